"""Companion package of the decoder course: conventions, toy data, plots and the building blocks of visible checks.

It never holds the answer to an exercise: every graded function is written by the student in a lesson, and its
reference lives only on the instructor's side, never in this package.

Conventions (lesson 00 states them again; the course's own tests hold the two to this text)
-------------------------------------------------------------------------------------------
Dimensions
    ``B`` batch, ``T`` target/query length, ``S`` source/key length, ``H`` heads, ``D`` model width,
    ``Dh = D // H`` head width, ``F`` feed-forward width, ``V`` vocabulary. Shape comments read ``# (B, H, T, S)``.
Masks
    A mask is boolean and ``True`` means **"this query may attend to this key"**, as in
    ``torch.nn.functional.scaled_dot_product_attention``. We call it ``allowed``; it broadcasts to ``(B, H, T, S)``.
    PyTorch's ``nn.MultiheadAttention`` and ``nn.Transformer*`` use the opposite polarity (``True`` = blocked):
    invert only at that boundary (``blocked = ~allowed``), with a comment.
Padding
    ``is_real`` is boolean ``(B, S)`` or ``(B, T)``, ``True`` for real tokens.
Fully masked rows
    A query row whose keys are all masked returns **zeros**: never NaN, never a uniform average.
Token ids
    ``PAD``, ``BOS`` and ``EOS`` are the special ids of every toy vocabulary in :mod:`decoder_course.data`.

Modules
-------
:mod:`~decoder_course.data`
    Toy tasks made by code (digit copy, reverse, sort; dates), vocabularies, padded batches, held-out splits.
:mod:`~decoder_course.plots`
    Masks as grids, attention heatmaps, live training curves, positional encodings, speed-ups.
:mod:`~decoder_course.checks`
    The building blocks of visible checks: ``check(title)``, ``expect_*`` helpers and leakage probes.
:mod:`~decoder_course.devices`
    ``device()``: cuda, else mps, else cpu (``DECODER_COURSE_DEVICE`` overrides); a clock that synchronises.
``grading()``
    True while nbgrader grades the notebook: lessons 07–09 then keep their training and timing runs short.

Importing the package, its data and its NumPy checks never imports torch: lessons 00–02 run without it.
"""

import os

from decoder_course import notebook_figures
from decoder_course.conventions import BOS, DIMENSIONS, EOS, PAD, SPECIAL_TOKENS
from decoder_course.devices import device

__all__ = ["BOS", "DIMENSIONS", "EOS", "PAD", "SPECIAL_TOKENS", "device", "grading"]
__version__ = "0.1.0"

GRADING_ENV = "NBGRADER_EXECUTION"  # set by nbgrader while it executes a notebook to grade it


def grading() -> bool:
    """True while the notebook is being graded (nbgrader sets ``NBGRADER_EXECUTION``): demonstrations that
    train or time things then run short, since no graded item reads what they compute."""
    return bool(os.environ.get(GRADING_ENV))


def _figure_html(fig) -> dict:
    """A matplotlib figure's ``text/html`` form (:func:`decoder_course.figure_text.figure_mimebundle`); that
    module, and so matplotlib, imported only once a figure is shown."""
    from decoder_course import figure_text

    return figure_text.figure_mimebundle(fig)


def describe_figures_in_notebooks() -> bool:
    """Show every matplotlib figure of this kernel with a text description a screen reader gets: its ``text/html``
    form becomes an ``<img>`` with ``alt`` (JupyterLab prefers it to the PNG, whose renderer writes no ``alt``); the
    PNG and the text still come from the usual formatters. A figure drawn with ``plt`` directly is described from
    what it holds (:func:`decoder_course.figure_text.figure_description`). Run when the package is imported in a kernel;
    True when it was registered (:func:`decoder_course.notebook_figures.register`)."""
    return notebook_figures.register(_figure_html)


describe_figures_in_notebooks()
