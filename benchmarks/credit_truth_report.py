"""credit_truth.py's statistics, table and figure, from its results.json alone (so that --report
writes results.md again byte for byte): per credit and tree set, Spearman's rho between credit and
A* (overall and by depth), sign agreement and zero credit where A* is clearly not 0, and the noise
ceiling, each with a 95% bootstrap interval over prompts (resampled with a fixed seed).
"""

import json
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import rankdata

from infra import files

DEPTHS = {"all": (1, 99), "depth 1": (1, 1), "depth 2": (2, 2), "depth 3+": (3, 99)}
CLEAR = 2.0  # A* is "not 0" where |A*| > CLEAR x its SE
CI = (2.5, 97.5)


def spearman(x, y) -> float:
    """Spearman's rho (ties: average ranks); NaN when either side is constant or n < 3."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def measures(steps: list[dict], name: str | None) -> dict[str, float]:
    """rho per depth bucket, sign agreement and zero-credit share of credit `name` on `steps`; with
    name None, the noise ceiling: rho between the two halves' A* per depth bucket."""
    out = {}
    for label, (lo, hi) in DEPTHS.items():
        at = [s for s in steps if lo <= s["depth"] <= hi]
        if name is None:
            out[label] = spearman([s["halves"][0] for s in at], [s["halves"][1] for s in at])
        else:
            out[label] = spearman([s["credit"][name] for s in at], [s["a_star"] for s in at])
    if name is not None:
        clear = [s for s in steps if abs(s["a_star"]) > CLEAR * s["se"]]
        moved = [s for s in clear if s["credit"][name] != 0]
        agree = [np.sign(s["credit"][name]) == np.sign(s["a_star"]) for s in moved]
        out["sign"] = float(np.mean(agree)) if agree else float("nan")
        out["zero"] = 1 - len(moved) / len(clear) if clear else float("nan")
    return out


def with_intervals(steps: list[dict], name: str | None, resamples: int) -> dict[str, tuple]:
    """measures() on `steps`, each with its 95% bootstrap interval over prompts: key -> (value,
    low, high)."""
    prompts = sorted({s["prompt"] for s in steps})
    by_prompt = {p: [s for s in steps if s["prompt"] == p] for p in prompts}
    rng = np.random.default_rng(0)
    draws = [
        measures([s for p in rng.choice(prompts, len(prompts)) for s in by_prompt[p]], name)
        for _ in range(resamples)
    ]
    point = measures(steps, name)
    return {
        k: (v, *np.nanpercentile([d[k] for d in draws], CI))
        if np.isfinite(v) and np.isfinite([d[k] for d in draws]).sum() >= 10
        else (v, float("nan"), float("nan"))
        for k, v in point.items()
    }


def cell(x: tuple, signed: bool = True) -> str:
    v, lo, hi = x
    if not np.isfinite(v):
        return "n/a"
    f = "{:+.2f}" if signed else "{:.2f}"
    return f.format(v) + (f" [{f.format(lo)}, {f.format(hi)}]" if np.isfinite(lo) else "")


def rows(stored: dict) -> list[tuple[str, str, list[dict], str | None, dict]]:
    """(credit, tree set, its steps, credit name or None for the noise ceiling, its measures with
    intervals), in table order."""
    out = []
    for tree_set, arm in stored["matched"].items():
        steps = [s for s in stored["steps"] if s["set"] == tree_set]
        names = list(steps[0]["credit"]) if steps else []
        where = f"shared: {arm}" if tree_set == "shared" else f"own: {arm}"
        out += [(n, where, steps, n) for n in names] + [("noise ceiling", where, steps, None)]
    resamples = stored["args"]["bootstrap"]
    return [(*r, with_intervals(r[2], r[3], resamples)) for r in out]


def ceiling(r):
    """The most a credit can correlate with an A* whose split-half reliability is r: sqrt(2r /
    (1 + r)) (Spearman-Brown: the reliability of the whole K), 0 for r <= 0."""
    r = np.clip(r, 0, 1)
    return np.sqrt(2 * r / (1 + r))


def render(stored: dict, table: list) -> str:
    """The table and its notes; `table`: rows(stored)."""
    a = stored["args"]
    lines = [
        f"Credit against Monte Carlo truth: {a['prompts']} train prompts, K = {a['K']} "
        f"continuations per context, policy: {stored['model']} (seed {stored['seed']}), "
        f"{a['bootstrap']} bootstrap resamples of the prompts (95% intervals); commit "
        f"{stored['commit']}, {stored['wall_s'] / 60:.0f} min.",
        "",
        "| credit | trees | steps | ρ(credit, A*) | depth 1 | depth 2 | depth 3+ | sign agrees "
        f"(|A*| > {CLEAR:g} SE) | zero credit (|A*| > {CLEAR:g} SE) |",
        "|---|---|---:|---|---|---|---|---|---|",
    ]
    ceilings = []
    for credit, where, steps, name, m in table:
        depth = [cell(m[k]) for k in ("all", "depth 1", "depth 2", "depth 3+")]
        if name is None:
            ceilings.append((where, m["all"][0]))
            trail = ["", ""]
            credit = "noise ceiling (split-half ρ of A*)"
        else:
            trail = [cell(m["sign"], False), cell(m["zero"], False)]
            trained = sum(s["credit"][name] != 0 for s in steps)
            credit = f"{credit} ({trained} with credit)"
        lines.append("| " + " | ".join([credit, where, str(len(steps)), *depth, *trail]) + " |")
    clear = sum(abs(s["a_star"]) > CLEAR * s["se"] for s in stored["steps"])
    lines += [
        "",
        f"Steps: those some credit trains in the tree set; a step a credit leaves untrained counts "
        f"as credit 0. A* = V(after) - V(before), each V the mean reward of K continuations from "
        f"the exact context (a step that ended: its reward). {clear} of {len(stored['steps'])} "
        f"steps have |A*| > {CLEAR:g} SE; over them, 'sign agrees' is the share of those with "
        f"nonzero credit whose credit has A*'s sign, 'zero credit' the share with credit 0.",
        "The noise ceiling is ρ between the A* of the two halves of the K continuations: the "
        "reliability of an A* from K/2; from all K (Spearman-Brown) it is 2r / (1 + r), and no "
        "credit can correlate with the estimated A* beyond sqrt(2r / (1 + r)): "
        + "; ".join(f"{where}: {ceiling(r):.2f}" for where, r in ceilings if np.isfinite(r))
        + ".",
    ]
    return "\n".join(lines)


def figure(table: list, path: str):
    """One panel per credit on the shared trees: its credit against A* (colour: depth), rho in the
    title; the last panel: rho by depth per credit, with its interval and the noise ceiling."""
    shared = [r for r in table if r[2] and r[1].startswith("shared")]
    credits = [r for r in shared if r[3] is not None]
    n = len(credits) + 1
    cols = min(n, 4)
    fig = Figure(figsize=(3.6 * cols, 3.3 * -(-n // cols)))
    axes = fig.subplots(-(-n // cols), cols, squeeze=False).ravel()
    for ax, (credit, _, steps, name, _) in zip(axes, credits):
        depth = np.minimum([s["depth"] for s in steps], 3)
        x, y = [s["a_star"] for s in steps], [s["credit"][name] for s in steps]
        for d in (1, 2, 3):
            pick = depth == d
            label = f"depth {d}" + "+" * (d == 3)
            ax.scatter(np.array(x)[pick], np.array(y)[pick], s=8, alpha=0.5, label=label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"{credit}: ρ = {spearman(y, x):+.2f}", fontsize=9)
        ax.set(xlabel="A* (Monte Carlo)", ylabel="credit in the loss")
    axes[0].legend(fontsize=7)
    ax = axes[len(credits)]
    labels = list(DEPTHS)
    for i, (credit, _, _, name, m) in enumerate(shared):
        v = np.array([m[k] for k in labels])  # (4, 3): value, low, high
        if name is None:  # the split-half r as the ceiling it implies for a credit
            v = ceiling(v)
        style = dict(color="black", ls="--") if name is None else dict(color=f"C{i}")
        x = np.arange(len(labels)) + 0.06 * (i - len(shared) / 2)
        ax.errorbar(
            x,
            v[:, 0],
            yerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]],
            marker="o",
            ms=3,
            capsize=2,
            lw=1,
            label=credit if name else "noise ceiling sqrt(2r / (1 + r))",
            **style,
        )
    ax.set_xticks(range(len(labels)), labels)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(ylabel="Spearman ρ with A* (95% CI)", title="ρ by depth, shared trees")
    ax.title.set_fontsize(9)
    for spare in axes[n:]:
        spare.axis("off")
    # the legend in the first spare panel, else on this one
    (axes[n] if len(axes) > n else ax).legend(*ax.get_legend_handles_labels(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")


def write(out: str, stored: dict, with_json: bool = True) -> str:
    """results.md, credit_truth.png and (with_json) results.json in `out`, whole or not at all; the
    table's text and where the files are."""
    table = rows(stored)
    text = render(stored, table)
    os.makedirs(out, exist_ok=True)
    texts = {"results.md": text + "\n"}
    if with_json:
        texts["results.json"] = json.dumps(stored, indent=1)
    writers = {os.path.join(out, n): lambda p, t=t: Path(p).write_text(t) for n, t in texts.items()}
    writers[os.path.join(out, "credit_truth.png")] = lambda p: figure(table, p)
    files.write_files(writers)
    return text + "\n\noutputs: " + ", ".join(writers)


def report_file(path: str, out: str) -> str:
    """The table and figure again from a results.json, in `out` (results.md byte for byte as the
    run wrote it); refused where `out` holds another run's results.json."""
    with open(path) as f:
        stored = json.load(f)
    held = os.path.join(out, "results.json")
    if os.path.exists(held) and not os.path.samefile(held, path):
        raise SystemExit(
            f"--report: --out {out} holds another run's results.json, which its results.md would "
            "then contradict; pass another --out (nothing was written)"
        )
    return write(out, stored, with_json=False)
