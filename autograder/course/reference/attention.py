"""Reference for lesson 02-attention (NumPy): stable softmax, masked softmax, scaled dot-product attention,
and a given attention with one bug to find (``fixed_attention``, see autograder.course.bugs).

Masks are boolean, True = "this query may attend to this key", broadcasting to the scores' shape. A query
whose keys are all blocked gets weights of exactly zero (so an output of zeros): never NaN, never a uniform
average.
"""

import math

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, stable for huge scores.

    Finite for any finite scores (subtract each row's own max along ``axis`` before ``exp``); the caller's ``x`` is
    unchanged.

    Shape:
        x: (...) -> (...), non-negative, summing to 1 along ``axis``
    """
    ### BEGIN SOLUTION
    # softmax(x) = softmax(x - c) for any c; with c = max the largest term is exp(0) = 1: nothing overflows
    shifted = x - x.max(axis=axis, keepdims=True)  # (...), every entry <= 0
    e = np.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)  # (...)
    ### END SOLUTION


def masked_softmax(scores: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """Softmax over the last axis that gives blocked keys weight 0, and a fully blocked row all zeros.

    Rows with an allowed key sum to 1 over the keys; the caller's ``scores`` and ``allowed`` are unchanged.

    Shape:
        scores: (..., T, S) float, allowed: bool broadcastable to scores, or None (all allowed) -> (..., T, S)
    """
    ### BEGIN SOLUTION
    if allowed is None:
        return softmax(scores, axis=-1)
    # a blocked score of -inf gets exp(-inf) = 0 exactly, and subtracting a finite row max from it never overflows
    # (a huge finite fill would: in float16, finfo.min - 20 is beyond the range, and NumPy warns)
    filled = np.where(allowed, scores, -np.inf)  # (..., T, S), dtype of the scores
    # a row with no allowed key would be all -inf, and its max -inf - (-inf) = NaN: give it zeros to work on
    has_key = np.any(allowed, axis=-1, keepdims=True)  # (..., T, 1)
    weights = softmax(np.where(has_key, filled, 0), axis=-1)  # (..., T, S); blocked -> 0
    # the fully blocked rows came out uniform (their scores were all 0): zero them, like every blocked weight
    return np.where(allowed, weights, 0)  # (..., T, S), dtype of the scores
    ### END SOLUTION


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention: each query's output is the softmax(q . k / sqrt(Dh))-weighted average of the values.

    Returns the pair ``(out, weights)`` in that order, with ``Dh = q.shape[-1]``. Blocked keys get weight 0 and a
    query with no allowed key gets zero weights and a zero output; the future must not leak under a causal mask, nor
    padded keys under a padding mask. The caller's arrays are unchanged.

    Shape:
        q: (..., T, Dh), k: (..., S, Dh), v: (..., S, Dv), allowed: bool broadcastable to (..., T, S) or None
        -> out: (..., T, Dv), weights: (..., T, S)
    """
    ### BEGIN SOLUTION
    Dh = q.shape[-1]
    # dividing by sqrt(Dh) keeps the scores' spread independent of the head width: softmax does not saturate
    # (math.sqrt is a Python float: a float32 input stays float32)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(Dh)  # (..., T, S)
    weights = masked_softmax(scores, allowed)  # (..., T, S)
    out = weights @ v  # (..., T, Dv)
    return out, weights
    ### END SOLUTION


def fixed_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention in one piece (find the bug): the contract of ``scaled_dot_product_attention``.

    Each query's output is the softmax(q . k / sqrt(Dh))-weighted average of the values, the softmax taken over
    that query's allowed keys; a blocked key weighs 0, and a query with no allowed key gets zero weights.

    Shape:
        q: (..., T, Dh), k: (..., S, Dh), v: (..., S, Dv), allowed: bool broadcastable to (..., T, S) or None
        -> out: (..., T, Dv), weights: (..., T, S)
    """
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, S)
    if allowed is None:
        allowed = np.ones(scores.shape, dtype=bool)  # (..., T, S): every key allowed
    filled = np.where(allowed, scores, np.finfo(scores.dtype).min)  # (..., T, S), finite everywhere
    e = np.exp(filled - filled.max(axis=-1, keepdims=True))  # (..., T, S), each query's largest is exp(0) = 1
    ### BEGIN SOLUTION
    weights = e / e.sum(axis=-1, keepdims=True)  # (..., T, S): each query's weights sum to 1 over its keys
    ### END SOLUTION
    ### BEGIN BUG
    # weights = e / e.sum(axis=-2, keepdims=True)  # (..., T, S)
    ### END BUG
    weights = np.where(allowed, weights, 0.0).astype(scores.dtype)  # blocked keys, fully blocked rows: 0
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.
MISTAKES = [
    ("fixed_attention", "normalised over the queries (axis -2), not the keys"),
]
