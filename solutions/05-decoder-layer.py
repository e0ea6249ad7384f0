# %% [markdown]
# # Lesson 05 — The decoder layer
#
# You now have every kind of attention a decoder needs: masked self-attention (lessons 01–03) and
# cross-attention over the encoder's output, the *memory* (lesson 04). A **decoder layer** puts them together with
# one more block, a small feed-forward network, and wraps each of the three in a **residual connection** and a
# **LayerNorm**:
#
# ![One decoder layer in its two forms, drawn bottom to top from x (B, T, D) to out (B, T, D). Both have three
# sublayers in the same order: masked self-attention (queries, keys and values all from x, causal), then
# cross-attention (queries from x, keys and values from the memory (B, S, D), which enters from the side), then the
# feed-forward network. Each sublayer is followed by its dropout (dropout1 to dropout3) and a residual addition
# that adds back the sublayer's input. Left, post-LN (the 2017 paper): LayerNorm norm1, norm2, norm3 comes after
# each addition, x = norm(x + dropout(sublayer(x))). Right, pre-LN: the LayerNorm comes first, LN → sublayer →
# dropout → (+), x = x + dropout(sublayer(norm(x))), and the residual path skips the norm.](assets/decoder_block.png)
#
# Follow the residual lines on the left of each column: in both forms every sublayer only *adds a change* to what
# came in. The two forms differ in one thing, where the LayerNorm sits (section 2): after the addition (left), so
# the stream itself is normalised, or before the sublayer (right), so the stream is never normalised and a clean
# path runs from the input to the output.
#
# Stack N of these and you have the decoder of "Attention Is All You Need" (lesson 06 does).
#
# In this lesson you write:
#
# 1. `FeedForward`, the position-wise network;
# 2. `DecoderLayer`, in the paper's **post-LN** form and the **pre-LN** form most models use today, and show that
#    it computes exactly what PyTorch's `nn.TransformerDecoderLayer` computes;
# 3. the same layer in **NumPy alone**: no modules and no autograd, every matrix in plain sight.
#
# Along the way you will see why pre-LN trains deep stacks more easily, and count where a layer's parameters
# live (the usual rule of thumb is wrong for this layer). Shapes use `B` batch, `T` target length, `S` memory
# length, `H` heads, `D` model width, `Dh = D // H`, `F` feed-forward width. Masks are boolean with `True` =
# "this query may attend to this key".

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from einops import rearrange
from torch import nn

from decoder_course.plots import plot_masks

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it

# %% [markdown]
# ## Building blocks from earlier lessons
#
# The next cells hold the course's versions of what you built before: lesson 02's NumPy attention, lesson 03's
# head splitting and `MultiHeadAttention`, lesson 04's `CrossAttention`. They are given (not your own answers) so
# that this lesson runs, and is graded, on its own: a slip in lesson 03 costs nothing here. Read them once; the
# decoder layer calls them. (In a graded course, a release made while one of those lessons is still open runs
# your own code from it instead, and says so in the cell; grading still runs the course's versions.)

# %% given=attention:softmax,masked_softmax,scaled_dot_product_attention

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention,load_from_torch_mha

# %% given=cross_attention:CrossAttention

# %% [markdown]
# ## 1. The feed-forward network
#
# Attention **moves** information between positions: each output is a weighted average of value vectors. It
# does little to **transform** what a position holds, since averaging is linear in the values. The second half
# of every Transformer layer does that: the same small two-layer network, applied to every position on its own,
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2 ,$$
#
# with a hidden width `F` usually four times `D` (the paper: `D = 512`, `F = 2048`). "Position-wise" means the
# same weights at every position and no mixing across `T`: `nn.Linear` acts on the last axis only, so a
# `(B, T, D)` input just works. During training, dropout sits on the hidden activations, after the ReLU (as in
# PyTorch's layer).
#
# A worked example with `D = 2`, `F = 3`: with `W1` rows `[1, 0], [0, 1], [1, 1]`, `b1 = [0, 0, -1]`, the input
# `[1, -2]` gives hidden pre-activations `[1, -2, -2]`; the ReLU keeps `[1, 0, 0]`; `W2` then mixes these three
# back into two numbers. The visible check below runs exactly this example.
#
# **Exercise.** Write `FeedForward(d_model, d_ff, dropout=0.0)` with submodules `linear1` (`D → F`), `dropout`
# and `linear2` (`F → D`): weights are loaded by these names, so keep them.

# %% exercise=FeedForward

# %% test=FeedForward points=2
from decoder_course.visible import l05_decoder_layer as visible

visible.check_feed_forward(FeedForward)

# %% [markdown]
# ## 2. Residual connections and LayerNorm, in two placements
#
# Each sublayer computes a **change** to its input, which is added back: `x + sublayer(x)`. This *residual
# connection* gives every layer an easy default (change nothing) and gives gradients a direct path back through
# the stack. **LayerNorm** rescales each position's `D` features to mean 0 and variance 1, then applies a
# learned gain and bias, so that activations stay at a sensible scale however many layers are stacked.
#
# Where the LayerNorm goes is a real choice:
#
# | | one sublayer | used by |
# |---|---|---|
# | **post-LN** (`norm_first=False`) | `x = norm(x + sublayer(x))` | the 2017 paper, BERT |
# | **pre-LN** (`norm_first=True`) | `x = x + sublayer(norm(x))` | GPT-2 and most models since |
#
# Pre-LN is a **departure from the paper**; section 5 shows why it won. One consequence to remember: in pre-LN
# nothing normalises the last layer's output, so a pre-LN stack ends with one extra LayerNorm (lesson 06).
#
# A decoder layer has three sublayers, so three LayerNorms (`norm1`, `norm2`, `norm3`) and three dropouts
# (`dropout1..3`, on each sublayer's output, before it is added back). The masks go where they belong:
# `self_allowed` (causal, and target padding) to the self-attention, `cross_allowed` (memory padding) to the
# cross-attention.
#
# **Injectable sublayers.** `DecoderLayer` builds its own `MultiHeadAttention`, `CrossAttention` and
# `FeedForward`, unless it is handed ready-made ones (`self_attn=`, `cross_attn=`, `feed_forward=`). Then it must
# use exactly those. This lets you plug in a known-good part to test the layer on its own; the grader does
# precisely that, so your layer is judged apart from your feed-forward.
#
# **Exercise.** Write `DecoderLayer`. Like PyTorch's layer, it keeps one small method per sublayer
# (`_sa_block`, `_ca_block`, `_ff_block`: the sublayer and its dropout, without the residual); `forward` adds the
# residuals and norms in the order that `norm_first` asks for.

# %% exercise=DecoderLayer

# %% test=DecoderLayer points=2
from decoder_course.visible import l05_decoder_layer as visible

visible.check_decoder_layer(DecoderLayer)

# %% [markdown]
# ## 3. The same layer as PyTorch's
#
# `nn.TransformerDecoderLayer` implements this very layer. Give it and ours the same weights and they must agree
# to rounding, for both LayerNorm placements. We run them at the paper's sizes (`D = 512`, 8 heads, `F = 2048`) on
# a padded batch: targets of length 5 with 3 and 4 real tokens, sources of length 7 with 5 and 6 (lesson 06
# stacks four such pre-LN layers into a whole model). Two differences of form to bridge:
#
# - PyTorch packs the query, key and value projections into one `(3 D, D)` matrix, `in_proj_weight`;
#   `load_from_torch_decoder_layer` (a helper, below) cuts it into our `q_proj`, `k_proj`, `v_proj`.
# - **PyTorch's masks have the opposite polarity**: `True` means *blocked*. We invert ours at this boundary and
#   nowhere else.

# %% given=load_from_torch_decoder_layer,numpy_params_from_torch,count_parameters
# Helpers of this lesson, not exercises: copy PyTorch's weights into ours, export ours for the NumPy layer, and
# count parameters.

# %%
# The sizes of the paper, and a padded batch: 3 and 4 real target tokens, 5 and 6 real source tokens
D, H, d_ff, B, T, S = 512, 8, 2048, 2, 5, 7
x, memory = torch.randn(B, T, D), torch.randn(B, S, D)  # (B, T, D), (B, S, D)
tgt_is_real = torch.arange(T) < torch.tensor([[3], [4]])  # (B, T)
memory_is_real = torch.arange(S) < torch.tensor([[5], [6]])  # (B, S)
causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): query t may see keys 0..t
self_allowed = causal & tgt_is_real[:, None, None, :]  # (B, 1, T, T): causal, and no padded target key
cross_allowed = memory_is_real[:, None, None, :]  # (B, 1, 1, S): the same for every query

for norm_first in (False, True):
    theirs = nn.TransformerDecoderLayer(D, H, d_ff, batch_first=True, norm_first=norm_first).eval()
    ours = load_from_torch_decoder_layer(DecoderLayer(D, H, d_ff, norm_first=norm_first), theirs).eval()
    with torch.no_grad():
        # PyTorch's masks: True = blocked, so ours are inverted here, at the boundary, and nowhere else
        want = theirs(x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_is_real,
                      memory_key_padding_mask=~memory_is_real)
        got = ours(x, memory, self_allowed=self_allowed, cross_allowed=cross_allowed)
    print(f"norm_first={norm_first!s:5}: output {tuple(got.shape)}, "
          f"max |ours - PyTorch's| = {(got - want).abs().max().item():.2e}")

# %% [markdown]
# ## 4. A worked system: a post-LN layer from injected sublayers
#
# The paper's sizes: `D = 512`, 8 heads, `F = 2048`. We build the three sublayers ourselves, hand them to the
# layer, and run a target of 4 positions against a memory of 6: the output keeps the target's shape. Since the
# layer is post-LN and its LayerNorms start with gain 1 and bias 0, every output position should come out with
# mean 0 and standard deviation 1 across its 512 features. And PyTorch's layer, given the same weights, must
# agree.

# %%
D, H, d_ff = 512, 8, 2048
self_attn, cross_attn, feed_forward = MultiHeadAttention(D, H), CrossAttention(D, H), FeedForward(D, d_ff)
layer = DecoderLayer(D, H, d_ff, dropout=0.1, norm_first=False,
                     self_attn=self_attn, cross_attn=cross_attn, feed_forward=feed_forward).eval()
x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)  # (B, T, D), (B, S, D)
causal = torch.ones(4, 4, dtype=torch.bool).tril()  # (T, T)

# to check the values, give it the weights of a fresh nn.TransformerDecoderLayer (they land in the injected
# sublayers), and run both
theirs = nn.TransformerDecoderLayer(D, H, d_ff, batch_first=True).eval()
load_from_torch_decoder_layer(layer, theirs)
with torch.no_grad():
    out = layer(x, memory, self_allowed=causal)
    difference = (out - theirs(x, memory, tgt_mask=~causal)).abs().max().item()  # ~causal: PyTorch's polarity

print("output shape:", tuple(out.shape))
print("the layer runs the modules it was given:",
      layer.self_attn is self_attn and layer.cross_attn is cross_attn and layer.feed_forward is feed_forward)
per_position = out.mean(-1), out.std(-1, correction=0)  # (B, T) each: statistics over the 512 features
print(f"per position: |mean| <= {per_position[0].abs().max().item():.1e}, "
      f"std in [{per_position[1].min().item():.4f}, {per_position[1].max().item():.4f}]")
print(f"max |ours - nn.TransformerDecoderLayer| = {difference:.1e}")
assert out.shape == (2, 4, 512) and difference < 1e-4

# %% [markdown]
# ## 5. Why pre-LN trains deep stacks more easily
#
# Follow the input `x₀` of a stack of `N` layers to the output.
#
# - **Pre-LN**: each layer only *adds* to the stream, `x_{l+1} = x_l + f_l(norm(x_l))`, so
#   `x_N = x₀ + f_0(…) + f_1(…) + … + f_{N-1}(…)`. The residual path is an **identity** from every layer to the
#   output, and backwards the gradient of the loss reaches every layer through it unchanged, plus the
#   contributions of the sublayers.
# - **Post-LN**: the stream itself goes through a LayerNorm after every sublayer, `3 N` of them in a decoder
#   stack. There is no clean identity path: every LayerNorm rescales the signal, and the gradient, on its way.
#
# Xiong et al. (2020, *On Layer Normalization in the Transformer Architecture*) showed that at initialisation a
# post-LN stack has large gradients for the parameters near its output. With a large learning rate the first
# updates are destructive, which is why the original Transformer needed a **learning-rate warm-up** (4000 steps of
# slowly rising learning rate). Pre-LN keeps the gradients well behaved, trains deep stacks reliably and needs
# little or no warm-up; the price is the extra final LayerNorm and a residual stream whose scale grows with depth.
#
# We can look at this at initialisation, with no training at all: a stack of 24 small layers, a random
# loss on its output, one backward pass. For each layer we measure (left) the gradient norm of its parameters and
# (right) how closely the gradient arriving at that layer's input points in the same direction as the gradient
# at the stack's output (the cosine of the angle between them; 1 = unchanged).

# %% demo
def gradient_profile(norm_first: bool, n_layers: int = 24, D: int = 32, seed: int = 0) -> tuple[list, list]:
    """Per layer: its parameters' gradient norm, and the cosine of its input's gradient with the output's."""
    torch.manual_seed(seed)
    layers = [DecoderLayer(D, 4, 2 * D, dropout=0.0, norm_first=norm_first) for _ in range(n_layers)]
    x, memory = torch.randn(8, 10, D), torch.randn(8, 12, D)  # (B, T, D), (B, S, D)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    streams = []
    h = x.requires_grad_(True)
    for layer in layers:
        streams.append(h)
        h.retain_grad()  # keep the gradient that arrives at this layer's input
        h = layer(h, memory, causal)
    h.retain_grad()
    (h * torch.randn_like(h)).sum().backward()  # a random linear loss on the output
    grad_norms = [math.sqrt(sum(p.grad.pow(2).sum().item() for p in layer.parameters())) for layer in layers]
    out_grad = h.grad.flatten()
    cosines = [torch.cosine_similarity(s.grad.flatten(), out_grad, dim=0).item() for s in streams]
    return grad_norms, cosines


fig, (ax_norm, ax_cos) = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
for norm_first, name in ((False, "post-LN"), (True, "pre-LN")):
    grad_norms, cosines = gradient_profile(norm_first)
    ax_norm.plot(grad_norms, marker=".", label=name)
    ax_cos.plot(cosines, marker=".", label=name)
    print(f"{name}: parameter-gradient norm, last layer / first = {grad_norms[-1] / grad_norms[0]:.2f}; "
          f"cosine at layer 0's input = {cosines[0]:.2f}")
ax_norm.set(xlabel="layer", ylabel="‖∂loss/∂parameters‖", title="gradient of each layer's parameters")
ax_cos.set(xlabel="layer (input of)", ylabel="cosine with ∂loss/∂output", ylim=(0, 1.05),
           title="how much of the output's gradient arrives")
ax_norm.legend()
ax_cos.legend();

# %% [markdown]
# Read the two panels against the printed ratios. On the left, look at the *shape* of each curve first. In the
# post-LN stack the parameter gradients grow towards the output (a last/first ratio above 1): the layers near the
# output get the largest updates, the pattern Xiong et al. describe, and the reason post-LN needs a warm-up. In the
# pre-LN stack they do not grow (a ratio at or below 1): the first layers get at least as much as the last.
#
# The *heights* differ too, and for the same reason: the pre-LN curve lies above the post-LN one. On its way back
# through a post-LN stack the gradient crosses a LayerNorm after every sublayer, and each one divides it by the
# spread of its input (the residual sum, whose spread is above 1), so it shrinks layer after layer; in pre-LN it
# runs back along the identity path without crossing any. On the right, the same story in directions: the
# gradient arriving at the first layers of the post-LN stack has been reshaped by every LayerNorm on the way and
# points further from the output's gradient than in pre-LN (the printed cosines at layer 0). Xiong et al.'s
# analysis shows these gaps widening with depth; it is why deep Transformers are pre-LN. Lesson 07 trains a pre-LN
# model, with a short warm-up for good measure.
#
# ## 6. Where do the parameters live?
#
# A common rule of thumb says the feed-forward network holds about **two thirds** of a Transformer layer's
# parameters. Count instead of believing: `count_parameters` (a helper above) sums the parameters of each
# submodule.

# %%
D, H, d_ff = 512, 8, 2048
counts = count_parameters(DecoderLayer(D, H, d_ff))
for name in ("self_attn", "cross_attn", "feed_forward", "norm1", "norm2", "norm3", "total"):
    print(f"{name:>12}: {counts[name]:>9,}  ({counts[name] / counts['total']:6.1%})")

# PyTorch's layers, counted independently: the same decoder layer, and a block WITHOUT cross-attention
# (the block of an encoder, or of a decoder-only model such as GPT: self-attention + feed-forward)
torch_decoder = sum(p.numel() for p in nn.TransformerDecoderLayer(D, H, d_ff, batch_first=True).parameters())
torch_block = sum(p.numel() for p in nn.TransformerEncoderLayer(D, H, d_ff, batch_first=True).parameters())
ffn = counts["feed_forward"]
print(f"\nnn.TransformerDecoderLayer has {torch_decoder:,} parameters (ours: {counts['total']:,})")
print(f"FFN share with cross-attention:    {ffn:,} / {counts['total']:,} = {ffn / counts['total']:.1%}")
print(f"FFN share without cross-attention: {ffn:,} / {torch_block:,} = {ffn / torch_block:.1%}")
assert torch_decoder == counts["total"]

# %% [markdown]
# The arithmetic behind the numbers: an attention sublayer has four `D × D` projections, about `4 D²`
# parameters; the feed-forward has `D × F + F × D = 8 D²` when `F = 4 D`. A block with self-attention and a
# feed-forward holds `8 D² / 12 D²` ≈ **2/3** in its feed-forward: the rule of thumb, true for encoders and for
# decoder-only models. The decoder layer of an encoder–decoder model has a second attention, cross-attention,
# and the share drops to `8 D² / 16 D²` ≈ **1/2**: the exact counts are printed above. (The LayerNorms, `2 D`
# each, hardly count.)
#
# ## 7. The decoder layer in NumPy alone
#
# PyTorch's modules hide two things: where the weights are, and the order of every product. Writing the layer
# with NumPy alone shows both. The parameters are a plain dict of arrays, and **weights are stored `(in, out)`**,
# so a linear map is `h @ W + b` with the activations on the left. (`nn.Linear` stores its weight `(out, in)`
# and computes `h @ W.T + b`; the helper `numpy_params_from_torch` transposes.) The order matters: `(B, T, D) @
# (D, F)` is the feed-forward's first product; `W2 @ h` would multiply the wrong axes.
#
# The parameter names: `sa_` (self-attention) and `ca_` (cross-attention) each have `Wq, bq, Wk, bk, Wv, bv,
# Wo, bo`; the feed-forward has `ff_W1 (D, F), ff_b1 (F,), ff_W2 (F, D), ff_b2 (D,)`; the LayerNorms have a
# gain and a bias each, `ln1_g, ln1_b, …, ln3_g, ln3_b`, all `(D,)`.
#
# **Exercise.** Write `init_numpy_decoder_params(D, H, F, rng=None)`:
#
# - every weight matrix drawn from a normal distribution with standard deviation `1 / sqrt(fan_in)` (its number of
#   rows): then `h @ W` keeps roughly the scale of `h`;
# - every bias zero; every LayerNorm gain one and bias zero (a LayerNorm starts as a plain normalisation);
# - every random number drawn from `rng`; when `rng` is `None`, from a fresh `np.random.default_rng()` (so two
#   calls differ); a `ValueError` when `D` is not divisible by `H`.

# %% exercise=init_numpy_decoder_params

# %% test=init_numpy_decoder_params points=1
from decoder_course.visible import l05_decoder_layer as visible

visible.check_init_numpy_decoder_params(init_numpy_decoder_params)

# %% [markdown]
# **Exercise.** Write `numpy_decoder_layer(x, memory, params, n_heads, self_allowed=None, cross_allowed=None,
# norm_first=False)`: the same computation as `DecoderLayer` in eval mode (no dropout), NumPy only. Three small
# inner functions keep it readable:
#
# - `layer_norm(h, i)`: mean and variance over the last axis (`D`), the biased variance (NumPy's default) and
#   `eps = 1e-5` inside the square root, as `nn.LayerNorm`; then `* g + b`;
# - `multi_head(h_q, h_kv, prefix, allowed)`: project, `split_heads`, the given `scaled_dot_product_attention`,
#   `merge_heads`, output projection (self-attention: `h_q = h_kv = x`; cross-attention: `h_kv = memory`);
# - `feed_forward(h)`: `max(0, h @ W1 + b1) @ W2 + b2`.

# %% exercise=numpy_decoder_layer

# %% test=numpy_decoder_layer points=2
from decoder_course.visible import l05_decoder_layer as visible

visible.check_numpy_decoder_layer(numpy_decoder_layer)

# %% [markdown]
# ## 8. A worked system in NumPy, with its own validation
#
# A single post-LN layer: `D = 64`, 4 heads, `F = 128`, a batch of 2 targets of length 5 attending to memories of
# length 7 (the second with two pad tokens). Its two masks:

# %%
D, H, d_ff, B, T, S = 64, 4, 128, 2, 5, 7
self_allowed = np.tril(np.ones((T, T), dtype=bool))  # (T, T): causal
memory_is_real = np.array([[True] * 7, [True] * 5 + [False] * 2])  # (B, S)
cross_allowed = np.repeat(memory_is_real[:, None, None, :], T, axis=2)  # (B, 1, T, S)
titles = ["self-attention (causal)", "cross-attention (sequence 1: 2 pads)"]
plot_masks([self_allowed, cross_allowed[1, 0]], titles=titles);

# %% [markdown]
# The validation does not need a reference: the output's shape; the score of query 0 on the last key is masked
# (its attention weight is exactly 0); no NaN or inf; and two runs without a fixed seed differ (the parameters
# really are random).

# %%
rng = np.random.default_rng()  # no seed on purpose
x, memory = rng.standard_normal((B, T, D)), rng.standard_normal((B, S, D))
params = init_numpy_decoder_params(D, H, d_ff)  # unseeded
out = numpy_decoder_layer(x, memory, params, H, self_allowed, cross_allowed)

# the first sublayer's attention weights, recomputed from the same parameters (post-LN: it reads x itself)
q = split_heads(x @ params["sa_Wq"] + params["sa_bq"], H)  # (B, H, T, Dh)
k = split_heads(x @ params["sa_Wk"] + params["sa_bk"], H)  # (B, H, T, Dh)
_, weights = scaled_dot_product_attention(q, k, k, self_allowed)  # weights: (B, H, T, T)

again = numpy_decoder_layer(x, memory, init_numpy_decoder_params(D, H, d_ff), H, self_allowed, cross_allowed)
validation = {
    f"output shape {out.shape} == (2, 5, 64)": out.shape == (2, 5, 64),
    "query 0's weight on the last key is 0 in every head": bool((weights[:, :, 0, -1] == 0).all()),
    "no NaN or inf": bool(np.isfinite(out).all()),
    "two runs without a fixed seed differ": not np.allclose(out, again),
}
for claim, holds in validation.items():
    print("✓" if holds else "✗", claim)
assert all(validation.values())

# %% [markdown]
# Finally the NumPy layer against our PyTorch layer with the same weights, in both placements: one computation,
# two implementations.

# %%
D, H, d_ff = 32, 4, 64
x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
for norm_first in (False, True):
    layer = DecoderLayer(D, H, d_ff, norm_first=norm_first).double().eval()
    with torch.no_grad():
        want = layer(x, memory, torch.from_numpy(self_allowed), torch.from_numpy(cross_allowed))
    got = numpy_decoder_layer(x.numpy(), memory.numpy(), numpy_params_from_torch(layer), H, self_allowed,
                              cross_allowed, norm_first=norm_first)
    print(f"norm_first={norm_first!s:5}: max |NumPy - PyTorch| = {np.abs(got - want.numpy()).max():.1e}")

# %% [markdown]
# ## 9. Find the bug
#
# Section 3 crossed PyTorch's boundary by hand: our masks say `True` = may attend, PyTorch's say `True` =
# blocked, and every mask was inverted once, at the call. Code written for `nn.TransformerDecoderLayer` passes
# its three mask arguments, `tgt_mask` `(T, T)`, `tgt_key_padding_mask` `(B, T)` and `memory_key_padding_mask`
# `(B, S)`, all in PyTorch's polarity. Below is a helper written by someone else that lets such code run **your**
# `DecoderLayer`: it joins PyTorch's two target masks into one, inverts the masks and calls your layer. It has
# **one** mistake. Its author tried it with a causal `tgt_mask` alone, where it agrees with PyTorch's layer to
# the last digit; with padding it still runs, every shape is right and every output looks like a layer's output.
#
# How would you find it? PyTorch's layer itself is the answer key: give both the same weights and the same mask
# arguments, and try every mix (each mask present or absent). Where they disagree, print the mask the helper
# hands your layer, as a grid, and read it row by row: which keys is each query allowed, and which should it be?
# Then read the code the same way: at each line, what does `True` mean in the masks it combines? The check under
# the cell runs the mixes for you, with a stand-in for your `DecoderLayer` whose answers are PyTorch's, so that
# only the helper is on trial.
#
# **Exercise.** Find and fix the bug in `run_with_torch_masks(layer, tgt, memory, tgt_mask=None,
# tgt_key_padding_mask=None, memory_key_padding_mask=None)`, in the given code. It is graded with your own
# `DecoderLayer` (its sublayers given): a mistake in it costs its own cell, not this one.

# %% exercise=run_with_torch_masks

# %% test=run_with_torch_masks points=1
from decoder_course.visible import l05_decoder_layer as visible

visible.check_run_with_torch_masks(run_with_torch_masks)

# %% [markdown]
# ## What you built
#
# | piece | shape | what it does |
# |---|---|---|
# | `FeedForward(D, F, dropout)` | `(B, T, D) → (B, T, D)` | `linear2(dropout(relu(linear1(x))))`, each position on its own |
# | `DecoderLayer(..., norm_first)` | `x (B, T, D), memory (B, S, D) → (B, T, D)` | self-attention, cross-attention, feed-forward, each with residual + LayerNorm; equal to `nn.TransformerDecoderLayer` |
# | `init_numpy_decoder_params(D, H, F, rng)` | dict of `(in, out)` arrays | weights `N(0, 1/fan_in)`, LayerNorms as the identity |
# | `numpy_decoder_layer(...)` | `(B, T, D) → (B, T, D)` | the same layer, NumPy only |
# | `run_with_torch_masks(layer, tgt, memory, ...)` (fixed) | `(B, T, D) → (B, T, D)` | PyTorch's mask arguments (True = blocked) joined and inverted for our layer |
#
# What you measured: post-LN and pre-LN agree with PyTorch; at initialisation a pre-LN stack passes gradients back
# through its identity path; in this decoder layer the feed-forward holds about **half** of the parameters (two
# thirds only in a block without cross-attention).
#
# Next: lesson 06 stacks these layers, adds embeddings and positional encodings, and builds the whole
# encoder–decoder model.
