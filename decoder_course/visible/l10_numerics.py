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
    agreeing,
    check,
    expect_close,
    expect_dtype,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
)
from decoder_course.spec import Spec, Under, options, run
from decoder_course.visible.l02_attention import check_weights, random_allowed, scaled_rows

# How far a weight or an output may be from float64's answer, per dtype: the rounding of that dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fill_rows(rng: np.random.Generator) -> list:
    """Every float dtype, float16 first: its range is where most wrong fills fail, and its message teaches most."""
    return [(f"dtype {dtype}", {"dtype": dtype}) for dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                               torch.float64)]


def _most_negative_finite(args: dict, got: float, desc: str) -> None:
    """Finite, negative, a number of the dtype asked about, and nothing finite in that dtype below it."""
    dtype, what = args["dtype"], f"mask_fill_value({args['dtype']})"
    if math.isinf(got) or math.isnan(got):
        raise CheckFailed(f"{what} returned {got} ({desc}): a row whose keys are all blocked becomes "
                          "-inf - (-inf) = NaN. The fill must be finite")
    as_dtype = torch.tensor(got, dtype=torch.float64).to(dtype)
    if not bool(torch.isfinite(as_dtype)):
        raise CheckFailed(f"{what} returned a number that {_name(dtype)} cannot hold ({desc}): it becomes "
                          f"{as_dtype.item()} there (float16 ends at ±65504, so -1e9 does not exist in float16; "
                          "bfloat16 ends just below float32's range). Take the value from the dtype you are given")
    if got >= 0:
        raise CheckFailed(f"{what} is not negative ({desc}): blocked keys need the most negative score, so that "
                          "exp() makes their weight 0")
    # doubling the most negative finite number overflows; doubling anything larger than half of it does not
    if bool(torch.isfinite(as_dtype * 2)):
        raise CheckFailed(f"{what} is finite but not {_name(dtype)}'s most negative finite number ({desc}): "
                          f"{_name(dtype)} goes down to about {float(as_dtype * 2):.3g} and beyond; torch.finfo "
                          "knows it for every dtype")


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


def _weights(got: np.ndarray, allowed: np.ndarray | None, what: str, desc: str) -> None:
    """Lesson 02's weights (finite, rows sum to one within half precision's rounding), and blocked keys weigh
    exactly 0 here: a finite fill's exp underflows to 0, and the zeroing step writes 0."""
    check_weights(got, allowed, what, desc, sum_atol=3e-2)
    if allowed is not None and (got[~np.broadcast_to(allowed, got.shape)] != 0).any():
        raise CheckFailed(f"{what}: a blocked key got a nonzero weight ({desc}). Apply the mask with True = \"this "
                          "query may attend to this key\", and make the blocked weights exactly 0")


def _robust_weights(args: dict, got: np.ndarray, desc: str) -> None:
    _weights(got, args["allowed"], "robust_masked_softmax(scores, allowed)", desc)


def _overflow(args: dict, error: str) -> str:
    """A fill PyTorch refused ("value cannot be converted ... without overflow") names its idea."""
    return OVERFLOW if "without overflow" in error else ""


def _lse_rows(rng: np.random.Generator) -> list:
    """Every dtype; rows of scores far apart (a max shared by many queries underflows the others); fully masked
    rows; half precision scores up to ±20000 (exp overflows above 88.7 in float32); a broadcast (T, S) mask, a
    causal one, none."""
    rows = []
    for shape, mask_shape, dtype, offsets, what in [
            ((2, 3, 5, 7), (2, 1, 5, 7), "float32", [0, 250, -120, 40, 0], "rows far apart, a fully masked row"),
            ((2, 3, 5, 7), None, "float32", [0, 250, -120, 40, 0], "rows far apart, allowed=None"),
            ((2, 2, 4, 6), (4, 6), "float16", [0, 20000, -20000, 5000],
             "scores up to ±20000, a (T, S) mask broadcast over B and H, a fully masked row"),
            ((3, 5), (3, 5), "bfloat16", [0, 300, -300], "rows far apart, a fully masked row"),
            ((2, 6, 6), "causal", "float32", [0, 0, 150, 0, -150, 0], "T = S = 6 with a causal mask, rows far apart"),
            ((1, 4, 6), None, "float64", [0, 1500, -1500, 0], "allowed=None, rows 1500 apart")]:
        scores = rng.standard_normal(shape) * 3 + np.asarray(offsets, np.float64)[:, None]  # (..., T, S)
        allowed = (np.tril(np.ones(shape[-2:], bool)) if mask_shape == "causal" else
                   None if mask_shape is None else random_allowed(rng, mask_shape))
        rows.append((f"scores {shape} in {dtype}, {what}",
                     {"scores": torch.tensor(scores).to(getattr(torch, dtype)), "allowed": allowed}))
    return rows


def _log_sum_exp(args: dict, got: np.ndarray, desc: str) -> None:
    """No NaN nor +inf; a query with no allowed key gives the result dtype's most negative finite number, any
    other a finite number: torch.logsumexp (float64) over its allowed keys."""
    scores, what = args["scores"].astype(np.float64), "masked_logsumexp(scores, allowed)"
    own_row = ("Each query must subtract the max of its own row of scores (amax over the last axis, keepdim=True): "
               "not one max shared by many queries (the whole tensor's, or each (T, S) matrix's), and not none.")
    if np.isnan(got).any():
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} NaN ({desc}): a fill of -inf gives -inf - "
                          f"(-inf) = NaN; the given code "
                          f"fills with mask_fill_value, which must be finite. {own_row}")
    if np.isposinf(got).any():
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} +inf ({desc}): exp of a large score "
                          f"overflowed. {own_row}")
    allowed = np.broadcast_to(True if args["allowed"] is None else args["allowed"], scores.shape)
    dead = ~allowed.any(-1)  # (..., T): queries with no allowed key
    lowest = np.finfo(got.dtype).min
    if (got[dead] != lowest).any():
        index = tuple(int(i) for i in np.argwhere(dead & (got != lowest))[0])
        raise CheckFailed(f"query {index} has no allowed key and gave {got[index]:.6g}, not {got.dtype}'s most "
                          f"negative finite number ({desc}): its filled scores minus the max it subtracts must be "
                          f"0, so that the row sums to S terms of exp(0) = 1. {own_row}")
    lost = np.isneginf(got) & ~dead
    if lost.any():
        index = tuple(int(i) for i in np.argwhere(lost)[0])
        raise CheckFailed(f"query {index} has allowed keys but gave -inf ({desc}): each of its terms exp(score - "
                          "max) underflowed to 0, because its scores are far below the max the code subtracted, so "
                          f"log(0) = -inf. A query's log-sum-exp depends on its own row only. {own_row}")
    want = torch.from_numpy(scores).masked_fill(torch.from_numpy(~allowed), -math.inf).logsumexp(-1).numpy()
    expect_close(got[~dead], want[~dead], f"{what} (vs torch.logsumexp in float64 over the allowed keys)",
                 rtol=1e-5, atol=1e-4 if got.dtype == np.float64 else 2e-3, hint=own_row)


def _attention_rows(rng: np.random.Generator) -> list:
    """Every dtype, autocast with float32 inputs, a float16 backward pass, fully masked rows (a (T, S) or
    (B, 1, T, S) mask), T > S, H = 1, no mask; and float16 entries of q and k ±40 with Dh = 64, where q·k reaches
    102400 > 65504 unless q is scaled first."""
    rows = []
    for (B, H, T, S, Dh), mask, dtype, under, what in [
            ((2, 3, 4, 6, 8), "B1TS", "float32", Under(), "fully masked rows"),
            ((1, 2, 5, 3, 4), "TS", "bfloat16", Under(), "B=1, T > S, a fully masked row"),
            ((2, 1, 3, 5, 6), None, "float64", Under(), "H=1, allowed=None"),
            ((2, 2, 3, 7, 8), "B1TS", "float32", Under(autocast="bfloat16"),
             "under torch.autocast('cpu', dtype=torch.bfloat16)"),
            ((3, 2, 4, 5, 8), "B1TS", "float32", Under(autocast="float16"),
             "under torch.autocast('cpu', dtype=torch.float16)"),
            ((2, 2, 4, 5, 8), "B1TS", "float16", Under(grad=True), "a backward pass"),
            ((2, 2, 3, 5, 64), "TS", "float16", Under(), "q and k entries ±40")]:
        if Dh == 64:  # key 0 aligned with query 0, whom every key is allowed: their product is the largest
            q, k = rng.choice([-40.0, 40.0], size=(B, H, T, Dh)), rng.choice([-40.0, 40.0], size=(B, H, S, Dh))
            k[..., 0, :] = q[..., 0, :]
        else:
            q, k = scaled_rows(rng, (B, H, T, Dh), scales=(0.1, 1.0, 2.0)), rng.standard_normal((B, H, S, Dh))
        allowed = None if mask is None else random_allowed(rng, (T, S) if mask == "TS" else (B, 1, T, S))
        tensors = {n: torch.tensor(x).to(getattr(torch, dtype)) for n, x in
                   (("q", q), ("k", k), ("v", rng.standard_normal((B, H, S, Dh))))}
        rows.append((f"(B, H, T, S, Dh) = {(B, H, T, S, Dh)} in {dtype}, {what}",
                     {**tensors, "allowed": allowed, "under": under}))
    return rows


def _precision(args: dict) -> torch.dtype:
    """The dtype a row computes in: autocast's, else q's (float32 values that all fit bfloat16 were bfloat16: NumPy
    has none, so they come widened)."""
    q = args["q"]
    if options(args).autocast:
        return getattr(torch, options(args).autocast)
    if q.dtype == np.float32 and not (q.view(np.uint32) & 0xFFFF).any():
        return torch.bfloat16
    return torch.from_numpy(q[:0]).dtype


def _attention(args: dict, got: list, desc: str) -> None:
    """Finite (what breaks it: the overflow of q @ kᵀ, a fill of the wrong dtype, -inf), the weights of lesson 02
    (blocked keys exactly 0, fully masked rows zeros), zeros out of a query with no allowed key, and PyTorch's
    F.scaled_dot_product_attention in float64 (zeros for such a query too) within the dtype's rounding."""
    out, weights = got
    work = _precision(args)
    dead = ~np.broadcast_to(True if args["allowed"] is None else args["allowed"], weights.shape).any(-1)  # (..., T)
    broken = ~(np.isfinite(out).all(-1) & np.isfinite(weights).all(-1))  # (..., T): rows with NaN or inf
    if broken.any():
        hint = ("inside autocast the scores are half precision although q is float32: take the fill from the "
                "scores' dtype, or work on a float32 copy" if options(args).autocast else
                "only in rows with no allowed key: a fill of -inf gives -inf - (-inf) = NaN there; use "
                "robust_masked_softmax, whose fill is finite" if not (broken & ~dead).any() else
                "in rows that have allowed keys: q @ kᵀ overflows float16 (65504) before the division by √Dh; "
                "scale q first")
        raise CheckFailed(f"robust_attention returned NaN or inf ({desc}), {hint}")
    _weights(weights, args["allowed"], "robust_attention's weights", desc)
    if dead.any() and np.abs(out[dead]).max() > 0:
        raise CheckFailed(f"robust_attention: a query with no allowed key must output zeros ({desc})")
    q, k, v = (torch.from_numpy(args[n].astype(np.float64)) for n in ("q", "k", "v"))
    mask = None if args["allowed"] is None else torch.from_numpy(args["allowed"])
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()  # (..., T, Dv)
    expect_close(out, want, "robust_attention's out (vs PyTorch's F.scaled_dot_product_attention in float64)",
                 rtol=0, atol=max(10 * TOLERANCE[work], 2e-5),
                 hint="scores = (q / √Dh) @ kᵀ over the last two axes (divided by the square root of the head width "
                      "Dh = q.shape[-1]), weights = robust_masked_softmax(scores, allowed), out = weights @ v")


SPECS = {
    "mask_fill_value": Spec(
        "mask_fill_value", _fill_rows, dtype=lambda a: float, shape=lambda a: (), scalar=True, rtol=0.0, atol=0.0,
        properties=_most_negative_finite, hint="torch.finfo(dtype) knows the most negative finite number."),
    "robust_masked_softmax": Spec(
        "robust_masked_softmax", _robust_rows, dtype=lambda a: a["scores"].dtype, shape=lambda a: a["scores"].shape,
        properties=_robust_weights, uses=("mask_fill_value",), tensors=True,
        on_error=_overflow,
        shape_hint="The weights have the scores' shape.",
        hint="Expected the softmax over the allowed keys of the last axis (computed in float32 for half precision "
             "scores), returned in the scores' dtype; fill the blocked scores (masked_fill, a new tensor) with "
             "mask_fill_value of the dtype you fill, then zero the blocked weights."),
    "robust_attention": Spec(
        "robust_attention", _attention_rows, outputs=("out", "weights"), order=("weights", "out"),
        # under autocast: the autocast dtype its products give, or the inputs' dtype kept
        dtype=lambda a: (getattr(torch, options(a).autocast), a["q"].dtype) if options(a).autocast else a["q"].dtype,
        shape=lambda a: ((*np.broadcast_shapes(a["q"].shape[:-2], a["k"].shape[:-2]), a["q"].shape[-2],
                          a["v"].shape[-1]),
                         (*np.broadcast_shapes(a["q"].shape[:-2], a["k"].shape[:-2]), a["q"].shape[-2],
                          a["k"].shape[-2])),
        axes=("B, H, T, Dv", "B, H, T, S"), properties=_attention, tensors=True, on_error=_overflow,
        uses=("mask_fill_value", "robust_masked_softmax"), forbidden=("F.scaled_dot_product_attention",),
        rtol=1e-5, atol=2e-5,
        grad_hint="A -inf (or an overflow) inside the softmax poisons the backward pass even when the output was "
                  "zeroed afterwards: use a finite fill.",
        hint="scores = (q / √Dh) @ kᵀ, weights = robust_masked_softmax(scores, allowed), out = weights @ v, in the "
             "inputs' dtype."),
    "masked_logsumexp": Spec(
        "masked_logsumexp", _lse_rows, shape=lambda a: a["scores"].shape[:-1], properties=_log_sum_exp,
        dtype=lambda a: a["scores"].dtype if a["scores"].dtype == torch.float64 else torch.float32,
        uses=("mask_fill_value",), tensors=True, on_error=_overflow, rtol=1e-5, atol=1e-4,
        shape_hint="One number per query: the last axis (S) is summed away.",
        hint="Subtract each query's own largest score (the max over the last axis, keepdim=True) before exp; the "
             "result is float32 for float16, bfloat16 and float32 scores, float64 for float64 ones."),
}


def check_mask_fill_value(mask_fill_value) -> None:
    """Every dtype, float16 first: finite, negative, and nothing finite in that dtype below it."""
    run(SPECS["mask_fill_value"], mask_fill_value)


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


def check_robust_attention(robust_attention) -> None:
    """Against F.scaled_dot_product_attention in every dtype and under autocast; float16 overflow; gradients."""
    run(SPECS["robust_attention"], robust_attention)


def check_masked_logsumexp(masked_logsumexp) -> None:
    """Find the bug: torch.logsumexp over the allowed keys on rows far apart, fully masked rows, huge half
    precision scores, every dtype."""
    run(SPECS["masked_logsumexp"], masked_logsumexp)
