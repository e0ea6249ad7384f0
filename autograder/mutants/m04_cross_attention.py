"""Wrong answers to lesson 04-cross-attention.

Most are the reference with a line or two changed (:func:`autograder.mutants.patched`), run where a student's
notebook has the given ``MultiHeadAttention``, ``split_heads``, ``merge_heads`` and ``attention`` of lesson 03, and
``torch``.
"""

from autograder.mutants import patched, shown_bug

LESSON = "04-cross-attention"
MUTANTS: list = []
_REPEAT = "    return allowed.repeat(1, 1, T, 1)"  # the reference mask's last line
_MEMORY_OR_KV = (  # the reference forward's choice between memory and memory_kv
    "        if (memory is None) == (memory_kv is None):\n"
    '            raise ValueError("pass exactly one of memory or memory_kv")\n'
    "        if memory_kv is None:\n"
    "            memory_kv = self.project_memory(memory)  # computed here only when not given\n"
)


# -- cross_attention_mask ----------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "cross_attention_mask", "PyTorch's key_padding_mask polarity: True at the padding",
        ("    allowed = memory_is_real[:, None, None, :]", "    allowed = ~memory_is_real[:, None, None, :]"))

patched(MUTANTS, LESSON, "cross_attention_mask", "adds a causal triangle, as in self-attention",
        (_REPEAT, "    causal = torch.ones(T, allowed.shape[-1], dtype=torch.bool).tril()  # (T, S)\n"
                  "    return causal[None, None] & allowed"))

patched(MUTANTS, LESSON, "cross_attention_mask", "(B, 1, 1, S): ignores T and relies on broadcasting",
        (_REPEAT, "    return allowed"))


# -- CrossAttention ----------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "CrossAttention", "ignores memory_kv and always projects the memory",
        (_MEMORY_OR_KV + "        k, v = memory_kv", "        k, v = self.project_memory(memory)"))

patched(MUTANTS, LESSON, "CrossAttention", "project_memory leaves the heads unsplit: (B, S, D)",
        ("        k = split_heads(self.k_proj(memory), self.n_heads)", "        k = self.k_proj(memory)"),
        ("        v = split_heads(self.v_proj(memory), self.n_heads)", "        v = self.v_proj(memory)"),
        ("        k, v = memory_kv  # (B, H, S, Dh) each\n",
         "        k, v = memory_kv\n"
         "        if k.dim() == 3:  # split here instead\n"
         "            k, v = split_heads(k, self.n_heads), split_heads(v, self.n_heads)\n"))

patched(MUTANTS, LESSON, "CrossAttention", "copy-paste: the values come from k_proj",
        ("        v = split_heads(self.v_proj(memory), self.n_heads)",
         "        v = split_heads(self.k_proj(memory), self.n_heads)"))

patched(MUTANTS, LESSON, "CrossAttention", "given both memory and memory_kv, silently prefers the memory",
        (_MEMORY_OR_KV, "        if memory is not None:\n            memory_kv = self.project_memory(memory)\n"))

patched(MUTANTS, LESSON, "cross_attention_mask",
        "returns an expand view: writing into it writes into the caller's mask",
        (_REPEAT, "    return allowed.expand(-1, 1, T, -1)"))


# -- CachedCrossAttention (find the bug) --------------------------------------------------------------------------
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
