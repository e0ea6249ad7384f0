"""Wrong answers to lesson 03-multi-head.

The MultiHeadAttention mutants use the names a student's notebook has at that point: ``math``, ``torch``, ``nn``,
``rearrange``, the student's ``split_heads`` / ``merge_heads`` and the given ``attention``.
"""

import math

import torch
from einops import rearrange
from torch import nn

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.multi_head import attention, merge_heads, split_heads

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


# -- MultiHeadAttention ------------------------------------------------------------------------------------------
# The reference's own forward with one line changed: it calls split_heads / merge_heads by name, as a notebook does,
# and the wrong ones above rebound those names in this module, so bind the correct ones again.
from autograder.reference.multi_head import merge_heads, split_heads  # noqa: E402, F811

LESSON = "03-multi-head"
ATTEND = "out, weights = attention(q, k, v, allowed, dropout=self.dropout)"
MERGED = "return self.out_proj(merge_heads(out)), weights"
patched(MUTANTS, LESSON, "MultiHeadAttention", "self.dropout built but never used: no dropout on the attention weights",
        (ATTEND, "out, weights = attention(q, k, v, allowed)"))
patched(MUTANTS, LESSON, "MultiHeadAttention", "dropout on the output instead of the attention weights",
        (ATTEND, "out, weights = attention(q, k, v, allowed)"),
        (MERGED, "return self.dropout(self.out_proj(merge_heads(out))), weights"))
patched(MUTANTS, LESSON, "MultiHeadAttention",
        "PyTorch's polarity: passes ~allowed, so it attends only to blocked keys",
        (ATTEND, "blocked = None if allowed is None else ~allowed  # as nn.MultiheadAttention wants it\n"
                 "        out, weights = attention(q, k, v, blocked, dropout=self.dropout)"))
patched(MUTANTS, LESSON, "MultiHeadAttention", "forgets the output projection out_proj",
        (MERGED, "return merge_heads(out), weights"))
patched(MUTANTS, LESSON, "MultiHeadAttention", "merges heads with a plain reshape, without moving H back after T",
        (MERGED, "return self.out_proj(out.reshape(query.shape)), weights"))
patched(MUTANTS, LESSON, "MultiHeadAttention",
        "own attention, additive -inf bias: right values, NaN gradients on empty rows",
        (ATTEND, """scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if allowed is not None:
            scores = scores + torch.where(allowed, 0.0, float("-inf"))  # an additive bias, as in lesson 01
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = torch.where(allowed, weights, 0.0)  # hides the NaN of empty rows, but not in backward
        weights = self.dropout(weights)
        out = weights @ v"""))
patched(MUTANTS, LESSON, "MultiHeadAttention", "own attention scaled by √D instead of √Dh",
        (ATTEND, """scores = q @ k.transpose(-2, -1) / math.sqrt(self.n_heads * self.d_head)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        weights = self.dropout(weights)
        out = weights @ v"""))


# -- causal_self_attention (find the bug) --------------------------------------------------------------------------
shown_bug(MUTANTS, "03-multi-head", "causal_self_attention",
          "the padding broadcast on the query axis: real queries attend to padded keys")


KEY_PADDING = "allowed = allowed & is_real[:, None, None, :]"
patched(MUTANTS, LESSON, "causal_self_attention",
        "a wrong fix: padding on both axes, so padded queries attend to nothing",
        (KEY_PADDING, "allowed = allowed & is_real[:, None, :, None] & is_real[:, None, None, :]"))
patched(MUTANTS, LESSON, "causal_self_attention",
        "a wrong fix: the key padding joined with | instead of &: the future leaks",
        (KEY_PADDING, "allowed = allowed | is_real[:, None, None, :]"))
