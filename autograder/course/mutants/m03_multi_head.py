"""Wrong answers to lesson 03-multi-head.

The MultiHeadAttention mutants use the names a student's notebook has at that point: ``math``, ``torch``, ``nn``,
``rearrange``, the student's ``split_heads`` / ``merge_heads`` and the given ``attention``.
"""

import math

import torch
from einops import rearrange
from torch import nn

from autograder.course.mutants import mutant
from autograder.course.reference.multi_head import attention, merge_heads, split_heads

MUTANTS: list = []

__all__ = ["MUTANTS", "attention", "math", "merge_heads", "nn", "rearrange", "split_heads", "torch"]


# -- split_heads (einops) ----------------------------------------------------------------------------------------
@mutant(MUTANTS, "split_heads", "reshapes straight to (B, H, T, Dh): time steps leak into heads")
def split_heads(x, H):  # noqa: F811 - the wrong answer replaces the correct import
    B, T, D = x.shape
    return x.reshape(B, H, T, D // H)


@mutant(MUTANTS, "split_heads", "(dh h) instead of (h dh): each head takes every H-th feature")
def split_heads(x, H):  # noqa: F811 - each mutant is a separate wrong answer
    return rearrange(x, "b t (dh h) -> b h t dh", h=H)


@mutant(MUTANTS, "split_heads", "leaves the head axis after time: (B, T, H, Dh)")
def split_heads(x, H):  # noqa: F811
    return rearrange(x, "b t (h dh) -> b t h dh", h=H)


# -- merge_heads (einops) ----------------------------------------------------------------------------------------
@mutant(MUTANTS, "merge_heads", "reshapes (B, H, T, Dh) straight to (B, T, D) without moving the heads back")
def merge_heads(x):  # noqa: F811 - the wrong answer replaces the correct import
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)


@mutant(MUTANTS, "merge_heads", "(dh h) instead of (h dh): heads interleaved feature by feature")
def merge_heads(x):  # noqa: F811
    return rearrange(x, "b h t dh -> b t (dh h)")


@mutant(MUTANTS, "merge_heads", "stacks the heads along time, (B, H * T, Dh), instead of side by side along D")
def merge_heads(x):  # noqa: F811
    return rearrange(x, "b h t dh -> b (h t) dh")


# -- split_heads_reshape -----------------------------------------------------------------------------------------
@mutant(MUTANTS, "split_heads_reshape", "torch's .transpose(1, 2): breaks on NumPy arrays")
def split_heads_reshape(x, H):
    B, T, D = x.shape
    return x.reshape(B, T, H, D // H).transpose(1, 2)


@mutant(MUTANTS, "split_heads_reshape", "reshapes straight to (B, H, T, Dh)")
def split_heads_reshape(x, H):  # noqa: F811
    B, T, D = x.shape
    return x.reshape(B, H, T, D // H)


@mutant(MUTANTS, "split_heads_reshape", "H and Dh swapped in the reshape")
def split_heads_reshape(x, H):  # noqa: F811
    B, T, D = x.shape
    return x.reshape(B, T, D // H, H).swapaxes(1, 2)


@mutant(MUTANTS, "split_heads_reshape", "checks H % D instead of D % H: raises ValueError on a valid input")
def split_heads_reshape(x, H):  # noqa: F811
    B, T, D = x.shape
    if H % D:
        raise ValueError(f"D={D} is not divisible by H={H}")
    return x.reshape(B, T, H, D // H).swapaxes(1, 2)


# -- merge_heads_reshape -----------------------------------------------------------------------------------------
@mutant(MUTANTS, "merge_heads_reshape", "reshapes without swapping H and T back")
def merge_heads_reshape(x):
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)


@mutant(MUTANTS, "merge_heads_reshape", "torch-only .transpose(1, 2).contiguous().view(...): breaks on NumPy")
def merge_heads_reshape(x):  # noqa: F811
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * Dh)


@mutant(MUTANTS, "merge_heads_reshape", "swaps batch and heads (axes 0 and 1) instead of heads and time")
def merge_heads_reshape(x):  # noqa: F811
    B, H, T, Dh = x.shape
    return x.swapaxes(0, 1).reshape(B, T, H * Dh)
