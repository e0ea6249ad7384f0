# %% [markdown]
# # Lesson 01 — Masks: who may look at whom
#
# Attention lets every query position mix information from key positions. Two rules limit that mixing in a
# decoder, and both are written as **boolean masks**:
#
# 1. **Causality.** When the decoder predicts token *t* it must not see tokens *t+1, t+2, …*: at generation
#    time they do not exist yet. If training lets them leak, the model learns to copy the answer and collapses
#    when it must generate (lesson 07 shows it happening).
# 2. **Padding.** Sequences in a batch have different lengths, so short ones are padded with `PAD`. A pad token
#    is not data: no query may attend to it.
#
# **The convention of this course** (the same as `torch.nn.functional.scaled_dot_product_attention`):
# a mask is boolean and **`True` means "this query may attend to this key"**. We call such a mask `allowed`; a
# padding description is `is_real`, `True` for real tokens. Shapes use `B` batch, `T` query length, `S` key length.
#
# In this lesson you write four small NumPy functions. Each one has a visible check right under it; run it to get
# feedback. A course that grades your notebook adds hidden checks on other inputs.

# %%
import numpy as np

from decoder_course import PAD
from decoder_course.plots import plot_mask, plot_masks

# %% [markdown]
# ## 1. The causal mask
#
# Query position `t` may attend to key positions `0, 1, …, t` — itself and the past — and to nothing later. As
# a matrix with one row per query and one column per key, that is everything **on and below the diagonal**.
#
# A worked example by hand for `T = 3` (rows are queries, columns are keys):
#
# ```
#            key 0  key 1  key 2
# query 0    True   False  False
# query 1    True   True   False
# query 2    True   True   True
# ```
#
# **Exercise.** Write `causal_mask(T)` returning a `(T, T)` boolean array. Compare positions with
# broadcasting (`np.arange`), or look up `np.tril`.

# %% exercise=causal_mask

# %% test=causal_mask points=1
from decoder_course.visible import l01_masks as visible

visible.check_causal_mask(causal_mask)

# %% [markdown]
# A picture says it faster: allowed cells are dark, blocked cells pale. Each row is what one query may see.

# %% demo
plot_mask(causal_mask(6), title="causal_mask(6)");

# %% [markdown]
# ## 2. The padding mask
#
# A batch of token ids, padded at the end with the vocabulary's pad id. `is_real` marks the real tokens. The pad
# id is an argument, not a constant: vocabularies differ, and a function that assumes `0` breaks silently on one
# where `0` is a real token.
#
# **Exercise.** Write `padding_mask(token_ids, pad_id)` returning `is_real`, a `(B, S)` boolean array. Do not
# change the caller's array.

# %% exercise=padding_mask

# %% test=padding_mask points=1
from decoder_course.visible import l01_masks as visible

visible.check_padding_mask(padding_mask)

# %% [markdown]
# ## 3. Combining them
#
# In a decoder's self-attention both rules apply at once: query `t` may attend to key `s` when `s ≤ t` **and** key
# `s` is a real token. The causal mask is the same for every sequence, `(T, S)`; the padding is per sequence,
# `(B, S)`. Attention scores have shape `(B, H, T, S)`, so we give the combined mask shape `(B, 1, T, S)`: the `1`
# broadcasts over the heads.
#
# The trap is the axis: `key_is_real` describes **keys**, so it must line up with the last axis `S`. Put it on
# `T` and you mask queries instead, which looks plausible and is wrong.
#
# **Exercise.** Write `combine_masks(causal, key_is_real)`.

# %% exercise=combine_masks

# %% test=combine_masks points=1
from decoder_course.visible import l01_masks as visible

visible.check_combine_masks(combine_masks)

# %% [markdown]
# Two sequences of a batch, the second with two pad tokens at the end: their columns go pale in every row.

# %% demo
ids = np.array([[5, 6, 7, 8, 9], [5, 6, 7, PAD, PAD]])
allowed = combine_masks(causal_mask(5), padding_mask(ids, PAD))
plot_masks([allowed[0, 0], allowed[1, 0]], titles=["sequence 0", "sequence 1 (2 pads)"]);

# %% [markdown]
# Notice a consequence: a query whose keys are *all* blocked (here none, but it happens with left padding or
# cross-attention to an empty source) has nothing to attend to. Lesson 02 decides what attention returns then.
#
# ## 4. From a mask to an additive bias
#
# Many implementations add a bias to the attention scores instead of selecting entries: `0` where allowed and a
# hugely negative number where blocked, so that `exp(score + bias)` is `0` there. Which number?
#
# - `-inf` looks exact, but a fully blocked row becomes `exp(-inf - (-inf)) = exp(nan)`: NaN, which then spreads.
# - `-1e9` is finite in float32 but does not exist in float16 (its largest magnitude is 65504): it becomes `-inf`.
# - `np.finfo(dtype).min`, the most negative finite value of the dtype, is finite in every dtype.
#
# **Exercise.** Write `mask_to_bias(allowed, dtype=np.float32)`: `0` where allowed, `np.finfo(dtype).min` where
# blocked, with the requested dtype.

# %% exercise=mask_to_bias

# %% test=mask_to_bias points=1
from decoder_course.visible import l01_masks as visible

visible.check_mask_to_bias(mask_to_bias)

# %% [markdown]
# See the difference the fill value makes on a fully blocked row, in float16:

# %%
scores = np.array([[1.0, 2.0, 3.0]], dtype=np.float16)  # (T, S) = (1, 3): one query, every key blocked
for name, fill in [("-inf", -np.inf), ("-1e9", -1e9), ("finfo.min", np.finfo(np.float16).min)]:
    # NumPy would warn twice here, and the printed numbers say why: -1e9 overflows float16, and -inf - (-inf) is NaN
    with np.errstate(over="ignore", invalid="ignore"):
        bias = np.full_like(scores, fill)  # (1, 3), float16 like the scores
        biased = scores + bias
        weights = np.exp(biased - biased.max(-1, keepdims=True))
        weights = weights / weights.sum(-1, keepdims=True)
    print(f"{name:>10}: bias {bias[0].tolist()}, scores + bias {biased[0].tolist()} -> weights {weights[0].tolist()}")

# %% [markdown]
# Read the printed weights: `-inf` and `-1e9` (which float16 turns into `-inf`) both give NaN; `finfo.min` gives a
# uniform average, finite but meaningless. That is why, in lesson 02, a fully masked row gets its weights set to
# zero explicitly.
#
# ## What you built
#
# | function | shape | meaning |
# |---|---|---|
# | `causal_mask(T)` | `(T, T)` | query `t` sees keys `≤ t` |
# | `padding_mask(ids, pad_id)` | `(B, S)` | `True` for real tokens |
# | `combine_masks(causal, key_is_real)` | `(B, 1, T, S)` | both rules, broadcast over heads |
# | `mask_to_bias(allowed, dtype)` | same as `allowed` | `0` / most negative finite value |
#
# Next: lesson 02 uses these masks inside softmax and attention.
