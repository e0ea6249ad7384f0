"""Reference for lesson 10-numerics (PyTorch): masked attention that stays finite in half precision, autocast.

Three ways to block a score, and what each does to a query row whose keys are *all* blocked:

=================  ===========================================  ==============================================
fill               float32                                      float16 / bfloat16
=================  ===========================================  ==============================================
``-inf``           NaN (``exp(-inf - (-inf))``)                 NaN
``-1e9``           silent uniform average over blocked keys     float16 cannot hold it (max 65504): a
                                                                bias rounds to ``-inf`` and gives NaN, and
                                                                ``masked_fill`` refuses it; bfloat16 has
                                                                float32's range: a silent uniform average
``finfo.min``      uniform average (finite), then zeroed        finite in every dtype
=================  ===========================================  ==============================================

The robust recipe: fill with ``torch.finfo(dtype).min`` (finite, and ``exp(min - max)`` underflows to exactly
0), take the softmax in float32 when the input is half precision (its sums lose fewer bits), then set blocked
weights to 0, which turns a fully blocked row into zeros, the course's convention.

``masked_logsumexp`` is a find-the-bug exercise (autograder.course.bugs): given code built on the student's
``mask_fill_value``, with one mistake in the max it subtracts before ``exp``.
"""

import math

import torch


def naive_masked_softmax(scores: torch.Tensor, allowed: torch.Tensor, fill: float) -> torch.Tensor:
    """The naive recipe, to watch it fail: add a bias of ``fill`` at blocked keys, softmax in the input dtype.

    The bias is built in float32 and cast to the scores' dtype, as mixed-precision code often does: in float16
    ``-1e9`` becomes ``-inf`` on the way.

    Shape:
        scores: (..., T, S), allowed: bool broadcastable to scores -> weights: (..., T, S), scores' dtype
    """
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=scores.device)  # float32: holds -1e9
    bias = bias.masked_fill(~allowed, fill)
    return (scores + bias.to(scores.dtype)).softmax(dim=-1)  # the cast rounds -1e9 to -inf in float16


def mask_fill_value(dtype: torch.dtype) -> float:
    """The score to put at blocked keys: the most negative finite number of ``dtype``.

    Shape:
        a dtype -> a Python float (-65504.0 for float16, about -3.4e38 for float32 and bfloat16)
    """
    ### BEGIN SOLUTION
    # finite in this dtype (unlike -inf, or -1e9 in float16), and exp(min - max) underflows to exactly 0
    return torch.finfo(dtype).min
    ### END SOLUTION


def robust_masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the allowed keys, never NaN: blocked keys weigh exactly 0, fully blocked rows give zeros; huge
    scores stay finite.

    The caller's ``scores`` are unchanged (``masked_fill``, not ``masked_fill_``).

    Computed in float32 when ``scores`` are float16 or bfloat16; the result has the dtype of ``scores``.

    Shape:
        scores: (..., T, S), allowed: bool broadcastable to scores, or None -> weights: (..., T, S)
    """
    ### BEGIN SOLUTION
    # half precision keeps ~3 significant digits (bfloat16 ~2): exponentials and sums are done in float32
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if allowed is not None:
        # finite fill in the working dtype: a fully blocked row becomes a row of equal finite numbers, not NaN
        work = work.masked_fill(~allowed, mask_fill_value(work.dtype))
    # softmax subtracts each row's max first, so huge scores cannot overflow exp
    weights = work.softmax(dim=-1)  # (..., T, S)
    if allowed is not None:
        # blocked keys already weigh 0 in a row with an allowed key; a fully blocked row came out uniform:
        # zero it. (This would also wipe the NaN row of a -inf fill, but the NaN would exist before it, and
        # code that adds the mask as a bias, or a fused kernel, never gets this second chance.)
        weights = weights.masked_fill(~allowed, 0.0)
    return weights.to(scores.dtype)
    ### END SOLUTION


def robust_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention that is NaN-free in float16, bfloat16 and under ``torch.autocast``.

    Float16 gradients stay finite when a row is fully blocked (a finite fill, never -inf); the caller's inputs are
    unchanged. Written by hand: ``F.scaled_dot_product_attention`` is what it is compared with, not to be used (the
    checks refuse it).

    A blocked key weighs exactly 0; a fully blocked query row gets zero weights and a zero output, as
    ``F.scaled_dot_product_attention`` gives in recent PyTorch; every other row agrees with it too. ``out`` and
    ``weights`` keep the inputs' dtype, and ``q`` is scaled by ``1/sqrt(Dh)`` *before* the product (in float16,
    ``q @ kᵀ`` can exceed 65504 first).

    Shape:
        q: (..., T, Dh), k: (..., S, Dh), v: (..., S, Dv), allowed: bool broadcastable to (..., T, S) or None
        -> out: (..., T, Dv), weights: (..., T, S)
    """
    ### BEGIN SOLUTION
    # scale q before the product, not the scores after: in float16 q @ k^T can overflow 65504 before dividing
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (..., T, S)
    weights = robust_masked_softmax(scores, allowed)  # (..., T, S), the scores' dtype
    return weights @ v, weights  # (..., T, Dv), (..., T, S)
    ### END SOLUTION


def masked_logsumexp(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The log of each query's softmax denominator, ``log Σ exp(score)`` over its allowed keys (find the bug).

    Attention kernels keep it per query (the backward pass and the merging of key blocks need it), and a
    cross-entropy loss subtracts it from the target's score. Each query's value depends on its own row of
    ``scores`` only, and is right whatever the scale of the other rows. Worked in float32 for float16 or
    bfloat16 scores (the result stays float32: a log-sum-exp can exceed float16's range), else in the scores'
    dtype. A blocked key adds nothing; a query with no allowed key gives the most negative finite number of the
    result's dtype (the log of an empty sum, kept finite). ``allowed`` broadcasts to ``scores``; None: every key
    is allowed. ``scores`` is unchanged.

    Shape:
        scores: (..., T, S), allowed: bool broadcastable to scores or None -> (..., T), float32 or float64
    """
    work = scores.to(torch.promote_types(scores.dtype, torch.float32))  # float32 for half scores, float64 kept
    if allowed is not None:
        work = torch.where(allowed, work, mask_fill_value(work.dtype))  # a blocked key: exp(min - max) = 0
    ### BEGIN SOLUTION
    top = work.amax(dim=-1, keepdim=True)  # (..., T, 1): each query's own largest score
    ### END SOLUTION
    ### BEGIN BUG
    # top = work.amax()  # the largest score
    ### END BUG
    # every exp(work - top) is at most 1, so nothing overflows; the row's own largest term is exp(0) = 1
    return (top + (work - top).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)  # (..., T)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.
MISTAKES = [
    ("mask_fill_value", "-1e9, the tutorials' large negative number: float16 cannot hold it",
     ("return torch.finfo(dtype).min", "return -1e9")),
    ("mask_fill_value", "-inf: a fully blocked row becomes NaN",
     ("return torch.finfo(dtype).min", 'return float("-inf")')),
    ("mask_fill_value", "float32's minimum whatever the dtype",
     ("return torch.finfo(dtype).min", "return torch.finfo(torch.float32).min")),
    ("mask_fill_value", "finfo.max: the sign forgotten",
     ("return torch.finfo(dtype).min", "return torch.finfo(dtype).max")),
    ("robust_masked_softmax", "returns float32 for half precision scores",
     ("return weights.to(scores.dtype)", "return weights")),
    ("robust_masked_softmax", "fills the half precision scores with -1e9 before upcasting",
     ("work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores", "work = scores"),
     ("mask_fill_value(work.dtype))", "-1e9)"),
     ("weights = work.softmax(dim=-1)", "weights = work.float().softmax(dim=-1)")),
    ("robust_attention", "scaled after the product: q @ kᵀ overflows float16",
     ("(q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)",
      "(q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])")),
    ("robust_attention", "no 1/sqrt(Dh) scaling",
     ("(q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)", "q @ k.transpose(-2, -1)")),
    ("robust_attention", "computes in float32 and returns float32",
     ("    scores = (q * ", "    q, k, v = q.float(), k.float(), v.float()\n    scores = (q * ")),
    ("masked_logsumexp",
     "the max of the whole tensor subtracted: rows far below it, and fully masked rows, give -inf"),
    ("masked_logsumexp",
     "a wrong fix: the max of each (T, S) matrix, still not each query's own",
     ("work.amax(dim=-1, keepdim=True)", "work.amax(dim=(-2, -1), keepdim=True)")),
    ("masked_logsumexp",
     "a wrong fix: no max at all (float32 is wide enough?): exp overflows, fully masked rows give -inf",
     ("(top + (work - top).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)", "work.exp().sum(dim=-1).log()")),
    ("masked_logsumexp",
     "a wrong fix: the whole tensor's max kept, the sum clamped away from 0: finite, and wrong",
     ("work.amax(dim=-1, keepdim=True)", "work.amax()"),
     ("keepdim=True).log()", "keepdim=True).clamp_min(1e-30).log()")),
]
