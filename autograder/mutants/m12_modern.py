"""Wrong answers to lesson 12-modern.

Most are the reference with the one line a student got wrong (``patched``); the one written out is a different
body, typed as a student would in the notebook, where ``torch``, ``nn``, ``split_heads``, ``merge_heads`` and the
lesson's other exercises exist.
"""

import torch
from torch import nn

from autograder.mutants import mutant, patched, shown_bug

LESSON = "12-modern"
MUTANTS: list = []


# -- RMSNorm -----------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "RMSNorm", "subtracts the mean first (LayerNorm without a bias)",
        ("rms = torch.sqrt(", "h = h - h.mean(dim=-1, keepdim=True)\n        rms = torch.sqrt("))
patched(MUTANTS, LESSON, "RMSNorm", "eps added outside the square root",
        ("torch.sqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
         "h.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps"))
patched(MUTANTS, LESSON, "RMSNorm", "a bfloat16 input comes back float32 (the float32 weight promotes it)",
        ("return (h / rms * self.weight).to(x.dtype)", "return h / rms * self.weight"))


# -- rotary_embedding --------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "rotary_embedding", "pairs dimension i with i + Dh/2 (rotate-half) instead of (2i, 2i+1)",
        ("a, b = x[..., 0::2].float(), x[..., 1::2].float()",
         "a, b = x[..., : Dh // 2].float(), x[..., Dh // 2:].float()"),
        ("rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)",
         "rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)"),
        ("return rotated.flatten(-2).to(x.dtype)", "return rotated.to(x.dtype)"))
patched(MUTANTS, LESSON, "rotary_embedding", "ignores positions: rotates row t by t",
        ("angles = positions.to(x.device, torch.float32)[:, None] * theta",
         "angles = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * theta"))
patched(MUTANTS, LESSON, "rotary_embedding", "frequencies base^(-i/Dh) instead of base^(-2i/Dh)",
        ("theta = base ** (-2 * i / Dh)", "theta = base ** (-i / Dh)"))
patched(MUTANTS, LESSON, "rotary_embedding", "rotates the wrong way: (a, b) -> (a cos + b sin, -a sin + b cos)",
        ("rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)",
         "rotated = torch.stack([a * cos + b * sin, -a * sin + b * cos], dim=-1)"))


# -- SwiGLUFeedForward -------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "SwiGLUFeedForward", "ReLU instead of SiLU on the gate",
        ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
         "hidden = torch.relu(self.gate_proj(x)) * self.up_proj(x)"))
patched(MUTANTS, LESSON, "SwiGLUFeedForward", "SiLU on the up projection, not on the gate",
        ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
         "hidden = self.gate_proj(x) * F.silu(self.up_proj(x))"))
patched(MUTANTS, LESSON, "SwiGLUFeedForward", "a sigmoid gate (GLU) instead of SiLU",
        ("hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)",
         "hidden = torch.sigmoid(self.gate_proj(x)) * self.up_proj(x)"))


# -- GroupedQueryAttention ---------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "GroupedQueryAttention", "tiles the key/value heads (repeat) instead of repeat_interleave",
        ("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)"),
        ("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)"))
patched(MUTANTS, LESSON, "GroupedQueryAttention", "rotates the queries only, not the keys",
        ("q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)", "q = rotary_embedding(q, positions)"))


# its own softmax, scaled by the model width (a different body, not a changed line): written out
@mutant(MUTANTS, "GroupedQueryAttention", "scores scaled by 1/sqrt(D) instead of 1/sqrt(Dh)")
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
patched(MUTANTS, LESSON, "sliding_window_mask", "off by one: window + 1 keys (t - s <= window)",
        ("(t - s < window)", "(t - s <= window)"))
patched(MUTANTS, LESSON, "sliding_window_mask", "not causal: |t - s| < window",
        ("return (s <= t) & (t - s < window)", "return (t - s).abs() < window"))


# -- ModernBlock -------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "ModernBlock", "post-norm: normalises after each residual addition",
        ("x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)",
         "x = self.attn_norm(x + self.attn(x, positions, allowed, cache, layer_idx))"),
        ("return x + self.feed_forward(self.ffn_norm(x))", "return self.ffn_norm(x + self.feed_forward(x))"))
patched(MUTANTS, LESSON, "ModernBlock", "positions not passed to the attention (no RoPE at all)",
        ("x = x + self.attn(self.attn_norm(x), positions, allowed, cache, layer_idx)",
         "x = x + self.attn(self.attn_norm(x), allowed=allowed, cache=cache, layer_idx=layer_idx)"))
patched(MUTANTS, LESSON, "ModernBlock", "one norm for both sublayers (attn_norm before the feed-forward too)",
        ("return x + self.feed_forward(self.ffn_norm(x))", "return x + self.feed_forward(self.attn_norm(x))"))


# -- mha_to_gqa (find the bug) -----------------------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "mha_to_gqa",
          "pools heads j, j + n_kv_heads, ... (repeat's layout), not the consecutive heads kv head j serves")
patched(MUTANTS, LESSON, "mha_to_gqa", "a wrong fix: keeps the first head of each group instead of the mean",
        ("pooled = heads.mean(dim=1)", "pooled = heads[:, 0]"))
patched(MUTANTS, LESSON, "mha_to_gqa", "a wrong fix: sums each group's heads instead of averaging them",
        ("pooled = heads.mean(dim=1)", "pooled = heads.sum(dim=1)"))
patched(MUTANTS, LESSON, "mha_to_gqa",
        "a wrong fix: (n_kv_heads, Dh, g, D): averages rows across a group's heads, not whole heads",
        ("heads = w.reshape(n_kv_heads, group, Dh, D)", "heads = w.reshape(n_kv_heads, Dh, group, D).transpose(1, 2)"))


# The definition above rebound this name to a wrong answer; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.reference.modern import GroupedQueryAttention  # noqa: E402, F401, F811
