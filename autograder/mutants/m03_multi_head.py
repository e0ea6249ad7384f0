"""Wrong answers to lesson 03-multi-head.

The MultiHeadAttention mutants use the names a student's notebook has at that point: ``math``, ``torch``, ``nn``,
``rearrange``, the student's ``split_heads`` / ``merge_heads`` and the given ``attention``.
"""

import math

import torch
from einops import rearrange
from torch import nn

from autograder.mutants import mutant, shown_bug
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
# The mutants below call split_heads / merge_heads by name, as a notebook does; the wrong ones above rebound those
# names in this module, so bind the correct ones again: each mutant is wrong in one place only.
@mutant(MUTANTS, "MultiHeadAttention", "self.dropout built but never used: no dropout on the attention weights")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        out, weights = attention(q, k, v, allowed)
        return self.out_proj(merge_heads(out)), weights


from autograder.reference.multi_head import merge_heads, split_heads  # noqa: E402, F811


@mutant(MUTANTS, "MultiHeadAttention", "dropout on the output instead of the attention weights")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        out, weights = attention(q, k, v, allowed)
        return self.dropout(self.out_proj(merge_heads(out))), weights


@mutant(MUTANTS, "MultiHeadAttention", "PyTorch's polarity: passes ~allowed, so it attends only to blocked keys")
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        blocked = None if allowed is None else ~allowed  # as nn.MultiheadAttention wants it
        out, weights = attention(q, k, v, blocked, dropout=self.dropout)
        return self.out_proj(merge_heads(out)), weights


@mutant(MUTANTS, "MultiHeadAttention", "forgets the output projection out_proj")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return merge_heads(out), weights


@mutant(MUTANTS, "MultiHeadAttention", "merges heads with a plain reshape, without moving H back after T")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        B, T, D = query.shape
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return self.out_proj(out.reshape(B, T, D)), weights


@mutant(MUTANTS, "MultiHeadAttention", "own attention, additive -inf bias: right values, NaN gradients on empty rows")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if allowed is not None:
            scores = scores + torch.where(allowed, 0.0, float("-inf"))  # an additive bias, as in lesson 01
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = torch.where(allowed, weights, 0.0)  # hides the NaN of empty rows, but not in backward
        weights = self.dropout(weights)
        return self.out_proj(merge_heads(weights @ v)), weights


@mutant(MUTANTS, "MultiHeadAttention", "own attention scaled by √D instead of √Dh")
class MultiHeadAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_model = d_model
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, allowed=None):
        q = split_heads(self.q_proj(query), self.n_heads)
        k = split_heads(self.k_proj(key), self.n_heads)
        v = split_heads(self.v_proj(value), self.n_heads)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        weights = self.dropout(weights)
        return self.out_proj(merge_heads(weights @ v)), weights


# -- causal_self_attention (find the bug) --------------------------------------------------------------------------
shown_bug(MUTANTS, "03-multi-head", "causal_self_attention",
          "the padding broadcast on the query axis: real queries attend to padded keys")


@mutant(MUTANTS, "causal_self_attention", "a wrong fix: padding on both axes, so padded queries attend to nothing")
def causal_self_attention(mha, x, is_real=None):
    T = x.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    if is_real is not None:
        allowed = allowed & is_real[:, None, :, None] & is_real[:, None, None, :]
    return mha(x, x, x, allowed)


@mutant(MUTANTS, "causal_self_attention", "a wrong fix: the key padding joined with | instead of &: the future leaks")
def causal_self_attention(mha, x, is_real=None):  # noqa: F811
    T = x.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    if is_real is not None:
        allowed = allowed | is_real[:, None, None, :]
    return mha(x, x, x, allowed)
