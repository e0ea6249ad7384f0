# %% [markdown]
# # Lesson 10 — Numerics: masks, half precision and autocast
#
# Real models rarely run in float32. Training uses **mixed precision** (matrix products in 16-bit floats, the rest
# in float32) and inference often runs entirely in **float16** or **bfloat16**: half the memory, twice the
# bandwidth, and much faster matrix units. The attention you wrote in lessons 02–04 was tested in float32. In this
# lesson we run masked attention in half precision and watch what breaks, then write a version that survives:
#
# 1. `mask_fill_value(dtype)`: the number to put at blocked keys;
# 2. `robust_masked_softmax(scores, allowed)`: never NaN, zeros for fully masked rows, correct in every dtype;
# 3. `robust_attention(q, k, v, allowed)`: the whole attention, finite in float16, bfloat16 and under
#    `torch.autocast`, agreeing with PyTorch's `F.scaled_dot_product_attention`.
#
# Nothing here is hypothetical: every failure below is produced by running it. Shapes use `B` batch, `H` heads,
# `T` queries, `S` keys, `Dh` head width; masks are boolean with `True` = "this query may attend to this key".

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import decoder_course

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# sections 5 and 7 run here: cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE overrides it)
device = decoder_course.device()
print("device:", device)

# %% [markdown]
# ## 1. Three number formats
#
# A float stores a sign, an exponent (the range) and a mantissa (the precision). float16 and bfloat16 both use
# 16 bits but split them differently: float16 keeps precision and gives up range, bfloat16 ("brain float") keeps
# float32's range and gives up precision. Ask PyTorch:

# %%
print(f"{'dtype':>9} | {'largest finite':>14} | {'most negative':>14} | {'eps (precision)':>15} | exp overflows above")
for dtype in DTYPES:
    info = torch.finfo(dtype)
    overflow = math.log(info.max)  # exp(x) is inf above this
    print(f"{str(dtype)[6:]:>9} | {info.max:14.5g} | {info.min:14.5g} | {info.eps:15.3g} | x = {overflow:.2f}")

print("\nfloat16:  2048 + 1 =", (torch.tensor(2048.0, dtype=torch.float16) + 1).item())
print("bfloat16:  256 + 1 =", (torch.tensor(256.0, dtype=torch.bfloat16) + 1).item())
print("float16:  -1e9 becomes", torch.tensor(-1e9).to(torch.float16).item())

# %% [markdown]
# Three facts to keep in mind for the rest of the lesson:
#
# - **float16 tops out at 65504.** `-1e9`, the "large negative number" of many tutorials, does not exist there:
#   converted, it becomes `-inf`. `exp(x)` overflows already at `x ≈ 11.1`.
# - **bfloat16 has float32's range but only about 2–3 significant digits** (`eps = 1/128`): `256 + 1` is `256`.
# - **Neither can accumulate long sums**: a float16 running total stops growing at 2048 when you add ones. A
#   softmax over thousands of keys sums thousands of terms; kernels therefore sum in float32.
#
# ## 2. Three ways to block a key, three dtypes: run them all
#
# Blocking a key means giving it a score so low that `exp` makes its weight 0. Lesson 01 listed three candidates:
# `-inf`, `-1e9` and `finfo(dtype).min`, the most negative *finite* number of the dtype. Two ways of applying the
# fill are common: **replace** the blocked scores (`scores.masked_fill(~allowed, fill)`) or **add** a bias
# (`scores + bias`, with the bias built once, often in float32, and cast to the scores' dtype). Here is the
# additive recipe, as a given helper to watch fail:

# %% given=naive_masked_softmax

# %% [markdown]
# Each recipe gets a two-row problem: row 0 has one blocked key, row 1 has *all* its keys blocked (a query with
# nothing to attend to, as happens with left padding or an empty source), and ordinary negative scores, as
# attention scores often are. The correct answer for row 1 is zeros
# (the course's convention, and what `F.scaled_dot_product_attention` returns). `outcome` classifies what came out.

# %%
scores32 = torch.tensor([[0.5, -1.0, 2.0], [-20.0, -24.0, -30.0]])  # (T, S) = (2, 3)
allowed2 = torch.tensor([[True, False, True], [False, False, False]])  # row 1: every key blocked


def outcome(weights):
    """Name what happened to the fully blocked row 1 (and whether row 0 is still right)."""
    row0, row1 = weights[0].float(), weights[1].float()
    want0 = torch.tensor([0.5, -1.0, 2.0]).masked_fill(~allowed2[0], -math.inf).softmax(-1)
    if not torch.isfinite(weights.float()).all():
        return "NaN"
    if not torch.allclose(row0, want0, atol=1e-2):
        return "row 0 wrong"
    if torch.allclose(row1, torch.full((3,), 1 / 3), atol=1e-2):
        return "uniform"
    return "zeros" if bool((row1 == 0).all()) else "other"


def replace_recipe(scores, allowed, fill):
    """masked_fill with `fill`, then softmax, in the scores' dtype."""
    return scores.masked_fill(~allowed, fill).softmax(dim=-1)


fills = {"-inf": -math.inf, "-1e9": -1e9, "finfo.min": None}  # None: the dtype's own finfo.min
results = {}
for recipe_name, recipe in [("add a bias", naive_masked_softmax), ("replace", replace_recipe)]:
    for fill_name, fill in fills.items():
        for dtype in DTYPES:
            value = torch.finfo(dtype).min if fill is None else fill
            try:
                results[recipe_name, fill_name, dtype] = outcome(recipe(scores32.to(dtype), allowed2, value))
            except RuntimeError as err:  # PyTorch refuses some fills outright
                results[recipe_name, fill_name, dtype] = "error" if "overflow" in str(err) else "crash"

for recipe_name in ("add a bias", "replace"):
    print(f"\n{recipe_name}: what happens to the fully blocked row")
    print(f"{'fill':>10} | " + " | ".join(f"{str(d)[6:]:>9}" for d in DTYPES))
    for fill_name in fills:
        print(f"{fill_name:>10} | " + " | ".join(f"{results[recipe_name, fill_name, d]:>9}" for d in DTYPES))

# %% [markdown]
# The same table as a picture:

# %% demo
colours = {"NaN": "#d7301f", "error": "#fc8d59", "uniform": "#fdcc8a", "zeros": "#a6d96a", "other": "#cccccc",
           "row 0 wrong": "#cccccc", "crash": "#cccccc"}
fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), layout="constrained")
for ax, recipe_name in zip(axes, ("add a bias", "replace"), strict=True):
    for i, fill_name in enumerate(fills):
        for j, dtype in enumerate(DTYPES):
            label = results[recipe_name, fill_name, dtype]
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colours[label], ec="white"))
            ax.text(j + 0.5, i + 0.5, label, ha="center", va="center")
    ax.set(xlim=(0, 3), ylim=(3, 0), title=f"{recipe_name}: fully blocked row")
    ax.set_xticks([0.5, 1.5, 2.5], [str(d)[6:] for d in DTYPES])
    ax.set_yticks([0.5, 1.5, 2.5], list(fills))
plt.show()

# %% [markdown]
# Read it row by row:
#
# - **`-inf`** gives NaN in every dtype: the row's max is `-inf`, and the softmax computes `-inf - (-inf)`,
#   which is NaN. One NaN row becomes NaN everywhere after the next layer mixes positions.
# - **`-1e9`** is a silent **uniform average** over keys the mask said do not count, in float32 and bfloat16
#   (all scores equal, so all weights equal). In float16 it does not exist: `masked_fill` refuses it
#   (`error`), and the additive recipe's cast turns it into `-inf`, hence NaN.
# - **`finfo.min`** *replacing* the scores is finite everywhere, so no NaN. *Added* to them, it is NaN again in
#   float16: the next section shows why. And even replaced, the fully blocked row still comes out **uniform**:
#   the fill alone cannot decide what a row with nothing to attend to should be. That takes an explicit rule:
#   **after the softmax, set blocked weights to zero**.
#
# **Exercise.** Write `mask_fill_value(dtype)`: the most negative finite number of `dtype`, as a Python float
# (`torch.finfo` knows it).

# %% exercise=mask_fill_value

# %% test=mask_fill_value points=1
from decoder_course.visible import l10_numerics as visible

visible.check_mask_fill_value(mask_fill_value)

# %% [markdown]
# ## 3. Replace, don't add
#
# Even the right number breaks if it is *added*, as the table's float16 column showed. In float16, `finfo.min` is
# `-65504`; add it to a score of `-20` and the sum, `-65524`, is beyond float16's range: it rounds to `-inf`. A
# fully blocked row of ordinary negative
# scores is NaN again:

# %%
neg_scores = torch.tensor([[-20.0, -120.0, -30.0]], dtype=torch.float16)  # (T, S) = (1, 3), all blocked
bias = torch.full_like(neg_scores, mask_fill_value(torch.float16))  # (1, 3) of -65504
print("scores + finfo.min      :", (neg_scores + bias).tolist())
print("softmax of that         :", (neg_scores + bias).softmax(-1).tolist())
every_key = torch.ones(1, 3, dtype=torch.bool)  # (T, S): all blocked
print("masked_fill(finfo.min)  :", neg_scores.masked_fill(every_key, -65504).softmax(-1).tolist())

# %% [markdown]
# `masked_fill` *replaces* the score, so it can never overflow. (Code that must add a bias, for instance a fused
# kernel's `attn_mask` argument, keeps the bias in float32 or uses half of `finfo.min`.)
#
# ## 4. Softmax in half precision: overflow before the softmax, and rounding inside it
#
# Two more things go wrong in float16, even without a mask.
#
# **Scores overflow before the softmax ever sees them.** Attention divides `q · k` by `√Dh`. Written the
# textbook way, `(q @ kᵀ) / √Dh`, the product is formed first. With `Dh = 64` and activations around 40 (not
# unusual in a model without careful normalisation), `q · k` is about `40 · 40 · 64 = 102400`: above 65504, so
# `inf`, and dividing `inf` by 8 is still `inf`. Scale `q` first and the largest value is 8 times smaller:

# %%
Dh = 64
q16 = torch.full((1, 2, Dh), 40.0, dtype=torch.float16)  # (B, T, Dh): large but ordinary activations
k16 = torch.full((1, 3, Dh), 40.0, dtype=torch.float16)  # (B, S, Dh)
late = (q16 @ k16.transpose(-2, -1)) / math.sqrt(Dh)  # (B, T, S): scaled after the product
early = (q16 * (1.0 / math.sqrt(Dh))) @ k16.transpose(-2, -1)  # (B, T, S): scaled before
print("scale after the product :", late[0, 0].tolist(), "-> softmax", late.softmax(-1)[0, 0].tolist())
print("scale before the product:", early[0, 0].tolist(), "-> softmax", early.softmax(-1)[0, 0].tolist())
x16 = torch.tensor([10.0, 11.0, 12.0], dtype=torch.float16)
print("textbook exp(x) / sum   :", (x16.exp() / x16.exp().sum()).tolist(), "| torch.softmax:", x16.softmax(-1).tolist())

# %% [markdown]
# The last line is the other overflow: the textbook `exp(x) / exp(x).sum()` in float16 overflows once `x > 11.1`.
# `torch.softmax` is safe from it because it subtracts each row's max before `exp`, as your lesson 02 softmax did.
#
# **Rounding inside the softmax.** A softmax sums one term per key: thousands of terms. Section 1 showed that a
# float16 total stops growing at 2048 when you add ones, so a kernel that kept its running sum in half precision
# would be badly wrong. Does PyTorch's? Measure it: a softmax over 1000 keys taken directly in bfloat16, against
# the same bfloat16 inputs taken in float32 and then rounded to bfloat16:

# %%
wide = torch.randn(4, 1000)  # (T, S): 4 queries over 1000 keys
exact = wide.bfloat16().double().softmax(-1)  # float64 answer for the bfloat16 inputs
in_bf16 = wide.bfloat16().softmax(-1)  # the softmax computed in bfloat16
via_f32 = wide.bfloat16().float().softmax(-1).bfloat16()  # softmax in float32, result rounded
for name, w in [("softmax in bfloat16", in_bf16), ("float32, then rounded", via_f32)]:
    err = (w.double() - exact).abs().max().item()
    print(f"{name:>22}: row sums {[round(s, 4) for s in w.double().sum(-1).tolist()]}, max error {err:.2e}")
print("identical:", torch.equal(in_bf16, via_f32))

# %% [markdown]
# When the last line says `True` (it did when this lesson was written, on a CPU), PyTorch's softmax kernel already
# accumulates half precision inputs in float32 internally, and what remains is rounding each weight to bfloat16's
# 2–3 digits (so rows sum to 1 only within about 1e-4). Not every kernel or hand-written `exp(x) / sum` does
# that, and the mask fill happens *before* the kernel, in whatever dtype the scores have. A float32 working copy
# settles both questions at once.
#
# The recipe that survives all of it, and the next exercise:
#
# 1. when the scores are float16 or bfloat16, **work in float32** (`scores.float()`): a float32 copy of a
#    `(B, H, T, S)` block is cheap next to the model, and every later step becomes safe;
# 2. **replace** blocked scores with `mask_fill_value` of the *working* dtype;
# 3. softmax over the last axis;
# 4. **zero the blocked weights** (`masked_fill(~allowed, 0.0)`): a fully blocked row becomes zeros, every
#    other row is unchanged because its blocked weights were already 0;
# 5. **return the scores' dtype**, so the rest of a float16 model stays float16.
#
# `allowed` broadcasts to the scores (`(T, S)`, `(B, 1, T, S)`, …) and may be `None`, meaning nothing is blocked.
# Do not modify the caller's `scores`.
#
# **Exercise.** Write `robust_masked_softmax(scores, allowed)`.

# %% exercise=robust_masked_softmax

# %% test=robust_masked_softmax points=1
from decoder_course.visible import l10_numerics as visible

visible.check_robust_masked_softmax(robust_masked_softmax)

# %% [markdown]
# ## 5. Autocast
#
# `torch.autocast` is how mixed precision is switched on: inside the `with` block, operations that profit from
# lower precision (matrix products, `nn.Linear`, convolutions) run in `bfloat16` or `float16`, while the tensors
# you pass in stay float32. Nothing in your code says which dtype a tensor has at a given line. Autocast is
# switched on per device type: `torch.autocast(device.type, ...)` covers the tensors on `device` (`"cpu"`,
# `"cuda"` or `"mps"`), and only those. Run it:

# %%
q = torch.randn(2, 4, 8, device=device)  # (B, T, Dh) float32
k = torch.randn(2, 5, 8, device=device)  # (B, S, Dh) float32
with torch.autocast(device.type, dtype=torch.bfloat16):
    scores_ac = q @ k.transpose(-2, -1)  # (B, T, S)
    print("q:", q.dtype, "| k:", k.dtype, "| q @ kᵀ:", scores_ac.dtype)

# %% [markdown]
# That makes a classic bug: taking the fill from the *inputs'* dtype. Inside autocast, `q` is float32 but the
# scores are bfloat16, and float32's `finfo.min` (`-3.40e38`) is just beyond bfloat16's range (`-3.39e38`):

# %%
mask_ac = torch.rand(2, 4, 5, device=device) > 0.3  # (B, T, S)
with torch.autocast(device.type, dtype=torch.bfloat16):
    scores_ac = q @ k.transpose(-2, -1)  # (B, T, S) in bfloat16
    try:
        scores_ac.masked_fill(~mask_ac, torch.finfo(q.dtype).min)  # the fill of q's dtype, float32
    except RuntimeError as err:
        print("fill from q.dtype     :", str(err).splitlines()[0])
    filled = scores_ac.masked_fill(~mask_ac, mask_fill_value(scores_ac.dtype))
    print("fill from scores.dtype: finite:", bool(torch.isfinite(filled).all()))

# %% [markdown]
# The rule: **a fill value belongs to the tensor it fills.** Your `robust_masked_softmax` already follows it (it
# fills the float32 working copy with float32's minimum), so it works inside autocast unchanged.
#
# ## 6. Robust attention
#
# **Exercise.** Write `robust_attention(q, k, v, allowed=None) -> (out, weights)`: scaled dot-product attention
# that is NaN-free in float16, bfloat16 and under autocast.
#
# - scale `q` by `1/√Dh` **before** the product with `kᵀ` (section 4);
# - take the weights with your `robust_masked_softmax`;
# - `out = weights @ v`; a fully blocked query row gets zero weights and a zero output, as
#   `F.scaled_dot_product_attention` gives;
# - outside autocast, `out` and `weights` keep the inputs' dtype.
#
# Shapes: `q (..., T, Dh)`, `k (..., S, Dh)`, `v (..., S, Dv)`, `allowed` broadcastable to `(..., T, S)` or `None`.
# The visible check compares with `F.scaled_dot_product_attention` in every dtype (you may not call it).

# %% exercise=robust_attention

# %% test=robust_attention points=2
from decoder_course.visible import l10_numerics as visible

visible.check_robust_attention(robust_attention)

# %% [markdown]
# ## 7. Measured: what breaks where
#
# One attention problem, `(B, H, T, S, Dh) = (2, 4, 6, 9, 64)` with ordinary activations, padding and a fully
# masked query row, run four ways in every setting. Against float64 `F.scaled_dot_product_attention`:
#
# - *textbook*: `(q @ kᵀ) / √Dh`, blocked scores replaced by `-1e9`, softmax in the working dtype;
# - *`-inf`*: scaled first, blocked scores replaced by `-inf`;
# - *finfo.min*: scaled first, `finfo.min` of the scores' dtype, but no zeroing after the softmax;
# - *robust*: your `robust_attention`.

# %%
def textbook(q, k, v, allowed):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    return scores.masked_fill(~allowed, -1e9).softmax(-1) @ v


def minus_inf(q, k, v, allowed):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)  # (B, H, T, S)
    return scores.masked_fill(~allowed, -math.inf).softmax(-1) @ v


def finfo_only(q, k, v, allowed):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)  # (B, H, T, S)
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1) @ v


B, H, T, S, Dh = 2, 4, 6, 9, 64
qm = torch.randn(B, H, T, Dh, device=device) * 2  # (B, H, T, Dh)
km = torch.randn(B, H, S, Dh, device=device) * 2  # (B, H, S, Dh)
vm = torch.randn(B, H, S, Dh, device=device)  # (B, H, S, Dh)
is_real = torch.arange(S, device=device) < torch.tensor([[S], [5]], device=device)  # (B, S): sequence 1: 4 pads
allowed_m = is_real[:, None, None, :].expand(B, 1, T, S).clone()  # (B, 1, T, S)
allowed_m[1, 0, 2] = False  # query 2 of sequence 1 may see nothing
# the float64 truth on the CPU (Apple's mps has no float64)
truth = F.scaled_dot_product_attention(qm.cpu().double(), km.cpu().double(), vm.cpu().double(),
                                       attn_mask=allowed_m.cpu())

settings = {"float32": (torch.float32, None), "float16": (torch.float16, None), "bfloat16": (torch.bfloat16, None),
            "autocast bf16": (torch.float32, torch.bfloat16), "autocast fp16": (torch.float32, torch.float16)}
methods = {"textbook": textbook, "-inf": minus_inf, "finfo.min": finfo_only,
           "robust": lambda *args: robust_attention(*args)[0]}
print(f"{'setting':>14} | " + " | ".join(f"{m:>12}" for m in methods))
for setting, (dtype, autocast_dtype) in settings.items():
    cells = []
    for fn in methods.values():
        args = (qm.to(dtype), km.to(dtype), vm.to(dtype), allowed_m)
        try:
            autocast = torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16,
                                      enabled=autocast_dtype is not None)
            with autocast:
                out = fn(*args)
            err = (out.cpu().double() - truth).abs().max().item()
            cells.append("NaN" if math.isnan(err) else f"err {err:.1e}")
        except RuntimeError as exc:
            cells.append("error" if "overflow" in str(exc) else "crash")
    print(f"{setting:>14} | " + " | ".join(f"{c:>12}" for c in cells))
uniform = vm[1].float().mean(dim=-2).abs().max().item()  # (H, Dh) averaged over all S keys, instead of zeros
print(f"\nthe fully masked query averaged over its keys instead of zeros would be off by {uniform:.1e}")

# %% [markdown]
# Every error of the size printed on the last line is the fully masked query: averaged over its keys instead of
# zeros (the other rows are fine). So every recipe but one fails somewhere: NaN with `-inf` in every setting, a refused fill with
# `-1e9` in float16 (autocast included), a silent average with `-1e9` elsewhere and with `finfo.min` without
# zeroing. The robust version's errors are each dtype's own rounding: float16 keeps about 3 significant digits,
# bfloat16 about 2.
#
# ## 8. Find the bug: a log-sum-exp
#
# The softmax's denominator has uses of its own. Its log, `log Σ exp(score)` over a query's allowed keys, is what
# a cross-entropy loss subtracts from the target's score, and what fused attention kernels keep for every query:
# the backward pass needs it, and so does merging attention computed over separate blocks of keys. Written as it
# reads it overflows as soon as a score passes the threshold section 1 printed, so it is computed with the
# softmax's own trick: `m + log Σ exp(score − m)`, where `m` is a largest score. Every term is then at most 1, and
# the largest is exactly 1.
#
# Below is a colleague's `masked_logsumexp(scores, allowed)`, built on **your** `mask_fill_value`. It has **one**
# mistake. On the batches its author tried (random scores of ordinary size, a few blocked keys) it agreed with
# `torch.logsumexp`. It goes wrong, silently, on batches every real model meets: a query whose keys are all
# padding, and a head whose queries score on very different scales (one confident query, one that is not).
#
# How would you find it? The docstring promises that a query's result depends on its own row of scores only.
# Test that promise directly: change one row (add a large number to its scores) and look at which results move.
# Then, for a row that went wrong, print the pieces: the `m` the code subtracted, and the terms `exp(score − m)`
# it summed. Does every row have a term equal to 1, as the trick promised? The check under the cell runs the
# probe for you and compares with `torch.logsumexp`.
#
# **Exercise.** Find and fix the bug in `masked_logsumexp(scores, allowed=None)`, in the given code. It is graded
# with your own `mask_fill_value`: a mistake there costs its own cell, not this one.

# %% exercise=masked_logsumexp

# %% test=masked_logsumexp points=1
from decoder_course.visible import l10_numerics as visible

visible.check_masked_logsumexp(masked_logsumexp)

# %% [markdown]
# ## What you built
#
# | function | what it guarantees |
# |---|---|
# | `mask_fill_value(dtype)` | the most negative *finite* number of the dtype: never `-inf`, never out of range |
# | `robust_masked_softmax(scores, allowed)` | float32 inside, replace-not-add, blocked weights exactly 0, fully masked rows zeros, the scores' dtype out |
# | `robust_attention(q, k, v, allowed)` | `q` scaled before the product; NaN-free in float16, bfloat16 and autocast; equal to `F.scaled_dot_product_attention` |
# | `masked_logsumexp(scores, allowed)` (fixed) | each query subtracts its own largest score: no row's result depends on another row's scale |
#
# The common advice, "mask with a large negative fill; `-inf` breaks under mixed precision", is now something you
# have watched happen: `-inf` gives NaN, `-1e9` overflows float16 or averages
# silently, and even `finfo.min` needs replacing rather than adding, a float32 softmax, and explicit zeros for
# rows with nothing to attend to.
