"""Reference for lesson 07-training (PyTorch): teacher forcing, a padding-aware loss, exact match and a loop.

Teacher forcing: the decoder reads the target shifted right by one (BOS first) and predicts the target itself,
all positions in parallel; the causal mask keeps position t from reading the token it must predict. The loss
ignores padding, and a generated sequence counts as correct only when it matches its target up to and
including EOS. ``greedy_generate`` (the simplest generation loop; lesson 08 writes the real decoders),
``evaluate_exact_match`` and ``train`` (a loop around the student's ``train_step``) are given;
``PeekingSeq2SeqTransformer`` is the ablation that trains without the causal mask: its teacher-forced loss
collapses, yet it cannot generate. ``validation_loss`` is the find-the-bug exercise: a held-out loss built on the
student's ``shift_right`` and ``sequence_loss`` whose shown version averages the batches' losses.
"""

import torch
import torch.nn.functional as F
from torch import nn

from autograder.course.reference.model import Seq2SeqTransformer
from decoder_course.conventions import BOS, EOS, PAD


def shift_right(tgt_ids: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Decoder input for teacher forcing: BOS, then the target without its last token.

    Shape:
        tgt_ids: (B, T) -> (B, T), the same dtype as ``tgt_ids`` (int32 stays int32); the input is unchanged
    """
    ### BEGIN SOLUTION
    bos = torch.full((tgt_ids.shape[0], 1), bos_id, dtype=tgt_ids.dtype, device=tgt_ids.device)  # (B, 1)
    # position t now holds token t-1: the model predicts token t having seen only tokens < t
    return torch.cat([bos, tgt_ids[:, :-1]], dim=1)  # (B, T)
    ### END SOLUTION


def sequence_loss(
    logits: torch.Tensor, targets: torch.Tensor, pad_id: int, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy over real (non-pad) target tokens, with optional label smoothing.

    Computed with torch operations only, so that gradients reach the logits; the caller's inputs are unchanged.
    Written by hand from ``log_softmax``: ``F.cross_entropy``, ``nn.CrossEntropyLoss``, ``F.nll_loss`` and
    ``nn.NLLLoss`` are what it is compared with, not to be used (the checks refuse them).

    Equals ``F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id,
    label_smoothing=label_smoothing)``, except that a batch with no real token gives 0 instead of NaN.

    Shape:
        logits: (B, T, V), targets: (B, T) int -> scalar
    """
    ### BEGIN SOLUTION
    log_probs = logits.log_softmax(dim=-1)  # (B, T, V), stable: never log(softmax(...))
    is_real = targets != pad_id  # (B, T): padding positions do not count
    # gather needs a valid index even where the target is padding (pad_id may be -100 or >= V): use 0 there
    safe_targets = targets.masked_fill(~is_real, 0)  # (B, T)
    nll = -log_probs.gather(-1, safe_targets[..., None]).squeeze(-1)  # (B, T): -log p(correct token)
    # label smoothing mixes the one-hot target with the uniform distribution: eps/V on every token
    uniform_ce = -log_probs.mean(dim=-1)  # (B, T): cross-entropy against the uniform distribution
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * uniform_ce  # (B, T)
    # mean over real tokens only, not over B * T (padding would dilute the loss)
    return (per_token * is_real).sum() / is_real.sum().clamp(min=1)
    ### END SOLUTION


def exact_match(pred_ids: torch.Tensor, target_ids: torch.Tensor, pad_id: int, eos_id: int) -> float:
    """Fraction of sequences whose prediction equals the target at every position up to and including its EOS.

    The caller's ids are unchanged.

    Positions after the target's first EOS are not compared (the prediction may pad them with anything); a
    target without EOS must be matched at every position, padding included. Lengths may differ: the shorter is
    padded.

    Shape:
        pred_ids: (B, L_pred), target_ids: (B, L_tgt) -> float in [0, 1]
    """
    ### BEGIN SOLUTION
    L = max(pred_ids.shape[1], target_ids.shape[1])
    pred = F.pad(pred_ids, (0, L - pred_ids.shape[1]), value=pad_id)  # (B, L)
    target = F.pad(target_ids, (0, L - target_ids.shape[1]), value=pad_id)  # (B, L)
    is_eos = (target == eos_id).long()  # (B, L)
    # after_eos[b, i]: an EOS occurs strictly before position i (cumsum counts EOS at or before i)
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0  # (B, L)
    # equal up to and including the target's EOS means the prediction also ended there
    row_ok = ((pred == target) | after_eos).all(dim=1)  # (B,)
    return row_ok.float().mean().item()
    ### END SOLUTION


def train_step(
    model: nn.Module, batch: dict, optimizer: torch.optim.Optimizer, clip_norm: float, label_smoothing: float = 0.0
) -> float:
    """One optimiser step of teacher forcing: loss, backward, gradients clipped to ``clip_norm``, one update.

    ``batch`` is what ``task.batches`` yields: ``src_ids`` (B, S), ``src_is_real`` (B, S) and ``tgt_ids`` (B, T)
    (the target, its EOS, then PAD), on the model's device. The model reads the shifted target (``shift_right``
    with ``BOS``) and the source with its padding (``src_is_real``); the loss is ``sequence_loss`` against
    ``tgt_ids`` with ``PAD`` ignored and the given ``label_smoothing``. Gradients left by an earlier step are
    cleared first; after the backward pass the gradients of all parameters together are rescaled to a joint norm
    of at most ``clip_norm`` (``torch.nn.utils.clip_grad_norm_``), before the update, which happens exactly once.
    The model's mode (train/eval) and the batch are left as they are. Returns the loss as a Python float, the loss
    *before* the update.

    Shape:
        batch: src_ids (B, S), src_is_real (B, S) bool, tgt_ids (B, T) -> float
    """
    ### BEGIN SOLUTION
    tgt = batch["tgt_ids"]  # (B, T): what the model must predict
    # teacher forcing: the decoder reads BOS, y0, ..., y_{T-2}; padding sits after the real tokens, where the
    # causal mask already hides it from every real query (no tgt_is_real needed)
    logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])  # (B, T, V)
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)  # scalar: mean over real target tokens
    optimizer.zero_grad(set_to_none=True)  # gradients accumulate in .grad: clear the last step's
    loss.backward()
    # rescale all gradients together so that their joint norm is at most clip_norm: same direction, capped size
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss.item()  # a float: holding the tensor would keep the whole graph alive
    ### END SOLUTION


@torch.no_grad()
def validation_loss(model: nn.Module, batches) -> float:
    """The held-out loss (find the bug): the mean cross-entropy per real target token over all ``batches``.

    ``batches`` is a list of batches as ``task.make_batch`` gives them (``src_ids``, ``src_is_real``, ``tgt_ids``),
    on the model's device; they may differ in size and in padding. The model reads ``shift_right(tgt_ids, BOS)``
    and the source with its padding, in eval mode (no dropout) and without gradients, and its mode is put back
    afterwards; ``sequence_loss`` with ``PAD`` scores it, without label smoothing. Every real target token of the
    set counts once, whatever batch it sits in: cutting the same pairs into other batches gives the same value.
    0.0 when there is no real token. The batches are unchanged.

    Shape:
        batches: each src_ids (B, S), src_is_real (B, S) bool, tgt_ids (B, T) -> float
    """
    was_training = model.training
    model.eval()  # dropout off: the loss of the model itself, not of a random part of it
    total, count = 0.0, 0
    for batch in batches:
        src_ids, src_is_real, tgt = batch["src_ids"], batch["src_is_real"], batch["tgt_ids"]  # tgt: (B, T)
        logits = model(src_ids, shift_right(tgt, BOS), src_is_real)  # (B, T, V): teacher forcing, as in training
        loss = sequence_loss(logits, tgt, PAD)  # scalar: this batch's loss
        ### BEGIN SOLUTION
        n_real = int((tgt != PAD).sum())  # the batch's loss is a mean over its real tokens
        total += loss.item() * n_real  # back to their sum: every token counts once, whatever its batch
        count += n_real
        ### END SOLUTION
        ### BEGIN BUG
        # total += loss.item()
        # count += 1
        ### END BUG
    model.train(was_training)
    return total / max(count, 1)


class PeekingSeq2SeqTransformer(Seq2SeqTransformer):
    """The ablation: the same model with the causal mask removed, so that each position can read the future.

    With teacher forcing the answer to position t sits at position t + 1 of the decoder input: the model
    learns to copy it, and its training loss drops fast. At generation time position t + 1 does not exist yet,
    and greedy decoding produces rubbish. Only self-attention's mask differs from
    ``Seq2SeqTransformer.decode``.

    Shape:
        as ``Seq2SeqTransformer``
    """

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        """``Seq2SeqTransformer.decode`` with every real target key visible to every query (no causal mask).

        Shape:
            tgt_ids: (B, T), memory: (B, S, D) -> logits: (B, T, V)
        """
        B, T = tgt_ids.shape
        # the bug on purpose: all keys allowed, only padding is skipped
        self_allowed = torch.ones(B, 1, T, T, dtype=torch.bool, device=tgt_ids.device)  # (B, 1, T, T)
        if tgt_is_real is not None:
            self_allowed = self_allowed & tgt_is_real.bool()[:, None, None, :]
        cross_allowed = None if src_is_real is None else src_is_real.bool()[:, None, None, :]  # (B, 1, 1, S)
        y = self.pos_encoding(self.tgt_embed(tgt_ids) * self.embed_scale)  # (B, T, D)
        return self.out_proj(self.decoder(y, memory, self_allowed, cross_allowed))  # (B, T, V)


@torch.no_grad()
def greedy_generate(
    model: nn.Module, src_ids: torch.Tensor, max_len: int, bos_id: int, src_is_real: torch.Tensor | None = None
) -> torch.Tensor:
    """The simplest generation: append the most likely next token, ``max_len`` times, to every sequence.

    Enough to score exact match, which ignores whatever follows the target's EOS. It never stops early and
    keeps writing after EOS; lesson 08's decoders stop each sequence at its own EOS and pad after it, and add
    sampling and beam search.

    Shape:
        src_ids (B, S), src_is_real (B, S) bool or None -> ids (B, max_len), without BOS
    """
    memory = model.encode(src_ids, src_is_real)  # (B, S, D): the source is encoded once
    tgt = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long, device=src_ids.device)  # (B, 1)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, src_is_real=src_is_real)  # (B, t, V)
        next_id = logits[:, -1].argmax(-1)  # (B,): only the last position predicts a new token
        tgt = torch.cat([tgt, next_id[:, None]], dim=1)  # (B, t + 1)
    return tgt[:, 1:]  # (B, max_len): BOS was given, not generated


@torch.no_grad()
def evaluate_exact_match(
    model: nn.Module, pairs, task, max_len: int | None = None, batch_size: int = 500
) -> float:
    """Greedy-decode the sources of ``pairs``; return the fraction decoded exactly (up to and including EOS).

    ``pairs`` are (source, target) strings, e.g. ``task.make_pairs(500, rng=1, split="test")``; ``task``
    supplies the vocabularies (``task.make_batch``). Batches go to the model's device. The model is evaluated
    in eval mode, then put back.

    Shape:
        pairs: N (source, target) pairs -> float in [0, 1]
    """
    was_training = model.training
    model.eval()
    max_len = task.max_tgt_len + 1 if max_len is None else max_len  # the target plus its EOS
    device = next(model.parameters()).device  # batches are made on the CPU: move them where the model is
    n_correct = 0.0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        batch = {name: tensor.to(device) for name, tensor in task.make_batch(chunk).items()}
        src_ids, src_is_real = batch["src_ids"], batch["src_is_real"]  # (B, S) each
        pred = greedy_generate(model, src_ids, max_len, BOS, src_is_real=src_is_real)  # (B, max_len)
        n_correct += exact_match(pred, batch["tgt_ids"], PAD, EOS) * len(chunk)
    model.train(was_training)
    return n_correct / max(len(pairs), 1)


def train(
    model: nn.Module,
    task,
    steps: int | None = None,
    seconds: float | None = None,
    batch_size: int = 128,
    lr: float = 3e-3,
    warmup_steps: int = 100,
    weight_decay: float = 0.01,
    label_smoothing: float = 0.0,
    grad_clip: float = 1.0,
    eval_every: int = 100,
    eval_pairs: int = 500,
    target_exact_match: float | None = None,
    seed: int = 0,
    progress: bool = True,
    live: bool = True,
    device: torch.device | str | None = None,
) -> dict:
    """Train ``model`` on ``task`` with teacher forcing; watch the loss and held-out exact match as it learns.

    Stops after ``steps`` optimiser steps or ``seconds`` of training time (held-out evaluation and drawing the
    curves excluded; whichever comes first, one is needed),
    or as soon as held-out exact match reaches ``target_exact_match``. AdamW; the learning rate warms up
    linearly to ``lr`` over ``warmup_steps``, then decays as 1/sqrt(step) (the paper's schedule); each step
    is ``train_step`` (yours, in the lesson), with gradients clipped to norm ``grad_clip``. Every
    ``eval_every`` steps (and at the end) greedy decoding is scored on ``eval_pairs`` held-out pairs. Shows a
    tqdm progress bar (``progress``) and live curves (``live``, via ``decoder_course.plots.LiveCurves`` when it
    is available). The training time is printed at the end; the model is left in eval mode.

    ``device`` (default: where the model's parameters are) is where the model and every batch go; the clock
    synchronises it before each reading (``decoder_course.devices.timer``), so a GPU's queued work is counted.

    Shape:
        batches from ``task.batches``: src (B, S), tgt (B, T) -> history ``{name: (steps, values)}`` with
        ``"loss"`` and ``"token_accuracy"`` (teacher-forced, every step) and ``"exact_match"`` (held out,
        every ``eval_every`` steps), ready for ``decoder_course.plots.plot_curves``
    """
    if steps is None and seconds is None:
        raise ValueError("give steps=, seconds= or both")
    from tqdm.auto import tqdm

    from decoder_course.devices import timer

    device = next(model.parameters()).device if device is None else torch.device(device)
    model.to(device)
    clock = timer(device)  # a GPU runs asynchronously: wait for its work before reading the time

    try:
        from decoder_course.plots import LiveCurves
    except ImportError:  # the plotting helpers are optional: train without live curves
        LiveCurves = None
    curves = LiveCurves(title=f"training on {task.name}", total_steps=steps) if live and LiveCurves else None

    torch.manual_seed(seed)
    held_out = task.make_pairs(eval_pairs, rng=seed + 1, split="test")
    batches = task.batches(batch_size, seed=seed, split="train")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # the paper's schedule: linear warm-up (tiny steps while Adam's moment estimates are still noise), then
    # decay as 1/sqrt(step), which settles the last errors; it needs no total step count, so seconds= works
    warmup = max(warmup_steps, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (warmup / (step + 1)) ** 0.5)
    )
    history = {"loss": ([], []), "token_accuracy": ([], []), "exact_match": ([], [])}

    def record(name, step, value):
        history[name][0].append(step)
        history[name][1].append(float(value))

    def evaluate(step):
        score = evaluate_exact_match(model, held_out, task)
        record("exact_match", step, score)
        if curves is not None:
            curves.update(step, exact_match=score)
        return score

    bar = tqdm(total=steps if steps is not None else None, disable=not progress, desc=f"train {task.name}")
    # train_step returns the loss only; a forward hook keeps its logits for the token accuracy (no second pass).
    # It sits on the output layer, which every path to the logits ends in (model(...), or model.encode then
    # model.decode), so the accuracy does not depend on how train_step calls the model
    seen = {}
    head = getattr(model, "out_proj", model)
    hook = head.register_forward_hook(lambda module, inputs, logits: seen.__setitem__("logits", logits.detach()))
    model.train()
    step, training_time, started = 0, 0.0, clock()
    while (steps is None or step < steps) and (seconds is None or training_time < seconds):
        batch = {name: tensor.to(device) for name, tensor in next(batches).items()}  # made on the CPU
        tgt = batch["tgt_ids"]  # (B, T): the target followed by EOS, then PAD
        seen.clear()  # an evaluation's generation also ran the output layer
        loss = train_step(model, batch, optimizer, grad_clip, label_smoothing)  # your step: a float
        schedule.step()
        step += 1
        training_time = clock() - started
        is_real = tgt != PAD
        logits = seen.pop("logits", None)  # (B, T, V), read by the hook from train_step's forward pass
        accuracy = float("nan") if logits is None else (
            ((logits.argmax(-1) == tgt) & is_real).sum().item() / max(is_real.sum().item(), 1))
        record("loss", step, loss)
        record("token_accuracy", step, accuracy)
        if curves is not None:
            paused = clock()
            curves.update(step, loss=loss, token_accuracy=accuracy)  # redraws about once a second
            started += clock() - paused  # drawing is not training: pause the clock
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.3f}")
        if step % eval_every == 0:
            # evaluation time is not training time: pause the clock
            paused = clock()
            score = evaluate(step)
            started += clock() - paused
            bar.set_postfix(loss=f"{loss:.3f}", exact_match=f"{score:.3f}")
            if target_exact_match is not None and score >= target_exact_match:
                break
    hook.remove()
    if not history["exact_match"][0] or history["exact_match"][0][-1] != step:
        evaluate(step)
    bar.close()
    if curves is not None:
        curves.final()
    if progress:
        print(
            f"{step} steps in {training_time:.1f} s of training; held-out exact match "
            f"{history['exact_match'][1][-1]:.3f}"
        )
    model.eval()
    return history


# -- known mistakes ------------------------------------------------------------------------------------------------
# Realistic wrong answers, each this module's code with a few lines changed: (item, what is wrong, (old, new), ...),
# applied by autograder.course.mutants.patched (each old must occur exactly once in the item's code, so an edit above
# that
# moves a line breaks its mistake loudly). (item, what is wrong) alone is the bug a find-the-bug exercise's release
# shows. Every one must cost its own item and no other, in both layers of checks (tests/test_hidden_checks.py,
# tests/test_visible_catch_rate.py); whole wrong answers of another structure live in autograder/course/mutants/.

SHIFTED = "return torch.cat([bos, tgt_ids[:, :-1]], dim=1)  # (B, T)"
MEAN = "return (per_token * is_real).sum() / is_real.sum().clamp(min=1)"
ROW_OK = "row_ok = ((pred == target) | after_eos).all(dim=1)  # (B,)"
FORWARD = 'logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])'
CLIP_THEN_STEP = "torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n    optimizer.step()"
REAL_TOKENS = "n_real = int((tgt != PAD).sum())  # the batch's loss is a mean over its real tokens"
MISTAKES = [
    ("shift_right", "shifted left: the target without its first token, BOS at the end",
     (SHIFTED, "return torch.cat([tgt_ids[:, 1:], bos], dim=1)  # (B, T)")),
    ("shift_right", "BOS prepended but the last token kept: (B, T + 1)",
     (SHIFTED, "return torch.cat([bos, tgt_ids], dim=1)  # (B, T + 1)")),
    ("shift_right", "returns floats: a BOS column of zeros + bos_id promotes the ids to float32",
     ("bos = torch.full((tgt_ids.shape[0], 1), bos_id, dtype=tgt_ids.dtype, device=tgt_ids.device)",
      "bos = torch.zeros(tgt_ids.shape[0], 1, device=tgt_ids.device) + bos_id")),
    ("shift_right", "the BOS column is int64 whatever the targets' dtype",
     ("bos_id, dtype=tgt_ids.dtype, device=", "bos_id, device=")),
    ("sequence_loss", "mean over all B * T positions: padding dilutes the loss",
     (MEAN, "return (per_token * is_real).mean()")),
    ("sequence_loss", "log(softmax(x)): -inf once softmax underflows",
     ("log_probs = logits.log_softmax(dim=-1)  # (B, T, V), stable: never log(softmax(...))",
      "log_probs = torch.log(torch.softmax(logits, dim=-1))  # (B, T, V)")),
    ("sequence_loss", "label smoothing spread over the V - 1 wrong tokens only",
     ("uniform_ce = -log_probs.mean(dim=-1)",
      "uniform_ce = -(log_probs.sum(dim=-1) + nll) / (logits.shape[-1] - 1)")),
    ("sequence_loss", "no guard for a batch of padding: 0 / 0 = NaN",
     (MEAN, "return (per_token * is_real).sum() / is_real.sum()")),
    ("exact_match", "compares the whole padded length: junk after EOS counts as wrong",
     (ROW_OK, "row_ok = (pred == target).all(dim=1)  # (B,)")),
    ("exact_match", "token accuracy instead of whole sequences",
     (ROW_OK, "row_ok = (pred == target) | after_eos  # (B, L)")),
    ("exact_match",
     "only the tokens before the target's EOS are compared: never checks the stop",
     ("after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0", "after_eos = is_eos.cumsum(dim=1) > 0")),
    # (first the two whose loss is wrong: they are caught even on top of a wrong shift_right or sequence_loss)
    ("train_step", "the decoder reads the target itself, not shift_right(target): it copies",
     (FORWARD, 'logits = model(batch["src_ids"], tgt, src_is_real=batch["src_is_real"])')),
    ("train_step",
     "src_is_real not passed: the encoder and cross-attention read source padding",
     (FORWARD, 'logits = model(batch["src_ids"], shift_right(tgt, BOS))')),
    ("train_step",
     "gradients clipped after optimizer.step(): the update used the unclipped ones",
     (CLIP_THEN_STEP, "optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)")),
    ("train_step", "no optimizer.zero_grad(): gradients of earlier steps add up",
     ("    optimizer.zero_grad(set_to_none=True)  # gradients accumulate in .grad: clear the last step's\n", "")),
    ("train_step", "returns the loss tensor, not loss.item()",
     ("return loss.item()  # a float: holding the tensor would keep the whole graph alive", "return loss")),
    ("validation_loss",
     "the mean of the batches' losses: a batch of few real tokens weighs as much as a batch of many"),
    ("validation_loss",
     "a wrong fix: each batch weighted by its number of sequences, not of real tokens",
     (REAL_TOKENS, "n_real = tgt.shape[0]  # the batch's size")),
    ("validation_loss",
     "a wrong fix: each batch weighted by all its B × T positions: padding counts",
     (REAL_TOKENS, "n_real = tgt.numel()  # the batch's positions")),
]
