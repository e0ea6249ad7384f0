"""Wrong answers to lesson 12-modern.

Each is written as a student would type it in the notebook, where ``torch``, ``nn``, ``F``, ``split_heads``,
``merge_heads``, ``attention``, ``KVCache``, ``cached_causal_mask`` and the lesson's other exercises exist.
"""

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from autograder.mutants import mutant, patched, shown_bug

MUTANTS: list = []


# -- RMSNorm -----------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "RMSNorm", "subtracts the mean first (LayerNorm without a bias)")
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        h = h - h.mean(-1, keepdim=True)
        return (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


@mutant(MUTANTS, "RMSNorm", "eps added outside the square root")
class RMSNorm(nn.Module):  # noqa: F811
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        return (h / (h.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight).to(x.dtype)


@mutant(MUTANTS, "RMSNorm", "a bfloat16 input comes back float32 (the float32 weight promotes it)")
class RMSNorm(nn.Module):  # noqa: F811
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# -- rotary_embedding --------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "rotary_embedding", "pairs dimension i with i + Dh/2 (rotate-half) instead of (2i, 2i+1)")
def rotary_embedding(x, positions, base=10000.0):
    Dh = x.shape[-1]
    if Dh % 2:
        raise ValueError("odd Dh")
    theta = base ** (-2 * torch.arange(Dh // 2, dtype=torch.float32) / Dh)
    angles = positions.float()[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., : Dh // 2].float(), x[..., Dh // 2:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


@mutant(MUTANTS, "rotary_embedding", "ignores positions: rotates row t by t")
def rotary_embedding(x, positions, base=10000.0):  # noqa: F811
    Dh, T = x.shape[-1], x.shape[-2]
    if Dh % 2:
        raise ValueError("odd Dh")
    theta = base ** (-2 * torch.arange(Dh // 2, dtype=torch.float32) / Dh)
    angles = torch.arange(T, dtype=torch.float32)[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).to(x.dtype)


@mutant(MUTANTS, "rotary_embedding", "frequencies base^(-i/Dh) instead of base^(-2i/Dh)")
def rotary_embedding(x, positions, base=10000.0):  # noqa: F811
    Dh = x.shape[-1]
    if Dh % 2:
        raise ValueError("odd Dh")
    theta = base ** (-torch.arange(Dh // 2, dtype=torch.float32) / Dh)
    angles = positions.float()[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).to(x.dtype)


# -- SwiGLUFeedForward -------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "SwiGLUFeedForward", "ReLU instead of SiLU on the gate")
class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.gate_proj(x)) * self.up_proj(x))


@mutant(MUTANTS, "SwiGLUFeedForward", "SiLU on the up projection, not on the gate")
class SwiGLUFeedForward(nn.Module):  # noqa: F811
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))


@mutant(MUTANTS, "SwiGLUFeedForward", "a sigmoid gate (GLU) instead of SiLU")
class SwiGLUFeedForward(nn.Module):  # noqa: F811
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(torch.sigmoid(self.gate_proj(x)) * self.up_proj(x))


# -- GroupedQueryAttention ---------------------------------------------------------------------------------------------
@mutant(MUTANTS, "GroupedQueryAttention", "tiles the key/value heads (repeat) instead of repeat_interleave")
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("sizes")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None, allowed=None, cache=None, layer_idx=0):
        q = split_heads(self.q_proj(x), self.n_heads)  # noqa: F821 - given in the notebook
        k = split_heads(self.k_proj(x), self.n_kv_heads)  # noqa: F821
        v = split_heads(self.v_proj(x), self.n_kv_heads)  # noqa: F821
        if positions is not None:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)  # noqa: F821
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        out, _ = attention(q, k, v, allowed)  # noqa: F821
        return self.out_proj(merge_heads(out))  # noqa: F821


@mutant(MUTANTS, "GroupedQueryAttention", "rotates the queries only, not the keys")
class GroupedQueryAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("sizes")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None, allowed=None, cache=None, layer_idx=0):
        q = split_heads(self.q_proj(x), self.n_heads)  # noqa: F821
        k = split_heads(self.k_proj(x), self.n_kv_heads)  # noqa: F821
        v = split_heads(self.v_proj(x), self.n_kv_heads)  # noqa: F821
        if positions is not None:
            q = rotary_embedding(q, positions)  # noqa: F821
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out, _ = attention(q, k, v, allowed)  # noqa: F821
        return self.out_proj(merge_heads(out))  # noqa: F821


@mutant(MUTANTS, "GroupedQueryAttention", "scores scaled by 1/sqrt(D) instead of 1/sqrt(Dh)")
class GroupedQueryAttention(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("sizes")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None, allowed=None, cache=None, layer_idx=0):
        q = split_heads(self.q_proj(x), self.n_heads)  # noqa: F821
        k = split_heads(self.k_proj(x), self.n_kv_heads)  # noqa: F821
        v = split_heads(self.v_proj(x), self.n_kv_heads)  # noqa: F821
        if positions is not None:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)  # noqa: F821
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / x.shape[-1] ** 0.5
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, -1)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        return self.out_proj(merge_heads(weights @ v))  # noqa: F821


# -- sliding_window_mask -----------------------------------------------------------------------------------------------
@mutant(MUTANTS, "sliding_window_mask", "off by one: window + 1 keys (t - s <= window)")
def sliding_window_mask(T, window):
    if window < 1:
        raise ValueError("window")
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (s <= t) & (t - s <= window)


@mutant(MUTANTS, "sliding_window_mask", "not causal: |t - s| < window")
def sliding_window_mask(T, window):  # noqa: F811
    if window < 1:
        raise ValueError("window")
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (t - s).abs() < window


# -- ModernBlock -------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "ModernBlock", "post-norm: normalises after each residual addition")
class ModernBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps=1e-6):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)  # noqa: F821
        self.ffn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.feed_forward = SwiGLUFeedForward(d_model, d_ff)  # noqa: F821

    def forward(self, x, positions, allowed=None, cache=None, layer_idx=0):
        x = self.attn_norm(x + self.attn(x, positions, allowed, cache, layer_idx))
        return self.ffn_norm(x + self.feed_forward(x))


@mutant(MUTANTS, "ModernBlock", "positions not passed to the attention (no RoPE at all)")
class ModernBlock(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps=1e-6):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)  # noqa: F821
        self.ffn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.feed_forward = SwiGLUFeedForward(d_model, d_ff)  # noqa: F821

    def forward(self, x, positions, allowed=None, cache=None, layer_idx=0):
        x = x + self.attn(self.attn_norm(x), allowed=allowed, cache=cache, layer_idx=layer_idx)
        return x + self.feed_forward(self.ffn_norm(x))


@mutant(MUTANTS, "ModernBlock", "one norm for both sublayers (attn_norm before the feed-forward too)")
class ModernBlock(nn.Module):  # noqa: F811
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps=1e-6):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)  # noqa: F821
        self.ffn_norm = RMSNorm(d_model, eps)  # noqa: F821
        self.feed_forward = SwiGLUFeedForward(d_model, d_ff)  # noqa: F821

    def forward(self, x, positions, allowed=None, cache=None, layer_idx=0):
        x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)
        return x + self.feed_forward(self.attn_norm(x))


# -- mha_to_gqa (find the bug) -----------------------------------------------------------------------------------------
shown_bug(MUTANTS, "12-modern", "mha_to_gqa",
          "pools heads j, j + n_kv_heads, ... (repeat's layout), not the consecutive heads kv head j serves")
patched(MUTANTS, "12-modern", "mha_to_gqa", "a wrong fix: keeps the first head of each group instead of the mean",
        ("pooled = heads.mean(dim=1)", "pooled = heads[:, 0]"))
patched(MUTANTS, "12-modern", "mha_to_gqa", "a wrong fix: sums each group's heads instead of averaging them",
        ("pooled = heads.mean(dim=1)", "pooled = heads.sum(dim=1)"))
patched(MUTANTS, "12-modern", "mha_to_gqa",
        "a wrong fix: (n_kv_heads, Dh, g, D): averages rows across a group's heads, not whole heads",
        ("heads = w.reshape(n_kv_heads, group, Dh, D)", "heads = w.reshape(n_kv_heads, Dh, group, D).transpose(1, 2)"))


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.reference.modern import (  # noqa: E402, F401, F811
    GroupedQueryAttention,
    RMSNorm,
    SwiGLUFeedForward,
    rotary_embedding,
)
