"""Rollout trees drawn with the credit each step receives: one panel per method, one colour scale.

The input is plain data (`scripts.credit.drawing` writes it), so nothing of the project is
imported here. A panel is a dict {"algo": a method of PANELS, "nodes": [...], "note": a line under
it}; a node is a dict {"id", "parent" (None: a root, the prompt), "kind" (a key of KINDS), "credit"
(None: not trained), "reward" (leaves; None: not scored), "marks" (keys of MARKS; a panel draws its
method's own), "dropped" (children sampled, then removed)}, every parent listed before its children.
A tree is drawn top-down: x by leaf order, y by depth.

Panels of more than MAX_NODES nodes are simplified, and say how under them: first a run of
single-child steps of one kind, one credit and no marks becomes one node labelled "xk" (k steps);
then, if still too many, only the first leaves (in tree order) and their ancestors are drawn.
"""

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import FuncNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

MAX_NODES = 120  # drawn nodes per panel before the simplification
LABELLED = 30  # a panel of at most this many nodes writes each trained step's credit beside it
REWARDS = 40  # a panel of at most this many leaves writes each leaf's reward below it
MAX_WIDTH = 26  # inches: wider figures squeeze their panels
UNTRAINED = "#a8a8a8"
CMAP = "RdBu"  # red: pushed down, white: 0, blue: pushed up
KINDS = {  # kind -> (marker, legend)
    "prompt": ("s", "prompt (the root, not a step)"),
    "search": ("o", "search step"),
    "answer": ("D", "answer step"),
    "invalid": ("X", "invalid action (parse error)"),
    "truncated": ("v", "cut by the token budget"),
    "discarded": ("P", "retrieval failed (discarded)"),
    "step": ("h", "step"),
}
MARKS = {  # mark -> (ring colour, ring marker, legend)
    "prefix_end": ("#e08214", "o", "BranPO: last step of a shared prefix"),
    "redundant": ("black", "o", "BranPO: redundant step (masked)"),
    "fork": ("#7b3294", "o", "CARL: forking state"),
    "retained": ("#1b9e77", "o", "TreePS-RAG: kept by the pruning"),
    "sampled": ("#1b9e77", "s", "a trained path's leaf (TreePS-RAG: drawn; VinePPO: a chain)"),
}
PANELS = {  # method -> (title, what its credit is, the marks it draws)
    "grpo": ("GRPO", "each trajectory's group advantage\non all its steps", ()),
    "tree_grpo": (
        "Tree-GRPO",
        ("each leaf's intra + inter advantage on its\npath; a shared step adds up its leaves'"),
        (),
    ),
    "branpo": (
        "BranPO",
        "a shared prefix once, base advantage;\nbranches: branch advantage",
        ("prefix_end", "redundant"),
    ),
    "carl": ("CARL", "only actions leaving a forking state:\nV(child) - V(state)", ("fork",)),
    "treeps": (
        "TreePS-RAG",
        ("(2V(n) - V(root) - V(parent)) / sqrt|L(n)|\non every step of each sampled path"),
        ("retained", "sampled"),
    ),
    "gigpo": ("GiGPO", "episode advantage + step advantage\namong steps from the same state", ()),
    "at2po": ("AT2PO", "V(n) from its children (entropy-\nweighted); leaves z-scored per tree", ()),
    "arpo": ("ARPO", "GRPO over every leaf\n(soft; hard: a shared step's mean)", ()),
    "vineppo": (
        "VinePPO",
        "V(next context) - V(context), V the\nmean of K continuations (grey)",
        ("sampled",),
    ),
    "igpo": (
        "IGPO",
        "gains in P(gold), outcome last:\nz-scored, summed to go",
        (),
    ),
    "mtgrpo": (
        "MT-GRPO",
        "outcome z + turn z (gold in the\ninformation), per turn index",
        (),
    ),
}


def _children(nodes: list[dict]) -> tuple[dict[str, list[str]], list[str]]:
    """id -> its children's ids, and the roots, in input order (parents before children)."""
    kids: dict[str, list[str]] = {}
    roots = []
    for n in nodes:
        if n["parent"] is not None and n["parent"] not in kids:
            raise ValueError(
                f"node {n['id']!r} names parent {n['parent']!r}, which is not listed "
                f"before it; list every parent before its children"
            )
        kids[n["id"]] = []
        (kids[n["parent"]] if n["parent"] is not None else roots).append(n["id"])
    return kids, roots


def simplify(nodes: list[dict], max_nodes: int = MAX_NODES) -> tuple[list[dict], str]:
    """At most `max_nodes` nodes to draw (module docstring), each with "count" (the steps it stands
    for), and a note saying what was merged or left out ("" if nothing)."""
    nodes = [{**n, "count": 1} for n in nodes]
    if len(nodes) <= max_nodes:
        return nodes, ""
    by_id, (kids, _) = {n["id"]: n for n in nodes}, _children(nodes)
    merged, note = 0, []
    for n in nodes:  # parents first: a run is merged into its first step
        while n["id"] in by_id and n["parent"] is not None and len(kids[n["id"]]) == 1:
            c = by_id[kids[n["id"]][0]]
            plain = not (n["marks"] or c["marks"] or n["dropped"] or c["dropped"])
            alike = (c["kind"], c["credit"]) == (n["kind"], n["credit"])
            if not (plain and alike and kids[c["id"]]):  # a leaf keeps its own node
                break
            n["count"] += 1
            kids[n["id"]] = kids.pop(c["id"])
            for g in kids[n["id"]]:
                by_id[g]["parent"] = n["id"]
            del by_id[c["id"]]
            merged += 1
    if merged:
        note.append(f"{merged} single-child steps merged into the step above (xk: k steps)")
    if len(by_id) > max_nodes:  # the first leaves and their ancestors, while they fit
        keep, leaves = set(), [i for i in by_id if not kids[i]]
        for k, leaf in enumerate(leaves):
            line, x = set(), leaf
            while x is not None and x not in keep:
                line.add(x)
                x = by_id[x]["parent"]
            if len(keep) + len(line) > max_nodes:
                note.append(f"only the first {k} of {len(leaves)} leaves drawn")
                break
            keep |= line
        by_id = {i: n for i, n in by_id.items() if i in keep}
    return list(by_id.values()), "; ".join(note)


def layout(nodes: list[dict]) -> dict[str, tuple[float, int]]:
    """id -> (x, depth): leaves at x = 0, 1, 2, ... in tree order, a parent above the middle of its
    children, successive roots (the trees of one prompt) half a leaf further apart."""
    kids, roots = _children(nodes)
    order, stack = [], [(r, 0) for r in reversed(roots)]
    while stack:  # depth first, children in order
        i, depth = stack.pop()
        order.append((i, depth))
        stack += [(c, depth + 1) for c in reversed(kids[i])]
    pos, x = {}, -0.5
    for i, depth in order:
        x += 0.5 if depth == 0 else 0.0
        if not kids[i]:
            pos[i], x = (x, depth), x + 1.0
    for i, depth in reversed(order):  # every child before its parent
        if kids[i]:
            pos[i] = ((pos[kids[i][0]][0] + pos[kids[i][-1]][0]) / 2, depth)
    return pos


def _number(v: float, signed: bool) -> str:
    """Two decimals at most, trailing zeros dropped: 1, 0.67, +0.87, -1.73."""
    s = f"{v:+.2f}" if signed else f"{v:.2f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _panel(ax, panel: dict, nodes: list[dict], note: str, pos: dict, norm, cmap) -> set[str]:
    """One method's trees on `ax`; returns the kinds and marks it drew (for the legend)."""
    name, what, panel_marks = PANELS[panel["algo"]]
    parents = {n["parent"] for n in nodes}
    n_leaves = sum(n["id"] not in parents for n in nodes)
    size = 150 if len(pos) <= LABELLED else max(20, 150 * LABELLED / len(pos))
    if bad := [n for n in nodes if n["kind"] not in KINDS]:
        raise ValueError(
            f"node {bad[0]['id']!r} has kind {bad[0]['kind']!r}; known kinds: {list(KINDS)}"
        )
    xy = {i: (x, -depth) for i, (x, depth) in pos.items()}
    ax.add_collection(
        LineCollection(
            [(xy[n["parent"]], xy[n["id"]]) for n in nodes if n["parent"] is not None],
            colors="#777777",
            linewidths=0.8,
            zorder=1,
        )
    )
    drawn = set()
    for kind, (marker, _) in KINDS.items():
        if group := [n for n in nodes if n["kind"] == kind]:
            faces = [
                "black"
                if kind == "prompt"
                else UNTRAINED
                if n["credit"] is None
                else cmap(norm(n["credit"]))
                for n in group
            ]
            ax.scatter(
                *zip(*(xy[n["id"]] for n in group)),
                s=size,
                marker=marker,
                c=faces,
                edgecolors="black",
                linewidths=0.7,
                zorder=3,
            )
            drawn.add(kind)
    for m in panel_marks:
        if group := [n for n in nodes if m in n["marks"]]:
            ax.scatter(
                *zip(*(xy[n["id"]] for n in group)),
                s=size * 3.2,
                marker=MARKS[m][1],
                facecolors="none",
                edgecolors=MARKS[m][0],
                linewidths=1.8,
                zorder=2,
            )
            drawn.add(m)
    for n in nodes:
        text = []  # (label, offset in points, alignment, style)
        if n["reward"] is not None and n_leaves <= REWARDS:
            text.append(
                (
                    _number(n["reward"], False),
                    (0, -11),
                    ("center", "top"),
                    {"fontsize": 8, "fontweight": "bold"},
                )
            )
        if n["credit"] is not None and len(pos) <= LABELLED:
            text.append((_number(n["credit"], True), (12, 5), ("left", "bottom"), {"fontsize": 7}))
        if n["count"] > 1:
            text.append((f"x{n['count']}", (-8, 0), ("right", "center"), {"fontsize": 7}))
        if n["dropped"]:
            text.append(
                (
                    f"{n['dropped']} dropped",
                    (7, -7),
                    ("left", "top"),
                    {"fontsize": 6, "color": "#666666", "style": "italic"},
                )
            )
        for label, offset, (ha, va), style in text:
            ax.annotate(
                label, xy[n["id"]], xytext=offset, textcoords="offset points", ha=ha, va=va, **style
            )
    ax.set_xlim(-0.8, max((x for x, _ in pos.values()), default=0.0) + 0.8)
    ax.set_ylim(-max((d for _, d in pos.values()), default=0) - 0.7, 0.5)
    ax.set_axis_off()
    ax.set_title(f"{name}\n{what}", fontsize=8.5)
    if foot := "\n".join(x for x in (panel.get("note", ""), note) if x):
        ax.text(0.5, 0.0, foot, transform=ax.transAxes, ha="center", va="top", fontsize=7)
    return drawn


def figure(panels: list[dict], path: str, title: str, caption: str = "") -> None:
    """Draw `panels` side by side into the PNG `path`: every step coloured by its credit on one
    diverging scale centred at 0 and shared by all panels (grey: not trained), its kind by the
    marker, its method's marks as rings, leaves' rewards below them; a legend and a colour bar."""
    if unknown := [p["algo"] for p in panels if p["algo"] not in PANELS]:
        raise ValueError(f"no panel style for {unknown}; known methods: {list(PANELS)}")
    drawn = [simplify(p["nodes"]) for p in panels]
    spots = [layout(nodes) for nodes, _ in drawn]
    vmax = (
        max(
            (abs(n["credit"]) for nodes, _ in drawn for n in nodes if n["credit"] is not None),
            default=0.0,
        )
        or 1.0
    )
    # colour by sign * sqrt|credit|: small credits (CARL's) stay visible beside large sums
    norm = FuncNorm(
        (lambda v: np.sign(v) * np.sqrt(np.abs(v)), lambda v: np.sign(v) * v**2), -vmax, vmax
    )
    cmap = colormaps[CMAP]
    widths = [
        max(3.2, 0.6 * (max((x for x, _ in pos.values()), default=0.0) + 1.6)) for pos in spots
    ]  # inches: about 0.6 per leaf, the whole at most MAX_WIDTH
    fig = Figure(figsize=(min(sum(widths), MAX_WIDTH), 6.2), dpi=100, layout="constrained")
    fig.suptitle(title, fontsize=11)
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=widths)[0]
    shown = set().union(
        *[
            _panel(ax, panel, nodes, note, pos, norm, cmap)
            for ax, panel, (nodes, note), pos in zip(axes, panels, drawn, spots)
        ]
    )
    handles = [
        Line2D(
            [],
            [],
            ls="",
            marker=KINDS[k][0],
            markerfacecolor="white",
            markeredgecolor="black",
            label=KINDS[k][1],
        )
        for k in KINDS
        if k in shown
    ]
    handles += [Patch(facecolor=UNTRAINED, edgecolor="black", label="not trained")]
    handles += [
        Line2D(
            [],
            [],
            ls="",
            marker=MARKS[m][1],
            markersize=11,
            markerfacecolor="none",
            markeredgecolor=MARKS[m][0],
            markeredgewidth=1.8,
            label=MARKS[m][2],
        )
        for m in MARKS
        if m in shown
    ]
    bar = fig.colorbar(
        ScalarMappable(norm, cmap),
        ax=list(axes),
        orientation="horizontal",
        fraction=0.04,
        pad=0.02,
        aspect=60,
    )
    bar.set_label(
        "credit of a step: the sum, over the training rows that contain it, of the "
        "advantage each gives its tokens (colour ~ sqrt of its size)\n"
        "blue: pushed up, red: pushed down, white: 0, grey: not trained",
        fontsize=8,
    )
    reading = (
        "marker: the step's action; fill: its credit (signed number beside it); "
        "bold number under a leaf: its reward"
    )
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 6),
        fontsize=7.5,
        frameon=False,
        title="\n".join(x for x in (reading, caption) if x),
        title_fontsize=8,
    )
    fig.savefig(path)
