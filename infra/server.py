"""Search-R1's retrieval API over HTTP. `SearchServer` answers `POST /retrieve` from any object
with `search(queries, k)` (`python retriever.py serve`: `main`); its client `RemoteRetriever` adds
a timeout, retries with backoff and a concurrency cap, failing with a countable `RetrievalError`
("Cut the Bill" §5.4.2, §8.2: environment errors are discarded and counted; one runaway trajectory
must not starve the batch).

Deviations from Search-R1's retrieval server, each cited by its name:
- scoreless-answer: `return_scores: false` answers `[{"document": {...}}, ...]` per query;
  Search-R1's server crashes on that path (it unpacks scores that batch_search did not return).
- dynamic-batching: concurrent requests are searched in one call: the same results (exact top-k,
  cut to each request's topk), but a search that raises fails every request batched with it (each
  answers 500; clients retry). A call takes at most 1024 queries, shared among the waiting
  requests, so a large request is searched over several calls while the others are answered.
- stdlib-http: standard-library HTTP (ThreadingHTTPServer, urllib) instead of FastAPI + uvicorn: no
  extra dependency.
"""

import http.client
import http.server
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from infra import flags
from infra.search import Passage, load_corpus, make_retriever

# --------------------------------------------------------------------------------------------------
# HTTP server: Search-R1's POST /retrieve


class _Batcher:
    """Runs the searches of concurrent requests as batched calls on one thread (dynamic-batching):
    each call takes up to `max_queries` queries, an equal share from every waiting request, so a
    request with more queries than its share is searched over several calls, and one that arrives
    meanwhile joins the next call instead of waiting for all of it."""

    def __init__(self, retriever, max_queries=1024):
        self.retriever, self.max_queries, self.inbox = retriever, max_queries, queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="retrieval-batcher").start()

    def search(self, queries, k):
        done = Future()
        self.inbox.put((list(queries), k, done))
        return done.result()

    def _loop(self):
        waiting = []  # (queries, k, done, the passages found so far) per request
        while True:
            if not waiting:
                waiting.append((*self.inbox.get(), []))
            while not self.inbox.empty():
                waiting.append((*self.inbox.get_nowait(), []))
            share = max(1, self.max_queries // len(waiting))
            batch = [(job, job[0][len(job[3]) : len(job[3]) + share]) for job in waiting]
            try:
                asked = [q for _, qs in batch for q in qs]
                found = iter(self.retriever.search(asked, max(k for _, k, _, _ in waiting)))
                for (_, k, _, so_far), qs in batch:
                    so_far += [next(found)[:k] for _ in qs]
            except Exception as e:
                # handed to every request of the call, which answers 500 with the message
                for _, _, done, _ in waiting:
                    done.set_exception(e)
            for queries, _, done, so_far in waiting:
                if not done.done() and len(so_far) == len(queries):
                    done.set_result(so_far)
            waiting = [job for job in waiting if not job[2].done()]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    MAX_BODY = 16 * 2**20  # bytes: a request body, the queries' JSON, may not be larger

    def setup(self):
        # a client that sends less than it announced cannot hang us
        self.timeout = self.server.request_timeout_s
        super().setup()

    def _reply(self, status, body=None, error=None, hang_up=False):
        """Send `body`, or {"error": error}, as JSON."""
        # the request's body was not read, so the connection cannot serve another request
        if hang_up:
            self.close_connection = True
        data = json.dumps(body if error is None else {"error": error}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # expected when a client gave up (its timeout): say so
            sys.stderr.write(
                f"retriever server: {self.address_string()} left before its answer (client "
                "timeout?)\n"
            )

    def do_POST(self):
        length = self.headers.get("Content-Length", "0")
        if not (length.isascii() and length.isdigit()):  # "²".isdigit(), but int("²") fails
            return self._reply(
                400,
                hang_up=True,
                error=f"Content-Length must be a non-negative integer, got {length!r}",
            )
        if int(length) > self.MAX_BODY:
            return self._reply(
                400,
                hang_up=True,
                error=f"Content-Length {length} is over the server's limit of "
                f"{self.MAX_BODY} bytes; send fewer queries per request",
            )
        try:
            body = self.rfile.read(int(length))  # read it all: keep-alive reuses the socket
        except TimeoutError:  # the client announced more than it sent
            body = b""
        if len(body) < int(length):
            return self._reply(
                400,
                hang_up=True,
                error=f"body shorter than its Content-Length ({length} bytes), or "
                f"not sent within {self.timeout} s; send the whole body",
            )
        if self.path != "/retrieve":
            return self._reply(404, error=f"unknown path {self.path!r}; the API is POST /retrieve")
        try:
            req = json.loads(body or b"null")
        except UnicodeDecodeError as e:  # a ValueError, but no JSONDecodeError
            return self._reply(400, error=f"body is not UTF-8 ({e}); send JSON encoded as UTF-8")
        except json.JSONDecodeError as e:
            return self._reply(400, error=f"body is not JSON ({e})")
        except RecursionError:
            return self._reply(400, error="body is nested too deeply to read; send flat JSON")
        if (
            not isinstance(req, dict)
            or not isinstance(req.get("queries"), list)
            or not all(isinstance(q, str) for q in req["queries"])
        ):
            return self._reply(
                400,
                error=f'body must be {{"queries": [str, ...], "topk": int|null, '
                f'"return_scores": bool}}, got {str(req)[:200]}',
            )
        if len(req["queries"]) > self.server.max_queries:
            return self._reply(
                413,
                error=f"at most {self.server.max_queries} queries per request (the server's "
                f"--max_queries), got {len(req['queries'])}; send them in several requests",
            )
        # Search-R1: `if not topk`
        topk = self.server.default_topk if req.get("topk") in (None, 0) else req["topk"]
        if type(topk) is not int or topk < 1:  # (a bool is not a topk)
            return self._reply(
                400,
                error=f"topk must be a positive integer, or 0 / null for the server's default "
                f"({self.server.default_topk}), got {topk!r}",
            )
        if topk > self.server.max_topk:
            return self._reply(
                400,
                error=f"topk must be at most {self.server.max_topk} (the server's --max_topk), "
                f"got {topk}",
            )
        try:
            results = self.server.batcher.search(req["queries"], topk)
        except Exception as e:  # reported to the client, which counts it as a retrieval error
            return self._reply(500, error=f"search failed: {type(e).__name__}: {e}")
        with_scores = bool(req.get("return_scores", False))  # Search-R1's default is False
        self._reply(
            200, {"result": [[_document(p, with_scores) for p in passages] for passages in results]}
        )

    # errors only; a training run sends millions of requests
    def log_request(self, code="-", size="-"):
        if isinstance(code, int) and code >= 400:
            super().log_request(code, size)


def _document(p, with_scores):
    """One entry of Search-R1's answer: the corpus row, and its score if scores were asked for
    (scoreless-answer)."""
    return {"document": {"id": p.id, "contents": p.contents}} | (
        {"score": p.score} if with_scores else {}
    )


class SearchServer(http.server.ThreadingHTTPServer):
    """Search-R1's retrieval API over any object with `search(queries, k)`; run with
    `serve_forever()`."""

    daemon_threads = True
    request_queue_size = 4096  # listen backlog: 1024 simultaneous clients must not be refused

    def __init__(
        self,
        retriever,
        host="127.0.0.1",
        port=8000,
        default_topk=3,
        max_topk=100,
        request_timeout_s=30.0,
        max_queries=4096,
    ):
        super().__init__((host, port), _Handler)
        self.batcher, self.default_topk, self.max_topk = _Batcher(retriever), default_topk, max_topk
        self.request_timeout_s, self.max_queries = request_timeout_s, max_queries


# --------------------------------------------------------------------------------------------------
# HTTP client


class _RequestFailed(Exception):
    """One HTTP request of RemoteRetriever failed for good; the message says why."""


class RetrievalError(RuntimeError):
    """Some queries could not be answered by the retrieval server (an environment error, not the
    model's)."""

    def __init__(self, message, failed, partial):
        super().__init__(message)
        self.failed = failed  # indices of the queries that failed
        self.partial = partial  # per query: its passages, or None where it failed


class RemoteRetriever:
    """`search(queries, k)` against a Search-R1-compatible server, with the failure policy of Cut
    the Bill §8.2: requests of `queries_per_request` queries, at most `max_concurrency` in flight
    (across all calling threads), each with `timeout_s` and `retries` more tries after waits of
    backoff_s, 2*backoff_s, ... (a 4xx is not retried); the queries of requests that still failed
    raise one RetrievalError that lists them and carries the rest's passages."""

    def __init__(
        self,
        url,
        timeout_s=10.0,
        retries=2,
        backoff_s=0.5,
        max_concurrency=32,
        queries_per_request=16,
    ):
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
                return [
                    [
                        Passage(
                            str(d["document"]["id"]),
                            d["document"]["contents"],
                            float(d.get("score", "nan")),
                        )
                        for d in docs
                    ]
                    for docs in result
                ]
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
                if e.code < 500 and e.code != 429:
                    # our request is wrong; retrying cannot help
                    raise _RequestFailed(error) from None
            except (OSError, http.client.HTTPException) as e:
                # refused, reset, timed out (URLError is an OSError)
                error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, TypeError) as e:
                raise _RequestFailed(
                    f"malformed answer ({type(e).__name__}: {e}); is {self.url} a Search-R1 "
                    f"retrieval server?"
                ) from None
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise _RequestFailed(
            f"{error} (after {self.retries + 1} attempts, timeout {self.timeout_s} s each)"
        )

    def search(self, queries, k):
        n = self.queries_per_request
        chunks = [list(queries[start : start + n]) for start in range(0, len(queries), n)]
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
            raise RetrievalError(
                f"retrieval failed for {len(failed)} of {len(queries)} queries at {self.url}: "
                f"{errors[0]}; check the server (python retriever.py serve ...) or raise "
                f"--retriever_timeout_s / lower the load",
                failed,
                partial,
            )
        return partial

    def close(self):
        self.pool.shutdown(wait=False)


@dataclass
class ServeConfig:
    """`python retriever.py serve`: what to serve and where (the retriever itself:
    RetrieverConfig)."""

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
    max_queries: int = 4096
    """Most queries one request may send (more are answered 413); a large request is searched 1024
    at a time, sharing each search with the other clients' requests."""


def main(argv: list[str], retriever_config):
    """`python retriever.py serve ...` (`argv`: the arguments after the script): ServeConfig and
    `retriever_config` (retriever.py's RetrieverConfig, passed in: the package never imports the top
    level) parsed, checked, served."""
    if argv[:1] != ["serve"]:
        sys.exit(
            "usage: python retriever.py serve --corpus FILE --retriever bm25|dense --port PORT "
            "[...]; see `python retriever.py serve --help`"
        )
    serve, cfg = flags.parse(ServeConfig, retriever_config, args=argv[1:])
    flags.check(
        (serve, cfg),
        [
            (
                "topk max_topk max_queries encode_batch_size max_length",
                "an integer >= 1",
                lambda v: v >= 1,
            ),
            ("port", "in 0..65535 (0: any free port)", lambda v: 0 <= v <= 65535),
            ("corpus", "an existing JSONL file", os.path.isfile),
        ],
        [
            (
                serve.max_topk < serve.topk,
                f"--max_topk {serve.max_topk} must be >= --topk {serve.topk}, the "
                f"default a request gets",
            )
        ],
    )
    print(serve, cfg, sep="\n")
    server = SearchServer(
        make_retriever(load_corpus(serve.corpus), cfg),
        serve.host,
        serve.port,
        serve.topk,
        serve.max_topk,
        max_queries=serve.max_queries,
    )
    print(f"serving POST http://{serve.host}:{server.server_address[1]}/retrieve", flush=True)
    server.serve_forever()
