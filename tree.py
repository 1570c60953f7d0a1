"""The rollout tree: the one data structure every paper's rollout writes and every advantage
function reads.

A `Tree` holds one prompt's rollouts: its root `Node` is the prompt, every other node one agent step
(sampled thought + action, then the environment's observation), every root-to-leaf path one
trajectory (GRPO's trees are chains; the other methods differ only in where they branch).
Token-in-token-out (Cut the Bill §5; BranPO App. A.3): a node's context is the exact concatenation
of the ids on its path, never decoded and re-encoded.

Conventions every module relies on:
- three-fields: reward, value and advantage are three fields (the rollout sets `reward` on leaves;
  advantages.py `value` and, for display, `advantage`). What is trained is per trajectory
  (`Trajectory.advantages`): Tree-GRPO trains a shared prefix once per leaf, with that leaf's
  advantage.
- discard: a trajectory whose retrieval failed (`env_error`) stays in the tree but is not *scored*:
  left out of every group statistic and never trained (Cut the Bill §5.4 "discard"). One cut by the
  token budget (`truncated`) is scored, but `to_samples` drops it from the loss.
- aligned-arrays: a `Sample`'s per-token arrays are aligned with `input_ids` (entry t describes
  token t); the trainer shifts by one.

Each paper's rollout knobs, the shape of the trees its strategy grows, are a class of their own at
the end (rollout.py's RolloutConfig gathers them for the flags): beside the strategies they would
take rollout.py, which holds the agent and every strategy, past its 600 lines.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields

from infra.protocol import FLAGS, AgentConfig  # FLAGS: the abnormal outcomes (meanings there)


@dataclass(eq=False)
class Node:
    """One agent step (thought + action + observation); the root is the prompt."""

    id: str  # unique within a prompt's trees; a child's is `parent.id + "." + k`
    parent: Node | None = field(default=None, repr=False)  # the step it continues; None: the root
    children: list[Node] = field(default_factory=list, repr=False)  # sampling order; 0: original
    tokens: list[int] = field(default_factory=list, repr=False)  # sampled ids; the root's: prompt
    logprobs: list[float] = field(default_factory=list, repr=False)  # rollout log-prob per token
    obs_tokens: list[int] = field(default_factory=list, repr=False)  # observation ids, untrained
    text: str = ""  # `tokens` decoded, for reading only (never re-encoded)
    obs_text: str = ""  # `obs_tokens` decoded, for reading only
    action: str = ""  # parsed action: "search", "answer", "invalid", or "" for the root
    query: str | None = None  # the search query of a "search" step
    answer: str | None = None  # the answer text of an "answer" step
    doc_ids: list[str] = field(default_factory=list)  # retrieved for `query` (TreePS-RAG's pruning)
    reward: float | None = None  # outcome reward R(H) of the trajectory ending here; None: unscored
    em: float | None = None  # exact match of `answer` to the golden answers (set by the agent)
    f1: float | None = None  # token F1 of `answer` to the golden answers (set by the agent)
    value: float | None = None  # V(n) where a method has one (CARL, TreePS-RAG, BranPO's r_base)
    advantage: float | None = None  # the step's, if every trajectory that trains it agrees
    flags: list[str] = field(default_factory=list)  # this step's abnormal outcomes, among FLAGS
    prefix_end: bool = False  # BranPO: last step of the prefix B (Eq. 8); its children: C (Eq. 9)
    redundant: bool = False  # BranPO RSM: a step a shorter correct branch showed needless (Eq. 14)
    sampled: bool = False  # a trained path's leaf: TreePS-RAG's N drawn (§2.3), VinePPO's chains
    phase1: bool = False  # CARL: a step of the N0 chains sampled before any fork (App. C.1)
    entropy: float | None = None  # CARL: H(s), mean length-normalised NLL of its actions (Eq. 6-8)
    n_sampled: int = 0  # children sampled, pruned ones too: CARL's n(s) (Eq. 12); names children
    gold_logp: float | None = None  # IGPO: mean log-prob of the gold answer forced after this node

    @property
    def depth(self) -> int:
        """Number of steps from the root (the root has depth 0)."""
        return 0 if self.parent is None else self.parent.depth + 1

    @property
    def scored(self) -> bool:
        """A leaf whose reward enters group statistics (not discarded by an environment error)."""
        return not self.children and self.reward is not None and "env_error" not in self.flags

    @property
    def ended(self) -> bool:
        """A step after which the trajectory stops: it has a reward, or a retrieval error."""
        return self.reward is not None or "env_error" in self.flags

    def add_child(self, **step) -> Node:
        """Append a newly sampled step under this node and return it."""
        self.n_sampled = max(self.n_sampled, len(self.children)) + 1
        child = Node(id=f"{self.id}.{self.n_sampled - 1}", parent=self, **step)
        self.children.append(child)
        return child

    # ---- JSON: {"id": str, <every non-default field>, "children": [...]} ----

    def to_dict(self) -> dict:
        d = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("id", "parent", "children")
            and getattr(self, f.name)
            != (f.default if f.default_factory is MISSING else f.default_factory())
        }
        return {"id": self.id, **d, "children": [c.to_dict() for c in self.children]}

    @classmethod
    def from_dict(cls, d: dict, parent: Node | None = None) -> Node:
        known = {f.name for f in fields(cls)} - {"parent"}
        if unknown := set(d) - known:
            raise ValueError(
                f"node {d.get('id')!r} has unknown keys {sorted(unknown)}; known keys: "
                f"{sorted(known)}"
            )
        if "id" not in d:
            raise ValueError(f"a node has no 'id': {json.dumps(d)[:200]}")
        if bad := set(d.get("flags", [])) - set(FLAGS):
            raise ValueError(
                f"node {d['id']!r} has unknown flags {sorted(bad)}; known flags: {FLAGS}"
            )
        node = cls(parent=parent, **{k: v for k, v in d.items() if k != "children"})
        node.children = [cls.from_dict(c, node) for c in d.get("children", [])]
        return node


def walk(node: Node):
    """Yield `node` and all its descendants, depth first, children in order."""
    yield node
    for c in node.children:
        yield from walk(c)


def leaves(node: Node) -> list[Node]:
    """All leaves below `node` (or `node` itself if it is a leaf), depth first."""
    return [n for n in walk(node) if not n.children]


def scored_leaves(node: Node) -> list[Node]:
    """L(n): the descendant leaves of `node` whose reward counts (not discarded)."""
    return [n for n in leaves(node) if n.scored]


def path(node: Node) -> list[Node]:
    """The steps from the root's child down to `node` (the root, the prompt, is no step)."""
    return [] if node.parent is None else path(node.parent) + [node]


def truncated(leaf: Node) -> bool:
    """A trajectory cut by the token budget: in group statistics, dropped by `to_samples`."""
    return any("truncated" in s.flags for s in path(leaf))


def action_nll(node: Node) -> float:
    """The length-normalised negative log-likelihood of the step sampled into `node`, from its
    rollout log-probs (0 without): CARL's per-action H (Eq. 8), AT2PO's and ARPO's step entropy."""
    return -sum(node.logprobs) / len(node.logprobs) if node.logprobs else 0.0


def context_ids(node: Node) -> list[int]:
    """TITO: the exact ids the model sees after `node`: prompt + each step's tokens + obs_tokens."""
    steps = path(node)
    root = steps[0].parent if steps else node
    return [i for n in [root, *steps] for i in n.tokens + n.obs_tokens]


@dataclass
class Tree:
    """The rollouts of one prompt that one method grew from one root."""

    root: Node  # the prompt node; its `tokens` are the prompt's token ids
    question: str = ""  # the question text, for reading
    golden_answers: list[str] = field(default_factory=list)  # what the reward compares against
    stats: dict[str, float] = field(default_factory=dict)  # generated_tokens, tool_calls, ...

    def leaves(self) -> list[Node]:
        return leaves(self.root)

    def find(self, node_id: str) -> Node:
        if found := [n for n in walk(self.root) if n.id == node_id]:
            return found[0]
        raise KeyError(f"no node {node_id!r} in tree {self.root.id!r}")

    def to_dict(self) -> dict:
        """The root's node dict with the prompt-level fields added at the top."""
        meta = {
            "question": self.question,
            "golden_answers": self.golden_answers,
            "stats": self.stats,
        }
        return self.root.to_dict() | {k: v for k, v in meta.items() if v}

    @classmethod
    def from_dict(cls, d: dict) -> Tree:
        d = dict(d)
        meta = {k: d.pop(k) for k in ("question", "golden_answers", "stats") if k in d}
        return cls(root=Node.from_dict(d), **meta)

    def render(self) -> str:
        """A text picture of the tree with each node's action, reward r, value V and advantage A."""
        return "\n".join(_draw(self.root, "", ""))


def _draw(n: Node, first: str, rest: str) -> list[str]:
    """`Tree.render`'s lines: `n`'s id, action, query, answer, r / V / A, flags (after `first`),
    then its subtree."""
    what = (
        (n.action or "prompt")
        + (f" {n.query!r}" if n.query is not None else "")
        + (f" -> {n.answer!r}" if n.answer is not None else "")
    )
    parts = [f"{n.id}  {what}"] + [
        f"{k}={v:+.3f}"
        for k, v in (("r", n.reward), ("V", n.value), ("A", n.advantage))
        if v is not None
    ]
    marks = n.flags + [m for m in ("prefix_end", "redundant", "sampled") if getattr(n, m)]
    lines = [first + "  ".join(parts + (["[" + ",".join(marks) + "]"] if marks else []))]
    for i, c in enumerate(n.children):
        last = i == len(n.children) - 1
        lines += _draw(c, rest + ("└─ " if last else "├─ "), rest + ("   " if last else "│  "))
    return lines


# --------------------------------------------------------------------------------------------------
# Training samples


@dataclass
class Trajectory:
    """One root-to-leaf path and the advantage each of its steps is trained with (None = not trained
    here)."""

    leaf: Node  # the trajectory's last step
    advantages: list[float | None]  # one per step of `path(leaf)`: times its tokens in the loss

    @property
    def steps(self) -> list[Node]:
        return path(self.leaf)


@dataclass
class Sample:
    """One training row: a trajectory's exact token ids with per-token loss mask, advantage and
    rollout log-prob."""

    input_ids: list[int]  # prompt + every step's sampled and observation ids, as generated (TITO)
    loss_mask: list[int]  # 1 on the model tokens of steps trained here; 0 elsewhere
    advantages: list[float]  # per-token advantage (0 where loss_mask is 0)
    logprobs: list[float]  # rollout log-prob per model token (0 elsewhere): PPO / TIS's pi_old
    leaf_id: str  # the trajectory's leaf, to trace a row back to its tree


def to_samples(trajectories: list[Trajectory]) -> list[Sample]:
    """Training rows of the trajectories, except those cut by the token budget and those with no
    step trained."""
    samples = []
    for traj in trajectories:
        steps = path(traj.leaf)
        if len(traj.advantages) != len(steps):
            raise ValueError(
                f"trajectory {traj.leaf.id}: {len(traj.advantages)} advantages for {len(steps)} "
                "steps"
            )
        if truncated(traj.leaf) or all(a is None for a in traj.advantages):
            continue
        ids = context_ids(steps[0].parent)  # the prompt
        mask, adv, lp = [0] * len(ids), [0.0] * len(ids), [0.0] * len(ids)
        for step, a in zip(steps, traj.advantages):
            if len(step.logprobs) != len(step.tokens):
                raise ValueError(
                    f"node {step.id}: {len(step.logprobs)} logprobs for {len(step.tokens)} tokens"
                )
            n, m = len(step.tokens), len(step.obs_tokens)
            ids += step.tokens + step.obs_tokens
            mask += [int(a is not None)] * n + [0] * m
            adv += [a or 0.0] * n + [0.0] * m
            lp += list(step.logprobs) + [0.0] * m
        samples.append(Sample(ids, mask, adv, lp, traj.leaf.id))
    return samples


def trained_steps(trajectories: list[Trajectory]):
    """Yield (step, advantage) for every step the loss trains, once per trajectory that trains it:
    the steps with an advantage, in the trajectories `to_samples` keeps (not `truncated`)."""
    for traj in trajectories:
        if not truncated(traj.leaf):
            yield from ((s, a) for s, a in zip(traj.steps, traj.advantages) if a is not None)


def step_credit(trajectories: list[Trajectory]) -> dict[str, float]:
    """Node id -> the credit its tokens receive in the loss: the sum of the advantages
    `trained_steps` gives the step. A step absent is not trained. Summed by id, so that copies of
    one tree (the demo's GRPO chains) add up on a step."""
    credit: dict[str, float] = {}
    for step, a in trained_steps(trajectories):
        credit[step.id] = credit.get(step.id, 0.0) + a
    return credit


# --------------------------------------------------------------------------------------------------
# Each paper's rollout knobs: the trees its strategy in rollout.py grows (the flags: RolloutConfig)


@dataclass
class GRPORollout:
    """GRPO's rollout knob (rollout.chain, GiGPO's chains too), ARPO's and VinePPO's chains."""

    grpo_G: int = 8
    """GRPO: trajectories per prompt (Search-R1: 5; Cut the Bill: 8); ARPO: initial chains."""


@dataclass
class TreeShape:
    """The M, N, L of Tree-GRPO's trees (rollout.tree_grpo), AT2PO's too (rollout.at2po)."""

    tree_M: int = 2
    """Tree-GRPO: trees per prompt (paper default (M, N, L) = (2, 2, 1)); AT2PO: initial chains."""
    tree_N: int = 2
    """Tree-GRPO, AT2PO: expansions per tree per round."""
    tree_L: int = 1
    """Tree-GRPO, AT2PO: expansion rounds."""


@dataclass
class TreeGRPORollout(TreeShape):
    """Tree-GRPO's rollout knobs (rollout.tree_grpo)."""

    tree_replace: bool = False
    """Tree-GRPO: draw the N expansion nodes with replacement (official code: random.choices)."""


@dataclass
class BranPORollout:
    """BranPO's rollout knobs (rollout.branpo)."""

    branpo_N: int = 4
    """BranPO: initial trajectories per prompt."""
    branpo_rsm: bool = True
    """BranPO: redundant step masking (§4.4)."""


@dataclass
class CARLRollout:
    """CARL's rollout knobs (rollout.carl)."""

    carl_N0: int = 1
    """CARL: initial chains (1 = CARL-Lite, 8 = CARL)."""
    carl_N: int = 16
    """CARL: progressive forks."""


@dataclass
class TreePSRollout:
    """TreePS-RAG's rollout knobs (rollout.treeps)."""

    treeps_N: int = 8
    """TreePS-RAG: nodes per layer (rollout budget N)."""
    treeps_retain: int = 2
    """TreePS-RAG: N_retain, search children kept per parent."""
    treeps_D: int = 0
    """TreePS-RAG: depth limit D <= max_turns + 1; 0 = max_turns + 1 (the paper uses D = 4)."""
    treeps_train: int = 0
    """TreePS-RAG: root-to-leaf paths sampled for training (§2.3); 0 = treeps_N, as the paper."""


@dataclass
class AT2PORollout(TreeShape):
    """AT2PO's rollout knobs (rollout.at2po): Tree-GRPO's M, N, L and its leaf count."""

    at2po_leaves: int = 0
    """AT2PO: leaves per tree, pruned or padded to (official run: 22); 0 = M + L N, as grown."""


@dataclass
class ARPORollout(GRPORollout):
    """ARPO's rollout knobs (rollout.arpo): its initial chains (grpo_G) and its trajectories."""

    arpo_M: int = 16
    """ARPO: trajectories per prompt in all, the initial chains included (official run: 16)."""


@dataclass
class VinePPORollout(GRPORollout):
    """VinePPO's rollout knobs (rollout.vineppo): its chains (grpo_G) and continuations."""

    vineppo_K: int = 4
    """VinePPO: Monte Carlo continuations per context (its official runs: 9; docs/paper_code.md)."""


ROLLOUT_RULES = [  # flags.check: the knobs above
    (
        "grpo_G tree_M tree_N branpo_N carl_N0 treeps_N treeps_retain arpo_M vineppo_K",
        "an integer >= 1",
        lambda v: v >= 1,
    ),
    ("tree_L carl_N treeps_D treeps_train at2po_leaves", "an integer >= 0", lambda v: v >= 0),
]


def depth_rule(r: TreePSRollout, cfg: AgentConfig) -> tuple[bool, str]:
    """flags.check's rule that ties --treeps_D to --max_turns: (broken?, message)."""
    return (
        r.treeps_D > cfg.max_turns + 1,
        f"--treeps_D {r.treeps_D}: TreePS-RAG's depth limit must be at most --max_turns + 1 = "
        f"{cfg.max_turns + 1}; lower it, or raise --max_turns to {r.treeps_D - 1}",
    )
