"""Wrong answers to lesson 10-numerics.

Most are the reference with the one line a student got wrong (``patched``); the few written out are a different
body, typed as a student would in the notebook, where ``math``, ``torch``, ``F``, ``mask_fill_value`` and
``robust_masked_softmax`` exist.
"""

import math

import torch

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.numerics import mask_fill_value

LESSON = "10-numerics"
MUTANTS: list = []


# -- mask_fill_value -----------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "mask_fill_value", "-1e9, the tutorials' large negative number: float16 cannot hold it",
        ("return torch.finfo(dtype).min", "return -1e9"))
patched(MUTANTS, LESSON, "mask_fill_value", "-inf: a fully blocked row becomes NaN",
        ("return torch.finfo(dtype).min", 'return float("-inf")'))
patched(MUTANTS, LESSON, "mask_fill_value", "float32's minimum whatever the dtype",
        ("return torch.finfo(dtype).min", "return torch.finfo(torch.float32).min"))
patched(MUTANTS, LESSON, "mask_fill_value", "finfo.max: the sign forgotten",
        ("return torch.finfo(dtype).min", "return torch.finfo(dtype).max"))


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


patched(MUTANTS, LESSON, "robust_masked_softmax", "returns float32 for half precision scores",
        ("return weights.to(scores.dtype)", "return weights"))
patched(MUTANTS, LESSON, "robust_masked_softmax", "fills the half precision scores with -1e9 before upcasting",
        ("work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores", "work = scores"),
        ("mask_fill_value(work.dtype))", "-1e9)"),
        ("weights = work.softmax(dim=-1)", "weights = work.float().softmax(dim=-1)"))


@mutant(MUTANTS, "robust_masked_softmax", "allowed=None not handled (~None)")
def robust_masked_softmax(scores, allowed):  # noqa: F811
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    return work.softmax(dim=-1).masked_fill(~allowed, 0.0).to(scores.dtype)


# -- robust_attention ------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "robust_attention", "scaled after the product: q @ kᵀ overflows float16",
        ("(q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)",
         "(q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])"))


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


patched(MUTANTS, LESSON, "robust_attention", "no 1/sqrt(Dh) scaling",
        ("(q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)", "q @ k.transpose(-2, -1)"))
patched(MUTANTS, LESSON, "robust_attention", "computes in float32 and returns float32",
        ("    scores = (q * ", "    q, k, v = q.float(), k.float(), v.float()\n    scores = (q * "))


# -- masked_logsumexp (find the bug) -------------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "masked_logsumexp",
          "the max of the whole tensor subtracted: rows far below it, and fully masked rows, give -inf")
patched(MUTANTS, LESSON, "masked_logsumexp",
        "a wrong fix: the max of each (T, S) matrix, still not each query's own",
        ("work.amax(dim=-1, keepdim=True)", "work.amax(dim=(-2, -1), keepdim=True)"))
patched(MUTANTS, LESSON, "masked_logsumexp",
        "a wrong fix: no max at all (float32 is wide enough?): exp overflows, fully masked rows give -inf",
        ("(top + (work - top).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)", "work.exp().sum(dim=-1).log()"))
patched(MUTANTS, LESSON, "masked_logsumexp",
        "a wrong fix: the whole tensor's max kept, the sum clamped away from 0: finite, and wrong",
        ("work.amax(dim=-1, keepdim=True)", "work.amax()"),
        ("keepdim=True).log()", "keepdim=True).clamp_min(1e-30).log()"))


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.reference.numerics import robust_attention, robust_masked_softmax  # noqa: E402, F401, F811
