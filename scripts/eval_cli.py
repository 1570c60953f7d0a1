"""`python eval.py`'s command line: its flags (EvalArgs), the run (a policy, its retriever and agent
under train.py's settings; an optional judge model) and the report it prints (`table`) and writes.
eval.py runs this file by name (`python -m scripts.eval_cli` is the same), which scores with
eval.py's `evaluate` and `judge`.
"""

import os
from dataclasses import asdict, dataclass
from functools import partial
from typing import Literal

from safetensors import SafetensorError

import retriever
import rollout
from eval import evaluate, judge
from infra import data, engines, files, flags, health, loaders, policy, protocol


def table(report):
    """The per-dataset table as text."""
    skip = ("by_source", "questions")  # not columns: per dataset below, per question in the JSON
    keys = [key for key in report if key not in skip and not key.startswith("em_hop")]
    lines = [f"{'dataset':14}" + "".join(f" {key:>10}" for key in keys)]
    for name, m in [*report["by_source"].items(), ("all", report)]:
        lines.append(
            f"{name:14}"
            + "".join(
                f" {m[key]:>10d}" if key in ("n", "env_errors") else f" {m[key]:>10.3f}"
                for key in keys
            )
        )
    hops = [f"{key[6:]}-hop {v:.3f}" for key, v in report.items() if key.startswith("em_hop")]
    return "\n".join(lines + ([f"EM by hops: {', '.join(hops)}"] if hops else []))


@dataclass
class EvalArgs:
    """`python eval.py --model DIR --data NAME|PATH`: a policy under train.py's agent settings and
    retriever."""

    model: str = "out/warmstart"
    """Policy: a checkpoint directory (e.g. out/runs/tree_grpo-seed0/final) or a hub name."""
    gguf_file: str = ""
    """A GGUF file inside --model's directory."""
    data: str = ""
    """Questions: .parquet / .jsonl / a directory with {split}.* / a datasets name; empty = the
    embedded world."""
    split: str = "test"
    """Split to evaluate."""
    corpus: str = ""
    """Corpus JSONL; empty = the embedded world's."""
    n: int = 500
    """Questions: n spread evenly over the split."""
    k: int = 1
    """Samples per question (pass@k); k > 1 needs eval_temperature > 0."""
    judge_model: str = ""
    """A local judge model directory for LLM-as-judge (BranPO Table 7); empty = none."""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """Generation engine."""
    out: str = ""
    """JSON report path; empty = next to the model as eval_<split>.json."""
    seed: int = 0
    """Seed of the engine's sampling (with --eval_temperature > 0), as train.py's --seed."""


def main():
    """Evaluate a policy (EvalArgs, AgentConfig, RetrieverConfig from the command line) with
    eval.py's `evaluate` and `judge`; print the per-dataset table and write the JSON report."""
    a, agent_cfg, retriever_cfg = flags.parse(
        EvalArgs, protocol.AgentConfig, retriever.RetrieverConfig
    )
    models = [
        policy.model_problem(a.model, a.gguf_file),  # checked before anything loads
        a.judge_model and policy.model_problem(a.judge_model),
    ]
    out = a.out or os.path.join(a.model if os.path.isdir(a.model) else ".", f"eval_{a.split}.json")
    no_out = files.unwritable(out, "--out")
    flags.check(
        (a, agent_cfg, retriever_cfg),
        rollout.RULES
        + retriever.RULES
        + engines.RULES
        + [("n k", "an integer >= 1", lambda v: v >= 1), ("seed", ">= 0", lambda v: v >= 0)],
        [
            (
                a.k > 1 and agent_cfg.eval_temperature == 0,
                f"--k {a.k} needs --eval_temperature > 0: greedy samples are all equal",
            ),
            *zip(models, models),
            (no_out, no_out),  # checked before the work, not after it
        ],
    )
    world = data.ensure_world("out/world") if not (a.data and a.corpus) else ""
    split = loaders.load_rows(a.data or world, a.split)
    rows = data.spread(split, a.n)
    if len(split) < a.n:
        print(f"--n {a.n}: the {a.split} split has {len(split)} questions; evaluating all of them")
    search, _ = retriever.connect(retriever_cfg, a.corpus or os.path.join(world, "corpus.jsonl"))
    model, tok = load(a.model, a.gguf_file)
    engine = engines.make_engine(a.engine, model, tok, a.model)
    judge_fn = None
    if a.judge_model:
        judge_model, judge_tok = load(a.judge_model, "")
        judge_fn = partial(
            judge, engines.make_engine(a.engine, judge_model, judge_tok, a.judge_model), judge_tok
        )
    refiner = retriever.refiner(retriever_cfg, a.engine)  # Cut the Bill §6; None: off
    agent = rollout.Agent(engine, search, tok, protocol.for_eval(agent_cfg), a.seed, refiner)
    report = evaluate(agent, rows, k=a.k, judge_fn=judge_fn)
    print(table(report))
    refine = health.refine_metrics(refiner.stats) if refiner else {}  # summaries: length, time
    if refine:
        print("refine agent: " + ", ".join(f"{k} {v:.2f}" for k, v in refine.items()))
    whole = {
        "args": vars(a),
        "agent": asdict(agent_cfg),
        "retriever": asdict(retriever_cfg),
        "report": report,
        **({"refine": refine} if refine else {}),
    }
    files.write_json(out, whole, indent=1)
    print(f"report: {out}")


def load(model: str, gguf_file: str):
    """policy.load_policy, its failure naming the directory and its weight files (a truncated
    file, e.g. an interrupted copy, fails to load without its name)."""
    try:
        return policy.load_policy(model, gguf_file or None)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        weights = (
            sorted(
                f"{f} ({os.path.getsize(os.path.join(model, f))} bytes)"
                for f in os.listdir(model)
                if f.endswith((".safetensors", ".bin", ".gguf"))
            )
            if os.path.isdir(model)
            else []
        )
        raise SystemExit(
            f"loading the model {model} failed ({type(e).__name__}: {e}); its weight files: "
            f"{', '.join(weights) or 'none'}. One may be truncated (an interrupted copy or save): "
            "copy or save it again"
        ) from None


if __name__ == "__main__":
    main()
