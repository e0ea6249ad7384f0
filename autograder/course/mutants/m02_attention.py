"""Wrong answers to lesson 02-attention.

A wrong ``masked_softmax`` or attention calls ``softmax`` / ``masked_softmax`` by name, as a student's would:
in a notebook those names are the student's own functions. Here they are bound, at the bottom of this module,
to the reference (after the wrong versions of the same names are defined), so each wrong answer is wrong in
one place only.
"""

import math

import numpy as np

from autograder.course.mutants import mutant

MUTANTS: list = []


# -- softmax -------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "softmax", "ignores the axis argument (always the last axis)")
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@mutant(MUTANTS, "softmax", "no max shift: exp overflows on huge scores")
def softmax(x, axis=-1):  # noqa: F811 - each mutant is a separate wrong answer
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


@mutant(MUTANTS, "softmax", "subtracts the global max instead of each row's")
def softmax(x, axis=-1):  # noqa: F811
    e = np.exp(x - x.max())
    return e / e.sum(axis=axis, keepdims=True)


@mutant(MUTANTS, "softmax", "shifts the caller's array in place")
def softmax(x, axis=-1):  # noqa: F811
    x -= x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


# -- masked_softmax ------------------------------------------------------------------------------------------
@mutant(MUTANTS, "masked_softmax", "-1e9 fill only: a fully masked row becomes a uniform average")
def masked_softmax(scores, allowed):
    if allowed is None:
        return softmax(scores)
    return softmax(np.where(allowed, scores, -1e9))


@mutant(MUTANTS, "masked_softmax", "-inf fill: a fully masked row becomes NaN")
def masked_softmax(scores, allowed):  # noqa: F811
    if allowed is None:
        return softmax(scores)
    with np.errstate(invalid="ignore"):
        return softmax(np.where(allowed, scores, -np.inf))


@mutant(MUTANTS, "masked_softmax", "mask applied after the softmax: rows no longer sum to one")
def masked_softmax(scores, allowed):  # noqa: F811
    weights = softmax(scores)
    if allowed is None:
        return weights
    return weights * allowed


@mutant(MUTANTS, "masked_softmax", "inverted polarity: True read as blocked")
def masked_softmax(scores, allowed):  # noqa: F811
    if allowed is None:
        return softmax(scores)
    blocked = allowed  # the PyTorch-module polarity, by mistake
    weights = softmax(np.where(blocked, np.finfo(scores.dtype).min, scores))
    return np.where(blocked, 0, weights)


@mutant(MUTANTS, "masked_softmax", "fills the caller's scores in place")
def masked_softmax(scores, allowed):  # noqa: F811
    if allowed is None:
        return softmax(scores)
    full = np.broadcast_to(allowed, scores.shape)
    scores[~full] = np.finfo(scores.dtype).min
    return np.where(full, softmax(scores), 0)


# -- scaled_dot_product_attention ----------------------------------------------------------------------------
@mutant(MUTANTS, "scaled_dot_product_attention", "no 1/sqrt(Dh) scaling")
def scaled_dot_product_attention(q, k, v, allowed=None):
    scores = q @ k.swapaxes(-1, -2)
    weights = masked_softmax(scores, allowed)
    return weights @ v, weights


@mutant(MUTANTS, "scaled_dot_product_attention", "divides by Dh instead of sqrt(Dh)")
def scaled_dot_product_attention(q, k, v, allowed=None):  # noqa: F811
    scores = q @ k.swapaxes(-1, -2) / q.shape[-1]
    weights = masked_softmax(scores, allowed)
    return weights @ v, weights


@mutant(MUTANTS, "scaled_dot_product_attention", "k.T, which reverses every axis of a batched k")
def scaled_dot_product_attention(q, k, v, allowed=None):  # noqa: F811
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = masked_softmax(scores, allowed)
    return weights @ v, weights


@mutant(MUTANTS, "scaled_dot_product_attention", "returns (weights, out)")
def scaled_dot_product_attention(q, k, v, allowed=None):  # noqa: F811
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    weights = masked_softmax(scores, allowed)
    return weights, weights @ v


@mutant(MUTANTS, "scaled_dot_product_attention", "scales the caller's q in place")
def scaled_dot_product_attention(q, k, v, allowed=None):  # noqa: F811
    q /= math.sqrt(q.shape[-1])
    weights = masked_softmax(q @ k.swapaxes(-1, -2), allowed)
    return weights @ v, weights


# -- fixed_attention (find the bug) ---------------------------------------------------------------------------


@mutant(MUTANTS, "fixed_attention", "a wrong fix: the max moved to axis -2 as well, still normalised over queries")
def fixed_attention(q, k, v, allowed=None):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if allowed is None:
        allowed = np.ones(scores.shape, dtype=bool)
    filled = np.where(allowed, scores, np.finfo(scores.dtype).min)
    e = np.exp(filled - filled.max(axis=-2, keepdims=True))
    weights = e / e.sum(axis=-2, keepdims=True)
    weights = np.where(allowed, weights, 0.0).astype(scores.dtype)
    return weights @ v, weights


@mutant(MUTANTS, "fixed_attention", "a wrong fix: normalised over the keys, but the zeroing of blocked keys dropped")
def fixed_attention(q, k, v, allowed=None):  # noqa: F811
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if allowed is None:
        allowed = np.ones(scores.shape, dtype=bool)
    filled = np.where(allowed, scores, np.finfo(scores.dtype).min)
    e = np.exp(filled - filled.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights


# The names a wrong answer calls resolve here, at call time: the reference's, defined once above the wrong
# ones.
from autograder.course.reference.attention import masked_softmax, softmax  # noqa: E402, F811
