"""The comparison's tables and figure (benchmarks/compare.py runs the arms): each arm's summary
per seed, the paired differences in their families of tests, the claims, costs and budgets tables,
the learning curves, and --merge / --report, which rebuild them from results.json files alone.

Families (FAMILIES in compare_arms.py; the statistics in compare_stats.py): at each measure, the
primary family, the five methods against GRPO G=4, is tested by Dunnett's many-to-one test on the
sd pooled over its six arms (the seed x arm residual: each row's own sd rests on n - 1 df); the
later methods (GiGPO, AT2PO, ARPO) against GRPO G=4 likewise, a family of their own (added after
the primary family's results were seen, they leave its tests as they were); the secondary
families, Tree-GRPO's Table 3 sweep and each ablation against its parent, by Holm over their rows'
paired t-tests; the claims table by Holm over its claims. Beside each difference: its
95% interval and its equivalence test at ±MARGIN; under each table, the difference each family
detects at the α its adjusted p uses. "higher" / "lower" / "agrees" / "disagrees" only where the
adjusted p is below 0.05.
"""

import json
import math
import os
import re
import statistics
import subprocess
from pathlib import Path

from matplotlib.figure import Figure

from benchmarks.compare_arms import (
    CLAIMS,
    FAMILIES,
    G4,
    GROUPS,
    MATCHED,
    arm_name,
    arm_prompts,
    arms,
    matched_by,
    nominal,
)
from benchmarks.compare_stats import ALPHA, MARGIN, POWER, Family, Paired, family, holm, paired
from infra import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -------------------------------------------------------------------------------------------------
# Tables and the figure; runs: arm name -> one summary per seed, in seed order


def summarize(rows: list[dict], step0: dict, prompts: int) -> dict:
    """One arm on one seed: its evaluation rows by step (step 0: the seed's eval.py row), cumulative
    generated tokens at each step, tool calls in all, and each step metric's mean over the steps."""
    steps = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    cum, tokens = 0.0, {0: 0.0}
    for r in steps:
        cum += r["rollout/tokens_per_prompt"] * prompts
        tokens[r["step"]] = cum
    return {
        "evals": {0: step0, **{r["step"]: r for r in rows if "eval/em" in r}},
        "tokens": tokens,
        "calls": sum(r["rollout/tool_calls_per_prompt"] * prompts for r in steps),
        "means": {k: statistics.mean(r[k] for r in steps) for k in steps[0] if k != "step"},
    }


def last(s: dict) -> dict:
    return s["evals"][max(s["evals"])]


def measure(s: dict, name: str) -> float:
    """em: the last evaluation's greedy test EM; multihop: its EM on questions of 2 hops or more
    (as many per hop count: the mean of theirs); any other name: that step metric's mean over the
    run."""
    if name == "em":
        return last(s)["eval/em"]
    if name == "multihop":
        return statistics.mean(
            v for k, v in last(s).items() if k.startswith("eval/em_hop") and k != "eval/em_hop1"
        )
    return s["means"][name]


def mean_std(xs: list[float], fmt: str = ".3f") -> str:
    if len(xs) < 2:
        return f"{xs[0]:{fmt}}"
    return f"{statistics.mean(xs):{fmt}} ± {statistics.stdev(xs):{fmt}}"


def reading(x: Paired, adjusted: float, sign: int = 0, tost: bool = True) -> str:
    """One cell: "higher" / "lower" (or, against a claimed sign, "agrees" / "disagrees") where the
    family's adjusted p is below ALPHA, the same "before correction only" where only the raw p is;
    "within ±MARGIN" where the equivalence test's p is below ALPHA (`tost`); else "inconclusive"."""
    if math.isnan(x.p):
        return "no test (one seed or no spread)"
    word = ("higher", "lower")[x.mean < 0]
    if sign:
        word = ("agrees", "disagrees")[x.mean * sign < 0]
    words = [word] if adjusted < ALPHA else [f"{word} before correction only"] * (x.p < ALPHA)
    words += [f"within ±{MARGIN:g}"] * (tost and x.tost() < ALPHA)
    return "; ".join(words) or "inconclusive"


def cells(x: Paired, fmt: str = ".3f") -> list[str]:
    """Mean ± standard error, the 95% interval, raw p; one seed: the difference."""
    if len(x.d) < 2:
        return [f"{x.mean:+{fmt}} (1 seed)", "-", "-"]
    p = "-" if math.isnan(x.p) else f"{x.p:.3f}"
    lo, hi = x.ci()
    return [f"{x.mean:+{fmt}} ± {x.se:{fmt}}", f"[{lo:+{fmt}}, {hi:+{fmt}}]", p]


def number(x: float, fmt: str = ".3f") -> str:
    return "-" if math.isnan(x) else f"{x:{fmt}}"


def row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def shown(runs: dict[str, list[dict]]) -> list[tuple[str, list[str]]]:
    """The groups of GROUPS a report shows: each that holds one of its pairings in these runs, or
    an arm no such group shows; its title and the arms of it the runs hold."""
    held = [
        (
            title,
            [arm_name(f) for f, _ in members if arm_name(f) in runs],
            any(arm_name(f) in runs and arm_name(r) in runs for f, refs in members for r in refs),
        )
        for title, members in GROUPS
    ]
    paired = {n for _, names, pairs in held if pairs for n in names}
    return [(t, names) for t, names, pairs in held if pairs or set(names) - paired]


def em_tables(runs: dict[str, list[dict]]) -> list[str]:
    first = next(iter(runs.values()))
    steps, end = sorted(first[0]["evals"]), max(first[0]["evals"])
    hops = sorted(k for k in last(first[0]) if k.startswith("eval/em_hop"))
    out = [f"### Greedy test EM, mean ± std over {len(first)} seed(s) (step 0: warm start)", ""]
    for title, names in shown(runs):
        out += [
            f"**{title}**",
            "",
            row(
                "arm",
                *(f"step {t}" for t in steps),
                *(f"{h[len('eval/em_hop') :]}-hop @ {end}" for h in hops),
            ),
            row(*["---"] * (1 + len(steps) + len(hops))),
        ]
        for arm in names:
            seeds = runs[arm]
            out.append(
                row(
                    arm,
                    *(mean_std([s["evals"][t]["eval/em"] for s in seeds]) for t in steps),
                    *(mean_std([last(s)[h] for s in seeds]) for h in hops),
                )
            )
        out.append("")
    return out


def families(runs: dict[str, list[dict]], pick) -> list[tuple[str, str, Family]]:
    """Each family of FAMILIES whose pairings these runs hold, tested on the measure pick(summary)
    (compare_stats.family): its name, its title, its tests."""
    out = []
    for name, title, groups, dunnett in FAMILIES:
        pairs = dict.fromkeys(
            (arm_name(f), arm_name(r))
            for g in groups
            for f, refs in GROUPS[g][1]
            for r in refs
            if arm_name(f) in runs and arm_name(r) in runs
        )
        if pairs:
            values = {n: [pick(s) for s in runs[n]] for pair in pairs for n in pair}
            out.append((name, title, family(values, list(pairs), dunnett)))
    return out


def family_line(name: str, title: str, f: Family) -> str:
    """A family's test and what it detects, in one line."""
    k, arms = len(f.tests), len({n for pair in f.tests for n in pair})
    how = (
        f"Dunnett over {k} on the pooled sd, critical t {number(f.crit, '.2f')} ({f.test_df} df)"
        if f.dunnett
        else f"Holm over {k}, the smallest p tested at {ALPHA:g}/{k} on its row's own sd "
        f"({f.test_df} df)"
    )
    return (
        f"- {name} ({title}): {how}. The sd of a paired difference pooled over its {arms} arms "
        f"(seed × arm residual × √2, {f.df} df): {number(f.sd)}; at that sd, {POWER:.0%} power "
        f"at this α detects {number(f.mde)}, at p < {ALPHA} alone {number(f.mde_alone)}"
    )


SIGNIFICANCE = (
    "Δ ± se, the 95% interval and p: the paired t-test over seeds on the row's own sd; TOST p: "
    f"Schuirmann's two one-sided tests against ±{MARGIN} (below {ALPHA}: the 90% interval lies "
    "within it); adjusted p: within the row's family of tests (family): primary, Dunnett's test "
    "on the sd pooled over the family's arms; sweep and ablation, Holm over the family's rows; "
    f'arm > ref: seeds where the arm is ahead. "higher" / "lower" where the adjusted p is below '
    f'{ALPHA}, "within ±{MARGIN}" where the TOST p is. Under each table, what each family '
    "detects"
)


def difference_table(runs: dict[str, list[dict]]) -> list[str]:
    first = next(iter(runs.values()))[0]
    steps, end = sorted(first["evals"]), max(first["evals"])
    early = steps[1] if len(steps) > 2 else end  # the first evaluation after step 0
    top = max(int(k[len("eval/em_hop") :]) for k in last(first) if k.startswith("eval/em_hop"))
    picks = [
        (f"EM @ step {early}", lambda s: s["evals"][early]["eval/em"]),
        (f"EM @ step {end}", lambda s: measure(s, "em")),
        (f"multi-hop EM @ step {end}", lambda s: measure(s, "multihop")),
        (f"{top}-hop EM @ step {end}", lambda s: last(s)[f"eval/em_hop{top}"]),
    ]
    picks = picks[early == end :]  # evaluated at step 0 and the end only: one table
    out = [
        "### Paired differences, arm − reference on the same seeds: one table per measure, each "
        "row in one family of tests",
        "",
        SIGNIFICANCE + ".",
        "",
    ]
    head = ["family", "arm", "reference", "Δ ± se", "95% CI", "p", "adjusted p", "TOST p"]
    for title, pick in picks:
        out += [f"**{title}**", "", row(*head, "arm > ref", "reading"), row(*["---"] * 10)]
        every = families(runs, pick)
        for name, _, f in every:
            for (arm, ref), (x, adjusted) in f.tests.items():
                ahead = f"{sum(v > 0 for v in x.d)}/{len(x.d)}"
                out.append(
                    row(
                        name,
                        arm,
                        ref,
                        *cells(x),
                        number(adjusted),
                        number(x.tost()),
                        ahead,
                        reading(x, adjusted),
                    )
                )
        out += ["", *(family_line(*f) for f in every), ""]
    return out


def claims_table(runs: dict[str, list[dict]]) -> list[str]:
    claims = [
        (claim, arm_name(arm), arm_name(ref), m, sign)
        for claim, arm, ref, m, sign in CLAIMS
        if arm_name(arm) in runs and arm_name(ref) in runs
    ]
    diffs = [
        paired([measure(s, m) for s in runs[arm]], [measure(s, m) for s in runs[ref]])
        for _, arm, ref, m, _ in claims
    ]
    adjusted = holm([x.p for x in diffs])
    out = [
        "### The papers' claims beside ours (EM: at the last evaluation; costs: per step, their "
        "ratio of means in brackets); Holm p over the table's claims; "
        '"agrees" / "disagrees" where the Holm p is below ' + f"{ALPHA}",
        "",
        row("claim", "measure", "ours: arm − reference", "Δ ± se", "95% CI", "p", "Holm p", "here"),
        row(*["---"] * 8),
    ]
    for (claim, arm, ref, m, sign), x, h in zip(claims, diffs, adjusted):
        fmt = ".3f" if m in ("em", "multihop") else ".2f"
        delta, ci, p = cells(x, fmt)
        if m not in ("em", "multihop"):
            ratio = statistics.mean(measure(s, m) for s in runs[arm]) / statistics.mean(
                measure(s, m) for s in runs[ref]
            )
            delta += f" ({ratio - 1:+.0%})"
        here = reading(x, h, sign, tost=False)
        out.append(row(claim, m, f"{arm} − {ref}", delta, ci, p, number(h), here))
    return out + [""]


COST = [
    ("generated tokens / prompt / step", "rollout/tokens_per_prompt", ".0f"),
    ("tool calls / prompt / step", "rollout/tool_calls_per_prompt", ".1f"),
    ("leaves / prompt", "tree/leaves_per_prompt", ".1f"),
    ("trained tokens / step", "train/tokens_trained", ".0f"),
    ("update actions / step", "train/actions_trained", ".0f"),
    ("samples / step", "train/samples", ".0f"),
    ("rollout s", "train/time_rollout", ".2f"),
    ("log-prob s", "train/time_logprob", ".2f"),
    ("update s", "train/time_update", ".2f"),
]


def budget(runs: dict[str, list[dict]], arm: str) -> float:
    """An arm's generated tokens per prompt per step: the mean over its steps and seeds."""
    return statistics.mean(s["means"]["rollout/tokens_per_prompt"] for s in runs[arm])


def cost_table(runs: dict[str, list[dict]], walls: dict[str, list[float]]) -> list[str]:
    target = budget(runs, arm_name(G4)) if arm_name(G4) in runs else math.nan
    out = [
        "### Cost per arm: means over steps and seeds; seconds per RL step split as BranPO's "
        "Table 8 (seconds as the arms ran: --jobs at a time, in a fixed order, not a timing "
        "experiment)",
        "",
        row(
            "arm",
            COST[0][0],
            "vs GRPO G=4",
            *(c[0] for c in COST[1:]),
            "step s",
            "rollout ms / generated token",
            "whole run: generated tokens, tool calls",
            "arm wall min",
        ),
        row(*["---"] * (len(COST) + 6)),
    ]
    for arm, seeds in runs.items():
        cells = [f"{statistics.mean(s['means'][k] for s in seeds):{fmt}}" for _, k, fmt in COST]
        step_s = statistics.mean(
            sum(s["means"][f"train/time_{x}"] for x in ("rollout", "logprob", "update"))
            for s in seeds
        )
        total = statistics.mean(s["tokens"][max(s["tokens"])] for s in seeds)
        per_token = statistics.mean(  # the run's rollout seconds over its generated tokens
            s["means"]["train/time_rollout"] * max(s["tokens"]) / s["tokens"][max(s["tokens"])]
            for s in seeds
        )
        calls = statistics.mean(s["calls"] for s in seeds)
        vs = "-" if math.isnan(target) else f"{budget(runs, arm) / target - 1:+.0%}"
        out.append(
            row(
                arm,
                cells[0],
                vs,
                *cells[1:],
                f"{step_s:.2f}",
                f"{1000 * per_token:.2f}",
                f"{total / 1000:.1f}k, {calls:.0f}",
                f"{statistics.mean(walls[arm]) / 60:.1f}",
            )
        )
    matched = [
        (n, budget(runs, n) / target - 1)
        for n in (arm_name(f) for f in MATCHED.values() if not arm_prompts(f))  # per prompt
        if n in runs and n != arm_name(G4)
    ]
    if matched and not math.isnan(target):
        out += [
            "",
            f"Matched budget: the target is GRPO G=4's {target:.0f} generated tokens per "
            f"prompt per step; achieved: "
            + "; ".join(f"{n} {d:+.0%}" + " (OUTSIDE ±15%)" * (abs(d) > 0.15) for n, d in matched),
        ]
    return out + [""]


BUDGET = [  # (column, metric, format): each as the arm's value and its ratio to the reference's
    ("leaves / prompt", "tree/leaves_per_prompt", ".1f"),
    ("generated tokens / prompt", "rollout/tokens_per_prompt", ".0f"),
    ("trained tokens / step", "train/tokens_trained", ".0f"),
    ("rollout s / step", "train/time_rollout", ".2f"),
]


def budget_table(runs: dict[str, list[dict]]) -> list[str]:
    """The budget sweep's and the matched methods' pairings (GROUPS' first three groups): which
    definition each matches, and what each costs against its reference."""
    flags = arms()
    chosen = dict.fromkeys(
        (arm_name(f), arm_name(r)) for _, members in GROUPS[:3] for f, refs in members for r in refs
    )
    out = [
        "### Budgets: each arm against its reference, means over steps and seeds (ratio in "
        "brackets; seconds on shared cores are noisy)",
        "",
        row("arm", "reference", "matched by", "nominal budget", *(c[0] for c in BUDGET)),
        row(*["---"] * (4 + len(BUDGET))),
    ]
    for arm, ref in (p for p in chosen if p[0] in runs and p[1] in runs):
        b, b_ref = nominal(flags[arm]), nominal(flags[ref])
        mean = {
            n: {k: statistics.mean(s["means"][k] for s in runs[n]) for _, k, _ in BUDGET}
            for n in (arm, ref)
        }
        out.append(
            row(
                arm,
                ref,
                matched_by(flags[arm], flags[ref]),
                "-" if b is None or b_ref is None else f"{b:g} vs {b_ref:g}",
                *(
                    f"{mean[arm][k]:{fmt}} ({mean[arm][k] / mean[ref][k] - 1:+.0%})"
                    for _, k, fmt in BUDGET
                ),
            )
        )
    return out + [""]


def figure(runs: dict[str, list[dict]], path: str):
    """Test EM against step (left) and cumulative generated tokens (right), a row per group, a line
    per arm (mean over seeds), the seeds' min-max as a band."""
    groups = shown(runs)
    fig = Figure(figsize=(11, 3.2 * len(groups)))
    for axes, (title, names) in zip(fig.subplots(len(groups), 2, squeeze=False), groups):
        for i, arm in enumerate(names):
            steps = sorted(runs[arm][0]["evals"])
            em = [[s["evals"][t]["eval/em"] for s in runs[arm]] for t in steps]  # [step][seed]
            tokens = [statistics.mean(s["tokens"][t] for s in runs[arm]) / 1000 for t in steps]
            for ax, x in zip(axes, (steps, tokens)):
                ax.plot(x, [statistics.mean(e) for e in em], "o-", ms=3, color=f"C{i}", label=arm)
                ax.fill_between(
                    x, [min(e) for e in em], [max(e) for e in em], color=f"C{i}", alpha=0.15
                )
        axes[0].set_title(title, fontsize=8, loc="left")
        axes[0].set(xlabel="RL step", ylabel="greedy test EM")
        axes[1].set(xlabel="generated tokens, cumulative (thousands)")
        axes[0].legend(fontsize=7)
        for ax in axes:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")


# -------------------------------------------------------------------------------------------------
# Reports: results.json written, merged and read back


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def without_eval_every(flags: str) -> str:
    """Shared train.py flags less --eval_every: the one flag that files to merge may differ in."""
    return re.sub(r"\s*--eval_every[ =]\S+", "", flags).strip()


def read_results(path: str) -> dict:
    """A results.json (a run's or a --merge's), or a message naming the file and what is wrong."""
    try:
        d = json.loads(Path(path).read_text())
        problem = "" if isinstance(d, dict) else f"it holds a {type(d).__name__}, not an object"
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        problem = f"{type(e).__name__}: {e}"
    missing = (
        [] if problem else [k for k in ("seeds", "train_flags", "runs", "walls") if k not in d]
    )
    if problem or missing:
        raise SystemExit(
            f"{path} is not a results.json that benchmarks/compare.py wrote ("
            + (problem or f"it has no {', '.join(missing)}")
            + "); pass one (nothing was written)"
        )
    return d


def refuse_overwrite(out: str, inputs: list[str], merging: bool):
    """Stop a --merge (`merging`) or --report of `inputs` that would write into `out` over an input
    (a merge's results.json) or over another comparison's files (not an earlier merge's), which
    would then no longer match its results.json."""
    held = os.path.join(out, "results.json")
    mine = os.path.exists(held) and any(os.path.samefile(p, held) for p in inputs)
    if not os.path.exists(held) or (mine and not merging):
        return  # --report of out's own results.json: its results.md and curves.png again
    if merging and not mine and read_results(held).get("how", "").startswith("merged by --merge"):
        return  # an earlier merge's: replaced
    raise SystemExit(
        f"--{'merge' if merging else 'report'}: --out {out} holds {held}, "
        + ("one of the inputs" if mine else "another comparison's results.json")
        + ", which this would overwrite or contradict; pass another --out (nothing was written)"
    )


def merge(paths: list[str], setting: str | None) -> tuple[dict, list[int], str, dict, dict, str]:
    """Several results.json files as one run, seeds in order: their setting (`setting`'s; None:
    any) and shared flags must agree, except --eval_every (evaluating draws nothing from
    training's random state: tests/test_train.py). Files join seeds (later seeds of the same arms)
    and arms (later arms over the same seeds, each seed's warm start the same: its step-0
    evaluation equal in every file); a seed's arm comes from one file only. The arms every seed
    holds are kept, at the evaluation steps all their seeds share: a file of `--arms matched
    --train_flags=""` (steps 0 and 15) adds seeds to the matched-budget tables. Returns what main()
    writes, and where it came from."""
    parts = [read_results(p) for p in paths]
    first = parts[0]
    keys = ("setting", "world flags", "warm start flags", "train_flags")
    problems = [
        f"{path}: {k} {p.get(k)!r}, not {first.get(k)!r} as in {paths[0]}"
        for path, p in zip(paths, parts)
        for k in keys
        if p.get(k) != first.get(k)
        and (k != "train_flags" or without_eval_every(p[k]) != without_eval_every(first[k]))
    ]
    if setting is not None and (held := first.get("setting", "default")) != setting:
        problems.append(f"the files hold setting {held!r}: pass --setting")
    cells, step0 = {}, {}  # seed -> arm -> (summary, wall); seed -> (path, its step-0 EM)
    for path, p in zip(paths, parts):
        for n, summaries in p["runs"].items():
            for seed, s, wall in zip(p["seeds"], summaries, p["walls"][n]):
                if n in cells.setdefault(seed, {}):
                    problems.append(f"seed {seed}'s {n} is in two files")
                cells[seed][n] = s, wall
                where, em = step0.setdefault(seed, (path, s["evals"]["0"]))
                if em != s["evals"]["0"]:
                    warm = f"seed {seed}'s step 0 in {path} is not the one in {where}"
                    problems.append(warm + " (another warm start)")
    seeds = sorted(cells)
    every = list(dict.fromkeys(n for p in parts for n in p["runs"]))
    kept = [n for n in every if all(n in cells[seed] for seed in seeds)]
    problems += [f"no arm is at every seed ({', '.join(paths)})"] * (not kept)
    if problems:
        raise SystemExit(
            "--merge: the files do not make one run (nothing was written):\n  "
            + "\n  ".join(dict.fromkeys(problems))
        )

    def steps(d: dict) -> dict:  # JSON made the steps strings
        return {int(k): v for k, v in d.items()}

    schedules = {frozenset(steps(cells[seed][n][0]["evals"])) for seed in seeds for n in kept}
    shared = frozenset.intersection(*schedules)
    runs = {
        n: [
            {**s, "evals": {t: e for t, e in steps(s["evals"]).items() if t in shared}}
            | {"tokens": steps(s["tokens"])}
            for s in (cells[seed][n][0] for seed in seeds)
        ]
        for n in kept
    }
    walls = {n: [cells[seed][n][1] for seed in seeds] for n in kept}
    named = {k: first[k] for k in keys[:3] if k in first}
    flags = {p["train_flags"] for p in parts}
    source = "; ".join(
        f"seed{'s' * (len(p['seeds']) > 1)} {', '.join(map(str, p['seeds']))} from {path} (commit "
        f"{p.get('commit', 'not recorded')}"
        + f", train.py flags {p['train_flags']!r}" * (len(flags) > 1)
        + ")"
        for path, p in zip(paths, parts)
    )
    if len(kept) < len(every):
        source += f"; arms not at every seed, left out: {', '.join(sorted(set(every) - set(kept)))}"
    if len(schedules) > 1:
        source += f"; the evaluation steps every seed has: {', '.join(map(str, sorted(shared)))}"
    train_flags = (
        first["train_flags"] if len(flags) == 1 else without_eval_every(first["train_flags"])
    )
    return named, seeds, train_flags, runs, walls, source


def render(named: dict, seeds: list[int], train_flags: str, runs: dict, walls: dict, how: str):
    """Every table as results.md holds it: a function of results.json's contents alone."""
    return "\n".join(
        em_tables(runs)
        + difference_table(runs)
        + claims_table(runs)
        + cost_table(runs, walls)
        + budget_table(runs)
        + [
            "".join(f"{k} {v!r}; " for k, v in named.items())
            + f"Seeds {', '.join(map(str, seeds))}; {len(runs)} arms; shared train.py "
            f"flags {train_flags!r}; {how}"
        ]
    )


def write_report(
    out: str, named: dict, seeds: list[int], train_flags: str, runs: dict, walls: dict, how: str
) -> str:
    """Every table, the figure and results.json in `out`, whole or not at all; the tables' text."""
    text = render(named, seeds, train_flags, runs, walls, how)
    stored = {**named, "seeds": seeds, "train_flags": train_flags, "commit": commit(), "how": how}
    texts = {"results.md": text + "\n"}
    texts["results.json"] = json.dumps({**stored, "runs": runs, "walls": walls}, indent=1)
    return text + "\n\noutputs: " + ", ".join(write_whole(out, runs, texts))


def write_whole(out: str, runs: dict, texts: dict[str, str]) -> list[str]:
    """`texts` (file name -> text) and the figure of `runs` (curves.png) in `out`, all whole or
    none (files.write_files); their paths."""
    os.makedirs(out, exist_ok=True)
    writers = {os.path.join(out, n): lambda p, t=t: Path(p).write_text(t) for n, t in texts.items()}
    writers[os.path.join(out, "curves.png")] = lambda p: figure(runs, p)
    files.write_files(writers)
    return list(writers)


def report_file(path: str, out: str) -> str:
    """The tables and the figure again from one results.json (a run's or a --merge's), in `out`,
    whole or not at all (refused over another's: `refuse_overwrite`): results.md byte for byte as
    the run wrote it (its provenance line is stored in the file)."""
    (named, seeds, train_flags, runs, walls, _), stored = merge([path], None), read_results(path)
    refuse_overwrite(out, [path], merging=False)
    how = stored.get("how") or f"from {path} (commit {stored.get('commit', 'not recorded')})."
    text = render(named, seeds, train_flags, runs, walls, how)
    written = write_whole(out, runs, {"results.md": text + "\n"})
    return text + "\n\noutputs: " + ", ".join(written)
