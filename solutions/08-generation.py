# %% [markdown]
# # Lesson 08 — Generation: greedy decoding, sampling and beam search
#
# A trained decoder does not output a sentence. At each step it outputs a **distribution over the next token**,
# given the source and the tokens so far. A *decoding algorithm* turns those distributions into a sequence, and
# the choice matters as much as the model: the same model can answer well or badly depending on it.
#
# In this lesson you write the three families, all for a **batch** of sources at once:
#
# 1. `greedy_decode`: always take the most likely token;
# 2. `sample`: draw the token at random from a reshaped distribution (temperature, top-k, top-p, repetition
#    penalty), reproducibly with an explicit `torch.Generator`, built on three small filters you write first;
# 3. `beam_search`: keep the `beam_size` best partial sequences, with a length penalty.
#
# Then you **measure** the settings people recommend (beam 4–8, temperature 0.7, nucleus `p = 0.9–0.95`, top-k 40
# with a repetition penalty of 1.2) on a model you train for a few seconds, instead of taking them on trust.
#
# **The interface.** Every decoder here works with any model that has these two methods (lesson 06's
# `Seq2SeqTransformer` has them):
#
# ```python
# memory = model.encode(src_ids, src_is_real)                       # (B, S, D): the source, encoded once
# logits = model.decode(tgt_ids, memory, src_is_real=src_is_real)   # (B, T, V): logits[:, t] scores the token after t
# ```
#
# **The output convention** of all three decoders: the generated ids *without* BOS, shape `(B, L)`. Each row stops
# at its own EOS (the EOS is kept) and is padded with `pad_id` after it; `L` is the length of the longest row, at
# most `max_len`, which counts generated tokens, EOS included. Once every row has finished, stop calling the model.
# The decoders do not change the model's mode: call `model.eval()` first, or dropout shakes the logits.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import decoder_course
from decoder_course import BOS, EOS, PAD
from decoder_course.data import get_task
from decoder_course.devices import timer
from decoder_course.plots import plot_curves
from decoder_course.testing import HashedLogitsModel, ScriptedModel, sequence_log_prob

_ = torch.manual_seed(0)  # reproducible demos; the exercises do not depend on it
GRADING = decoder_course.grading()  # True while nbgrader grades this notebook: keep demos short
# the trained model of section 4 runs here: cuda if there is a GPU, else mps, else cpu (DECODER_COURSE_DEVICE)
device = decoder_course.device()

# %% [markdown]
# ## 0. A model whose answers we know
#
# To test a decoder you want a model whose best answer you already know. `decoder_course.testing.ScriptedModel`
# is one: its next-token probabilities come from a tree you write by hand. `{token: (probability, subtree)}`;
# any prefix not in the tree ends with EOS. Here is one (EOS is id 2, BOS id 1):

# %%
TREE = {
    3: (0.5, {5: (0.4, None), 6: (0.3, None), 7: (0.3, None)}),
    4: (0.4, {5: (0.9, None), 6: (0.1, None)}),
    EOS: (0.1, None),
}
tree_model = ScriptedModel.from_tree(TREE, vocab_size=10)
src = torch.zeros(2, 3, dtype=torch.long)  # (B, S): this model ignores the source except for its batch size
probs = tree_model.decode(torch.tensor([[BOS, 4]] * 2), tree_model.encode(src)).softmax(-1)  # (B, T, V)
print("p(first token)  :", {t: round(p, 3) for t, p in enumerate(probs[0, 0].tolist()) if p > 0.01})
print("p(next | BOS, 4):", {t: round(p, 3) for t, p in enumerate(probs[0, 1].tolist()) if p > 0.01})


# %% demo
def draw_tree(tree, paths, title):
    """Draw a probability tree from left to right; ``paths`` maps a legend label to a token sequence to highlight."""
    y_of, edges, leaves = {}, [], []

    def place(node, prefix):
        """Leaves on consecutive rows, each parent at the mean row of its children; returns the node's row."""
        rows = []
        for token, (p, child) in node.items():
            path = prefix + (token,)
            y_of[path] = place(child, path) if child else float(len(leaves))
            if not child:
                leaves.append(path)
            edges.append((prefix, path, f"{'EOS' if token == EOS else token} ({p:g})"))
            rows.append(y_of[path])
        return sum(rows) / len(rows)

    y_of[()] = place(tree, ())
    fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
    colours = dict(zip(paths, ("tab:orange", "tab:green"), strict=False))
    for prefix, path, label in edges:
        # an edge is highlighted when its path starts the highlighted sequence
        on = [name for name, seq in paths.items() if tuple(seq[: len(path)]) == path]
        x0, x1, y0, y1 = len(prefix), len(path), y_of[prefix], y_of[path]
        ax.plot([x0, x1], [y0, y1], color=colours[on[0]] if on else "0.6", linewidth=3 if on else 1)
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.18, label, ha="center", fontsize=8)
        if path in leaves and path[-1] != EOS:
            ax.text(x1 + 0.05, y1, "→ EOS", va="center", fontsize=8, color="0.4")  # unscripted: EOS follows
    ax.text(-0.05, y_of[()], "BOS", ha="right", va="center")
    for name, colour in colours.items():
        ax.plot([], [], color=colour, linewidth=3, label=name)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title)
    ax.axis("off")
    return fig


draw_tree(TREE, {"greedy: 3, 5 (0.5 · 0.4 = 0.20)": [3, 5], "most likely: 4, 5 (0.4 · 0.9 = 0.36)": [4, 5]},
          "next-token probabilities of tree_model");

# %% [markdown]
# Greedy decoding takes the most likely first token, 3, and is then stuck in a branch where the best it can do is
# 0.4: the sequence `3, 5, EOS` has probability 0.20. The most likely sequence, `4, 5, EOS`, has 0.36, but starts
# with the *less* likely token. Keep this tree in mind: greedy decoding will find the orange path and beam search
# the green one.
#
# ## 1. Greedy decoding
#
# Start every row with BOS. At each step, run the decoder on everything generated so far, read the logits of the
# **last** position (`logits[:, -1]`, shape `(B, V)`), take the argmax, and append it:
#
# ```
# step 0: decoder input [BOS]            -> argmax 3
# step 1: decoder input [BOS, 3]         -> argmax 5
# step 2: decoder input [BOS, 3, 5]      -> argmax EOS   (this row is finished)
# ```
#
# A batch makes one thing subtle: **rows finish at different steps**. Keep a boolean `finished` of shape `(B,)`;
# a finished row still gets a token each step (the batch stays a rectangle), but that token is `pad_id`, whatever
# the model says. Stop when every row has finished or after `max_len` steps. Encode the source once, before the
# loop, and pass `src_is_real` to both `encode` and `decode` so that source padding is ignored.
#
# **Exercise.** Write `greedy_decode(model, src_ids, max_len, bos_id, eos_id, src_is_real=None, pad_id=0)`,
# decorated with `@torch.no_grad()` (no gradients are needed to generate).

# %% exercise=greedy_decode

# %% test=greedy_decode points=2
from decoder_course.visible import l08_generation as visible

visible.check_greedy_decode(greedy_decode)

# %% [markdown]
# A batch on `HashedLogitsModel`, a stand-in whose logits are pseudo-random but fixed by the source and the prefix:
# rows stop at different lengths and are padded after their EOS (pad id 0 here):

# %%
hashed = HashedLogitsModel(12, seed=3, eos_bias=0.8)
src_ids = torch.tensor([[5, 6, 7, 8], [9, 4, PAD, PAD], [3, 3, 3, PAD]])  # (B, S)
src_is_real = src_ids != PAD  # (B, S)
print(greedy_decode(hashed, src_ids, max_len=8, bos_id=BOS, eos_id=EOS, src_is_real=src_is_real, pad_id=PAD))

# %% [markdown]
# ## 2. Sampling, and the filters that make it usable
#
# Greedy decoding always gives the same answer: fine for a task with one right answer, dull for a story, and, as
# the tree showed, not even the most likely sequence. **Sampling** draws each token from the model's distribution
# instead. Drawn as it is, that distribution has a long tail of unlikely tokens which, over many steps, are
# drawn surprisingly often; every practical sampler reshapes it first. Four knobs, applied in this order:
#
# 1. **repetition penalty**: make tokens already generated less likely;
# 2. **temperature** `τ`: divide the logits by `τ`. `τ < 1` sharpens the distribution towards the argmax, `τ > 1`
#    flattens it, and `τ → 0` is greedy;
# 3. **top-k**: keep only the `k` most likely tokens;
# 4. **top-p** (nucleus): keep the fewest most likely tokens whose probabilities add up to at least `p`.
#
# Removing a token means setting its logit to `-inf`: `softmax` then gives it probability exactly 0, and the
# remaining probabilities are renormalised automatically. Here is temperature, on a four-token distribution:

# %% demo
first_probs = torch.tensor([0.4, 0.3, 0.2, 0.1])  # p(token 3..6), the first step of a model below
fig, ax = plt.subplots(figsize=(7, 2.6), layout="constrained")
for i, tau in enumerate([0.5, 1.0, 2.0]):
    tempered = (first_probs.log() / tau).softmax(-1)  # softmax(logits / τ)
    ax.bar(np.arange(4) + (i - 1) * 0.27, tempered.numpy(), width=0.27, label=f"τ = {tau}")
ax.set(xticks=range(4), xticklabels=["3", "4", "5", "6"], xlabel="token", ylabel="probability",
       title="temperature reshapes the distribution")
ax.legend();

# %% [markdown]
# ### Top-k
#
# Keep the `k` largest logits of each row and set the others to `-inf`. Compare each logit with the `k`-th largest
# of its row (`logits.topk(k, dim=-1).values[..., -1:]` keeps the axis for broadcasting): everything smaller goes.
# A logit *equal* to the `k`-th largest stays, so ties can keep more than `k` tokens: with logits `[4, 3, 3, 1]`
# and `k = 2`, both 3s stay. `k` larger than the vocabulary keeps everything (clamp it), and `k < 1` still keeps the
# top token. Work on any leading shape `(..., V)`, keep the dtype, and return a new tensor (the caller's logits
# are not modified).
#
# **Exercise.** Write `top_k_filter(logits, k)`.

# %% exercise=top_k_filter

# %% test=top_k_filter points=1
from decoder_course.visible import l08_generation as visible

visible.check_top_k_filter(top_k_filter)

# %% [markdown]
# ### Top-p (nucleus)
#
# Top-k keeps a fixed number of tokens, whether the model is sure (one token has 0.99) or unsure (a hundred tokens
# share the mass). Top-p adapts: it keeps the smallest set of most likely tokens whose total probability reaches
# `p`. A worked example with probabilities `[0.4, 0.3, 0.2, 0.1]` and `p = 0.6`: `0.4 < 0.6`, then
# `0.4 + 0.3 = 0.7 ≥ 0.6`, so tokens 0 and 1 stay. With `p = 0.75` token 2 joins (`0.9 ≥ 0.75`).
#
# The vectorised recipe: sort each row, take the softmax and a cumulative sum in sorted order, decide in sorted
# order which tokens to drop, then scatter that decision back to vocabulary order (`torch.zeros_like(...)
# .scatter(-1, order, drop_sorted)`). A tip that avoids a rounding trap: sort **ascending** and drop a token when
# the mass of it and every less likely token is `<= 1 - p`; summing the other way, a float32 cumulative sum can
# reach 1.0 before the last token and drop it even with `p = 1`. The most likely token is always kept, even for
# `p <= 0`. Same shape, dtype and no-modification rules as top-k.
#
# **Exercise.** Write `top_p_filter(logits, p)`.

# %% exercise=top_p_filter

# %% test=top_p_filter points=1
from decoder_course.visible import l08_generation as visible

visible.check_top_p_filter(top_p_filter)

# %% [markdown]
# ### Repetition penalty
#
# Language models love loops ("the the the", or the same sentence again). CTRL (Keskar et al., 2019) made tokens
# that already appear in the sequence less likely: their logit is **divided** by `penalty` if positive and
# **multiplied** by it if negative (dividing a negative logit would *raise* it). A token that appears several times
# is penalised once. `penalty = 1.0` changes nothing.
#
# Worked example, `penalty = 2`: logits `[2, -1, 0.5, 3, -4]` with previous tokens `[0, 1, 1, 4]` become
# `[1, -2, 0.5, 3, -8]`. Token 1 appeared twice and was multiplied once. `logits.gather(-1, prev_ids)` reads the
# logits of the previous tokens, row by row; `logits.scatter(-1, prev_ids, new_values)` writes them back into a
# copy (writing the same value twice for a repeated token is harmless).
#
# **Exercise.** Write `apply_repetition_penalty(logits, prev_ids, penalty)` for `logits (B, V)` and
# `prev_ids (B, L)`.

# %% exercise=apply_repetition_penalty

# %% test=apply_repetition_penalty points=1
from decoder_course.visible import l08_generation as visible

visible.check_apply_repetition_penalty(apply_repetition_penalty)

# %% [markdown]
# ### Putting it together: `sample`
#
# The loop is greedy decoding's, with a different choice of token. Each step:
#
# 1. take the last position's logits, in float32 (`.float()`);
# 2. if `repetition_penalty != 1.0`, apply it with the tokens generated so far (not BOS: it was given, not said);
# 3. if `temperature == 0`, take the argmax (greedy: the limit of `τ → 0`, without dividing by zero); otherwise
#    divide by `temperature`, apply `top_k_filter` if `top_k` is not None, then `top_p_filter` if `top_p` is not
#    None, take the softmax and draw one token per row with
#    `torch.multinomial(probs, 1, generator=generator)`;
# 4. finished rows get `pad_id`, as in greedy decoding.
#
# **Why an explicit generator?** `torch.multinomial` draws from PyTorch's global random state unless you pass a
# `torch.Generator`. With a generator seeded by the caller, the same call gives the same tokens whatever else
# happened in the program before: results can be reproduced, compared and debugged. Pass it to every draw.
#
# **Exercise.** Write `sample(model, src_ids, max_len, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,
# repetition_penalty=1.0, generator=None, src_is_real=None, pad_id=0)` using your three filters.

# %% exercise=sample

# %% test=sample points=2
from decoder_course.visible import l08_generation as visible

visible.check_sample(sample)

# %% [markdown]
# **Measure, don't trust.** A scripted model whose first token is 3, 4, 5 or 6 with probabilities 0.4, 0.3, 0.2
# and 0.1 (then EOS). Draw 4000 first tokens per setting with one generator and compare the frequencies with what
# each setting should give, computed from the definitions:

# %% demo
first_model = ScriptedModel.from_tree({3: (0.4, None), 4: (0.3, None), 5: (0.2, None), 6: (0.1, None)},
                                      vocab_size=8, floor=1e-9)
n_draws = 1000 if GRADING else 4000
p = torch.tensor([0.4, 0.3, 0.2, 0.1])  # the model's probabilities of tokens 3..6
# each setting, and what its definition predicts for tokens 3..6
settings = {
    "τ = 1": ({}, p),
    "τ = 0.5": ({"temperature": 0.5}, (p.log() / 0.5).softmax(-1)),
    "τ = 2": ({"temperature": 2.0}, (p.log() / 2.0).softmax(-1)),
    "top-k 2": ({"top_k": 2}, torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7),  # the two largest, renormalised
    "top-p 0.75": ({"top_p": 0.75}, torch.tensor([0.4, 0.3, 0.2, 0.0]) / 0.9),  # 0.4 + 0.3 < 0.75 <= 0.9
}
fig, ax = plt.subplots(figsize=(9, 2.8), layout="constrained")
for i, (name, (setting, predicted)) in enumerate(settings.items()):
    g = torch.Generator().manual_seed(i)
    drawn = sample(first_model, torch.zeros(n_draws, 1, dtype=torch.long), 1, BOS, EOS, generator=g, **setting)
    freq = torch.bincount(drawn[:, 0], minlength=8)[3:7].float() / n_draws  # frequencies of tokens 3..6
    ax.bar(np.arange(4) + (i - 2) * 0.16, freq.numpy(), width=0.16, label=name)
    print(f"{name:>10}: measured {[round(f, 3) for f in freq.tolist()]}, "
          f"predicted {[round(f, 3) for f in predicted.tolist()]}")
print(f"sampling noise: one standard error is at most {math.sqrt(0.25 / n_draws):.3f} with {n_draws} draws")
ax.set(xticks=range(4), xticklabels=["3", "4", "5", "6"], xlabel="first token", ylabel="frequency")
ax.legend(ncols=5, fontsize=8);

# %% [markdown]
# Measured and predicted agree to within sampling noise (the last printed line gives its size). `τ = 0.5`
# squares the probabilities before renormalising (`0.16, 0.09, 0.04, 0.01` → `0.53, 0.30, 0.13, 0.03`); top-k 2
# and top-p 0.75 never draw a token outside their set and renormalise what is left (top-k 2: `0.4 / 0.7 = 0.57`).
#
# And the repetition penalty, on a scripted model that always slightly prefers token 3 over token 4 (a loop in
# the making). With `temperature = 0` sampling is greedy, so only the penalty changes the tokens:

# %%
loop_logits = [-9.0, -9.0, -9.0, 1.0, 0.9, -9.0]  # PAD, BOS, EOS, 3, 4, 5: token 3 narrowly ahead of token 4
loop_model = ScriptedModel(6, table={(): loop_logits}, default_logits=loop_logits)
one_src = torch.zeros(1, 1, dtype=torch.long)
for penalty in (1.0, 1.2, 2.0):
    out = sample(loop_model, one_src, 8, BOS, EOS, temperature=0, repetition_penalty=penalty)
    print(f"penalty {penalty}: {out[0].tolist()}")

# %% [markdown]
# Without a penalty the model says 3 forever. With 1.2, token 3's logit drops to `1.0 / 1.2 = 0.83 < 0.9` once it
# has been said, so 4 comes next; then both have been said and 3 wins again (penalised once, however often it
# appeared). Note what the penalty cannot do: it knows nothing about which repeats are *right*.
#
# ## 3. Beam search
#
# Greedy decoding commits to one token per step. Beam search keeps the `K = beam_size` best **partial sequences**
# (beams) instead, scored by their total log-probability. Each step, every beam is extended by every token
# (`K × V` candidates per batch row), and the `K` best candidates survive. On the tree with `K = 2`:
#
# | step | candidates (sequence: probability) | kept |
# |---|---|---|
# | 1 | 3: 0.5, 4: 0.4, EOS: 0.1 | 3, 4 |
# | 2 | 3 5: 0.20, 3 6: 0.15, 3 7: 0.15, 4 5: **0.36**, 4 6: 0.04 | 4 5, 3 5 |
# | 3 | 4 5 EOS: 0.36, 3 5 EOS: 0.20 | both finished: return the best, 4 5 EOS |
#
# ![Beam search with K = 2 on the tree above, drawn left to right. From BOS (p = 1.0), step 1 has three
# candidates: 3 (p = 0.5) and 4 (p = 0.4) are kept, EOS (p = 0.1) is pruned. Step 2 has five candidates: 3 5 (0.20)
# and 4 5 (0.36) are kept; 3 6 (0.15), 3 7 (0.15) and 4 6 (0.04) are pruned. At step 3 both beams finish with EOS:
# 3 5 EOS (0.20), which is greedy's answer, and 4 5 EOS (0.36), which beam search returns as the best
# score.](assets/beam_search.png)
#
# The point of the picture is the second row: token 4 is only the second most likely first token, and greedy
# decoding drops it for good at step 1. A beam of 2 keeps it alive long enough for its continuation (0.9) to
# overtake.
#
# Greedy is beam search with `K = 1`. Details that make or break an implementation:
#
# - **Batch × beams.** Lay the beams out as `B·K` rows, row `b·K + j` being beam `j` of sequence `b`; repeat the
#   memory and `src_is_real` accordingly (`repeat_interleave(K, dim=0)`). Scores live in a `(B, K)` tensor.
# - **Start with one live beam.** At step 0 all beams would be the same `[BOS]`; give beam 0 a score of 0 and
#   the others `-inf`, or the beam fills up with K copies of one sequence.
# - **Candidates.** `scores[..., None] + log_probs` is `(B, K, V)`; flatten it to `(B, K·V)`, take `topk(K)`, and
#   recover each winner's beam (`index // V`) and token (`index % V`). Reorder the histories so that beam `j`
#   holds the prefix it came from, then append the tokens.
# - **Finished beams stay.** A beam that has emitted EOS keeps its score and competes with the live ones; its
#   only continuation is `pad_id` at log-probability 0 (every other token `-inf`). A beam cut off at `max_len` is
#   finished too. Stop early when every beam of every row has finished.
# - **Length penalty.** Every token multiplies in a probability below 1, so raw log-probabilities favour short
#   sequences. At the end, choose each row's winner by GNMT's normalised score (Wu et al., 2016):
#   `log_prob / ((5 + len) / 6) ** length_penalty`, with `len` the generated tokens up to and including EOS.
#   `length_penalty = 0` compares raw log-probabilities; larger values favour longer outputs. (The ranking
#   *during* the search stays by raw log-probability.)
# - **Output.** The winner without BOS, padded after its EOS; `L` is the longest winner (trim the columns
#   that only losing beams used).
#
# **Exercise.** Write `beam_search(model, src_ids, max_len, bos_id, eos_id, beam_size=4, length_penalty=1.0,
# src_is_real=None, pad_id=0)`.

# %% exercise=beam_search

# %% test=beam_search points=2
from decoder_course.visible import l08_generation as visible

visible.check_beam_search(beam_search)

# %% [markdown]
# The tree again: greedy finds 0.20, beam search 0.36. `sequence_log_prob` (from `decoder_course.testing`) scores
# any output under the model:

# %%
two_src = torch.zeros(2, 3, dtype=torch.long)
for name, out in [("greedy", greedy_decode(tree_model, two_src, 6, BOS, EOS)),
                  ("beam 2", beam_search(tree_model, two_src, 6, BOS, EOS, beam_size=2, length_penalty=0.0))]:
    p = sequence_log_prob(tree_model, two_src, out).exp()
    print(f"{name:>7}: {out[0].tolist()}  probability {p[0].item():.3f}")

# %% [markdown]
# ## 4. Which settings? A measurement on a trained model
#
# The usual advice: **beam 4–8** for translation-like tasks, **nucleus sampling with `p = 0.9–0.95`** or
# **temperature 0.7** for open-ended text, **top-k 40 with a repetition penalty of 1.2** against loops. Advice is
# cheap; let us measure it on a real (if small) model. We train lesson 07's reversal task (`"30417"` → `"71403"`,
# 3 to 6 digits) for a short while with the course's training loop. We stop it *before* it is perfect on purpose:
# a model that never errs would make every decoder look the same.
#
# The model and the training loop of lessons 06–07 are given below. (Lesson 07's evaluation uses
# `greedy_generate`, the simplest loop: it never stops early and keeps writing after EOS, which exact match
# ignores. Your `greedy_decode` is what it grows into.)

# %% given=multi_head:split_heads,merge_heads,attention,MultiHeadAttention

# %% given=cross_attention:CrossAttention

# %% given=decoder_layer:FeedForward,DecoderLayer

# %% given=model:sinusoidal_table,PositionalEncoding,EncoderLayer,Encoder,Decoder,Seq2SeqTransformer

# %% given=training:shift_right,sequence_loss,exact_match,train_step,greedy_generate,evaluate_exact_match,train

# %% demo
task = get_task("reverse", min_len=3, max_len=6)
torch.manual_seed(0)
model = Seq2SeqTransformer(len(task.src_vocab), len(task.tgt_vocab), d_model=64, n_heads=4, d_ff=256, n_layers=2,
                           dropout=0.0).to(device)
history = train(model, task, steps=60 if GRADING else 200, eval_every=50, eval_pairs=200, live=False,
                device=device)
if GRADING:
    print("(a graded run: training was cut to 60 steps to save time; the measurements below mean little)")
plot_curves(history, title="reversal, a short training run");

# %% [markdown]
# Now decode 200 held-out sources with each setting. For every sampler we draw twice with different generators:
# *varied* is the fraction of sources whose two samples differ (0 for the deterministic decoders).

# %% demo
test_pairs = task.make_pairs(100 if GRADING else 200, rng=1, split="test")
batch = {name: t.to(device) for name, t in task.make_batch(test_pairs).items()}  # where the model is
src_ids, src_is_real, tgt_ids = batch["src_ids"], batch["src_is_real"], batch["tgt_ids"]  # (B, S), (B, S), (B, T)
max_len = task.max_tgt_len + 1  # the longest target plus its EOS
model.eval()


measured = {}  # (decoder, seed, settings) -> result: the sweeps below reuse the table's runs
clock = timer(device)  # reads the time after the device's queued work is done (a GPU runs asynchronously)


def measure(decoder, seed=0, **settings):
    """Exact match, seconds, and the outputs of one decoder with one setting on the held-out batch."""
    key = (decoder.__name__, seed, tuple(sorted(settings.items())))
    if key not in measured:
        extra = {"generator": torch.Generator(device).manual_seed(seed)} if decoder is sample else {}
        start = clock()
        out = decoder(model, src_ids, max_len, BOS, EOS, src_is_real=src_is_real, pad_id=PAD, **settings, **extra)
        measured[key] = (exact_match(out, tgt_ids, PAD, EOS), clock() - start, out)
    return measured[key]


def varied(**settings):
    """Fraction of sources whose samples with two different generators differ."""
    a, b = measure(sample, 0, **settings)[2], measure(sample, 1, **settings)[2]
    L = max(a.shape[1], b.shape[1])
    a, b = F.pad(a, (0, L - a.shape[1]), value=PAD), F.pad(b, (0, L - b.shape[1]), value=PAD)
    return (a != b).any(-1).float().mean().item()


rows = [
    ("greedy", greedy_decode, {}),
    ("beam 4", beam_search, {"beam_size": 4, "length_penalty": 0.6}),
    ("beam 8", beam_search, {"beam_size": 8, "length_penalty": 0.6}),
    ("sample, τ = 1", sample, {"temperature": 1.0}),
    ("τ = 0.7", sample, {"temperature": 0.7}),
    ("top-p 0.9", sample, {"temperature": 1.0, "top_p": 0.9}),
    ("top-p 0.95", sample, {"top_p": 0.95}),
    ("τ = 0.7, top-p 0.9", sample, {"temperature": 0.7, "top_p": 0.9}),
    ("top-k 40, rep 1.2", sample, {"top_k": 40, "repetition_penalty": 1.2}),
]
scores = {}
print(f"{'setting':>20} | exact match | varied | seconds")
for name, decoder, setting in rows:
    em, seconds, _ = measure(decoder, **setting)
    spread = varied(**setting) if decoder is sample else 0.0
    scores[name] = em
    print(f"{name:>20} | {em:11.3f} | {spread:6.2f} | {seconds:7.2f}")
print(f"\nvocabulary size V = {len(task.tgt_vocab)}: top-k 40 keeps every token of this task")

# %% [markdown]
# Two sweeps, drawn: exact match against the beam size (and what it costs in time), and against the temperature,
# with and without a nucleus.

# %% demo
beam_sizes = [1, 2, 4, 8]
beam_runs = [measure(beam_search, beam_size=k, length_penalty=0.6) for k in beam_sizes]
temperatures = [0.3, 0.5, 0.7, 1.0, 1.5]
plain = [measure(sample, temperature=t)[0] for t in temperatures]
nucleus = [measure(sample, temperature=t, top_p=0.9)[0] for t in temperatures]

print("beam size   :", beam_sizes, "-> exact match", [round(r[0], 3) for r in beam_runs])
print("temperature :", temperatures, "-> exact match", [round(e, 3) for e in plain], "(with top-p 0.9:",
      [round(e, 3) for e in nucleus], ")")
best_em, best_name = max([(e, f"τ = {t}") for t, e in zip(temperatures, plain)]
                         + [(e, f"τ = {t}, top-p 0.9") for t, e in zip(temperatures, nucleus)])
print(f"best sampler: {best_name} at {best_em:.3f}; greedy {scores['greedy']:.3f}")
lowest = min([r[0] for r in beam_runs] + plain + nucleus)
fig, (ax_beam, ax_temp) = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
ax_beam.plot(beam_sizes, [r[0] for r in beam_runs], marker="o", label="exact match")
ax_beam.set(xlabel="beam size", ylabel="held-out exact match", xticks=beam_sizes, title="beam search",
            ylim=(max(0.0, lowest - 0.05), 1.0))
ax_time = ax_beam.twinx()
ax_time.plot(beam_sizes, [r[1] for r in beam_runs], marker="s", color="grey", linestyle="--", label="seconds")
ax_time.set_ylabel("seconds")
# one legend for both lines, under the axes: inside them it would cover a point (the time at beam 1 is lowest)
lines = ax_beam.get_lines() + ax_time.get_lines()
ax_beam.legend(lines, [line.get_label() for line in lines], loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
ax_temp.axhline(scores["greedy"], color="black", linestyle=":", label="greedy")
ax_temp.plot(temperatures, plain, marker="o", label="sampling")
ax_temp.plot(temperatures, nucleus, marker="o", label="sampling, top-p 0.9")
ax_temp.set(xlabel="temperature τ", ylabel="held-out exact match", title="sampling",
           ylim=(max(0.0, lowest - 0.05), 1.0))
ax_temp.legend();

# %% [markdown]
# Read your numbers (a different machine or seed moves them a little; the shape stays):
#
# - **This task has one right answer**, like translation or date normalisation. The deterministic decoders are
#   the ones to beat, and pure sampling (`τ = 1`) pays for its variety with exact match: every token it draws
#   from the tail is a chance to be wrong, and one wrong digit fails the sequence.
# - **Beam search** looks for sequences the *model* scores higher. It helps exactly as far as the model's scores
#   track correctness; on a half-trained model it may gain a few points or none, at a cost that grows with the
#   beam (the grey line). This is why beam 4–8 is a *translation* default: beyond that, sequences get more likely but
#   not better.
# - **Temperature and the nucleus trade variety for accuracy.** Lower `τ` and top-p both cut the tail, and
#   `τ = 0.7` with `p = 0.9` keeps some variety (the *varied* column) at a smaller cost than `τ = 1`. Compare
#   the best sampler with greedy (the sweep's last printed line): a low temperature is nearly greedy (`τ → 0`
#   *is* greedy), so it can tie greedy or, by luck, beat it on a given run; as `τ` grows, every place where the
#   model hesitates between two digits becomes a chance to pick the wrong one. Variety is the right trade for
#   open-ended text, where many answers are good, not for a task with one answer.
# - **Settings are relative to the vocabulary.** "top-k 40" comes from word-piece vocabularies of tens of
#   thousands of tokens; with this task's vocabulary (its size is printed under the table) it filters nothing at
#   all, and the row behaves like plain sampling with a repetition penalty.
#
# One more measurement, because the repetition penalty is the setting most often applied blindly: reversal
# targets *should* repeat digits (`"33014"`). Greedy decoding with and without the penalty, on held-out targets with
# and without a repeated digit:

# %% demo
with_penalty = sample(model, src_ids, max_len, BOS, EOS, temperature=0, repetition_penalty=1.2,
                      src_is_real=src_is_real, pad_id=PAD)
without = greedy_decode(model, src_ids, max_len, BOS, EOS, src_is_real=src_is_real, pad_id=PAD)
has_repeat = torch.tensor([len(set(t)) < len(t) for _, t in test_pairs], device=device)  # (B,): a digit twice
for name, mask in [("targets with a repeated digit", has_repeat), ("targets without", ~has_repeat)]:
    idx = mask.nonzero().flatten()
    print(f"{name:>30} ({len(idx):3d}): greedy {exact_match(without[idx], tgt_ids[idx], PAD, EOS):.3f}, "
          f"greedy + penalty 1.2 {exact_match(with_penalty[idx], tgt_ids[idx], PAD, EOS):.3f}")

# %% [markdown]
# A penalty can only push the model away from tokens it has already said. Where repeating is correct it can
# only cost accuracy; where it is a loop (the scripted model above) it helps. Pick decoding settings per task,
# and measure them on held-out data, as you just did.
#
# ## 5. Find the bug
#
# Several samples per source are what the *varied* column above needed, and what reranking, majority votes and
# "pass@k" are made of. Drawing them one call at a time wastes the batch; `sample_n` below, written by a colleague
# on top of **your** `sample`, draws all `n` samples of all `B` sources in one call: it repeats the sources `n`
# times, hands that batch of `B·n` rows to `sample`, and reads the result back as `(B, n, L)`. It has **one**
# mistake. It runs, the shape is right, every sample is a plausible sequence, and on the case its author tried,
# one source, the samples are exactly what they should be. It breaks with two sources or more, which is every
# real batch.
#
# How would you find it? Ask what must hold whatever the batch: sample `j` of source `b` is a sample of source
# `b`, whatever the other sources are. With `temperature=0` sampling is greedy, so every sample of a source must
# be what that source gives on its own, with `B = 1`: compare the two for a few sources of different lengths.
# Then print the batch the code hands to `sample`, row by row, next to the row of the output each sample is
# read from, and check that they are the same source (with the same padding). The check under the cell does the
# comparison for you.
#
# **Exercise.** Find and fix the bug in `sample_n(model, src_ids, n, max_len, bos_id, eos_id, ...)`, in the given
# code. It is graded with your own `sample` and filters: a mistake in those costs their own cells, not this one.

# %% exercise=sample_n

# %% test=sample_n points=1
from decoder_course.visible import l08_generation as visible

visible.check_sample_n(sample_n)

# %% [markdown]
# ## What you built
#
# | function | what it does |
# |---|---|
# | `greedy_decode` | argmax at each step; rows stop at their own EOS and pad; stops when all rows are done |
# | `top_k_filter(logits, k)` | keeps the `k` largest logits (and ties), `-inf` elsewhere |
# | `top_p_filter(logits, p)` | keeps the smallest most-likely set reaching probability `p` |
# | `apply_repetition_penalty` | CTRL's penalty: divide positive, multiply negative logits of seen tokens, once |
# | `sample` | penalty → temperature → top-k → top-p → one reproducible draw per row |
# | `beam_search` | `K` beams per row, finished beams kept, GNMT length normalisation to pick the winner |
# | `sample_n` (fixed) | `n` samples of every source in one batched call of `sample`, each read back under its own source |
#
# Every one of these re-runs the decoder over the whole prefix at every step: generating `L` tokens costs
# `1 + 2 + … + L` positions of decoder work. Lesson 09 caches what does not change and makes each step cost one
# position.
