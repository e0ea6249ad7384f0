"""Reference for lesson 02-attention (NumPy): stable softmax, masked softmax, scaled dot-product attention.

Masks are boolean, True = "this query may attend to this key", broadcasting to the scores' shape. A query
whose keys are all blocked gets weights of exactly zero (so an output of zeros): never NaN, never a uniform
average.
"""

import math

import numpy as np

EXERCISES = ["softmax", "masked_softmax", "scaled_dot_product_attention"]
GIVEN: list[str] = []


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, stable for huge scores.

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

    Shape:
        scores: (..., T, S) float, allowed: bool broadcastable to scores, or None (all allowed) -> (..., T, S)
    """
    ### BEGIN SOLUTION
    if allowed is None:
        return softmax(scores, axis=-1)
    # the most negative finite number, not -inf: a fully blocked row stays finite (no NaN, no warning)
    very_negative = np.finfo(scores.dtype).min
    weights = softmax(np.where(allowed, scores, very_negative), axis=-1)  # (..., T, S); blocked -> 0
    # a fully blocked row came out uniform (its scores were all equal): zero it, like every blocked weight
    return np.where(allowed, weights, 0)  # (..., T, S), dtype of the scores
    ### END SOLUTION


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention: each query's output is the softmax(q . k / sqrt(Dh))-weighted average of the values.

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
