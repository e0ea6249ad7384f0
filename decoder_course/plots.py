"""Pictures of what the course builds: masks as grids, attention heatmaps, training curves, speed-ups.

Matplotlib only. Every function accepts NumPy arrays or PyTorch tensors, draws with ``pyplot`` (so the
figure shows inline in Jupyter and Colab, and ``plt.show()`` shows it in a script), and returns what it drew
on: the ``Axes`` for one-panel plots, the ``Figure`` for several panels. In Jupyter, end a line that returns a
figure with ``;`` or assign the result, or the figure shows twice. :class:`LiveCurves` redraws one image
in place while a training loop runs.

Every figure says what it shows to a reader who cannot see it. Each helper writes a description of its panel
computed from the data (:func:`describe`; "mask 6×6 (queries × keys): True on and below the diagonal, ..."), and a
panel drawn without a helper is described from what it holds (title, axis labels, each line's first, last and
lowest values, each image's size and range: :func:`figure_description`). In a notebook a figure is shown with
that text as its image's ``alt``: ``decoder_course`` registers :func:`figure_html` as the figure's ``text/html``
form, which JupyterLab prefers to the PNG (its PNG renderer writes no ``alt``), beside the usual ``image/png``.

Axes follow the course's letters: rows are queries (``T``), columns are keys (``S``).
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from decoder_course.figure_text import (  # noqa: F401 - describe, figure_description, figure_html: plots' own names too
    DescribedImage,
    _listed,
    _num,
    _ranges,
    describe,
    figure_description,
    figure_html,
)

__all__ = [
    "DescribedImage",
    "LiveCurves",
    "describe",
    "figure_description",
    "figure_html",
    "plot_attention",
    "plot_attention_heads",
    "plot_curves",
    "plot_mask",
    "plot_masks",
    "plot_positional_encoding",
    "plot_speedup",
]

ALLOWED_COLOUR = "#2a7ab9"  # a cell where the query may attend to the key
BLOCKED_COLOUR = "#eef0f3"  # a blocked cell: pale, so the allowed pattern stands out
# In an attention heatmap a blocked entry is not drawn as a weight: its weight is 0 because the mask says so,
# which must not look like a weight the softmax made small. Blocked cells are pale and hatched; the cells of a
# query row with no allowed key at all (its weights are all zeros by the course's rule) get a crossed hatch.
BLOCKED_HATCH = "///"
NO_KEY_HATCH = "xxx"
HATCH_COLOUR = "#6b7079"
LEGEND_LOC = "outside right lower"  # right of the colour bar: clear of titles and axis labels
BLOCKED_GID = "blocked"  # the gid of each blocked cell's patch (tests find them by it)
KEY_LABEL = "key position (S)"
QUERY_LABEL = "query position (T)"


def _to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of an array, tensor (any device, with or without grad) or nested list."""
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _first_2d(x: np.ndarray, what: str) -> np.ndarray:
    """The first item of each leading dimension, down to 2-D: (B, H, T, S) → (T, S); (S,) → (1, S)."""
    if x.ndim == 0:
        raise ValueError(f"{what} must have at least one dimension, got a scalar")
    while x.ndim > 2:
        x = x[0]
    return x[None, :] if x.ndim == 1 else x


def _as_mask(allowed: Any) -> np.ndarray:
    """A boolean 2-D mask from a boolean (or 0/1) array or tensor, refusing anything that is not a mask."""
    return _first_2d(_bool_mask(allowed), "a mask")


def _bool_mask(allowed: Any) -> np.ndarray:
    """A boolean mask of any shape from a boolean (or 0/1) array or tensor, refusing anything that is not one."""
    mask = _to_numpy(allowed)
    if mask.ndim == 0:
        raise ValueError("a mask must have at least one dimension, got a scalar")
    if mask.dtype != bool:
        values = np.unique(mask)
        if not np.isin(values, [0, 1]).all():
            raise ValueError(
                "a mask holds True/False (True = this query may attend to this key), but this one holds "
                f"values such as {values[:4].tolist()}: is it an additive bias or attention weights? "
                "Use plot_attention for weights."
            )
        mask = mask.astype(bool)
    return mask


def _tick_labels(ax: Axes, labels: Sequence[Any] | None, n: int, axis: str) -> None:
    """Put token labels (or every position when there are few) on the x or y axis."""
    positions = np.arange(n)
    if labels is not None:
        if len(labels) != n:
            raise ValueError(f"{len(labels)} labels for {n} {'keys' if axis == 'x' else 'queries'}")
        text = [str(label) for label in labels]
    elif n <= 24:
        text = [str(i) for i in positions]
    else:
        return
    if axis == "x":
        ax.set_xticks(positions, text, rotation=90 if labels is not None else 0)
    else:
        ax.set_yticks(positions, text)


def _new_axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    _, ax = plt.subplots(figsize=size, layout="constrained")
    return ax


# ------------------------------------------------------------------------------------------------------------
# Descriptions: what a figure shows, in words, for a reader who cannot see it (the image's alt text)
# ------------------------------------------------------------------------------------------------------------

def _mask_pattern(mask: np.ndarray) -> str:
    """Which cells of a (T, S) mask are True, in words: a named pattern when it is one, else row by row."""
    T, S = mask.shape
    if mask.all():
        return "every cell True: every query may attend to every key"
    if not mask.any():
        return "every cell False: no query may attend to any key"
    if T == S and np.array_equal(mask, np.tril(np.ones((T, S), dtype=bool))):
        return ("True on and below the diagonal, False above it: each query may attend to itself and the "
                "keys before it (causal)")
    if (mask == mask[0]).all():
        return (f"the same in every row: keys {_ranges(np.nonzero(~mask[0])[0].tolist())} blocked, keys "
                f"{_ranges(np.nonzero(mask[0])[0].tolist())} allowed")
    rows = [f"query {t}: " + (f"key{'s' if row.sum() > 1 else ''} {_ranges(np.nonzero(row)[0].tolist())}"
                              if row.any() else "no key") for t, row in enumerate(mask)]
    return f"{int(mask.sum())} of {T * S} cells True; allowed keys by row: {_listed(rows)}"


def _strongest_keys(w: np.ndarray, query_tokens: Sequence[Any] | None, key_tokens: Sequence[Any] | None,
                    blocked: np.ndarray | None) -> str:
    """Each query's largest weight, in words: "query 0 → key 0 (1.00); query 1 → key 0 (0.62); …"."""
    def name(kind: str, i: int, tokens: Sequence[Any] | None) -> str:
        return f"{kind} {i} '{tokens[i]}'" if tokens is not None else f"{kind} {i}"

    rows = []
    for t, row in enumerate(w):
        if blocked is not None and blocked[t].all():
            rows.append(f"{name('query', t, query_tokens)}: no allowed key (all zeros)")
        elif np.isfinite(row).any():
            s = int(np.nanargmax(row))
            rows.append(f"{name('query', t, query_tokens)} → {name('key', s, key_tokens)} ({row[s]:.2f})")
    return "strongest key of each query: " + _listed(rows)


def plot_mask(
    allowed: Any,
    title: str | None = None,
    ax: Axes | None = None,
    query_labels: Sequence[Any] | None = None,
    key_labels: Sequence[Any] | None = None,
    legend: bool = True,
) -> Axes:
    """Draw a boolean mask as a grid: allowed cells coloured, blocked cells pale, one row per query.

    Shape:
        allowed: (T, S), or any (B, 1, T, S) / (B, T, S) mask, of which the first item is drawn.
    """
    mask = _as_mask(allowed)  # (T, S)
    T, S = mask.shape
    ax = _new_axes(ax, (min(1.2 + 0.45 * S, 9), min(1.0 + 0.45 * T, 9)))
    # 1 = allowed, 0 = blocked; the two-colour map draws them without shading.
    ax.imshow(mask.astype(np.int64), cmap=ListedColormap([BLOCKED_COLOUR, ALLOWED_COLOUR]), vmin=0, vmax=1,
              interpolation="nearest", aspect="equal")
    # White lines between cells, on the minor ticks half-way between positions.
    ax.set_xticks(np.arange(-0.5, S, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, T, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    _tick_labels(ax, key_labels, S, "x")
    _tick_labels(ax, query_labels, T, "y")
    ax.set_xlabel(KEY_LABEL)
    ax.set_ylabel(QUERY_LABEL)
    if title is not None:
        ax.set_title(title)
    if legend:
        handles = [Patch(color=ALLOWED_COLOUR, label="True: may attend"),
                   Patch(color=BLOCKED_COLOUR, label="False: blocked")]
        # Outside the grid, on the right, so it never hides a cell.
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                  fontsize="small")
    head = f"'{title}': " if title else ""
    describe(ax, f"{head}mask {T}×{S} (rows: queries, columns: keys), {_mask_pattern(mask)}")
    return ax


def plot_masks(masks: Sequence[Any], titles: Sequence[str] | None = None, **kwargs: Any) -> Figure:
    """Draw several masks side by side (same options as :func:`plot_mask`); the legend goes on the last one.

    Shape:
        masks: a list of (T, S) masks (each may be a (B, 1, T, S) mask: its first item is drawn).
    """
    if titles is not None and len(titles) != len(masks):
        raise ValueError(f"{len(titles)} titles for {len(masks)} masks")
    fig, axes = plt.subplots(1, len(masks), figsize=(3.2 * len(masks) + 1.5, 3.4), layout="constrained",
                             squeeze=False)
    for i, (ax, mask) in enumerate(zip(axes[0], masks, strict=True)):
        title = None if titles is None else titles[i]
        plot_mask(mask, title=title, ax=ax, legend=i == len(masks) - 1, **kwargs)
    return fig


def _blocked_of(allowed: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``~allowed`` broadcast to the weights' ``shape``: True where the mask blocks the key."""
    mask = _bool_mask(allowed)
    try:
        return ~np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(f"allowed {mask.shape} does not broadcast to the weights {shape}") from None


def _mark_blocked(ax: Axes, blocked: np.ndarray) -> set[str]:
    """Cover each blocked cell of a (T, S) heatmap with a pale hatched patch; return the kinds drawn."""
    no_key = blocked.all(axis=-1)  # (T,): a query row with no allowed key
    for t, s in zip(*np.nonzero(blocked), strict=True):
        ax.add_patch(Rectangle((s - 0.5, t - 0.5), 1, 1, facecolor=BLOCKED_COLOUR, edgecolor=HATCH_COLOUR,
                               hatch=NO_KEY_HATCH if no_key[t] else BLOCKED_HATCH, linewidth=0, gid=BLOCKED_GID))
    return {kind for kind, present in (("blocked", (blocked & ~no_key[:, None]).any()), ("no key", no_key.any()))
            if present}


def _blocked_legend(fig: Figure, kinds: set[str]) -> None:
    """One legend under the figure for what the hatches mean (merged when several heatmaps share a figure)."""
    drawn = getattr(fig, "_course_blocked_kinds", set())
    kinds = drawn | kinds
    if kinds == drawn:
        return
    for legend in [legend for legend in fig.legends if getattr(legend, "_course_blocked", False)]:
        legend.remove()
    meaning = {"blocked": (BLOCKED_HATCH, "blocked by the mask\n(weight 0)"),
               "no key": (NO_KEY_HATCH, "query with no\nallowed key\n(row of zeros)")}
    handles = [Patch(facecolor=BLOCKED_COLOUR, edgecolor=HATCH_COLOUR, hatch=meaning[kind][0], label=meaning[kind][1])
               for kind in ("blocked", "no key") if kind in kinds]
    legend = fig.legend(handles=handles, loc=LEGEND_LOC, frameon=False, fontsize="small", handleheight=1.6,
                        labelspacing=1.0)
    legend._course_blocked = True
    fig._course_blocked_kinds = kinds


def plot_attention(
    weights: Any,
    query_tokens: Sequence[Any] | None = None,
    key_tokens: Sequence[Any] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    vmax: float | None = 1.0,
    allowed: Any = None,
) -> Axes:
    """Draw attention weights as a heatmap with a colour bar: row t shows where query t looks.

    The colour scale runs from 0 to ``vmax``: 1 by default, so maps can be compared; None scales to the
    largest weight. Given the mask ``allowed``, blocked entries are drawn pale and hatched, and the cells of a
    query with no allowed key cross-hatched, so that neither looks like a small weight; a legend says which.

    Shape:
        weights: (T, S), or (B, H, T, S) / (H, T, S), whose first item along each leading dimension is drawn;
        allowed: bool, broadcastable to the weights' shape (e.g. (B, 1, T, S) or (T, S)), or None.
    """
    raw = _to_numpy(weights).astype(np.float64)
    w = _first_2d(raw, "attention weights")  # (T, S)
    T, S = w.shape
    legend_width = 0.0 if allowed is None else 1.6  # room for the legend of the hatches
    ax = _new_axes(ax, (min(2.0 + 0.45 * S, 10) + legend_width, min(1.0 + 0.45 * T, 9)))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
    ax.figure.colorbar(image, ax=ax, label="attention weight", shrink=0.9)
    blocked = None
    if allowed is not None:
        blocked = _first_2d(_blocked_of(allowed, raw.shape if raw.ndim >= 2 else w.shape), "a mask")  # (T, S)
        _blocked_legend(ax.figure, _mark_blocked(ax, blocked))
    _tick_labels(ax, key_tokens, S, "x")
    _tick_labels(ax, query_tokens, T, "y")
    ax.set_xlabel("key (S)" if key_tokens is not None else KEY_LABEL)
    ax.set_ylabel("query (T)" if query_tokens is not None else QUERY_LABEL)
    if title is not None:
        ax.set_title(title)
    describe(ax, _attention_description(w, query_tokens, key_tokens, blocked, title))
    return ax


def _attention_description(w: np.ndarray, query_tokens: Sequence[Any] | None, key_tokens: Sequence[Any] | None,
                           blocked: np.ndarray | None, title: str | None) -> str:
    """A (T, S) heatmap of attention weights in words: its size, the blocked entries, each query's strongest key."""
    T, S = w.shape
    head = f"'{title}': " if title else ""
    masked = ""
    if blocked is not None and blocked.any():
        masked = f"; {int(blocked.sum())} entries blocked by the mask (drawn pale and hatched, weight 0)"
    return (f"{head}attention weights heatmap, {T} queries (rows) × {S} keys (columns), weights from "
            f"{_num(np.nanmin(w))} to {_num(np.nanmax(w))}{masked}; "
            f"{_strongest_keys(w, query_tokens, key_tokens, blocked)}")


def plot_attention_heads(
    weights: Any,
    query_tokens: Sequence[Any] | None = None,
    key_tokens: Sequence[Any] | None = None,
    title: str | None = None,
    ncols: int = 4,
    allowed: Any = None,
) -> Figure:
    """Draw each head's attention weights as a small heatmap, on one shared 0–1 colour scale.

    Given the mask ``allowed``, blocked entries are drawn pale and hatched (cross-hatched for a query with no
    allowed key), with a legend, as in :func:`plot_attention`.

    Shape:
        weights: (H, T, S), or (B, H, T, S), of which the first batch item is drawn;
        allowed: bool, broadcastable to the weights' shape (e.g. (B, 1, T, S) or (T, S)), or None.
    """
    w = _to_numpy(weights).astype(np.float64)
    blocked = None if allowed is None else _blocked_of(allowed, w.shape)
    if w.ndim == 4:
        w = w[0]  # (H, T, S)
        blocked = None if blocked is None else blocked[0]
    if w.ndim != 3:
        raise ValueError(f"plot_attention_heads expects weights (H, T, S) or (B, H, T, S), got {w.shape}")
    H, T, S = w.shape
    ncols = max(1, min(ncols, H))
    nrows = -(-H // ncols)  # ceil(H / ncols)
    legend_width = 0.0 if allowed is None else 1.4  # room for the legend of the hatches
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols + 1.0 + legend_width, 2.4 * nrows + 0.4),
                             layout="constrained", squeeze=False)
    image, used, kinds = None, [], set()
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.remove()  # an empty cell of the grid
            continue
        used.append(ax)
        image = ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
        if blocked is not None:
            kinds |= _mark_blocked(ax, blocked[h])
        ax.set_title(f"head {h}", fontsize="medium")
        describe(ax, _attention_description(w[h], query_tokens, key_tokens,
                                            None if blocked is None else blocked[h], f"head {h}"))
        _tick_labels(ax, key_tokens, S, "x")
        _tick_labels(ax, query_tokens, T, "y")
        # Tick labels only on the outer edge of the grid, to keep small panels readable.
        ax.tick_params(labelleft=h % ncols == 0, labelbottom=h + ncols >= H)
    fig.colorbar(image, ax=used, label="attention weight", shrink=0.9)
    fig.supxlabel(KEY_LABEL)
    fig.supylabel(QUERY_LABEL)
    if title is not None:
        fig.suptitle(title)
    if kinds:
        _blocked_legend(fig, kinds)
    return fig


def plot_positional_encoding(
    pe: Any, ax: Axes | None = None, title: str | None = "sinusoidal positional encoding"
) -> Axes:
    """Draw a positional-encoding table as a heatmap: one row per position, one column per model dimension.

    Shape:
        pe: (T, D), or (1, T, D).
    """
    table = _first_2d(_to_numpy(pe).astype(np.float64), "a positional encoding")  # (T, D)
    ax = _new_axes(ax, (8, 4))
    limit = float(np.abs(table).max()) or 1.0
    image = ax.imshow(table, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest", aspect="auto")
    ax.figure.colorbar(image, ax=ax, label="value")
    ax.set_xlabel("dimension (D)")
    ax.set_ylabel("position (T)")
    if title is not None:
        ax.set_title(title)
    T, D = table.shape
    flips = [int((np.diff(np.sign(table[:, d])) != 0).sum()) for d in (0, D - 1)]
    head = f"'{title}': " if title else ""
    describe(ax, f"{head}positional encoding heatmap, {T} positions (rows) × {D} "
                 f"dimensions (columns), values from {_num(table.min())} to {_num(table.max())}; going down the "
                 f"positions, dimension 0 changes sign {flips[0]} times and dimension {D - 1} {flips[1]} times")
    return ax


# ------------------------------------------------------------------------------------------------------------
# Training curves
# ------------------------------------------------------------------------------------------------------------

# name → (steps, values): the form LiveCurves keeps and plot_curves draws.
History = dict[str, tuple[list[float], list[float]]]


def _normalise_history(history: Any) -> History:
    """``{name: values}``, ``{name: (steps, values)}`` or ``[{"step": s, name: value}, ...]`` as a History."""
    if isinstance(history, LiveCurves):
        return history.history
    if isinstance(history, Sequence) and not isinstance(history, str):
        records: History = {}
        for i, record in enumerate(history):
            step = record.get("step", i)
            for name, value in record.items():
                if name != "step" and value is not None:
                    steps, values = records.setdefault(name, ([], []))
                    steps.append(float(step))
                    values.append(float(value))
        return records
    if not isinstance(history, Mapping):
        raise TypeError(f"history must be a dict or a list of dicts, got {type(history).__name__}")
    out: History = {}
    for name, series in history.items():
        # A (steps, values) pair is a tuple of two 1-D sequences; anything else is the values alone.
        is_pair = isinstance(series, tuple) and len(series) == 2 and all(np.ndim(p) == 1 for p in series)
        if is_pair:
            steps, values = (_to_numpy(part).astype(np.float64).tolist() for part in series)
        else:
            values = _to_numpy(series).astype(np.float64).reshape(-1).tolist()
            steps = list(range(len(values)))
        out[str(name)] = (steps, values)
    return out


def _is_loss(name: str) -> bool:
    return "loss" in name.lower() or "perplexity" in name.lower()


def _draw_curves(
    fig: Figure, history: History, title: str | None, logy: bool, total_steps: int | None
) -> None:
    """(Re)draw losses on a left panel and every other metric (accuracies, in [0, 1]) on a right panel."""
    fig.clear()
    groups = [[name for name in history if _is_loss(name)], [name for name in history if not _is_loss(name)]]
    groups = [group for group in groups if group] or [[]]
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, names in zip(axes, groups, strict=True):
        for name in names:
            steps, values = history[name]
            ax.plot(steps, values, label=name, marker="." if len(values) < 30 else None)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if total_steps is not None:
            ax.set_xlim(0, total_steps)
        if names and _is_loss(names[0]):
            ax.set_ylabel("loss")
            all_values = [v for name in names for v in history[name][1]]
            if logy and all_values and min(all_values) > 0:
                ax.set_yscale("log")
        elif names:
            ax.set_ylabel("accuracy / exact match")
            ax.set_ylim(-0.02, 1.02)
        if names:
            ax.legend(loc="best", fontsize="small")
    if title is not None:
        fig.suptitle(title)


def plot_curves(history: Any, title: str | None = None, logy: bool = True) -> Figure:
    """Draw training curves: losses on the left panel, accuracies and exact match on the right.

    ``history`` is ``{name: values}`` (x = index), ``{name: (steps, values)}``, a list of ``{"step": s, name:
    value}`` records, or a :class:`LiveCurves`.
    """
    fig = plt.figure(figsize=(10, 3.6), layout="constrained")
    _draw_curves(fig, _normalise_history(history), title, logy, None)
    return fig


def _in_notebook() -> bool:
    """True inside a Jupyter or Colab kernel (where rich output can be updated in place)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")


def _display(obj: Any, display_id: bool = False) -> Any:
    """IPython's ``display``, kept as one name so tests can replace it."""
    from IPython.display import display

    return display(obj, display_id=display_id)


class LiveCurves:
    """Live loss and exact-match curves for a training loop: one image, redrawn in place while training runs.

    In Jupyter or Colab the figure is shown once and updated through a display handle at most every
    ``every_s`` seconds (default 1); elsewhere a line of numbers is printed at most every ``every_s`` seconds
    (default 10) instead (``mode="print"``), or nothing
    (``mode="silent"``). ``final()`` draws the last state and returns the figure (assign it:
    ``fig = curves.final()``).

    Example::

        curves = LiveCurves(total_steps=1000)
        for step in range(1000):
            ...
            curves.update(step, loss=loss.item())
            if step % 100 == 0:
                curves.update(step, exact_match=evaluate(model))
        fig = curves.final()
    """

    def __init__(self, title: str | None = None, every_s: float | None = None, mode: str = "auto",
                 logy: bool = True, total_steps: int | None = None):
        if mode not in ("auto", "notebook", "print", "silent"):
            raise ValueError(f"mode must be 'auto', 'notebook', 'print' or 'silent', got {mode!r}")
        self.mode = ("notebook" if _in_notebook() else "print") if mode == "auto" else mode
        if every_s is None:
            every_s = 1.0 if self.mode == "notebook" else 10.0  # a printed line per second would be noise
        self.title, self.every_s, self.logy, self.total_steps = title, every_s, logy, total_steps
        self.history: History = {}
        # A figure outside pyplot: it is never shown twice by the inline backend nor kept open by pyplot.
        self.fig = Figure(figsize=(10, 3.6), layout="constrained")
        self._handle = None
        self._last_shown = -float("inf")
        self._last_step: float | None = None

    def update(self, step: float, **metrics: Any) -> None:
        """Record ``metrics`` (numbers or 0-d tensors) at ``step``; show them if ``every_s`` has passed."""
        for name, value in metrics.items():
            steps, values = self.history.setdefault(name, ([], []))
            steps.append(float(step))
            values.append(float(value))
        self._last_step = float(step)
        if time.monotonic() - self._last_shown >= self.every_s:
            self._show()

    def final(self) -> Figure:
        """Draw (or print) the last state and return the figure."""
        self._show()
        if self.mode != "notebook":
            _draw_curves(self.fig, self.history, self.title, self.logy, self.total_steps)
        return self.fig

    def _show(self) -> None:
        self._last_shown = time.monotonic()
        if self.mode == "print":
            parts = [f"{name} {values[-1]:.4g}" for name, (_, values) in self.history.items()]
            if parts:
                print(f"step {self._last_step:g}: " + "  ".join(parts), flush=True)
        elif self.mode == "notebook":
            _draw_curves(self.fig, self.history, self.title, self.logy, self.total_steps)
            image = self._png()
            if self._handle is None:
                self._handle = _display(image, display_id=True)
            else:
                self._handle.update(image)

    def _png(self) -> DescribedImage:
        """The figure as a PNG with its description (independent of the notebook's matplotlib backend)."""
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", dpi=80)
        return DescribedImage(buffer.getvalue(), figure_description(self.fig))


# ------------------------------------------------------------------------------------------------------------
# Speed-up
# ------------------------------------------------------------------------------------------------------------


def plot_speedup(
    lengths: Sequence[float],
    seconds_a: Sequence[float],
    seconds_b: Sequence[float],
    labels: tuple[str, str] = ("without KV cache", "with KV cache"),
    title: str | None = None,
) -> Figure:
    """Draw two timings against generated length (left) and the speed-up ``seconds_a / seconds_b`` (right)."""
    x = _to_numpy(lengths).astype(np.float64).reshape(-1)
    a = _to_numpy(seconds_a).astype(np.float64).reshape(-1)
    b = _to_numpy(seconds_b).astype(np.float64).reshape(-1)
    if not len(x) == len(a) == len(b):
        raise ValueError(f"need as many timings as lengths, got {len(x)}, {len(a)} and {len(b)}")
    fig, (ax_time, ax_ratio) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    ax_time.plot(x, a, marker="o", label=labels[0])
    ax_time.plot(x, b, marker="o", label=labels[1])
    ax_time.set_xlabel("generated length (tokens)")
    ax_time.set_ylabel("seconds")
    ax_time.legend()
    ax_time.grid(alpha=0.3)
    ax_ratio.plot(x, a / b, marker="o", color="black")
    ax_ratio.axhline(1.0, color="grey", linestyle="--", linewidth=1)  # below this line the second is slower
    ax_ratio.set_xlabel("generated length (tokens)")
    ax_ratio.set_ylabel("speed-up (×)")
    ax_ratio.set_title(f"time {labels[0]} ÷ time {labels[1]}", fontsize="medium")
    ax_ratio.grid(alpha=0.3)
    if title is not None:
        fig.suptitle(title)
    return fig
