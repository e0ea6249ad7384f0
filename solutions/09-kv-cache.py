# %% [markdown]
# # Lesson 09 — The KV cache: generating without recomputing the past
#
# Lesson 08's `greedy_decode` runs the whole decoder on the whole prefix at every step. To generate `L` tokens it
# processes `1 + 2 + … + L ≈ L²/2` positions, although each step adds only one. This lesson removes the waste:
#
# 1. `KVCache`: an object that keeps each layer's self-attention **keys and values** of the positions already
#    decoded, and appends one position per step;
# 2. `cached_causal_mask`: the causal mask when the queries are only the *new* positions, aligned to absolute
#    positions (and why `is_causal=True` is wrong there);
# 3. `decode_step`: run the decoder on the new token(s) only, reading the rest from the cache, with the
#    cross-attention keys and values of the memory projected **once** per layer;
# 4. `greedy_decode_cached`: greedy decoding that produces *exactly* the tokens of `greedy_decode`, and a measured
#    speed-up against the generated length.
#
# How much faster does a cache make generation? A single factor is often quoted; we will measure it, and see why
# the answer depends on the length and on the batch size. Shapes: `B` batch, `T` new (query) positions, `S` key
# positions, `H` heads, `D` width, `Dh = D // H`, `V` vocabulary; masks are boolean, `True` = may attend.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import decoder_course
from decoder_course import BOS, EOS, PAD
from decoder_course.devices import timer
from decoder_course.plots import plot_masks, plot_speedup

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it
# section 6 times decoding here: cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE overrides it)
device = decoder_course.device()
GRADING = decoder_course.grading()  # True while nbgrader grades this notebook: keep timings short

# %% [markdown]
# ## Building blocks from earlier lessons
#
# The model of lessons 03–06 and lesson 08's `greedy_decode`, given so that this lesson runs on its own. You will
# read `DecoderLayer.forward` closely: `decode_step` repeats its wiring, one new position at a time. (In a graded
# course, a release made while one of those lessons is still open runs your own code from it instead, and says so
# in the cell; grading still runs the course's versions.)

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer

# %% given=model:sinusoidal_table,PositionalEncoding,EncoderLayer,Encoder,Decoder,Seq2SeqTransformer

# %% given=generation:greedy_decode,beam_search

# %% [markdown]
# ## 1. What changes from one step to the next, and what does not
#
# A small untrained model is enough to see it (its output layer is sharpened and PAD/BOS are made impossible, so
# that its greedy outputs vary and padding stays unambiguous). Decode a prefix of 5 tokens, then the same prefix
# with one more token, and compare the logits of the first 5 positions:

# %%
def small_model(norm_first=True, seed=0, V=20):
    """An untrained Seq2SeqTransformer whose greedy outputs vary: sharpened output layer, PAD/BOS never chosen."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(V, V, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.1, tie_weights=False,
                               norm_first=norm_first).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)
        model.out_proj.bias[:2] -= 100.0
    return model


model = small_model()
src_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, PAD, PAD, PAD]])  # (B, S)
src_is_real = src_ids != PAD  # (B, S)
prefix = torch.tensor([[BOS, 4, 9, 3, 14], [BOS, 8, 8, 15, 6]])  # (B, 5)
longer = torch.cat([prefix, torch.tensor([[7], [12]])], dim=1)  # (B, 6): one more token
with torch.no_grad():
    memory = model.encode(src_ids, src_is_real)  # (B, S, D)
    short_logits = model.decode(prefix, memory, src_is_real=src_is_real)  # (B, 5, V)
    long_logits = model.decode(longer, memory, src_is_real=src_is_real)  # (B, 6, V)
print("max change of the first 5 positions' logits:", (long_logits[:, :5] - short_logits).abs().max().item())

# %% [markdown]
# Nothing changed (up to rounding): the causal mask guarantees that position `t` never sees later positions, so
# everything computed for positions `0 … t-1` (in every layer: hidden states, keys, values) is the same at every
# later step. Only the **new** position needs computing, and in each layer it needs from the past exactly two
# things: the past **keys** (to score against) and **values** (to average). Keep them, and each step costs one
# position instead of `t`.
#
# The same holds, even more simply, for cross-attention: its keys and values are projections of the *memory*,
# which does not change at all during generation. Lesson 04's `CrossAttention.project_memory(memory)` computes
# them; `forward(query, memory_kv=...)` reuses them. Project once per layer, before the first step.
#
# ![Greedy decoding with a KV cache, one layer, steps p = 0 to 3 as rows. At each step there is one new query
# (B, H, 1, Dh). The self-attention key cache and value cache, (B, H, p+1, Dh), grow by one position per step: the
# position computed at this step is outlined in bold at the end of the row, the earlier ones are kept from the
# steps before. On the right, the cross-attention keys and values of the memory, (B, H, S, Dh) each, are projected
# from the memory (B, S, D) by project_memory once, before the first step, and the same tensors are reused
# unchanged at every later step.](assets/kv_cache.png)
#
# Two kinds of keys and values, two policies: the self-attention ones grow (one position appended per step, none
# ever recomputed), the cross-attention ones are fixed (computed once from the memory). Each step's work is one
# position's projections and one query row of attention, whatever the length so far.
#
# ## 2. The cache object
#
# Hugging Face's generation code made this pattern standard: the cache is an **explicit object** passed in and
# returned, never state hidden inside the modules (a module that remembers the last call is a bug factory: two
# generations interleave, a batch is reordered by beam search, and the hidden state is silently wrong).
#
# `KVCache(n_layers)` holds one `(keys, values)` pair per layer, each `(B, H, S, Dh)` with `S` the positions
# cached so far (nothing, before the first update):
#
# - `update(k, v, layer_idx=0)` appends this step's `k, v` (`(B, H, T_new, Dh)`) to layer `layer_idx`'s entries
#   along the **sequence axis** (dim 2) and returns that layer's full keys and values;
# - `length`: the number of cached positions (layer 0's, which every layer matches between steps);
# - `positions`: the absolute positions held, `torch.arange(length)`;
# - `reorder(index)`: keep batch rows `index` of every layer's keys and values, in that order (`index` is
#   `(B_new,)`; rows may repeat or vanish). Beam search needs it in section 7: when beams are reordered, their
#   cached past must follow them.
#
# **Exercise.** Write `KVCache`. (`torch.cat` along `dim=2` appends; keep a list with one slot per layer;
# `k.index_select(0, index)` picks batch rows.)

# %% exercise=KVCache

# %% test=KVCache points=2
from decoder_course.visible import l09_kv_cache as visible

visible.check_kv_cache(KVCache)
visible.check_kv_cache_reorder(KVCache)

# %% [markdown]
# ## 3. The causal mask, aligned to absolute positions
#
# Without a cache, the self-attention is square: `T` queries against the same `T` keys, and the causal mask is the
# lower triangle. With a cache, the queries are the `T_new` new positions, at absolute positions
# `p … p + T_new - 1`, and the keys are *all* `S = p + T_new` positions. The rule does not change, **key `k` is
# allowed for a query at position `q` when `k ≤ q`**, but the mask is now a `(T_new, S)` rectangle made of the
# **last** rows of the full triangle: its corner is at the bottom right.
#
# PyTorch's `F.scaled_dot_product_attention(..., is_causal=True)` builds `torch.ones(T, S).tril()`: a triangle
# whose corner is at the **top left**. For `T == S` that is right; for `T ≠ S`, the case of every cached step, it
# is not. Run it: 3 new queries at positions 4, 5, 6 over 7 keys, against the full computation of all 7 positions:

# %% demo
g = torch.Generator().manual_seed(0)
q_all, k_all, v_all = (torch.randn(1, 2, 7, 8, generator=g) for _ in range(3))  # (B, H, 7, Dh): positions 0..6
full = F.scaled_dot_product_attention(q_all, k_all, v_all, is_causal=True)  # (B, H, 7, Dh): no cache, T == S
new_q = q_all[:, :, 4:]  # (B, H, 3, Dh): the queries of positions 4, 5, 6 only
top_left = F.scaled_dot_product_attention(new_q, k_all, v_all, is_causal=True)  # (B, H, 3, Dh)
bottom_right = torch.ones(7, 7, dtype=torch.bool).tril()[4:]  # (3, 7): the last 3 rows of the full mask
aligned = F.scaled_dot_product_attention(new_q, k_all, v_all, attn_mask=bottom_right)  # (B, H, 3, Dh)
print("is_causal=True with T=3, S=7   : max error", (top_left - full[:, :, 4:]).abs().max().item())
print("mask aligned to positions 4..6 : max error", (aligned - full[:, :, 4:]).abs().max().item())
plot_masks([torch.ones(3, 7).tril().bool(), bottom_right],
           titles=["is_causal=True: top-left (wrong)", "aligned to positions 4, 5, 6"], query_labels=[4, 5, 6]);

# %% [markdown]
# With the top-left triangle, the query at position 4 sees only key 0: it has lost positions 1–4 of its own past.
#
# **Exercise.** Write `cached_causal_mask(q_positions, k_len)`: for queries at the absolute positions
# `q_positions` (`(T,)` integers) and keys at positions `0 … k_len - 1`, return the `(T, S)` boolean mask. One
# comparison with broadcasting does it (`torch.arange(k_len)`), and it works for any positions, not only the last.

# %% exercise=cached_causal_mask

# %% test=cached_causal_mask points=1
from decoder_course.visible import l09_kv_cache as visible

visible.check_cached_causal_mask(cached_causal_mask)

# %% [markdown]
# ## 4. One decoding step
#
# `decode_step(model, token_ids, memory_kv, cache, position, src_is_real=None)` runs the decoder on the new
# tokens only and returns `(logits, cache)`: the logits of the **last** new position, `(B, V)`, and the cache with
# this step's keys and values appended. `token_ids` `(B, T_new)` are the tokens at absolute positions
# `position … position + T_new - 1`: usually one token, several for a *prefill* (a known prefix cached in one
# call). `memory_kv[i]` is layer `i`'s `cross_attn.project_memory(memory)`.
#
# It must compute, for those positions, exactly what `Seq2SeqTransformer.decode` computes, with the model's own
# modules and weights. Three questions to answer before writing code:
#
# - **Where are the new tokens?** At absolute positions `position …`, so their positional encodings are those
#   rows of the table, not rows `0 …`.
# - **What does self-attention read?** Its queries are the new positions only; its keys and values are all that
#   the cache holds once this step's are appended. Which keys may each new query see? (Section 3.)
# - **What stays the same?** Everything else: each layer's sublayers, residuals, LayerNorms (in the order
#   `layer.norm_first` asks for) and dropouts, as in `DecoderLayer.forward`, then the stack's final norm and the
#   output projection, as in `decode`. Read those two given methods side by side with your function.
#
# Decorate it with `@torch.inference_mode()` (or `@torch.no_grad()`: both turn gradients off; inference mode also
# skips autograd's bookkeeping of tensor versions and views, which a step made of many tiny operations feels);
# dropout is called as in the layers (it does nothing after `model.eval()`).
#
# <details><summary>Hint: the pieces, one by one</summary>
#
# - **Embedding**: `model.tgt_embed(token_ids) * model.embed_scale`, plus rows `position … position + T_new - 1`
#   of the buffer `model.pos_encoding.pe`, then `model.pos_encoding.dropout` (`model.pos_encoding(x)` would add
#   rows `0 …`).
# - **Self-attention** of layer `i`: `split_heads` of the layer's `self_attn.q_proj`, `k_proj`, `v_proj`;
#   `cache.update(k, v, i)` returns every key and value so far; the given `attention(q, k_all, v_all, allowed,
#   dropout=...)` with `allowed = cached_causal_mask(...)`; then `merge_heads`, `out_proj` and `layer.dropout1`.
# - **Cross-attention**: `layer.cross_attn(h, memory_kv=memory_kv[i], allowed=...)`, with the source padding mask
#   `(B, 1, 1, S)` from `src_is_real` (or `None`), then `layer.dropout2`. **Feed-forward**: `layer.feed_forward`,
#   then `layer.dropout3`.
# - **Wiring**: pre-LN `x = x + sublayer(norm(x))`, post-LN `x = norm(x + sublayer(x))`, with `norm1`, `norm2`,
#   `norm3` for the three sublayers in turn.
# - **Output**: `model.decoder.norm` (an identity for post-LN), then `model.out_proj`, on the last new position.
#
# </details>
#
# **Exercise.** Write `decode_step`. The check compares its logits, step by step, with the full decoder's.

# %% exercise=decode_step

# %% test=decode_step points=2
from decoder_course.visible import l09_kv_cache as visible

visible.check_decode_step(decode_step, KVCache, Seq2SeqTransformer)

# %% [markdown]
# ## 5. Greedy decoding with the cache
#
# The loop of `greedy_decode`, with three changes: before the loop, encode the source and project the memory once
# per layer (`memory_kv`) and create an empty `KVCache`; each step feeds **only the newest token** (BOS first) at
# `position = ` the number of tokens fed so far; and the output is collected token by token. Everything else
# (finished rows get `pad_id`, stop when all rows are done, `(B, L)` without BOS) is as in lesson 08, and the
# result must be *exactly* the same tokens.
#
# **Exercise.** Write `greedy_decode_cached(model, src_ids, max_len, bos_id, eos_id, src_is_real=None,
# pad_id=0)`.

# %% exercise=greedy_decode_cached

# %% test=greedy_decode_cached points=2
from decoder_course.visible import l09_kv_cache as visible

visible.check_greedy_decode_cached(greedy_decode_cached, greedy_decode, Seq2SeqTransformer)

# %% [markdown]
# The same tokens, on 64 random sources of different lengths, both LayerNorm placements. EOS is made a little more
# likely than the untrained model makes it, so that rows end at different steps and the finished ones are padded:

# %% demo
g = torch.Generator().manual_seed(1)
many_src = torch.randint(3, 20, (64, 8), generator=g)  # (B, S)
many_real = torch.arange(8)[None, :] < torch.randint(1, 9, (64, 1), generator=g)  # (B, S): random lengths
for norm_first in (True, False):
    net = small_model(norm_first, seed=3)
    with torch.no_grad():
        net.out_proj.bias[EOS] += 2.0  # without it no row of this untrained model ends within 12 tokens
    plain = greedy_decode(net, many_src, 12, BOS, EOS, src_is_real=many_real, pad_id=PAD)
    cached = greedy_decode_cached(net, many_src, 12, BOS, EOS, src_is_real=many_real, pad_id=PAD)
    print(f"norm_first={norm_first}: identical tokens: {torch.equal(plain, cached)}, output shape "
          f"{tuple(cached.shape)}, rows ending in EOS: {int((cached == EOS).any(-1).sum())} of 64")

# %% [markdown]
# ## 6. Measured: how much faster?
#
# A model of about a million parameters (`D = 128`, 4 heads, `F = 512`, 2 + 2 layers), untrained: the time per
# step does not depend on the weights. We generate `n` tokens for `n` up to 256 (with an EOS id no token has, so
# every run really generates `n`), with and without the cache, for one sequence and for a batch of 4. Each time is
# the best of up to three runs after a warm-up; expect some noise all the same. (While the notebook is graded
# the lengths are shorter.)

# %% demo
timing_model = Seq2SeqTransformer(16, 16, d_model=128, n_heads=4, d_ff=512, n_layers=2, dropout=0.0).to(device).eval()
n_params = sum(p.numel() for p in timing_model.parameters())
print(f"parameters: {n_params:,}, on {device}")
NEVER = -1  # an EOS id that no token has: every run generates exactly n tokens
clock = timer(device)  # reads the time once the device's queued work is done (a GPU runs asynchronously)


def seconds(decoder, src, n):
    """Wall time of generating n tokens: the best of up to 3 runs (one run when it takes over half a second)."""
    best = math.inf
    for _ in range(3):
        start = clock()
        decoder(timing_model, src, n, BOS, NEVER)
        best = min(best, clock() - start)
        if best > 0.5:  # long runs are measured once: their noise is small next to their length
            break
    return best


lengths = [16, 32, 64] if GRADING else [32, 64, 128, 256]
if GRADING:
    print("(a graded run: only short lengths are timed, where the cache matters least)")
budget_s = 25.0  # a slow machine skips the longest runs rather than stalling the notebook
warm_src = torch.randint(3, 16, (4, 10), device=device)  # (4, S)
seconds(greedy_decode, warm_src, 8), seconds(greedy_decode_cached, warm_src, 8)  # warm-up: first calls are slow
started, timings = time.perf_counter(), {}
for B in (1, 4):
    src = torch.randint(3, 16, (B, 10), device=device)  # (B, S)
    done, next_cost = [], 0.0
    for n in lengths:
        if time.perf_counter() - started + next_cost > budget_s:
            print(f"batch {B}: skipping {n} tokens and beyond, they would not fit in this cell's {budget_s:.0f} s")
            break
        a, b = seconds(greedy_decode, src, n), seconds(greedy_decode_cached, src, n)
        done.append((n, a, b))
        next_cost = 4 * a + 2 * b  # twice the length: without the cache about 4x (it grows with the square), with 2x
        print(f"batch {B}, {n:3d} tokens: {a:6.2f} s without cache, {b:5.2f} s with ({1000 * b / n:5.2f} ms per "
              f"step): {a / b:4.1f}x")
    timings[B] = done
for B, done in timings.items():
    if done:
        n, a, b = zip(*done, strict=True)
        plot_speedup(n, a, b, title=f"greedy decoding, batch {B}, a {n_params / 1e6:.1f} M-parameter model")
plt.show()

# %% [markdown]
# Read the measurement. Without the cache, the time grows roughly with the square of the length (each step
# re-runs a longer prefix, and attention over `t` positions costs `t²`). With the cache it grows linearly: every
# step does the same small amount of work. So the speed-up *grows with the length*; at a few dozen tokens it is
# modest.
#
# At **batch 1**, look at the milliseconds per cached step: that is the floor. A cached step for one sequence is a
# few tiny matrix products, and their cost is dominated by fixed per-call overhead (Python, dispatching dozens of
# small PyTorch ops, `torch.cat` growing the cache), not by arithmetic. The uncached run pays that overhead too,
# plus its growing arithmetic, so the ratio climbs slowly: **per-step overhead, not arithmetic, limits
# single-sequence decoding**. A batch spreads the fixed overhead over more sequences, so the uncached arithmetic
# dominates sooner and the cache pays off more: compare the printed speed-ups of batch 1 and batch 4 at the same
# length. Any single "N× faster" is one point on these curves, not a constant: it depends on the length, the
# batch, the model and the machine.
#
# (Production decoders also pre-allocate the cache to a fixed length and mask the unused part: `torch.cat`
# copies the whole cache at every step, and fixed shapes let the same kernels run at every step.)

# %% [markdown]
# ## 7. Beam search with the cache
#
# Lesson 08's `beam_search` re-runs the decoder on every beam's whole history at every step. With a cache it
# feeds only each beam's newest token, exactly as greedy decoding does: the `B * K` beams are simply a batch of
# `B * K` rows. One thing is new. After the top-k, beam `j` of row `b` continues the beam it was extended from,
# and its history is gathered from that parent: `tgt = tgt[rows]` with `rows = b * K + beam_idx`. The cache
# holds the parents' keys and values in the same row order, so it must be gathered **by the same rows**:
# `cache.reorder(rows)`, which keeps batch rows `rows` of every layer (a row may appear twice, when two
# continuations of one beam survive, and another may vanish). Skip it and each beam attends to some other beam's
# past: plausible tokens, wrong beams.
#
# **Exercise.** With your `KVCache.reorder` (section 2), write
# `beam_search_cached(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,
# src_is_real=None, pad_id=0)`: lesson 08's `beam_search` (given above, read it) with `decode_step` on the newest
# tokens, the memory repeated `beam_size` times and projected once per layer, and the cache reordered after every
# top-k. It must return exactly `beam_search`'s beams: the same ranking, scores, length normalisation, EOS and
# padding.

# %% exercise=beam_search_cached

# %% test=beam_search_cached points=2
from decoder_course.visible import l09_kv_cache as visible

visible.check_beam_search_cached(beam_search_cached, beam_search, Seq2SeqTransformer)

# %% [markdown]
# And measured, on the timing model of section 6, batch 2 with 4 beams each (8 rows), an EOS that never comes:

# %% demo
n_beam = 16 if GRADING else 64
beam_src = torch.randint(3, 16, (2, 10), device=device)  # (B, S)
seconds(beam_search, beam_src, 8), seconds(beam_search_cached, beam_src, 8)  # warm-up
plain_s, cached_s = seconds(beam_search, beam_src, n_beam), seconds(beam_search_cached, beam_src, n_beam)
same = torch.equal(beam_search(timing_model, beam_src, n_beam, BOS, NEVER),
                   beam_search_cached(timing_model, beam_src, n_beam, BOS, NEVER))
print(f"beam search, batch 2 x 4 beams, {n_beam} tokens: {plain_s:.2f} s without cache, {cached_s:.2f} s with: "
      f"{plain_s / cached_s:.1f}x faster; the same beams: {same}")

# %% [markdown]
# ## 8. Find the bug
#
# A prefix known in advance (a prompt, a forced start of the answer) need not be decoded token by token:
# `decode_step` takes several tokens at once and caches them in one call. A long prefix is usually fed in
# **chunks** of a fixed size instead, as inference servers do with long prompts, so that no single call's
# attention grows too large. `prefill` below, written by a colleague on top of **your** `decode_step` and
# `KVCache`, does that. It has **one** mistake. It runs, the logits have the right shape, the cache the right
# length, and its author checked it against the full decoder with one token per chunk and with the whole prefix
# in one chunk: both right. Any other chunk size gives plausible logits that are wrong, and every token
# generated after them is conditioned on a past the model never saw.
#
# How would you find it? Ask what must hold whatever the chunk size: the cache and the last logits describe the
# prefix, not the way it was fed, so every `chunk_size` must give the full decoder's logits at the prefix's last
# position. Compare chunk sizes 1, 2, 3 and the whole prefix; then, for a size that fails, print for each call
# of `decode_step` which tokens of the prefix the chunk holds and the position it is given, and compare with
# what `decode_step`'s docstring asks for. The check under the cell does the comparison for you.
#
# **Exercise.** Find and fix the bug in `prefill(model, prefix_ids, memory_kv, cache, chunk_size,
# src_is_real=None)`, in the given code. It is graded with your own `decode_step` and `KVCache`: a mistake in
# those costs their own cells, not this one.

# %% exercise=prefill

# %% test=prefill points=1
from decoder_course.visible import l09_kv_cache as visible

visible.check_prefill(prefill, decode_step, KVCache, Seq2SeqTransformer)

# %% [markdown]
# ## What you built
#
# | piece | what it does |
# |---|---|
# | `KVCache` | per layer, the keys and values of every decoded position; `update` appends; `length`, `positions`; `reorder` follows the beams |
# | `cached_causal_mask(q_positions, k_len)` | key `k` allowed for a query at absolute position `q` iff `k ≤ q`: the bottom-right triangle |
# | `decode_step` | the decoder on the new token(s) only, with the past from the cache and the memory's K/V projected once |
# | `greedy_decode_cached` | exactly `greedy_decode`'s tokens, in linear instead of quadratic work |
# | `beam_search_cached` | exactly `beam_search`'s beams, the cache reordered with them (`cache.reorder(rows)`) |
# | `prefill` (fixed) | a known prefix cached chunk by chunk, each chunk at the positions its tokens hold |
#
# The same cache serves sampling too: sampling changes only how the next token is chosen.
