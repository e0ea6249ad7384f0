"""Visible checks of lesson 10-numerics: the fill value, a robust masked softmax, a robust attention and a
log-sum-exp to fix.

Worked examples use numbers you can check by hand; the rest are properties any correct answer has (finite in
every dtype, blocked keys weigh exactly 0, fully masked rows are zeros, the scores' dtype comes back, huge
scores stay finite) and agreement with PyTorch's own ``F.scaled_dot_product_attention``, whose boolean mask has
the course's polarity and which returns zeros for a query with no allowed key. The log-sum-exp is compared with
``torch.logsumexp`` and probed: changing one row of the scores must not move any other row's result.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
)
from decoder_course.spec import Spec, run
from decoder_course.visible.l02_attention import check_weights, random_allowed, scaled_rows

# How far a weight or an output may be from float64's answer, per dtype: the rounding of that dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fill(mask_fill_value, dtype: torch.dtype) -> float | int:
    """mask_fill_value(dtype) as a Python number (a 0-d tensor is accepted)."""
    got = mask_fill_value(dtype)
    got = got.item() if isinstance(got, torch.Tensor) else got
    expect_type(got, (float, int), f"mask_fill_value({dtype})")
    return got


def check_mask_fill_value(mask_fill_value) -> None:
    """float16's value by hand (-65504), then: a finite number of each dtype, and none more negative exists."""
    with check("mask_fill_value(torch.float16) is -65504, float16's most negative finite number"):
        got = _fill(mask_fill_value, torch.float16)
        if math.isinf(got) or math.isnan(got):
            raise CheckFailed(f"got {got}: -inf turns a fully blocked row into NaN (-inf - (-inf) is NaN); "
                              "the fill must be finite")
        if got != -65504.0:
            raise CheckFailed(f"got {got}, expected -65504.0: float16's range ends at ±65504 "
                              "(-1e9 does not exist in float16, and -1e4 is not the most negative number)")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        with check(f"mask_fill_value({dtype}) is finite in {_name(dtype)} and nothing finite is below it"):
            got = _fill(mask_fill_value, dtype)
            as_dtype = torch.tensor(float(got), dtype=torch.float64).to(dtype)
            if not bool(torch.isfinite(as_dtype)):
                raise CheckFailed(f"{got} is not a finite {_name(dtype)}: it becomes {as_dtype.item()} in that "
                                  "dtype. Take the fill from the dtype you are asked about")
            if got >= 0:
                raise CheckFailed(f"got {got}: blocked keys need a very *negative* score, so exp() makes them 0")
            # doubling the most negative finite number overflows; doubling anything larger than half of it does not
            if bool(torch.isfinite(as_dtype * 2)):
                raise CheckFailed(f"{got} is finite in {_name(dtype)}, but not the most negative finite number: "
                                  f"{_name(dtype)} goes down to about {float(as_dtype * 2):.3g} and beyond")


OVERFLOW = ("The fill value does not exist in the dtype of the tensor being filled (-1e9 in float16, or float32's "
            "minimum in bfloat16/float16: inside autocast the scores are half precision even when q is float32). "
            "Take the fill from the dtype of the tensor you fill.")


def _robust_rows(rng: np.random.Generator) -> list:
    """Every dtype, fully masked rows, rows of very different scale, a broadcast (T, S) mask, no mask, and huge
    scores (a quarter of the dtype's largest number)."""
    rows = []
    for shape, mask_shape, dtype, what in [
            ((2, 3, 5, 7), (2, 1, 5, 7), "float32", "fully masked rows, rows of very different scale"),
            ((2, 2, 4, 6), (4, 6), "float16", "a (T, S) mask broadcast over B and H, a fully masked row"),
            ((3, 1, 3, 5), (3, 1, 3, 5), "bfloat16", "H=1, fully masked rows"),
            ((1, 4, 6), None, "float64", "B=1, allowed=None"),
            ((2, 6), (2, 6), "float16", "huge scores and a fully masked row"),
            ((2, 6), (2, 6), "bfloat16", "huge scores and a fully masked row")]:
        if what.startswith("huge"):
            big = torch.finfo(getattr(torch, dtype)).max / 4
            scores = rng.choice([-big, -big / 2, 0.0, big / 2, big], size=shape)
        else:
            scores = scaled_rows(rng, shape)
        allowed = None if mask_shape is None else random_allowed(rng, mask_shape)
        rows.append((f"scores {shape} in {dtype}, {what}",
                     {"scores": torch.tensor(scores).to(getattr(torch, dtype)), "allowed": allowed}))
    return rows


def _robust_weights(args: dict, got: np.ndarray, desc: str) -> None:
    check_weights(got, args["allowed"], "robust_masked_softmax(scores, allowed)", desc, sum_atol=3e-2)


SPECS = {
    "robust_masked_softmax": Spec(
        "robust_masked_softmax", _robust_rows, dtype=lambda a: a["scores"].dtype, shape=lambda a: a["scores"].shape,
        properties=_robust_weights, uses=("mask_fill_value",), tensors=True,
        on_error=lambda args, error: OVERFLOW if "without overflow" in error else "",
        shape_hint="The weights have the scores' shape.",
        hint="Expected the softmax over the allowed keys of the last axis (computed in float32 for half precision "
             "scores), returned in the scores' dtype; fill the blocked scores (masked_fill, a new tensor) with "
             "mask_fill_value of the dtype you fill, then zero the blocked weights."),
}


def check_robust_masked_softmax(robust_masked_softmax) -> None:
    """The worked example in three dtypes, the input untouched, broadcasting, no mask, huge scores."""
    allowed = torch.tensor([[True, False, True], [False, False, False]])  # (T, S): row 1 fully blocked
    e = 1.0 / (1.0 + math.e**2)  # softmax([1, 3]) = [1, e²] / (1 + e²)
    want = torch.tensor([[e, 0.0, 1.0 - e], [0.0, 0.0, 0.0]], dtype=torch.float64)  # the answer by hand
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        with check(f"worked example in {_name(dtype)}: one blocked key, one fully blocked row"):
            scores = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=dtype)  # (T, S)
            got = expect_inputs_unchanged(robust_masked_softmax, scores, allowed)
            expect_type(got, torch.Tensor, "robust_masked_softmax(scores, allowed)")
            expect_shape(got, (2, 3), "the weights", names="T, S")
            expect_dtype(got, dtype, f"the weights of {_name(dtype)} scores")
            expect_finite(got, "the weights",
                          hint="-inf at blocked keys gives NaN on a fully blocked row: fill with the most "
                               "negative finite number, then set the blocked weights to 0")
            expect_rows_sum_to_one(got, allowed, atol=TOLERANCE[dtype] * 3)
            expect_close(got, want, "the weights", atol=TOLERANCE[dtype], rtol=0,
                         hint="row 0 is softmax([1, 3]) on keys 0 and 2, row 1 is all zeros")
    with check("a (T, S) mask broadcasts over (B, H, T, S) float16 scores"):
        g = torch.Generator().manual_seed(0)
        scores = (torch.randn(2, 3, 4, 5, generator=g) * 4).half()  # (B, H, T, S)
        allowed = torch.rand(4, 5, generator=g) > 0.4  # (T, S)
        allowed[:, 0] = True
        allowed[2] = False  # query 2 sees nothing
        got = robust_masked_softmax(scores, allowed)
        expect_shape(got, (2, 3, 4, 5), "the weights", names="B, H, T, S")
        expect_dtype(got, torch.float16, "the weights")
        expect_rows_sum_to_one(got, allowed, atol=TOLERANCE[torch.float16] * 5)
    with check("allowed=None is a plain softmax over the last axis"):
        scores = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
        got = robust_masked_softmax(scores, None)
        expect_close(got, torch.softmax(scores.double(), -1), "robust_masked_softmax(scores, None)",
                     atol=1e-6, hint="with no mask nothing is blocked")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        with check(f"huge scores (a quarter of {_name(dtype)}'s largest number) stay finite"):
            big = torch.finfo(dtype).max / 4
            scores = torch.tensor([[big, -big, 0.0, big / 2], [-big, -big, -big, -big]], dtype=dtype)
            allowed = torch.tensor([[True, True, True, False], [True, True, False, False]])
            got = robust_masked_softmax(scores, allowed)
            expect_finite(got, "the weights", hint="subtract each row's max before exp (torch.softmax does), "
                                                   "and never add a bias that can overflow")
            expect_close(got, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]), "the weights",
                         atol=TOLERANCE[dtype], rtol=0, hint="row 0: the biggest allowed score takes everything; "
                                                             "row 1: two equal allowed scores share the weight")
    run(SPECS["robust_masked_softmax"], robust_masked_softmax)


def _inputs(seed: int, scale: float = 1.0, B=2, H=3, T=4, S=6, Dh=8):
    """q, k, v float32, rows of q on very different scales, and a (B, 1, T, S) mask with a fully blocked row."""
    g = torch.Generator().manual_seed(seed)
    row_scale = torch.tensor([0.1, 1.0, 3.0, 0.5])[:T, None]  # (T, 1)
    q = torch.randn(B, H, T, Dh, generator=g) * row_scale * scale
    k, v = torch.randn(B, H, S, Dh, generator=g) * scale, torch.randn(B, H, S, Dh, generator=g)
    allowed = torch.rand(B, 1, T, S, generator=g) > 0.4  # (B, 1, T, S)
    allowed[..., 0] = True
    allowed[1, 0, 1] = False  # query 1 of sequence 1 may attend to nothing
    return q, k, v, allowed


def _sdpa64(q, k, v, allowed) -> torch.Tensor:
    """PyTorch's attention in float64: the answer up to the rounding of the inputs' dtype."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=allowed)


def _pair(result, what):
    expect_type(result, tuple, what)
    if len(result) != 2:
        raise CheckFailed(f"{what} should return (out, weights), got {len(result)} values")
    return result


def check_robust_attention(robust_attention) -> None:
    """Against F.scaled_dot_product_attention in three dtypes and under autocast; float16 overflow; gradients."""
    q, k, v, allowed = _inputs(seed=1)
    dead = ~allowed.any(-1)  # (B, 1, T): fully blocked queries
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        with check(f"{_name(dtype)}: equals F.scaled_dot_product_attention; a fully blocked query gets zeros"):
            args = (q.to(dtype), k.to(dtype), v.to(dtype))
            out, weights = _pair(expect_inputs_unchanged(robust_attention, *args, allowed),
                                 "robust_attention(q, k, v, allowed)")
            expect_shape(out, (2, 3, 4, 8), "out", names="B, H, T, Dv")
            expect_shape(weights, (2, 3, 4, 6), "weights", names="B, H, T, S")
            expect_dtype(out, dtype, f"out for {_name(dtype)} inputs")
            expect_dtype(weights, dtype, f"weights for {_name(dtype)} inputs")
            expect_rows_sum_to_one(weights, allowed, atol=TOLERANCE[dtype] * 6)
            if bool(out.float()[dead.expand(2, 3, 4)].ne(0).any()):
                raise CheckFailed("a query with no allowed key must output zeros (its weights are all 0)")
            expect_close(out, _sdpa64(*args, allowed), "out", atol=TOLERANCE[dtype] * 10, rtol=0,
                         hint="scores = (q / sqrt(Dh)) @ k^T, weights = robust_masked_softmax(scores, "
                              "allowed), out = weights @ v")
    with check("float16 with large activations: q · k exceeds 65504 unless q is scaled first"):
        sign = torch.Generator().manual_seed(2)
        q16 = (torch.randint(0, 2, (2, 2, 3, 64), generator=sign) * 80.0 - 40.0).half()  # entries ±40
        k16 = (torch.randint(0, 2, (2, 2, 5, 64), generator=sign) * 80.0 - 40.0).half()
        k16[:, :, 0] = q16[:, :, 0]  # key 0 = query 0: q · k = 64 * 40 * 40 = 102400 > 65504 before any scaling
        v16 = torch.randn(2, 2, 5, 4, generator=sign).half()
        out, _ = _pair(robust_attention(q16, k16, v16, None), "robust_attention(q, k, v)")
        expect_finite(out, "out", hint="(q @ k^T) overflows float16 before the division by sqrt(Dh): "
                                       "multiply q by 1/sqrt(Dh) first, then take the product")
        expect_close(out, _sdpa64(q16, k16, v16, None), "out", atol=2e-2, rtol=0)
    for ac_dtype in (torch.bfloat16, torch.float16):
        with check(f"under torch.autocast('cpu', dtype={_name(ac_dtype)}) with float32 inputs"):
            with torch.autocast("cpu", dtype=ac_dtype):
                out, weights = _pair(robust_attention(q, k, v, allowed), "robust_attention under autocast")
            expect_finite(out, "out under autocast")
            expect_dtype(out, "float", "out under autocast")
            expect_rows_sum_to_one(weights, allowed, atol=TOLERANCE[ac_dtype] * 6)
            expect_close(out, _sdpa64(q, k, v, allowed), "out under autocast", atol=TOLERANCE[ac_dtype] * 10,
                         rtol=0, hint="inside autocast q @ k^T is half precision although q is float32: take "
                                      "the fill value from the scores' dtype (or work in float32)")
    with check("float16 gradients are finite, even through the fully blocked query"):
        q16, k16, v16 = (t.half().requires_grad_() for t in (q, k, v))
        out, _ = _pair(robust_attention(q16, k16, v16, allowed), "robust_attention(q, k, v, allowed)")
        out.float().sum().backward()
        for name, t in (("q", q16), ("k", k16), ("v", v16)):
            expect_finite(t.grad, f"the gradient of {name}",
                          hint="a -inf that reaches the softmax gives NaN gradients even when the output was "
                               "zeroed: use a finite fill")


def _logsumexp64(scores, allowed) -> torch.Tensor:
    """PyTorch's log-sum-exp in float64 over the allowed keys; a row with no allowed key is -inf there."""
    s = scores.double()
    return s.logsumexp(-1) if allowed is None else s.masked_fill(~allowed, -math.inf).logsumexp(-1)


def _expect_logsumexp(masked_logsumexp, scores, allowed, names, dtype, atol, rtol, hint=None) -> None:
    """masked_logsumexp(scores, allowed) leaves its inputs, drops the S axis, returns ``dtype``, stays finite and
    equals torch.logsumexp over the allowed keys."""
    got = expect_inputs_unchanged(masked_logsumexp, scores, allowed)
    expect_type(got, torch.Tensor, "masked_logsumexp(scores, allowed)")
    expect_shape(got, scores.shape[:-1], "masked_logsumexp(scores, allowed)", names=names)
    expect_dtype(got, dtype, f"the log-sum-exp of {_name(scores.dtype)} scores")
    expect_finite(got, "the log-sum-exp", hint="exp of a huge score overflows: subtract a max first")
    expect_close(got, _logsumexp64(scores, allowed), "the log-sum-exp", atol=atol, rtol=rtol, hint=hint)


def check_masked_logsumexp(masked_logsumexp) -> None:
    """Find the bug: PyTorch's torch.logsumexp, then the probe (one row changed, the others must not move), a fully
    blocked row, huge half precision scores, broadcasting."""
    with check("worked example: equals torch.logsumexp over the allowed keys, in float32"):
        scores = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])  # (T, S)
        allowed = torch.tensor([[True, False, True], [True, True, True]])
        _expect_logsumexp(masked_logsumexp, scores, allowed, "T", torch.float32, atol=1e-5, rtol=1e-6,
                          hint="row 0 is log(e¹ + e³), key 1 blocked; row 1 is log(e⁻¹ + e^0.5 + e⁴)")
    with check("the probe: changing only row 2 of the scores changes no other row's result"):
        g = torch.Generator().manual_seed(0)
        scores = torch.randn(4, 5, generator=g)  # (T, S): ordinary scores
        allowed = torch.ones(4, 5, dtype=torch.bool)
        before = masked_logsumexp(scores, allowed)
        moved = scores.clone()
        moved[2] += 200.0  # one query's scores, far above the others (a confident head)
        after = masked_logsumexp(moved, allowed)
        changed = (after - before).abs() > 1e-4  # (T,)
        changed[2] = False
        if bool(changed.any()):
            rows = torch.nonzero(changed).flatten().tolist()
            raise CheckFailed(
                f"rows {rows} changed when only row 2's scores changed: before {before[rows].tolist()}, after "
                f"{after[rows].tolist()}. A query's log-sum-exp depends on its own scores only; print the max "
                "your code subtracts before exp, and the terms exp(score - max) of row 0. Which max should a row "
                "subtract?")
        expect_close(after[2], _logsumexp64(moved, allowed)[2], "row 2 after the change", atol=1e-4, rtol=1e-6)
    with check("a query with no allowed key gives float32's most negative finite number, next to ordinary rows"):
        scores = torch.tensor([[0.5, -1.0, 2.0], [3.0, 1.0, 0.0], [-2.0, 0.0, 1.0]])
        allowed = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
        got = masked_logsumexp(scores, allowed)
        expect_shape(got, (3,), "masked_logsumexp(scores, allowed)", names="T")
        if not bool(torch.isfinite(got).all()):
            raise CheckFailed(f"got {got.tolist()}: the fully blocked row 1 (or another) is not finite. The fill "
                              "is finite; follow it through the code for that row: its max, then exp(score - max)")
        if float(got[1]) != torch.finfo(torch.float32).min:
            raise CheckFailed(f"row 1 has no allowed key and gave {float(got[1])}, expected float32's most "
                              f"negative finite number {torch.finfo(torch.float32).min:.4g}")
        expect_close(got[[0, 2]], _logsumexp64(scores, allowed)[[0, 2]], "rows 0 and 2", atol=1e-5, rtol=1e-6)
    with check("float16 scores up to ±30000 (exp overflows above 88.7 in float32): finite, float32, right"):
        g = torch.Generator().manual_seed(1)
        scores = (torch.randn(2, 3, 4, 6, generator=g) * 10000).clamp(-30000, 30000).half()  # (B, H, T, S)
        allowed = torch.rand(4, 6, generator=g) > 0.3  # (T, S), broadcast over B and H
        allowed[:, 0] = True
        _expect_logsumexp(masked_logsumexp, scores, allowed, "B, H, T", torch.float32, atol=1e-2, rtol=1e-6)
    with check("float64 scores, allowed=None: equals torch.logsumexp, float64 kept"):
        g = torch.Generator().manual_seed(2)
        scores = torch.randn(3, 5, generator=g, dtype=torch.float64) * torch.tensor([[1.0], [30.0], [0.1]])
        _expect_logsumexp(masked_logsumexp, scores, None, "T", torch.float64, atol=1e-10, rtol=1e-12)
