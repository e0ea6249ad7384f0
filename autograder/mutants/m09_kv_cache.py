"""Wrong answers to lesson 09-kv-cache.

Each is the reference's own code with a line or a few changed (``patched``), as a student would get it wrong in
the notebook, where ``torch``, ``nn``, ``split_heads``, ``merge_heads``, ``attention``, ``KVCache``,
``cached_causal_mask`` and ``decode_step`` exist.
"""

from autograder.mutants import patched, shown_bug

MUTANTS: list = []
LESSON = "09-kv-cache"


# -- KVCache -----------------------------------------------------------------------------------------------------------
APPEND_K = "self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)"
APPEND_V = "self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)"
patched(MUTANTS, LESSON, "KVCache", "appends along the heads axis (dim 1) instead of the sequence axis",
        (APPEND_K, APPEND_K.replace("dim=2", "dim=1")), (APPEND_V, APPEND_V.replace("dim=2", "dim=1")))
patched(MUTANTS, LESSON, "KVCache", "one slot for every layer: layer_idx ignored",
        ("        if self.keys[layer_idx] is None:",
         "        layer_idx = 0  # one slot is enough\n        if self.keys[layer_idx] is None:"))
patched(MUTANTS, LESSON, "KVCache", "length counts calls to update, not positions",
        ("self.values: list[torch.Tensor | None] = [None] * n_layers",
         "self.values: list[torch.Tensor | None] = [None] * n_layers\n        self.calls = 0"),
        ("        if self.keys[layer_idx] is None:",
         "        if layer_idx == 0:\n            self.calls += 1\n        if self.keys[layer_idx] is None:"),
        ("return 0 if self.keys[0] is None else self.keys[0].shape[2]", "return self.calls"))
patched(MUTANTS, LESSON, "KVCache", "reorder moves the keys only: the values stay with the old beams",
        ("self.keys[i], self.values[i] = k.index_select(0, index), v.index_select(0, index)",
         "self.keys[i] = k.index_select(0, index)"))


# -- cached_causal_mask ------------------------------------------------------------------------------------------------
ALIGNED = "return k_positions[None, :] <= q_positions[:, None]"
patched(MUTANTS, LESSON, "cached_causal_mask", "top-left triangle, as is_causal=True builds it",
        (ALIGNED, "return torch.ones(len(q_positions), k_len, dtype=torch.bool).tril()"))
patched(MUTANTS, LESSON, "cached_causal_mask", "strictly earlier keys: a token cannot see itself",
        (ALIGNED, "return k_positions[None, :] < q_positions[:, None]"))
patched(MUTANTS, LESSON, "cached_causal_mask", "positions taken as 0 .. T-1, whatever q_positions says",
        (ALIGNED, "return k_positions[None, :] <= torch.arange(len(q_positions))[:, None]"))


# -- decode_step -------------------------------------------------------------------------------------------------------
patched(MUTANTS, LESSON, "decode_step", "positional encodings of rows 0.. instead of the absolute positions",
        ("rows = pe.pe[position : position + T_new]", "rows = pe.pe[:T_new]"))
patched(MUTANTS, LESSON, "decode_step", "no mask in the cached self-attention: a prefill sees its own future",
        ("out, _ = attention(q, k, v, allowed,", "out, _ = attention(q, k, v, None,"))
patched(MUTANTS, LESSON, "decode_step", "pre-LN wiring whatever norm_first says, and no final norm",
        ("pre = layer.norm_first", "pre = True"),
        ("model.out_proj(model.decoder.norm(x[:, -1]))", "model.out_proj(x[:, -1])"))
patched(MUTANTS, LESSON, "decode_step", "src_is_real ignored: the cross-attention attends to the source padding",
        ("cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]",
         "cross_allowed = None"))


# -- greedy_decode_cached ----------------------------------------------------------------------------------------------
STEP = "logits, cache = decode_step(model, token, memory_kv, cache, position, src_is_real)"
PROJECTED = "memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]"
patched(MUTANTS, LESSON, "greedy_decode_cached", "the position never advances: every token at position 0",
        (STEP, "logits, cache = decode_step(model, token, memory_kv, cache, 0, src_is_real)"))
patched(MUTANTS, LESSON, "greedy_decode_cached", "the memory projected again at every step",
        ("    # cross-attention keys/values: once per layer for the whole generation\n    " + PROJECTED + "\n", ""),
        (STEP, PROJECTED + "\n        " + STEP))
patched(MUTANTS, LESSON, "greedy_decode_cached", "finished rows keep their tokens: no padding after EOS",
        ("logits.argmax(-1).masked_fill(finished, pad_id)", "logits.argmax(-1)"))


# -- beam_search_cached ------------------------------------------------------------------------------------------------
REORDER = "cache.reorder(rows)  # the cached keys/values follow their beams, exactly as the histories do"
patched(MUTANTS, LESSON, "beam_search_cached",
        "the cache is never reordered: each beam attends to another beam's past",
        ("        " + REORDER + "\n", ""))
patched(MUTANTS, LESSON, "beam_search_cached",
        "the cache reordered by beam_idx (0..K-1), not by row b * K + beam_idx",
        (REORDER, "cache.reorder(beam_idx.view(-1))"))
patched(MUTANTS, LESSON, "beam_search_cached",
        "no length penalty: the final pick compares raw log-probabilities whatever length_penalty says",
        (" / ((5.0 + lengths.float()) / 6.0) ** length_penalty", ""))
patched(MUTANTS, LESSON, "beam_search_cached",
        "each step ranks its candidates by the new token's log-probability alone, not the beam's running total",
        ("candidates = (scores[..., None] + log_probs)", "candidates = (0.0 * scores[..., None] + log_probs)"))


# -- prefill (find the bug) ------------------------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "prefill",
          "chunk i fed at position i, its index, instead of i * chunk_size")
FED = "decode_step(model, chunk, memory_kv, cache, i * chunk_size, src_is_real)"
patched(MUTANTS, LESSON, "prefill",
        "a wrong fix: each chunk fed at the position of its last token",
        (FED, "decode_step(model, chunk, memory_kv, cache, (i + 1) * chunk_size - 1, src_is_real)"))
patched(MUTANTS, LESSON, "prefill",
        "a wrong fix: chunk i fed at i times its own length: a shorter last chunk lands too early",
        (FED, "decode_step(model, chunk, memory_kv, cache, i * chunk.shape[1], src_is_real)"))
