"""Wrong answers to lesson 00-setup (einops warm-ups)."""

import numpy as np
from einops import rearrange

from autograder.mutants import mutant

MUTANTS: list = []


@mutant(MUTANTS, "flatten_batch", "time-major order: (t b) instead of (b t)")
def flatten_batch(x):
    return rearrange(x, "b t d -> (t b) d")


@mutant(MUTANTS, "flatten_batch", "merges T and D instead of B and T")
def flatten_batch(x):  # noqa: F811 - each mutant is a separate wrong answer
    return x.reshape(x.shape[0], -1)


@mutant(MUTANTS, "flatten_batch", "flattens everything into one axis")
def flatten_batch(x):  # noqa: F811
    return rearrange(x, "b t d -> (b t d)")


@mutant(MUTANTS, "time_major", "reshape instead of transpose: same shape, scrambled values")
def time_major(x):
    B, T, D = x.shape
    return x.reshape(T, B, D)


@mutant(MUTANTS, "time_major", "NumPy's .T reverses every axis: (D, T, B)")
def time_major(x):  # noqa: F811
    return x.T


@mutant(MUTANTS, "time_major", "swaps T and D instead of B and T")
def time_major(x):  # noqa: F811
    return np.swapaxes(x, 1, 2)


@mutant(MUTANTS, "split_last", "(dh h): the heads' features interleaved")
def split_last(x, H):
    return rearrange(x, "b t (dh h) -> b t h dh", h=H)


@mutant(MUTANTS, "split_last", "H hard-coded from the worked example")
def split_last(x, H):  # noqa: F811
    return rearrange(x, "b t (h dh) -> b t h dh", h=3)


@mutant(MUTANTS, "split_last", "heads moved before time: (B, H, T, Dh)")
def split_last(x, H):  # noqa: F811
    return rearrange(x, "b t (h dh) -> b h t dh", h=H)
