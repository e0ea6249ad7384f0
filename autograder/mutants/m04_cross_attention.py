"""Wrong answers to lesson 04-cross-attention.

The CrossAttention mutants use the names a student's notebook has at that point: the given ``MultiHeadAttention``,
``split_heads``, ``merge_heads`` and ``attention`` of lesson 03, and ``torch``.
"""

import torch

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.multi_head import MultiHeadAttention, attention, merge_heads, split_heads

MUTANTS: list = []

__all__ = ["MUTANTS", "MultiHeadAttention", "attention", "merge_heads", "split_heads", "torch"]


# -- cross_attention_mask ----------------------------------------------------------------------------------------
@mutant(MUTANTS, "cross_attention_mask", "PyTorch's key_padding_mask polarity: True at the padding")
def cross_attention_mask(memory_is_real, T):
    is_pad = ~memory_is_real
    return is_pad[:, None, None, :].repeat(1, 1, T, 1)


@mutant(MUTANTS, "cross_attention_mask", "adds a causal triangle, as in self-attention")
def cross_attention_mask(memory_is_real, T):  # noqa: F811 - each mutant is a separate wrong answer
    S = memory_is_real.shape[-1]
    causal = torch.ones(T, S, dtype=torch.bool).tril()
    return causal[None, None] & memory_is_real[:, None, None, :]


@mutant(MUTANTS, "cross_attention_mask", "(B, 1, 1, S): ignores T and relies on broadcasting")
def cross_attention_mask(memory_is_real, T):  # noqa: F811
    return memory_is_real[:, None, None, :]


# -- CrossAttention ----------------------------------------------------------------------------------------------
@mutant(MUTANTS, "CrossAttention", "ignores memory_kv and always projects the memory")
class CrossAttention(MultiHeadAttention):
    def project_memory(self, memory):
        k = split_heads(self.k_proj(memory), self.n_heads)
        v = split_heads(self.v_proj(memory), self.n_heads)
        return k, v

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        k, v = self.project_memory(memory)
        q = split_heads(self.q_proj(query), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return self.out_proj(merge_heads(out)), weights


@mutant(MUTANTS, "CrossAttention", "project_memory leaves the heads unsplit: (B, S, D)")
class CrossAttention(MultiHeadAttention):  # noqa: F811
    def project_memory(self, memory):
        return self.k_proj(memory), self.v_proj(memory)

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        if (memory is None) == (memory_kv is None):
            raise ValueError("pass exactly one of memory or memory_kv")
        if memory_kv is None:
            memory_kv = self.project_memory(memory)
        k, v = memory_kv
        if k.dim() == 3:  # split here instead
            k, v = split_heads(k, self.n_heads), split_heads(v, self.n_heads)
        q = split_heads(self.q_proj(query), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return self.out_proj(merge_heads(out)), weights


@mutant(MUTANTS, "CrossAttention", "copy-paste: the values come from k_proj")
class CrossAttention(MultiHeadAttention):  # noqa: F811
    def project_memory(self, memory):
        k = split_heads(self.k_proj(memory), self.n_heads)
        v = split_heads(self.k_proj(memory), self.n_heads)
        return k, v

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        if (memory is None) == (memory_kv is None):
            raise ValueError("pass exactly one of memory or memory_kv")
        if memory_kv is None:
            memory_kv = self.project_memory(memory)
        k, v = memory_kv
        q = split_heads(self.q_proj(query), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return self.out_proj(merge_heads(out)), weights


@mutant(MUTANTS, "CrossAttention", "given both memory and memory_kv, silently prefers the memory")
class CrossAttention(MultiHeadAttention):  # noqa: F811
    def project_memory(self, memory):
        k = split_heads(self.k_proj(memory), self.n_heads)
        v = split_heads(self.v_proj(memory), self.n_heads)
        return k, v

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        if memory is not None:
            memory_kv = self.project_memory(memory)
        k, v = memory_kv
        q = split_heads(self.q_proj(query), self.n_heads)
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)
        return self.out_proj(merge_heads(out)), weights


@mutant(MUTANTS, "cross_attention_mask", "returns an expand view: writing into it writes into the caller's mask")
def cross_attention_mask(memory_is_real, T):  # noqa: F811
    memory_is_real = torch.as_tensor(memory_is_real, dtype=torch.bool)
    return memory_is_real[:, None, None, :].expand(-1, 1, T, -1)



# -- CachedCrossAttention (find the bug) --------------------------------------------------------------------------
LESSON = "04-cross-attention"
_CHANGED = "        if memory is not self.memory:"  # the fixed test of the reference

shown_bug(MUTANTS, LESSON, "CachedCrossAttention",
          "the first memory projected once and for all: every later batch reads the first batch's keys and values")

patched(MUTANTS, LESSON, "CachedCrossAttention",
        "a wrong fix: the memory compared by shape: a new batch of the same size reuses the old keys and values",
        (_CHANGED, "        if self.memory is None or memory.shape != self.memory.shape:"))

patched(MUTANTS, LESSON, "CachedCrossAttention",
        "a wrong fix: the memory never stored with its keys and values: projected again at every step",
        ("            self.memory, self.memory_kv = memory, self.xattn.project_memory(memory)",
         "            self.memory_kv = self.xattn.project_memory(memory)"))

patched(MUTANTS, LESSON, "CachedCrossAttention",
        "a wrong fix: no reuse at all, forward handed the memory at every step: right values, none of the saving",
        ("        return self.xattn(query, memory_kv=self.memory_kv, allowed=allowed)",
         "        return self.xattn(query, memory, allowed=allowed)"))
