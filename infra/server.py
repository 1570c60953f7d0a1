"""Search-R1's retrieval API over HTTP. `SearchServer` answers `POST /retrieve` from any object
with `search(queries, k)` (`python retriever.py serve`: `main`); its client `RemoteRetriever` adds
a deadline per request, retries with backoff and a concurrency cap, failing with a countable
`RetrievalError` ("Cut the Bill" §5.4.2, §8.2: environment errors are discarded and counted; one
runaway trajectory must not starve the batch).

Deviations from Search-R1's retrieval server, each cited by its name (docs/paper_code.md):
- scoreless-answer: `return_scores: false` is answered without scores (Search-R1 crashes)
- dynamic-batching: concurrent requests are searched in one call, within per-call caps
- stdlib-http: standard-library HTTP instead of FastAPI + uvicorn
"""

import http.client
import http.server
import json
import os
import queue
import re
import socket
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from infra import flags
from infra.search import Passage, load_corpus, make_retriever

# --------------------------------------------------------------------------------------------------
# HTTP server: Search-R1's POST /retrieve


class _Batcher:
    """Runs the searches of concurrent requests as batched calls on one thread (dynamic-batching):
    each call takes up to `max_queries` queries and `max_bytes` of query text, an equal share of
    each from every waiting request (at least one query), so a request larger than its share is
    searched over several calls, and one that arrives meanwhile joins the next call instead of
    waiting for all of it."""

    def __init__(self, retriever, max_queries=1024, max_bytes=256 * 2**10):
        self.retriever, self.max_queries, self.max_bytes = retriever, max_queries, max_bytes
        self.inbox = queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="retrieval-batcher").start()

    def search(self, queries, k, sizes=None):
        """Each query's passages (`sizes`: each query's size in bytes; default its length)."""
        done = Future()
        sizes = list(sizes) if sizes is not None else [len(q) for q in queries]
        self.inbox.put((list(queries), k, done, sizes))
        return done.result()

    def _share(self, job, count: int, size: int) -> list[str]:
        """The next queries of `job` for one call: at most `count` of them and `size` bytes, but at
        least one."""
        queries, sizes, start = job[0], job[3], len(job[4])
        end, used = start + 1, sizes[start]
        while end < min(len(queries), start + count) and used + sizes[end] <= size:
            used, end = used + sizes[end], end + 1
        return queries[start:end]

    def _call(self, batch: list) -> list:
        """Search `batch` ((job, queries) pairs) in one call: per pair, each query's passages cut
        to its job's k, or the exception the search raised. A call of several requests that raises
        is tried again request by request, so that one request's bad query fails that request
        alone."""
        try:
            found = iter(
                self.retriever.search(
                    [q for _, qs in batch for q in qs], max(job[1] for job, _ in batch)
                )
            )
            return [[next(found)[: job[1]] for _ in qs] for job, qs in batch]
        except Exception as e:  # handed to the request, which answers 500 with the message
            if len(batch) == 1:
                return [e]
        return [self._call([pair])[0] for pair in batch]

    def _loop(self):
        waiting = []  # (queries, k, done, sizes, the passages found so far) per request
        while True:
            if not waiting:
                waiting.append((*self.inbox.get(), []))
            while not self.inbox.empty():
                waiting.append((*self.inbox.get_nowait(), []))
            count = max(1, self.max_queries // len(waiting))
            size = self.max_bytes // len(waiting)
            batch = [(job, self._share(job, count, size)) for job in waiting if job[0]]
            for (job, _), found in zip(batch, self._call(batch) if batch else []):
                if isinstance(found, Exception):
                    job[2].set_exception(found)
                else:
                    job[4].extend(found)
            for queries, _, done, _, so_far in waiting:
                if not done.done() and len(so_far) == len(queries):
                    done.set_result(so_far)
            waiting = [job for job in waiting if not job[2].done()]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    MAX_BODY = 16 * 2**20  # bytes: a request body, the queries' JSON, may not be larger
    MAX_DRAIN = 4 * MAX_BODY  # bytes of a larger body read and dropped, so its client sees the 400
    MAX_LINE = 1024  # bytes: a chunked body's size line or trailer line may not be longer

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

    def _refuse(self, status, error) -> None:
        """Answer a refused request, then close the connection: what is left of its body is never
        read as the next request."""
        self._reply(status, error=error, hang_up=True)

    def _drain(self, length: int) -> None:
        """Read and drop the next `length` bytes of a refused body, at most MAX_DRAIN within the
        request timeout: a client sends the whole body before it reads the answer, and closing on
        unread bytes resets its connection, losing the answer (a broken pipe at the client)."""
        deadline = time.monotonic() + self.timeout
        left = length if length <= self.MAX_DRAIN else 0  # larger: answered at once
        try:
            while left > 0 and time.monotonic() < deadline:
                got = self.rfile.read1(min(left, 2**20))
                if not got:  # the client closed
                    return
                left -= len(got)
        except TimeoutError:  # the client stopped sending: it is answered all the same
            return

    def _chunked(self) -> bytes | None:
        """A `Transfer-Encoding: chunked` body (RFC 9112 §7.1): chunks of a hex size line, that many
        bytes and CRLF, up to a chunk of size 0 and the trailer lines; None once refused (400: a
        broken chunk, or over MAX_BODY, its chunks read and dropped up to MAX_DRAIN)."""
        over = (
            f"chunked body is over the server's limit of {self.MAX_BODY} bytes; send fewer "
            "queries per request"
        )
        parts, size = [], 0
        while True:
            line = self.rfile.readline(self.MAX_LINE + 1)
            digits = line.split(b";")[0].strip()  # a chunk extension after ";" is ignored
            if not line.endswith(b"\n") or not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", digits):
                return self._refuse(
                    400,
                    f"a chunk's size line {line[:40]!r} is not hex digits ended by CRLF; send a "
                    "whole chunked body, or a Content-Length",
                )
            n = int(digits, 16)
            if n == 0:
                break
            size += n
            if size > self.MAX_DRAIN:  # too much to drop: answered at once
                return self._refuse(400, over)
            data = self.rfile.read(n + 2)
            if len(data) < n + 2 or not data.endswith(b"\r\n"):
                return self._refuse(
                    400,
                    f"a chunk of {n} bytes was cut short or not ended by CRLF; send whole chunks",
                )
            if size <= self.MAX_BODY:
                parts.append(data[:-2])
        for _ in range(64):  # the trailer lines, dropped, up to the empty line that ends the body
            if self.rfile.readline(self.MAX_LINE + 1) in (b"\r\n", b"\n"):
                break
        else:
            return self._refuse(400, "a chunked body's trailer did not end within 64 lines")
        return self._refuse(400, over) if size > self.MAX_BODY else b"".join(parts)

    def _body(self) -> bytes | None:
        """The request's body, read whole: Content-Length bytes, or a chunked body; None once the
        request was refused (400; 501 for a transfer coding other than chunked) and the
        connection is closing."""
        coding = self.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            return self._refuse(
                501,
                f"Transfer-Encoding {coding!r} is not supported; send the body with a "
                "Content-Length, or chunked",
            )
        if coding is not None and "Content-Length" in self.headers:
            return self._refuse(
                400, "both Transfer-Encoding and Content-Length: send the body with one of them"
            )
        if coding is not None:
            try:
                return self._chunked()
            except TimeoutError:  # the client stopped sending
                return self._refuse(
                    400, f"chunked body not sent within {self.timeout} s; send the whole body"
                )
        length = self.headers.get("Content-Length", "0")
        if not (length.isascii() and length.isdigit()):  # "²".isdigit(), but int("²") fails
            return self._refuse(
                400, f"Content-Length must be a non-negative integer, got {length!r}"
            )
        if int(length) > self.MAX_BODY:
            self._drain(int(length))
            return self._refuse(
                400,
                f"Content-Length {length} is over the server's limit of {self.MAX_BODY} bytes; "
                "send fewer queries per request",
            )
        try:
            body = self.rfile.read(int(length))  # read it all: keep-alive reuses the socket
        except TimeoutError:  # the client announced more than it sent
            body = b""
        if len(body) < int(length):
            return self._refuse(
                400,
                f"body shorter than its Content-Length ({length} bytes), or not sent within "
                f"{self.timeout} s; send the whole body",
            )
        return body

    def do_POST(self):
        body = self._body()
        if body is None:  # refused, answered
            return
        if self.path != "/retrieve":
            return self._reply(404, error=f"unknown path {self.path!r}; the API is POST /retrieve")
        try:
            req = json.loads(body or b"null")
        except UnicodeDecodeError as e:  # a ValueError, but no JSONDecodeError
            return self._reply(400, error=f"body is not UTF-8 ({e}); send JSON encoded as UTF-8")
        except json.JSONDecodeError as e:
            return self._reply(400, error=f"body is not JSON ({e})")
        except ValueError as e:  # a number of more than 4300 digits, which int() refuses
            return self._reply(400, error=f"body cannot be read ({e}); send smaller numbers")
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
        sizes = []
        for i, query in enumerate(req["queries"]):
            try:
                sizes.append(len(query.encode("utf-8")))
            except UnicodeEncodeError as e:  # a lone surrogate: valid JSON, not text
                return self._reply(
                    400, error=f"query {i} ({query[:50]!r}) is not text ({e}); send UTF-8 text"
                )
            if sizes[-1] > self.server.max_query_bytes:
                return self._reply(
                    413,
                    error=f"query {i} has {sizes[-1]} bytes (UTF-8), over the server's limit of "
                    f"{self.server.max_query_bytes} (--max_query_bytes); send a shorter query",
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
            results = self.server.batcher.search(req["queries"], topk, sizes)
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
        max_query_bytes=4096,
    ):
        super().__init__((host, port), _Handler)
        self.batcher, self.default_topk, self.max_topk = _Batcher(retriever), default_topk, max_topk
        self.request_timeout_s, self.max_queries = request_timeout_s, max_queries
        self.max_query_bytes = max_query_bytes


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


class _Deadline:
    """Cuts an HTTP connection (`conn`, http.client's) when `seconds` have passed, whatever it is
    doing: a socket timeout bounds each read, not the exchange, and a server that drips its answer a
    byte at a time would hold the caller for ever. `passed` says whether it cut."""

    def __init__(self, conn, seconds: float):
        self.conn, self.lock, self.passed = conn, threading.Lock(), False
        self.timer = threading.Timer(seconds, self.cut)
        self.timer.daemon = True
        self.timer.start()

    def cut(self):
        with self.lock:
            self.passed = True
            if self.conn.sock is not None:  # None: not connected yet (the caller checks `passed`)
                try:
                    self.conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read
                except OSError:  # already closed by the peer: the caller's read fails by itself
                    return

    def close(self):
        self.timer.cancel()
        with self.lock:
            self.conn.close()


class RemoteRetriever:
    """`search(queries, k)` against a Search-R1-compatible server, with the failure policy of Cut
    the Bill §8.2: requests of `queries_per_request` queries, at most `max_concurrency` in flight
    (across all calling threads), each answered in full within `timeout_s` (a deadline for the
    whole request, connection to last byte) or tried again, `retries` more times after waits of
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

    def _exchange(self, body: bytes) -> tuple[int, bytes]:
        """POST `body` to the server: its HTTP status and answer, within timeout_s in all (else a
        TimeoutError)."""
        parts = urlsplit(self.url)
        http_class = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        conn = http_class(parts.hostname, parts.port, timeout=self.timeout_s)
        deadline = _Deadline(conn, self.timeout_s)
        try:
            conn.connect()
            if deadline.passed:
                raise TimeoutError(f"timed out: not connected within {self.timeout_s} s")
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as e:
            if deadline.passed:  # the cut made it fail: say so, not what the cut looked like
                raise TimeoutError(
                    f"timed out: no whole answer within {self.timeout_s} s "
                    f"(the server answered too slowly: {type(e).__name__})"
                ) from None
            raise
        finally:
            deadline.close()

    def _post(self, queries, k):
        body = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        for attempt in range(self.retries + 1):
            try:
                status, answer = self._exchange(body)
                if status >= 400:
                    error = f"HTTP {status}: {answer[:300].decode(errors='replace')}"
                    if status < 500 and status != 429:
                        # our request is wrong; retrying cannot help
                        raise _RequestFailed(error)
                else:
                    return [
                        [
                            Passage(
                                str(d["document"]["id"]),
                                d["document"]["contents"],
                                float(d.get("score", "nan")),
                            )
                            for d in docs
                        ]
                        for docs in json.loads(answer)["result"]
                    ]
            except (OSError, http.client.HTTPException) as e:
                # refused, reset, timed out
                error = f"{type(e).__name__}: {e}"
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
    max_query_bytes: int = 4096
    """Longest query a request may send, in UTF-8 bytes (a longer one is answered 413); each
    search takes at most 256 KiB of query text, shared among the waiting requests."""


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
                "topk max_topk max_queries max_query_bytes encode_batch_size max_length",
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
        max_query_bytes=serve.max_query_bytes,
    )
    print(f"serving POST http://{serve.host}:{server.server_address[1]}/retrieve", flush=True)
    server.serve_forever()
