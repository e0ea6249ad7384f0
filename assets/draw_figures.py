"""Draw the course's static figures: the diagrams the lessons embed (``python assets/draw_figures.py``).

Every PNG in ``assets/`` comes from this one script, and ``tests/test_assets.py`` fails when a committed PNG is
not what the script draws now: change a figure here, run the script, commit both. The lesson builder
(``autograder/course/notebooks.py``) embeds a figure into a notebook where a lesson's markdown says
``![what it shows](assets/<name>.png)``.

One legend for every figure (:data:`ROLES`): the same colour, hatching and edge for queries, keys/values, the
memory and masks wherever they appear. Colours are the Okabe–Ito palette (told apart by colour-blind readers);
hatching, edges and labels carry the same information in greyscale.

Deterministic output: a fixed size and dpi, matplotlib's default style whatever the user's matplotlibrc says,
the Agg backend, and no ``Software`` or date metadata in the PNG, so rerunning the script reproduces the files
byte for byte with the course's pinned matplotlib.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, the same renderer everywhere

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
DPI = 100  # one pixel density for every figure; sizes below are in inches, so fonts read alike everywhere
FONT = 10  # points

# The Okabe–Ito palette (Okabe & Ito 2008): eight colours that colour-blind readers tell apart.
ORANGE, SKY, GREEN, YELLOW = "#E69F00", "#56B4E9", "#009E73", "#F0E442"
BLUE, VERMILLION, PURPLE, BLACK = "#0072B2", "#D55E00", "#CC79A7", "#000000"
GREY = "#777777"


@dataclass(frozen=True)
class Role:
    """How one kind of thing is drawn in every figure: fill, hatching and edge, plus its legend label."""

    label: str  # the legend's words
    face: str  # fill colour
    hatch: str = ""  # matplotlib hatch pattern: the greyscale-safe twin of the colour
    edge: str = BLACK  # outline colour
    linestyle: str = "-"  # outline style
    linewidth: float = 1.2


# The one legend. Queries, keys/values, memory and the mask's two values are the four ideas every attention
# figure shows; the rest are the blocks around them.
ROLES = {
    "query": Role("queries Q", ORANGE, "///"),
    "keyvalue": Role("keys K / values V", SKY, "xx"),
    "memory": Role("memory (encoder output)", GREEN, "..."),
    "memory_kv": Role("K / V projected from the memory", SKY, "xx", edge=GREEN, linewidth=2.2),
    "allowed": Role("mask: may attend (True)", BLUE),
    "blocked": Role("mask: blocked (False)", "#EDEDED", edge=GREY),
    "hidden": Role("hidden states (B, T, D)", "#FFFFFF"),
    "attention": Role("attention sublayer", "#FFFFFF", linewidth=2.0),
    "norm": Role("LayerNorm", YELLOW),
    "ffn": Role("feed-forward", "#E9C6DA"),  # a light tint of Okabe–Ito's reddish purple
    "dropout": Role("dropout", "#FFFFFF", edge=GREY, linestyle="--"),
    "linear": Role("linear map", "#DDDDDD"),
    "ghost": Role("not in this model", "#FFFFFF", edge=GREY, linestyle=":"),
}


# -- drawing primitives (units: inches, origin bottom left) ------------------------------------------------------
def canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure whose data coordinates are inches, so that boxes and text keep their proportions."""
    fig = plt.figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def box(ax: Axes, cx: float, cy: float, w: float, h: float, text: str = "", role: str = "hidden",
        fontsize: float = FONT, bold: bool = False, textcolor: str = BLACK, **overrides) -> FancyBboxPatch:
    """A rounded box centred on (cx, cy), drawn in ``role``'s style, with ``text`` on a white label if hatched."""
    style = ROLES[role]
    kw = dict(facecolor=style.face, edgecolor=style.edge, hatch=style.hatch or None, linewidth=style.linewidth,
              linestyle=style.linestyle)
    if style.hatch:
        kw["hatchcolor"] = "#00000060"  # half-transparent black lines: visible in greyscale, quiet in colour
    kw.update(overrides)
    patch = FancyBboxPatch((cx - w / 2, cy - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.05", **kw)
    ax.add_patch(patch)
    if text:
        label = dict(boxstyle="round,pad=0.12", facecolor="white", edgecolor="none") if style.hatch else None
        ax.text(cx, cy, text, ha="center", va="center", fontsize=fontsize, color=textcolor,
                fontweight="bold" if bold else "normal", bbox=label, linespacing=1.15)
    return patch


def cell(ax: Axes, x: float, y: float, size: float, role: str, **overrides) -> Rectangle:
    """One square of a grid (a mask cell, a cached position), lower-left corner at (x, y)."""
    style = ROLES[role]
    kw = dict(facecolor=style.face, edgecolor=style.edge if role != "allowed" else "white",
              hatch=style.hatch or None, linewidth=1.0)
    if style.hatch:
        kw["hatchcolor"] = "#00000060"
    kw.update(overrides)
    patch = Rectangle((x, y), size, size, **kw)
    ax.add_patch(patch)
    return patch


def arrow(ax: Axes, *points: tuple[float, float], color: str = BLACK, lw: float = 1.3, style: str = "-",
          head: bool = True) -> None:
    """A polyline through ``points`` with an arrowhead on its last segment."""
    if len(points) > 2:
        xs, ys = zip(*points[:-1])
        ax.add_line(Line2D(xs, ys, color=color, lw=lw, linestyle=style, solid_capstyle="butt"))
    ax.annotate("", xy=points[-1], xytext=points[-2],
                arrowprops=dict(arrowstyle="-|>" if head else "-", color=color, lw=lw, linestyle=style,
                                shrinkA=0, shrinkB=0, mutation_scale=12))


def plus(ax: Axes, cx: float, cy: float, r: float = 0.13) -> None:
    """The residual addition: a circled plus."""
    ax.add_patch(Circle((cx, cy), r, facecolor="white", edgecolor=BLACK, linewidth=1.3))
    ax.plot([cx - r * 0.6, cx + r * 0.6], [cy, cy], color=BLACK, lw=1.3)
    ax.plot([cx, cx], [cy - r * 0.6, cy + r * 0.6], color=BLACK, lw=1.3)


def text(ax: Axes, x: float, y: float, s: str, size: float = FONT, **kw) -> None:
    ax.text(x, y, s, fontsize=size, **{"ha": "center", "va": "center", **kw})


def legend(ax: Axes, roles: Sequence[str], x: float, y: float, width: float) -> None:
    """The shared legend: swatches for ``roles`` left to right from ``x`` (top ``y``), wrapping at ``width``."""
    sx, sy = x, y
    for name in roles:
        style = ROLES[name]
        needed = 0.42 + 0.064 * len(style.label) + 0.3  # swatch, label (about 0.064 in a character), gap
        if sx + needed > x + width and sx > x:
            sx, sy = x, sy - 0.32
        kw = dict(facecolor=style.face, edgecolor=style.edge, hatch=style.hatch or None, linewidth=style.linewidth,
                  linestyle=style.linestyle)
        if style.hatch:
            kw["hatchcolor"] = "#00000060"
        ax.add_patch(Rectangle((sx, sy - 0.2), 0.34, 0.2, **kw))
        text(ax, sx + 0.42, sy - 0.1, style.label, size=FONT - 1, ha="left")
        sx += needed


# -- the figures --------------------------------------------------------------------------------------------------
def _qkv_tabs(ax: Axes, cx: float, y: float, w: float, cross: bool) -> None:
    """Small Q, K, V tabs under an attention box: its queries and its keys/values, in the legend's styles."""
    tab_w, tab_h = 0.34, 0.2
    kv = "memory_kv" if cross else "keyvalue"
    for dx, label, role in ((-w / 2 + 0.3, "Q", "query"), (w / 2 - 0.7, "K", kv), (w / 2 - 0.3, "V", kv)):
        box(ax, cx + dx, y + tab_h / 2, tab_w, tab_h, label, role, fontsize=FONT - 2)


def _sublayer_column(ax: Axes, cx: float, y: float, sublayers: Sequence[tuple[str, str, str]], norm_first: bool,
                     memory_x: float | None = None, width: float = 2.7) -> float:
    """Draw a stack of residual sublayers bottom to top from ``y``; return the y where the stream leaves.

    ``sublayers``: (name, role, kind) with kind "self", "cross", "ffn" or "ghost" (drawn, but bypassed).
    """
    gap, box_h, small_h, res_dx = 0.16, 0.46, 0.26, width / 2 + 0.3
    for index, (name, role, kind) in enumerate(sublayers, start=1):
        if kind == "ghost":
            y += gap
            # the stream passes straight through: nothing is computed here
            ax.plot([cx, cx], [y - gap, y + box_h + gap], color=BLACK, lw=1.3)
            box(ax, cx + width / 2, y + box_h / 2, width * 0.72, box_h, name, "ghost", fontsize=FONT - 1,
                textcolor=GREY)
            y += box_h
            y += gap
            continue
        start = y  # the residual branches off here
        y += gap
        if norm_first:
            box(ax, cx, y + small_h / 2, width * 0.7, small_h, f"LayerNorm (norm{index})", "norm", fontsize=FONT - 1)
            arrow(ax, (cx, start), (cx, y))
            y += small_h + gap
        tabs = kind in ("self", "cross")
        if tabs:
            arrow(ax, (cx, y - gap), (cx, y))
            _qkv_tabs(ax, cx, y, width, kind == "cross")
            y += 0.2
        elif not norm_first:
            arrow(ax, (cx, start), (cx, y))
        box(ax, cx, y + box_h / 2, width, box_h, name, role, bold=kind != "ffn")
        if kind == "cross" and memory_x is not None:
            # the memory, beside the layer, feeds the K and V tabs
            my = y - 0.1
            box(ax, memory_x + 0.45, my, 0.9, 0.5, "memory\n(B, S, D)", "memory", fontsize=FONT - 1)
            arrow(ax, (memory_x, my), (cx + width / 2 - 0.11, my), color=GREEN, lw=2.4)
        y += box_h + gap
        arrow(ax, (cx, y - gap), (cx, y))
        box(ax, cx, y + small_h / 2, width * 0.5, small_h, f"dropout{index}", "dropout", fontsize=FONT - 1)
        y += small_h + gap + 0.13
        arrow(ax, (cx, y - gap - 0.13), (cx, y - 0.13))
        plus(ax, cx, y)
        # the residual: from where the sublayer started, round the side, into the plus
        arrow(ax, (cx, start + 0.06), (cx - res_dx, start + 0.06), (cx - res_dx, y), (cx - 0.13, y), lw=1.1)
        y += 0.13
        if not norm_first:
            y += gap
            arrow(ax, (cx, y - gap), (cx, y))
            box(ax, cx, y + small_h / 2, width * 0.7, small_h, f"LayerNorm (norm{index})", "norm", fontsize=FONT - 1)
            y += small_h
        if index < len(sublayers):
            y += gap
            ax.plot([cx, cx], [y - gap, y], color=BLACK, lw=1.3)
    return y


DECODER_SUBLAYERS = (
    ("masked self-attention\nQ, K, V from x; causal", "attention", "self"),
    ("cross-attention\nQ from x; K, V from memory", "attention", "cross"),
    ("feed-forward\nlinear1 → ReLU → linear2", "ffn", "ffn"),
)


def decoder_block() -> Figure:
    """Lesson 05: one decoder layer, post-LN (the paper) beside pre-LN (most models since)."""
    fig, ax = canvas(11.0, 9.1)
    for cx, norm_first, title, rule, note in (
        (2.6, False, "post-LN (norm_first=False): the 2017 paper", "x = norm(x + dropout(sublayer(x)))",
         "every output is normalised: no final LayerNorm needed"),
        (8.0, True, "pre-LN (norm_first=True): GPT-2 and most since", "x = x + dropout(sublayer(norm(x)))",
         "a pre-LN stack adds one final LayerNorm after its last layer (lesson 06)"),
    ):
        text(ax, cx + 0.3, 8.85, title, size=FONT + 1, fontweight="bold")
        text(ax, cx + 0.3, 8.57, rule, size=FONT, family="monospace")
        text(ax, cx + 0.3, 8.3, note, size=FONT - 1.5, style="italic")
        box(ax, cx, 0.95, 1.9, 0.34, "x  (B, T, D)", "hidden")
        top = _sublayer_column(ax, cx, 1.12, DECODER_SUBLAYERS, norm_first, memory_x=cx + 1.75)
        arrow(ax, (cx, top), (cx, top + 0.22))
        box(ax, cx, top + 0.39, 1.9, 0.34, "out  (B, T, D)", "hidden")
    legend(ax, ["query", "keyvalue", "memory", "memory_kv", "attention", "norm", "ffn", "dropout"], 0.35, 0.55,
           10.4)
    return fig


def encoder_decoder() -> Figure:
    """Lesson 06: the whole encoder–decoder model; the memory feeds the cross-attention of every decoder layer."""
    fig, ax = canvas(10.4, 9.7)
    ex, dx = 2.0, 6.4  # the two columns' centres
    text(ax, ex, 9.4, "encoder (given)", size=FONT + 1, fontweight="bold")
    text(ax, dx, 9.4, "decoder: N × DecoderLayer (you build it)", size=FONT + 1, fontweight="bold")
    # encoder: bottom to top
    box(ax, ex, 1.05, 1.9, 0.34, "src_ids  (B, S)", "hidden")
    box(ax, ex, 1.75, 2.1, 0.36, "src_embed · √D", "linear")
    box(ax, ex, 2.45, 2.1, 0.36, "+ positional encoding", "linear")
    box(ax, ex, 3.65, 2.3, 1.2, "N × encoder layer:\nself-attention (source\npadding mask only),\nfeed-forward",
        "attention")
    for y0, y1 in ((1.22, 1.57), (1.93, 2.27), (2.63, 3.05)):
        arrow(ax, (ex, y0), (ex, y1))
    box(ax, ex, 5.0, 2.1, 0.6, "memory  (B, S, D)\ncomputed once", "memory", bold=True)
    arrow(ax, (ex, 4.25), (ex, 4.7))
    text(ax, ex, 5.75, "the same memory feeds the\ncross-attention of every layer", size=FONT - 1, color="#005A46",
         style="italic")
    # decoder: bottom to top
    box(ax, dx, 1.05, 1.9, 0.34, "tgt_ids  (B, T)", "hidden")
    box(ax, dx, 1.75, 2.1, 0.36, "tgt_embed · √D", "linear")
    box(ax, dx, 2.45, 2.1, 0.36, "+ positional encoding", "linear")
    for y0, y1 in ((1.22, 1.57), (1.93, 2.27)):
        arrow(ax, (dx, y0), (dx, y1))
    layer_w, layer_h, sub_h = 3.3, 1.12, 0.27
    bus_x = ex + 1.65  # the memory's vertical bus between the columns
    layers = [("layer 1", 3.0), ("layer 2", 4.4), ("layer N", 6.15)]
    previous_top = 2.63
    cross_ys = []
    for name, y in layers:
        if name == "layer N":
            text(ax, dx, (previous_top + y) / 2, "⋮", size=FONT + 8)
            arrow(ax, (dx, y - 0.16), (dx, y))
        else:
            arrow(ax, (dx, previous_top), (dx, y))
        box(ax, dx, y + layer_h / 2, layer_w, layer_h, "", "hidden", linewidth=1.6)
        text(ax, dx + layer_w / 2 - 0.08, y + layer_h - 0.16, name, size=FONT - 1, ha="right", color=GREY)
        subs = (("masked self-attention", "attention"), ("cross-attention", "attention"), ("feed-forward", "ffn"))
        for i, (label, role) in enumerate(subs):
            sy = y + 0.14 + i * (sub_h + 0.07) + sub_h / 2
            box(ax, dx - 0.25, sy, 2.3, sub_h, label, role, fontsize=FONT - 1, linewidth=1.3)
            if i == 1:  # cross-attention: its keys and values come from the memory
                box(ax, dx - 1.69, sy, 0.48, sub_h, "K, V", "memory_kv", fontsize=FONT - 2)
                arrow(ax, (bus_x, sy), (dx - 1.94, sy), color=GREEN, lw=2.4)
                cross_ys.append(sy)
        previous_top = y + layer_h
    arrow(ax, (ex + 1.05, 5.0), (bus_x, 5.0), color=GREEN, lw=2.4, head=False)
    ax.plot([bus_x, bus_x], [cross_ys[0], cross_ys[-1]], color=GREEN, lw=2.4, solid_capstyle="butt")
    top = layers[-1][1] + layer_h
    box(ax, dx, top + 0.4, 2.6, 0.32, "LayerNorm (pre-LN only)", "norm", fontsize=FONT - 1)
    box(ax, dx, top + 0.95, 3.0, 0.32, "out_proj (may be tied to tgt_embed)", "linear", fontsize=FONT - 1)
    box(ax, dx, top + 1.5, 1.9, 0.34, "logits  (B, T, V)", "hidden")
    arrow(ax, (dx, top), (dx, top + 0.24))
    arrow(ax, (dx, top + 0.56), (dx, top + 0.79))
    arrow(ax, (dx, top + 1.11), (dx, top + 1.33))
    text(ax, dx + layer_w / 2 + 0.2, 4.2, "causal mask\n+ target padding\n→ self-attention\n\nsource padding\n"
         "→ cross-attention", size=FONT - 1.5, ha="left", va="top", color="#333333")
    legend(ax, ["memory", "memory_kv", "attention", "ffn", "norm", "linear"], 0.3, 0.55, 9.9)
    return fig


def _cards(ax: Axes, x: float, y: float, w: float, h: float, role: str, n: int = 3, step: float = 0.12,
           grid: tuple[int, int] | None = None) -> None:
    """``n`` stacked cards (one per head), front card at (x, y) lower left; ``grid`` draws rows × cols cells."""
    for i in reversed(range(n)):
        ox, oy = x + i * step, y + i * step
        style = ROLES[role]
        kw = dict(facecolor=style.face, edgecolor=BLACK, hatch=style.hatch or None, linewidth=1.0)
        if style.hatch:
            kw["hatchcolor"] = "#00000060"
        ax.add_patch(Rectangle((ox, oy), w, h, **kw))
        if grid is not None and i == 0:
            rows, cols = grid
            for r in range(1, rows):
                ax.plot([ox, ox + w], [oy + r * h / rows] * 2, color="#00000055", lw=0.7)
            for c in range(1, cols):
                ax.plot([ox + c * w / cols] * 2, [oy, oy + h], color="#00000055", lw=0.7)


def _split_bar(ax: Axes, x: float, y: float, w: float, h: float, role: str, heads: int = 3) -> None:
    """A (T, D) tensor as a bar whose width D is cut into ``heads`` slices of Dh."""
    style = ROLES[role]
    for i in range(heads):
        kw = dict(facecolor=style.face, edgecolor=BLACK, hatch=style.hatch or None, linewidth=1.0)
        if style.hatch:
            kw["hatchcolor"] = "#00000060"
        ax.add_patch(Rectangle((x + i * w / heads, y), w / heads, h, **kw))
        text(ax, x + (i + 0.5) * w / heads, y + h + 0.1, f"h{i}", size=FONT - 3)


def multi_head() -> Figure:
    """Lesson 03: project, split into heads, attend per head, merge, project; with each tensor's shape."""
    fig, ax = canvas(12.0, 6.0)
    text(ax, 6.0, 5.7, "multi-head attention: H heads side by side (one card per head), computed as one batched "
         "product", size=FONT + 1, fontweight="bold")
    rows = (("query", "query  (B, T, D)", "q_proj", 4.4, "(B, H, T, Dh)"),
            ("keyvalue", "key  (B, S, D)", "k_proj", 3.1, "(B, H, S, Dh)"),
            ("keyvalue", "value  (B, S, D)", "v_proj", 1.8, "(B, H, S, Dh)"))
    for role, label, proj, y, shape in rows:
        _split_bar(ax, 0.3, y - 0.2, 1.2, 0.4, role)
        text(ax, 0.9, y - 0.38, label, size=FONT - 1)
        arrow(ax, (1.55, y), (1.8, y))
        box(ax, 2.25, y, 0.85, 0.36, proj, "linear", fontsize=FONT - 1)
        arrow(ax, (2.7, y), (2.95, y))
        _cards(ax, 3.0, y - 0.3, 0.42, 0.5, role)
        text(ax, 3.8, y + 0.16, shape, size=FONT - 1.5, ha="left")
    text(ax, 3.3, 5.25, "split_heads", size=FONT - 1, fontweight="bold")
    text(ax, 3.3, 5.07, "b t (h dh) → b h t dh", size=FONT - 2.5, family="monospace")
    # scores = q kᵀ / √Dh, masked, then softmax
    sx, sy = 5.0, 3.3
    arrow(ax, (3.75, 4.4), (5.45, 4.4), (5.45, 3.97))
    arrow(ax, (3.75, 3.1), (4.6, 3.1), (4.6, 3.6), (4.97, 3.6))
    _cards(ax, sx, sy, 0.9, 0.6, "hidden", grid=(4, 6))
    text(ax, sx + 0.6, 4.78, "scores = q kᵀ / √Dh", size=FONT - 1, fontweight="bold")
    text(ax, sx + 0.6, 4.6, "(B, H, T, S)", size=FONT - 1.5)
    mx, my, c = 5.1, 2.25, 0.12  # the mask, broadcast over heads
    for r in range(4):
        for col in range(6):
            cell(ax, mx + col * c, my + (3 - r) * c, c, "allowed" if col <= r + 2 else "blocked")
    arrow(ax, (mx + 0.36, my + 0.5), (mx + 0.36, sy - 0.03))
    text(ax, mx + 0.85, my + 0.24, "allowed  (B, 1, T, S)\nbroadcast over H", size=FONT - 2, ha="left")
    arrow(ax, (6.17, 3.65), (6.37, 3.65))
    box(ax, 6.85, 3.65, 0.95, 0.55, "masked\nsoftmax\nover S", "attention", fontsize=FONT - 2)
    arrow(ax, (7.33, 3.65), (7.57, 3.65))
    _cards(ax, 7.6, sy, 0.9, 0.6, "hidden", grid=(4, 6))
    text(ax, 8.2, 4.78, "weights  (B, H, T, S)", size=FONT - 1, fontweight="bold")
    text(ax, 8.2, 4.6, "each row sums to 1", size=FONT - 1.5)
    # weights @ v: one output per head
    arrow(ax, (3.75, 1.8), (8.05, 1.8), (8.05, sy - 0.03))
    text(ax, 8.15, 2.6, "weights @ v", size=FONT - 1, ha="left", fontweight="bold")
    text(ax, 8.15, 2.42, "(B, H, T, S) @ (B, H, S, Dh)", size=FONT - 2, ha="left")
    arrow(ax, (8.78, 3.65), (9.2, 3.65))
    _cards(ax, 9.25, 3.35, 0.42, 0.5, "hidden")
    text(ax, 9.55, 3.15, "(B, H, T, Dh)", size=FONT - 1.5)
    # merge the heads back side by side, then mix them
    arrow(ax, (9.95, 3.65), (10.25, 3.65))
    _split_bar(ax, 10.3, 3.45, 1.2, 0.4, "hidden")
    text(ax, 10.9, 4.6, "merge_heads", size=FONT - 1, fontweight="bold")
    text(ax, 10.9, 4.42, "b h t dh → b t (h dh)", size=FONT - 2.5, family="monospace")
    text(ax, 10.9, 3.27, "(B, T, D)", size=FONT - 1.5)
    arrow(ax, (10.9, 3.12), (10.9, 2.75))
    box(ax, 10.9, 2.57, 0.95, 0.34, "out_proj", "linear", fontsize=FONT - 1)
    arrow(ax, (10.9, 2.39), (10.9, 2.15))
    text(ax, 10.9, 1.9, "out  (B, T, D)\nheads mixed", size=FONT - 1)
    legend(ax, ["query", "keyvalue", "allowed", "blocked", "linear", "attention"], 0.3, 0.75, 11.4)
    return fig


def _mask_panel(ax: Axes, x0: float, y0: float, allowed: Sequence[Sequence[bool]], query_tokens: Sequence[str],
                key_tokens: Sequence[str], key_role: str, title: str, subtitle: str, size: float = 0.5) -> None:
    """One mask as a grid: query tokens down the left (rows, T), key tokens along the top (columns, S)."""
    T, S = len(allowed), len(allowed[0])
    top = y0 + T * size
    text(ax, x0 + S * size / 2, top + size + 0.62, title, size=FONT + 1, fontweight="bold")
    text(ax, x0 + S * size / 2, top + size + 0.36, subtitle, size=FONT - 1, family="monospace")
    for s, token in enumerate(key_tokens):
        if key_role == "memory":
            cell(ax, x0 + s * size, top + 0.06, size, "memory")
        else:
            cell(ax, x0 + s * size, top + 0.06, size, "keyvalue")
        ax.text(x0 + (s + 0.5) * size, top + 0.06 + size / 2, token, ha="center", va="center", fontsize=FONT - 2,
                bbox=dict(boxstyle="round,pad=0.08", facecolor="white", edgecolor="none"))
    for t, token in enumerate(query_tokens):
        cy = top - (t + 1) * size
        cell(ax, x0 - size - 0.06, cy, size, "query")
        ax.text(x0 - size / 2 - 0.06, cy + size / 2, token, ha="center", va="center", fontsize=FONT - 2,
                bbox=dict(boxstyle="round,pad=0.08", facecolor="white", edgecolor="none"))
        for s in range(S):
            cell(ax, x0 + s * size, cy, size, "allowed" if allowed[t][s] else "blocked")
    keys = "keys = memory positions (S)" if key_role == "memory" else "keys = target positions (T)"
    text(ax, x0 + S * size / 2, y0 - 0.2, keys, size=FONT - 1)
    text(ax, x0 - size - 0.3, y0 + T * size / 2, "queries = target positions (T)", size=FONT - 1, rotation=90)


def attention_masks() -> Figure:
    """Lesson 04: the two masks of a decoder layer, side by side, on a padded target and a padded source."""
    fig, ax = canvas(10.0, 5.1)
    target = ["le", "chat", "dort", "PAD"]
    source = ["the", "cat", "is", "asleep", "PAD", "PAD"]
    tgt_real = [tok != "PAD" for tok in target]
    src_real = [tok != "PAD" for tok in source]
    self_allowed = [[s <= t and tgt_real[s] for s in range(4)] for t in range(4)]
    cross_allowed = [[src_real[s] for s in range(6)] for _ in range(4)]
    _mask_panel(ax, 1.5, 1.3, self_allowed, target, target, "keyvalue", "self-attention: (B, 1, T, T)",
                "s <= t  and  target is_real[s]")
    _mask_panel(ax, 5.9, 1.3, cross_allowed, target, source, "memory", "cross-attention: (B, 1, T, S)",
                "memory_is_real[s]  (no triangle)")
    text(ax, 2.5, 0.85, "the triangle hides the future;\nthe pad column hides padding", size=FONT - 1.5,
         style="italic")
    text(ax, 7.4, 0.85, "the whole source is known: every row is the\nsame, only memory padding is hidden",
         size=FONT - 1.5, style="italic")
    legend(ax, ["query", "keyvalue", "memory", "allowed", "blocked"], 0.3, 0.45, 9.6)
    return fig


def kv_cache() -> Figure:
    """Lesson 09: self-attention K/V grow one position per step; the memory's K/V are projected once."""
    fig, ax = canvas(11.6, 5.5)
    size, steps, S = 0.34, 4, 4
    text(ax, 5.8, 5.25, "greedy decoding with a KV cache (one layer shown): each step computes one new position",
         size=FONT + 1, fontweight="bold")
    kx, vx, mx = 2.45, 4.45, 7.3  # where the K cache, the V cache and the memory's K/V start
    heads = ((0.5, "step"), (1.55, "new query\n(B, H, 1, Dh)"), (kx + 0.7, "self-attention K\n(B, H, p+1, Dh)"),
             (vx + 0.7, "self-attention V\n(B, H, p+1, Dh)"),
             (mx + (S + 0.2) * size, "cross-attention K, V of the memory\n(B, H, S, Dh) each"))
    for x, label in heads:
        text(ax, x, 4.7, label, size=FONT - 1, fontweight="bold")
    for p in range(steps):
        y = 3.75 - p * 0.78
        text(ax, 0.5, y + size / 2, f"p = {p}", size=FONT)
        cell(ax, 1.55 - size / 2, y, size, "query")
        for x0 in (kx, vx):
            for k in range(p + 1):
                new = k == p  # this step's position: the one computed now, appended to the cache
                cell(ax, x0 + k * size, y, size, "keyvalue", linewidth=2.6 if new else 0.8,
                     edgecolor=BLACK if new else GREY)
            text(ax, x0 + (p + 1) * size + 0.08, y + size / 2, "new" if p == 0 else "+1 new", size=FONT - 2,
                 ha="left", color="#333333")
        once = p == 0
        for x0 in (mx, mx + (S + 0.4) * size):
            for s in range(S):
                cell(ax, x0 + s * size, y, size, "memory_kv", edgecolor=GREEN, linewidth=2.2 if once else 1.2,
                     linestyle="-" if once else "--")
        text(ax, mx + S * size / 2, y - 0.12, "K", size=FONT - 2)
        text(ax, mx + (S + 0.4 + S / 2) * size, y - 0.12, "V", size=FONT - 2)
        note = "computed once,\nbefore the first step" if once else "the same tensors,\nreused"
        text(ax, mx + (2 * S + 0.4) * size + 0.12, y + size / 2, note, size=FONT - 2, ha="left",
             color="#005A46" if once else GREY)
    # the memory, projected once into the cross-attention's keys and values
    y0 = 3.75 + size / 2
    box(ax, 6.35, y0, 0.75, 0.5, "memory\n(B, S, D)", "memory", fontsize=FONT - 2)
    arrow(ax, (6.73, y0), (mx - 0.05, y0), color=GREEN, lw=2.4)
    text(ax, 6.35, y0 - 0.45, "project_memory", size=FONT - 2.5, family="monospace", color="#005A46")
    text(ax, 5.8, 0.95, "at step p the new query attends to all p + 1 cached keys (cached_causal_mask: key k "
         "allowed when k ≤ p) and to the memory's S keys", size=FONT - 1.5, style="italic")
    legend(ax, ["query", "keyvalue", "memory", "memory_kv"], 0.3, 0.55, 11.0)
    return fig


def beam_search() -> Figure:
    """Lesson 08: beam search with K = 2 on lesson 08's probability tree: kept, pruned, finished."""
    fig, ax = canvas(10.4, 5.2)
    text(ax, 5.2, 4.95, "beam search, K = 2, on lesson 08's tree: keep the 2 best partial sequences per step",
         size=FONT + 1, fontweight="bold")
    # (label, probability, column, row y, state) with state kept / pruned / finished / best
    nodes = {
        "BOS": ("BOS", "1.0", 0, 2.6, "kept"),
        "3": ("3", "0.5", 1, 3.7, "kept"),
        "4": ("4", "0.4", 1, 2.0, "kept"),
        "E": ("EOS", "0.1", 1, 1.15, "pruned"),
        "35": ("3 5", "0.20", 2, 4.35, "kept"),
        "36": ("3 6", "0.15", 2, 3.8, "pruned"),
        "37": ("3 7", "0.15", 2, 3.25, "pruned"),
        "45": ("4 5", "0.36", 2, 2.35, "kept"),
        "46": ("4 6", "0.04", 2, 1.8, "pruned"),
        "35E": ("3 5 EOS", "0.20", 3, 4.35, "finished"),
        "45E": ("4 5 EOS", "0.36", 3, 2.35, "best"),
    }
    edges = [("BOS", "3"), ("BOS", "4"), ("BOS", "E"), ("3", "35"), ("3", "36"), ("3", "37"), ("4", "45"),
             ("4", "46"), ("35", "35E"), ("45", "45E")]
    xs = [0.9, 3.1, 5.5, 8.2]
    w, h = 1.45, 0.4
    for col, label in enumerate(("start", "step 1: 3 candidates, keep 2", "step 2: 5 candidates, keep 2",
                                 "step 3: both beams finish")):
        text(ax, xs[col], 4.65, label, size=FONT - 1, color="#333333")
    styles = {
        "kept": dict(edgecolor=BLUE, linewidth=2.2, linestyle="-", facecolor="white"),
        "pruned": dict(edgecolor=GREY, linewidth=1.0, linestyle="--", facecolor="#F4F4F4"),
        "finished": dict(edgecolor=BLUE, linewidth=2.2, linestyle="-", facecolor="#DDEBF5"),
        "best": dict(edgecolor=VERMILLION, linewidth=3.2, linestyle="-", facecolor="#F9E0CF"),
    }
    for parent, child in edges:
        _, _, c0, y0, _ = nodes[parent]
        _, _, c1, y1, state = nodes[child]
        kept = state != "pruned"
        arrow(ax, (xs[c0] + w / 2, y0), (xs[c1] - w / 2, y1), color=BLACK if kept else GREY,
              lw=1.8 if kept else 0.9, style="-" if kept else "--")
    for label, prob, col, y, state in nodes.values():
        ax.add_patch(FancyBboxPatch((xs[col] - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                    **styles[state]))
        colour = GREY if state == "pruned" else BLACK
        text(ax, xs[col], y, f"{label}   p = {prob}", size=FONT - 1, color=colour,
             fontweight="bold" if state == "best" else "normal")
    text(ax, xs[3] + 0.0, 1.85, "best: 4 5 EOS, p = 0.36", size=FONT - 1, color=VERMILLION, fontweight="bold")
    text(ax, xs[3] + 0.0, 3.85, "greedy's answer: 3 5 EOS, p = 0.20", size=FONT - 1, color="#333333")
    text(ax, xs[1], 0.75, "4 is only the second most likely first token,\nbut a beam of 2 keeps it alive",
         size=FONT - 1.5, style="italic")
    # the legend of this figure: the beam states, one line style each
    lx = 4.6
    for i, (state, label) in enumerate((("kept", "kept in the beam"), ("pruned", "pruned (not in the top K)"),
                                        ("finished", "finished (EOS)"), ("best", "returned: best score"))):
        ly = 1.15 - i * 0.25
        ax.add_patch(FancyBboxPatch((lx + 1.2, ly - 0.09), 0.34, 0.18, boxstyle="round,pad=0,rounding_size=0.03",
                                    **styles[state]))
        text(ax, lx + 1.64, ly, label, size=FONT - 1.5, ha="left")
    return fig


def gpt_stack() -> Figure:
    """Lesson 11 (to come): a decoder-only GPT, the same DecoderLayer with cross-attention switched off."""
    fig, ax = canvas(8.0, 9.6)
    cx = 3.3
    text(ax, 4.0, 9.35, "GPT: a decoder-only stack (pre-LN)", size=FONT + 1, fontweight="bold")
    box(ax, cx, 0.95, 1.9, 0.34, "ids  (B, T)", "hidden")
    box(ax, cx, 1.6, 2.2, 0.34, "tok_embed", "linear")
    box(ax, cx, 2.2, 2.2, 0.34, "+ positional embedding", "linear")
    arrow(ax, (cx, 1.12), (cx, 1.43))
    arrow(ax, (cx, 1.77), (cx, 2.03))
    sublayers = (("masked self-attention\nQ, K, V from x; causal", "attention", "self"),
                 ("cross-attention: off\n(no memory)", "ghost", "ghost"),
                 ("feed-forward\nlinear1 → ReLU → linear2", "ffn", "ffn"))
    start = 2.37
    top = _sublayer_column(ax, cx, start, sublayers, norm_first=True)
    ax.add_patch(FancyBboxPatch((cx - 2.05, start + 0.05), 4.1 + 0.5, top - start + 0.05,
                                boxstyle="round,pad=0,rounding_size=0.1", facecolor="none", edgecolor=GREY,
                                linewidth=1.2, linestyle="-"))
    text(ax, cx + 2.45, top - 0.1, "× N layers", size=FONT, ha="right", fontweight="bold", color="#333333")
    box(ax, cx, top + 0.45, 2.2, 0.32, "final LayerNorm", "norm", fontsize=FONT - 1)
    box(ax, cx, top + 1.0, 2.2, 0.32, "out_proj", "linear", fontsize=FONT - 1)
    box(ax, cx, top + 1.55, 1.9, 0.34, "logits  (B, T, V)", "hidden")
    arrow(ax, (cx, top), (cx, top + 0.29))
    arrow(ax, (cx, top + 0.61), (cx, top + 0.84))
    arrow(ax, (cx, top + 1.16), (cx, top + 1.38))
    # weight tying: out_proj shares tok_embed's matrix
    arrow(ax, (cx + 1.1, 1.6), (6.4, 1.6), (6.4, top + 1.0), (cx + 1.1, top + 1.0), color=GREY, lw=1.1, style="--")
    text(ax, 6.5, (1.6 + top + 1.0) / 2, "tied weights:\nout_proj.weight\nis tok_embed.weight", size=FONT - 1.5,
         ha="left", rotation=0, color="#333333")
    legend(ax, ["query", "keyvalue", "norm", "ffn", "dropout", "ghost"], 0.3, 0.55, 6.8)
    return fig


# Every figure: file name → function. A lesson shows one with ![alt text](assets/<name>.png).
FIGURES: dict[str, Callable[[], Figure]] = {
    "decoder_block.png": decoder_block,
    "encoder_decoder.png": encoder_decoder,
    "multi_head.png": multi_head,
    "attention_masks.png": attention_masks,
    "kv_cache.png": kv_cache,
    "beam_search.png": beam_search,
    "gpt_stack.png": gpt_stack,
}


def draw(out: Path = HERE, names: Sequence[str] | None = None) -> list[Path]:
    """Draw the figures (all, or ``names``) into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    # matplotlib's defaults, whatever a matplotlibrc or an earlier style changed: the same pixels for everyone
    with matplotlib.rc_context(matplotlib.rcParamsDefault):
        matplotlib.rcParams.update({"font.family": "DejaVu Sans", "hatch.linewidth": 0.8,
                                    "path.simplify": False, "text.hinting": "auto"})
        for name in names or FIGURES:
            fig = FIGURES[name]()
            path = out / name
            fig.savefig(path, dpi=DPI, facecolor="white", metadata={"Software": None})
            plt.close(fig)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: assets/)")
    parser.add_argument("names", nargs="*", help=f"figures to draw (default: all): {', '.join(FIGURES)}")
    args = parser.parse_args(argv)
    for path in draw(args.out, args.names or None):
        print(path)


if __name__ == "__main__":
    main()
