"""credit_truth.py's statistics, tables, worked example and figure, from its results.json alone (so
that --report writes results.md again byte for byte).

The headline is sibling ranking accuracy: two steps taken from the same context s are siblings
(alternative actions at one state: QVal's Q-alignment, VinePPO's ranking test), and a pair of them
is separated when their A* differ by more than CLEAR combined standard errors. A credit's accuracy
is the share of the separated pairs it orders as A* does, a tie counting one half (chance: 0.5).
Beside it, per credit: the tie share; Spearman's rho between credit and A* over every step; the
share of zero credit among the steps whose |A*| > CLEAR SE. The noise ceiling of rho, and Kendall's
tau between the methods' rankings by sibling accuracy in each policy and draw. Every interval is a
95% bootstrap interval over prompts (a step's and a pair's prompt shares its trees and its values,
so prompts, not pairs, are the independent units), resampled with a fixed seed, the same resamples
for every credit of a table.
"""

import json
import math
import os
from collections import defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import kendalltau, rankdata

from infra import files

CLEAR = 2.0  # two estimates differ where they are more than CLEAR x their combined SE apart
CI = (2.5, 97.5)
FLOOR = "random"  # a seeded N(0, 1) per step: what chance scores
VINE_K = 4  # the VinePPO row's continuations per context (credit_truth.py draws them)
CEILING = f"VinePPO, K = {VINE_K}"  # A = V(s') - V(s) from continuations of its own: a cheap truth
REFERENCES = (FLOOR, CEILING)  # the two rows that are no method: left out of Kendall's tau


# ---- the sibling pairs ------------------------------------------------------------------------


def separated(a: dict, b: dict) -> bool:
    """Whether sibling steps `a` and `b` (taken from one context s) are told apart by their A*:
    |A*_a - A*_b| > CLEAR sqrt(SE_a^2 + SE_b^2), strictly, SE the standard error of each one's
    V(s') (0 for a step that ended: its reward is exact). Their V(s) is one estimate, shared, so
    it cancels from the difference: A*_a - A*_b = V(s'_a) - V(s'_b)."""
    return abs(a["a_star"] - b["a_star"]) > CLEAR * math.hypot(a["se_after"], b["se_after"])


def sibling_pairs(steps: list[dict]) -> list[tuple[dict, dict]]:
    """(better, worse) by A*, for every separated pair among `steps` of two siblings: steps of one
    policy, draw, tree set and prompt taken from the same context (`from`, a hash of its token ids:
    the first steps of a prompt's several trees are siblings too)."""
    groups = defaultdict(list)
    for s in steps:
        groups[(s["policy"], s["draw"], s["set"], s["prompt"], s["from"])].append(s)
    return [
        (a, b) if a["a_star"] > b["a_star"] else (b, a)
        for group in groups.values()
        for a, b in combinations(group, 2)
        if separated(a, b)
    ]


def order(pair: tuple[dict, dict], name: str) -> float:
    """1 where credit `name` puts the pair's better step above its worse one, 1/2 on a tie (the two
    get the same credit, 0 where neither is trained), 0 where it puts it below."""
    better, worse = (s["credit"][name] for s in pair)
    return 1.0 if better > worse else 0.5 if better == worse else 0.0


def kendall(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b between two scorings of the same credits (ties, such as two credits equal
    by construction, count in neither concordant nor discordant pairs); NaN for fewer than 2."""
    return float(kendalltau(x, y).statistic) if len(x) > 1 else float("nan")


# ---- the measures and their bootstrap ---------------------------------------------------------


def columns(steps: list[dict], names: list[str]) -> dict:
    """`steps` and their separated pairs as arrays for `measures`, each tagged with its prompt
    (its draw and prompt: the bootstrap's unit)."""
    units = sorted({(s["draw"], s["prompt"]) for s in steps})
    unit = {u: i for i, u in enumerate(units)}
    pairs = sibling_pairs(steps)
    return {
        "units": len(units),
        "names": names,
        "step_unit": np.array([unit[s["draw"], s["prompt"]] for s in steps], int),
        "credit": np.array([[s["credit"][n] for n in names] for s in steps]).reshape(
            -1, len(names)
        ),
        "a_star": np.array([s["a_star"] for s in steps]),
        "clear": np.array([abs(s["a_star"]) > CLEAR * s["se"] for s in steps], bool),
        "halves": np.array([s["halves"] for s in steps]).reshape(-1, 2),
        "pair_unit": np.array([unit[p[0]["draw"], p[0]["prompt"]] for p in pairs], int),
        "order": np.array([[order(p, n) for n in names] for p in pairs]).reshape(-1, len(names)),
    }


def spearman(x, y):
    """Spearman's rho of each column of `x` (n, k) with `y` (n,) (ties: average ranks); NaN where
    either side is constant or n < 3."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(y) < 3:
        return np.full(x.shape[1], np.nan)
    rx, ry = rankdata(x, axis=0), rankdata(y)
    rx, ry = rx - rx.mean(axis=0), ry - ry.mean()
    norm = np.sqrt((rx**2).sum(axis=0) * (ry**2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, rx.T @ ry / norm, np.nan)


def share(weights, hits):
    """The weighted share of the rows of `hits` (n, k) that are true, per column; NaN without
    weight."""
    total = weights.sum()
    return weights @ hits / total if total > 0 else np.full(hits.shape[1], np.nan)


def measures(c: dict, counts) -> dict[str, np.ndarray]:
    """Each credit's measures (an array over c["names"]) on the prompts of `c` taken counts[u]
    times each (all ones: the data as they are): sibling accuracy and its tie share over the
    separated pairs, pairs (how many), rho over every step, zero credit over the steps whose |A*|
    > CLEAR SE; "ceiling": the split-half rho of A* (one number). (The first version's sign
    agreement is gone: every method scored 0.93 to 1.00 on it, so it separated none.)"""
    w_pair, w_step = counts[c["pair_unit"]], counts[c["step_unit"]]
    take = np.repeat(np.arange(len(w_step)), w_step)  # the resampled steps, duplicates included
    clear = w_step * c["clear"]
    return {
        "sibling": share(w_pair, c["order"]),
        "ties": share(w_pair, c["order"] == 0.5),
        "pairs": np.full(len(c["names"]), w_pair.sum(), float),
        "rho": spearman(c["credit"][take], c["a_star"][take]),
        "zero": share(clear, c["credit"] == 0),
        "ceiling": spearman(c["halves"][take, :1], c["halves"][take, 1])[0],
    }


def with_intervals(c: dict, resamples: int) -> dict[str, dict[str, tuple]]:
    """measures(c) for each credit with its 95% bootstrap interval over prompts: credit (or
    "ceiling") -> measure -> (value, low, high); low and high NaN where fewer than 10 resamples
    give a number."""
    rng = np.random.default_rng(0)
    draws = [
        measures(c, np.bincount(rng.integers(0, c["units"], c["units"]), minlength=c["units"]))
        for _ in range(resamples)
    ]
    point = measures(c, np.ones(c["units"], int))

    def interval(key, i=None):
        v = point[key] if i is None else point[key][i]
        got = np.array([d[key] if i is None else d[key][i] for d in draws], float)
        if not np.isfinite(v) or np.isfinite(got).sum() < 10:
            return float(v), float("nan"), float("nan")
        return float(v), *(float(x) for x in np.nanpercentile(got, CI))

    out = {
        n: {k: interval(k, i) for k in point if k != "ceiling"} for i, n in enumerate(c["names"])
    }
    return out | {"ceiling": {"rho": interval("ceiling")}}


# ---- the tables -------------------------------------------------------------------------------


def runs(stored: dict) -> list[tuple[str, str, list[dict], list[str]]]:
    """(policy, tree set, its steps, its credit names) in table order."""
    out = []
    for policy in stored["policies"]:
        for tree_set in stored["sets"]:
            steps = [s for s in stored["steps"] if s["policy"] == policy and s["set"] == tree_set]
            if steps:
                out.append((policy, tree_set, steps, list(steps[0]["credit"])))
    return out


def tables(stored: dict) -> dict[tuple[str, str], tuple[dict, dict]]:
    """(policy, tree set) -> (columns, with_intervals) of its steps."""
    out = {}
    for policy, tree_set, steps, names in runs(stored):
        c = columns(steps, names)
        out[policy, tree_set] = c, with_intervals(c, stored["args"]["bootstrap"])
    return out


def taus(stored: dict) -> tuple[list[str], np.ndarray]:
    """The shared trees' (policy, draw) runs, and Kendall's tau between every two of them over the
    methods' sibling accuracies (the random and VinePPO rows left out: their places are known)."""
    labels, scores = [], []
    for policy, tree_set, steps, names in runs(stored):
        methods = [n for n in names if n not in REFERENCES]
        for draw in sorted({s["draw"] for s in steps}):
            if tree_set == "shared":
                pairs = sibling_pairs([s for s in steps if s["draw"] == draw])
                labels.append(f"{policy} {draw}")
                scores.append(
                    [np.mean([order(p, n) for p in pairs]) if pairs else np.nan for n in methods]
                )
    tau = np.array([[kendall(x, y) for y in scores] for x in scores]).reshape(len(labels), -1)
    return labels, tau


def tau_cell(x: float) -> str:
    return f"{x:+.2f}" if np.isfinite(x) else "n/a"


def tau_summary(labels: list[str], tau: np.ndarray) -> str:
    """The mean tau between two draws of one policy and between draws of two policies."""
    policy = [x.rsplit(" ", 1)[0] for x in labels]
    pairs = [(i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))]
    said = []
    for what, same in (("two draws of one policy", True), ("the two policies' draws", False)):
        got = [tau[i, j] for i, j in pairs if (policy[i] == policy[j]) == same]
        if got:
            mean = np.nanmean(got) if np.isfinite(got).any() else np.nan
            said.append(f"between {what}: {tau_cell(mean)} ({len(got)} of them)")
    return "Mean τ " + "; ".join(said) + "." if said else "No two draws to compare."


def cell(x: tuple, signed: bool = False) -> str:
    v, lo, hi = x
    if not np.isfinite(v):
        return "n/a"
    f = "{:+.2f}" if signed else "{:.2f}"
    return f.format(v) + (f" [{f.format(lo)}, {f.format(hi)}]" if np.isfinite(lo) else "")


def headline(stored: dict, got: dict) -> str:
    """The README's table: each credit's sibling accuracy on the shared trees, per policy."""
    policies = [p for p in stored["policies"] if (p, "shared") in got]
    names = list(got[policies[0], "shared"][1]) if policies else []
    count = lambda p: int(got[p, "shared"][1][names[0]]["pairs"][0])
    lines = [
        "| credit | " + " | ".join(f"{p} ({count(p)} pairs)" for p in policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for n in (n for n in names if n != "ceiling"):
        lines.append(
            f"| {n} | "
            + " | ".join(cell(got[p, "shared"][1][n]["sibling"]) for p in policies)
            + " |"
        )
    return "\n".join(lines)


def policy_table(stored: dict, policy: str, got: dict) -> list[str]:
    """One policy's full table: every credit on every tree set, then the noise ceiling."""
    lines = [
        f"**{policy}** ({stored['policies'][policy]}):",
        "",
        "| credit | trees | separated pairs | sibling accuracy | ties | ρ(credit, A*) | zero "
        f"credit (\\|A*\\| > {CLEAR:g} SE) |",
        "|---|---|---:|---|---|---|---|",
    ]
    for tree_set, arm in stored["sets"].items():
        if (policy, tree_set) not in got:
            continue
        where = f"{'shared' if tree_set == 'shared' else 'own'}: {arm}"
        m = got[policy, tree_set][1]
        for n in (n for n in m if n != "ceiling"):
            x = m[n]
            cells = [
                n,
                where,
                str(int(x["pairs"][0])),
                cell(x["sibling"]),
                cell((x["ties"][0], np.nan, np.nan)),
                cell(x["rho"], True),
                cell(x["zero"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        ceiling = [
            "noise ceiling (split-half ρ of A*)",
            where,
            "",
            "",
            "",
            cell(m["ceiling"]["rho"], True),
            "",
        ]
        lines.append("| " + " | ".join(ceiling) + " |")
    return lines + [""]


def ceiling(r):
    """The most a credit can correlate with an A* whose split-half reliability is r: sqrt(2r /
    (1 + r)) (Spearman-Brown: the reliability of the whole K), 0 for r <= 0."""
    r = np.clip(r, 0, 1)
    return np.sqrt(2 * r / (1 + r))


def power(got: dict) -> str:
    """What the pairs buy: per policy on the shared trees, the pairs, the widest half-width of a
    credit's sibling accuracy and rho, and the design effect of prompts on the random row."""
    parts = []
    for (policy, tree_set), (c, m) in got.items():
        if tree_set != "shared":
            continue
        names = [n for n in m if n != "ceiling"]
        n_pairs = int(m[names[0]]["pairs"][0])
        half = {k: max((m[n][k][2] - m[n][k][1]) / 2 for n in names) for k in ("sibling", "rho")}
        said = f"{policy}: {n_pairs} pairs over {c['units']} prompts, widest half-width "
        said += f"{half['sibling']:.3f} (sibling accuracy), {half['rho']:.3f} (ρ)"
        if FLOOR in m and n_pairs:
            lo, hi = m[FLOOR]["sibling"][1:]
            binomial = 1.96 * math.sqrt(0.25 / n_pairs)
            said += f", the random row's {(hi - lo) / 2:.3f} against {binomial:.3f} for "
            said += f"independent pairs (design effect {((hi - lo) / 2 / binomial) ** 2:.1f})"
        parts.append(said)
    return "; ".join(parts)


def render(stored: dict, got: dict) -> str:
    """results.md: the headline table, each policy's table, Kendall's tau, the notes and the worked
    example; `got`: tables(stored)."""
    a = stored["args"]
    quick = a["quick"]
    jobs = min(a.get("jobs", 1), len(stored["policies"]))  # runs before --jobs: one at a time
    lines = [
        "Credit against Monte Carlo truth"
        + " (--quick)" * quick
        + (": the policies " if len(stored["policies"]) > 1 else ": the policy ")
        + ", ".join(stored["policies"])
        + f" (seed {stored['seed']}), each on {a['draws']} "
        f"draw(s) of {a['prompts']} train prompts; shared trees {stored['sets']['shared']}; "
        f"K = {a['K']} continuations per context for A* (VinePPO's 4 drawn apart); "
        f"{a['bootstrap']} bootstrap resamples of the prompts (95% intervals); commit "
        f"{stored['commit']}, {stored['wall_s'] / 60:.0f} min"
        + f" ({jobs} policies at once)" * (jobs > 1)
        + ".",
        "",
    ]
    if quick:
        lines += [
            "A --quick run: fewer prompts than the full run, so fewer separated sibling pairs and "
            "wider intervals; it shows that the measure works, not what it finds.",
            "",
        ]
    lines += [
        "Sibling ranking accuracy on the shared trees (chance: 0.5):",
        "",
        headline(stored, got),
        "",
    ]
    for policy in stored["policies"]:
        lines += policy_table(stored, policy, got)
    labels, tau = taus(stored)
    lines += [
        "Kendall's τ between the methods' rankings by sibling accuracy, each policy and draw on "
        "its own (random and VinePPO left out; n/a: a draw whose methods all tie, or without a "
        "separated pair):",
        "",
        "| | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    lines += [
        f"| {x} | " + " | ".join(tau_cell(t) for t in row) + " |" for x, row in zip(labels, tau)
    ]
    lines += ["", tau_summary(labels, tau)]
    ceilings = [
        (p, ceiling(m["ceiling"]["rho"][0])) for (p, s), (_, m) in got.items() if s == "shared"
    ]
    lines += [
        "",
        f"Siblings: two steps taken from the same context s (the same token ids). A pair is "
        f"separated where |A*_a − A*_b| > {CLEAR:g} sqrt(SE_a² + SE_b²), strictly, each SE that "
        f"of V̂(s′) (0 for a step that ended; V̂(s) is shared and cancels); sibling accuracy is the "
        f"share of the separated pairs a credit orders as A* does, a tie (the same credit, or "
        f"neither trained) counting one half; 'ties' is their share. ρ is Spearman's over every "
        f"step some credit trains (a step a credit leaves untrained: credit 0); zero credit is the "
        f"share with credit 0 among the steps whose |A*| > {CLEAR:g} SE. The noise ceiling is ρ "
        f"between the A* of the two halves of the K continuations; no credit can correlate with "
        f"the estimated A* beyond sqrt(2r / (1 + r)): "
        + "; ".join(f"{p}: {x:.2f}" for p, x in ceilings if np.isfinite(x))
        + ".",
        f"Power: {power(got)}.",
    ]
    example = worked_example(stored)
    return "\n".join(lines + ([example] if example else []))


# ---- the worked example -----------------------------------------------------------------------


def example_pair(stored: dict) -> tuple[dict, dict] | None:
    """The branch point docs/credit.md shows: among the first policy's separated pairs on the
    shared trees, those whose two siblings both have continuations (searches), else any; of them
    the one on which the methods disagree most (the most of them on the less common side of right
    and wrong, then the most wrong; the first in prompt order of those)."""
    first = next(iter(stored["policies"]))
    steps = [s for s in stored["steps"] if s["policy"] == first and s["set"] == "shared"]
    pairs = sibling_pairs(steps)
    pairs = [p for p in pairs if all(s["k_after"] for s in p)] or pairs
    if not pairs:
        return None
    methods = [n for n in pairs[0][0]["credit"] if n not in REFERENCES]
    said = lambda p: [order(p, n) for n in methods]
    disagree = lambda p: (min(said(p).count(1.0), said(p).count(0.0)), said(p).count(0.0))
    return max(pairs, key=disagree)


def worked_example(stored: dict) -> str:
    """One branch point, as docs/credit.md shows it: the two siblings' K continuation rewards,
    V̂(s′), A* and its SE, and what each credit gives them."""
    pair = example_pair(stored)
    if pair is None:
        return ""
    a, b = pair
    draws = lambda s: ", ".join(f"{r:g}" for r in s["k_after"]) if s["k_after"] else "ended"
    value = lambda s: f"{s['v_after']:.3f} ± {s['se_after']:.3f}"
    said = lambda s: s["step"].replace("|", "\\|")  # a query may hold the table's separator
    gap = a["a_star"] - b["a_star"]
    lines = [
        "",
        f"Worked example ({a['policy']}, draw {a['draw']}, prompt {a['prompt']}): the branch point "
        f"before steps {a['id']} and {b['id']}, at turn {a['depth']}.",
        f"V̂(s) = {a['v_before']:.3f}; A*(a) − A*(b) = {gap:.3f} > {CLEAR:g} × "
        f"{math.hypot(a['se_after'], b['se_after']):.3f}: separated, a is the better.",
        "",
        f"| | a: {said(a)} | b: {said(b)} | orders them as A* |",
        "|---|---|---|---|",
        f"| the continuations' rewards from s′ | {draws(a)} | {draws(b)} | |",
        f"| V̂(s′) ± SE | {value(a)} | {value(b)} | |",
        f"| A* = V̂(s′) − V̂(s) | {a['a_star']:+.3f} | {b['a_star']:+.3f} | |",
    ]
    verdict = {1.0: "yes", 0.5: "tie", 0.0: "no"}
    for n in a["credit"]:
        got = [f"{s['credit'][n]:+.3f}" for s in pair]
        lines.append(f"| {n} | {got[0]} | {got[1]} | {verdict[order(pair, n)]} |")
    return "\n".join(lines)


# ---- the figure -------------------------------------------------------------------------------


def figure(stored: dict, got: dict, path: str):
    """Two panels on the shared trees, one row per credit and a marker per policy, with 95%
    intervals: sibling accuracy (chance 0.5 dashed), and ρ with A* (the noise ceiling dashed)."""
    policies = [p for p in stored["policies"] if (p, "shared") in got]
    names = [n for n in got[policies[0], "shared"][1] if n != "ceiling"] if policies else []
    fig = Figure(figsize=(11, 0.35 * len(names) + 1.6))
    axes = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(names))[::-1]
    for i, p in enumerate(policies):
        m = got[p, "shared"][1]
        for ax, key in zip(axes, ("sibling", "rho")):
            v = np.array([m[n][key] for n in names])  # (credits, 3): value, low, high
            ax.errorbar(
                v[:, 0],
                y + 0.15 * (i - (len(policies) - 1) / 2),
                xerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]],
                fmt="o",
                ms=4,
                capsize=2,
                lw=1,
                color=f"C{i}",
                label=p,
            )
        r = ceiling(m["ceiling"]["rho"][0])
        axes[1].axvline(r, color=f"C{i}", ls="--", lw=0.8)
    axes[0].axvline(0.5, color="grey", ls="--", lw=0.8)
    axes[1].axvline(0, color="grey", lw=0.5)
    axes[0].set_yticks(y, names)
    axes[0].set(xlabel="sibling ranking accuracy (95% CI); chance 0.5")
    axes[1].set(xlabel="Spearman ρ(credit, A*) (95% CI); dashed: noise ceiling")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"Credit against Monte Carlo truth on {stored['sets']['shared']} trees"
        + " (--quick)" * stored["args"]["quick"],
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")


# ---- the files --------------------------------------------------------------------------------


def dumps(stored: dict) -> str:
    """results.json's text: the run's settings indented, one line per step (a full run's JSON
    stays small and its diffs readable)."""
    head = json.dumps({k: v for k, v in stored.items() if k != "steps"}, indent=1)
    steps = ",\n".join("  " + json.dumps(s) for s in stored["steps"])
    return head[:-2] + ',\n "steps": [\n' + steps + "\n ]\n}\n"


def write(out: str, stored: dict, with_json: bool = True) -> str:
    """results.md, credit_truth.png and (with_json) results.json in `out`, whole or not at all; the
    table's text and where the files are."""
    got = tables(stored)
    text = render(stored, got)
    os.makedirs(out, exist_ok=True)
    texts = {"results.md": text + "\n"}
    if with_json:
        texts["results.json"] = dumps(stored)
    writers = {os.path.join(out, n): lambda p, t=t: Path(p).write_text(t) for n, t in texts.items()}
    writers[os.path.join(out, "credit_truth.png")] = lambda p: figure(stored, got, p)
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
