"""Visible checks of lesson 02-attention: softmax, masked softmax, scaled dot-product attention.

Worked examples use numbers you can check by hand (e^0, e^1, e^2 normalised); the rest are properties any
correct answer has: rows sum to one, blocked keys get nothing, a fully masked row is zeros, huge scores stay
finite, the future and the padding do not leak, and the caller's arrays are not modified. ``softmax`` and
``masked_softmax`` are specs (:mod:`decoder_course.spec`): their rows and properties below drive the hidden checks
too, on secret draws.
"""

import numpy as np

from decoder_course.checks import (
    CheckFailed,
    agreeing,
    check,
    expect_close,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
)
from decoder_course.spec import Keyword, Perturbed, Spec, run

# softmax([1, 2, 3]) = [e^0, e^1, e^2] / (e^0 + e^1 + e^2), by hand
SOFTMAX_123 = np.array([0.09003057317038046, 0.24472847105479767, 0.6652409557748219])
ATOL = 1e-6  # a weight this small counts as zero (blocked keys, fully masked rows)


def scaled_rows(rng: np.random.Generator, shape: tuple[int, ...], scales=(0.01, 1.0, 30.0)) -> np.ndarray:
    """Normal values whose rows (last axis) differ in scale: one global max would underflow some rows."""
    row_scale = rng.choice(scales, size=shape[:-1] + (1,))
    row_scale.reshape(-1)[: len(scales)] = scales  # every scale appears at least once
    return rng.standard_normal(shape) * row_scale


def random_allowed(rng: np.random.Generator, shape: tuple[int, ...], p: float = 0.6) -> np.ndarray:
    """A random mask with a fully allowed first row and a fully masked last row (when it has two rows)."""
    allowed = rng.random(shape) < p
    rows = allowed.reshape(-1, shape[-1])  # a view: (rows, S)
    rows[0] = True
    if rows.shape[0] > 1:
        rows[-1] = False
    return allowed


def check_weights(w: np.ndarray, allowed: np.ndarray | None, what: str, desc: str, sum_atol: float = 1e-4) -> None:
    """Finite, blocked keys get no weight, a fully masked row is all zeros, every other row sums to one (within
    ``sum_atol``: half precision weights round)."""
    w = np.asarray(w, dtype=np.float64)
    full = np.broadcast_to(True if allowed is None else allowed, w.shape)  # (..., T, S)
    has_key = full.any(axis=-1)  # (..., T)
    if not np.isfinite(w).all():
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} NaN or inf ({desc}). A fully masked row filled "
                          f"with -inf gives "
                          "exp(-inf - (-inf)) = NaN, and exp overflows on huge scores: give a row with no allowed "
                          "key zeros, and subtract each row's max before exp.")
    if (w < -ATOL).any():
        raise CheckFailed(f"{agreeing(what, 'has', 'have')} negative weights ({desc}): softmax outputs are "
                          f"probabilities.")
    empty_rows = w[~has_key]  # (rows, S)
    if empty_rows.size and np.allclose(empty_rows, 1.0 / w.shape[-1], atol=1e-4):
        raise CheckFailed(f"a fully masked row of {what} came out as a uniform average, 1/S on every key ({desc}): "
                          "that is what a large negative fill alone gives. The course's rule: a query with no "
                          "allowed key gets weights of exactly zero.")
    if (~full & has_key[..., None] & (np.abs(w) > ATOL)).any():
        raise CheckFailed(f"{what} gives weight to a blocked key ({desc}): mask the scores before the softmax, with "
                          "the course's polarity (True = this query may attend to this key).")
    if empty_rows.size and np.abs(empty_rows).max() > ATOL:
        raise CheckFailed(f"a fully masked row of {what} is not all zeros ({desc}): a query with no allowed key "
                          "gets weights of exactly zero.")
    sums = w.sum(axis=-1)[has_key]
    if sums.size and not np.allclose(sums, 1.0, atol=sum_atol):
        raise CheckFailed(f"a row of {what} with allowed keys does not sum to 1 ({desc}). Zeroing blocked weights "
                          "after a plain softmax leaves the rest summing to less than one: mask the scores first, "
                          "then normalise over the keys (the last axis).")


def _softmax_rows(rng: np.random.Generator) -> list:
    rows = []
    # (shape, dtype, axis or None for the default, how axis is passed, huge scores)
    for shape, dtype, axis, how, huge in [
            ((3, 7), "float64", None, None, False), ((2, 3, 4, 5), "float32", None, None, False),
            ((4, 6), "float64", 0, "by name", False), ((2, 5, 3), "float32", 1, "by position", False),
            ((3, 6), "float32", -1, "by name", True), ((1, 9), "float64", None, None, True)]:
        if huge:
            x = rng.standard_normal(shape) * 1e4
            x[0] = 1e4  # a row of equal huge scores: exactly uniform
            x[-1] = 5e4 + rng.integers(0, 8, size=shape[-1])  # huge and close together
        else:
            x = scaled_rows(rng, shape, scales=(0.01, 1.0, 1e3))  # exp(1e3) overflows even float64
        args = {"x": x.astype(dtype)}
        if how is not None:
            args["axis"] = Keyword(axis) if how == "by name" else axis
        rows.append((f"x of shape {shape}, {dtype}, " + ("huge scores" if huge else "rows of very different scale")
                     + (f", axis={axis} passed {how}" if how else " (default axis)"), args))
    return rows


def _softmax_properties(args: dict, got: np.ndarray, desc: str) -> None:
    axis = args.get("axis", -1)
    if not np.isfinite(got).all():
        raise CheckFailed(f"softmax(x) contains NaN or inf ({desc}). exp overflows for large scores (exp(1000) = "
                          "inf, and inf / inf = NaN), and a max that is not the row's own underflows whole rows to "
                          "0 / 0. Subtract each row's own max (along `axis`) before exp.")
    if not np.allclose(got.astype(np.float64).sum(axis=axis), 1.0, atol=1e-4):
        raise CheckFailed(f"softmax(x) does not sum to 1 along axis {axis} ({desc}): normalise along the axis you "
                          "are given, and keep that axis when summing (keepdims=True) so the division broadcasts.")


def _masked_softmax_rows(rng: np.random.Generator) -> list:
    B, H, T, S = 2, 3, 4, 5
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T)
    key_is_real = np.array([[True] * S, [True, True, False, False, False]])  # (B, S)
    return [(desc, {"scores": scores, "allowed": allowed}) for desc, scores, allowed in [
        (f"scores (B, H, T, S) = {(B, H, T, S)}, allowed (B, 1, T, S) with a fully masked row",
         scaled_rows(rng, (B, H, T, S)), random_allowed(rng, (B, 1, T, S))),
        ("scores (T, S) = (5, 3), float32, allowed (T, S) with a fully masked row",
         scaled_rows(rng, (5, 3)).astype(np.float32), random_allowed(rng, (5, 3))),
        (f"scores (B, H, T, S) = {(B, 2, 3, S)}, key padding allowed (B, 1, 1, S)",
         scaled_rows(rng, (B, 2, 3, S)), key_is_real[:, None, None, :]),
        (f"scores (B, H, T, S) = (1, 2, {T}, {T}), a causal (T, S) mask broadcast over B and H",
         scaled_rows(rng, (1, 2, T, T)), causal),
        ("scores (B, T, S) = (3, 4, 6), float32, allowed=None (every key allowed)",
         scaled_rows(rng, (3, 4, 6)).astype(np.float32), None),
        ("huge scores (B, H, T, S) = (2, 1, 3, 7), float32, allowed (B, H, T, S), a fully masked row",
         (rng.standard_normal((2, 1, 3, 7)) * 1e4).astype(np.float32), random_allowed(rng, (2, 1, 3, 7))),
    ]]


SPECS = {
    "softmax": Spec(
        "softmax", _softmax_rows, dtype=lambda a: "float", shape=lambda a: a["x"].shape,
        properties=_softmax_properties, rtol=1e-4, atol=1e-5,
        hint="softmax(x) = exp(x - max) / sum(exp(x - max)), max and sum taken along `axis`."),
    "masked_softmax": Spec(
        "masked_softmax", _masked_softmax_rows, dtype=lambda a: "float", shape=lambda a: a["scores"].shape,
        uses=("softmax",), rtol=1e-4, atol=1e-5,
        properties=lambda a, got, desc: check_weights(got, a["allowed"], "masked_softmax(scores, allowed)", desc),
        hint="Over the allowed keys of each row it is the softmax of their scores."),
}


# -- scaled_dot_product_attention: rows of every layout, two probes ------------------------------------------------
def _attention_rows(rng: np.random.Generator) -> list:
    """Batched heads, no batch axes at all, key padding (the padded keys changed), causal self-attention (the future
    changed), huge float64 scores, one head with a (T, S) mask; fully masked rows where a mask is random."""
    def normal(*shapes, dtype=np.float64):
        return [rng.standard_normal(shape).astype(dtype) for shape in shapes]

    def row(desc, q, k, v, allowed, probe=None):
        args = {"q": q, "k": k, "v": v} | ({} if allowed is None else {"allowed": allowed})
        return (desc, args) if probe is None else (desc, args, probe(args))

    def padded_changed(args):  # other keys and values at the padded positions: no output may move
        k2, v2, pad = args["k"].copy(), args["v"].copy(), ~args["allowed"][:, 0, :]  # (B, S)
        k2[pad] += 5.0 * rng.standard_normal(k2[pad].shape)
        v2[pad] += 5.0 * rng.standard_normal(v2[pad].shape)
        return Perturbed(args | {"k": k2, "v": v2}, lambda out: out, "changing the keys and values at padded "
                         "positions changed the output: padded keys leak into real queries. Apply `allowed` to the "
                         "scores before the softmax (True = may attend).")

    def future_changed(args):  # the same x after position t0 only: no output at or before t0 may move
        t0, x2 = int(rng.integers(1, args["q"].shape[-2] - 2)), args["q"].copy()
        x2[..., t0 + 1:, :] += 3.0 * rng.standard_normal(x2[..., t0 + 1:, :].shape)
        return Perturbed(args | {"q": x2, "k": x2, "v": x2}, lambda out, t0=t0: out[..., :t0 + 1, :],
                         f"in causal self-attention an output at a position <= {t0} changed when only positions "
                         f"after {t0} changed: the future leaks. Apply `allowed` to the scores before the softmax "
                         "(True = may attend).")

    B, H, T, S, Dh, Dv = 2, 3, 4, 5, 8, 6
    (x,) = normal((2, 2, 6, 4))
    return [
        row(f"(B, H, T, S, Dh, Dv) = {(B, H, T, S, Dh, Dv)}, allowed (B, 1, T, S) with a fully masked row",
            scaled_rows(rng, (B, H, T, Dh), scales=(0.1, 1.0, 3.0)), *normal((B, H, S, Dh), (B, H, S, Dv)),
            random_allowed(rng, (B, 1, T, S))),
        row("q (T, Dh) = (3, 6), k (S, Dh) = (5, 6), v (S, Dv) = (5, 2), float32, allowed=None",
            *normal((3, 6), (5, 6), (5, 2), dtype=np.float32), None),
        row("(B, T, S, Dh, Dv) = (2, 4, 6, 3, 5) without heads, key padding (B, 1, S), the padded keys changed",
            *normal((2, 4, 3), (2, 6, 3), (2, 6, 5)), np.array([[True] * 6, [True] * 3 + [False] * 3])[:, None, :],
            padded_changed),
        row("causal self-attention, q = k = v of shape (B, H, T, Dh) = (2, 2, 6, 4), the future changed", x, x, x,
            np.tril(np.ones((6, 6), dtype=bool)), future_changed),
        row("huge scores, (B, H, T, S, Dh, Dv) = (1, 2, 3, 5, 4, 4), a fully masked row",
            rng.standard_normal((1, 2, 3, 4)) * 1e3, rng.standard_normal((1, 2, 5, 4)) * 1e2,
            rng.standard_normal((1, 2, 5, 4)), random_allowed(rng, (1, 2, 3, 5))),
        row("(B, H, T, S, Dh, Dv) = (2, 1, 5, 3, 2, 4), float32, allowed (T, S)",
            *normal((2, 1, 5, 2), (2, 1, 3, 2), (2, 1, 3, 4), dtype=np.float32), random_allowed(rng, (5, 3))),
    ]


def _attention_shape(a: dict) -> tuple:
    lead = np.broadcast_shapes(a["q"].shape[:-2], a["k"].shape[:-2])
    return lead + (a["q"].shape[-2], a["v"].shape[-1]), lead + (a["q"].shape[-2], a["k"].shape[-2])  # out, weights


def _swapped(a: dict, shape: tuple) -> str:
    out, weights = _attention_shape(a)
    return "The outputs come in the wrong order: return `out, weights`, the output first." if shape == weights \
        and out != weights else ""


def _attention_properties(a: dict, got: list, desc: str) -> None:
    """The weights are masked_softmax's (finite, blocked keys 0, rows summing to one); a query with no key outputs 0."""
    out, weights = got
    check_weights(weights, a.get("allowed"), "the attention weights", desc)
    if a.get("allowed") is not None:
        has_key = np.broadcast_to(a["allowed"], weights.shape).any(axis=-1)  # (..., T)
        if np.abs(out[~has_key]).max(initial=0.0) > ATOL:
            raise CheckFailed(f"a query with no allowed key should output zeros ({desc}): its weights are zero, so "
                              "its weighted average of the values is zero.")


def _matmul_error(args: dict, error: str) -> str:
    if "matmul" in error and args["k"].ndim > 2:
        return ("k.T reverses every axis of a batched k: swap only its last two, k.swapaxes(-1, -2), so that "
                "q (..., T, Dh) @ kᵀ (..., Dh, S) gives the scores (..., T, S).")
    return ""


SPECS["scaled_dot_product_attention"] = Spec(
    "scaled_dot_product_attention", _attention_rows, dtype=lambda a: "float", shape=_attention_shape,
    outputs=("out", "weights"), order=("weights", "out"), on_error=_matmul_error,
    shape_hint=(_swapped, "One score per query and key: q · kᵀ with k's last two axes swapped."),
    properties=_attention_properties, uses=("masked_softmax", "softmax"), rtol=1e-4, atol=1e-5,
    hint={"weights": "weights = masked_softmax(q · kᵀ / sqrt(Dh), allowed), with Dh = q.shape[-1] and k's last two "
                     "axes swapped.",
          "out": "Your weights are right: out = weights @ v."})


def check_softmax(softmax) -> None:
    """Worked example, huge scores, rows of very different scale, the axis argument, the caller's array."""
    with check("softmax([1, 2, 3]) matches the worked example"):
        got = softmax(np.array([1.0, 2.0, 3.0]))
        expect_type(got, np.ndarray, "softmax([1, 2, 3])")
        expect_close(got, SOFTMAX_123, "softmax([1, 2, 3])",
                     hint="softmax(x)_i = exp(x_i) / sum_j exp(x_j)")
    with check("huge scores: softmax([1001, 1002, 1003]) is finite and equals softmax([1, 2, 3])"):
        got = softmax(np.array([1001.0, 1002.0, 1003.0]))
        expect_finite(got, "softmax([1001, 1002, 1003])",
                      hint="exp(1001) overflows to inf and inf / inf is NaN: subtract the max first, which "
                           "does not change the softmax")
        expect_close(got, SOFTMAX_123, "softmax([1001, 1002, 1003])",
                     hint="adding a constant to every score does not change the softmax")
    with check("rows 1 and 2 of x differ by a constant: their softmax is the same"):
        x = np.array([[0.001, 0.002, 0.003, 0.004], [1.0, 2.0, 3.0, 4.0], [1000.0, 1001.0, 1002.0, 1003.0]])
        got = softmax(x)
        expect_shape(got, (3, 4), "softmax(x)", names="T, S")
        expect_finite(got, "softmax(x)",
                      hint="a row turned to 0 / 0: subtract each row's own max (keepdims=True), not one "
                           "global max")
        expect_close(got[1], got[2], "rows 1 and 2 of softmax(x)",
                     hint="rows 1 and 2 differ by a constant, so their softmax is the same")
    run(SPECS["softmax"], softmax)


def check_masked_softmax(masked_softmax) -> None:
    """Worked example with a blocked key and a fully masked row, broadcasting, None, huge scores."""
    with check("masked_softmax on the worked example (a blocked key, a fully masked row)"):
        scores = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])  # (T, S) = (3, 3)
        allowed = np.array([[True, True, True], [True, False, True], [False, False, False]])
        got = expect_inputs_unchanged(masked_softmax, scores, allowed)
        expect_type(got, np.ndarray, "masked_softmax(scores, allowed)")
        expect_shape(got, (3, 3), "masked_softmax(scores, allowed)", names="T, S")
        expect_finite(got, "masked_softmax(scores, allowed)",
                      hint="row 2 has no allowed key: a -inf fill gives exp(-inf - (-inf)) = NaN there")
        w = np.asarray(got, dtype=np.float64)
        if w[1, 1] != 0:
            raise AssertionError(f"key 1 is blocked for query 1 (allowed[1, 1] is False) but got weight "
                                 f"{w[1, 1]:.4g}: mask the scores before the softmax, with True = may attend")
        if not np.isclose(w[1].sum(), 1.0, atol=1e-6):
            raise AssertionError(f"row 1 sums to {w[1].sum():.4g}, not 1. Zeroing blocked weights after a "
                                 "plain softmax leaves the others short: mask the scores first, then "
                                 "normalise")
        expect_rows_sum_to_one(got, allowed, what="masked_softmax(scores, allowed)")
        # row 1: the softmax of the allowed scores [1, 3] only
        e1, e3 = np.exp(1.0 - 3.0), 1.0
        want = np.array([SOFTMAX_123, [e1 / (e1 + e3), 0.0, e3 / (e1 + e3)], [0.0, 0.0, 0.0]])
        expect_close(got, want, "masked_softmax(scores, allowed)",
                     hint="each row is the softmax over its allowed keys only; blocked keys and fully "
                          "masked rows get exactly 0")
    with check("allowed=None allows every key"):
        got = masked_softmax(np.array([[1.0, 2.0, 3.0]]), None)
        expect_close(got, SOFTMAX_123[None, :], "masked_softmax(scores, None)",
                     hint="None means no mask: the plain softmax over the last axis")
    run(SPECS["masked_softmax"], masked_softmax)


def check_scaled_dot_product_attention(scaled_dot_product_attention) -> None:
    """Worked example (the 1/sqrt(Dh) scale), shapes with T != S and Dh != Dv, masks, leakage, inputs."""
    with check("the worked example: one query, two keys, Dh = 4"):
        q = np.array([[2.0, 0.0, 0.0, 0.0]])  # (T, Dh) = (1, 4)
        k = np.array([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # (S, Dh) = (2, 4)
        v = np.array([[1.0, 0.0], [0.0, 1.0]])  # (S, Dv) = (2, 2)
        result = scaled_dot_product_attention(q, k, v)
        expect_type(result, tuple, "scaled_dot_product_attention(q, k, v)")
        if len(result) != 2:
            raise AssertionError(f"it returned {len(result)} values: return `out, weights`")
        out, weights = result
        expect_shape(weights, (1, 2), "weights", names="T, S")
        expect_shape(out, (1, 2), "out", names="T, Dv")
        # scores = q . k / sqrt(4) = [4 / 2, 0] = [2, 0]; softmax([2, 0]) = [e^2, 1] / (e^2 + 1)
        w0 = np.exp(2.0) / (np.exp(2.0) + 1.0)
        w00 = float(np.asarray(weights, dtype=np.float64)[0, 0])
        for score, why in [(4.0, "the scores were not divided by sqrt(Dh) = 2"),
                           (1.0, "the scores were divided by Dh = 4, not sqrt(Dh) = 2")]:  # the usual wrong scales
            if np.isclose(w00, np.exp(score) / (np.exp(score) + 1.0), atol=1e-4):
                raise AssertionError(f"weights[0, 0] is {w00:.4f} = softmax([{score:g}, 0]): {why}")
        expect_close(weights, np.array([[w0, 1.0 - w0]]), "weights",
                     hint="scores = q · kᵀ / sqrt(Dh) = [2, 0], and the weights are their softmax")
        expect_close(out, np.array([[w0, 1.0 - w0]]), "out", hint="out = weights @ v")

    run(SPECS["scaled_dot_product_attention"], scaled_dot_product_attention)


def check_fixed_attention(fixed_attention) -> None:
    """Find the bug: first the probe that exposes it (a property every attention has), then attention's checks."""
    with check("the probe: each query's weights are a distribution over the keys (T = 3 queries, S = 5 keys)"):
        rng = np.random.default_rng(7)
        q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
        out, weights = fixed_attention(q, k, v)  # no mask: every key allowed
        expect_shape(weights, (3, 5), "weights", names="T, S")
        by_query = np.asarray(weights, dtype=np.float64).sum(axis=-1)  # (T,): one sum per query
        if not np.allclose(by_query, 1.0, atol=1e-6):
            raise AssertionError(
                f"weights.sum(axis=-1) = {np.round(by_query, 3)}: with every key allowed, each query's weights "
                "should sum to 1 over its keys. Print the sums along each axis of `weights` on this example: "
                "the axis whose sums are all ones is the one the code normalises over. Which line decides it?")
    check_scaled_dot_product_attention(fixed_attention)
