"""Wrong answers to lesson 09-kv-cache.

Each is written as a student would type it in the notebook, where ``torch``, ``nn``, ``split_heads``,
``merge_heads``, ``attention``, ``KVCache``, ``cached_causal_mask`` and ``decode_step`` exist.
"""

import torch

from autograder.mutants import mutant, patched, shown_bug
from autograder.reference.multi_head import attention, merge_heads, split_heads  # noqa: F401

MUTANTS: list = []


# -- KVCache -----------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "KVCache", "appends along the heads axis (dim 1) instead of the sequence axis")
class KVCache:
    def __init__(self, n_layers=1):
        self.keys = [None] * n_layers
        self.values = [None] * n_layers

    def update(self, k, v, layer_idx=0):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=1)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=1)
        return self.keys[layer_idx], self.values[layer_idx]

    def reorder(self, index):
        self.keys = [None if k is None else k[index] for k in self.keys]
        self.values = [None if v is None else v[index] for v in self.values]

    @property
    def length(self):
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    @property
    def positions(self):
        return torch.arange(self.length)


@mutant(MUTANTS, "KVCache", "one slot for every layer: layer_idx ignored")
class KVCache:  # noqa: F811 - each mutant is a separate wrong answer
    def __init__(self, n_layers=1):
        self.k = None
        self.v = None

    def update(self, k, v, layer_idx=0):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reorder(self, index):
        if self.k is not None:
            self.k, self.v = self.k[index], self.v[index]

    @property
    def length(self):
        return 0 if self.k is None else self.k.shape[2]

    @property
    def positions(self):
        return torch.arange(self.length)


@mutant(MUTANTS, "KVCache", "length counts calls to update, not positions")
class KVCache:  # noqa: F811
    def __init__(self, n_layers=1):
        self.keys = [None] * n_layers
        self.values = [None] * n_layers
        self.calls = 0

    def update(self, k, v, layer_idx=0):
        if layer_idx == 0:
            self.calls += 1
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def reorder(self, index):
        self.keys = [None if k is None else k[index] for k in self.keys]
        self.values = [None if v is None else v[index] for v in self.values]

    @property
    def length(self):
        return self.calls

    @property
    def positions(self):
        return torch.arange(self.length)


@mutant(MUTANTS, "KVCache", "reorder moves the keys only: the values stay with the old beams")
class KVCache:  # noqa: F811
    def __init__(self, n_layers=1):
        self.keys = [None] * n_layers
        self.values = [None] * n_layers

    def update(self, k, v, layer_idx=0):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def reorder(self, index):
        self.keys = [None if k is None else k[index] for k in self.keys]

    @property
    def length(self):
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    @property
    def positions(self):
        return torch.arange(self.length)


# -- cached_causal_mask ------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "cached_causal_mask", "top-left triangle, as is_causal=True builds it")
def cached_causal_mask(q_positions, k_len):
    return torch.ones(len(q_positions), k_len, dtype=torch.bool).tril()


@mutant(MUTANTS, "cached_causal_mask", "strictly earlier keys: a token cannot see itself")
def cached_causal_mask(q_positions, k_len):  # noqa: F811
    return torch.arange(k_len)[None, :] < q_positions[:, None]


@mutant(MUTANTS, "cached_causal_mask", "positions taken as 0 .. T-1, whatever q_positions says")
def cached_causal_mask(q_positions, k_len):  # noqa: F811
    return torch.arange(k_len)[None, :] <= torch.arange(len(q_positions))[:, None]


# -- decode_step -------------------------------------------------------------------------------------------------------
@mutant(MUTANTS, "decode_step", "positional encodings of rows 0.. instead of the absolute positions")
@torch.no_grad()
def decode_step(model, token_ids, memory_kv, cache, position, src_is_real=None):
    T_new = token_ids.shape[1]
    q_positions = torch.arange(position, position + T_new)
    x = model.pos_encoding(model.tgt_embed(token_ids) * model.embed_scale)
    cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]
    for i, layer in enumerate(model.decoder.layers):
        pre, attn = layer.norm_first, layer.self_attn
        h = layer.norm1(x) if pre else x
        q = split_heads(attn.q_proj(h), attn.n_heads)
        k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads), split_heads(attn.v_proj(h), attn.n_heads), i)
        out, _ = attention(q, k, v, cached_causal_mask(q_positions, k.shape[2]), dropout=attn.dropout)
        sa = layer.dropout1(attn.out_proj(merge_heads(out)))
        x = x + sa if pre else layer.norm1(x + sa)
        h = layer.norm2(x) if pre else x
        ca = layer.dropout2(layer.cross_attn(h, memory_kv=memory_kv[i], allowed=cross_allowed)[0])
        x = x + ca if pre else layer.norm2(x + ca)
        h = layer.norm3(x) if pre else x
        ff = layer.dropout3(layer.feed_forward(h))
        x = x + ff if pre else layer.norm3(x + ff)
    return model.out_proj(model.decoder.norm(x[:, -1])), cache


@mutant(MUTANTS, "decode_step", "no mask in the cached self-attention: a prefill sees its own future")
@torch.no_grad()
def decode_step(model, token_ids, memory_kv, cache, position, src_is_real=None):  # noqa: F811
    T_new = token_ids.shape[1]
    pe = model.pos_encoding
    x = pe.dropout(model.tgt_embed(token_ids) * model.embed_scale + pe.pe[position : position + T_new])
    cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]
    for i, layer in enumerate(model.decoder.layers):
        pre, attn = layer.norm_first, layer.self_attn
        h = layer.norm1(x) if pre else x
        q = split_heads(attn.q_proj(h), attn.n_heads)
        k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads), split_heads(attn.v_proj(h), attn.n_heads), i)
        out, _ = attention(q, k, v, None, dropout=attn.dropout)
        sa = layer.dropout1(attn.out_proj(merge_heads(out)))
        x = x + sa if pre else layer.norm1(x + sa)
        h = layer.norm2(x) if pre else x
        ca = layer.dropout2(layer.cross_attn(h, memory_kv=memory_kv[i], allowed=cross_allowed)[0])
        x = x + ca if pre else layer.norm2(x + ca)
        h = layer.norm3(x) if pre else x
        ff = layer.dropout3(layer.feed_forward(h))
        x = x + ff if pre else layer.norm3(x + ff)
    return model.out_proj(model.decoder.norm(x[:, -1])), cache


@mutant(MUTANTS, "decode_step", "pre-LN wiring whatever norm_first says, and no final norm")
@torch.no_grad()
def decode_step(model, token_ids, memory_kv, cache, position, src_is_real=None):  # noqa: F811
    T_new = token_ids.shape[1]
    q_positions = torch.arange(position, position + T_new)
    pe = model.pos_encoding
    x = pe.dropout(model.tgt_embed(token_ids) * model.embed_scale + pe.pe[q_positions])
    cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn
        h = layer.norm1(x)
        q = split_heads(attn.q_proj(h), attn.n_heads)
        k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads), split_heads(attn.v_proj(h), attn.n_heads), i)
        out, _ = attention(q, k, v, cached_causal_mask(q_positions, k.shape[2]), dropout=attn.dropout)
        x = x + layer.dropout1(attn.out_proj(merge_heads(out)))
        x = x + layer.dropout2(layer.cross_attn(layer.norm2(x), memory_kv=memory_kv[i], allowed=cross_allowed)[0])
        x = x + layer.dropout3(layer.feed_forward(layer.norm3(x)))
    return model.out_proj(x[:, -1]), cache


@mutant(MUTANTS, "decode_step", "src_is_real ignored: the cross-attention attends to the source padding")
@torch.no_grad()
def decode_step(model, token_ids, memory_kv, cache, position, src_is_real=None):  # noqa: F811
    T_new = token_ids.shape[1]
    q_positions = torch.arange(position, position + T_new)
    pe = model.pos_encoding
    x = pe.dropout(model.tgt_embed(token_ids) * model.embed_scale + pe.pe[q_positions])
    for i, layer in enumerate(model.decoder.layers):
        pre, attn = layer.norm_first, layer.self_attn
        h = layer.norm1(x) if pre else x
        q = split_heads(attn.q_proj(h), attn.n_heads)
        k, v = cache.update(split_heads(attn.k_proj(h), attn.n_heads), split_heads(attn.v_proj(h), attn.n_heads), i)
        out, _ = attention(q, k, v, cached_causal_mask(q_positions, k.shape[2]), dropout=attn.dropout)
        sa = layer.dropout1(attn.out_proj(merge_heads(out)))
        x = x + sa if pre else layer.norm1(x + sa)
        h = layer.norm2(x) if pre else x
        ca = layer.dropout2(layer.cross_attn(h, memory_kv=memory_kv[i])[0])
        x = x + ca if pre else layer.norm2(x + ca)
        h = layer.norm3(x) if pre else x
        ff = layer.dropout3(layer.feed_forward(h))
        x = x + ff if pre else layer.norm3(x + ff)
    return model.out_proj(model.decoder.norm(x[:, -1])), cache


# -- greedy_decode_cached ----------------------------------------------------------------------------------------------
@mutant(MUTANTS, "greedy_decode_cached", "the position never advances: every token at position 0")
@torch.no_grad()
def greedy_decode_cached(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = KVCache(len(model.decoder.layers))
    token = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    generated = []
    for _ in range(max_len):
        logits, cache = decode_step(model, token, memory_kv, cache, 0, src_is_real)
        next_id = logits.argmax(-1).masked_fill(finished, pad_id)
        generated.append(next_id)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
        token = next_id[:, None]
    return torch.stack(generated, dim=1) if generated else torch.zeros(B, 0, dtype=torch.long)


@mutant(MUTANTS, "greedy_decode_cached", "the memory projected again at every step")
@torch.no_grad()
def greedy_decode_cached(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    cache = KVCache(len(model.decoder.layers))
    token = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    generated = []
    for position in range(max_len):
        memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
        logits, cache = decode_step(model, token, memory_kv, cache, position, src_is_real)
        next_id = logits.argmax(-1).masked_fill(finished, pad_id)
        generated.append(next_id)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
        token = next_id[:, None]
    return torch.stack(generated, dim=1) if generated else torch.zeros(B, 0, dtype=torch.long)


@mutant(MUTANTS, "greedy_decode_cached", "finished rows keep their tokens: no padding after EOS")
@torch.no_grad()
def greedy_decode_cached(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0):  # noqa: F811
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = KVCache(len(model.decoder.layers))
    token = torch.full((B, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    generated = []
    for position in range(max_len):
        logits, cache = decode_step(model, token, memory_kv, cache, position, src_is_real)
        next_id = logits.argmax(-1)
        generated.append(next_id)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
        token = next_id[:, None]
    return torch.stack(generated, dim=1) if generated else torch.zeros(B, 0, dtype=torch.long)


# The definitions above rebound these names to wrong answers; a wrong answer that calls another exercise must
# find the correct one, as in a notebook where only that one exercise is wrong.
from autograder.reference.kv_cache import KVCache, cached_causal_mask, decode_step  # noqa: E402, F401, F811

# -- beam_search_cached ------------------------------------------------------------------------------------------------

@mutant(MUTANTS, "beam_search_cached", "the cache is never reordered: each beam attends to another beam's past")
@torch.no_grad()
def beam_search_cached(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,
                       src_is_real=None, pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = KVCache(len(model.decoder.layers))
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"))
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool)
    lengths = torch.zeros(B, K, dtype=torch.long)
    for position in range(max_len):
        logits, cache = decode_step(model, tgt[:, -1:], memory_kv, cache, position, beam_is_real)
        log_probs = logits.float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"))
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        was_finished = finished.gather(1, beam_idx)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    best = (scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty).argmax(-1)
    best_ids = tgt.view(B, K, -1)[torch.arange(B), best, 1:]
    return best_ids[:, : int(lengths.gather(1, best[:, None]).max())]


@mutant(MUTANTS, "beam_search_cached", "the cache reordered by beam_idx (0..K-1), not by row b * K + beam_idx")
@torch.no_grad()
def beam_search_cached(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,  # noqa: F811
                       src_is_real=None, pad_id=0):
    B, K = src_ids.shape[0], beam_size
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = KVCache(len(model.decoder.layers))
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"))
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool)
    lengths = torch.zeros(B, K, dtype=torch.long)
    for position in range(max_len):
        logits, cache = decode_step(model, tgt[:, -1:], memory_kv, cache, position, beam_is_real)
        log_probs = logits.float().log_softmax(-1).view(B, K, -1)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"))
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)
        scores, flat_idx = (scores[..., None] + log_probs).view(B, K * V).topk(K, dim=-1)
        beam_idx, token = flat_idx // V, flat_idx % V
        rows = (torch.arange(B)[:, None] * K + beam_idx).view(-1)
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)
        cache.reorder(beam_idx.view(-1))
        was_finished = finished.gather(1, beam_idx)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    best = (scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty).argmax(-1)
    best_ids = tgt.view(B, K, -1)[torch.arange(B), best, 1:]
    return best_ids[:, : int(lengths.gather(1, best[:, None]).max())]


# -- prefill (find the bug) ------------------------------------------------------------------------------------------
shown_bug(MUTANTS, "09-kv-cache", "prefill",
          "chunk i fed at position i, its index, instead of i * chunk_size")
FED = "decode_step(model, chunk, memory_kv, cache, i * chunk_size, src_is_real)"
patched(MUTANTS, "09-kv-cache", "prefill",
        "a wrong fix: each chunk fed at the position of its last token",
        (FED, "decode_step(model, chunk, memory_kv, cache, (i + 1) * chunk_size - 1, src_is_real)"))
patched(MUTANTS, "09-kv-cache", "prefill",
        "a wrong fix: chunk i fed at i times its own length: a shorter last chunk lands too early",
        (FED, "decode_step(model, chunk, memory_kv, cache, i * chunk.shape[1], src_is_real)"))
