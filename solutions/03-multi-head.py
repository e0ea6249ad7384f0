# %% [markdown]
# # Lesson 03 — Multi-head attention: from NumPy to PyTorch
#
# In lesson 02 each query computed **one** weighted average of the values: one way of looking at the keys. A
# token often needs several at once: the previous token, the word it agrees with, the source word it translates.
# **Multi-head attention** runs `H` attentions side by side. Each head works in its own slice of the model width,
# `Dh = D // H` features, with its own queries, keys and values, so each can learn to look for something else.
# The heads' outputs are put back side by side and mixed by one last linear map.
#
# It costs no more than one head of width `D`: the projections are still `D × D` matrices, and the `H` heads are
# computed at once by treating the head axis like a batch axis. That is the whole trick of this lesson, and it
# is all about moving axes around:
#
# 1. **split and merge heads** with `einops` (named axes that check themselves);
# 2. the same **by hand with `reshape`**, to see what `einops` saves you from;
# 3. lesson 02's attention **in PyTorch** (given);
# 4. the **`MultiHeadAttention`** module;
# 5. a proof that it equals **PyTorch's `nn.MultiheadAttention`**, and the mask-polarity trap met on the way.
#
# Conventions as before: `B` batch, `T` query length, `S` key length, `H` heads, `D` model width, `Dh = D // H`.
# A mask is boolean and **`True` means "this query may attend to this key"** (`allowed`), broadcasting to
# `(B, H, T, S)`; a query with no allowed key gets zero weights.

# %%
import math

import numpy as np
import torch
from einops import rearrange
from torch import nn

from decoder_course.plots import plot_attention_heads

torch.manual_seed(0);  # every random tensor below is the same on every run

# %% [markdown]
# ## 1. Heads are slices of the model width
#
# A sequence of `T` vectors of width `D` is an array `(B, T, D)`. With `H` heads, head `h` owns the contiguous
# features `h·Dh … (h+1)·Dh − 1` of every vector. The worked example we use throughout: `B = 1`, `T = 2`,
# `D = 6`, `H = 3`, so `Dh = 2`:
#
# ```
#                  head 0   head 1   head 2
# time 0:  x[0, 0] = [ 0  1 |  2  3 |  4  5 ]
# time 1:  x[0, 1] = [10 11 | 12 13 | 14 15 ]
# ```
#
# Splitting gives each head its own `(T, Dh)` matrix, and we move the head axis **before** time:
#
# ```
# head 0: [[ 0,  1],     head 1: [[ 2,  3],     head 2: [[ 4,  5],
#          [10, 11]]              [12, 13]]              [14, 15]]      →  shape (B, H, T, Dh) = (1, 3, 2, 2)
# ```
#
# Why `(B, H, T, Dh)`? A matrix product works on the **last two** axes and treats every axis before them as a
# batch. With heads before time, `q @ k.swapaxes(-1, -2)` (only the last two axes swapped, as in lesson 02) is
# `(T, Dh) @ (Dh, S)` for every sequence *and* every head at once: one call, no Python loop over heads. Lesson 02's attention runs unchanged on such arrays.
#
# ### einops in one minute
#
# `einops.rearrange(x, pattern)` moves axes by **name**. Names in brackets are axes merged into one; on the left
# of the arrow they say how to cut an axis, and sizes you give (`a=2`) let einops work out the rest. The names are
# checked: a size that does not fit raises an error instead of silently scrambling data. Two examples on a
# different task, cutting 6 time steps into 2 chunks of 3:

# %%
x = np.arange(2 * 6 * 4).reshape(2, 6, 4)  # (B, T, D) = (2, 6, 4)
chunks = rearrange(x, "b (c t) d -> b c t d", c=2)  # (B, 2 chunks, 3 steps, D)
print(chunks.shape, "— chunk 1 starts at time step 3:", np.array_equal(chunks[:, 1, 0], x[:, 3]))
print(rearrange(chunks, "b c t d -> b (c t) d").shape, "— and back")
try:
    rearrange(x, "b (c t) d -> b c t d", c=4)  # 6 steps do not cut into 4 equal chunks
except Exception as exc:  # einops.EinopsError
    print("einops refuses:", str(exc).splitlines()[-1])

# %% [markdown]
# **Exercise.** Write `split_heads(x, H)`: `(B, T, D) → (B, H, T, Dh)` with one `rearrange`. Since einops works
# on NumPy arrays and PyTorch tensors alike, so does your function, and the check tries both.

# %% exercise=split_heads

# %% test=split_heads points=1
from decoder_course.visible import l03_multi_head as visible

visible.check_split_heads(split_heads)

# %% [markdown]
# **Exercise.** Write `merge_heads(x)`: the inverse, `(B, H, T, Dh) → (B, T, D)`, heads side by side again.

# %% exercise=merge_heads

# %% test=merge_heads points=1
from decoder_course.visible import l03_multi_head as visible

visible.check_merge_heads(merge_heads)

# %% [markdown]
# The worked example, split and merged back:

# %%
example = np.array([[[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]]])  # (B, T, D) = (1, 2, 6)
heads = split_heads(example, 3)  # (B, H, T, Dh) = (1, 3, 2, 2)
for h in range(3):
    print(f"head {h}:", heads[0, h].tolist())
print("merge_heads undoes it:", np.array_equal(merge_heads(heads), example))

# %% [markdown]
# ## 2. The same by hand: `reshape`, then swap axes
#
# What does `rearrange` do for you? Two steps:
#
# 1. `x.reshape(B, T, H, Dh)` cuts the last axis into `H` chunks of `Dh`. A reshape never moves data: it reads
#    the same numbers in the same (row-major) order with a new shape, so cutting the **last** axis into
#    consecutive pieces is exactly what it can do.
# 2. `.swapaxes(1, 2)` then exchanges time and heads: `(B, T, H, Dh) → (B, H, T, Dh)`.
#
# **The trap** is to reshape straight to `(B, H, T, Dh)`. The shape is right and nothing complains, but the data is
# read in the wrong order: "head 0" gets the first `T·Dh` numbers of the sequence, which mixes time steps into
# heads. Look:

# %%
wrong = example.reshape(1, 3, 2, 2)  # straight to (B, H, T, Dh): right shape, wrong content
print("reshape straight, head 0:", wrong[0, 0].tolist(), "← time step 1's features 0, 1 are missing")
print("cut D, then swap, head 0:", example.reshape(1, 2, 3, 2).swapaxes(1, 2)[0, 0].tolist())

# %% [markdown]
# Merging is the same two steps in reverse: swap back to `(B, T, H, Dh)`, then reshape to `(B, T, D)`.
#
# NumPy and PyTorch share `.reshape` and `.swapaxes`, so one function can serve both. Beware the look-alikes:
# torch's `x.transpose(1, 2)` swaps two axes but NumPy's `x.transpose(...)` wants *all* the axes, and torch's
# `x.view(shape)` reshapes while NumPy's `x.view(...)` reinterprets the dtype (torch's `.view` also refuses a
# tensor whose axes were just swapped; `.reshape` copies when it must).
#
# **Exercise.** Write `split_heads_reshape(x, H)` and `merge_heads_reshape(x)` without einops. Raise a
# `ValueError` when `D` is not divisible by `H` (einops did that for you).

# %% exercise=split_heads_reshape

# %% test=split_heads_reshape points=1
from decoder_course.visible import l03_multi_head as visible

visible.check_split_heads_reshape(split_heads_reshape)

# %% exercise=merge_heads_reshape

# %% test=merge_heads_reshape points=1
from decoder_course.visible import l03_multi_head as visible

visible.check_merge_heads_reshape(merge_heads_reshape)

# %% [markdown]
# ## 3. Attention in PyTorch
#
# From here on we work in PyTorch. Three things change from NumPy:
#
# - a **tensor** remembers how it was computed, so `loss.backward()` can fill in every gradient (training,
#   lesson 07). Whatever you write must keep flowing through torch operations;
# - an **`nn.Module`** holds parameters (here `nn.Linear(D, D)`: `y = x @ W.T + b`) and is called like a
#   function; `module.eval()` turns off training-only behaviour such as dropout;
# - NumPy's `np.where(allowed, s, fill)` becomes `s.masked_fill(~allowed, fill)`, `np.finfo` becomes
#   `torch.finfo`, and axes are `dim=` rather than `axis=`.
#
# Here is lesson 02's `scaled_dot_product_attention` ported to PyTorch, as a given building block. Read it: it is
# your lesson 02 code, with one addition, `dropout` on the weights (as `nn.MultiheadAttention` does). Because
# every operation works on the last two axes, it computes all heads at once when given `(B, H, T, Dh)` tensors.

# %% given=attention

# %% [markdown]
# A quick check of the promise "a query with no allowed key gets zeros, not NaN": query 1 may see nothing. The
# gradients stay finite too, because the fill is the most negative *finite* number, not `-inf`.

# %%
q = torch.randn(1, 2, 3, 4, requires_grad=True)  # (B, H, T, Dh)
k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)  # (B, H, S, Dh)
allowed = torch.ones(3, 5, dtype=torch.bool)  # (T, S), broadcast over B and H
allowed[1] = False  # query 1 may attend to nothing
out, weights = attention(q, k, v, allowed)  # (B, H, T, Dh), (B, H, T, S)
out.sum().backward()
print("weights of query 1:", weights[0, 0, 1].tolist())
print("output of query 1 :", out[0, 0, 1].tolist())
print("gradient finite   :", bool(torch.isfinite(q.grad).all()))

# %% [markdown]
# ## 4. `MultiHeadAttention`
#
# ![Multi-head attention, left to right. The query (B, T, D) and the key and value (B, S, D), each drawn as a bar
# cut into head slices h0, h1, h2, go through their own linear map q_proj, k_proj, v_proj. split_heads turns each
# into one card per head: (B, H, T, Dh) for the queries, (B, H, S, Dh) for keys and values. The scores q kᵀ / √Dh
# are one T × S grid per head, (B, H, T, S); the mask allowed (B, 1, T, S) broadcasts over the heads; a masked
# softmax over S gives the weights, each row summing to 1; weights @ v gives one (B, H, T, Dh) output per head;
# merge_heads puts the heads back side by side as (B, T, D), and out_proj mixes them into the output
# (B, T, D).](assets/multi_head.png)
#
# The shapes are the lesson: the head axis is created by `split_heads`, carried through every step as if it were
# a second batch axis (one matrix product for all heads), and removed by `merge_heads`. The mask has a `1` where
# the heads are, so one mask serves them all.
#
# Each projection is one `nn.Linear(D, D)`: head `h` reads only its own output features `h·Dh … (h+1)·Dh − 1`,
# so one `D × D` matrix holds `H` separate `D × Dh` projections side by side and computes them in one product.
# `out_proj` mixes the heads afterwards. Queries may come from one sequence and keys/values from another
# (cross-attention, next lesson), so `T` and `S` may differ.
#
# **Exercise.** Write the module. The names are part of the contract (weights are loaded by name when graded, and
# later lessons build on it):
#
# - `__init__(d_model, n_heads, dropout=0.0)`: raise `ValueError` when `d_model % n_heads != 0`; store
#   `self.n_heads` and `self.d_head`; four `nn.Linear(d_model, d_model)` with bias named `q_proj`, `k_proj`,
#   `v_proj`, `out_proj`; `self.dropout = nn.Dropout(dropout)`, handed to `attention` (it acts on the weights in
#   training mode and does nothing after `.eval()`). No other parameters.
# - `forward(query, key, value, allowed=None) -> (out, weights)`: `out (B, T, D)` and the per-head weights
#   `(B, H, T, S)`. Use your `split_heads`, `merge_heads` and the given `attention`; `allowed` is passed on as it
#   is (it broadcasts).
#
# A query with no allowed key gets a zero attention output, so its output row is just `out_proj.bias`. Do not call
# `nn.MultiheadAttention` or `F.scaled_dot_product_attention` inside your module: they are what we compare
# against in section 5, and the last check below refuses them, as a grader does.

# %% exercise=MultiHeadAttention

# %% test=MultiHeadAttention points=2
from decoder_course.visible import l03_multi_head as visible

visible.check_multi_head_attention(MultiHeadAttention)

# %% [markdown]
# What do the heads look like? With random weights they have learnt nothing yet, but each head already has its
# own pattern, and the causal + padding mask is respected in every one of them: the blocked cells (hatched) are
# everything above the diagonal and the padded columns.

# %% demo
tokens = ["<bos>", "the", "cat", "sat", "<pad>", "<pad>"]
T = len(tokens)
is_real = torch.tensor([[tok != "<pad>" for tok in tokens]])  # (B, T) = (1, 6)
allowed = torch.ones(T, T, dtype=torch.bool).tril() & is_real[:, None, None, :]  # (B, 1, T, T)
mha = MultiHeadAttention(d_model=16, n_heads=4).eval()
x = 2.0 * torch.randn(1, T, 16)  # (B, T, D)
with torch.no_grad():
    out, weights = mha(x, x, x, allowed=allowed)  # (B, T, D), (B, H, T, T)
plot_attention_heads(weights, query_tokens=tokens, key_tokens=tokens, title="4 heads, causal + padding",
                     allowed=allowed);

# %% [markdown]
# (The `<pad>` queries still attend to the real tokens before them: masking keys does not silence padded
# *queries*. Their outputs are ignored later, by the loss in lesson 07.)
#
# ## 5. Is it right? Compare with `nn.MultiheadAttention`
#
# PyTorch ships the same layer. If ours holds the same weights, both must give the same numbers, which is the
# strongest test we can write without knowing the answer. Two details stand between us:
#
# - **Weights.** `nn.MultiheadAttention` stores the three input projections stacked in one `in_proj_weight` of
#   shape `(3·D, D)` (queries, then keys, then values) and `in_proj_bias` `(3·D,)`; `out_proj` is the same.
#   `load_from_torch_mha` (given below) copies them into our four `nn.Linear`s.
# - **Masks: the polarity trap.** Its `attn_mask` (shape `(T, S)` or `(B·H, T, S)`) and `key_padding_mask`
#   (`(B, S)`) say **`True` = blocked**: the opposite of our `allowed` and of `F.scaled_dot_product_attention`.
#   Both conventions are reasonable; mixing them is a bug that raises no error. We therefore keep ours
#   everywhere and invert exactly once, at the call into PyTorch, with a comment: `attn_mask = ~allowed`,
#   `key_padding_mask = ~is_real`.

# %% given=load_from_torch_mha

# %% [markdown]
# Self-attention over two sequences, the second with two pad tokens, causal + padding mask:

# %%
B, T, D, H = 2, 5, 16, 4
theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
with torch.no_grad():  # PyTorch starts its biases at zero: give them values, so that a bias mistake would show
    theirs.in_proj_bias.normal_()
    theirs.out_proj.bias.normal_()
ours = load_from_torch_mha(MultiHeadAttention(D, H), theirs).eval()
x = torch.randn(B, T, D)  # (B, T, D)
is_real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, T)
causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = may attend
allowed = causal & is_real[:, None, None, :]  # (B, 1, T, T)

with torch.no_grad():
    out, weights = ours(x, x, x, allowed=allowed)
    # PyTorch's boundary: its masks say True = blocked, so invert ours here and only here
    want, want_w = theirs(x, x, x, attn_mask=~causal, key_padding_mask=~is_real, average_attn_weights=False)
    # the trap: our masks passed as they are, with the opposite meaning
    trap, _ = theirs(x, x, x, attn_mask=causal, key_padding_mask=is_real)

print(f"inverted at the boundary : max |ours - theirs| = {(out - want).abs().max():.2e} (output), "
      f"{(weights - want_w).abs().max():.2e} (weights)")
nan_rows = trap.isnan().any(dim=-1)  # (B, T)
print(f"passed as they are       : {int(nan_rows.sum())} of {B * T} output rows are NaN, the others differ by up "
      f"to {(out - trap)[~nan_rows].abs().max():.2f}")

# %% [markdown]
# Passed as they are, the masks keep exactly the keys we meant to block and block the ones we meant to keep:
# queries left with no key at all come out as NaN, the others are silently wrong. Nothing raised an error.
#
# **One place where we differ on purpose.** When a query may attend to nothing (here: every key of sequence 1 is
# padding), our attention returns zero weights, so the output row is exactly `out_proj.bias`. What PyTorch returns
# depends on which of its code paths runs; measured here:

# %% demo
empty = torch.tensor([[True] * 5, [False] * 5])  # (B, S): sequence 1 has no real key at all
memory = torch.randn(B, 5, D)  # (B, S, D), another sequence to attend to
ours = load_from_torch_mha(MultiHeadAttention(D, H), theirs).eval()  # the same weights as above
with torch.no_grad():
    ours_out, _ = ours(x, memory, memory, allowed=empty[:, None, None, :])  # (B, T, D)
    # PyTorch's boundary again: key_padding_mask is True at padding
    paths = {
        "need_weights=True (the general path)": theirs(x, memory, memory, key_padding_mask=~empty)[0],
        "need_weights=False, query != key": theirs(x, memory, memory, key_padding_mask=~empty,
                                                   need_weights=False)[0],
        "need_weights=False, self-attention": theirs(x, x, x, key_padding_mask=~empty, need_weights=False)[0],
    }
def first3(row):
    return "[" + ", ".join(f"{v:7.3f}" for v in row[:3].tolist()) + "]"


print(f"{'out_proj.bias':>45}: {first3(ours.out_proj.bias)}")
print(f"{'ours':>45}: {first3(ours_out[1, 0])}")
for name, theirs_out in paths.items():
    print(f"{'PyTorch, ' + name:>45}: {first3(theirs_out[1, 0])}")

# %% [markdown]
# Three code paths, two answers, one of them NaN, which would then spread through every later layer and into the
# loss. That is why the course fixes one behaviour for fully masked rows (zeros) and tests it.
#
# ## 6. Find the bug
#
# Your `MultiHeadAttention` does exactly what its mask says, so every mistake in building that mask becomes a
# model that runs, trains and is quietly wrong. Below is the self-attention block a decoder uses, written by
# someone else on top of **your** module: it makes the causal mask, adds the padding to it and hands the result
# to `mha`. It has **one** mistake, and on the batches its author tried (padding at the end) it gives the right
# answer for every real token. It breaks on left padding, which is how batched generation pads its prompts.
#
# How would you find it? Ask what must hold whatever the batch: a real token's output cannot depend on the pad
# vectors, and cannot depend on later tokens. Test it by changing only those positions and seeing which outputs
# move; then print the mask the code hands to `mha` for the sequence that failed, as a grid, and read it row by
# row against the docstring. The check under the cell does the first step for you, with a stand-in for `mha`
# whose answers are PyTorch's, so that only the mask is on trial.
#
# **Exercise.** Find and fix the bug in `causal_self_attention(mha, x, is_real=None)`, in the given code. It is
# graded with your own `MultiHeadAttention` as `mha`: a mistake in that class costs its own cell, not this one.

# %% exercise=causal_self_attention

# %% test=causal_self_attention points=1
from decoder_course.visible import l03_multi_head as visible

visible.check_causal_self_attention(causal_self_attention)

# %% [markdown]
# ## What you built
#
# | name | shape | idea |
# |---|---|---|
# | `split_heads(x, H)` | `(B, T, D) → (B, H, T, Dh)` | head `h` owns features `h·Dh … (h+1)·Dh − 1`; heads before time |
# | `merge_heads(x)` | `(B, H, T, Dh) → (B, T, D)` | heads side by side again |
# | `split_heads_reshape`, `merge_heads_reshape` | same | reshape cuts the last axis, then swap `T` and `H` |
# | `MultiHeadAttention(d_model, n_heads, dropout)` | `(B, T, D), (B, S, D) → (B, T, D), (B, H, T, S)` | project, split, attend per head, merge, project |
# | `causal_self_attention(mha, x, is_real)` (fixed) | `(B, T, D) → (B, T, D), (B, H, T, T)` | padding is masked on the key axis |
#
# And one habit: **one mask convention inside the code, inverted only at PyTorch's boundary, with a comment.**
#
# Next, lesson 04: cross-attention, where the decoder's queries attend to the encoder's output, and why its keys
# and values are computed only once.
