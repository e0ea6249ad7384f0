"""Hidden checks of lesson 03-multi-head: every exercise is a spec.

The four head exercises, ``MultiHeadAttention`` and ``causal_self_attention`` (find the bug, handed the student's
own ``MultiHeadAttention``) are rows of ``decoder_course/visible/l03_multi_head.py``.
"""

from autograder.checks import spec
from autograder.reference import multi_head as ref
from decoder_course.visible import l03_multi_head as visible

LESSON = "03-multi-head"

spec.register(LESSON, visible.SPECS, ref)
