"""Reference for lesson 03-multi-head: splitting heads (einops and plain reshape), then multi-head attention.

``split_heads`` / ``merge_heads`` work on NumPy arrays and PyTorch tensors alike. ``attention`` is lesson 02's
scaled dot-product attention ported to PyTorch (given, not graded). ``MultiHeadAttention`` takes a boolean
``allowed`` mask (True = may attend); PyTorch's ``nn.MultiheadAttention`` uses the opposite polarity, which is
why ``load_from_torch_mha`` exists only to copy weights and never touches a mask. ``causal_self_attention`` is a
find-the-bug exercise (autograder.course.bugs): given code built on the student's ``MultiHeadAttention``, with one
mistake
in the mask it hands it.
"""

import math

import numpy as np
import torch
from einops import rearrange
from torch import nn


def split_heads(x: np.ndarray | torch.Tensor, H: int) -> np.ndarray | torch.Tensor:
    """Split the model width into H heads and move the head axis before time (einops).

    Works on NumPy arrays and PyTorch tensors alike, keeps the dtype, and leaves the input unchanged.

    Shape:
        x: (B, T, D) -> (B, H, T, Dh) with Dh = D // H; head h holds features h*Dh ... (h+1)*Dh - 1
    """
    ### BEGIN SOLUTION
    # einops checks that D = H * Dh, and names say which axis goes where
    return rearrange(x, "b t (h dh) -> b h t dh", h=H)  # (B, H, T, Dh)
    ### END SOLUTION


def merge_heads(x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Undo ``split_heads``: put the heads side by side again along the model width (einops).

    Works on NumPy arrays and PyTorch tensors alike, keeps the dtype, and leaves the input unchanged.

    Shape:
        x: (B, H, T, Dh) -> (B, T, D) with D = H * Dh
    """
    ### BEGIN SOLUTION
    return rearrange(x, "b h t dh -> b t (h dh)")  # (B, T, D)
    ### END SOLUTION


def split_heads_reshape(x: np.ndarray | torch.Tensor, H: int) -> np.ndarray | torch.Tensor:
    """``split_heads`` with plain reshape and axis swap (no einops).

    Works on NumPy arrays and PyTorch tensors alike (``.reshape`` and ``.swapaxes``; torch's ``.transpose(1, 2)``
    and ``.view`` mean something else in NumPy), keeps the dtype, and leaves the input unchanged. Raises
    ValueError when D is not divisible by H (for ``split_heads``, einops did that check).

    Shape:
        x: (B, T, D) -> (B, H, T, Dh)
    """
    ### BEGIN SOLUTION
    B, T, D = x.shape
    if D % H != 0:
        raise ValueError(f"model width D={D} is not divisible by H={H} heads")
    # reshape first: the last axis D is cut into H contiguous chunks of Dh features
    x = x.reshape(B, T, H, D // H)  # (B, T, H, Dh)
    # then swap time and heads (NumPy arrays and PyTorch tensors both have .swapaxes)
    return x.swapaxes(1, 2)  # (B, H, T, Dh)
    ### END SOLUTION


def merge_heads_reshape(x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """``merge_heads`` with plain axis swap and reshape (no einops).

    Works on NumPy arrays and PyTorch tensors alike (``.swapaxes`` and ``.reshape``), keeps the dtype, and leaves
    the input unchanged.

    Shape:
        x: (B, H, T, Dh) -> (B, T, D)
    """
    ### BEGIN SOLUTION
    B, H, T, Dh = x.shape
    # swap back first: reshaping (B, H, T, Dh) straight to (B, T, D) would interleave time steps and heads
    x = x.swapaxes(1, 2)  # (B, T, H, Dh)
    return x.reshape(B, T, H * Dh)  # (B, T, D)
    ### END SOLUTION


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None, dropout=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention in PyTorch (lesson 02's, ported); a fully blocked query row gives zeros.

    ``dropout`` (optional, e.g. an ``nn.Dropout``) is applied to the weights before they average the values;
    the weights returned are those used, as in ``nn.MultiheadAttention``.

    Shape:
        q: (..., T, Dh), k: (..., S, Dh), v: (..., S, Dv), allowed: bool broadcastable to (..., T, S) or None
        -> out: (..., T, Dv), weights: (..., T, S)
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if allowed is not None:
        # finite fill, not -inf: a fully blocked row stays finite, and so do its value and gradient
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    if allowed is not None:
        # a fully blocked row came out uniform: zero it (a no-op elsewhere, blocked weights are already 0)
        weights = weights.masked_fill(~allowed, 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project queries, keys and values, attend in H heads at once, project back.

    ``MultiHeadAttention(d_model, n_heads)`` raises ValueError when ``d_model`` is not divisible by ``n_heads``. The
    weights are per head (not averaged). In training mode ``dropout`` acts on the attention weights, before they
    average the values, and the weights returned are the dropped-out ones (as ``nn.MultiheadAttention``;
    ``attention(..., dropout=self.dropout)`` does both); in eval mode there is no dropout. Gradients stay finite
    when a query row is fully blocked; the caller's inputs are unchanged. Written with ``attention`` and your
    head split: ``nn.MultiheadAttention``, ``F.scaled_dot_product_attention`` and ``F.multi_head_attention_forward``
    are what it is compared with, not to be used (the checks refuse them).

    ``allowed`` is boolean, True = "this query may attend to this key", broadcastable to (B, H, T, S). A fully
    blocked query gets zero attention output, so its output row is ``out_proj.bias``.

    Shape:
        query: (B, T, D), key: (B, S, D), value: (B, S, D), allowed: (B, H, T, S)-broadcastable bool or None
        -> out: (B, T, D), weights: (B, H, T, S)
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        ### BEGIN SOLUTION
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads  # Dh
        # one D -> D projection each: all H heads at once, head h reads features h*Dh ... (h+1)*Dh - 1
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)  # on the attention weights, as in nn.MultiheadAttention
        ### END SOLUTION

    def forward(self, query, key, value, allowed=None):
        """Attend from ``query`` to ``key``/``value`` (T may differ from S).

        Shape:
            query: (B, T, D), key: (B, S, D), value: (B, S, D) -> out: (B, T, D), weights: (B, H, T, S)
        """
        ### BEGIN SOLUTION
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dh)
        k = split_heads(self.k_proj(key), self.n_heads)  # (B, H, S, Dh)
        v = split_heads(self.v_proj(value), self.n_heads)  # (B, H, S, Dh)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)  # (B, H, T, Dh), (B, H, T, S)
        return self.out_proj(merge_heads(out)), weights  # (B, T, D), (B, H, T, S)
        ### END SOLUTION


def load_from_torch_mha(ours: MultiHeadAttention, torch_mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """Copy an ``nn.MultiheadAttention``'s weights into ours (its packed ``in_proj`` holds q, k, v stacked).

    Only weights are copied: masks are not involved, and PyTorch's mask polarity (True = blocked) stays out.

    Shape:
        in_proj_weight: (3 * D, D) -> q_proj, k_proj, v_proj weights (D, D) each; out_proj copied as is
    """
    if not torch_mha._qkv_same_embed_dim or torch_mha.in_proj_bias is None:
        raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim and bias=True is supported")
    if torch_mha.num_heads != ours.n_heads or torch_mha.embed_dim != ours.q_proj.in_features:
        raise ValueError("the two modules disagree on d_model or n_heads")
    w_q, w_k, w_v = torch_mha.in_proj_weight.chunk(3, dim=0)  # (D, D) each, in the order q, k, v
    b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3, dim=0)  # (D,) each
    with torch.no_grad():
        for proj, w, b in [(ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k), (ours.v_proj, w_v, b_v)]:
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.out_proj.weight.copy_(torch_mha.out_proj.weight)
        ours.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return ours


def causal_self_attention(mha: MultiHeadAttention, x: torch.Tensor, is_real: torch.Tensor | None = None):
    """A decoder's masked self-attention (find the bug): each position attends to itself and earlier real tokens.

    ``mha`` is a ``MultiHeadAttention``; the queries, keys and values are all ``x``. Query t may attend to key s
    when s <= t and token s is real (``is_real[b, s]``; None: every token is real). The padding may sit at the
    end of a sequence or at its start (left padding, as batched generation uses). Padding is masked on the key
    axis only: a padded query attends as any query does (its output is ignored downstream), and a query with no
    allowed key gets what ``mha`` gives such a row. ``x`` and ``is_real`` are unchanged.

    Shape:
        x: (B, T, D), is_real: (B, T) bool or None -> out: (B, T, D), weights: (B, H, T, T)
    """
    T = x.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T): key s <= query t
    if is_real is not None:
        ### BEGIN SOLUTION
        allowed = allowed & is_real[:, None, None, :]  # (B, 1, T, T): a padded key is blocked for every query
        ### END SOLUTION
        ### BEGIN BUG
        # allowed = allowed & is_real[:, None, :, None]  # (B, 1, T, T)
        ### END BUG
    return mha(x, x, x, allowed)  # (B, T, D), (B, H, T, T)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

# Given helpers that are an earlier lesson's graded answer in another form: a release of a term holds them only
# after that lesson closes, like its answers (autograder.term.integrity); until then the student ports their own.
PORTS = {"attention": "02-attention"}

ATTEND = "out, weights = attention(q, k, v, allowed, dropout=self.dropout)"
MERGED = "return self.out_proj(merge_heads(out)), weights"
KEY_PADDING = "allowed = allowed & is_real[:, None, None, :]"
MISTAKES = [
    ("MultiHeadAttention", "self.dropout built but never used: no dropout on the attention weights",
     (ATTEND, "out, weights = attention(q, k, v, allowed)")),
    ("MultiHeadAttention", "dropout on the output instead of the attention weights",
     (ATTEND, "out, weights = attention(q, k, v, allowed)"),
     (MERGED, "return self.dropout(self.out_proj(merge_heads(out))), weights")),
    ("MultiHeadAttention",
     "PyTorch's polarity: passes ~allowed, so it attends only to blocked keys",
     (ATTEND, "blocked = None if allowed is None else ~allowed  # as nn.MultiheadAttention wants it\n"
              "        out, weights = attention(q, k, v, blocked, dropout=self.dropout)")),
    ("MultiHeadAttention", "forgets the output projection out_proj",
     (MERGED, "return merge_heads(out), weights")),
    ("MultiHeadAttention", "merges heads with a plain reshape, without moving H back after T",
     (MERGED, "return self.out_proj(out.reshape(query.shape)), weights")),
    ("MultiHeadAttention",
     "own attention, additive -inf bias: right values, NaN gradients on empty rows",
     (ATTEND, """scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if allowed is not None:
            scores = scores + torch.where(allowed, 0.0, float("-inf"))  # an additive bias, as in lesson 01
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = torch.where(allowed, weights, 0.0)  # hides the NaN of empty rows, but not in backward
        weights = self.dropout(weights)
        out = weights @ v""")),
    ("MultiHeadAttention", "own attention scaled by √D instead of √Dh",
     (ATTEND, """scores = q @ k.transpose(-2, -1) / math.sqrt(self.n_heads * self.d_head)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        weights = self.dropout(weights)
        out = weights @ v""")),
    ("causal_self_attention",
     "the padding broadcast on the query axis: real queries attend to padded keys"),
    ("causal_self_attention",
     "a wrong fix: padding on both axes, so padded queries attend to nothing",
     (KEY_PADDING, "allowed = allowed & is_real[:, None, :, None] & is_real[:, None, None, :]")),
    ("causal_self_attention",
     "a wrong fix: the key padding joined with | instead of &: the future leaks",
     (KEY_PADDING, "allowed = allowed | is_real[:, None, None, :]")),
]
