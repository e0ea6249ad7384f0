# %% [markdown]
# # Lesson 04 — Cross-attention: the decoder reads the source
#
# An encoder–decoder model (translation, summarising, our toy tasks of lesson 07) has two sequences. The
# **encoder** reads the source sentence, `S` tokens, and turns it into `S` vectors: the **memory**, `(B, S, D)`.
# The **decoder** writes the target, `T` tokens, one at a time. Each decoder layer attends twice:
#
# 1. **self-attention** over the target written so far (causal, lesson 03);
# 2. **cross-attention**: the decoder's positions are the **queries**, the memory gives the **keys and values**.
#    This is where a word of the translation looks up the source words it depends on.
#
# Cross-attention is lesson 03's `MultiHeadAttention` with `key = value = memory`, so `T ≠ S` is the normal case.
# Two things are new, and they are this lesson:
#
# - **its mask** has no causal part: the whole source is known before decoding starts; only memory padding is
#   hidden;
# - **its keys and values never change** while the decoder generates: they depend on the memory only. Computing
#   them once (`project_memory`) and reusing them at every step (`memory_kv=`) saves most of the work; lesson 09's
#   KV cache builds on it.
#
# Last, an **alignment heatmap**: a tiny "translation" whose right answer we know, to see cross-attention copy
# source words in a new order.
#
# Conventions: `B` batch, `T` target (query) length, `S` source (memory) length, `H` heads, `D` model width,
# `Dh = D // H`. Masks are boolean, **`True` = "this query may attend to this key"**, broadcasting to
# `(B, H, T, S)`; padding is `is_real`, `True` for real tokens.

# %%
import math

import numpy as np
import torch
from einops import rearrange
from torch import nn

from decoder_course.plots import plot_attention_heads, plot_masks

torch.manual_seed(0);  # every random tensor below is the same on every run

# %% [markdown]
# Lesson 03's building blocks, given so that this notebook runs on its own: the head split and merge, attention
# in PyTorch, `MultiHeadAttention`, and the weight copy from `nn.MultiheadAttention`.

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention,load_from_torch_mha

# %% [markdown]
# ## 1. The cross-attention mask
#
# In self-attention a target position may not see later target positions (causal mask). In cross-attention the
# keys are **source** positions, and the source was written in full before the decoder started: target position
# 0 may read the last source word as well as the first. So there is no triangle. What remains is padding: a
# batch of source sentences of different lengths is padded, and no query may attend to a pad.
#
# ![The two masks of a decoder layer side by side, for the target le chat dort PAD reading the source the cat is
# asleep PAD PAD. Left, self-attention, (B, 1, T, T): queries and keys are both target positions; allowed cells
# form the lower triangle (s ≤ t), and the key column of the target pad is blocked. Right, cross-attention,
# (B, 1, T, S): queries are target positions, keys are memory positions; there is no triangle, every row is the
# same, and only the two memory pad columns are blocked.](assets/attention_masks.png)
#
# Read the grids by rows: row `t` is what query `t` may look at. On the left the triangle keeps the future out; on
# the right the whole source is allowed from the first target word on, and only its padding is hidden.
#
# Worked example, `B = 2` source sentences of `S = 4` tokens, the second with two pads, and `T = 3` target
# positions:
#
# ```
# memory_is_real = [[True, True, True, False],        allowed[0, 0] = [[T T T F],     allowed[1, 0] = [[T T F F],
#                   [True, True, False, False]]                        [T T T F],                      [T T F F],
#                                                                      [T T T F]]                      [T T F F]]
# ```
#
# Every query row of a sequence is the same: that sequence's `memory_is_real`.
#
# **Exercise.** Write `cross_attention_mask(memory_is_real, T)` returning a boolean tensor `(B, 1, T, S)` (the
# `1` broadcasts over heads). Build a new tensor: do not change the caller's.

# %% exercise=cross_attention_mask

# %% test=cross_attention_mask points=1
from decoder_course.visible import l04_cross_attention as visible

visible.check_cross_attention_mask(cross_attention_mask)

# %% [markdown]
# The two masks of a decoder layer side by side, for a target of 4 tokens (the last a pad) reading a source of 6
# tokens (the last two pads). Self-attention: the triangle, and pad columns. Cross-attention: rectangular,
# `T × S`, only the source pads blocked.

# %% demo
tgt_is_real = torch.tensor([[True, True, True, False]])  # (B, T)
src_is_real = torch.tensor([[True, True, True, True, False, False]])  # (B, S)
self_allowed = torch.ones(4, 4, dtype=torch.bool).tril() & tgt_is_real[:, None, None, :]  # (B, 1, T, T)
cross_allowed = cross_attention_mask(src_is_real, 4)  # (B, 1, T, S) with T = 4
plot_masks([self_allowed, cross_allowed], titles=["self-attention (T × T)", "cross-attention (T × S)"]);

# %% [markdown]
# ## 2. `CrossAttention`: project the memory once
#
# At generation time the decoder produces one token per step. At step `t` it runs cross-attention for one new
# query, against the **same** memory as at every other step. The keys and values, `k_proj(memory)` and
# `v_proj(memory)` split into heads, are therefore the same at every step: recomputing them is `2·S·D²`
# multiply-adds per step, per layer, for nothing. So we split the work in two:
#
# - `project_memory(memory) -> (k, v)`: the memory's keys and values, each `(B, H, S, Dh)`, computed once;
# - `forward(query, memory=None, allowed=None, memory_kv=None) -> (out, weights)`: pass **either** the memory
#   (then project it here) **or** `memory_kv = project_memory(memory)` (then use it as it is, projecting nothing
#   but the queries). Both at once would be ambiguous (they could disagree): raise a `ValueError`, and also when
#   neither is given.
#
# `CrossAttention` subclasses `MultiHeadAttention`: it inherits `__init__`, hence the four projections and
# `self.dropout`, and you write only the two methods. The result must equal `MultiHeadAttention` called with
# `key = value = memory`. (Lesson 03's `forward(query, key, value, allowed)` is replaced by this one, with a
# different signature: cross-attention always reads the memory.)
#
# **Exercise.** Write `project_memory` and `forward`, from lesson 03's blocks (not `nn.MultiheadAttention` or
# `F.scaled_dot_product_attention`: the last check below refuses them, as a grader does).

# %% exercise=CrossAttention

# %% test=CrossAttention points=2
from decoder_course.visible import l04_cross_attention as visible

visible.check_cross_attention(CrossAttention)

# %% [markdown]
# ### What the reuse saves, measured
#
# A decoding loop of 64 steps over a memory of 300 tokens, `D = 256`: the memory projected at every step, then
# projected once. Forward hooks count how often `k_proj` runs.

# %%
import decoder_course
from decoder_course.devices import timer

device = decoder_course.device()  # cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE overrides)
clock = timer(device)  # reads the time once the device's queued work is done (a GPU runs asynchronously)
D, H, S, steps = 256, 4, 300, 64
xattn = CrossAttention(D, H).to(device).eval()
memory = torch.randn(1, S, D, device=device)  # (B, S, D): one source sentence
queries = torch.randn(1, steps, D, device=device)  # (B, T, D): one new query per decoding step
k_proj_calls = []
hook = xattn.k_proj.register_forward_hook(lambda *_: k_proj_calls.append(1))

with torch.no_grad():
    start = clock()
    for t in range(steps):  # the memory projected again at every step
        xattn(queries[:, t:t + 1], memory)
    every_step = clock() - start
    calls_every_step = len(k_proj_calls)

    start = clock()
    memory_kv = xattn.project_memory(memory)  # ((B, H, S, Dh), (B, H, S, Dh)), once
    for t in range(steps):
        xattn(queries[:, t:t + 1], memory_kv=memory_kv)
    once = clock() - start
hook.remove()
print(f"memory projected at every step: {every_step * 1000:6.1f} ms, k_proj ran {calls_every_step} times")
print(f"memory projected once         : {once * 1000:6.1f} ms, k_proj ran {len(k_proj_calls) - calls_every_step} time")
print(f"speed-up {every_step / once:.1f}x on this machine")

# %% [markdown]
# ## 3. Is it right? `nn.MultiheadAttention` again, and the polarity trap again
#
# PyTorch has no separate cross-attention module: `nn.MultiheadAttention(query, memory, memory)` is it. Its
# padding argument is `key_padding_mask`, `(B, S)`, **`True` at padding**: the opposite of `memory_is_real`. We
# invert at that call and only there.

# %%
B, T, S, D, H = 2, 4, 6, 16, 4
theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
with torch.no_grad():  # PyTorch starts its biases at zero: give them values, so that a bias mistake would show
    theirs.in_proj_bias.normal_()
    theirs.out_proj.bias.normal_()
ours = load_from_torch_mha(CrossAttention(D, H), theirs).eval()  # CrossAttention has the same four projections
query, memory = torch.randn(B, T, D), torch.randn(B, S, D)
memory_is_real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # (B, S)

with torch.no_grad():
    out, weights = ours(query, memory, allowed=cross_attention_mask(memory_is_real, T))
    # PyTorch's boundary: key_padding_mask is True at padding, so it is ~memory_is_real
    want, want_w = theirs(query, memory, memory, key_padding_mask=~memory_is_real, average_attn_weights=False)
print(f"max |ours - theirs| = {(out - want).abs().max():.1e} (output), {(weights - want_w).abs().max():.1e} (weights)")

# %% [markdown]
# ## 4. An alignment you can read: a hand-made translation
#
# Attention weights are easiest to understand where we know the right answer. Take a four-word "translation"
# with a reordering, as between French and English, where the adjective moves:
#
# ```
# source (S = 5):  le   chat   noir   dort   <pad>
# target (T = 4):  the  black  cat    sleeps
# aligned to:      le   noir   chat   dort
# ```
#
# We set the weights of a 2-head `CrossAttention` **by hand** instead of training them:
#
# - every memory vector is a one-hot code of its source position, and every query a one-hot code of its target
#   position;
# - `k_proj` passes the position codes through, into both heads;
# - head 0's `q_proj` maps target position `t` onto the code of its aligned source position, times a large
#   scale, so the query of `black` scores high against exactly the key of `noir`;
# - head 1's `q_proj` sends every target position to the code of position 3 (`dort`): a head that always looks
#   at the verb, to show that heads can do different things;
# - `v_proj` and `out_proj` pass the codes through, so the output of position `t` says which source position it
#   read.

# %% demo
source = ["le", "chat", "noir", "dort", "<pad>"]
target = ["the", "black", "cat", "sleeps"]
align = [0, 2, 1, 3]  # target position t reads source position align[t]
S, T, D, H = len(source), len(target), 16, 2
Dh, scale = D // H, 20.0

eye = torch.eye(D)
memory = eye[:S][None]  # (B, S, D): source position s is the one-hot code e_s
query = eye[:T][None]  # (B, T, D): target position t is the one-hot code e_t
w_q, w_kv = torch.zeros(D, D), torch.zeros(D, D)  # nn.Linear computes x @ W.T: row = output, column = input
for t in range(T):
    w_q[0 * Dh + align[t], t] = scale  # head 0: target t asks for source position align[t]
    w_q[1 * Dh + 3, t] = scale  # head 1: every target position asks for position 3, the verb
for s in range(S):
    w_kv[0 * Dh + s, s] = w_kv[1 * Dh + s, s] = 1.0  # both heads see the position codes

toy = CrossAttention(D, H).eval()
state = {"q_proj.weight": w_q, "k_proj.weight": w_kv, "v_proj.weight": w_kv, "out_proj.weight": eye}
state |= {f"{name}.bias": torch.zeros(D) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
toy.load_state_dict(state)

memory_is_real = torch.tensor([[tok != "<pad>" for tok in source]])  # (B, S)
with torch.no_grad():
    out, weights = toy(query, memory, allowed=cross_attention_mask(memory_is_real, T))  # (B, T, D), (B, H, T, S)
read = out[0, :, :S].argmax(dim=-1)  # (T,): head 0's output features 0..S-1 name the source position it read
print("head 0 reads:", [f"{target[t]} <- {source[int(read[t])]}" for t in range(T)])
print("the alignment we set by hand:", weights[0, 0].argmax(dim=-1).tolist() == align)
plot_attention_heads(weights, query_tokens=target, key_tokens=source,
                     title="cross-attention: head 0 aligns, head 1 always reads the verb",
                     allowed=cross_attention_mask(memory_is_real, T));

# %% [markdown]
# Read the heatmap row by row: each target word is a query, and its row shows where it looked in the source.
# Head 0's bright cells are off the diagonal exactly where the adjective moved (`black → noir`, `cat → chat`), and
# the `<pad>` column is hatched (blocked) in both heads. A trained model's heads are rarely this crisp, but this is the
# picture to look for. For a model trained to reverse a sequence (lesson 07), the right alignment is the
# anti-diagonal.
#
# ## 5. Find the bug
#
# A decoding loop calls cross-attention once per generated token, always with the same memory. Passing
# `memory_kv` around by hand (section 2) is easy to forget, so here is a small wrapper written by someone else on
# top of **your** `project_memory`, `forward(memory_kv=...)` and `cross_attention_mask`: the loop keeps calling
# `cached(query, memory, memory_is_real)` as if nothing were cached, and the wrapper projects the memory at the
# first call and reuses its keys and values at the later ones. It has **one** mistake. Its author tried it on
# one batch, where every step gives exactly the right answer and the memory is projected once. Nothing crashes
# when the next batch of sentences comes, of the same shape: each output still looks like an attention output,
# and yet it belongs to the wrong sentences.
#
# How would you find it? Ask what must hold whatever the calls before: a cache may change how much work a call
# does, never what it returns. So run a loop over two batches in a row and compare every call with the uncached
# one, `xattn(query, memory, allowed=cross_attention_mask(memory_is_real, T))`, and print the calls that
# disagree; then count the projections (a forward hook on `k_proj`) and compare the count with the number of times
# the memory changed. The check under the cell does both for you, with a stand-in for `CrossAttention` whose
# answers are PyTorch's, so that only the given code is on trial.
#
# **Exercise.** Find and fix the bug in `CachedCrossAttention`, in the given code. It is graded with your own
# `CrossAttention` and `cross_attention_mask`: a mistake in those costs their own cells, not this one.

# %% exercise=CachedCrossAttention

# %% test=CachedCrossAttention points=1
from decoder_course.visible import l04_cross_attention as visible

visible.check_cached_cross_attention(CachedCrossAttention)

# %% [markdown]
# ## What you built
#
# | name | shape | idea |
# |---|---|---|
# | `cross_attention_mask(memory_is_real, T)` | `(B, S) → (B, 1, T, S)` | every query sees every real source token; no causal part |
# | `CrossAttention.project_memory(memory)` | `(B, S, D) → (k, v)`, each `(B, H, S, Dh)` | the memory's keys and values, computed once |
# | `CrossAttention.forward(query, memory=None, allowed=None, memory_kv=None)` | `(B, T, D) → (B, T, D), (B, H, T, S)` | queries from the decoder, keys and values from the memory, reused |
# | `CachedCrossAttention(xattn)` (fixed) | `cached(query, memory, memory_is_real)`: `(B, T, D) → (B, T, D), (B, H, T, S)` | each memory projected once; its keys and values belong to it |
#
# Next, lesson 05 puts self-attention, cross-attention and a feed-forward block together into a decoder layer,
# and checks it against `nn.TransformerDecoderLayer`.
