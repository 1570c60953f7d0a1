"""The search engine the agent calls: `search(queries, k) -> list[list[Passage]]`, in process or
over HTTP.

`connect` picks it: the retrieval server at --retriever_url (infra/server.py's `RemoteRetriever`: a
deadline per request, retries with backoff, a concurrency cap), else an in-process index over the
corpus file (infra/search.py: BM25 through bm25s, or a Hugging Face encoder with FAISS; --retriever
chooses), and checks it with one query. Queries the server could not answer raise `RetrievalError`,
which the agent counts ("Cut the Bill" §5.4.2: environment errors are discarded). `Refiner`, the
optional refine agent (Cut the Bill §6, --refine_model), summarises each query's passages with a
frozen model.

    python retriever.py serve --corpus FILE --port 8000  # Search-R1's POST /retrieve
                                                         # (infra/server.py)
"""

import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from infra import server
from infra.engines import Sampling, make_engine
from infra.policy import load_policy, model_problem
from infra.search import load_corpus, make_retriever
from infra.server import RemoteRetriever, RetrievalError


@dataclass
class RetrieverConfig:
    """Which in-process retriever to build, and how."""

    retriever: Literal["bm25", "dense"] = "bm25"
    """In-process retriever when --retriever_url is empty: bm25 (bm25s) or dense (HF encoder +
    FAISS)."""
    retriever_url: str = ""
    """A Search-R1 retrieval server (python retriever.py serve ...); empty = in-process."""
    retriever_timeout_s: float = 10.0
    """Seconds the retrieval server gets to answer a request in full, first byte to last
    (--retriever_url)."""
    retriever_retries: int = 2
    """Further tries of a failed retrieval request, after 0.5 s, 1 s, ... (--retriever_url)."""
    encoder: str = ""
    """Dense encoder: hub name or local directory (Search-R1: intfloat/e5-base-v2); empty = offline
    MiniLM."""
    index_dir: str = ""
    """Directory to load the index from, or to save it to after building; empty: build in memory
    every start."""
    encode_batch_size: int = 64
    """Texts per encoder forward pass."""
    max_length: int = 256
    """Encoder truncation length in tokens."""
    query_prefix: str = "query: "
    """Prepended to queries before encoding (E5 convention)."""
    passage_prefix: str = "passage: "
    """Prepended to passages before encoding (E5 convention)."""
    refine_model: str = ""
    """Cut the Bill §6's refine agent: a frozen model (directory or hub name) that summarises each
    query's passages, its summary the agent's only observation; empty = off."""
    refine_max_tokens: int = 128
    """Most tokens of a refine agent's summary."""


def health_check(retriever, where):
    """Search one query before a run starts, so a dead or misconfigured retriever stops it at once
    with a clear message instead of looking like a model that never finds anything (every trajectory
    an env_error)."""
    try:
        (passages,) = retriever.search(["health check"], 1)
    except RetrievalError as e:
        raise RuntimeError(f"{where} did not answer one test query, so nothing runs: {e}") from None
    if not passages:
        raise RuntimeError(f"{where} answered a test query with no passage; is its corpus empty?")


RULES = [  # flags.check: (flags, what is allowed, test)
    ("retriever_timeout_s", "> 0", lambda v: v > 0),
    ("retriever_retries", "an integer >= 0", lambda v: v >= 0),
    ("refine_max_tokens", "an integer >= 1", lambda v: v >= 1),
    (
        "refine_model",
        "empty or a model directory or hub name",
        lambda v: not v or not model_problem(v),
    ),
    (
        "retriever_url",
        "empty or a URL http://HOST:PORT (or https://...)",
        lambda v: not v or (urlsplit(v).scheme in ("http", "https") and bool(urlsplit(v).netloc)),
    ),
]


def connect(cfg: RetrieverConfig, corpus_path: str):
    """The retriever a run searches with (the server at --retriever_url, else the in-process one
    over the corpus file), checked with one query; and its name for messages."""
    if cfg.retriever_url:
        search = RemoteRetriever(cfg.retriever_url, cfg.retriever_timeout_s, cfg.retriever_retries)
        where = f"the retrieval server {cfg.retriever_url}"
    else:
        search, where = (
            make_retriever(load_corpus(corpus_path), cfg),
            f"the in-process {cfg.retriever}",
        )
    health_check(search, where)
    return search, where


class Refiner:
    """Cut the Bill §6: a second, frozen model reads each query's retrieved passages and writes a
    query-relevant summary; only the summary is appended to the agent's context. It is never
    trained."""

    PROMPT = (
        "Summarize the information in the passages below that is relevant to the query, in a few "
        "sentences. Keep names exactly as written.\nQuery: {query}\nPassages:\n{passages}\nSummary:"
    )

    def __init__(self, engine, tokenizer, max_tokens: int):
        self.engine, self.tok = engine, tokenizer
        self.sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=max_tokens, stop=[], seed=0)
        self.stats = Counter()  # summaries, summary_tokens, seconds: the refine metrics' sums

    def summarize(self, queries: list[str], bodies: list[str | None]) -> list[str | None]:
        """One summary per query of its passages, given as the agent's observation body (None where
        retrieval failed, which stays None); one batched engine call."""
        t0 = time.perf_counter()
        todo = [i for i, body in enumerate(bodies) if body is not None]
        prompts = [
            self.tok.encode(self.PROMPT.format(query=queries[i], passages=bodies[i])) for i in todo
        ]
        summaries: list[str | None] = [None] * len(queries)
        for i, out in zip(todo, self.engine.generate(prompts, self.sampling) if prompts else []):
            summaries[i] = self.tok.decode(out.token_ids, skip_special_tokens=True).strip()
            self.stats["summary_tokens"] += len(out.token_ids)
        self.stats.update(summaries=len(todo), seconds=time.perf_counter() - t0)
        return summaries


def refiner(cfg: RetrieverConfig, engine: str) -> Refiner | None:
    """The refine agent of --refine_model on an `engine` of that kind (train.py's --engine), or
    None when --refine_model is empty."""
    if not cfg.refine_model:
        return None
    model, tok = load_policy(cfg.refine_model)
    return Refiner(make_engine(engine, model, tok, cfg.refine_model), tok, cfg.refine_max_tokens)


if __name__ == "__main__":
    server.main(sys.argv[1:], RetrieverConfig)
