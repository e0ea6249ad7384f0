"""Reference for lesson 04-cross-attention: the decoder's queries attend to the encoder's memory.

The memory's keys and values do not depend on the decoder's position, so ``CrossAttention.project_memory``
computes them once and ``forward(..., memory_kv=...)`` reuses them at every decoding step (lesson 09 builds on
it). ``CachedCrossAttention`` is a find-the-bug exercise (autograder.course.bugs): given code built on the student's
``project_memory``, ``forward(memory_kv=...)`` and ``cross_attention_mask``, with one mistake in when it projects
the memory again.
"""

import torch

from autograder.course.reference.multi_head import MultiHeadAttention, attention, merge_heads, split_heads


def cross_attention_mask(memory_is_real: torch.Tensor, T: int) -> torch.Tensor:
    """Cross-attention mask: every query may attend to every real memory token, never to memory padding.

    Returns a new tensor (not an ``expand`` view of ``memory_is_real``) and leaves ``memory_is_real`` unchanged.

    Shape:
        memory_is_real: (B, S) bool -> allowed: (B, 1, T, S) bool (the 1 broadcasts over heads)
    """
    ### BEGIN SOLUTION
    memory_is_real = torch.as_tensor(memory_is_real, dtype=torch.bool)  # (B, S); a NumPy array works too
    # no causal part: the whole source sentence is known before decoding starts
    allowed = memory_is_real[:, None, None, :]  # (B, 1, 1, S)
    return allowed.repeat(1, 1, T, 1)  # (B, 1, T, S), a fresh tensor: one identical row per query
    ### END SOLUTION


class CrossAttention(MultiHeadAttention):
    """Multi-head attention from decoder queries to encoder memory, whose keys/values can be projected once.

    Same parameters as ``MultiHeadAttention`` (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), and its contract:
    ``allowed`` True = this query may attend to this memory token, a query with no allowed key gets zero weights
    (its output row is ``out_proj.bias``), gradients stay finite, the caller's inputs (and ``memory_kv``) unchanged.
    Written by hand like it: ``nn.MultiheadAttention``, ``F.scaled_dot_product_attention`` and
    ``F.multi_head_attention_forward`` are not to be used (the checks refuse them).

    Shape:
        query: (B, T, D), memory: (B, S, D), allowed: (B, H, T, S)-broadcastable bool or None
        -> out: (B, T, D), weights: (B, H, T, S)
    """

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project the memory into per-head keys and values, to be reused by every later ``forward``.

        Shape:
            memory: (B, S, D) -> k: (B, H, S, Dh), v: (B, H, S, Dh)
        """
        ### BEGIN SOLUTION
        k = split_heads(self.k_proj(memory), self.n_heads)  # (B, H, S, Dh)
        v = split_heads(self.v_proj(memory), self.n_heads)  # (B, H, S, Dh)
        return k, v
        ### END SOLUTION

    def forward(self, query, memory=None, allowed=None, memory_kv=None):
        """Attend from ``query`` to the memory; pass ``memory`` or ``memory_kv = project_memory(memory)``.

        Pass exactly one of them: both, or neither, raises ``ValueError``. With ``memory_kv`` the memory is not
        projected again (``k_proj`` and ``v_proj`` do not run).

        Shape:
            query: (B, T, D), memory: (B, S, D) or memory_kv: ((B, H, S, Dh), (B, H, S, Dh))
            -> out: (B, T, D), weights: (B, H, T, S)
        """
        ### BEGIN SOLUTION
        if (memory is None) == (memory_kv is None):
            raise ValueError("pass exactly one of memory or memory_kv")
        if memory_kv is None:
            memory_kv = self.project_memory(memory)  # computed here only when not given
        k, v = memory_kv  # (B, H, S, Dh) each
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dh): the queries come from the decoder
        out, weights = attention(q, k, v, allowed, dropout=self.dropout)  # (B, H, T, Dh), (B, H, T, S): S = memory
        return self.out_proj(merge_heads(out)), weights  # (B, T, D), (B, H, T, S), as in self-attention
        ### END SOLUTION


class CachedCrossAttention:
    """A decoding loop's cross-attention that projects each memory once and reuses it (find the bug).

    ``CachedCrossAttention(xattn)`` wraps a ``CrossAttention``; calling it, ``cached(query, memory,
    memory_is_real)``, gives what ``xattn(query, memory, allowed=cross_attention_mask(memory_is_real, T))`` gives,
    T being the query's length. A decoding loop calls it once per step with the same memory tensor: the memory is
    projected (``xattn.project_memory``) at the first of those calls only, and the later ones reuse its keys and
    values (``memory_kv``). The keys and values are kept with the memory they came from: any other memory tensor
    (the next batch of sentences) is projected anew, once. The caller's tensors are unchanged.

    Shape:
        query: (B, T, D), memory: (B, S, D), memory_is_real: (B, S) bool -> out: (B, T, D), weights: (B, H, T, S)
    """

    def __init__(self, xattn: CrossAttention):
        self.xattn = xattn
        self.memory_kv = None  # ((B, H, S, Dh), (B, H, S, Dh)): the keys and values of the last memory projected
        ### BEGIN SOLUTION
        self.memory = None  # the memory they came from
        ### END SOLUTION
        ### BEGIN BUG
        ### END BUG

    def __call__(self, query: torch.Tensor, memory: torch.Tensor, memory_is_real: torch.Tensor):
        ### BEGIN SOLUTION
        if memory is not self.memory:  # a memory other than the last one (a new batch): project it, once
            self.memory, self.memory_kv = memory, self.xattn.project_memory(memory)
        ### END SOLUTION
        ### BEGIN BUG
        # if self.memory_kv is None:  # nothing projected yet: project the memory, once
        #     self.memory_kv = self.xattn.project_memory(memory)
        ### END BUG
        allowed = cross_attention_mask(memory_is_real, query.shape[1])  # (B, 1, T, S)
        return self.xattn(query, memory_kv=self.memory_kv, allowed=allowed)  # (B, T, D), (B, H, T, S)


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

_REPEAT = "    return allowed.repeat(1, 1, T, 1)"  # the reference mask's last line
_MEMORY_OR_KV = (  # the reference forward's choice between memory and memory_kv
    "        if (memory is None) == (memory_kv is None):\n"
    '            raise ValueError("pass exactly one of memory or memory_kv")\n'
    "        if memory_kv is None:\n"
    "            memory_kv = self.project_memory(memory)  # computed here only when not given\n"
)
_CHANGED = "        if memory is not self.memory:"  # the fixed test of the reference
MISTAKES = [
    ("cross_attention_mask", "PyTorch's key_padding_mask polarity: True at the padding",
     ("    allowed = memory_is_real[:, None, None, :]", "    allowed = ~memory_is_real[:, None, None, :]")),
    ("cross_attention_mask", "adds a causal triangle, as in self-attention",
     (_REPEAT, "    causal = torch.ones(T, allowed.shape[-1], dtype=torch.bool).tril()  # (T, S)\n"
               "    return causal[None, None] & allowed")),
    ("cross_attention_mask", "(B, 1, 1, S): ignores T and relies on broadcasting",
     (_REPEAT, "    return allowed")),
    ("CrossAttention", "ignores memory_kv and always projects the memory",
     (_MEMORY_OR_KV + "        k, v = memory_kv", "        k, v = self.project_memory(memory)")),
    ("CrossAttention", "project_memory leaves the heads unsplit: (B, S, D)",
     ("        k = split_heads(self.k_proj(memory), self.n_heads)", "        k = self.k_proj(memory)"),
     ("        v = split_heads(self.v_proj(memory), self.n_heads)", "        v = self.v_proj(memory)"),
     ("        k, v = memory_kv  # (B, H, S, Dh) each\n",
      "        k, v = memory_kv\n"
      "        if k.dim() == 3:  # split here instead\n"
      "            k, v = split_heads(k, self.n_heads), split_heads(v, self.n_heads)\n")),
    ("CrossAttention", "copy-paste: the values come from k_proj",
     ("        v = split_heads(self.v_proj(memory), self.n_heads)",
      "        v = split_heads(self.k_proj(memory), self.n_heads)")),
    ("CrossAttention", "given both memory and memory_kv, silently prefers the memory",
     (_MEMORY_OR_KV, "        if memory is not None:\n            memory_kv = self.project_memory(memory)\n")),
    ("cross_attention_mask",
     "returns an expand view: writing into it writes into the caller's mask",
     (_REPEAT, "    return allowed.expand(-1, 1, T, -1)")),
    ("CachedCrossAttention",
     "the first memory projected once and for all: every later batch reads the first batch's keys and values"),
    ("CachedCrossAttention",
     "a wrong fix: the memory compared by shape: a new batch of the same size reuses the old keys and values",
     (_CHANGED, "        if self.memory is None or memory.shape != self.memory.shape:")),
    ("CachedCrossAttention",
     "a wrong fix: the memory never stored with its keys and values: projected again at every step",
     ("            self.memory, self.memory_kv = memory, self.xattn.project_memory(memory)",
      "            self.memory_kv = self.xattn.project_memory(memory)")),
    ("CachedCrossAttention",
     "a wrong fix: no reuse at all, forward handed the memory at every step: right values, none of the saving",
     ("        return self.xattn(query, memory_kv=self.memory_kv, allowed=allowed)",
      "        return self.xattn(query, memory, allowed=allowed)")),
]
