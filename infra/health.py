"""A rollout batch's health metrics: the `rollout/`, `tree/` and `abnormal/` entries of every
step's log (the README lists them). rollout.py exposes them as `rollout.metrics`, with tree.py's
`path` and `FLAGS` passed in, as this package never imports the top level.
"""


def metrics(prompts: list[list], path, flags) -> dict[str, float]:
    """One rollout batch's metrics (the README lists them): reward, EM/F1 (as the agent recorded
    them), behaviour, effective groups, budgets per prompt, failed retrieval queries (summed over
    the batch), abnormal rates (`path`: tree.path; `flags`: tree.FLAGS, the abnormal outcomes)."""
    n = max(len(prompts), 1)
    leaves = [leaf for trees in prompts for t in trees for leaf in t.leaves()]
    scored = [leaf for leaf in leaves if leaf.scored]
    em = [x.em or 0.0 for x in scored]  # a missing answer scores 0
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    stat = lambda key: sum(t.stats.get(key, 0) for trees in prompts for t in trees) / n
    groups = [[x.reward for t in trees for x in t.leaves() if x.scored] for trees in prompts]
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
            "rollout/retrieval_failed_queries": stat("failed_queries") * n,
        }
    )
    for flag in flags:  # share of trajectories with that outcome on any of their steps
        m[f"abnormal/{flag}"] = mean([float(any(flag in s.flags for s in path(x))) for x in leaves])
    return m
