# %% [markdown]
# # Lesson 06 — The whole model: positions, the decoder stack, an encoder–decoder Transformer
#
# Lesson 05 built one decoder layer. This lesson turns layers into a model that reads token ids and writes
# next-token scores:
#
# ![The encoder–decoder Transformer, drawn bottom to top in two columns. Left, the encoder: src_ids (B, S)
# go through src_embed times √D, plus positional encoding, then N encoder layers (self-attention with only the
# source padding mask, and feed-forward), giving the memory (B, S, D), computed once. Right, the decoder: tgt_ids
# (B, T) go through tgt_embed times √D, plus positional encoding, then layer 1, layer 2, up to layer N, each made of
# masked self-attention, cross-attention and feed-forward. One line carries the same memory to the keys and
# values of the cross-attention of every decoder layer. After the last layer come a LayerNorm (pre-LN only) and
# out_proj (which may be tied to tgt_embed), giving logits (B, T, V).](assets/encoder_decoder.png)
#
# The memory is the only thing the decoder receives from the source, and every decoder layer reads the same
# memory: the encoder runs once per source sentence, however many layers and generation steps follow. The masks
# go where the picture says: causal and target padding to each self-attention, source padding to each
# cross-attention.
#
# You write five pieces:
#
# 1. `sinusoidal_table`, the paper's positional encodings: attention alone cannot tell positions apart;
# 2. `PositionalEncoding`, the module that adds them;
# 3. `EncoderLayer`, from your attention and feed-forward, checked against PyTorch's `nn.TransformerEncoderLayer`;
# 4. `Decoder`, a stack of `N` decoder layers (with a final LayerNorm when pre-LN), checked against PyTorch's
#    `nn.TransformerDecoder`;
# 5. `Seq2SeqTransformer`, the whole encoder–decoder model, with optional **weight tying**.
#
# Then you run the paper-sized model on a padded batch and list what it still lacks before it can be trained
# and used: that list is the plan of lessons 07–10.
#
# Conventions: `B` batch, `T` target length, `S` source length, `H` heads, `D` model width, `Dh = D // H`, `F`
# feed-forward width, `V` vocabulary. Masks are boolean, **`True` = "this query may attend to this key"**;
# padding is `is_real`, `True` for real tokens.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from einops import rearrange
from torch import nn

import decoder_course
from decoder_course import PAD
from decoder_course.plots import plot_positional_encoding

_ = torch.manual_seed(0)  # every random tensor below is the same on every run
# the full model of section 7 runs here: cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE)
device = decoder_course.device()

# %% [markdown]
# ## Building blocks from earlier lessons
#
# Lessons 03–05's blocks, given so that this lesson runs, and is graded, on its own: a slip in an earlier lesson
# costs nothing here. `DecoderLayer` is the layer you wrote in lesson 05; the others are what it is made of. (In a
# graded course, a release made while one of those lessons is still open runs your own code from it instead, and
# says so in the cell; grading still runs the course's versions.)

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention,load_from_torch_mha

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer,load_from_torch_decoder_layer

# %% [markdown]
# ## 1. Attention does not know where a token is
#
# Self-attention compares every query with every key and averages values. Nothing in that computation looks at
# *where* a token sits: shuffle the input positions and the outputs are shuffled the same way, otherwise
# unchanged. (The causal mask does depend on positions, but only to hide some of them; it does not say how far
# away a key is.) For a sentence, or for reversing a string of digits, order is everything. See it:

# %%
attn = MultiHeadAttention(16, 4).eval()
x = torch.randn(1, 6, 16)  # (B, T, D): six tokens, no position information
order = torch.tensor([3, 0, 5, 1, 4, 2])  # a shuffle of the six positions
with torch.no_grad():
    out, _ = attn(x, x, x)  # no mask: every token sees every token
    out_shuffled, _ = attn(x[:, order], x[:, order], x[:, order])
print("shuffled input gives the same outputs, shuffled:",
      torch.allclose(out_shuffled, out[:, order], atol=1e-6))

# %% [markdown]
# The Transformer's answer is to **add** a vector that depends only on the position to each token's embedding,
# before the first layer. Then "token 7 at position 2" and "token 7 at position 5" are different vectors, and
# attention can learn to use the difference.
#
# ## 2. The sinusoidal table
#
# "Attention Is All You Need" uses fixed vectors, no training needed. Feature pair `i` (features `2i` and
# `2i + 1`) of position `pos` is a sine and a cosine of the same angle:
#
# $$PE[pos, 2i] = \sin\!\left(\frac{pos}{10000^{2i/D}}\right), \qquad PE[pos, 2i+1] = \cos\!\left(\frac{pos}{10000^{2i/D}}\right).$$
#
# Each pair turns at its own speed: pair 0 once every `2π ≈ 6.3` positions, the last pair so slowly that it
# barely moves over thousands of positions. Together they are like the hands of a clock, fast and slow, and
# every position gets its own combination. And since `sin` and `cos` of `pos + k` are a rotation of those of
# `pos`, the encoding of `pos + k` is a fixed linear map of the encoding of `pos`, the same map at every `pos`:
# "k positions further" looks the same everywhere, which attention can learn to use.
#
# A worked example with `D = 4` (two pairs, frequencies `1` and `1/10000^{2/4} = 1/100`):
#
# | pos | feature 0: sin(pos) | feature 1: cos(pos) | feature 2: sin(pos/100) | feature 3: cos(pos/100) |
# |---|---|---|---|---|
# | 0 | 0 | 1 | 0 | 1 |
# | 1 | 0.8415 | 0.5403 | 0.0100 | 1.0000 |
# | 2 | 0.9093 | -0.4161 | 0.0200 | 0.9998 |
#
# **Exercise.** Write `sinusoidal_table(max_len, d_model)` returning a float32 tensor of shape `(max_len, D)`
# (`D` is even). Build the angles for all positions and pairs at once with broadcasting, a `(max_len, 1)`
# column of positions times a `(D/2,)` row of frequencies, then fill the even features with `sin` and the odd
# ones with `cos` (slices `0::2` and `1::2`). Computing `10000^{-2i/D}` as `exp(-2i · ln(10000) / D)` is the
# usual, accurate way.

# %% exercise=sinusoidal_table

# %% test=sinusoidal_table points=1
from decoder_course.visible import l06_model as visible

visible.check_sinusoidal_table(sinusoidal_table)

# %% [markdown]
# The table as a picture: one row per position, one column per feature. The left columns (fast pairs) change
# from row to row; the right columns (slow pairs) hardly change. Every row is a different pattern.

# %%
plot_positional_encoding(sinusoidal_table(64, 128), title="sinusoidal_table(64, 128)");

# %% [markdown]
# What does attention see? The dot product of two positions' encodings depends only on their **distance**, and
# it is largest at distance 0: nearby positions look alike, far ones do not.

# %% demo
table = sinusoidal_table(100, 128)  # (max_len, D)
fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
for pos in (20, 50):
    ax.plot(table @ table[pos], label=f"PE[p] · PE[{pos}]")  # (max_len,): similarity to one position
ax.set(xlabel="position p", ylabel="dot product", title="similarity of positional encodings")
ax.legend();

# %% [markdown]
# ## 3. A module that adds positions
#
# `PositionalEncoding(d_model, max_len=512, dropout=0.0)` computes the table once, in `__init__`, and adds its
# first `T` rows to a `(B, T, D)` input in `forward`; the `(T, D)` rows broadcast over the batch. Then dropout,
# as in the paper (it is `nn.Dropout`: active after `.train()`, off after `.eval()`).
#
# The table is not trained, but it belongs to the module: it must move with `model.to(device)` and be saved in
# `model.state_dict()`. That is what a **buffer** is: `self.register_buffer("pe", table)`. (A plain attribute
# would stay on the CPU; an `nn.Parameter` would be trained.) Keep the name `pe`: the grader loads tables into
# it.
#
# **Exercise.** Write `PositionalEncoding`. Do not modify the input in place (`x + ...`, not `x += ...`).

# %% exercise=PositionalEncoding

# %% test=PositionalEncoding points=2
from decoder_course.visible import l06_model as visible

visible.check_positional_encoding(PositionalEncoding, sinusoidal_table)

# %% [markdown]
# ## 4. The encoder layer
#
# The encoder reads the whole source at once. An encoder layer is a decoder layer with less in it: a
# self-attention over the source **without a causal mask** (every source token may read every other: the source
# is given in full, nothing is generated), then the feed-forward, each with its residual connection and
# LayerNorm. The only mask is the source padding: no query may read a padded key. Padding is a property of the
# *keys*, so `src_is_real` (B, S) becomes `allowed` of shape `(B, 1, 1, S)`, broadcast over heads and queries.
# (Padded queries still compute something; nothing downstream reads them, because the decoder's cross-attention
# masks the same positions.)
#
# | `norm_first` | sublayer wiring |
# |---|---|
# | `False` (post-LN, the paper) | `x = norm1(x + dropout1(self_attn(x)))`, then `x = norm2(x + dropout2(feed_forward(x)))` |
# | `True` (pre-LN) | `x = x + dropout1(self_attn(norm1(x)))`, then `x = x + dropout2(feed_forward(norm2(x)))` |
#
# **Exercise.** Write `EncoderLayer(d_model, n_heads, d_ff, dropout=0.1, norm_first=False)` from the blocks above:
# `self_attn` a `MultiHeadAttention(d_model, n_heads, dropout)`, `feed_forward` a `FeedForward(d_model, d_ff,
# dropout)`, `norm1` and `norm2` (`nn.LayerNorm(d_model)`), `dropout1` and `dropout2`: weights are loaded by these
# names. `forward(x, src_is_real=None)` returns `(B, S, D)` and leaves `x` unchanged. It must equal PyTorch's
# `nn.TransformerEncoderLayer(batch_first=True, norm_first=...)` with the same weights, in eval mode, for both
# LayerNorm placements (not a wrapper around it: write it from the blocks).

# %% exercise=EncoderLayer

# %% test=EncoderLayer points=2
from decoder_course.visible import l06_model as visible

visible.check_encoder_layer(EncoderLayer)

# %% [markdown]
# The check the grader makes, both LayerNorm placements: PyTorch's layer, its weights copied into yours
# (`load_from_torch_encoder_layer` unpacks its `in_proj_weight` into `q_proj`, `k_proj`, `v_proj`), and its
# padding mask, `src_key_padding_mask`, which means **True = ignore this key**: the opposite of our `is_real`,
# inverted right here, at the boundary, and nowhere else.

# %% given=load_from_torch_encoder_layer

# %%
src = torch.randn(2, 7, 32)  # (B, S, D)
src_real = torch.arange(7) < torch.tensor([[7], [4]])  # (B, S): the second source has 3 pads
for norm_first in (False, True):
    theirs = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first).eval()
    ours = load_from_torch_encoder_layer(EncoderLayer(32, 4, 64, norm_first=norm_first), theirs).eval()
    with torch.no_grad():
        gap = (ours(src, src_real) - theirs(src, src_key_padding_mask=~src_real)).abs().max().item()
    print(f"norm_first={norm_first!s:5}: max |ours - nn.TransformerEncoderLayer| = {gap:.1e}")

# %% [markdown]
# The encoder is a stack of these layers, built like the decoder stack of the next section (given, so that its
# check does not depend on yours): `N` of your `EncoderLayer`s, each reading the previous one's output with the
# same `src_is_real`, then a final LayerNorm when pre-LN. No part of the model is PyTorch's any more.

# %% given=Encoder

# %% [markdown]
# ## 5. The decoder stack
#
# The decoder is `N` decoder layers applied one after the other: the output of layer `l` is the input of layer
# `l + 1`, and every layer gets the **same** memory and the same two masks. Each layer has its own weights: `N`
# separate `DecoderLayer` objects, in an `nn.ModuleList` (a plain Python list would hide them from
# `.parameters()`, `.to()` and `state_dict()`; `[layer] * N` would be one layer used `N` times).
#
# **A final LayerNorm, for pre-LN only.** A pre-LN layer normalises each sublayer's *input* and adds the
# sublayer's output to a residual stream that is never normalised (lesson 05). After the last layer that stream
# is unnormalised, and its scale grows with depth, so a pre-LN stack ends with one more LayerNorm. A post-LN
# stack already ends with a LayerNorm (the last layer's `norm3`): it gets none (use `nn.Identity()`, which has no
# parameters). PyTorch does the same: `nn.TransformerDecoder(..., norm=nn.LayerNorm(D))` for pre-LN models.
#
# **Exercise.** Write `Decoder(d_model, n_heads, d_ff, n_layers, dropout=0.1, norm_first=True)` with the
# submodules `layers` (an `nn.ModuleList` of `DecoderLayer`) and `norm`: weights are loaded by these names.

# %% exercise=Decoder

# %% test=Decoder points=2
from decoder_course.visible import l06_model as visible

visible.check_decoder(Decoder)

# %% [markdown]
# The same check the grader makes: PyTorch's `nn.TransformerDecoder`, three layers, both LayerNorm placements,
# weights copied layer by layer with lesson 05's helper, and PyTorch's masks inverted at the boundary.

# %%
D, H, d_ff, N, B, T, S = 32, 4, 64, 3, 2, 5, 7
x, memory = torch.randn(B, T, D), torch.randn(B, S, D)  # (B, T, D), (B, S, D)
tgt_is_real = torch.arange(T) < torch.tensor([[5], [3]])  # (B, T): the second target has 2 pads
src_is_real = torch.arange(S) < torch.tensor([[7], [5]])  # (B, S): the second source has 2 pads
causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
self_allowed = causal & tgt_is_real[:, None, None, :]  # (B, 1, T, T)
cross_allowed = src_is_real[:, None, None, :]  # (B, 1, 1, S)

for norm_first in (False, True):
    theirs = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, d_ff, batch_first=True, norm_first=norm_first),
        num_layers=N, norm=nn.LayerNorm(D) if norm_first else None,
    ).eval()
    ours = Decoder(D, H, d_ff, N, norm_first=norm_first).eval()
    for our_layer, their_layer in zip(ours.layers, theirs.layers):
        load_from_torch_decoder_layer(our_layer, their_layer)
    if norm_first:
        ours.norm.load_state_dict(theirs.norm.state_dict())
    with torch.no_grad():
        got = ours(x, memory, self_allowed, cross_allowed)
        # PyTorch's masks: True = blocked, so ours are inverted here, at the boundary
        want = theirs(x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real,
                      memory_key_padding_mask=~src_is_real)
    print(f"norm_first={norm_first!s:5}: {N} layers, max |ours - nn.TransformerDecoder| = "
          f"{(got - want).abs().max().item():.1e}")

# %% [markdown]
# ## 6. The whole model
#
# `Seq2SeqTransformer` joins the pieces. Its submodules, with the names the grader loads weights by:
#
# | name | module | role |
# |---|---|---|
# | `src_embed` | `nn.Embedding(src_vocab, D)` | source ids → vectors |
# | `tgt_embed` | `nn.Embedding(tgt_vocab, D)` | target ids → vectors |
# | `pos_encoding` | `PositionalEncoding(D, max_len, dropout)` | shared by both sides: it has no weights |
# | `encoder` | `Encoder(D, H, F, N, dropout, norm_first)` | source → memory `(B, S, D)` |
# | `decoder` | `Decoder(D, H, F, N, dropout, norm_first)` | target + memory → `(B, T, D)` |
# | `out_proj` | `nn.Linear(D, tgt_vocab)` | one score per vocabulary entry: logits `(B, T, V)` |
#
# It has three methods. `encode(src_ids, src_is_real)` embeds the source, adds positions and runs the
# encoder. `decode(tgt_ids, memory, src_is_real, tgt_is_real)` does the same for the target, runs the decoder
# and projects to logits. `forward` is `decode(tgt_ids, encode(src_ids, ...), ...)`. They are separate because
# generation (lesson 08) encodes the source once and then calls `decode` once per new token.
#
# **The masks are built inside `decode`**, from what it is given:
#
# - `self_allowed`: causal, `(1, 1, T, T)`; and when `tgt_is_real` is given, also no padded target key:
#   `(B, 1, T, T)`;
# - `cross_allowed`: every target position may read every **real** source token: `src_is_real` as
#   `(B, 1, 1, S)`, or `None` when no `src_is_real` is given.
#
# **Weight tying** (`tie_weights=True`, Press & Wolf 2017). `tgt_embed.weight` is a `(V, D)` matrix: row `v`
# is token `v`'s vector. `out_proj.weight` is also `(V, D)`: row `v` scores how well the decoder's output
# matches token `v`. Tying makes them **the same parameter** (`self.out_proj.weight = self.tgt_embed.weight`),
# one storage and one gradient: it saves `V × D` parameters, and a token's input and output vectors learn from
# each other. Copying the values once (`.data.copy_`) is not tying: the two would drift apart at the first step.
#
# **A departure from the paper: no `√D` scaling.** The paper multiplies the embeddings by `√D` before adding
# positions; its embeddings start small. PyTorch's `nn.Embedding` starts at `N(0, 1)`, so every embedding
# already has norm about `√D`, while a positional encoding has entries of at most 1; multiplying by `√D` makes
# the tokens `√D` times louder still and drowns the positions. We keep the scaling as an option,
# `scale_embedding=False` by default (stored as `self.embed_scale`, `√D` or `1.0`). Lesson 07 measures what it
# costs.
#
# **Exercise.** Write `Seq2SeqTransformer`: `__init__` with the submodules above, then `encode`, `decode` and
# `forward`.

# %% exercise=Seq2SeqTransformer

# %% test=Seq2SeqTransformer points=2
from decoder_course.visible import l06_model as visible

visible.check_seq2seq_transformer(Seq2SeqTransformer)

# %% [markdown]
# ## 7. A worked system: the paper-sized pre-LN model on a padded batch
#
# The paper's sizes, pre-LN: `D = 512`, 8 heads, `F = 2048`, 4 encoder and 4 decoder layers, a vocabulary of
# 1000 tokens on both sides. A batch of 2 sources of length 7, with 5 and 6 real tokens, and 2 targets of length
# 5, with 3 and 4 real tokens. Expect logits `(2, 5, 1000)`: one score for every vocabulary entry, at every
# target position.
#
# Then two checks on the masks, through the whole model. Changing the **padded source** tokens must change
# nothing; changing the target tokens **after** position 1 must leave the logits at positions 0 and 1 alone.

# %% demo
V, D, H, d_ff, N = 1000, 512, 8, 2048, 4
model = Seq2SeqTransformer(V, V, D, H, d_ff, N, dropout=0.1, tie_weights=True, norm_first=True).to(device).eval()

src_is_real = torch.arange(7) < torch.tensor([[5], [6]])  # (B, S) = (2, 7): 5 and 6 real tokens
tgt_is_real = torch.arange(5) < torch.tensor([[3], [4]])  # (B, T) = (2, 5): 3 and 4 real tokens
src_ids = torch.randint(3, V, (2, 7)).masked_fill(~src_is_real, PAD)  # (B, S)
tgt_ids = torch.randint(3, V, (2, 5)).masked_fill(~tgt_is_real, PAD)  # (B, T)
# the inputs go where the model is (made on the CPU first, so the random ids are the same on every device)
src_is_real, tgt_is_real, src_ids, tgt_ids = (t.to(device) for t in (src_is_real, tgt_is_real, src_ids, tgt_ids))
with torch.no_grad():
    logits = model(src_ids, tgt_ids, src_is_real, tgt_is_real)

n_params = sum(p.numel() for p in model.parameters())  # a tied parameter is counted once
print("logits:", tuple(logits.shape), logits.dtype, "| finite:", bool(torch.isfinite(logits).all()))
print(f"parameters: {n_params:,} tied; {n_params + V * D:,} untied (tying saves V × D = {V * D:,})")
print("out_proj.weight is tgt_embed.weight:", model.out_proj.weight is model.tgt_embed.weight)
assert logits.shape == (2, 5, 1000)

with torch.no_grad():
    other_src = torch.where(src_is_real, src_ids, torch.randint(3, V, src_ids.shape, device=device))  # new pads
    logits_src = model(other_src, tgt_ids, src_is_real, tgt_is_real)
    other_tgt = tgt_ids.clone()
    other_tgt[:, 2:] = torch.randint(3, V, (2, 3), device=device)  # new target tokens at positions 2, 3, 4
    logits_tgt = model(src_ids, other_tgt, src_is_real)  # no target padding here: only the causal mask
    base = model(src_ids, tgt_ids, src_is_real)
print(f"padded source changed:   max |Δ logits|          = {(logits_src - logits).abs().max().item():.1e}")
print(f"targets 2..4 changed:    max |Δ logits[:, :2]|   = {(logits_tgt - base)[:, :2].abs().max().item():.1e}"
      f"   (position 2 changed: {not torch.allclose(logits_tgt[:, 2], base[:, 2])})")

# %% [markdown]
# ## 8. What this model still lacks
#
# It computes logits, and its masks hold. It cannot yet learn or speak. Before it can:
#
# | missing | why it matters | where |
# |---|---|---|
# | **shifted targets** (teacher forcing) | the decoder must read `BOS, y₀, …, y_{T-2}` and predict `y₀, …, y_{T-1}`; fed the target itself, each position would predict the token it already sees | lesson 07: `shift_right` |
# | **a pad-aware loss** | padded positions are not tokens: counting them dilutes the loss and trains the model to predict `PAD` | lesson 07: `sequence_loss` (with label smoothing) |
# | **special tokens** | `BOS` starts every decoder input, `EOS` ends every target so that the model learns to stop, `PAD` fills batches | lesson 07 (teacher forcing), lesson 08 (stopping) |
# | **weight tying** | one `(V, D)` matrix for input and output tokens: fewer parameters, better-trained rare tokens | done: `tie_weights=True` above |
# | **decoding with stop conditions** | at inference there is no target: generate one token at a time, each sequence of the batch stopping at its own `EOS` or at `max_len`; greedy, sampling (temperature, top-k, top-p) or beam search | lesson 08; lesson 09 makes it fast with a KV cache |
# | **a guard for fully masked rows** | a query with no allowed key (left padding, an empty source) must give zeros, not NaN: our attention already does it (lesson 02) | lesson 10 tests it under float16 / bfloat16, where `-inf` and `-1e9` break |
#
# ## 9. Find the bug
#
# Training and generation will not hand the model `is_real` masks: they hand it batches of token ids, padded with
# `PAD`. Below is a helper written by someone else on top of **your** `Seq2SeqTransformer`: it makes both masks from
# the ids and a `pad_id`, encodes the source once with `encode`, then calls `decode`, the two calls generation
# makes (lesson 08). It has **one** mistake. Its author tried it on a batch of sentences of the same length, where
# it returns exactly `model(src_ids, tgt_ids, ...)`; on a batch with padding it still runs, every shape is right and
# every logit looks like a logit, yet some of them are wrong.
#
# How would you find it? Section 7's probe is the tool: the padded source tokens must change nothing. Here the
# padding is read from the ids, so compare with the model's own `forward`, given the masks explicitly, on a batch
# whose sources have different lengths, and print the positions that differ. Then read each call the helper
# makes: which masks does it receive, and which does it need to do its part? The check under the cell does this
# with a stand-in for your model whose answers are PyTorch's, so that only the helper is on trial.
#
# **Exercise.** Find and fix the bug in `logits_from_ids(model, src_ids, tgt_ids, pad_id)`, in the given code. It
# is graded with your own `Seq2SeqTransformer` (and what it is built from): a mistake in those costs their own
# cells, not this one.

# %% exercise=logits_from_ids

# %% test=logits_from_ids points=1
from decoder_course.visible import l06_model as visible

visible.check_logits_from_ids(logits_from_ids)

# %% [markdown]
# ## What you built
#
# | piece | shape | what it does |
# |---|---|---|
# | `sinusoidal_table(max_len, D)` | `(max_len, D)` | sines and cosines of `pos / 10000^{2i/D}`, interleaved |
# | `PositionalEncoding(D, max_len, dropout)` | `(B, T, D) → (B, T, D)` | adds `pe[:T]` (a buffer), then dropout |
# | `EncoderLayer(D, H, F, dropout, norm_first)` | `(B, S, D) → (B, S, D)` | self-attention without a causal mask (padding keys masked), feed-forward; equals `nn.TransformerEncoderLayer` |
# | `Decoder(D, H, F, N, dropout, norm_first)` | `(B, T, D), (B, S, D) → (B, T, D)` | `N` layers, final LayerNorm when pre-LN; equals `nn.TransformerDecoder` |
# | `Seq2SeqTransformer(...)` | `(B, S), (B, T) → (B, T, V)` | embeddings + positions, encoder, decoder, output projection; builds its masks; optional weight tying |
# | `logits_from_ids(model, src_ids, tgt_ids, pad_id)` (fixed) | `(B, S), (B, T) → (B, T, V)` | both masks made from `pad_id`, each handed to every call that reads that side |
#
# Next: lesson 07 trains this model on a toy task and watches it learn, and unlearn when a mask is removed.
