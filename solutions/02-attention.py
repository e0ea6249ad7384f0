# %% [markdown]
# # Lesson 02 — Attention: softmax, masks and scaled dot products
#
# Attention, in one sentence: **each query position outputs a weighted average of value vectors, and the
# weights say how well the query matches each key.** Three steps make it, and each is an exercise:
#
# 1. **softmax** turns a row of scores into weights that are positive and sum to one — without overflowing;
# 2. **masked softmax** lets the masks of lesson 01 decide which keys count, and gives a query with no key at
#    all the course's answer: zeros;
# 3. **scaled dot-product attention** scores every query against every key with a dot product divided by
#    `√Dh`, and averages the values with the weights.
#
# Everything is NumPy: attention is a few lines of array code. Shapes have any number of leading axes, written
# `...`: in a model they are `(B, H)`, batch and heads. So `q` is `(..., T, Dh)` (T queries of width `Dh`), `k`
# is `(..., S, Dh)`, `v` is `(..., S, Dv)`, scores and weights are `(..., T, S)`.
#
# The exercises build on each other: `masked_softmax` may call your `softmax`, and attention your
# `masked_softmax`. Each is graded on its own, but a bug in an earlier one shows again in the later ones: fix
# the first failing check first.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np

from decoder_course import PAD
from decoder_course.plots import plot_attention, plot_mask

# %% [markdown]
# The masks of lesson 01, given so that this lesson runs on its own (`True` = this query may attend to this key):

# %% given=masks:causal_mask,padding_mask,combine_masks

# %% [markdown]
# ## 1. Softmax, and why the formula overflows
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i}}{\sum_j e^{x_j}}$$
#
# Every weight is positive, they sum to one, and a larger score gets a larger weight. Only the *differences*
# between scores matter: adding a constant `c` to every score multiplies every `e^{x_i}` by `e^c`, which
# cancels. Now run the formula as written, on small scores and on large ones:

# %%
def naive_softmax(x):
    """The formula as written, over the last axis. Do not use it: see below."""
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


print("scores [1, 2, 3]:            ", naive_softmax(np.array([1.0, 2.0, 3.0])))
with np.errstate(over="ignore", invalid="ignore"):  # silence NumPy's warnings to see the results
    print("scores [1000, 1001, 1002]:   ", naive_softmax(np.array([1000.0, 1001.0, 1002.0])))
    print("float32 scores [100, 101, 102]:", naive_softmax(np.array([100.0, 101.0, 102.0], dtype=np.float32)))
for dtype in (np.float64, np.float32, np.float16):
    # exp(x) is inf once x > log(largest finite number of the dtype)
    print(f"exp overflows in {np.dtype(dtype).name} above x = {np.log(float(np.finfo(dtype).max)):.1f}")

# %% [markdown]
# `exp(1000)` is `inf` in float64, and `inf / inf` is NaN. In float32 it happens above 88.7, and in float16
# (lesson 10) above 11: attention scores get that large easily, so the formula as written is a bug waiting
# for its input.
#
# The fix uses the property above: `softmax(x) = softmax(x - c)` for any `c`. Choose `c = max(x)`. Then the
# largest exponent is `exp(0) = 1`, so nothing overflows, and the sum is at least 1, so nothing divides by
# zero. Terms far below the max underflow to 0, which is also the right answer to float precision.
#
# **Exercise.** Write `softmax(x, axis=-1)`, stable for huge scores. Take the max and the sum along `axis`
# with `keepdims=True`, so that they broadcast back against `x` (each row gets its own max: one max for the
# whole array would underflow the rows whose scores are small). Don't modify `x`: `x -= ...` would change the
# caller's array.

# %% exercise=softmax

# %% test=softmax points=1
from decoder_course.visible import l02_attention as visible

visible.check_softmax(softmax)

# %% [markdown]
# The spread of the scores decides how peaked the weights are. Multiply the same scores by a growing factor:
# small scores give nearly uniform weights, large ones put almost everything on the largest score. Keep this
# picture in mind for section 3.

# %% demo
scores = np.array([1.0, 0.5, 0.0, -0.5, -1.0])  # one query's scores over 5 keys
factors = [0.3, 1.0, 8.0]
fig, axes = plt.subplots(1, 3, figsize=(9, 2.4), sharey=True, layout="constrained")
for ax, factor in zip(axes, factors, strict=True):
    ax.bar(range(5), softmax(factor * scores), color="#2a7ab9")
    ax.set_title(f"softmax({factor} × scores)")
    ax.set_xlabel("key")
axes[0].set_ylabel("weight")
plt.show()

# %% [markdown]
# ## 2. Masked softmax
#
# A mask from lesson 01 says which keys each query may attend to. A blocked key must get weight **exactly 0**,
# and the allowed keys' weights must still sum to one. So the mask acts on the **scores, before** the
# normalisation: zeroing weights after a plain softmax leaves the remaining weights summing to less than one.
#
# The hard case is a row with **no** allowed key — a left-padded query, or a query attending to an empty
# source. Here are the two usual ways to mask, run on three queries, the last of which has no allowed key:

# %%
scores = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])  # (T, S)
allowed = np.array([[True, True, True],
                    [True, False, True],
                    [False, False, False]])  # (T, S): query 2 may attend to nothing
_ = plot_mask(allowed, title="allowed: query 2 has no key")
with np.errstate(invalid="ignore"):  # -inf - (-inf) is NaN: NumPy would warn, and the result shows it
    print("blocked scores set to -inf:\n", softmax(np.where(allowed, scores, -np.inf)).round(3))
print("blocked scores set to -1e9:\n", softmax(np.where(allowed, scores, -1e9)).round(3))

# %% [markdown]
# - With **`-inf`**, rows 0 and 1 are right, but row 2 is **NaN**: its max is `-inf`, and `-inf - (-inf)` is
#   NaN. NaN then spreads: the next layer mixes it into every position, and one training step turns every
#   weight of the model into NaN.
# - With **`-1e9`**, nothing is NaN, but row 2 is a **uniform average** over keys the mask said do not count:
#   a padded query quietly reads padding. Nothing fails; the numbers are just wrong.
#
# **The course's rule: a query with no allowed key gets weights of exactly zero** (so its attention output is
# zero too). `F.scaled_dot_product_attention` in recent PyTorch does the same; `nn.MultiheadAttention` gives
# NaN, as lesson 00 showed.
#
# **Exercise.** Write `masked_softmax(scores, allowed)`: the softmax over the last axis (the keys) in which
# blocked keys get 0 and a fully masked row is all zeros, with no NaN and no warning, for scores of any size in
# any float dtype. `allowed=None` means every key is allowed. `allowed` **broadcasts** to the scores' shape — a
# `(T, S)` mask serves `(B, H, T, S)` scores. Don't modify `scores`. You may call your `softmax`.
#
# Two questions decide the design. Which blocked score makes `exp` give exactly 0, without the subtraction of the
# row's max ever overflowing or making NaN? And what should a row with *no* allowed key hand to the softmax, given
# that you will zero its weights afterwards anyway?
#
# <details><summary>Hint</summary>
#
# - `np.where(allowed, scores, fill)` broadcasts the mask; boolean indexing (`scores[~allowed] = ...`) needs equal
#   shapes and would modify the caller's array.
# - `-inf` is the blocked score that gives `exp(-inf) = 0` exactly; `x - max` with a finite max stays `-inf`, no
#   warning. A huge *finite* fill such as `np.finfo(dtype).min` overflows instead when the row's max is large
#   enough: in float16, `finfo.min - 20` is beyond the range.
# - Only a row whose keys are all blocked has max `-inf` (and `-inf - (-inf)` is NaN): `np.any(allowed, axis=-1,
#   keepdims=True)` finds the rows that have a key; give the others any finite scores, such as zeros.
# - Last, `np.where(allowed, weights, 0)` sets every blocked weight to 0, which turns those rows into zeros.
#
# </details>

# %% exercise=masked_softmax

# %% test=masked_softmax points=1
from decoder_course.visible import l02_attention as visible

visible.check_masked_softmax(masked_softmax)

# %% [markdown]
# The same three queries through your `masked_softmax`, drawn with the mask (`allowed=`): a blocked key is
# hatched, its weight is 0 because the mask says so; the fully masked query's row is cross-hatched, all zeros,
# instead of NaN or a uniform average. A weight the softmax made small would be dark, not hatched.

# %%
plot_attention(masked_softmax(scores, allowed), title="masked_softmax(scores, allowed)", allowed=allowed);

# %% [markdown]
# ## 3. Scaled dot-product attention
#
# ### Scores from dot products
#
# The score of query `t` for key `s` is the dot product `q_t · k_s`: large when the two vectors point the
# same way. All pairs at once are one matrix product, `q @ kᵀ`: `(T, Dh) @ (Dh, S) = (T, S)`. With leading
# axes, transpose only the **last two** axes of `k` (`k.swapaxes(-1, -2)`); NumPy's `k.T` reverses *every*
# axis, which is right for a 2-D array and wrong for a `(B, H, S, Dh)` one.
#
# ### Why divide by √Dh
#
# If the entries of `q` and `k` are independent with mean 0 and variance 1, their dot product is a sum of `Dh`
# products of variance 1: its **variance is `Dh`**, so its typical size grows like `√Dh`. Measure it:

# %%
rng = np.random.default_rng(0)
print(f"{'Dh':>5} {'var(q·k)':>10} {'var(q·k / √Dh)':>16}")
for Dh in [4, 16, 64, 256, 1024]:
    q = rng.standard_normal((5000, Dh))  # 5000 random queries of width Dh
    k = rng.standard_normal((5000, Dh))  # and as many keys
    dots = (q * k).sum(axis=-1)  # (5000,): one dot product per pair
    print(f"{Dh:>5} {dots.var():>10.1f} {(dots / math.sqrt(Dh)).var():>16.2f}")

# %% [markdown]
# Section 1 showed what large scores do to a softmax: it puts nearly all the weight on one key. Measure how
# peaked the weights of one query over 16 keys get as `Dh` grows, with and without the division:

# %% demo
widths = [2, 4, 8, 16, 32, 64, 128, 256, 512]
peak = {"q · k": [], "q · k / √Dh": []}
for Dh in widths:
    q = rng.standard_normal((500, 1, Dh))  # (trials, T, Dh): 500 independent queries
    k = rng.standard_normal((500, 16, Dh))  # (trials, S, Dh): 16 keys for each
    dots = q @ k.swapaxes(-1, -2)  # (trials, T, S)
    peak["q · k"].append(softmax(dots).max(axis=-1).mean())
    peak["q · k / √Dh"].append(softmax(dots / math.sqrt(Dh)).max(axis=-1).mean())
fig, ax = plt.subplots(figsize=(6, 3.2), layout="constrained")
for label, values in peak.items():
    ax.plot(widths, values, marker="o", label=f"scores = {label}")
ax.axhline(1 / 16, color="grey", linestyle=":", label="uniform (1/16)")
ax.set_xscale("log", base=2)
ax.set_xlabel("head width Dh")
ax.set_ylabel("mean largest weight")
ax.set_title("How peaked is the softmax over 16 keys?")
ax.legend(fontsize="small")
plt.show()
print(f"Dh = 64: largest weight {peak['q · k'][5]:.2f} unscaled, {peak['q · k / √Dh'][5]:.2f} scaled")

# %% [markdown]
# Without the division the softmax gets more one-hot as heads get wider: at a typical head width of 64, most
# of each query's weight already sits on a single key before training has started (see the printed numbers).
# Worse, a saturated softmax has gradients near zero (the derivative of a weight `w` is proportional to
# `w(1 − w)`), so training barely moves it. Dividing by `√Dh` keeps the scores'
# variance at 1 for every head width, and the softmax stays soft. That is the "scaled" in the name (Vaswani
# et al., 2017).
#
# **Exercise.** Write `scaled_dot_product_attention(q, k, v, allowed=None)` returning `(out, weights)`:
#
# - `scores = q · kᵀ / √Dh` with `Dh = q.shape[-1]`, shape `(..., T, S)`;
# - `weights = masked_softmax(scores, allowed)`;
# - `out = weights @ v`, shape `(..., T, Dv)`: each query's weighted average of the values.
#
# Return both, `out` first: the weights are what we draw and check. Use `math.sqrt(Dh)` (a Python float keeps
# float32 inputs float32; `np.sqrt` of an integer is a float64 that would promote them). Don't modify the inputs.

# %% exercise=scaled_dot_product_attention

# %% test=scaled_dot_product_attention points=2
from decoder_course.visible import l02_attention as visible

visible.check_scaled_dot_product_attention(scaled_dot_product_attention)

# %% [markdown]
# ## 4. Looking at attention
#
# A tiny example to read a heatmap. Each token gets a random vector (the same token, the same vector), and
# the sequence attends to itself: `q = k = v = x`, under the causal mask. The second sentence is **left
# padded**, so its first queries are pads whose only visible keys (themselves and the past) are pads: rows
# with no allowed key.

# %% demo
vocab = ["<pad>", "the", "cat", "sat", "on", "mat", "dog", "ran"]  # "<pad>" has id PAD = 0
assert vocab[PAD] == "<pad>"
sentences = [["the", "cat", "sat", "on", "the", "mat"], ["<pad>", "<pad>", "the", "dog", "ran", "on"]]
ids = np.array([[vocab.index(word) for word in sentence] for sentence in sentences])  # (B, T)
embedding = np.random.default_rng(1).standard_normal((len(vocab), 16))  # (V, Dh): one random vector per token
x = embedding[ids]  # (B, T, Dh)
allowed = combine_masks(causal_mask(6), padding_mask(ids, PAD))  # (B, 1, T, S): causal and no pad keys
allowed = allowed[:, 0]  # (B, T, S): no head axis in this example
out, weights = scaled_dot_product_attention(x, x, x, allowed)  # (B, T, Dh), (B, T, S)
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
for b, ax in enumerate(axes):
    plot_attention(weights[b], sentences[b], sentences[b], ax=ax, title=f"sentence {b}", allowed=allowed[b])
plt.show()
print("largest |output| of sentence 1's two pad queries (no allowed key):", np.abs(out[1, :2]).max())

# %% [markdown]
# How to read it: row `t` is query `t`, and its colours are its weights over the keys (each row sums to one,
# except rows with no allowed key, which are zero). Everything above the diagonal is hatched: the future is
# masked. In sentence 0 the second "the" (row 4) looks at itself and at the first "the" — identical vectors
# have the largest dot product — and the diagonal is bright everywhere for the same reason (`x · x = |x|²`).
# In sentence 1 the pad columns are hatched, and the two pad queries' rows are cross-hatched: all zero, and so
# are their outputs (the printed line).
#
# Attention on raw vectors can only measure similarity. Lesson 03 gives each head learned projections of `x`
# into queries, keys and values, so that a head can learn *what* to look for.

# %% [markdown]
# ## 5. Find the bug
#
# Code that runs is not code that is right. Below is attention written in one piece, as you might find it in
# a colleague's notebook: it runs, it returns arrays of the right shapes, its heatmaps even look plausible.
# It has **one** mistake.
#
# How would you find it? Not by rereading it line by line, but by asking what must hold for *any* correct
# answer, and testing that on an input small enough to print: each query's weights are a distribution over
# the keys; a blocked key gets nothing; the future does not leak; `T ≠ S` and `Dh ≠ Dv` give the shapes the
# docstring says. The first property that fails tells you which step to look at. Then change as little as
# you can: the bug is one idea, so the fix is small.
#
# **Exercise.** Find and fix the bug in `fixed_attention(q, k, v, allowed=None)`. Its contract is that of your
# `scaled_dot_product_attention`; write the fix in the given code (calling your own attention instead would
# skip the point of the exercise). The check under it starts with the probe that exposes the bug.

# %% exercise=fixed_attention

# %% test=fixed_attention points=1
from decoder_course.visible import l02_attention as visible

visible.check_fixed_attention(fixed_attention)

# %% [markdown]
# ## What you built
#
# | function | shape | meaning |
# |---|---|---|
# | `softmax(x, axis=-1)` | `(...) → (...)` | positive weights summing to one along `axis`; the max is subtracted first |
# | `masked_softmax(scores, allowed)` | `(..., T, S) → (..., T, S)` | softmax over the allowed keys; a fully masked row is zeros |
# | `scaled_dot_product_attention(q, k, v, allowed)` | `(..., T, Dh), (..., S, Dh), (..., S, Dv) → (..., T, Dv), (..., T, S)` | `softmax(q·kᵀ/√Dh)` over allowed keys, times `v` |
#
# Next: lesson 03 runs several of these in parallel, one per head, with learned projections — first in NumPy,
# then as a PyTorch module checked against `nn.MultiheadAttention`.
