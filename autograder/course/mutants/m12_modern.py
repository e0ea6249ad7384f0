"""A whole wrong answer to lesson 12-modern (the patches of the reference are its ``MISTAKES``): a different body,
typed as a student would in the notebook, where ``torch``, ``nn``, ``split_heads``, ``merge_heads`` and the
lesson's other exercises exist.
"""

import torch
from torch import nn

from autograder.course.mutants import mutant

MUTANTS: list = []


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


# The definition above rebound this name to a wrong answer; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.course.reference.modern import GroupedQueryAttention  # noqa: E402, F401, F811
