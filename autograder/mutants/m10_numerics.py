"""Wrong answers to lesson 10-numerics.

Each is written as a student would type it in the notebook, where ``math``, ``torch``, ``F``,
``mask_fill_value`` and ``robust_masked_softmax`` exist.
"""

import math

import torch

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.numerics import mask_fill_value, robust_masked_softmax

MUTANTS: list = []


# -- mask_fill_value -----------------------------------------------------------------------------------------------
@mutant(MUTANTS, "mask_fill_value", "-1e9, the tutorials' large negative number: float16 cannot hold it")
def mask_fill_value(dtype):
    return -1e9


@mutant(MUTANTS, "mask_fill_value", "-inf: a fully blocked row becomes NaN")
def mask_fill_value(dtype):  # noqa: F811 - each mutant is a separate wrong answer
    return float("-inf")


@mutant(MUTANTS, "mask_fill_value", "float32's minimum whatever the dtype")
def mask_fill_value(dtype):  # noqa: F811
    return torch.finfo(torch.float32).min


@mutant(MUTANTS, "mask_fill_value", "finfo.max: the sign forgotten")
def mask_fill_value(dtype):  # noqa: F811
    return torch.finfo(dtype).max


# -- robust_masked_softmax -----------------------------------------------------------------------------------------
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


@mutant(MUTANTS, "robust_masked_softmax", "returns float32 for half precision scores")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if allowed is not None:
        work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    weights = work.softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights


@mutant(MUTANTS, "robust_masked_softmax", "fills the half precision scores with -1e9 before upcasting")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -1e9)
    weights = scores.float().softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights.to(scores.dtype)


@mutant(MUTANTS, "robust_masked_softmax", "allowed=None not handled (~None)")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    return work.softmax(dim=-1).masked_fill(~allowed, 0.0).to(scores.dtype)


# -- robust_attention ------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "robust_attention", "scaled after the product: q @ kᵀ overflows float16")
def robust_attention(q, k, v, allowed=None):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = robust_masked_softmax(scores, allowed)
    return weights @ v, weights


@mutant(MUTANTS, "robust_attention", "fill taken from q's dtype: float32's minimum in autocast's half scores")
def robust_attention(q, k, v, allowed=None):  # noqa: F811
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(q.dtype).min)
    weights = scores.softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ v, weights


@mutant(MUTANTS, "robust_attention", "no 1/sqrt(Dh) scaling")
def robust_attention(q, k, v, allowed=None):  # noqa: F811
    weights = robust_masked_softmax(q @ k.transpose(-2, -1), allowed)
    return weights @ v, weights


@mutant(MUTANTS, "robust_attention", "computes in float32 and returns float32")
def robust_attention(q, k, v, allowed=None):  # noqa: F811
    q, k, v = q.float(), k.float(), v.float()
    weights = robust_masked_softmax((q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1), allowed)
    return weights @ v, weights


# -- masked_logsumexp (find the bug) -------------------------------------------------------------------------------
shown_bug(MUTANTS, "10-numerics", "masked_logsumexp",
          "the max of the whole tensor subtracted: rows far below it, and fully masked rows, give -inf")
patched(MUTANTS, "10-numerics", "masked_logsumexp",
        "a wrong fix: the max of each (T, S) matrix, still not each query's own",
        ("work.amax(dim=-1, keepdim=True)", "work.amax(dim=(-2, -1), keepdim=True)"))
patched(MUTANTS, "10-numerics", "masked_logsumexp",
        "a wrong fix: no max at all (float32 is wide enough?): exp overflows, fully masked rows give -inf",
        ("(top + (work - top).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)", "work.exp().sum(dim=-1).log()"))
patched(MUTANTS, "10-numerics", "masked_logsumexp",
        "a wrong fix: the whole tensor's max kept, the sum clamped away from 0: finite, and wrong",
        ("work.amax(dim=-1, keepdim=True)", "work.amax()"),
        ("keepdim=True).log()", "keepdim=True).clamp_min(1e-30).log()"))


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.reference.numerics import mask_fill_value, robust_masked_softmax  # noqa: E402, F401, F811
