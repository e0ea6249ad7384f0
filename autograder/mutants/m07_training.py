"""Wrong answers to lesson 07-training.

Most are the reference's own code with one line changed (``patched``); the rest are written as a student would type
them in the notebook, where ``torch``, ``F``, ``shift_right``, ``sequence_loss``, ``BOS`` and ``PAD`` exist.
"""

from autograder.mutants import mutant, patched, shown_bug

MUTANTS: list = []
LESSON = "07-training"

# -- shift_right ---------------------------------------------------------------------------------------------
SHIFTED = "return torch.cat([bos, tgt_ids[:, :-1]], dim=1)  # (B, T)"
patched(MUTANTS, LESSON, "shift_right", "shifted left: the target without its first token, BOS at the end",
        (SHIFTED, "return torch.cat([tgt_ids[:, 1:], bos], dim=1)  # (B, T)"))
patched(MUTANTS, LESSON, "shift_right", "BOS prepended but the last token kept: (B, T + 1)",
        (SHIFTED, "return torch.cat([bos, tgt_ids], dim=1)  # (B, T + 1)"))


@mutant(MUTANTS, "shift_right", "shifted in place: the caller's targets are overwritten")
def shift_right(tgt_ids, bos_id):
    tgt_ids[:, 1:] = tgt_ids[:, :-1].clone()
    tgt_ids[:, 0] = bos_id
    return tgt_ids


patched(MUTANTS, LESSON, "shift_right", "the BOS column is int64 whatever the targets' dtype",
        ("bos_id, dtype=tgt_ids.dtype, device=", "bos_id, device="))


# -- sequence_loss -------------------------------------------------------------------------------------------
MEAN = "return (per_token * is_real).sum() / is_real.sum().clamp(min=1)"
patched(MUTANTS, LESSON, "sequence_loss", "mean over all B * T positions: padding dilutes the loss",
        (MEAN, "return (per_token * is_real).mean()"))
patched(MUTANTS, LESSON, "sequence_loss", "log(softmax(x)): -inf once softmax underflows",
        ("log_probs = logits.log_softmax(dim=-1)  # (B, T, V), stable: never log(softmax(...))",
         "log_probs = torch.log(torch.softmax(logits, dim=-1))  # (B, T, V)"))
patched(MUTANTS, LESSON, "sequence_loss", "label smoothing spread over the V - 1 wrong tokens only",
        ("uniform_ce = -log_probs.mean(dim=-1)",
         "uniform_ce = -(log_probs.sum(dim=-1) + nll) / (logits.shape[-1] - 1)"))
patched(MUTANTS, LESSON, "sequence_loss", "no guard for a batch of padding: 0 / 0 = NaN",
        (MEAN, "return (per_token * is_real).sum() / is_real.sum()"))


# -- exact_match ---------------------------------------------------------------------------------------------
ROW_OK = "row_ok = ((pred == target) | after_eos).all(dim=1)  # (B,)"
patched(MUTANTS, LESSON, "exact_match", "compares the whole padded length: junk after EOS counts as wrong",
        (ROW_OK, "row_ok = (pred == target).all(dim=1)  # (B,)"))
patched(MUTANTS, LESSON, "exact_match", "token accuracy instead of whole sequences",
        (ROW_OK, "row_ok = (pred == target) | after_eos  # (B, L)"))
patched(MUTANTS, LESSON, "exact_match",
        "only the tokens before the target's EOS are compared: never checks the stop",
        ("after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0", "after_eos = is_eos.cumsum(dim=1) > 0"))


# -- train_step ----------------------------------------------------------------------------------------------
# (first the two whose loss is wrong: they are caught even on top of a wrong shift_right or sequence_loss)
FORWARD = 'logits = model(batch["src_ids"], shift_right(tgt, BOS), src_is_real=batch["src_is_real"])'
CLIP_THEN_STEP = "torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n    optimizer.step()"
patched(MUTANTS, LESSON, "train_step", "the decoder reads the target itself, not shift_right(target): it copies",
        (FORWARD, 'logits = model(batch["src_ids"], tgt, src_is_real=batch["src_is_real"])'))
patched(MUTANTS, LESSON, "train_step",
        "src_is_real not passed: the encoder and cross-attention read source padding",
        (FORWARD, 'logits = model(batch["src_ids"], shift_right(tgt, BOS))'))
patched(MUTANTS, LESSON, "train_step",
        "gradients clipped after optimizer.step(): the update used the unclipped ones",
        (CLIP_THEN_STEP, "optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)"))
patched(MUTANTS, LESSON, "train_step", "no optimizer.zero_grad(): gradients of earlier steps add up",
        ("    optimizer.zero_grad(set_to_none=True)  # gradients accumulate in .grad: clear the last step's\n", ""))
patched(MUTANTS, LESSON, "train_step", "returns the loss tensor, not loss.item()",
        ("return loss.item()  # a float: holding the tensor would keep the whole graph alive", "return loss"))


# -- validation_loss (find the bug) ----------------------------------------------------------------------------
shown_bug(MUTANTS, LESSON, "validation_loss",
          "the mean of the batches' losses: a batch of few real tokens weighs as much as a batch of many")

REAL_TOKENS = "n_real = int((tgt != PAD).sum())  # the batch's loss is a mean over its real tokens"
patched(MUTANTS, LESSON, "validation_loss",
        "a wrong fix: each batch weighted by its number of sequences, not of real tokens",
        (REAL_TOKENS, "n_real = tgt.shape[0]  # the batch's size"))
patched(MUTANTS, LESSON, "validation_loss",
        "a wrong fix: each batch weighted by all its B × T positions: padding counts",
        (REAL_TOKENS, "n_real = tgt.numel()  # the batch's positions"))
