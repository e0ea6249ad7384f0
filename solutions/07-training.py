# %% [markdown]
# # Lesson 07 — Training: teacher forcing, a loss that ignores padding, and watching a model learn
#
# Lesson 06's model turns ids into logits, but it has never seen data. This lesson trains it on a toy task,
# **reversing a string of digits** (`"30417" → "71403"`), on a CPU, within a minute, and then breaks it
# on purpose to see why each piece matters. You write the four pieces a training loop needs from you:
#
# 1. `shift_right`: **teacher forcing**, the decoder's input during training;
# 2. `sequence_loss`: cross-entropy that **ignores padding**, with optional **label smoothing**;
# 3. `exact_match`: the metric that counts whole sequences generated right;
# 4. `train_step`: one optimiser step (loss, gradients clipped, one update), the step the training loop runs.
#
# The loop around your step (AdamW, learning-rate warm-up, a progress bar and live curves) is given. Then three measured
# ablations: training **without the causal mask**, **without cross-attention**, and with the paper's **`√D`
# embedding scaling**.
#
# Conventions: `B` batch, `T` target length, `S` source length, `D` model width, `V` vocabulary. Masks are
# boolean, `True` = "may attend"; `PAD`, `BOS`, `EOS` are the special ids of every toy vocabulary.

# %%
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import decoder_course
from decoder_course import BOS, EOS, PAD
from decoder_course.data import get_task
from decoder_course.plots import plot_curves

_ = torch.manual_seed(0)  # every random tensor below is the same on every run
# cuda if there is a GPU, else mps (Apple), else cpu; the environment variable DECODER_COURSE_DEVICE overrides it
device = decoder_course.device()
print("device:", device)

# %% [markdown]
# **Training time, and grading.** Run as it is, this notebook trains for up to 30 seconds (the main run) plus a
# shorter run per ablation, each capped in seconds too; each run prints how long it took. When it is **graded**,
# nbgrader sets the environment variable `NBGRADER_EXECUTION` (`decoder_course.grading()` reads it): the
# demonstration cells you left as they are (the training runs and ablations below) are skipped, and a training run
# in a cell you edited is cut to **3 seconds**. The graded exercises do not depend on training, and grading stays
# fast. The numbers printed in a graded run are therefore not the ones the text discusses; run the notebook
# yourself to see those.

# %%
GRADING = decoder_course.grading()  # True while nbgrader grades this notebook


def budget(steps: int | None = None, seconds: float | None = None) -> dict:
    """How long a training run may last: as asked, or 3 seconds when the notebook is being graded."""
    return {"seconds": 3.0} if GRADING else {"steps": steps, "seconds": seconds}


def last_mean(history: dict, name: str, n: int = 10) -> float:
    """The mean of the last n recorded values of a curve (losses are noisy from batch to batch)."""
    values = history[name][1][-n:]
    return sum(values) / len(values)


def value_at(history: dict, name: str, step: int) -> float:
    """A curve's value at the last recorded step <= step (NaN if it has none: a run cut short)."""
    steps, values = history[name]
    return next((v for s, v in zip(reversed(steps), reversed(values)) if s <= step), float("nan"))


print("graded run: every training run is cut to 3 s" if GRADING else "full run: training as described")

# %% [markdown]
# ## Building blocks from earlier lessons
#
# Lesson 06's model and everything it is made of, given so that this lesson runs, and is graded, on its own. (In a
# graded course, a release made while one of those lessons is still open runs your own code from it instead, and
# says so in the cell; grading still runs the course's versions.)

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer

# %% given=model:sinusoidal_table,PositionalEncoding,EncoderLayer,Encoder,Decoder,Seq2SeqTransformer

# %% [markdown]
# ## 1. The task and its batches
#
# `decoder_course.data` makes toy tasks by code: nothing is downloaded, every example comes from a seed, and a
# fixed tenth of all possible sources is **held out**: never seen in training, used only to measure. Sources
# are 3 to 10 digits. Vocabularies are characters, after the three special tokens `PAD = 0`, `BOS = 1`,
# `EOS = 2`.
#
# A batch holds the source ids and the target ids, each **padded** with `PAD` to the longest sequence of the
# batch, and their `is_real` masks. Every target ends with `EOS`: a model that is to stop by itself must learn
# to say where the answer ends. There is no `BOS` in the batch yet; that is your first exercise.

# %%
task = get_task("reverse")
print(task.description, "|", task.src_vocab)
pairs = task.make_pairs(3, rng=0)
batch = task.make_batch(pairs)
for (src, tgt), src_ids, tgt_ids in zip(pairs, batch["src_ids"], batch["tgt_ids"]):
    print(f"{src:>10} → {tgt:<10}  src_ids {src_ids.tolist()}\n{'':>25}tgt_ids {tgt_ids.tolist()}")

# %% [markdown]
# ## 2. Teacher forcing
#
# The decoder predicts token `t` from the tokens before it. At generation time those are the tokens it has
# generated so far. In training we do better: we feed the **true** previous tokens and train every position
# at once, in one parallel pass (this is *teacher forcing*). The decoder's input is the target **shifted right**
# by one: `BOS` first, then the target without its last token.
#
# ```
# position            0     1     2     3     4     5
# decoder input      BOS    7     1     4     0     3        = shift_right(target)
# must predict        7     1     4     0     3    EOS       = target
# ```
#
# Position `t` reads `BOS, y₀ … y_{t-1}` and is scored on `y_t`. The causal mask (lesson 01) is what keeps it
# from also reading `y_t`, which sits at input position `t + 1`; section 7 shows what happens without it. The
# dropped last token is `EOS` or `PAD`: nothing is predicted after it.
#
# **Exercise.** Write `shift_right(tgt_ids, bos_id)`: same shape and dtype as `tgt_ids`, the input unchanged
# (build a new tensor, e.g. with `torch.cat` and `torch.full`).

# %% exercise=shift_right

# %% test=shift_right points=1
from decoder_course.visible import l07_training as visible

visible.check_shift_right(shift_right)

# %% [markdown]
# ## 3. A loss that ignores padding
#
# The model outputs logits `(B, T, V)`; the targets are ids `(B, T)`. The loss at one position is the
# cross-entropy `-log softmax(logits)[target]`: how surprised the model is by the right token. Two details
# make it right for batches of sequences:
#
# - **Padding does not count.** A padded position has no token to predict. Averaging over all `B × T`
#   positions would count them as zero-loss positions and shrink the loss of batches with more padding (or, if
#   `PAD` is scored as a target, teach the model to predict padding). Average over the **real** positions only:
#   the sum of their losses divided by their number.
# - **Compute `log_softmax` directly**, never `log(softmax(x))`: for a large gap between logits, `softmax`
#   underflows to exactly 0 and its log is `-inf`. `log_softmax` subtracts the row's log-sum-exp and stays finite.
#
# **Label smoothing** (ε, e.g. 0.1, as in the paper) trains towards a softened target: probability `1 - ε` on
# the right token and `ε` spread **uniformly over all `V` tokens**. Its loss per position is
#
# $$(1-ε)\,\big(-\log p_{y}\big) \;+\; ε \cdot \frac{1}{V}\sum_{v=1}^{V}\big(-\log p_v\big),$$
#
# which keeps the model from becoming infinitely confident. This is exactly what
# `F.cross_entropy(..., ignore_index=pad_id, label_smoothing=ε)` computes (note: `ε/V` on every token, the right
# one included, not `ε/(V-1)` on the others).
#
# **Exercise.** Write `sequence_loss(logits, targets, pad_id, label_smoothing=0.0)` returning a scalar tensor,
# **without** calling `F.cross_entropy` or `nn.CrossEntropyLoss` (use `log_softmax` and `gather`, or one-hot
# products). A batch with no real token at all returns `0`, not the NaN of `0 / 0`.

# %% exercise=sequence_loss

# %% test=sequence_loss points=2
from decoder_course.visible import l07_training as visible

visible.check_sequence_loss(sequence_loss)

# %% [markdown]
# Yours and PyTorch's, side by side, on logits for one batch of the task (random logits, as from an untrained
# model) with and without label smoothing; and what counting the padding would have done.

# %%
tgt = batch["tgt_ids"]  # (B, T) with PAD after EOS
logits = torch.randn(*tgt.shape, len(task.tgt_vocab)) * 3  # (B, T, V)
for eps in (0.0, 0.1):
    ours = sequence_loss(logits, tgt, PAD, label_smoothing=eps)
    theirs = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=PAD,
                             label_smoothing=eps)
    print(f"label_smoothing={eps}: sequence_loss = {ours.item():.6f}   F.cross_entropy = {theirs.item():.6f}")
per_position = F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none")  # (B, T), padding included
is_real = tgt != PAD
print(f"mean over real positions: {per_position[is_real].mean().item():.4f}; over all B × T positions with "
      f"padding zeroed: {(per_position * is_real).mean().item():.4f} ({int((~is_real).sum())} pads)")

# %% [markdown]
# ## 4. Exact match
#
# Token accuracy flatters a sequence model: a reversal with one digit wrong is 90 % right token by token and
# 100 % wrong as an answer. We count a generated sequence as correct only when it equals its target at every
# position **up to and including the target's `EOS`**: the right digits, and then the model must also stop.
# What it writes after that `EOS` does not matter (generation may run on, or pad). A target without `EOS` must
# be matched at every position. The two tensors may have different lengths: pad the shorter with `pad_id`.
#
# A worked example (`EOS = 2`, `PAD = 0`), target `[5, 6, 2, 0]`:
#
# | prediction | correct? | why |
# |---|---|---|
# | `[5, 6, 2, 0, 0]` | yes | a longer prediction, padded after `EOS` |
# | `[5, 6, 2, 9, 9]` | yes | anything after `EOS` is ignored |
# | `[5, 6, 9, 0]` | no | no `EOS` where the target ends: the model did not stop |
# | `[5, 2, 0, 0]` | no | stopped too early |
#
# **Exercise.** Write `exact_match(pred_ids, target_ids, pad_id, eos_id)` returning a Python float: the fraction
# of sequences that are correct.

# %% exercise=exact_match

# %% test=exact_match points=1
from decoder_course.visible import l07_training as visible

visible.check_exact_match(exact_match)

# %% [markdown]
# ## 5. Generating, to measure
#
# Exact match needs the model to **generate**: start with `BOS`, take the most likely next token, append it,
# repeat. `greedy_generate` is the simplest such loop: it encodes the source once, then calls `decode` on the
# growing prefix `max_len` times. It never stops early and writes on after `EOS`, which `exact_match` ignores.
# Lesson 08 writes the real decoders (each sequence stopping at its own `EOS`, sampling, beam search), and
# lesson 09 makes them fast. `evaluate_exact_match` runs it on held-out pairs and scores them with your
# `exact_match`.

# %% given=greedy_generate,evaluate_exact_match

# %% [markdown]
# ## 6. The training loop
#
# `train` (given, read it) repeats one step, **yours**, `train_step` (below): feed `shift_right(tgt)` to the
# model, score the logits against `tgt` with `sequence_loss`, back-propagate, clip the gradient norm to 1, step
# **AdamW**. Around it, `train` draws a fresh batch per step and schedules the learning rate.
# Four choices deserve a word:
#
# - **Learning-rate warm-up.** The learning rate rises linearly from ~0 to `5e-3` over the first 25 steps, then
#   decays as `1/√step` (the paper's schedule). Early on Adam's estimates of the gradient's scale are noise, and
#   full-size steps on noise can wreck a Transformer's first layers (lesson 05: post-LN needs it badly; pre-LN,
#   as here, much less, which is why a short warm-up to a high rate works).
# - **Label smoothing 0.1** (your `sequence_loss`): a model that may not become certain keeps learning from
#   the tokens it already gets right, and here it reaches 99 % in fewer steps than without. These settings
#   (`TRAINING` below) were chosen by measuring steps to 99 % over several seeds: they need fewer than `train`'s
#   defaults (the paper's gentler `3e-3`, 100 warm-up steps). The run below prints its own steps and time.
# - **Gradient clipping** caps the occasional huge gradient without changing the direction.
# - **Exact match on 200 held-out pairs every 50 steps**, by generation, not teacher forcing: that is the
#   number that says whether the model can do the task. The clock pauses while it evaluates and draws.
#
# The model: `D = 64`, 4 heads, `F = 256`, 2 encoder + 2 decoder layers, pre-LN, no dropout (data are
# unlimited here: nothing to overfit). Batches of 128; at most 30 seconds; it stops as soon as held-out exact
# match reaches 99 %. Watch the progress bar and the curves: the loss falls first, then exact match jumps
# once every digit of a sequence is right.
#
# One more choice: **untied** output weights. `nn.Embedding` starts at `N(0, 1)`, so a tied `(V, D)` matrix
# gives the untrained model logits of size about `√D`: a confident, wrong start. See the loss before training:

# %%
V = len(task.tgt_vocab)
config = dict(src_vocab=V, tgt_vocab=V, d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.0)
TRAINING = dict(lr=5e-3, warmup_steps=25, label_smoothing=0.1)  # every run below: see section 6
probe = {name: t.to(device) for name, t in task.make_batch(task.make_pairs(256, rng=7)).items()}  # on the device
for tie in (True, False):
    torch.manual_seed(0)
    fresh = Seq2SeqTransformer(**config, tie_weights=tie).to(device).eval()
    with torch.no_grad():
        logits = fresh(probe["src_ids"], shift_right(probe["tgt_ids"], BOS), probe["src_is_real"])
    loss = F.cross_entropy(logits.transpose(1, 2), probe["tgt_ids"], ignore_index=PAD)
    print(f"tie_weights={tie!s:5}: loss before training {loss.item():6.2f}   (a uniform guess: ln V = "
          f"{math.log(V):.2f})")

# %% [markdown]
# With tied weights the model first has to unlearn that confidence, and it needs more steps to reach 99 % on
# this task (try it: `tie_weights=True` in the next run, and compare the step count it prints). The paper's
# remedy is to start the embeddings small. We train untied.
#
# ### One training step
#
# Everything the model learns happens in one step: a forward pass on the shifted target, the loss against the
# target, gradients, an update. Two details decide whether it works. PyTorch *adds* each backward pass into
# `.grad`, so the previous step's gradients must go first, or every step also pushes in the directions of all
# the earlier batches. And the gradient is clipped (all parameters together, to a joint norm of at most
# `clip_norm`: same direction, capped size) between the backward pass and the update, because clipping after
# the update changes nothing that was used. Return the loss as a Python float: holding the tensor would keep the
# step's whole graph alive in the history.
#
# <details><summary>Hint: the PyTorch calls, in order</summary>
#
# `optimizer.zero_grad()`, `loss.backward()`, `torch.nn.utils.clip_grad_norm_(…)`, `optimizer.step()`, and
# `loss.item()` for the value returned.
#
# </details>
#
# **Exercise.** Write `train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0)`; `batch` is a dict
# with `src_ids`, `src_is_real` and `tgt_ids`, as `task.batches` yields it. Leave the model's mode (train or
# eval) as it is and the batch unchanged. The grader runs one step of yours and one of its own on copied weights
# and compares the loss, the parameters after the step and the gradient norm.

# %% exercise=train_step

# %% test=train_step points=2
from decoder_course.visible import l07_training as visible

visible.check_train_step(train_step, Seq2SeqTransformer)

# %% given=train

# %% demo
torch.manual_seed(0)
model = Seq2SeqTransformer(**config, tie_weights=False).to(device)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {device}")
started = time.perf_counter()
history = train(model, task, **budget(seconds=30), **TRAINING, eval_every=50, eval_pairs=200,
                target_exact_match=0.99, device=device)
wall = time.perf_counter() - started

final_steps, final_em = history["exact_match"][0][-1], history["exact_match"][1][-1]
reached = next((step for step, em in zip(*history["exact_match"]) if em >= 0.99), None)
print(f"held-out exact match {final_em:.1%} after {final_steps} steps "
      f"({wall:.0f} s of wall time, held-out evaluations included)")
print(f"≥ 99 % reached at step {reached}" if reached else "99 % not reached within the budget")

# %% [markdown]
# The training time printed by `train` excludes evaluation; the wall time printed under it includes the
# held-out evaluations. Now read the model's answers on held-out sources:

# %% demo
test_pairs = task.make_pairs(6, rng=99, split="test")
test_batch = {name: t.to(device) for name, t in task.make_batch(test_pairs).items()}
model.eval()
pred = greedy_generate(model, test_batch["src_ids"], task.max_tgt_len + 1, BOS, test_batch["src_is_real"])
for (src, tgt), text in zip(test_pairs, task.tgt_vocab.decode_batch(pred)):
    print(f"{src:>10} → {text:<10} {'✓' if text == tgt else '✗ expected ' + tgt}")

# %% [markdown]
# ## 7. Ablation: no causal mask
#
# What if the decoder's self-attention had no causal mask? `PeekingSeq2SeqTransformer` is the same model with
# only that mask removed (padding is still hidden). With teacher forcing, the token position `t` must predict,
# `y_t`, sits in the decoder input at position `t + 1`: a model allowed to look ahead learns to **copy it**.
# Its training loss and teacher-forced token accuracy look superb. At generation time position `t + 1` does not
# exist yet; what the model learned to read is not there.

# %% given=PeekingSeq2SeqTransformer

# %% demo
torch.manual_seed(0)
peeking = PeekingSeq2SeqTransformer(**config, tie_weights=False).to(device)
peek_history = train(peeking, task, **budget(steps=100, seconds=8), **TRAINING, eval_every=100, eval_pairs=200,
                     live=False, device=device)

eps = TRAINING["label_smoothing"]
right, other = 1 - eps + eps / V, eps / V  # the smoothed target: its entropy is the lowest loss there is
floor = -(right * math.log(right) + (V - 1) * other * math.log(other))
n = peek_history["loss"][0][-1]
print(f"label smoothing's floor (the loss of a model that is always right): {floor:.3f}")
print(f"without the causal mask, after {n} steps: teacher-forced loss {last_mean(peek_history, 'loss'):.3f}, "
      f"token accuracy {last_mean(peek_history, 'token_accuracy'):.1%}, "
      f"held-out exact match by generation {peek_history['exact_match'][1][-1]:.1%}")
print(f"with the causal mask, at step {n}:       loss {value_at(history, 'loss', n):.3f}, held-out exact match "
      f"{value_at(history, 'exact_match', n):.1%}")
peeking.eval()
pred = greedy_generate(peeking, test_batch["src_ids"], task.max_tgt_len + 1, BOS, test_batch["src_is_real"])
for (src, tgt), text in list(zip(test_pairs, task.tgt_vocab.decode_batch(pred)))[:3]:
    print(f"{src:>10} → {text!r:<14} (expected {tgt})")

# %% [markdown]
# A training loss near label smoothing's floor and a token accuracy near 100 %, and an exact match near zero. This
# is the most common silent bug of a hand-written decoder, and the training loss will never show it: **always
# measure by generation.**
#
# ## 8. Ablation: no cross-attention
#
# Now the opposite: a decoder that cannot read the source. We block every memory key in cross-attention by
# passing an all-`False` `src_is_real`; by the course's convention a query with no allowed key gets a zero
# attention output, so the source never reaches the decoder. It can still learn the *target language*: digits,
# then `EOS`, at plausible lengths.

# %% demo
class BlindSeq2SeqTransformer(Seq2SeqTransformer):
    """The ablation: cross-attention sees no memory key, so the decoder never reads the source."""

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        no_source = torch.zeros(memory.shape[:2], dtype=torch.bool, device=memory.device)  # (B, S): all blocked
        return super().decode(tgt_ids, memory, no_source, tgt_is_real)


torch.manual_seed(0)
blind = BlindSeq2SeqTransformer(**config, tie_weights=False).to(device)
blind_history = train(blind, task, **budget(steps=75, seconds=6), **TRAINING, eval_every=75, eval_pairs=200,
                      live=False, device=device)
n = blind_history["loss"][0][-1]
print(f"without cross-attention, after {n} steps: loss {last_mean(blind_history, 'loss'):.3f} (ln 10 = "
      f"{math.log(10):.3f}: a uniform guess among the digits, a little more with label smoothing), held-out "
      f"exact match "
      f"{blind_history['exact_match'][1][-1]:.1%}")
print(f"with cross-attention, at step {n}:        loss {value_at(history, 'loss', n):.3f}, held-out exact match "
      f"{value_at(history, 'exact_match', n):.1%}")

# %% [markdown]
# The loss stalls near `ln 10` (label smoothing adds a little): the model learns where sequences end and that digits
# come next, but which digit is a coin toss among ten. Exact match is zero. The causal mask and cross-attention are
# both load-bearing.
#
# ## 9. Ablation: the paper's `√D` embedding scaling
#
# The paper multiplies embeddings by `√D`. Its embeddings start small; PyTorch's `nn.Embedding` starts at
# `N(0, 1)`, so each token vector already has norm about `√D = 8`, against at most 1 per entry of the positional
# encoding. Scaling by `√D` makes the token vectors 8 times louder still (norm ≈ 64): the position signal is
# drowned, and reversal, a task entirely about positions, has to be learned through the noise. Lesson 06 made
# the scaling an option, `scale_embedding`; here is the same model with it on, trained for 150 steps (or for as
# many as the main run, if it stopped sooner; at most 10 seconds) and compared with the main run at that step.

# %% demo
torch.manual_seed(0)
scaled = Seq2SeqTransformer(**config, tie_weights=False, scale_embedding=True).to(device)
n = min(150, history["loss"][0][-1])  # the main run evaluated at every 50th step and at its last
scaled_history = train(scaled, task, **budget(steps=n, seconds=10), **TRAINING, eval_every=n, eval_pairs=200,
                       live=False, device=device)
n = scaled_history["loss"][0][-1]  # fewer where its 10 seconds ran out (or under grading: 3 seconds)
print(f"after {n} steps      loss   held-out exact match")
for name, h in (("unscaled (main run)", history), ("scaled by √D", scaled_history)):
    print(f"{name:>20} {value_at(h, 'loss', n):7.3f}   {value_at(h, 'exact_match', n):7.1%}")
fig = plot_curves({"loss, unscaled": history["loss"], "loss, scaled by √D": scaled_history["loss"]},
                  title="the same model with and without √D embedding scaling")

# %% [markdown]
# Compare the two rows printed above, taken after the same number of steps: the scaled model's loss is far
# higher and its exact match far lower. Give it more steps (`budget(steps=...)`) and it does learn reversal in
# the end, many times more slowly. The departure from the paper in lesson 06 is not a detail.
#
# ## 10. A harder task: dates (optional, up to 3 minutes)
#
# Date normalisation reads ten written formats (`"the 3rd of march, 1999"`, `"3-mar-1999"`, `"1999/3/3"`, …)
# and writes `1999-03-03`. The same model learns it to ≥ 99 % held-out exact match, within a budget of 3 minutes
# of training (the run prints how long it took). It is off by default to keep this notebook short: set
# `RUN_DATES = True` to watch it.

# %% demo
RUN_DATES = False  # set to True to train on dates (at most 3 minutes)

if RUN_DATES and not GRADING:
    dates = get_task("dates")
    print(dates.description)
    torch.manual_seed(0)
    date_model = Seq2SeqTransformer(len(dates.src_vocab), len(dates.tgt_vocab), 64, 4, 256, 2, dropout=0.0,
                                    tie_weights=False).to(device)
    date_history = train(date_model, dates, seconds=180, eval_every=100, target_exact_match=0.99, device=device)
else:
    print("skipped: set RUN_DATES = True to train on dates")

# %% [markdown]
# ## 11. Find the bug
#
# Exact match says whether the model can do the task; the **held-out loss** says how sure it is of the right
# tokens, and it is the number one compares across runs and watches for overfitting. Below is
# `validation_loss`, written by a colleague on top of **your** `shift_right` and `sequence_loss`: it runs the
# model in eval mode on a list of held-out batches and averages what `sequence_loss` says. It has **one**
# mistake. It runs, it returns a loss of the right size, and on the batches its author tried (batches of the
# same size, drawn at random) it is close to the right value. It goes wrong when batches differ: a small last
# batch (the remainder, when the pairs do not divide evenly), or batches grouped by length, as fast data loaders
# make them. Two runs batched differently then compare their batching, not their models.
#
# How would you find it? Ask what must hold whatever the batching: the loss of a set of pairs belongs to the
# pairs and the model, not to how they were cut into batches. Test that: the same pairs in one batch, then cut
# into two batches of unequal size, must give the same number. Then print, for each batch, its `sequence_loss`
# and its number of real target tokens, and work out by hand the mean over every token of the set. The check
# under the cell does the first step for you.
#
# **Exercise.** Find and fix the bug in `validation_loss(model, batches)`, in the given code. It is graded with
# your own `shift_right` and `sequence_loss`: a mistake in those costs their own cells, not this one.

# %% exercise=validation_loss

# %% test=validation_loss points=1
from decoder_course.visible import l07_training as visible

visible.check_validation_loss(validation_loss, Seq2SeqTransformer)

# %% [markdown]
# ## What you built
#
# | piece | shape | what it does |
# |---|---|---|
# | `shift_right(tgt_ids, bos_id)` | `(B, T) → (B, T)` | the decoder's input in training: `BOS`, then the target without its last token |
# | `sequence_loss(logits, targets, pad_id, label_smoothing)` | `(B, T, V), (B, T) → ()` | mean cross-entropy over real tokens; equals `F.cross_entropy(..., ignore_index, label_smoothing)` |
# | `exact_match(pred, target, pad_id, eos_id)` | `(B, L), (B, L') → float` | the fraction of sequences right up to and including `EOS` |
# | `train_step(model, batch, optimizer, clip_norm)` | `batch → float` | one step: loss on the shifted target, backward, clip, one update |
# | `validation_loss(model, batches)` (fixed) | `batches → float` | the mean over every real token of the set, whatever the batching |
#
# What you measured: the model reverses held-out digit strings with ≥ 99 % exact match after the number of
# steps section 6 printed; without the causal mask its training loss is excellent and its generations are wrong;
# without cross-attention it cannot beat a guess; the paper's `√D` scaling, with PyTorch's embedding init, slows
# learning down badly.
#
# Next: lesson 08 writes proper decoders (greedy with per-sequence stopping, sampling, beam search).
