"""Wrong answers to lesson 07-training.

Each is written as a student would type it in the notebook, where ``torch``, ``F``, ``shift_right``,
``sequence_loss``, ``BOS`` and ``PAD`` exist.
"""

import torch
import torch.nn.functional as F  # noqa: F401 - the notebook's namespace

from autograder.mutants import mutant, patched, shown_bug
from decoder_course.conventions import BOS, PAD

MUTANTS: list = []


# -- shift_right ---------------------------------------------------------------------------------------------
@mutant(MUTANTS, "shift_right", "shifted left: the target without its first token, BOS at the end")
def shift_right(tgt_ids, bos_id):
    bos = torch.full((tgt_ids.shape[0], 1), bos_id, dtype=tgt_ids.dtype)
    return torch.cat([tgt_ids[:, 1:], bos], dim=1)


@mutant(MUTANTS, "shift_right", "BOS prepended but the last token kept: (B, T + 1)")
def shift_right(tgt_ids, bos_id):  # noqa: F811 - each mutant is a separate wrong answer
    bos = torch.full((tgt_ids.shape[0], 1), bos_id, dtype=tgt_ids.dtype)
    return torch.cat([bos, tgt_ids], dim=1)


@mutant(MUTANTS, "shift_right", "shifted in place: the caller's targets are overwritten")
def shift_right(tgt_ids, bos_id):  # noqa: F811
    tgt_ids[:, 1:] = tgt_ids[:, :-1].clone()
    tgt_ids[:, 0] = bos_id
    return tgt_ids


@mutant(MUTANTS, "shift_right", "the BOS column is int64 whatever the targets' dtype")
def shift_right(tgt_ids, bos_id):  # noqa: F811
    bos = torch.full((tgt_ids.shape[0], 1), bos_id)
    return torch.cat([bos, tgt_ids[:, :-1]], dim=1)


# -- sequence_loss -------------------------------------------------------------------------------------------
@mutant(MUTANTS, "sequence_loss", "mean over all B * T positions: padding dilutes the loss")
def sequence_loss(logits, targets, pad_id, label_smoothing=0.0):
    log_probs = logits.log_softmax(dim=-1)
    is_real = targets != pad_id
    nll = -log_probs.gather(-1, targets.masked_fill(~is_real, 0)[..., None]).squeeze(-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * (-log_probs.mean(dim=-1))
    return (per_token * is_real).mean()


@mutant(MUTANTS, "sequence_loss", "log(softmax(x)): -inf once softmax underflows")
def sequence_loss(logits, targets, pad_id, label_smoothing=0.0):  # noqa: F811
    log_probs = torch.log(torch.softmax(logits, dim=-1))
    is_real = targets != pad_id
    nll = -log_probs.gather(-1, targets.masked_fill(~is_real, 0)[..., None]).squeeze(-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * (-log_probs.mean(dim=-1))
    return (per_token * is_real).sum() / is_real.sum().clamp(min=1)


@mutant(MUTANTS, "sequence_loss", "label smoothing spread over the V - 1 wrong tokens only")
def sequence_loss(logits, targets, pad_id, label_smoothing=0.0):  # noqa: F811
    log_probs = logits.log_softmax(dim=-1)
    V = logits.shape[-1]
    is_real = targets != pad_id
    nll = -log_probs.gather(-1, targets.masked_fill(~is_real, 0)[..., None]).squeeze(-1)
    others = -(log_probs.sum(dim=-1) + nll) / (V - 1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * others
    return (per_token * is_real).sum() / is_real.sum().clamp(min=1)


@mutant(MUTANTS, "sequence_loss", "no guard for a batch of padding: 0 / 0 = NaN")
def sequence_loss(logits, targets, pad_id, label_smoothing=0.0):  # noqa: F811
    log_probs = logits.log_softmax(dim=-1)
    is_real = targets != pad_id
    nll = -log_probs.gather(-1, targets.masked_fill(~is_real, 0)[..., None]).squeeze(-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * (-log_probs.mean(dim=-1))
    return (per_token * is_real).sum() / is_real.sum()


# -- exact_match ---------------------------------------------------------------------------------------------
@mutant(MUTANTS, "exact_match", "compares the whole padded length: junk after EOS counts as wrong")
def exact_match(pred_ids, target_ids, pad_id, eos_id):
    L = max(pred_ids.shape[1], target_ids.shape[1])
    pred = F.pad(pred_ids, (0, L - pred_ids.shape[1]), value=pad_id)
    target = F.pad(target_ids, (0, L - target_ids.shape[1]), value=pad_id)
    return (pred == target).all(dim=1).float().mean().item()


@mutant(MUTANTS, "exact_match", "token accuracy instead of whole sequences")
def exact_match(pred_ids, target_ids, pad_id, eos_id):  # noqa: F811
    L = max(pred_ids.shape[1], target_ids.shape[1])
    pred = F.pad(pred_ids, (0, L - pred_ids.shape[1]), value=pad_id)
    target = F.pad(target_ids, (0, L - target_ids.shape[1]), value=pad_id)
    is_eos = (target == eos_id).long()
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
    return ((pred == target) | after_eos).float().mean().item()


@mutant(MUTANTS, "exact_match", "only the tokens before the target's EOS are compared: never checks the stop")
def exact_match(pred_ids, target_ids, pad_id, eos_id):  # noqa: F811
    L = max(pred_ids.shape[1], target_ids.shape[1])
    pred = F.pad(pred_ids, (0, L - pred_ids.shape[1]), value=pad_id)
    target = F.pad(target_ids, (0, L - target_ids.shape[1]), value=pad_id)
    from_eos = (target == eos_id).long().cumsum(dim=1) > 0
    return ((pred == target) | from_eos).all(dim=1).float().mean().item()


# -- train_step ----------------------------------------------------------------------------------------------
# (first the two whose loss is wrong: they are caught even on top of a wrong shift_right or sequence_loss)
@mutant(MUTANTS, "train_step", "the decoder reads the target itself, not shift_right(target): it copies")
def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):
    tgt = batch["tgt_ids"]
    logits = model(batch["src_ids"], tgt, src_is_real=batch["src_is_real"])
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss.item()


@mutant(MUTANTS, "train_step", "src_is_real not passed: the encoder and cross-attention read source padding")
def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):  # noqa: F811
    tgt = batch["tgt_ids"]
    logits = model(batch["src_ids"], shift_right(tgt, BOS))
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss.item()


@mutant(MUTANTS, "train_step", "gradients clipped after optimizer.step(): the update used the unclipped ones")
def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):  # noqa: F811
    tgt = batch["tgt_ids"]
    logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    return loss.item()


@mutant(MUTANTS, "train_step", "no optimizer.zero_grad(): gradients of earlier steps add up")
def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):  # noqa: F811
    tgt = batch["tgt_ids"]
    logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss.item()


@mutant(MUTANTS, "train_step", "returns the loss tensor, not loss.item()")
def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):  # noqa: F811
    tgt = batch["tgt_ids"]
    logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])
    loss = sequence_loss(logits, tgt, PAD, label_smoothing)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss


# -- validation_loss (find the bug) ----------------------------------------------------------------------------
shown_bug(MUTANTS, "07-training", "validation_loss",
          "the mean of the batches' losses: a batch of few real tokens weighs as much as a batch of many")

REAL_TOKENS = "n_real = int((tgt != PAD).sum())  # the batch's loss is a mean over its real tokens"
patched(MUTANTS, "07-training", "validation_loss",
        "a wrong fix: each batch weighted by its number of sequences, not of real tokens",
        (REAL_TOKENS, "n_real = tgt.shape[0]  # the batch's size"))
patched(MUTANTS, "07-training", "validation_loss",
        "a wrong fix: each batch weighted by all its B × T positions: padding counts",
        (REAL_TOKENS, "n_real = tgt.numel()  # the batch's positions"))
