"""Whole wrong answers to lesson 10-numerics (the patches of the reference are its ``MISTAKES``): a different body,
typed as a student would in the notebook, where ``math``, ``torch``, ``F``, ``mask_fill_value`` and
``robust_masked_softmax`` exist.
"""

import math

import torch

from autograder.course.mutants import mutant
from autograder.course.reference.numerics import mask_fill_value

MUTANTS: list = []


# -- robust_masked_softmax -----------------------------------------------------------------------------------------
# Without the zeroing step (a whole step missing, not a changed line): written out.
@mutant(MUTANTS, "robust_masked_softmax", "-inf fill and no zeroing: fully blocked rows are NaN")
def robust_masked_softmax(scores, allowed):
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if allowed is not None:
        work = work.masked_fill(~allowed, float("-inf"))
    return work.softmax(dim=-1).to(scores.dtype)


@mutant(MUTANTS, "robust_masked_softmax", "finite fill but no zeroing: fully blocked rows are uniform")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if allowed is not None:
        work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    return work.softmax(dim=-1).to(scores.dtype)


@mutant(MUTANTS, "robust_masked_softmax", "allowed=None not handled (~None)")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    return work.softmax(dim=-1).masked_fill(~allowed, 0.0).to(scores.dtype)


# its own softmax, with the fill of q's dtype (a different body, not a changed line): written out
@mutant(MUTANTS, "robust_attention", "fill taken from q's dtype: float32's minimum in autocast's half scores")
def robust_attention(q, k, v, allowed=None):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(q.dtype).min)
    weights = scores.softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ v, weights


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.course.reference.numerics import robust_attention, robust_masked_softmax  # noqa: E402, F401, F811
