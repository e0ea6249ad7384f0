"""Visible checks of lesson 02-attention: softmax, masked softmax, scaled dot-product attention.

Worked examples use numbers you can check by hand (e^0, e^1, e^2 normalised); the rest are properties any
correct answer has: rows sum to one, blocked keys get nothing, a fully masked row is zeros, huge scores stay
finite, the future and the padding do not leak, and the caller's arrays are not modified.
"""

import numpy as np

from decoder_course.checks import (
    causal_leakage_probe,
    check,
    expect_close,
    expect_finite,
    expect_inputs_unchanged,
    expect_rows_sum_to_one,
    expect_shape,
    expect_type,
    padding_leakage_probe,
)

# softmax([1, 2, 3]) = [e^0, e^1, e^2] / (e^0 + e^1 + e^2), by hand
SOFTMAX_123 = np.array([0.09003057317038046, 0.24472847105479767, 0.6652409557748219])


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
    with check("rows of very different scale, (T, S) = (3, 4): each row is its own distribution"):
        x = np.array([[0.001, 0.002, 0.003, 0.004], [1.0, 2.0, 3.0, 4.0], [1000.0, 1001.0, 1002.0, 1003.0]])
        got = expect_inputs_unchanged(softmax, x)
        expect_shape(got, (3, 4), "softmax(x)", names="T, S")
        expect_finite(got, "softmax(x)",
                      hint="a row turned to 0 / 0: subtract each row's own max (keepdims=True), not one "
                           "global max")
        expect_rows_sum_to_one(got, what="softmax(x)")
        expect_close(got[1], got[2], "rows 1 and 2 of softmax(x)",
                     hint="rows 1 and 2 differ by a constant, so their softmax is the same")
    with check("softmax(x, axis=0) normalises the columns of a (4, 3) array"):
        x = np.arange(12.0).reshape(4, 3)
        got = softmax(x, axis=0)
        expect_shape(got, (4, 3), "softmax(x, axis=0)")
        expect_close(got.sum(axis=0), np.ones(3), "the column sums of softmax(x, axis=0)",
                     hint="use the axis argument for the max and the sum, with keepdims=True")


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
    with check("a (T, S) mask broadcasts over (B, H, T, S) scores, huge scores stay finite"):
        rng = np.random.default_rng(0)
        scores = rng.standard_normal((2, 3, 4, 5)) * np.array([1e-3, 1.0, 10.0, 1e4])[:, None]  # (B, H, T, S)
        allowed = rng.random((4, 5)) < 0.6  # (T, S)
        allowed[0], allowed[3] = True, False  # a full row and a fully masked row
        got = expect_inputs_unchanged(masked_softmax, scores, allowed)
        expect_shape(got, (2, 3, 4, 5), "masked_softmax(scores, allowed)", names="B, H, T, S")
        expect_rows_sum_to_one(got, allowed, what="masked_softmax(scores, allowed)")


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

    rng = np.random.default_rng(1)
    B, H, T, S, Dh, Dv = 2, 3, 4, 5, 8, 6
    q = rng.standard_normal((B, H, T, Dh))  # (B, H, T, Dh)
    k = rng.standard_normal((B, H, S, Dh))  # (B, H, S, Dh)
    v = rng.standard_normal((B, H, S, Dv))  # (B, H, S, Dv)
    with check("shapes (B, H, T, S, Dh, Dv) = (2, 3, 4, 5, 8, 6) with a (B, 1, T, S) mask and a fully "
               "masked row"):
        allowed = rng.random((B, 1, T, S)) < 0.6
        allowed[0, 0, 0], allowed[1, 0, 2] = True, False  # a full row and a fully masked row
        out, weights = expect_inputs_unchanged(scaled_dot_product_attention, q, k, v, allowed)
        if np.shape(out) == (B, H, T, S) and np.shape(weights) == (B, H, T, Dv):
            raise AssertionError("out and weights come in the wrong order: return `out, weights`")
        expect_shape(weights, (B, H, T, S), "weights", names="B, H, T, S")
        expect_shape(out, (B, H, T, Dv), "out", names="B, H, T, Dv")
        expect_rows_sum_to_one(weights, allowed, what="weights")
        expect_close(out[1, :, 2], np.zeros((H, Dv)), "out for the fully masked query (batch 1, position 2)",
                     hint="a query with no allowed key has zero weights, so its output is zeros")
    with check("causal self-attention: no output position depends on a later one"):
        causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T): key s <= query t
        causal_leakage_probe(lambda x: scaled_dot_product_attention(x, x, x, causal),
                             rng.standard_normal((B, H, T, Dh)), time_axis=2,
                             what="scaled_dot_product_attention(x, x, x, causal)")
    with check("key padding: changing padded keys and values changes no output"):
        is_real = np.array([[True] * S, [True, True, False, False, False]])  # (B, S)
        q3 = rng.standard_normal((B, T, Dh))  # (B, T, Dh): no head axis this time
        # allowed (B, 1, S): the padding of each sequence, for every query
        padding_leakage_probe(lambda kv: scaled_dot_product_attention(q3, kv, kv, is_real[:, None, :]),
                              rng.standard_normal((B, S, Dh)), is_real, key_axis=1,
                              what="scaled_dot_product_attention(q, kv, kv, allowed)")


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
