# %% [markdown]
# # Lesson 11 — GPT: a decoder-only language model, from bytes to generated code
#
# Lessons 05–09 built a decoder that reads an encoder's memory. Take the cross-attention away and what is left —
# masked self-attention and a feed-forward, stacked — is the model most people now mean by "a decoder": **GPT**.
# It has no source sentence; it reads a stream of text and predicts, at every position, the next token.
#
# In this lesson you build the whole pipeline and train it on real text in under a minute of CPU:
#
# 1. `train_bpe` and `BPETokenizer`: a **byte-level BPE** tokenizer (GPT-2's idea): the 256 byte values are the
#    first tokens, and training learns *merges* that fuse frequent pairs into new tokens. Every string, in any
#    language, round-trips exactly;
# 2. `GPT`: token and learned position embeddings, a stack of lesson 05's `DecoderLayer` **with cross-attention
#    switched off** (the same class, `cross_attn=False`), a final LayerNorm and an output layer tied to the
#    embedding. It equals a stack of PyTorch's `nn.TransformerEncoderLayer` run with a causal mask;
# 3. `lm_batches`: random windows of the token stream, the targets shifted by one;
# 4. `generate`: temperature and top-k sampling with lesson 09's `KVCache`.
#
# The text is Python's own standard library, read from your installation at run time: nothing is downloaded.
#
# ![The GPT stack: token ids go through a token embedding plus a learned position embedding, then N decoder
# blocks each made of masked self-attention and a feed-forward network with residual connections and pre-LN,
# then a final LayerNorm and an output projection tied to the token embedding, giving next-token logits](assets/gpt_stack.png)

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
from decoder_course.devices import timer

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it
GRADING = decoder_course.grading()  # True while nbgrader grades this notebook: keep demos short
device = decoder_course.device()  # cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE overrides)

# %% [markdown]
# ## 0. The blocks you already have
#
# Attention, the decoder layer, the cache and the top-k filter come from lessons 03–09. `DecoderLayer` now takes
# `cross_attn=False`: no cross-attention sublayer, no `norm2`, and `forward(x)` needs no memory.

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer

# %% given=kv_cache:KVCache,cached_causal_mask

# %% given=generation:top_k_filter

# %%
layer = DecoderLayer(64, 4, 256, norm_first=True, cross_attn=False)
print({name: sum(p.numel() for p in child.parameters()) for name, child in layer.named_children()})
print(layer(torch.randn(2, 5, 64), self_allowed=torch.ones(5, 5, dtype=torch.bool).tril()).shape)

# %% [markdown]
# ## 1. Byte-level BPE
#
# A language model predicts tokens, so text must become ids. Characters would make sequences long; words would
# need a huge vocabulary and still meet unknown words. **Byte-pair encoding** sits between: start from the UTF-8
# bytes (ids 0–255, so nothing is ever unknown), then repeatedly find the most frequent adjacent pair and give it
# a new id. On `"aaabdaaabac"`:
#
# ```
# bytes      a a a b d a a a b a c      (a, a) occurs 4 times (overlapping)  -> 256
# merge 0    256 a b d 256 a b a c      (256, a) and (a, b) occur twice; (256, a) comes first -> 257
# merge 1    257 b d 257 b a c          (257, b) occurs twice -> 258
# merge 2    258 d 258 a c
# ```
#
# The two helpers below count pairs and merge one pair everywhere (left to right, no overlaps: `a a a` with
# `(a, a)` becomes `256 a`). A tie goes to the pair that occurs **first**: `pair_counts` keeps its keys in order of
# first occurrence, and `max(counts, key=counts.get)` returns the first of the largest.

# %% given=pair_counts,merge_pair

# %% [markdown]
# **Exercise.** Write `train_bpe(text, vocab_size) -> merges`: `merges[i]` is the pair fused into token `256 + i`.
# Stop after `vocab_size - 256` merges, or when fewer than two tokens are left.

# %% exercise=train_bpe

# %% test=train_bpe points=2
from decoder_course.visible import l11_gpt as visible

visible.check_train_bpe(train_bpe)

# %% [markdown]
# **Exercise.** Write `BPETokenizer(merges)`. `vocab[i]` holds the bytes of token `i`: the 256 single bytes, then
# `vocab[a] + vocab[b]` for each merge. `encode` replays the merges on the text's bytes *in the order they were
# learned* (merge `k` may use tokens made by earlier merges), so on the training text it reproduces training's
# final sequence. `decode` joins the bytes of all tokens and decodes them **once**: a character can be split
# across two tokens, so decoding token by token would break it. `errors="replace"` turns bytes that are not valid
# UTF-8 (a list of ids cut in the middle of a character) into U+FFFD instead of raising.
#
# Replaying a merge with `merge_pair` is a Python loop over the whole text. A faster equivalent: hold the sequence
# as a `str` whose characters are the token ids (`chr(id)`); `str.replace` merges left to right without overlaps,
# exactly as `merge_pair`, in C.

# %% exercise=BPETokenizer

# %% test=BPETokenizer points=2
from decoder_course.visible import l11_gpt as visible

visible.check_bpe_tokenizer(BPETokenizer)

# %% [markdown]
# ### The text: Python's standard library
#
# `python_source_text` reads a fixed list of standard-library modules from your installation (about 300 000
# characters). We learn 256 merges on its first 40 000 characters (the naive training loop counts every pair
# at every merge: seconds, not minutes) and encode all of it.

# %% demo
started = time.perf_counter()
text = python_source_text(max_chars=300_000)
merges = train_bpe(text[:40_000], vocab_size=512)
tokenizer = BPETokenizer(merges)
corpus = torch.tensor(tokenizer.encode(text))  # (N,)
print(f"{len(text):,} characters -> {len(corpus):,} tokens ({len(text.encode()) / len(corpus):.2f} bytes per token), "
      f"vocabulary {tokenizer.vocab_size}, in {time.perf_counter() - started:.1f} s")
print("first merges:", [tokenizer.vocab[256 + k].decode("utf-8", "replace") for k in range(12)])
print("longest tokens:", sorted((t.decode("utf-8", "replace") for t in tokenizer.vocab), key=len)[-6:])
print(tokenizer.encode("def forward(self, x):\n        return x"))

# %% [markdown]
# The first merges are indentation (runs of spaces) and common letter pairs; later ones are whole keywords such
# as `self` or `return`. The tokenizer has no idea what Python is: frequency alone found these units.
#
# ## 2. The model
#
# ```
# ids (B, T) -> tok_embed(ids) + pos_embed(0 .. T-1)          (B, T, D)
#            -> n_layers x DecoderLayer(..., norm_first=True, cross_attn=False), causal mask
#            -> norm (final LayerNorm) -> out_proj, tied to tok_embed   (B, T, V)
# ```
#
# Lesson 06 added fixed sinusoids; GPT *learns* one vector per position (`pos_embed`, `max_len` rows). Tying
# `out_proj.weight` to `tok_embed.weight` uses one (V, D) matrix to read and to write tokens (Press & Wolf 2017):
# one (V, D) matrix fewer (the count below prints both). Tied, the embedding must start small (N(0, 0.02²), as GPT-2): with
# PyTorch's N(0, 1) the first logits would be about √D in size and the first loss far above log V.
#
# With a cache (`forward(ids, cache)`), the new tokens are at positions `cache.length ..`; each layer appends its
# keys and values and attends over everything cached. `DecoderLayer.forward` has no cache, so the cached path opens
# the self-attention up, as lesson 09's `decode_step` did (`_cached_layer`).
#
# **Exercise.** Write `GPT`, `forward` with and without a cache.

# %% given=causal_allowed

# %% exercise=GPT

# %% test=GPT points=3
from decoder_course.visible import l11_gpt as visible

visible.check_gpt(GPT, KVCache)

# %% [markdown]
# `GPT` is PyTorch's encoder stack in disguise: an encoder layer that cannot see the future is a decoder-only
# layer. The check above copied your weights into `nn.TransformerEncoderLayer(norm_first=True)` layers and
# compared. Where the parameters of a small GPT live:

# %%
small = GPT(512, 64, 4, 256, 2, 64)
counts = {name: sum(p.numel() for p in child.parameters()) for name, child in small.named_children()}
print(counts, "total", sum(p.numel() for p in small.parameters()), "(out_proj shares tok_embed's matrix)")

# %% [markdown]
# ## 3. Next-token batches
#
# Training reads random windows of the token stream: a window of `block` tokens is the input, the same window
# shifted by one is the target, so every position is a training example (`targets[:, t]` follows `inputs[:, t]`).
#
# **Exercise.** Write `lm_batches(ids, block, batch, generator)`.

# %% exercise=lm_batches

# %% test=lm_batches points=1
from decoder_course.visible import l11_gpt as visible

visible.check_lm_batches(lm_batches)

# %% [markdown]
# ## 4. Training
#
# 90 % of the tokens train, the last 10 % (other modules) are held out. A 2-layer model with D = 64 trains for
# 25 seconds (the two held-out evaluations, before and after, come on top and are timed apart): AdamW, a short
# warm-up, gradient clipping. The loss is in nats per token; log V = 6.24 is
# guessing uniformly.

# %% demo
split = int(0.9 * len(corpus))
train_ids, held_out_ids = corpus[:split], corpus[split:]
BLOCK, BATCH, SECONDS = 64, 16, (3 if GRADING else 25)
torch.manual_seed(0)
lm = GPT(tokenizer.vocab_size, d_model=64, n_heads=4, d_ff=256, n_layers=2, max_len=BLOCK).to(device)
optimizer = torch.optim.AdamW(lm.parameters(), lr=3e-3, weight_decay=0.01)
batches = torch.Generator().manual_seed(0)


@torch.no_grad()
def held_out_loss(n_batches=20):
    """Mean next-token loss on held-out windows (the same windows every time)."""
    lm.eval()
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n_batches):
        x, y = (t.to(device) for t in lm_batches(held_out_ids, BLOCK, 32, g))
        losses.append(F.cross_entropy(lm(x).flatten(0, 1), y.flatten()).item())
    lm.train()
    return sum(losses) / len(losses)


print(f"step 0: held-out loss {held_out_loss():.2f} (log V = {math.log(tokenizer.vocab_size):.2f})")
history, steps, started = [], 0, time.perf_counter()
while time.perf_counter() - started < SECONDS:
    for group in optimizer.param_groups:
        group["lr"] = 3e-3 * min(1.0, (steps + 1) / 50)  # warm-up over 50 steps
    x, y = (t.to(device) for t in lm_batches(train_ids, BLOCK, BATCH, batches))
    loss = F.cross_entropy(lm(x).flatten(0, 1), y.flatten())  # (B*T, V) vs (B*T,)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
    optimizer.step()
    history.append(loss.item())
    steps += 1
trained = time.perf_counter() - started  # the training alone: the budget SECONDS bounds this
final = held_out_loss()
recent = history[-50:]  # the last 50 steps (fewer in a short run)
print(f"{steps} steps in {trained:.0f} s of training: training loss {sum(recent) / len(recent):.2f}, "
      f"held-out loss {final:.2f} nats/token")
if GRADING:
    print("(a graded run: training was cut short; the numbers mean little)")
plt.figure(figsize=(6, 3))
plt.plot(history, linewidth=0.8)
plt.axhline(final, color="tab:orange", linestyle="--", label=f"held-out {final:.2f}")
plt.xlabel("step")
plt.ylabel("loss (nats/token)")
plt.legend()
plt.title("GPT on Python's standard library");

# %% [markdown]
# ## 5. Generation with a KV cache
#
# Generation appends one token at a time. Without a cache, step t re-runs all t positions; with lesson 09's
# `KVCache` the prompt runs once and every later step runs one position. Per step: the last position's logits,
# divided by the temperature (below 1 sharpens, above 1 flattens; 0 is greedy), top-k keeps the k best, one draw
# from the softmax with your generator.
#
# **Exercise.** Write `generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None)`.

# %% exercise=generate

# %% test=generate points=2
from decoder_course.visible import l11_gpt as visible

visible.check_generate(generate)

# %% [markdown]
# What the model writes after `def `, three ways. Greedy decoding loops; sampling at temperature 1 is varied but
# noisy; a lower temperature with top-k is the usual compromise.

# %% demo
lm.eval()
prompt = torch.tensor([tokenizer.encode("    def ")], device=device)  # (1, T)
for name, settings in [("greedy", {"temperature": 0}), ("temperature 1.0", {"temperature": 1.0}),
                       ("temperature 0.8, top-k 20", {"temperature": 0.8, "top_k": 20})]:
    out = generate(lm, prompt, BLOCK - prompt.shape[1], generator=torch.Generator(device).manual_seed(0),
                   **settings)
    print(f"---- {name} ----")
    print(tokenizer.decode(out[0].tolist()))

# %% [markdown]
# The cache's gain, measured on this model: the same greedy tokens, once with the cache and once re-running the
# whole sequence at every step.

# %% demo
@torch.no_grad()
def generate_uncached(model, prompt_ids, max_new_tokens):
    """Greedy decoding that re-runs every position at every step (the baseline)."""
    ids = prompt_ids
    for _ in range(max_new_tokens):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


prompts = prompt.repeat(8, 1)  # (8, T)
n_new = BLOCK - prompt.shape[1]
clock = timer(device)
start = clock()
with_cache = generate(lm, prompts, n_new, temperature=0)
middle = clock()
without = generate_uncached(lm, prompts, n_new)
end = clock()
print(f"same tokens: {torch.equal(with_cache, without)}; with the cache {middle - start:.3f} s, without "
      f"{end - middle:.3f} s ({(end - middle) / (middle - start):.1f}x) for {n_new} tokens, batch 8")

# %% [markdown]
# ## 6. Find the bug: writing past `max_len`
#
# `generate` stops at `max_len`: the model learned one vector per position, and there is none for position
# `max_len`. To write more, forget the oldest tokens: start again from the latest `keep` tokens with a fresh cache,
# and continue. The cache cannot be carried over: when the window slides, every token it keeps moves to a new
# position, so every key and value cached for it is stale. (Lesson 12's rotary positions change that story:
# there a position is only a rotation, and nothing is learned per position.)
#
# Below is a colleague's `generate_long`, which calls **your** `generate` once per round. It has **one** mistake.
# Its author tried a short continuation, one round, where it gives exactly `generate`'s tokens; then a longer
# greedy run, which came back repetitive, as greedy text often is, so nothing looked wrong.
#
# How would you find it? A round must see the latest tokens, whatever came before. So print, for every round,
# the prompt it hands `generate` beside the sequence so far, with positions: are they its *last* `keep` tokens? And
# look at where the repetition starts: a greedy model handed the same prompt twice writes the same continuation
# twice. The check under the cell wraps your `generate` in a spy that records what each round hands it, so only
# the rounds are on trial.
#
# **Exercise.** Find and fix the bug in `generate_long(model, prompt_ids, max_new_tokens, keep, temperature=1.0,
# top_k=None, generator=None)`, in the given code. It is graded with your own `generate`: a mistake there costs
# its own cell, not this one.

# %% exercise=generate_long

# %% test=generate_long points=1
from decoder_course.visible import l11_gpt as visible

visible.check_generate_long(generate_long)

# %% [markdown]
# ## What you built
#
# A tokenizer that learned Python's vocabulary from frequency alone, a GPT built from the course's own decoder
# layer, generation with a cache, and `generate_long` (fixed: each round starts from the latest `keep` tokens) to
# write past `max_len`. What GPT-2 adds is mostly scale (48 layers, D = 1600, 50 257 tokens, a
# pre-tokenising regex so merges stay inside words) and GELU instead of ReLU. Lesson 12 replaces the block's parts
# with the modern ones (RMSNorm, rotary positions, SwiGLU, grouped-query attention) and trains it beside this one.
