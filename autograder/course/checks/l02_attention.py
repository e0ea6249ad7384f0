"""Hidden checks of lesson 02-attention (NumPy): softmax, masked softmax, scaled dot-product attention.

All three are specs (``decoder_course/visible/l02_attention.py``): the visible checks' rows on secret draws, their
contracts and properties judged here by the same public code (blocked keys get no weight, fully masked rows are
zeros, rows sum to one, the future and the padded keys do not leak), then the values against the reference's, each
item's known mistakes named. ``fixed_attention`` (find the bug) is judged by attention's spec.

``masked_softmax`` may call the student's ``softmax``, and attention their ``masked_softmax``: those items are
judged relative to the student's own answers (``uses``, :mod:`autograder.course.checks.relative`), so a wrong
``softmax`` costs ``softmax`` only.
"""

from __future__ import annotations

from autograder.course.checks import spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.find_the_bug import FindTheBug
from autograder.course.reference import attention as ref
from decoder_course.visible import l02_attention as visible

LESSON = "02-attention"


# ------------------------------------------------------------------------------------------------------------
# fixed_attention: find the bug (autograder.course.bugs), judged as scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------------------
@exercise(LESSON, "fixed_attention")
class FixedAttention(FindTheBug, spec.SpecExercise):
    """The given attention normalised over the queries (axis -2): the attention's own spec, rows and verdicts."""

    judged_as = "scaled_dot_product_attention"
    spec = visible.SPECS["scaled_dot_product_attention"]
    ref = reference = ref
