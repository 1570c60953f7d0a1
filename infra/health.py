"""A step's health metrics: the `rollout/`, `tree/` and `abnormal/` entries of every step's log,
from the step's trees (tree.py's Tree and Node, read by their fields), and the update's `train/`
ones (docs/metrics.md lists them all); and what they tell of the run: the stop on non-finite weights
(`check_finite`), the warnings of its last line (`warnings`).
"""

import torch

from infra.protocol import FLAGS


def path(node) -> list:
    """The steps from the root's child down to `node` (tree.py's `path`, on the nodes' parents)."""
    steps = []
    while node.parent is not None:
        steps.append(node)
        node = node.parent
    return steps[::-1]


def metrics(tree_groups: list[list]) -> dict[str, float]:
    """One rollout batch's metrics (docs/metrics.md lists them): reward, EM/F1 (as the agent
    recorded them), behaviour, effective groups, budgets per prompt, failed retrieval queries
    (summed over the batch), abnormal rates (FLAGS, the abnormal outcomes)."""
    n = max(len(tree_groups), 1)
    leaves = [leaf for trees in tree_groups for t in trees for leaf in t.leaves()]
    scored = [leaf for leaf in leaves if leaf.scored]
    em = [x.em or 0.0 for x in scored]  # a missing answer scores 0
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    stat = lambda key: sum(t.stats.get(key, 0) for trees in tree_groups for t in trees) / n
    groups = [[x.reward for t in trees for x in t.leaves() if x.scored] for trees in tree_groups]
    m = {
        "rollout/reward": mean([x.reward for x in scored]),
        "rollout/em": mean(em),
        "rollout/f1": mean([x.f1 or 0.0 for x in scored]),
        "rollout/effective_groups": mean([float(len(set(g)) > 1) for g in groups]),
    }
    for name, values in (
        ("turns", [float(x.depth) for x in scored]),
        ("searches", [float(sum(s.action == "search" for s in path(x))) for x in scored]),
    ):
        correct = [v for v, e in zip(values, em) if e == 1]
        for suffix, picked in (("", values), ("_correct", correct)):
            # upper median
            m[f"rollout/{name}_median{suffix}"] = (
                sorted(picked)[len(picked) // 2] if picked else 0.0
            )
            m[f"rollout/{name}_max{suffix}"] = max(picked, default=0.0)
    m.update(
        {
            "rollout/tokens_per_prompt": stat("generated_tokens"),
            "rollout/tool_calls_per_prompt": stat("tool_calls"),
            "tree/leaves_per_prompt": len(leaves) / n,
            "rollout/gen_seconds_per_prompt": stat("gen_seconds"),
            "rollout/retrieval_seconds_per_prompt": stat("retrieval_seconds"),
            "rollout/gold_seconds_per_prompt": stat("gold_seconds"),  # IGPO's teacher forcing
            "rollout/retrieval_failed_queries": stat("failed_queries") * n,
        }
    )
    for flag in FLAGS:  # share of trajectories with that outcome on any of their steps
        m[f"abnormal/{flag}"] = mean([float(any(flag in s.flags for s in path(x))) for x in leaves])
    return m


def sample_metrics(trajectories: list, samples: list) -> dict[str, float]:
    """What the step trains (tree.py's Trajectory and Sample): tokens, rows, and update actions
    (CARL's |D_upd|): the steps with an advantage, once per trajectory a row trains (a truncated
    one has none)."""
    kept = {s.leaf_id for s in samples}
    trained = [a for traj in trajectories if traj.leaf.id in kept for a in traj.advantages]
    return {
        "train/tokens_trained": float(sum(sum(s.loss_mask) for s in samples)),
        "train/actions_trained": float(sum(a is not None for a in trained)),
        "train/samples": float(len(samples)),
    }


def refine_metrics(sums) -> dict[str, float]:
    """The refine agent's (Cut the Bill §6) over one step, from its summed `stats`: mean summary
    length in tokens, and its seconds (part of retrieval's)."""
    return {
        "rollout/refine_summary_tokens": sums["summary_tokens"] / max(sums["summaries"], 1),
        "rollout/refine_seconds": sums["seconds"],
    }


def train_metrics(stats, grad_norms, losses, args) -> dict[str, float]:
    """The update's train/ metrics (docs/metrics.md lists them): `stats`, the per-micro-batch
    statistics of train.update, the applied steps' gradient norms and losses; `args`: train.py's
    Args."""
    cat = lambda k: torch.cat([s[k].float().cpu() for s in stats]) if stats else torch.zeros(0)
    mean = lambda x: x.mean().item() if stats else 0.0
    return {
        "train/loss": sum(losses) / max(len(losses), 1),
        "train/kl": mean(cat("kl")),
        "train/entropy": mean(cat("entropy")),
        "train/clip_fraction": mean(cat("clipped")),
        "train/tis_truncated_fraction": mean((cat("tis") > args.tis_cap).float())
        if args.tis_cap > 0
        else 0.0,
        **({"train/dual_clip_fraction": mean(cat("dual_clipped"))} if args.dual_clip else {}),
        "train/grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
        **quantiles("train/ratio", cat("ratio")),
        **quantiles("train/tis_ratio", cat("tis")),
        **({"train/tis_ratio_max_dev": (cat("tis") - 1).abs().max().item()} if stats else {}),
    }


def quantiles(name: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {}
    q = torch.quantile(x.float(), torch.tensor([0.05, 0.5, 0.95]))
    return {f"{name}_p5": q[0].item(), f"{name}_p50": q[1].item(), f"{name}_p95": q[2].item()}


def warnings(history: list[dict]) -> str:
    """What the summary must add about the steps of `history`: those that lost trajectories to
    retrieval errors (each with its share), and a run that trained no token at all, or only
    tokens of zero advantage."""
    lost = [(r["step"], r["abnormal/env_error"]) for r in history if r.get("abnormal/env_error")]
    trained = [r["train/tokens_trained"] for r in history if "train/tokens_trained" in r]
    said = ""
    if lost:
        steps = ", ".join(f"{step} ({rate:.0%})" for step, rate in lost[:20])
        more = f" and {len(lost) - 20} more" if len(lost) > 20 else ""
        said += (
            f". DEGRADED: steps {steps}{more} lost trajectories to retrieval errors "
            "(abnormal/env_error), trained without them"
        )
    differed = [r["rollout/effective_groups"] for r in history if "rollout/effective_groups" in r]
    if trained and not any(trained):
        said += (
            ". NOTHING WAS TRAINED: no step had a token to train (train/tokens_trained 0): every "
            "trajectory was cut by --max_traj_tokens, lost, or had no advantage"
        )
    elif differed and not any(differed):
        said += (
            ". NOTHING WAS TRAINED: at every step each prompt's rollouts had one reward "
            "(rollout/effective_groups 0), so every advantage was 0: rollouts that cannot differ "
            "(--temperature 0, --grpo_G 1) or questions the policy always fails (or always solves)"
        )
    return said


def check_finite(bad: list[str], step: int, applied: int, skipped: int):
    """Stop the run after `step` when its update left weights NaN or inf (`bad`: their names,
    shard.Weights.nonfinite; a --lr too large), or when none of its optimizer steps could be applied
    (`applied`; `skipped`: those dropped for a non-finite loss or gradient norm): what it would go
    on to train, and save as final/, is not a policy. Every rank decides alike (the ranks hold the
    same weights and skip alike)."""
    if bad:
        raise SystemExit(
            f"stopping at step {step}: the update left {len(bad)} weight tensors with NaN or inf "
            f"({', '.join(bad[:3])}{', ...' * (len(bad) > 3)}); nothing is saved as final/ (the "
            "checkpoints hold the steps before). Lower --lr (or --grad_clip), then start over "
            "with --overwrite"
        )
    if skipped and not applied:
        raise SystemExit(
            f"stopping at step {step}: the loss or the gradient norm was NaN or inf in all "
            f"{skipped} of its optimizer steps (train/skipped_steps), so none was applied; "
            "nothing is saved as final/. Lower --lr, check the advantages, then start over "
            "with --overwrite"
        )
