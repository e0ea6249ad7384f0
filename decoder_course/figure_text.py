"""What a figure shows, in words: the alt text a screen reader reads for each of the course's figures.

:func:`describe` gives a panel (or a figure) its text; a panel drawn without one is described from what it holds
(title, axis labels, each line's first, last and lowest values, each image's size and range:
:func:`figure_description`). In a notebook a figure is shown with that text as its image's ``alt``: its ``text/html``
form (:func:`figure_html`), which JupyterLab prefers to the PNG (its PNG renderer writes no ``alt``), is registered
for every matplotlib figure of the kernel (:mod:`decoder_course.notebook_figures`). :mod:`decoder_course.plots`'
helpers describe their panels from the data they draw, with the small formatters here.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from decoder_course import notebook_figures

DESCRIPTION_ATTR = "_course_description"  # where describe() keeps a panel's or a figure's text
LISTED = 8  # rows, series or labels a description lists one by one; beyond, it says how many more


def describe(target: Axes | Figure, text: str) -> Axes | Figure:
    """Say in words what a panel (an ``Axes``) or a whole ``Figure`` shows: a screen reader reads it as the
    image's alt text. It replaces the description made from the panel's content (:func:`figure_description`),
    which names only what is drawn; write what the reader should see in it. Returns ``target``."""
    if not isinstance(target, (Axes, Figure)):
        raise TypeError(f"describe takes a matplotlib Axes or Figure, got {type(target).__name__}: "
                        "pass the ax (or fig) you drew on")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("describe needs a text that says what the figure shows, e.g. "
                         "'loss falls from 2.3 to 0.4 over 500 steps'")
    setattr(target, DESCRIPTION_ATTR, " ".join(text.split()))
    _describe_figures_in_notebooks()  # a kernel that imported the package before its shell existed (see the end)
    return target


def _num(x: float) -> str:
    return f"{float(x):.3g}"


def _listed(items: Sequence[str]) -> str:
    """The first LISTED items joined by "; ", and how many more there are."""
    shown = "; ".join(items[:LISTED])
    return shown + (f"; and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _ranges(positions: Sequence[int]) -> str:
    """Integer positions as runs: [0, 1, 2, 5] → "0–2, 5"."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def _line_description(line: Any) -> str | None:
    """One plotted line in words: its name, where it starts and ends, its lowest and highest points."""
    x = np.asarray(line.get_xdata(), dtype=np.float64).reshape(-1)
    y = np.asarray(line.get_ydata(), dtype=np.float64).reshape(-1)
    keep = np.isfinite(x) & np.isfinite(y) if x.shape == y.shape else np.isfinite(y)
    if x.shape != y.shape:
        x = np.arange(len(y), dtype=np.float64)
    x, y = x[keep], y[keep]
    label = str(line.get_label())
    name = f"'{label}'" if label and not label.startswith("_") else "a line"
    if y.size == 0:
        return None
    if y.size == 2 and y[0] == y[1] and x[0] != x[1] and tuple(x) == (0.0, 1.0):
        return f"{name}: a horizontal line at {_num(y[0])}"
    if x.size == 2 and x[0] == x[1] and tuple(y) == (0.0, 1.0):
        return f"{name}: a vertical line at {_num(x[0])}"
    if y.size <= 6:
        points = ", ".join(f"({_num(a)}, {_num(b)})" for a, b in zip(x, y, strict=True))
        return f"{name}: {y.size} point{'s' if y.size > 1 else ''} {points}"
    low, high = int(np.argmin(y)), int(np.argmax(y))
    return (f"{name}: {y.size} points from x={_num(x[0])} to x={_num(x[-1])}, y going from {_num(y[0])} to "
            f"{_num(y[-1])} (lowest {_num(y[low])} at x={_num(x[low])}, highest {_num(y[high])} at "
            f"x={_num(x[high])})")


def _content_description(ax: Axes) -> str:
    """What a panel drawn without a helper holds: its images, lines, bars and text labels."""
    parts = []
    for image in ax.images:
        values = np.ma.masked_invalid(np.ma.asarray(image.get_array(), dtype=np.float64))
        if values.ndim == 2 and values.count():
            parts.append(f"a heatmap of {values.shape[0]} rows × {values.shape[1]} columns, values from "
                         f"{_num(values.min())} to {_num(values.max())}")
    parts += [text for line in ax.lines if (text := _line_description(line)) is not None]
    bars = [container for container in ax.containers if hasattr(container, "datavalues")]
    for container in bars:
        label = str(container.get_label())
        values = ", ".join(_num(v) for v in list(container.datavalues)[:LISTED])
        name = f"'{label}'" if label and not label.startswith("_") else "bars"
        parts.append(f"{name}: {len(container.datavalues)} bars of heights {values}")
    texts = [t.get_text() for t in ax.texts if t.get_text().strip()]
    if texts:
        parts.append("labels " + _listed([f"'{t}'" for t in texts]).replace("; ", ", "))
    shapes = len(ax.patches) - sum(len(c) for c in bars)
    if shapes > 0 and not parts:
        parts.append(f"{shapes} shapes")
    return _listed(parts) if parts else "nothing drawn"


def _axes_description(ax: Axes) -> str:
    """A panel in words: the text :func:`describe` gave it, else its title, axes and content."""
    given = getattr(ax, DESCRIPTION_ATTR, None)
    if given:
        return given
    head = f"'{ax.get_title()}': " if ax.get_title() else ""
    axes = [f"{which} axis {label}" + (" (log scale)" if scale == "log" else "")
            for which, label, scale in (("x", ax.get_xlabel(), ax.get_xscale()),
                                         ("y", ax.get_ylabel(), ax.get_yscale())) if label]
    return head + _content_description(ax) + (f"; {', '.join(axes)}" if axes else "")


def figure_description(fig: Figure) -> str:
    """What ``fig`` shows, in words: the text :func:`describe` gave the figure, else its title and each panel's
    description (colour bars left out: the panel they belong to names its values)."""
    given = getattr(fig, DESCRIPTION_ATTR, None)
    if given:
        return given
    panels = [ax for ax in fig.axes if ax.get_visible() and not hasattr(ax, "_colorbar")]
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    head = f"Figure '{suptitle}'. " if suptitle else ""
    if len(panels) == 1:
        return head + _axes_description(panels[0])
    if not panels:
        return head + "An empty figure."
    return head + " ".join(f"Panel {i} of {len(panels)}: {_axes_description(ax)}."
                           for i, ax in enumerate(panels, start=1))


def _img_html(png_base64: str, description: str) -> str:
    """An ``<img>`` of a PNG with its description as ``alt`` (escaped: a title may come from anyone's code)."""
    return f'<img src="data:image/png;base64,{png_base64}" alt="{html.escape(description, quote=True)}">'


def figure_html(fig: Figure) -> str | None:
    """The figure as an HTML ``<img>`` whose ``alt`` is :func:`figure_description`: the ``text/html`` form a
    notebook shows (JupyterLab writes no ``alt`` for an ``image/png`` output); None for an empty figure."""
    from IPython.core.pylabtools import print_figure

    png = print_figure(fig, "png", bbox_inches="tight", base64=True)  # as the inline backend draws it
    return _img_html(png, figure_description(fig)) if png else None


class DescribedImage:
    """A PNG and what it shows: displayed as ``image/png`` and as an ``<img>`` with ``alt`` (``text/html``),
    so that every front end shows the picture and JupyterLab gives a screen reader the description."""

    def __init__(self, png: bytes, description: str):
        self.data, self.description = png, description

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        encoded = base64.b64encode(self.data).decode("ascii")
        return {"image/png": encoded, "text/html": _img_html(encoded, self.description),
                "text/plain": self.description}


def figure_mimebundle(fig: Figure) -> dict:
    """A figure's ``text/html`` form (:func:`figure_html`) as IPython's mime-bundle formatter wants it; nothing for
    an empty figure."""
    page = figure_html(fig)
    return {"text/html": page} if page else {}


def _describe_figures_in_notebooks() -> bool:
    return notebook_figures.register(figure_mimebundle)


# A kernel that imported the package before its shell existed registers here, when a lesson imports the plots, or
# when a helper describes a figure: a grading sandbox imports both before it forks each notebook's kernel.
_describe_figures_in_notebooks()
