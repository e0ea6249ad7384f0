# %% [markdown]
# # Lesson 00 — Setup: conventions, shapes, and how your work is checked
#
# This course builds the decoder of a Transformer step by step, one idea per lesson: masks (01), attention
# (02), several heads (03), attention to an encoder's output (04), a decoder layer (05), a whole model (06),
# training it on toy tasks on a CPU (07), generating with it (08), making generation fast (09), the numerics
# that break in half precision (10), a GPT trained on real text with its own tokenizer (11) and the modern
# decoder block: RMSNorm, rotary positions, SwiGLU, grouped-query attention (12).
#
# A Transformer is mostly bookkeeping of array axes, and most of its bugs are bookkeeping bugs: a mask with
# the wrong polarity, two axes swapped, a reshape where a transpose was meant. They rarely crash; they give
# plausible numbers that are wrong. So this lesson does three things before any model:
#
# 1. shows how a lesson works and how your answers are checked;
# 2. states the course's **conventions** once: dimension letters, masks, padding, special tokens;
# 3. warms you up on the tool that keeps axes honest, einops' `rearrange`, with three small exercises.
#
# Run the notebook top to bottom (Run All), then work through it.

# %%
import numpy as np
from einops import rearrange

from decoder_course import BOS, DIMENSIONS, EOS, PAD
from decoder_course.checks import CheckFailed, check, expect_shape
from decoder_course.plots import plot_mask

# %% [markdown]
# ## 1. How a lesson works
#
# Each exercise is a function with its docstring and its body replaced by `raise NotImplementedError()`. You
# replace that line with your code and run the cell. Right under it sits a **test cell** with **visible
# checks**: run it, and each check prints `✓ what it checked`, or stops with `✗ what it checked: what broke
# and the likely reason`. A visible check is made of small pieces like this one:

# %%
with check("a probability distribution sums to one"):
    p = np.array([0.2, 0.3, 0.5])
    assert np.isclose(p.sum(), 1.0), f"it sums to {p.sum()}"

# %% [markdown]
# And when it fails, the message says which idea broke (we catch the failure here so that the notebook keeps
# running; in a test cell it stops the cell):

# %%
try:
    with check("every row of these attention weights sums to one"):
        weights = np.array([[0.2, 0.8], [0.5, 0.7]])
        sums = weights.sum(axis=-1)
        assert np.allclose(sums, 1.0), f"row 1 sums to {sums[1]}: was it normalised over the wrong axis?"
except CheckFailed as failure:
    print(failure)

# %% [markdown]
# <!-- graded-course -->
# ### How your notebook is graded
#
# Visible checks use small, fixed inputs that you can see. Passing them is necessary, not sufficient. When you
# submit, the grader:
#
# 1. runs your notebook **top to bottom in a fresh kernel** — so it must run without you: no cell that waits for
#    input, crashes the kernel or loops forever (a cell that never finishes costs every exercise after it);
# 2. in each test cell, also runs your function on **hidden inputs** chosen for that grading run: other sizes,
#    padded batches, fully masked rows, huge values. Your code only computes; the results are handed back as
#    plain arrays, and the **verdict is made outside your kernel**, by the grader comparing them with the
#    instructor's reference. No reference code or value ever enters your notebook;
# 3. grades **each exercise on its own**: one wrong answer costs that one item, not the ones after it. (When
#    an exercise builds on an earlier one of the same lesson — lesson 02's attention builds on your softmax —
#    a bug in the earlier one shows in both: fix the first failing check first.)
#
# Your feedback shows, for each exercise, the hidden checks' verdict and a message that says which idea broke
# ("a fully masked row should give zeros, got NaN"), never the hidden inputs or expected values.
# <!-- /graded-course -->
# <!-- self-study
# ### When a lesson is done
#
# Visible checks use small, fixed inputs that you can see: passing them is necessary, not sufficient. Write
# general code (no size that happens to appear in a check), and before you call a lesson done, run it **top to
# bottom in a fresh kernel** (Kernel › Restart Kernel and Run All Cells), or check the saved notebook from a
# terminal, which runs it that way and prints one line per exercise:
#
# ```bash
# python -m decoder_course check 00-setup.ipynb
# ```
#
# Courses that grade this notebook run hidden checks on other inputs as well (other sizes, padded batches,
# fully masked rows, huge values), each exercise on its own.
# -->
#
# A few rules follow: keep the function names and signatures as given (the checks call them), don't edit the
# test cells, and keep each lesson self-contained (everything it needs is imported or given in it).
#
# ## 2. The conventions of this course
#
# ### Dimension letters
#
# Every shape in the course is written with the same letters, in docstrings (a `Shape:` section) and in a
# comment at every line that changes a shape, such as `# (B, H, T, S)`:

# %%
for letter, meaning in DIMENSIONS.items():
    print(f"{letter:>3}  {meaning}")

# %% [markdown]
# `T` and `S` are different letters on purpose. In self-attention a sequence attends to itself, so `T = S`; in
# cross-attention (lesson 04) the decoder's `T` queries attend to the encoder's `S` keys, and `T ≠ S`. Code
# written with `T` everywhere works until the day it meets a source of a different length.
#
# ### Special tokens and padding: `PAD`, `BOS`, `EOS`, `is_real`
#
# Every toy vocabulary of the course starts with three special tokens, whose ids are named constants:
# `PAD` fills the end of short sequences in a batch, `BOS` ("beginning of sequence") is the decoder's first
# input, and `EOS` ("end of sequence") tells generation to stop.

# %% demo
from decoder_course.data import get_task

print(f"PAD = {PAD}, BOS = {BOS}, EOS = {EOS}")
task = get_task("reverse")  # a toy task: reverse a string of digits
batch = task.make_batch([("30417", "71403"), ("52", "25")])
print("src_ids (B, S):\n", batch["src_ids"])
print("src_is_real (B, S):\n", batch["src_is_real"])
print("tgt_ids (B, T), EOS appended:\n", batch["tgt_ids"])

# %% [markdown]
# The second source is two tokens long, so it is padded with `PAD` to the batch's length `S = 5`. Which
# positions are real is described by a boolean **`is_real`** array, `(B, S)` or `(B, T)`, `True` for real
# tokens. (Never assume the pad id is 0 in your own functions: take it as an argument.)
#
# ### Masks: `True` means "this query may attend to this key"
#
# Attention lets each **query** position gather information from **key** positions. A mask says which pairs
# are allowed. In this course a mask is **boolean** and **`True` means "this query may attend to this key"**,
# the convention of `torch.nn.functional.scaled_dot_product_attention`. We name masks `allowed`: the name
# carries the polarity. Row `t` is query `t`, column `s` is key `s`:

# %%
allowed = np.array([
    [True, False, False, False],  # query 0 may attend to key 0 only
    [True, True, False, False],   # query 1: keys 0 and 1
    [True, True, False, False],   # query 2: keys 0 and 1 (keys 2 and 3 are padding, say)
])  # (T, S) = (3, 4)
plot_mask(allowed, title="allowed (T, S): True = may attend");

# %% [markdown]
# Attention scores have shape `(B, H, T, S)`: one score per batch item, head, query and key. A mask
# **broadcasts** to that shape, so it only keeps the axes it needs: a `(T, S)` mask is the same for every
# sequence and head; a key-padding mask `(B, 1, 1, S)` is the same for every head and query.

# %%
B, H = 2, 8
key_is_real = np.array([[True, True, True, True], [True, True, False, False]])  # (B, S)
print(np.broadcast_to(allowed, (B, H, 3, 4)).shape)  # (T, S) -> (B, H, T, S)
print(np.broadcast_to(key_is_real[:, None, None, :], (B, H, 3, 4)).shape)  # (B, 1, 1, S) -> (B, H, T, S)

# %% [markdown]
# ### Fully masked rows return zeros
#
# Sometimes a query has **no** allowed key at all: a padded query row whose keys are all blocked, or a
# cross-attention to an empty source. Attention is a weighted average over the allowed keys, and an average
# of nothing is undefined; implementations quietly give one of three answers:
#
# | what the code does | what a fully masked row becomes |
# |---|---|
# | fill blocked scores with `-inf`, then softmax | **NaN**, which then spreads through every later layer |
# | fill with a large negative number such as `-1e9` | a **uniform average** over all keys, padding included |
# | set the weights of a fully masked row to zero | **zeros**: no information, and nothing invented |
#
# **This course's rule: a fully masked row returns zeros** — never NaN, never a uniform average. Lesson 02
# runs all three so that you see them happen.
#
# ### The PyTorch polarity trap
#
# PyTorch is not consistent: `F.scaled_dot_product_attention` takes `True` = may attend, but
# `nn.MultiheadAttention` and the `nn.Transformer*` modules take **`True` = blocked**, the opposite. Pass the
# same boolean tensor to both and one of them is wrong — without any error. Here is the trap, on one sequence
# of three tokens with a causal mask and identity projections (so both compute the same attention):

# %%
try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ModuleNotFoundError:  # lessons 00-02 need only NumPy; PyTorch comes in at lesson 03
    torch = None
    print("PyTorch is not installed here: this demo of its polarity trap waits for lesson 03")

if torch is not None:
    torch.manual_seed(0)
    seq = torch.randn(1, 3, 4)  # (B, T, D): queries, keys and values all at once
    causal = torch.tensor([[True, False, False],
                           [True, True, False],
                           [True, True, True]])  # (T, S), our polarity: True = may attend

    # F.scaled_dot_product_attention speaks our language: True = may attend.
    expected = F.scaled_dot_product_attention(seq, seq, seq, attn_mask=causal)  # (B, T, D)

    mha = nn.MultiheadAttention(4, 1, batch_first=True, bias=False).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(4).repeat(3, 1))  # q, k and v projections: identity
        mha.out_proj.weight.copy_(torch.eye(4))
        trap_out, trap_weights = mha(seq, seq, seq, attn_mask=causal)  # WRONG: MHA reads True as "blocked"
        # nn.MultiheadAttention uses the opposite polarity (True = blocked): invert at this boundary only.
        out, weights = mha(seq, seq, seq, attn_mask=~causal)

    print("weights with the mask passed as is (the trap):\n", trap_weights[0].numpy().round(2))
    print("weights with ~causal:\n", weights[0].numpy().round(2))
    print("trap equals SDPA:", torch.allclose(trap_out, expected, atol=1e-6),
          "| ~causal equals SDPA:", torch.allclose(out, expected, atol=1e-6))

# %% [markdown]
# With the mask passed as is, query 0 looks only at the **future** (keys 1 and 2) and query 2, whose keys are
# all "blocked", is NaN. With `~causal`, PyTorch's module agrees with `F.scaled_dot_product_attention`. The
# course keeps one polarity everywhere and inverts it **only** where it calls one of those modules, with a
# comment on that line, as above.
#
# ## 3. Shapes, and why we name axes
#
# A `reshape` never checks what the axes mean: it reads the numbers in memory order and cuts them into the new
# shape. That makes it easy to "swap" two axes with a reshape that has the right shape and the wrong content.
# Let every value say where it came from: `x[b, t, d] = 100 b + 10 t + d`.

# %%
B, T, D = 2, 3, 4
b, t, d = np.meshgrid(np.arange(B), np.arange(T), np.arange(D), indexing="ij")  # each (B, T, D)
x = 100 * b + 10 * t + d  # (B, T, D): x[1, 2, 3] == 123
print("x[:, 0] — both sequences at time 0:\n", x[:, 0])
print("x.reshape(T, B, D)[0] — NOT time 0 of both sequences:\n", x.reshape(T, B, D)[0])

# %% [markdown]
# The reshape has the shape `(T, B, D)` we asked for, but its row 0 holds times 0 and 1 of sequence 0 (values
# 0… and 10…), not time 0 of sequences 0 and 1 (values 0… and 100…). Nothing failed; a model trained on it
# would learn from scrambled data.
#
# `einops.rearrange` names every axis in a pattern, `"input axes -> output axes"`, and moves the values with
# their names. Parentheses merge or split axes: `(t d)` is one axis of size `T·D` in which `t` varies slowest.

# %%
print(rearrange(x, "b t d -> b d t").shape)  # (B, D, T): a transpose you can read
y = rearrange(x, "b t d -> b (t d)")  # (B, T * D): each sequence flattened, time-major
print(y[1])  # sequence 1: time 0's four features, then time 1's, then time 2's
print(rearrange(y, "b (t d) -> b t d", t=T).shape)  # (B, T, D) again: the size of t says where to cut

# %% [markdown]
# ### A pattern is a checked assertion
#
# Names with sizes are **checked**: `rearrange` raises when the array does not have the shape the pattern
# claims, instead of silently producing something else. A shape comment can rot; a pattern cannot.

# %%
print(rearrange(x, "b t d -> b d t", b=2, t=3).shape)  # sizes asserted: b == 2 and t == 3
for pattern, sizes in [("b t d -> b d t", {"b": 3}), ("b t (h dh) -> b t h dh", {"h": 3})]:
    try:
        rearrange(x, pattern, **sizes)
    except Exception as error:  # einops.EinopsError
        print(f"{pattern} with {sizes}:", str(error).splitlines()[-1].strip())

# %% [markdown]
# The visible checks do the same for the shapes your functions return, and say which axes look wrong:

# %%
try:
    with check("time-major activations have shape (T, B, D)"):
        expect_shape(x, (T, B, D), "x", names="T, B, D")  # x is still (B, T, D)
except CheckFailed as failure:
    print(failure)

# %% [markdown]
# One more property: `rearrange` works the same on NumPy arrays and PyTorch tensors (and returns the same kind
# of object), so the patterns you write now serve again in the PyTorch lessons.

# %%
if torch is not None:  # (without PyTorch installed, lessons 00-02 skip their few torch lines)
    print(type(rearrange(torch.from_numpy(x), "b t d -> b d t")).__name__)

# %% [markdown]
# ## 4. Warm-ups
#
# Three graded exercises, one line each with `rearrange`. Each takes activations `x` of shape `(B, T, D)`.
#
# ### Flatten the batch
#
# Many operations treat every token of every sequence alike: a linear layer, or the loss over a batch of
# predictions, where logits `(B, T, V)` become `(B·T, V)` rows (lesson 07). The order of the merged axis
# matters when you undo it: we want **batch-major** order, all of sequence 0 first, so that row `b·T + t` is
# `x[b, t]`.
#
# **Exercise.** Write `flatten_batch(x)`: `(B, T, D) → (B·T, D)` with row `b·T + t` equal to `x[b, t]`.

# %% exercise=flatten_batch

# %% test=flatten_batch points=1
from decoder_course.visible import l00_setup as visible

visible.check_flatten_batch(flatten_batch)

# %% [markdown]
# ### Time-major order
#
# Some code wants time first: PyTorch's `nn.MultiheadAttention` and `nn.RNN` take `(T, B, D)` unless you pass
# `batch_first=True`, and a loop over time steps reads `x[t]` for all sequences at once.
#
# **Exercise.** Write `time_major(x)`: `(B, T, D) → (T, B, D)` with `out[t, b]` equal to `x[b, t]` (a swap of
# axes, not a reshape: see section 3).

# %% exercise=time_major

# %% test=time_major points=1
from decoder_course.visible import l00_setup as visible

visible.check_time_major(time_major)

# %% [markdown]
# ### Split the features into heads
#
# Multi-head attention (lesson 03) cuts each token's `D` features into `H` groups of `Dh = D // H` features,
# one group per head, and lets each head attend on its own. Group `h` is the consecutive slice
# `x[b, t, h·Dh : (h+1)·Dh]`. The worked example: `D = 12` features `0 … 11` into `H = 3` heads gives groups
# `[0 1 2 3]`, `[4 5 6 7]`, `[8 9 10 11]`.
#
# **Exercise.** Write `split_last(x, H)`: `(B, T, D) → (B, T, H, Dh)`. `H` is an argument: don't hard-code it.
# (Inside parentheses the first name varies slowest; `rearrange` needs the size of one of the two new axes.)

# %% exercise=split_last

# %% test=split_last points=1
from decoder_course.visible import l00_setup as visible

visible.check_split_last(split_last)

# %% [markdown]
# ## What you built
#
# | function | shape | meaning |
# |---|---|---|
# | `flatten_batch(x)` | `(B, T, D) → (B·T, D)` | every token of every sequence as one row, sequence 0 first |
# | `time_major(x)` | `(B, T, D) → (T, B, D)` | time first, for code that loops over time or wants `(T, B, D)` |
# | `split_last(x, H)` | `(B, T, D) → (B, T, H, Dh)` | each token's features cut into `H` heads of `Dh` features |
#
# And the conventions the rest of the course relies on:
#
# | convention | in code |
# |---|---|
# | dimension letters | `B, T, S, H, D, Dh, F, V`; a `# (B, H, T, S)` comment at every reshape |
# | a mask | boolean `allowed`, `True` = this query may attend to this key, broadcasting to `(B, H, T, S)` |
# | padding | boolean `is_real`, `(B, S)` or `(B, T)`, `True` for real tokens |
# | fully masked rows | return zeros: never NaN, never a uniform average |
# | PyTorch's modules | `nn.MultiheadAttention` / `nn.Transformer*` take `True` = blocked: pass `~allowed`, with a comment |
# | special tokens | `PAD`, `BOS`, `EOS` from `decoder_course` |
#
# Next: lesson 01 builds the masks themselves.
