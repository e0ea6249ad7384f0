"""Visible checks of lesson 10-numerics: the fill value, a robust masked softmax and a robust attention.

Worked examples use numbers you can check by hand; the rest are properties any correct answer has (finite in
every dtype, blocked keys weigh exactly 0, fully masked rows are zeros, the scores' dtype comes back, huge
scores stay finite) and agreement with PyTorch's own ``F.scaled_dot_product_attention``, whose boolean mask has
the course's polarity and which returns zeros for a query with no allowed key.
"""

from __future__ import annotations

import math

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

HALF = (torch.float16, torch.bfloat16)
# How far a weight or an output may be from float64's answer, per dtype: the rounding of that dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_mask_fill_value(mask_fill_value) -> None:
    """float16's value by hand (-65504), then: a finite number of each dtype, and none more negative exists."""
    with check("mask_fill_value(torch.float16) is -65504, float16's most negative finite number"):
        got = mask_fill_value(torch.float16)
        if isinstance(got, torch.Tensor):
            got = got.item()
        expect_type(got, (float, int), "mask_fill_value(torch.float16)")
        if math.isinf(got) or math.isnan(got):
            raise CheckFailed(f"got {got}: -inf turns a fully blocked row into NaN (-inf - (-inf) is NaN); "
                              "the fill must be finite")
        if got != -65504.0:
            raise CheckFailed(f"got {got}, expected -65504.0: float16's range ends at ±65504 "
                              "(-1e9 does not exist in float16, and -1e4 is not the most negative number)")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        with check(f"mask_fill_value({dtype}) is finite in {_name(dtype)} and nothing finite is below it"):
            got = mask_fill_value(dtype)
            got = got.item() if isinstance(got, torch.Tensor) else got
            expect_type(got, (float, int), f"mask_fill_value({dtype})")
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


def _worked(dtype: torch.dtype):
    """scores (2, 3), allowed (2, 3) with a fully blocked row 1, and the answer by hand."""
    scores = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=dtype)
    allowed = torch.tensor([[True, False, True], [False, False, False]])
    e = 1.0 / (1.0 + math.e**2)  # softmax([1, 3]) = [1, e²] / (1 + e²)
    want = torch.tensor([[e, 0.0, 1.0 - e], [0.0, 0.0, 0.0]], dtype=torch.float64)
    return scores, allowed, want


def check_robust_masked_softmax(robust_masked_softmax) -> None:
    """The worked example in three dtypes, the input untouched, broadcasting, no mask, huge scores."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        with check(f"worked example in {_name(dtype)}: one blocked key, one fully blocked row"):
            scores, allowed, want = _worked(dtype)
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
                         atol=TOLERANCE[dtype], rtol=0,
                         hint="row 0: the biggest allowed score takes everything; row 1: two equal allowed "
                              "scores share the weight")


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
