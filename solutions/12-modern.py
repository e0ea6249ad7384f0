# %% [markdown]
# # Lesson 12 — The modern decoder block: RMSNorm, RoPE, SwiGLU, grouped-query attention
#
# Lesson 11's GPT uses GPT-2's block: LayerNorm, a learned position table, a ReLU feed-forward and one key/value
# head per query head. Open the code of LLaMA, Mistral, Qwen or Gemma and every one of those parts has been
# replaced, each for a reason you can measure:
#
# 1. `RMSNorm`: normalise by the root mean square only — no mean, no bias; cheaper, and as good;
# 2. `rotary_embedding` (RoPE): positions as *rotations* of queries and keys, so attention scores depend only on
#    how far apart two tokens are; nothing to learn, no table to run out of;
# 3. `SwiGLUFeedForward`: a gated feed-forward with three matrices, narrowed so the parameter count stays the same;
# 4. `GroupedQueryAttention`: several query heads share one key/value head; the KV cache shrinks by the same factor;
# 5. `sliding_window_mask`: each query sees only the last few positions;
# 6. `ModernBlock`: the pre-norm block made from them.
#
# Then the modern block trains beside lesson 11's, on the same text, at about the same parameter count (printed).

# %%
import math
import time
from collections import Counter

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import decoder_course
from decoder_course.data import python_source_text
from decoder_course.plots import plot_masks

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it
GRADING = decoder_course.grading()  # True while the notebook is graded: demonstrations run short
device = decoder_course.device()  # cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE overrides)

# %% [markdown]
# ## 0. The blocks you already have
#
# Attention and the KV cache from lessons 03 and 09; lesson 11's tokenizer, batches and `GPT` (built from lesson
# 05's `DecoderLayer`), which this lesson's model will race.

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer

# %% given=kv_cache:KVCache,cached_causal_mask

# %% given=gpt:pair_counts,merge_pair,train_bpe,BPETokenizer,causal_allowed,GPT,lm_batches

# %% [markdown]
# ## 1. RMSNorm
#
# LayerNorm subtracts the mean of a position's D features, divides by their standard deviation, then scales and
# shifts: `(x - mean) / std * weight + bias`. RMSNorm (Zhang & Sennrich 2019) keeps only the rescaling:
#
# $$\mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac{1}{D}\sum_i x_i^2 + \epsilon}} \cdot w$$
#
# Re-centring turned out not to matter; dropping it saves a reduction and the bias. `eps` sits *inside* the
# root: it only matters for rows of tiny scale, where it keeps the division finite. Compute in float32 (squares of
# bfloat16 values lose precision) and return the input's dtype.
#
# **Exercise.** Write `RMSNorm(d, eps)`: one parameter `weight` (D,), starting at ones.

# %% exercise=RMSNorm

# %% test=RMSNorm points=1
from decoder_course.visible import l12_modern as visible

visible.check_rms_norm(RMSNorm)

# %% [markdown]
# ## 2. Rotary position embeddings
#
# Lesson 11 *added* a learned vector per position to the token embedding. RoPE (Su et al. 2021) instead *rotates*
# the queries and keys inside every attention layer. Split a head's Dh dimensions into pairs — here neighbours,
# (0, 1), (2, 3), …, read as one complex number `x[2i] + j·x[2i+1]` — and at position p turn pair i by the angle
# `p·θ_i`, with `θ_i = base^(-2i/Dh)`: pair 0 turns one radian per position, the last pair barely moves.
#
# Why rotations? A query rotated by mθ against a key rotated by nθ scores the same as the query rotated by (m − n)θ
# against the unrotated key: **the score depends only on the distance m − n**, never on where the two tokens sit. Shift a whole
# sentence and the scores do not change.
#
# As complex numbers, pair by pair: `rotated = z · exp(j·p·θ_i)`; in real arithmetic, `(a, b) -> (a cos − b sin,
# a sin + b cos)`. Many libraries pair dimension i with i + Dh/2 instead ("rotate half"): the same idea with the
# dimensions permuted; here, pairs are neighbours.
#
# **Exercise.** Write `rotary_embedding(x, positions, base=10000)` for x (B, H, T, Dh), positions (T,).

# %% exercise=rotary_embedding

# %% test=rotary_embedding points=2
from decoder_course.visible import l12_modern as visible

visible.check_rotary_embedding(rotary_embedding)

# %% [markdown]
# The property, seen: one query and one key, their score at positions (m, n), and again with both moved along.

# %%
q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)


def rope_score(m, n):
    """q at position m, k at position n: the attention score (before the 1/sqrt(Dh))."""
    return float((rotary_embedding(q, torch.tensor([m])) * rotary_embedding(k, torch.tensor([n]))).sum())


for m, n in [(5, 2), (105, 102), (1005, 1002), (5, 4)]:
    print(f"q at {m:4d}, k at {n:4d} (distance {m - n}): score {rope_score(m, n):+.4f}")

# %% [markdown]
# ## 3. A gated feed-forward: SwiGLU
#
# Lesson 05's feed-forward is `linear2(relu(linear1(x)))`. SwiGLU (Shazeer 2020) adds a third matrix and lets one
# projection gate the other: `down_proj(silu(gate_proj(x)) * up_proj(x))`, with SiLU(x) = x·sigmoid(x), no bias.
# Three D×F matrices instead of two: to keep the parameter count, F shrinks to about 2/3 of the ReLU width.
#
# **Exercise.** Write `SwiGLUFeedForward(d_model, d_ff)` with `gate_proj`, `up_proj`, `down_proj`.

# %% exercise=SwiGLUFeedForward

# %% test=SwiGLUFeedForward points=1
from decoder_course.visible import l12_modern as visible

visible.check_swiglu(SwiGLUFeedForward)

# %% [markdown]
# The count, for D = 64 and the usual F = 4D:

# %%
D_MODEL = 64
relu_ff = FeedForward(D_MODEL, 4 * D_MODEL)
swiglu_ff = SwiGLUFeedForward(D_MODEL, round(2 / 3 * 4 * D_MODEL))
for name, ff in [(f"ReLU, F = {4 * D_MODEL}", relu_ff), (f"SwiGLU, F = {round(2 / 3 * 4 * D_MODEL)}", swiglu_ff)]:
    print(f"{name:16s} {sum(p.numel() for p in ff.parameters()):7,d} parameters")

# %% [markdown]
# ## 4. Grouped-query attention
#
# At generation time the KV cache holds, for every layer and every past token, one key and one value per head.
# For long contexts that memory — not the arithmetic — limits batch size and length. **Multi-query attention**
# (Shazeer 2019) keeps all the query heads but only *one* key/value head, shared by all of them;
# **grouped-query attention** (Ainslie et al. 2023) sits between: `n_kv_heads` key/value heads, each shared by a
# group of `n_heads / n_kv_heads` consecutive query heads (query head h reads kv head `h // group`).
# `n_kv_heads = n_heads` is plain multi-head attention.
#
# ```
# q_proj: D -> H·Dh        split into H heads           (B, H, T, Dh)
# k_proj, v_proj: D -> H_kv·Dh, split into H_kv heads   (B, H_kv, T, Dh)   <- what the cache stores
# rotate q and k (RoPE) at their positions; with a cache, append k, v
# repeat each kv head for its group (repeat_interleave on the head axis)   (B, H, S, Dh)
# attention (lesson 03's, fully masked rows -> zeros), merge heads, out_proj
# ```
#
# With `positions` the queries and keys are rotated by your `rotary_embedding`; without, no position enters (the
# check compares that with PyTorch's `F.scaled_dot_product_attention(..., enable_gqa=True)`). No biases, as LLaMA.
#
# **Exercise.** Write `GroupedQueryAttention(d_model, n_heads, n_kv_heads)`, `forward(x, positions=None,
# allowed=None, cache=None, layer_idx=0) -> (B, T, D)`, without PyTorch's attention function.

# %% exercise=GroupedQueryAttention

# %% test=GroupedQueryAttention points=3
from decoder_course.visible import l12_modern as visible

visible.check_gqa(GroupedQueryAttention, KVCache)

# %% [markdown]
# ## 5. A sliding window
#
# Mistral lets each query see only the last `window` positions (itself included). The cache then never needs more
# than `window` positions per layer, and information still travels further than the window: through L layers, a
# token can reach about L·(window − 1) positions back.
#
# **Exercise.** Write `sliding_window_mask(T, window)`: True where `t - window < s <= t`.

# %% exercise=sliding_window_mask

# %% test=sliding_window_mask points=1
from decoder_course.visible import l12_modern as visible

visible.check_sliding_window_mask(sliding_window_mask)

# %% demo
_ = plot_masks([torch.ones(8, 8, dtype=torch.bool).tril(), sliding_window_mask(8, 3)],
               titles=["causal", "sliding window of 3"])

# %% [markdown]
# ## 6. The modern block
#
# ```
# x = x + attn(attn_norm(x), positions, allowed, cache, layer_idx)     RMSNorm, then GQA with RoPE
# x = x + feed_forward(ffn_norm(x))                                    RMSNorm, then SwiGLU
# ```
#
# Pre-norm, as lesson 11's block, with its own norm before each sublayer.
#
# **Exercise.** Write `ModernBlock(d_model, n_heads, n_kv_heads, d_ff, eps=1e-6)`.

# %% exercise=ModernBlock

# %% test=ModernBlock points=2
from decoder_course.visible import l12_modern as visible

visible.check_modern_block(ModernBlock, KVCache)

# %% [markdown]
# Stacked, it makes a model: lesson 11's GPT without the position table (RoPE does that job inside every
# attention), RMSNorm at the end, the output tied to the embedding. And a helper that counts what a `KVCache`
# holds per token, straight from its tensors.

# %% given=ModernGPT,cache_bytes_per_token

# %% [markdown]
# ## 7. KV-cache memory: MHA, GQA, MQA
#
# The same model three times — 8 query heads, and 8, 2 or 1 key/value heads — runs a prompt with a cache; the
# cache's own tensors say how many bytes each token costs (lesson 11's GPT appears in the comparison table of
# section 8).

# %%
B_CACHE, T_CACHE = 2, 32
cache_rows = []
for name, kv_heads in [("MHA", 8), ("GQA", 2), ("MQA", 1)]:
    model = ModernGPT(512, 256, 8, kv_heads, 512, 2, 64).eval()
    cache = KVCache(len(model.layers))
    with torch.no_grad():
        model(torch.randint(0, 512, (B_CACHE, T_CACHE)), cache)
    per_token = cache_bytes_per_token(cache, B_CACHE)
    cache_rows.append((name, kv_heads, per_token))
    print(f"{name}: n_heads=8, n_kv_heads={kv_heads}: cache keys per layer {tuple(cache.keys[0].shape)}, "
          f"{per_token:,.0f} bytes per token (2 layers x 2 (k, v) x {kv_heads} heads x Dh {256 // 8} x 4 bytes)")
print(f"MHA / GQA = {cache_rows[0][2] / cache_rows[1][2]:.0f}x, MHA / MQA = {cache_rows[0][2] / cache_rows[2][2]:.0f}x")

# %% [markdown]
# At the scale of real models the same arithmetic decides what fits: per token, 2 (k, v) × layers × kv heads × Dh
# × bytes per number. Below, a 32-layer model with 32 query heads of 128 dimensions in 16-bit numbers.

# %%
for name, kv_heads in [("MHA", 32), ("GQA", 8), ("MQA", 1)]:
    per_token = 2 * 32 * kv_heads * 128 * 2
    print(f"{name:3s} ({kv_heads:2d} kv heads): {per_token / 2**10:6.0f} KiB per token, "
          f"{per_token * 4096 / 2**30:5.2f} GiB for one sequence of 4096 tokens")

# %% [markdown]
# ## 8. Training: lesson 11's block against the modern one
#
# The text and tokenizer are lesson 11's: Python's standard library, byte-level BPE.

# %% demo
started = time.perf_counter()
text = python_source_text(max_chars=300_000)
tokenizer = BPETokenizer(train_bpe(text[:40_000], vocab_size=512))
corpus = torch.tensor(tokenizer.encode(text))  # (N,)
split = int(0.9 * len(corpus))
train_ids, held_out_ids = corpus[:split], corpus[split:]
print(f"{len(corpus):,} tokens, vocabulary {tokenizer.vocab_size}, in {time.perf_counter() - started:.1f} s")

# %% [markdown]
# Two models of the same size: lesson 11's `GPT` (learned positions, LayerNorm, ReLU feed-forward with F = 4D, 4
# key/value heads) and `ModernGPT` with 2 key/value heads. The modern feed-forward's width is chosen (in steps of
# 8) to bring its parameter count closest to the classic model's.

# %% demo
BLOCK, BATCH, LAYERS, HEADS = 64, 16, 2, 4
V = tokenizer.vocab_size


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # out_proj shares tok_embed's matrix: counted once


torch.manual_seed(0)
classic = GPT(V, D_MODEL, HEADS, 4 * D_MODEL, LAYERS, BLOCK).to(device)
widths = range(8, 8 * D_MODEL, 8)
d_ff_modern = min(widths, key=lambda f: abs(n_params(ModernGPT(V, D_MODEL, HEADS, 2, f, LAYERS, BLOCK))
                                            - n_params(classic)))
torch.manual_seed(0)
modern = ModernGPT(V, D_MODEL, HEADS, 2, d_ff_modern, LAYERS, BLOCK).to(device)
for name, model in [("classic", classic), ("modern", modern)]:
    parts = {part: sum(p.numel() for p in child.parameters()) for part, child in model.named_children()
             if part != "out_proj"}
    print(f"{name:8s} {n_params(model):8,d} parameters  {parts}")
print(f"modern feed-forward width {d_ff_modern} (classic {4 * D_MODEL})")

# %% [markdown]
# Both train on the same batches, in the same order, with the same optimiser and schedule (AdamW, a short warm-up,
# gradient clipping), for the same number of steps; the held-out loss is measured on the same windows. The two take
# their steps in turn, so that when the time budget (30 seconds for both, the held-out evaluations included) runs
# out first, both have still taken the same number: on a slow machine they train less, never unequally.

# %% demo
STEPS, SECONDS = (10, 3) if GRADING else (400, 30)


@torch.no_grad()
def held_out_loss(model, n_batches=10):
    """Mean next-token loss on held-out windows (the same windows every time)."""
    model.eval()
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n_batches):
        x, y = (t.to(device) for t in lm_batches(held_out_ids, BLOCK, 32, g))
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train_in_turn(models):
    """Up to STEPS AdamW steps for each model, taken in turn on the shared batch stream, until SECONDS run out
    (evaluations included): per model, the training losses, (step, held-out loss) pairs and seconds taken."""
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01) for name, m in models.items()}
    started = time.perf_counter()
    runs = {name: ([], [(0, held_out_loss(m))], 0.0) for name, m in models.items()}
    evaluating = time.perf_counter() - started  # what the evaluations after the last step will take, about
    batches = torch.Generator().manual_seed(0)  # one batch per step, the same for both models
    steps = 0
    while steps < STEPS and time.perf_counter() - started + evaluating < SECONDS:
        x, y = (t.to(device) for t in lm_batches(train_ids, BLOCK, BATCH, batches))
        steps += 1
        for name, model in models.items():
            history, evals, seconds = runs[name]
            clock = time.perf_counter()
            for group in optimizers[name].param_groups:
                group["lr"] = 3e-3 * min(1.0, steps / 50)  # warm-up over 50 steps
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (B*T, V) vs (B*T,)
            optimizers[name].zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizers[name].step()
            history.append(loss.item())
            if steps % 50 == 0:
                evals.append((steps, held_out_loss(model)))
            runs[name] = (history, evals, seconds + time.perf_counter() - clock)
    for name, model in models.items():  # the last step's held-out loss, where the budget cut between evaluations
        history, evals, seconds = runs[name]
        if evals[-1][0] != steps:
            clock = time.perf_counter()
            evals.append((steps, held_out_loss(model)))
            runs[name] = (history, evals, seconds + time.perf_counter() - clock)
    print(f"{steps} steps each in {time.perf_counter() - started:.0f} s (a budget of {SECONDS} s, evaluations "
          f"included; at most {STEPS} steps)")
    return runs


runs = train_in_turn({"classic": classic, "modern": modern})
if GRADING:
    print("(a graded run: training was cut short; the numbers mean little)")

fig, ax = plt.subplots(figsize=(7, 3.5))
for (name, (history, evals, _)), colour in zip(runs.items(), ["tab:blue", "tab:orange"], strict=True):
    smooth = [sum(history[max(0, i - 19):i + 1]) / len(history[max(0, i - 19):i + 1]) for i in range(len(history))]
    ax.plot(range(1, len(history) + 1), smooth, color=colour, linewidth=1, label=f"{name}: training (mean of 20)")
    ax.plot(*zip(*evals, strict=True), "o--", color=colour, label=f"{name}: held-out")
ax.axhline(math.log(V), color="grey", linewidth=0.8, linestyle=":", label="log V (uniform guess)")
ax.set_xlabel("step")
ax.set_ylabel("loss (nats/token)")
ax.legend(fontsize="small")
_ = ax.set_title("lesson 11's block vs the modern block, same size, same batches")

# %% [markdown]
# The comparison, all from the runs above: parameters, losses, time, and each model's KV cache after a prompt of
# `BLOCK` tokens, measured from the cache's tensors.

# %% demo
print(f"{'':8s} {'parameters':>10s} {'train loss':>10s} {'held-out':>9s} {'seconds':>8s} {'cache B/token':>13s}")
for name, model in [("classic", classic), ("modern", modern)]:
    history, evals, seconds = runs[name]
    cache = KVCache(len(model.layers))
    model.eval()
    with torch.no_grad():
        model(train_ids[None, :BLOCK].to(device), cache)
    print(f"{name:8s} {n_params(model):10,d} {sum(history[-20:]) / len(history[-20:]):10.3f} {evals[-1][1]:9.3f} "
          f"{seconds:8.1f} {cache_bytes_per_token(cache, 1):13,.0f}")

# %% [markdown]
# Read the table above: about the same parameter count, the same batches, the same number of steps. Part of the
# gap in held-out loss may still be noise of one short run: change the seeds (the two `torch.manual_seed` calls
# for the initialisation, the generator in `train` for the batches) and rerun to see how much. The cache column
# needs no training to read: half the key/value heads, half the bytes per token. And no learned position table
# caps the length (`max_len` is only a guard); whether the model generalises past the length it trained on is
# another question, one this lesson leaves open: RoPE makes each score depend on the offset between two positions,
# but offsets of `BLOCK` or more never occurred in training, so nothing here says the model handles them well.
#
# ## 9. Find the bug: from multi-head to grouped-query attention
#
# A GQA model need not be trained from scratch. Ainslie et al. (2023) start from a trained multi-head checkpoint:
# keep its query and output projections, replace the key and value heads of each group by their **mean**, then
# train briefly to recover what the averaging lost. The cache saving is GQA's; the knowledge is the checkpoint's.
#
# Below is a colleague's `mha_to_gqa(mha, n_heads, n_kv_heads)`. It takes a `GroupedQueryAttention` with
# `n_kv_heads = n_heads` (plain multi-head attention, one end of **your** class) and builds one with fewer
# key/value heads, also from your class. It has **one** mistake. Its author tried both ends, `n_kv_heads = 1`
# (MQA) and `n_kv_heads = n_heads`, and both came out right; the mistake lives only in between.
#
# How would you find it? Your `GroupedQueryAttention` decides which query heads each key/value head serves
# (section 4): the conversion must average exactly those. Two tests need no reference answer. Label the heads:
# fill the key rows of head h with the number h, convert, and print the number each pooled head holds. And convert
# an `mha` whose heads already agree within each group: nothing is lost, so its outputs must not change. The check
# under the cell does both, and computes the outputs with PyTorch's `F.scaled_dot_product_attention(...,
# enable_gqa=True)` over the converted weights, so that only the conversion is on trial.
#
# **Exercise.** Find and fix the bug in `mha_to_gqa(mha, n_heads, n_kv_heads)`, in the given code. It is graded
# with your own `GroupedQueryAttention`: a mistake there costs its own cell, not this one.

# %% exercise=mha_to_gqa

# %% test=mha_to_gqa points=1
from decoder_course.visible import l12_modern as visible

visible.check_mha_to_gqa(mha_to_gqa, GroupedQueryAttention)

# %% [markdown]
# ## What you built
#
# Every part of a LLaMA-style block: RMSNorm, rotary positions, a SwiGLU feed-forward and grouped-query attention
# with a cache that stores only the shared key/value heads, and a sliding window; and `mha_to_gqa` (fixed: each
# key/value head averages the consecutive query heads it serves) to turn a multi-head checkpoint into GQA. What separates it from a
# released model is mostly scale, and for long contexts a RoPE base raised or rescaled so that the slowest pairs
# still tell far positions apart.
