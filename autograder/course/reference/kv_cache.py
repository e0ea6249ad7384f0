"""Reference for lesson 09-kv-cache (PyTorch): decode one token at a time without recomputing the past.

At step t plain greedy decoding re-runs the decoder on all t tokens, although the keys and values of positions
0 .. t-1 have not changed (the causal mask guarantees it). A KV cache keeps each layer's self-attention keys
and values and appends one position per step; cross-attention keys and values depend only on the memory, so
they are projected once per layer before decoding starts (``CrossAttention.project_memory``).

The cache is an explicit object passed in and returned (never hidden module state), as in Hugging Face's cache
utilities: one ``KVCache`` for the whole decoder, ``update(k, v, layer_idx)`` per layer.
"""

import torch
from torch import nn

from autograder.course.reference.model import Seq2SeqTransformer  # noqa: F401 - given in the lesson; graded by name
from autograder.course.reference.multi_head import attention, merge_heads, split_heads


class KVCache:
    """Self-attention keys and values of every position decoded so far, one (k, v) pair of tensors per layer.

    New positions are appended on the sequence axis (dim 2); the caller's ``k`` and ``v`` are unchanged.

    ``update(k, v, layer_idx)`` appends the new positions of one layer and returns everything cached for it
    (``update(k, v)`` alone is ``layer_idx=0``: a one-layer cache). ``length`` is the number of cached positions;
    they are the absolute positions ``0 .. length - 1`` (``positions``).

    Shape:
        k, v: (B, H, T_new, Dh) -> k_all, v_all: (B, H, S, Dh) with S = positions cached so far
    """

    def __init__(self, n_layers: int = 1):
        ### BEGIN SOLUTION
        # one slot per layer: None until that layer's first update
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        ### END SOLUTION

    def update(
        self, k: torch.Tensor, v: torch.Tensor, layer_idx: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values for one layer; return all of that layer's keys and values.

        Shape:
            k, v: (B, H, T_new, Dh) -> k_all, v_all: (B, H, S_so_far + T_new, Dh)
        """
        ### BEGIN SOLUTION
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            # new positions go after the old ones along the sequence axis (dim 2 of (B, H, S, Dh))
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)  # (B, H, S + T_new, Dh)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)  # (B, H, S + T_new, Dh)
        return self.keys[layer_idx], self.values[layer_idx]
        ### END SOLUTION

    @property
    def length(self) -> int:
        """Number of positions cached (in layer 0; every layer has the same count between decoding steps)."""
        ### BEGIN SOLUTION
        return 0 if self.keys[0] is None else self.keys[0].shape[2]
        ### END SOLUTION

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` of every layer, in that order (beam search: row i now holds row index[i]).

        Rows may repeat (a beam extended twice) or disappear (a beam dropped); positions are unchanged.

        Shape:
            index: (B_new,) int64 -> every layer's k, v: (B, H, S, Dh) -> (B_new, H, S, Dh)
        """
        ### BEGIN SOLUTION
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None:
                # the batch axis is dim 0; index_select makes new tensors, so no two rows share storage
                self.keys[i], self.values[i] = k.index_select(0, index), v.index_select(0, index)
        ### END SOLUTION

    @property
    def positions(self) -> torch.Tensor:
        """The absolute positions held in the cache, ``0 .. length - 1``.

        Shape:
            (S,) int64
        """
        ### BEGIN SOLUTION
        device = None if self.keys[0] is None else self.keys[0].device
        return torch.arange(self.length, device=device)  # (S,)
        ### END SOLUTION


def cached_causal_mask(q_positions: torch.Tensor, k_len: int) -> torch.Tensor:
    """Causal mask for queries at absolute positions ``q_positions`` over keys at positions 0 .. k_len - 1.

    The caller's ``q_positions`` are unchanged.

    Aligned to absolute positions (key k is allowed when k <= the query's position): with a cache T < S and
    the triangle's corner is bottom-right, unlike ``is_causal=True``, whose top-left triangle fits only
    T == S.

    Shape:
        q_positions: (T,) int -> allowed: (T, S) bool with S = k_len
    """
    ### BEGIN SOLUTION
    k_positions = torch.arange(k_len, device=q_positions.device)  # (S,)
    return k_positions[None, :] <= q_positions[:, None]  # (T, S)
    ### END SOLUTION


@torch.inference_mode()  # no_grad, and no autograd bookkeeping of versions and views: a step is many tiny ops
def decode_step(
    model: nn.Module,
    token_ids: torch.Tensor,
    memory_kv: list,
    cache: KVCache,
    position: int,
    src_is_real: torch.Tensor | None = None,
) -> tuple[torch.Tensor, KVCache]:
    """Run the decoder on new tokens only, reusing cached self-attention keys/values; return the last logits.

    ``src_is_real`` masks the source padding in every layer's cross-attention (``allowed = src_is_real[:, None,
    None, :]``); the logits equal the full decoder's at the same positions, and the returned cache holds every
    position so far, in every layer.

    ``token_ids`` hold the tokens at absolute positions ``position .. position + T_new - 1`` (usually one
    token; several tokens prefill the cache). ``memory_kv[i]`` is layer i's
    ``cross_attn.project_memory(memory)``. Works for both norm placements; dropout is applied as in the layers
    (call ``model.eval()`` first).

    Shape:
        token_ids: (B, T_new), memory_kv: per layer ((B, H, S, Dh), (B, H, S, Dh)),
        src_is_real: (B, S) bool or None
        -> logits: (B, V) for the last new position, and the updated cache
    """
    ### BEGIN SOLUTION
    T_new = token_ids.shape[1]
    q_positions = torch.arange(position, position + T_new, device=token_ids.device)  # (T_new,) absolute
    # these tokens' position encodings are rows position .. position + T_new - 1 of the table, not rows 0..
    pe = model.pos_encoding
    rows = pe.pe[position : position + T_new]  # (T_new, D): a slice of the table, no index lookup
    x = model.tgt_embed(token_ids) * model.embed_scale + rows  # (B, T_new, D)
    # dropout is the identity in eval mode, as in generation: skip its calls there (each costs time, and a
    # cached step is dozens of tiny calls); in train mode it is applied exactly as in the layers
    train = model.training
    x = pe.dropout(x) if train else x
    cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]  # (B, 1, 1, S)
    for i, layer in enumerate(model.decoder.layers):
        # the same three sublayers and residual wiring as DecoderLayer.forward; pre-LN normalises the
        # sublayer's input, post-LN the residual sum
        pre = layer.norm_first
        # 1. self-attention over the cached past plus the new positions
        attn, h = layer.self_attn, (layer.norm1(x) if pre else x)
        q = split_heads(attn.q_proj(h), attn.n_heads)  # (B, H, T_new, Dh)
        k_new = split_heads(attn.k_proj(h), attn.n_heads)  # (B, H, T_new, Dh)
        v_new = split_heads(attn.v_proj(h), attn.n_heads)  # (B, H, T_new, Dh)
        k, v = cache.update(k_new, v_new, i)  # (B, H, S_self, Dh): every position so far
        # aligned to absolute positions: new query t sees cached keys 0 .. position + t
        allowed = cached_causal_mask(q_positions, k.shape[2])  # (T_new, S_self)
        out, _ = attention(q, k, v, allowed, dropout=attn.dropout if train else None)  # (B, H, T_new, Dh)
        sa = attn.out_proj(merge_heads(out))  # (B, T_new, D)
        sa = layer.dropout1(sa) if train else sa
        x = x + sa if pre else layer.norm1(x + sa)
        # 2. cross-attention with the memory's keys/values projected once, before decoding started
        h = layer.norm2(x) if pre else x
        out, _ = layer.cross_attn(h, memory_kv=memory_kv[i], allowed=cross_allowed)  # (B, T_new, D)
        ca = layer.dropout2(out) if train else out
        x = x + ca if pre else layer.norm2(x + ca)
        # 3. feed-forward, position by position
        h = layer.norm3(x) if pre else x
        ff = layer.feed_forward(h)  # (B, T_new, D)
        ff = layer.dropout3(ff) if train else ff
        x = x + ff if pre else layer.norm3(x + ff)
    logits = model.out_proj(model.decoder.norm(x[:, -1]))  # (B, V): only the last position predicts
    return logits, cache
    ### END SOLUTION


@torch.inference_mode()
def greedy_decode_cached(
    model: nn.Module,
    src_ids: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Greedy decoding with a KV cache: the same tokens as ``greedy_decode``, one decoder position per step.

    The memory's cross-attention keys and values are projected once per layer for the whole generation
    (``cross_attn.project_memory`` before the loop, then ``memory_kv`` at every step); ``src_ids`` is unchanged.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, L), L <= max_len, without BOS,
        ``pad_id`` after each row's EOS
    """
    ### BEGIN SOLUTION
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_is_real)  # (B, S, D)
    # cross-attention keys/values: once per layer for the whole generation
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]
    cache = KVCache(len(model.decoder.layers))
    # the decoder input of each step is the newest token only, BOS first
    token = torch.full((B, 1), bos_id, dtype=torch.long, device=src_ids.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src_ids.device)  # (B,)
    generated = []
    for position in range(max_len):
        logits, cache = decode_step(model, token, memory_kv, cache, position, src_is_real)  # (B, V)
        next_id = logits.argmax(-1).masked_fill(finished, pad_id)  # (B,): finished rows only pad
        generated.append(next_id)
        finished = finished | (next_id == eos_id)
        if bool(finished.all()):
            break
        token = next_id[:, None]  # (B, 1): the only input of the next step
    if not generated:
        return torch.zeros(B, 0, dtype=torch.long, device=src_ids.device)
    return torch.stack(generated, dim=1)  # (B, L)
    ### END SOLUTION


@torch.inference_mode()
def beam_search_cached(
    model: nn.Module,
    src_ids: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    src_is_real: torch.Tensor | None = None,
    pad_id: int = 0,
) -> torch.Tensor:
    """Lesson 08's ``beam_search`` with a KV cache: the same beams, the same scores, one new position per step.

    Every step runs ``decode_step`` on each beam's newest token only. After the top-k, beam j of row b continues
    the beam it was extended from (``beam_idx``), so the cache is reordered with ``cache.reorder(rows)``, the
    same row index that reorders the token histories. The memory's cross-attention keys and values are projected
    once per layer, for all beams at once (the memory repeated beam_size times along the batch). Ranking, length
    normalisation, EOS and padding are ``beam_search``'s; ``src_ids`` is unchanged.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, L), L <= max_len, without BOS,
        ``pad_id`` after each row's EOS
    """
    ### BEGIN SOLUTION
    B, K, device = src_ids.shape[0], beam_size, src_ids.device
    memory = model.encode(src_ids, src_is_real).repeat_interleave(K, dim=0)  # (B*K, S, D): row b*K + j
    beam_is_real = None if src_is_real is None else src_is_real.repeat_interleave(K, dim=0)  # (B*K, S)
    memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]  # once per layer
    cache = KVCache(len(model.decoder.layers))
    tgt = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)  # (B*K, 1): histories, BOS first
    scores = torch.full((B, K), float("-inf"), device=device)  # (B, K): only beam 0 alive at the start
    scores[:, 0] = 0.0
    finished = torch.zeros(B, K, dtype=torch.bool, device=device)  # (B, K)
    lengths = torch.zeros(B, K, dtype=torch.long, device=device)  # (B, K): tokens generated up to EOS
    for position in range(max_len):
        # only the newest token of each beam: the cache holds the keys and values of all earlier positions
        logits, cache = decode_step(model, tgt[:, -1:], memory_kv, cache, position, beam_is_real)  # (B*K, V)
        log_probs = logits.float().log_softmax(-1).view(B, K, -1)  # (B, K, V)
        V = log_probs.shape[-1]
        pad_only = torch.full((V,), float("-inf"), device=device)  # a finished beam continues with PAD, free
        pad_only[pad_id] = 0.0
        log_probs = torch.where(finished[..., None], pad_only, log_probs)  # (B, K, V)
        candidates = (scores[..., None] + log_probs).view(B, K * V)  # (B, K*V): every beam x every token
        scores, flat_idx = candidates.topk(K, dim=-1)  # (B, K)
        beam_idx, token = flat_idx // V, flat_idx % V  # (B, K): the parent beam and the new token
        rows = (torch.arange(B, device=device)[:, None] * K + beam_idx).view(-1)  # (B*K,): parent rows
        tgt = torch.cat([tgt[rows], token.view(-1, 1)], dim=1)  # (B*K, T + 1)
        cache.reorder(rows)  # the cached keys/values follow their beams, exactly as the histories do
        was_finished = finished.gather(1, beam_idx)  # (B, K)
        lengths = lengths.gather(1, beam_idx) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()):
            break
    normalised = scores / ((5.0 + lengths.float()) / 6.0) ** length_penalty  # (B, K): GNMT, as beam_search
    best = normalised.argmax(-1)  # (B,)
    best_ids = tgt.view(B, K, -1)[torch.arange(B, device=device), best, 1:]  # (B, steps): drop BOS
    L = int(lengths.gather(1, best[:, None]).max())
    return best_ids[:, :L]  # (B, L)
    ### END SOLUTION


@torch.inference_mode()
def prefill(
    model: nn.Module,
    prefix_ids: torch.Tensor,
    memory_kv: list,
    cache: KVCache,
    chunk_size: int,
    src_is_real: torch.Tensor | None = None,
) -> tuple[torch.Tensor, KVCache]:
    """Feed a known prefix into an empty cache, ``chunk_size`` tokens per ``decode_step`` call (find the bug).

    Chunked prefill, as inference servers feed long prompts: the chunks are the prefix's tokens in order (the last
    may be shorter), and the result is that of one ``decode_step`` on the whole prefix at position 0, whatever
    ``chunk_size``: the logits of the prefix's last position, equal to the full decoder's there, and the cache
    holding all P positions in every layer, ready for the next token at position P. ``memory_kv`` and
    ``src_is_real`` are ``decode_step``'s; ``prefix_ids`` is unchanged.

    Shape:
        prefix_ids: (B, P) BOS first, memory_kv: per layer ((B, H, S, Dh), (B, H, S, Dh)),
        src_is_real: (B, S) bool or None -> logits: (B, V), and the cache
    """
    P = prefix_ids.shape[1]
    n_chunks = (P + chunk_size - 1) // chunk_size  # the last chunk may be shorter
    for i in range(n_chunks):
        chunk = prefix_ids[:, i * chunk_size : (i + 1) * chunk_size]  # (B, <= chunk_size)
        ### BEGIN SOLUTION
        # decode_step's position is the absolute position of the chunk's first token: chunk i starts at token
        # i * chunk_size (the cache's length so far), not at position i
        logits, cache = decode_step(model, chunk, memory_kv, cache, i * chunk_size, src_is_real)  # (B, V)
        ### END SOLUTION
        ### BEGIN BUG
        # logits, cache = decode_step(model, chunk, memory_kv, cache, i, src_is_real)  # (B, V)
        ### END BUG
    return logits, cache


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

APPEND_K = "self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)"
APPEND_V = "self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)"
ALIGNED = "return k_positions[None, :] <= q_positions[:, None]"
STEP = "logits, cache = decode_step(model, token, memory_kv, cache, position, src_is_real)"
PROJECTED = "memory_kv = [layer.cross_attn.project_memory(memory) for layer in model.decoder.layers]"
REORDER = "cache.reorder(rows)  # the cached keys/values follow their beams, exactly as the histories do"
FED = "decode_step(model, chunk, memory_kv, cache, i * chunk_size, src_is_real)"
MISTAKES = [
    ("KVCache", "appends along the heads axis (dim 1) instead of the sequence axis",
     (APPEND_K, APPEND_K.replace("dim=2", "dim=1")), (APPEND_V, APPEND_V.replace("dim=2", "dim=1"))),
    ("KVCache", "one slot for every layer: layer_idx ignored",
     ("        if self.keys[layer_idx] is None:",
      "        layer_idx = 0  # one slot is enough\n        if self.keys[layer_idx] is None:")),
    ("KVCache", "length counts calls to update, not positions",
     ("self.values: list[torch.Tensor | None] = [None] * n_layers",
      "self.values: list[torch.Tensor | None] = [None] * n_layers\n        self.calls = 0"),
     ("        if self.keys[layer_idx] is None:",
      "        if layer_idx == 0:\n            self.calls += 1\n        if self.keys[layer_idx] is None:"),
     ("return 0 if self.keys[0] is None else self.keys[0].shape[2]", "return self.calls")),
    ("KVCache", "reorder moves layer 0 only: the other layers keep their old batch rows",
     ("enumerate(zip(self.keys, self.values, strict=True))",
      "enumerate(zip(self.keys[:1], self.values[:1], strict=True))")),
    ("KVCache", "reorder moves the keys only: the values stay with the old beams",
     ("self.keys[i], self.values[i] = k.index_select(0, index), v.index_select(0, index)",
      "self.keys[i] = k.index_select(0, index)")),
    ("cached_causal_mask", "top-left triangle, as is_causal=True builds it",
     (ALIGNED, "return torch.ones(len(q_positions), k_len, dtype=torch.bool).tril()")),
    ("cached_causal_mask", "strictly earlier keys: a token cannot see itself",
     (ALIGNED, "return k_positions[None, :] < q_positions[:, None]")),
    ("cached_causal_mask", "positions taken as 0 .. T-1, whatever q_positions says",
     (ALIGNED, "return k_positions[None, :] <= torch.arange(len(q_positions))[:, None]")),
    ("decode_step", "positional encodings of rows 0.. instead of the absolute positions",
     ("rows = pe.pe[position : position + T_new]", "rows = pe.pe[:T_new]")),
    ("decode_step", "no mask in the cached self-attention: a prefill sees its own future",
     ("out, _ = attention(q, k, v, allowed,", "out, _ = attention(q, k, v, None,")),
    ("decode_step", "pre-LN wiring whatever norm_first says, and no final norm",
     ("pre = layer.norm_first", "pre = True"),
     ("model.out_proj(model.decoder.norm(x[:, -1]))", "model.out_proj(x[:, -1])")),
    ("decode_step", "no dropout of its own in training mode (only the modules it calls drop out), where the "
     "docstring applies it as in the layers",
     ("    train = model.training\n", "    train = False\n")),
    ("decode_step", "src_is_real ignored: the cross-attention attends to the source padding",
     ("cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]",
      "cross_allowed = None")),
    ("greedy_decode_cached", "the position never advances: every token at position 0",
     (STEP, "logits, cache = decode_step(model, token, memory_kv, cache, 0, src_is_real)")),
    ("greedy_decode_cached", "the memory projected again at every step",
     ("    # cross-attention keys/values: once per layer for the whole generation\n    " + PROJECTED + "\n", ""),
     (STEP, PROJECTED + "\n        " + STEP)),
    ("greedy_decode_cached", "finished rows keep their tokens: no padding after EOS",
     ("logits.argmax(-1).masked_fill(finished, pad_id)", "logits.argmax(-1)")),
    ("beam_search_cached",
     "the cache is never reordered: each beam attends to another beam's past",
     ("        " + REORDER + "\n", "")),
    ("beam_search_cached",
     "the cache reordered by beam_idx (0..K-1), not by row b * K + beam_idx",
     (REORDER, "cache.reorder(beam_idx.view(-1))")),
    ("beam_search_cached",
     "the beams given the unrepeated src_is_real: B rows of padding for B * K beams",
     ("decode_step(model, tgt[:, -1:], memory_kv, cache, position, beam_is_real)",
      "decode_step(model, tgt[:, -1:], memory_kv, cache, position, src_is_real)")),
    ("beam_search_cached",
     "no length penalty: the final pick compares raw log-probabilities whatever length_penalty says",
     (" / ((5.0 + lengths.float()) / 6.0) ** length_penalty", "")),
    ("beam_search_cached",
     "each step ranks its candidates by the new token's log-probability alone, not the beam's running total",
     ("candidates = (scores[..., None] + log_probs)", "candidates = (0.0 * scores[..., None] + log_probs)")),
    ("prefill",
     "chunk i fed at position i, its index, instead of i * chunk_size"),
    ("prefill",
     "a wrong fix: each chunk fed at the position of its last token",
     (FED, "decode_step(model, chunk, memory_kv, cache, (i + 1) * chunk_size - 1, src_is_real)")),
    ("prefill",
     "a wrong fix: chunk i fed at i times its own length: a shorter last chunk lands too early",
     (FED, "decode_step(model, chunk, memory_kv, cache, i * chunk.shape[1], src_is_real)")),
]
