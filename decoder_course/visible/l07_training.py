"""Visible checks of lesson 07-training: teacher forcing, the padding-aware loss, exact match.

The loss is compared with PyTorch's own ``F.cross_entropy`` (an independent implementation, not an answer key);
the rest are worked examples and properties any correct answer has: padding never changes the loss, huge logits
stay finite, inputs are left unchanged.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

from decoder_course.checks import (
    CheckFailed,
    check,
    expect_building_blocks,
    expect_close,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    expect_unchanged,
    snapshot,
)
from decoder_course.conventions import BOS, EOS, PAD
from decoder_course.spec import Keyword, Spec, run


# -- shift_right ---------------------------------------------------------------------------------------------
def _shift_rows(rng: np.random.Generator) -> list:
    """Targets (B, T) of real ids, EOS and padding, int64 and int32, a bos_id that is not always 1, B = 1 and
    T = 1 (shape generality)."""
    rows = []
    for B, T, dtype, bos_id in [(3, 6, "int64", int(rng.integers(1, 3))), (2, 5, "int32", int(rng.integers(41, 60))),
                                (1, 1, "int64", 1), (4, int(rng.integers(8, 13)), "int64", int(rng.integers(3, 9)))]:
        ids = rng.integers(3, 40, size=(B, T))
        lengths = rng.integers(1, T + 1, size=B)
        lengths[0] = T
        for b, n in enumerate(lengths[1:], start=1):
            ids[b, n - 1], ids[b, n:] = EOS, PAD
        rows.append((f"B={B}, T={T}, {dtype} ids, bos_id={bos_id}", {"tgt_ids": ids.astype(dtype), "bos_id": bos_id}))
    return rows


def _not_shifted_left(args: dict, got: np.ndarray, desc: str) -> None:
    ids = args["tgt_ids"]
    left = np.concatenate([ids[:, 1:], np.full((len(ids), 1), args["bos_id"], ids.dtype)], axis=1)
    if ids.shape[1] > 1 and np.array_equal(got, left):
        raise CheckFailed(f"shift_right's output is shifted left ({desc}): the target without its first token, BOS "
                          "last. The decoder input is shifted right: BOS first, the target's last token dropped")


SHIFT_RIGHT = Spec(
    "shift_right", _shift_rows, dtype=lambda a: a["tgt_ids"].dtype, shape=lambda a: a["tgt_ids"].shape, axes="B, T",
    shape_hint="The decoder input keeps the target's length T: put BOS first and drop the target's last token.",
    properties=_not_shifted_left, tensors=True,
    hint="Position 0 holds bos_id and position t holds token t - 1 of the target.")
def check_shift_right(shift_right) -> None:
    """The worked example, dtype and shape kept, the input unchanged, one-token targets."""
    with check("shift_right on the worked example: BOS first, the last token dropped"):
        tgt = torch.tensor([[10, 4, 7, 3, 6, 2], [5, 8, 2, 0, 0, 0]])  # (B, T): targets, EOS = 2, PAD = 0
        got = expect_inputs_unchanged(shift_right, tgt, 1)
        expect_type(got, torch.Tensor, "shift_right(tgt_ids, 1)")
        expect_shape(got, (2, 6), "shift_right(tgt_ids, 1)", names="B, T")
        expect_close(got, torch.tensor([[1, 10, 4, 7, 3, 6], [1, 5, 8, 2, 0, 0]]), "shift_right(tgt_ids, bos_id=1)",
                     hint="position t of the decoder input holds token t - 1 of the target, and position 0 holds "
                          "BOS; the target's last token is dropped, so the length stays T")
    with check("shift_right keeps the dtype, uses the bos_id it is given, and works for T = 1"):
        got = shift_right(torch.tensor([[3, 4, 5]], dtype=torch.int32), 7)
        expect_dtype(got, torch.int32, "shift_right of an int32 tensor")
        expect_close(got, torch.tensor([[7, 3, 4]], dtype=torch.int32), "shift_right(tgt_ids, bos_id=7)")
        expect_close(shift_right(torch.tensor([[9], [8]]), 1), torch.tensor([[1], [1]]), "shift_right with T = 1")
    run(SHIFT_RIGHT, shift_right)


# -- sequence_loss -------------------------------------------------------------------------------------------
def _loss_rows(rng: np.random.Generator) -> list:
    """Logits (B, T, V), each batch row on its own scale, targets avoiding pad_id, padded per row (the last row
    always, also for B = 1); pad_id != 0, label smoothing 0 (the default), 0.1 or more, logits up to 1e4, and a
    batch of nothing but padding."""
    V = int(rng.integers(9, 14))
    rows = []
    for B, T, V_, pad_id, eps, scales, what in [
            (3, 6, V, int(rng.integers(3, 6)), None, [0.3, 3.0, 10.0], ""),
            (4, 5, V, int(rng.integers(3, 6)), 0.1, [1.0, 0.1, 5.0, 2.0], ""),
            (2, 7, 7, 4, round(float(rng.uniform(0.2, 0.4)), 3), [2.0, 0.5], ""),
            (2, 4, V, 3, 0.0, [1e4, 3.0], ", logits of size up to 1e4"),
            (1, 3, 5, 1, 0.1, [2.0], ""),
            (2, 3, 6, 5, None, [1.0, 1.0], ", every target is padding")]:
        logits = rng.standard_normal((B, T, V_)) * np.asarray(scales)[:, None, None]
        targets = rng.integers(0, V_, size=(B, T))
        targets[targets == pad_id] = (pad_id + 1) % V_
        lengths = rng.integers(1, T + 1, size=B)
        lengths[0], lengths[-1] = T, max(1, T - 3)  # one row without padding, one with real padding
        if what.endswith("padding"):
            lengths[:] = 0
        args = {"logits": logits.astype(np.float32), "targets": np.where(np.arange(T) < lengths[:, None], targets,
                                                                          pad_id), "pad_id": pad_id}
        if eps is not None:
            args["label_smoothing"] = Keyword(eps)
        rows.append((f"B={B}, T={T}, V={V_}, pad_id={pad_id}, label_smoothing={eps or 0.0}{what}", args))
    return rows


def _torch_loss(a: dict) -> float:
    """PyTorch's own loss on a row's arguments, in float64: the mean over real tokens (0 where there are none)."""
    logits, targets = torch.from_numpy(a["logits"]).double(), torch.from_numpy(a["targets"])
    if not (targets != a["pad_id"]).any():
        return 0.0
    return F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=a["pad_id"],
                           label_smoothing=a.get("label_smoothing", 0.0)).item()  # (B * T, V) against (B * T,)


def _finite_and_zero_without_tokens(args: dict, got: np.ndarray, desc: str) -> None:
    if not (args["targets"] != args["pad_id"]).any():
        if not np.isfinite(got) or got != 0:
            raise CheckFailed(f"on a batch with no real token ({desc}) sequence_loss should be 0, not "
                              f"{'NaN' if np.isnan(got) else 'non-zero'}: divide by max(number of real tokens, 1)")
    elif not np.isfinite(got).all():
        raise CheckFailed(f"sequence_loss is not finite ({desc}): log(softmax(x)) is log(0) = -inf when softmax "
                          "underflows; compute x.log_softmax(-1) directly")


def _no_gradient(args: dict, error: str) -> str:
    return ("No gradient reaches the logits: compute the loss with torch operations only (no .item(), .detach(), "
            ".numpy() or torch.tensor(...) of a value)" if "does not require grad" in error else "")


SEQUENCE_LOSS = Spec(
    "sequence_loss", _loss_rows, dtype=lambda a: "float", shape=lambda a: (), tensors=True, grad=True,
    properties=_finite_and_zero_without_tokens, twin=_torch_loss, on_error=_no_gradient, rtol=1e-4, atol=1e-5,
    # the exercise is to write the loss from log_softmax; PyTorch's is what it is compared with
    forbidden=("F.cross_entropy", "nn.CrossEntropyLoss", "F.nll_loss", "nn.NLLLoss"),
    hint="The mean over real tokens (target != pad_id) of (1 - eps) * (-log p[target]) + eps * the mean over all V "
         "tokens of (-log p), as F.cross_entropy(..., ignore_index=pad_id, label_smoothing=eps) computes it.")


def check_sequence_loss(sequence_loss) -> None:
    """Equals F.cross_entropy (pad_id != 0, with and without label smoothing), gradients reach the logits, huge
    logits finite, a batch of padding gives 0."""
    run(SEQUENCE_LOSS, sequence_loss)


# -- exact_match ---------------------------------------------------------------------------------------------
def _match_rows(rng: np.random.Generator) -> list:
    """Targets with EOS and padding (one without EOS), predictions made from them with every kind of error (junk
    after EOS, EOS missing or early, a wrong token), longer and shorter than the targets, pad_id != 0, B = 1."""
    rows = []
    for B, L_tgt, L_pred in [(6, 7, 9), (8, 8, 5), (12, 6, 6), (1, 4, 6)]:
        pad_id, eos_id = int(rng.integers(30, 40)), int(rng.integers(2, 5))
        target = rng.integers(5, 30, size=(B, L_tgt))
        for b, n in enumerate(rng.integers(1, L_tgt, size=B)):
            target[b, n], target[b, n + 1:] = eos_id, pad_id
        target[0] = rng.integers(5, 30, size=L_tgt)  # a target without EOS
        pred = np.full((B, L_pred), pad_id)
        width = min(L_tgt, L_pred)
        pred[:, :width] = target[:, :width]
        for b in range(B):
            end = int(np.argmax(target[b] == eos_id)) if (target[b] == eos_id).any() else None
            kind = ("right", "junk after EOS", "no EOS", "early EOS", "a wrong token", "right")[b % 6]
            if kind == "junk after EOS" and end is not None and end + 1 < L_pred:
                pred[b, end + 1:] = rng.integers(5, 30, size=L_pred - end - 1)
            elif kind == "no EOS" and end is not None and end < L_pred:
                pred[b, end] = 7
            elif kind == "early EOS" and end is not None and 1 <= end <= L_pred:
                pred[b, end - 1] = eos_id
            elif kind == "a wrong token":
                pred[b, 0] += 1
        rows.append((f"B={B}, predictions of length {L_pred}, targets of length {L_tgt}, pad_id={pad_id}, "
                     f"eos_id={eos_id}", {"pred_ids": pred, "target_ids": target, "pad_id": pad_id, "eos_id": eos_id}))
    return rows


def _a_fraction_of_rows(args: dict, got: float, desc: str) -> None:
    B = len(args["target_ids"])
    if not 0.0 <= got <= 1.0 or abs(got * B - round(got * B)) > 1e-6:
        raise CheckFailed(f"exact_match gave {got} on {B} sequences ({desc}): it counts whole sequences, so it is "
                          f"k / {B} for some k in 0 .. {B} (token accuracy is not)")


SPECS = {
    "shift_right": SHIFT_RIGHT,
    "sequence_loss": SEQUENCE_LOSS,
    "exact_match": Spec(
        "exact_match", _match_rows, dtype=lambda a: float, shape=lambda a: (), scalar=True, tensors=True,
        properties=_a_fraction_of_rows, rtol=0.0, atol=1e-6,
        hint="A sequence is right when it equals its target at every position up to and including the target's "
             "first EOS (the prediction must stop there too); pad the shorter tensor with pad_id."),
}


def check_exact_match(exact_match) -> None:
    """The worked example, different lengths, a target without EOS, and a Python float in [0, 1]."""
    with check("exact_match on the worked example: 2 of 4 predictions are right"):
        target = torch.tensor([[5, 6, 2, 0]] * 4)  # (B, L_tgt)
        pred = torch.tensor([[5, 6, 2, 0, 0], [5, 6, 2, 9, 9], [5, 6, 9, 0, 0], [5, 2, 0, 0, 0]])  # (B, L_pred)
        got = expect_inputs_unchanged(exact_match, pred, target, PAD, EOS)
        if isinstance(got, torch.Tensor) and got.dim() == 0:
            got = got.item()
        expect_type(got, float, "exact_match(...)")
        if abs(got - 0.5) > 1e-9:
            per_row = [float(exact_match(pred[row:row + 1], target[row:row + 1], PAD, EOS)) for row in range(4)]
            raise CheckFailed(f"expected 0.5, got {got}. Row by row your function gives {per_row} for: a longer "
                              "prediction padded after EOS (right), junk after EOS (right: ignored), no EOS where "
                              "the target ends (wrong), stopping too early (wrong)")
    with check("a shorter prediction is padded; a target without EOS must be matched everywhere"):
        for pred, target, want, why in [  # PAD = 0, EOS = 2
            ([[5, 6]], [[5, 6, 2]], 0.0, "the prediction ends before the target's EOS: wrong"),
            ([[5, 6, 2]], [[5, 6, 2, 0, 0]], 1.0, "equal up to EOS, then padding: right"),
            ([[4, 4, 4, 9]], [[4, 4, 4, 4]], 0.0, "a target without EOS: every position counts"),
            ([[7, 2], [7, 7]], [[7, 2], [7, 2]], 0.5, "two rows: one right, one missing its EOS"),
        ]:
            got = float(exact_match(torch.tensor(pred), torch.tensor(target), PAD, EOS))
            if abs(got - want) > 1e-9:
                raise CheckFailed(f"exact_match(pred={pred}, target={target}) gave {got}, expected {want}: {why}")
    run(SPECS["exact_match"], exact_match)


# -- train_step and validation_loss: PyTorch's own loss of a whole model ------------------------------------
def parameter_vector(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter of ``model``, flattened and joined in ``model.parameters()`` order (a copy).

    Shape:
        -> (number of parameters,)
    """
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def gradient_norm(model: torch.nn.Module) -> float:
    """The joint L2 norm of every parameter's ``.grad`` (missing gradients count as zero)."""
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def _loss_batch(src_lengths, tgt_lengths, S, T, seed, V=11):
    """A batch as task.make_batch makes it: real tokens, then PAD; each target ends with EOS (2)."""
    g = torch.Generator().manual_seed(seed)
    src_is_real = torch.arange(S)[None, :] < torch.tensor(src_lengths)[:, None]  # (B, S)
    src_ids = torch.randint(3, V, (len(src_lengths), S), generator=g).masked_fill(~src_is_real, PAD)
    tgt_ids = torch.randint(3, V, (len(tgt_lengths), T), generator=g)
    for b, n in enumerate(tgt_lengths):  # n real tokens: n - 1 digits, then EOS
        tgt_ids[b, n - 1], tgt_ids[b, n:] = EOS, PAD
    return {"src_ids": src_ids, "src_is_real": src_is_real, "tgt_ids": tgt_ids}


def _model_loss(model, batch, reduction="mean"):
    """PyTorch's loss of ``model`` on ``batch``, teacher-forced: the decoder reads BOS, then all but the last."""
    tgt = batch["tgt_ids"]
    decoder_in = torch.cat([torch.full((tgt.shape[0], 1), BOS), tgt[:, :-1]], dim=1)  # (B, T)
    logits = model(batch["src_ids"], decoder_in, src_is_real=batch["src_is_real"])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt.reshape(-1), ignore_index=PAD,
                           reduction=reduction)  # (B * T, V) logits against (B * T,) targets


def _expect_contract(before, batch, model, who):
    """The batch left as it was (``before`` is its snapshot) and the model still in training mode."""
    for name, old in before.items():
        expect_unchanged(old, batch[name], f"batch[{name!r}] given to {who}")
    if not model.training:
        raise CheckFailed(f"{who} left the model in eval mode: leave the mode it found, or put it back "
                          "(model.train(was_training))")


BUILDING_BLOCKS = {"shift_right": check_shift_right, "sequence_loss": check_sequence_loss}  # what both items call


def check_train_step(train_step, Seq2SeqTransformer) -> None:
    """Returns the pre-step loss as a float (teacher forcing, source padding, padding ignored); the update uses
    gradients of this batch only, clipped to clip_norm before one optimizer step; the model's mode is kept."""
    with check("train_step's building blocks, shift_right and sequence_loss, pass their own checks"):
        expect_building_blocks(train_step, BUILDING_BLOCKS)
    batch = _loss_batch([6, 4, 2], [5, 3, 5], S=6, T=5, seed=7)  # one target ends early: EOS, then padding
    torch.manual_seed(3)
    start = Seq2SeqTransformer(11, 11, 16, 4, 32, 1, dropout=0.0, tie_weights=False).train()

    def expected(clip_norm):
        """The same step done by hand with PyTorch's own loss: (loss, parameters after, gradient norm before)."""
        model = copy.deepcopy(start)
        loss = _model_loss(model, batch)
        loss.backward()
        norm = gradient_norm(model)
        with torch.no_grad():
            for p in model.parameters():  # plain SGD with lr = 1 on the clipped gradient
                p -= p.grad * min(1.0, clip_norm / (norm + 1e-6))
        return loss.item(), parameter_vector(model), norm

    for clip_norm, what in ((1e6, "no clipping (clip_norm=1e6)"), (0.05, "clip_norm=0.05, below the gradient's norm")):
        with check(f"train_step with SGD(lr=1), {what}: the loss and the update"):
            model = copy.deepcopy(start)
            for p in model.parameters():  # stale gradients of an earlier step: train_step must clear them
                p.grad = torch.full_like(p, 0.5)
            before = snapshot(batch)
            loss = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=1.0), clip_norm)
            expect_type(loss, float, "train_step's return value (loss.item(), a Python float)")
            want_loss, want_params, norm = expected(clip_norm)
            _expect_contract(before, batch, model, "train_step")
            expect_close(torch.tensor(loss), torch.tensor(want_loss), "the loss", rtol=1e-5, atol=1e-6,
                         hint="the model reads shift_right(tgt_ids, BOS) and src_is_real; sequence_loss scores its "
                              "logits against tgt_ids itself, with PAD ignored; return the loss before the step")
            got = parameter_vector(model)
            moved = (got - parameter_vector(start)).norm().item()
            if clip_norm < norm and moved > clip_norm * 1.001 + 1e-6:
                raise CheckFailed(f"with SGD(lr=1) and clip_norm={clip_norm} the parameters moved by {moved:.3g}, "
                                  "more than clip_norm: clip the gradients with torch.nn.utils.clip_grad_norm_("
                                  "model.parameters(), clip_norm) after backward and before optimizer.step()")
            expect_close(got, want_params, "the parameters after the step", rtol=1e-4, atol=1e-6,
                         hint="optimizer.zero_grad() first (stale gradients add up), then backward, clip, and "
                              "exactly one optimizer.step()")


def _rows(batch, rows):
    """Some rows of a batch, trimmed to their longest target (as make_batch pads to the longest of a batch)."""
    part = {name: t[rows] for name, t in batch.items()}
    part["tgt_ids"] = part["tgt_ids"][:, : int((part["tgt_ids"] != PAD).sum(-1).max())]
    return part


def check_validation_loss(validation_loss, Seq2SeqTransformer) -> None:
    """Find the bug: the same pairs cut into other batches give the same loss; PyTorch's own mean over every
    real token of the set; eval mode, the mode put back, the batches unchanged."""
    with check("validation_loss's building blocks, your shift_right and sequence_loss, pass their own checks"):
        expect_building_blocks(validation_loss, BUILDING_BLOCKS)
    torch.manual_seed(5)
    model = Seq2SeqTransformer(11, 11, 16, 4, 32, 1, dropout=0.3, tie_weights=False).train()  # dropout, train mode
    whole = _loss_batch([6, 4, 5, 2], [6, 2, 5, 3], S=6, T=6, seed=11)  # 4 pairs, 16 real target tokens

    with check("the probe: the same 4 pairs, in one batch or cut in two, give the same loss"):
        before = snapshot(whole)
        one = validation_loss(model, [whole])
        expect_type(one, float, "validation_loss(...) (a Python float)")
        if abs(validation_loss(model, [whole]) - one) > 1e-6 * (1 + abs(one)):
            raise CheckFailed("two calls on the same batch gave different losses: dropout is acting. Evaluate in "
                              "eval mode (model.eval()), then put back the mode the model had")
        _expect_contract(before, whole, model, "validation_loss")
        for first, second in [([0], [1, 2, 3]), ([0, 1, 2], [3])]:
            parts = [_rows(whole, first), _rows(whole, second)]
            two = validation_loss(model, parts)
            if abs(two - one) > 1e-5 * (1 + abs(one)):
                counts = [int((p["tgt_ids"] != PAD).sum()) for p in parts]
                raise CheckFailed(
                    f"one batch of 4 pairs gives {one:.5f}; the same pairs cut into batches of {len(first)} and "
                    f"{len(second)} sequences ({counts[0]} and {counts[1]} real target tokens) give {two:.5f}. "
                    "The loss of a set of pairs cannot depend on how they were batched. Print each batch's "
                    "sequence_loss and its number of real target tokens: what mean of the whole set do they make, "
                    "and what does the code compute from them?")

    with check("equal to PyTorch's loss summed over every real token of three batches, divided by their number"):
        batches = [whole, _loss_batch([3, 6], [6, 6], S=6, T=6, seed=12),
                   _loss_batch([2, 5, 4], [2, 3, 2], S=5, T=3, seed=13)]
        got = validation_loss(model, batches)
        with torch.no_grad():
            total = sum(_model_loss(model.eval(), batch, reduction="sum").item() for batch in batches)
        model.train()
        count = sum(int((batch["tgt_ids"] != PAD).sum()) for batch in batches)
        expect_close(torch.tensor(got), torch.tensor(total / count), "validation_loss(...)", rtol=1e-5, atol=1e-6,
                     hint="every real target token counts once, whichever batch it sits in; the model runs in eval "
                          "mode (no dropout), on shift_right(tgt_ids, BOS) and src_is_real")
