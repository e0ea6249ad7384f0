"""Hidden checks of lesson 10-numerics (PyTorch): a fill value, a softmax, an attention and a log-sum-exp that stay
finite.

Every exercise is a spec (``decoder_course/visible/l10_numerics.py``): its rows, drawn here from the secret
generator, run in the kernel, in every dtype (float16, bfloat16, float32, float64); an attention row may run inside
``torch.autocast("cpu", ...)`` (the harvest's ``autocast`` step option), where ``q @ kᵀ`` is half precision
although ``q`` is float32: the trap of a fill value taken from the inputs' dtype. The spec's properties are judged
here with its public code, then the values against the reference's on the same arguments, within the dtype's
rounding; values that differ name the known mistake (``autograder/mutants/m10_numerics.py``) they match.
"""

from __future__ import annotations

from autograder.checks import spec
from autograder.reference import numerics as ref
from decoder_course.visible import l10_numerics as visible

LESSON = "10-numerics"

spec.register(LESSON, visible.SPECS, ref)
