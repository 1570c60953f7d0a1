"""What benchmarks/compare.py compares: the arms (each one's train.py flags and its name in the
tables), the groups each table sets side by side, the papers' claims set beside ours, the settings
(worlds) every seed runs in, and which budget definition each pairing matches. A new arm or claim is
an edit here; the running is compare.py's, the tables compare_report.py's, the statistics
compare_stats.py's."""

import functools
import re
from dataclasses import dataclass

from advantages import CreditConfig
from infra.flags import parse
from rollout import RolloutConfig
from scripts.credit import tree_grpo_budget


def grpo(G: int) -> str:
    return f"--algo grpo --grpo_G {G}"


def tree(M: int, N: int, L: int) -> str:
    return f"--algo tree_grpo --tree_M {M} --tree_N {N} --tree_L {L}"


def vine(G: int, K: int, prompts: int = 0) -> str:
    """VinePPO: G chains, K continuations per context; `prompts` per step (0: the shared ones)."""
    return f"--algo vineppo --grpo_G {G} --vineppo_K {K}" + f" --prompts_per_step {prompts}" * (
        prompts > 0
    )


@dataclass
class ArmPrompts:
    """The one train.py flag an arm may set beside its method's knobs."""

    prompts_per_step: int = 0
    """This arm's prompts per step (a budget met with fewer prompts); 0: the shared flags'."""


# The matched budget: GRPO G=4's generated tokens per prompt per step, each method within +-15% of
# it. Chosen among CANDIDATES with `--calibrate` on seed 0's warm start (docs/comparison.md); the
# comments give each against GRPO G=4 over 3 steps (every candidate) and 15 steps (the nearest
# ones).
VINE_PROMPTS = 1  # VinePPO (4,4)'s prompts per step at GRPO G=4's tokens per step (shared: 8)
MATCHED = {
    "grpo": grpo(4),
    "tree_grpo": tree(2, 1, 1),  # -12%, -15.2%; (2,2,1) +19%, +18%; M=1: intra = inter
    "branpo": "--algo branpo --branpo_N 2",  # +21%, +6%; N=1 -45%, N=3 +85%
    "carl": "--algo carl --carl_N0 1 --carl_N 6",  # -1%, -3%; (1,8) +19%, +21%
    "treeps": "--algo treeps --treeps_N 3 --treeps_retain 2",  # +9%, +2%; (4,2) +28%, +18%
    # the later methods, calibrated after the five's comparison had run (on its seed 0)
    "gigpo": "--algo gigpo --grpo_G 4",  # -0%: GRPO's chains, GRPO G=4's budget by construction
    "at2po": "--algo at2po --tree_M 3 --tree_N 1 --tree_L 1",  # -5%; (2,2,1) -13%, (2,1,2) -14%
    "arpo": "--algo arpo --grpo_G 2 --arpo_M 5",  # -3%; (2,4) -13%, (3,5) +13%
    # the ceiling, matched per step, with fewer prompts: VinePPO (G, K) = (4, 4) generates 1770
    # tokens per prompt per step against GRPO G=4's 256 (6.9x, +591%; 3 steps on seed 0); at 1
    # prompt a step that is 1770 against 8 x 256 = 2048 tokens per step, -14%; at 2, +73%
    "vineppo": vine(4, 4, VINE_PROMPTS),
    # the turn-level credits: GRPO's chains (IGPO adds one teacher-forced pass, no sampled token)
    "igpo": "--algo igpo --grpo_G 4",
    "mtgrpo": "--algo mtgrpo --grpo_G 4",
}
AT2PO = [(2, 2, 1), (3, 1, 1), (2, 1, 2)]  # --calibrate's AT2PO (M, N, L): 4 leaves each
CANDIDATES = {  # --calibrate's knobs per method; the budget grows with G, trees, N, forks, nodes
    "grpo": [grpo(4)],
    "tree_grpo": [tree(2, 1, 1), tree(2, 1, 2), tree(2, 2, 1)],
    "branpo": [f"--algo branpo --branpo_N {n}" for n in (1, 2, 3)],
    "carl": [f"--algo carl --carl_N0 1 --carl_N {n}" for n in (4, 6, 8, 10)],
    "treeps": [f"--algo treeps --treeps_N {n} --treeps_retain 2" for n in (3, 4, 5)],
    # the later methods (GiGPO's chains are GRPO's; AT2PO's one tree has M + L N leaves; ARPO
    # starts G chains and ends with M leaves)
    "gigpo": ["--algo gigpo --grpo_G 4"],
    "at2po": [f"--algo at2po --tree_M {m} --tree_N {n} --tree_L {x}" for m, n, x in AT2PO],
    "arpo": [f"--algo arpo --grpo_G {g} --arpo_M {m}" for g, m in ((2, 4), (2, 5), (3, 5))],
    # VinePPO at the shared prompts per step (its token multiple), then at fewer
    "vineppo": [vine(4, 4), *(vine(4, 4, p) for p in (1, 2))],
    "igpo": ["--algo igpo --grpo_G 4"],
    "mtgrpo": ["--algo mtgrpo --grpo_G 4"],
}
TREE, G4 = MATCHED["tree_grpo"], grpo(4)
GROUPS = [  # (title, [(an arm's flags, the arms it is compared with, paired by seed)]); an ablation
    # is compared with its parent only (against GRPO G=4 it would test nothing a paper claims)
    (
        "Tree-GRPO's budget sweep (its Table 3): chains against trees at ~2, 4, 8 trajectories",
        [
            (grpo(2), ()),
            (grpo(4), ()),
            (grpo(8), ()),
            (tree(1, 2, 1), (grpo(2),)),
            (tree(2, 2, 1), (grpo(4),)),
            (tree(4, 2, 1), (grpo(8),)),
        ],
    ),
    (
        "the five methods at GRPO G=4's budget (Tree-GRPO at both of its matches: (2,1,1) in "
        "generated tokens, (2,2,1) in its Table 3's budget M(1 + LN/2) = 4)",
        [(G4, ()), (TREE, (G4,)), (tree(2, 2, 1), (G4,))]
        + [(MATCHED[a], (G4,)) for a in ("branpo", "carl", "treeps")],
    ),
    (
        "the later methods at GRPO G=4's budget (GiGPO, AT2PO, ARPO; IGPO, MT-GRPO per turn index "
        "and unbiased: each added after the five's comparison, over its seeds and warm starts)",
        [(G4, ())]
        + [(MATCHED[a], (G4,)) for a in ("gigpo", "at2po", "arpo", "igpo", "mtgrpo")]
        + [(MATCHED["mtgrpo"] + " --mtgrpo_baseline unbiased", (G4,))],
    ),
    (
        "Tree-GRPO's advantage (its Table 4): intra-tree, inter-tree, both",
        [
            (TREE + " --tree_mode intra", (TREE,)),
            (TREE + " --tree_mode inter", (TREE,)),
            (TREE, ()),
        ],
    ),
    (
        "each paper's own ablation at the matched budget",
        [
            (MATCHED["treeps"] + " --no_treeps_process", (MATCHED["treeps"],)),
            (MATCHED["carl"] + " --carl_update_all", (MATCHED["carl"],)),
            (MATCHED["branpo"] + " --no_branpo_rsm", (MATCHED["branpo"],)),
        ],
    ),
    (
        "the ceiling: VinePPO's Monte Carlo values at every context, near-exact credit, at GRPO "
        "G=4's prompts per step (its tokens a multiple of GRPO's) and at GRPO G=4's tokens per "
        "step (fewer prompts)",
        [(G4, ()), (vine(4, 4), (G4,)), (MATCHED["vineppo"], (G4,))],
    ),
]
FAMILIES = [  # (name, title, the GROUPS whose pairings it tests, Dunnett's test (else Holm's))
    ("primary", "the five methods against GRPO G=4", (1,), True),
    ("later", "the later methods against GRPO G=4, a family of their own", (2,), True),
    ("sweep", "Tree-GRPO's Table 3 sweep, each tree against its chains", (0,), False),
    ("ablation", "each ablation against the method it ablates", (3, 4), False),
    ("ceiling", "VinePPO against GRPO G=4, a family of its own: can credit win here?", (5,), True),
]
SETS = {  # --arms NAME: a group's arms (with "matched", 1 h per pair of hard-setting seeds)
    "matched": [f for f, _ in GROUPS[1][1]],  # the five methods at GRPO G=4's budget
    "later": [f for f, _ in GROUPS[2][1]],  # the later methods and GRPO G=4
    "ceiling": [f for f, _ in GROUPS[5][1]],  # VinePPO's two arms and GRPO G=4
}
CLAIMS = [  # (a paper's claim, its numbers; arm; reference; measure(); the sign it claims)
    (
        "Tree-GRPO Table 3, budget ~2: tree (1,2,1) beats chains (multi-hop EM 31.6 vs 14.9)",
        tree(1, 2, 1),
        grpo(2),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 3, budget ~4: tree (2,2,1) beats chains (36.8 vs 31.8)",
        tree(2, 2, 1),
        grpo(4),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 3, budget ~8: tree (4,2,1) beats chains (35.1 vs 31.4)",
        tree(4, 2, 1),
        grpo(8),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 4: the intra-tree advantage alone collapses (1.2 vs GRPO 31.8), from a "
        "base model over a full run; a warm-started 0.8M-parameter policy for 15 steps cannot "
        "test that",
        TREE + " --tree_mode intra",
        G4,
        "multihop",
        -1,
    ),
    (
        "Tree-GRPO Table 4: the inter-tree advantage alone is below both (33.8 vs 36.8)",
        TREE + " --tree_mode inter",
        TREE,
        "multihop",
        -1,
    ),
    (
        "TreePS-RAG Table 2: the process advantage beats GRPO on its trees (multi-hop 0.448 vs "
        "0.419)",
        MATCHED["treeps"],
        MATCHED["treeps"] + " --no_treeps_process",
        "multihop",
        +1,
    ),
    (
        "CARL Table 4: updating only critical actions beats updating all (~1 point)",
        MATCHED["carl"],
        MATCHED["carl"] + " --carl_update_all",
        "em",
        +1,
    ),
    (
        "CARL (its Eq. 15 and after): 60% fewer update actions than GRPO",
        MATCHED["carl"],
        G4,
        "train/actions_trained",
        -1,
    ),
    (
        "BranPO Table 4: redundant step masking helps (multi-hop F1 54.6 vs 53.7)",
        MATCHED["branpo"],
        MATCHED["branpo"] + " --no_branpo_rsm",
        "multihop",
        +1,
    ),
    (
        "BranPO Table 8: its rollout takes longer than GRPO's (191 vs 108 s a step)",
        MATCHED["branpo"],
        G4,
        "train/time_rollout",
        +1,
    ),
    (
        "BranPO Table 8: its update takes less time than GRPO's (182 vs 251 s a step)",
        MATCHED["branpo"],
        G4,
        "train/time_update",
        -1,
    ),
]
QUICK_ARMS = [grpo(2), tree(1, 2, 1)]

# The worlds the comparison runs in; every seed's world, warm start and arm alike. Each setting:
# flags of infra/data.py's WorldConfig (world), of protocol.AgentConfig (agent: the warm start's and
# every arm's, before --warm_flags and --train_flags, which win) and of WarmConfig (warm). "hard"
# (docs/comparison.md, "The hard setting"): 6 hops (a search round each), twice the look-alike
# passages, and a demonstrator that stops after 4 searches on 5- and 6-hop questions.
SETTINGS = {
    "default": dict(world="", agent="", warm=""),
    "hard": dict(
        world="--max_hops 6 --distractor_fraction 0.6",
        agent="--max_turns 6 --max_traj_tokens 1536",
        warm="--search_budget 4",
    ),
}


def algo_config(flags: str) -> tuple[RolloutConfig, CreditConfig]:
    return parse(RolloutConfig, CreditConfig, ArmPrompts, args=flags.split())[:2]


def arm_prompts(flags: str) -> int:
    """The prompts per step an arm sets for itself (0: the shared flags')."""
    return parse(RolloutConfig, CreditConfig, ArmPrompts, args=flags.split())[2].prompts_per_step


@functools.cache  # parsing flags takes 40 ms; the tables ask for hundreds of names
def arm_name(flags: str) -> str:
    """An arm's name in the tables, from its method's knobs (the defaults where unset)."""
    r, c = algo_config(flags)
    mode = {"intra": " intra only", "inter": " inter only", "treepo": " TreePO"}.get(
        c.tree_mode, ""
    )
    return {
        "grpo": f"GRPO G={r.grpo_G}",
        "tree_grpo": f"Tree-GRPO ({r.tree_M},{r.tree_N},{r.tree_L})" + mode,
        "branpo": f"BranPO N={r.branpo_N}" + " no RSM" * (not r.branpo_rsm),
        "carl": f"CARL ({r.carl_N0},{r.carl_N})" + " update-all" * c.carl_update_all,
        "treeps": f"TreePS ({r.treeps_N},{r.treeps_retain})"
        + " no process" * (not c.treeps_process),
        "gigpo": f"GiGPO G={r.grpo_G}",
        "at2po": f"AT2PO ({r.tree_M},{r.tree_N},{r.tree_L})",
        "arpo": f"ARPO ({r.grpo_G},{r.arpo_M})" + " hard" * (c.arpo_credit == "hard"),
        "vineppo": f"VinePPO G={r.grpo_G} K={r.vineppo_K}"
        + f", {arm_prompts(flags)} prompts/step" * (arm_prompts(flags) > 0),
        "igpo": f"IGPO G={r.grpo_G}"
        + " log-prob gain" * (c.igpo_gain == "logprob")
        + " discount first" * (c.igpo_order == "discount"),
        "mtgrpo": f"MT-GRPO G={r.grpo_G}" + " unbiased" * (c.mtgrpo_baseline == "unbiased"),
    }[r.algo]


def arms() -> dict[str, str]:
    """Every arm of GROUPS once: name -> flags; two arms of one name but other knobs: refused."""
    out = {}
    for flags in (f for _, members in GROUPS for arm, refs in members for f in (arm, *refs)):
        name = arm_name(flags)
        if algo_config(out.setdefault(name, flags)) != algo_config(flags):
            raise ValueError(
                f"arms {out[name]!r} and {flags!r} are both named {name!r}; extend "
                f"arm_name so that the tables tell them apart"
            )
    return out


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def nominal(flags: str) -> float | None:
    """Tree-GRPO's Table 3 budget in complete trajectories: G for GRPO, M (1 + LN/2) for a tree
    (budget-formula in scripts/credit.py); None for the other methods."""
    r, _ = algo_config(flags)
    if r.algo == "grpo":
        return r.grpo_G
    return tree_grpo_budget(r.tree_M, r.tree_N, r.tree_L)[1] if r.algo == "tree_grpo" else None


def matched_by(arm: str, ref: str) -> str:
    """Which budget definition a pairing matches (arms as flags), in words."""
    (r, _), (r_ref, _) = algo_config(arm), algo_config(ref)
    if r == r_ref:
        return "the same rollout"
    b, b_ref = nominal(arm), nominal(ref)
    words = "generated tokens (±15%, calibrated on the default)"
    if b is not None and b == b_ref:
        words = "Tree-GRPO Table 3: M(1 + LN/2) complete trajectories"
    elif b is not None and b_ref is not None:
        words += f"; M(1 + LN/2) = {b:g}, not {b_ref:g}"
    if r.algo == "treeps":
        trained = r.treeps_train or r.treeps_N
        words += f"; not TreePS-RAG's own (trained paths = group size): {trained} vs {r_ref.grpo_G}"
    return words
