"""Hidden checks of lesson 07-training (PyTorch): teacher forcing, the padding-aware loss, exact match, a step.

``shift_right``, ``sequence_loss`` and ``exact_match`` are specs (``decoder_course/visible/l07_training.py``);
``train_step`` and ``validation_loss`` run a small model against the reference step and PyTorch's own loss.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from autograder.course.checks import judges
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result
from autograder.course.reference import training as ref_training
from decoder_course.conventions import BOS, EOS, PAD

LESSON = "07-training"


def _targets(rng: np.random.Generator, B: int, T: int, pad_id: int, eos_id: int = EOS, V: int = 40) -> np.ndarray:
    """Target ids (B, T): tokens 3 .. 39 (those above V - 1 become V - 1), then EOS, then padding; row 0 without
    padding. The clip makes V - 1 a frequent token: a loss mistake that an untrained model's near-uniform logits
    would all but hide (label smoothing over V - 1 tokens) stays big enough for the replay of the student's
    sequence_loss (autograder.course.checks.relative) to see, so that it costs sequence_loss, not train_step."""
    ids = judges.token_ids(rng, B, T, 40).clip(max=V - 1)
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    for b, n in enumerate(lengths):
        if n < T:
            ids[b, n - 1] = eos_id
            ids[b, n:] = pad_id
    return ids


def _raised(result: Result, case: Case, what: str, built_on: str = "") -> None:
    """The call raised: quote the exception (and say which of the student's building blocks it runs)."""
    error = result.error(case.id)
    if error is not None:
        raise Fail(f"{what} raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}{built_on}")


# -- train_step and validation_loss: a small model, a batch, the student's code around them ---------------------
STEP_MODEL = {"src_vocab": 13, "tgt_vocab": 13, "d_model": 16, "n_heads": 4, "d_ff": 24, "n_layers": 1,
              "dropout": 0.0, "tie_weights": False, "norm_first": True}
LOSS_MODEL = {**STEP_MODEL, "dropout": 0.3}  # dropout that would shake the loss, were the model left in train mode
VECTOR = "decoder_course.visible.l07_training:parameter_vector"
GRAD_NORM = "decoder_course.visible.l07_training:gradient_norm"


def _model(config: dict, seed: int = 0, state: dict | None = None) -> torch.nn.Module:
    """The reference Seq2SeqTransformer of ``config``, seeded, holding ``state`` if given, in training mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ref_training.Seq2SeqTransformer(**config)
    if state is not None:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model.train()


def _weights(config: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A fresh model's state dict of ``config``, as NumPy arrays."""
    return {k: v.detach().numpy().copy() for k, v in _model(config, int(rng.integers(2**31))).state_dict().items()}


def _batch(rng: np.random.Generator, B: int, S: int, T: int, min_src: int = 1) -> dict[str, np.ndarray]:
    """A batch as task.make_batch makes it: padded sources (at least ``min_src`` real tokens) and targets (the
    target, EOS, then PAD)."""
    V = STEP_MODEL["tgt_vocab"]
    src_is_real = judges.right_padded(rng, B, S, min_real=min_src)  # (B, S)
    return {"src_ids": judges.token_ids(rng, B, S, V, src_is_real, PAD), "src_is_real": src_is_real,
            "tgt_ids": _targets(rng, B, T, PAD, EOS, V)}


def _student_model(case: Case, config: dict, state: dict) -> None:
    """Bind the student's Seq2SeqTransformer of ``config`` as ``m``, holding ``state``, in training mode."""
    case.call("Seq2SeqTransformer", **config, let="m")
    case.load_state("m", state)
    case.steps.append({"train": "m"})


def _record_batches_after(case: Case, name: str, batches: dict | list[dict]) -> dict[str, np.ndarray]:
    """Record every tensor of the bound ``name`` (one batch, or a list of them) again after the call, under the
    name the student reads it by (``batch['tgt_ids']``, ``batches[1]['src_ids']``): the ``before`` that
    judges.unchanged compares them with."""
    before = {}
    for i, batch in [(None, batches)] if isinstance(batches, dict) else enumerate(batches):
        holder = name if i is None else f"{name}[{i}]"
        if i is not None:
            case.let(holder, {"index": [name, i]})
        for key, value in batch.items():
            case.record(f"{holder}['{key}']_after", {"index": [holder, key]})
            before[f"{holder}['{key}']"] = value
    return before


# SGD, not Adam: Adam's first step is about lr * sign(g), which would amplify rounding in tiny gradients
STEPS = [  # (id, SGD's arguments, clip_norm, label_smoothing, situation)
    ("sgd", {"lr": 0.5}, 0.05, 0.0, "SGD(lr=0.5), clip_norm=0.05 (below the gradient's norm)"),
    ("decay", {"lr": 0.3, "weight_decay": 0.1}, 1e6, 0.1,
     "SGD(lr=0.3, weight_decay=0.1), clip_norm=1e6, label_smoothing=0.1"),
]


def _reference_step(d: dict, *, clip: bool = True, zero_grad: bool = True) -> tuple[float, np.ndarray]:
    """The reference train_step on the case's weights: (loss, parameters after); the flags make known mistakes
    (no clipping, stale gradients kept)."""
    from decoder_course.visible.l07_training import parameter_vector

    model = _model(STEP_MODEL, state=d["state"])
    stale = d["stale"]  # an earlier backward pass, whose gradients are still in .grad
    logits = model(torch.from_numpy(stale["src_ids"]), torch.from_numpy(stale["tgt_ids"]))
    (logits * torch.from_numpy(stale["weights"])).sum().backward()
    optimizer = torch.optim.SGD(model.parameters(), **d["sgd"])
    batch = {k: torch.from_numpy(v) for k, v in d["batch"].items()}
    if zero_grad and clip:
        loss = ref_training.train_step(model, batch, optimizer, d["clip_norm"], d["label_smoothing"])
    else:  # the same step with one thing left out
        logits = model(batch["src_ids"], ref_training.shift_right(batch["tgt_ids"], BOS), batch["src_is_real"])
        loss_t = ref_training.sequence_loss(logits, batch["tgt_ids"], PAD, d["label_smoothing"])
        if zero_grad:
            optimizer.zero_grad()
        loss_t.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), d["clip_norm"])
        optimizer.step()
        loss = loss_t.item()
    return loss, parameter_vector(model).numpy()


@exercise(LESSON, "train_step")
class TrainStep(Exercise):
    """Against the reference step on copied weights (SGD with a clip that bites; SGD with weight decay, no
    clipping, label smoothing; stale gradients left in .grad before the call): the same loss (a Python float, before the
    update), the same parameters after exactly one step, the gradient norm at most clip_norm, the model's mode
    and the batch unchanged."""

    # it calls the student's shift_right and sequence_loss
    uses = ("shift_right", "sequence_loss")
    reference = ref_training

    def cases(self, rng):
        cases = []
        for case_id, sgd, clip_norm, smoothing, what in STEPS:
            state = _weights(STEP_MODEL, rng)
            B, S, T, V = 4, 6, 5, STEP_MODEL["tgt_vocab"]
            batch = _batch(rng, B, S, T, min_src=2)
            stale = {"src_ids": rng.integers(3, V, size=(2, S)), "tgt_ids": rng.integers(3, V, size=(2, T)),
                     "weights": rng.normal(0.0, 1.0, (2, T, V)).astype(np.float32)}
            desc = f"B={B}, S={S}, T={T}, a 1-layer model, {what}, stale gradients in .grad before the call"
            case = Case(case_id, desc, data={"state": state, "batch": batch, "sgd": sgd, "clip_norm": clip_norm,
                                             "label_smoothing": smoothing, "stale": stale})
            _student_model(case, STEP_MODEL, state)
            case.method("m", "forward", case.tensor(stale["src_ids"]), case.tensor(stale["tgt_ids"]), let="junk")
            case.backward("junk", stale["weights"])  # stale gradients: train_step must clear them
            case.let("torch_", {"global": "torch"})
            case.call({"attr": ["m", "parameters"]}, let="params")
            case.call({"attr": ["torch_", "optim", "SGD"]}, {"ref": "params"}, let="opt", **sgd)
            case.let("batch", {"dict": {k: case.tensor(v) for k, v in batch.items()}})
            extra = {"label_smoothing": smoothing} if smoothing else {}
            case.call("train_step", {"ref": "m"}, {"ref": "batch"}, {"ref": "opt"}, clip_norm, record="loss",
                      **extra)
            case.record("training", {"attr": ["m", "training"]})
            case.data["before"] = _record_batches_after(case, "batch", batch)
            # what the step did to the weights follows the gradients of the student's own loss: "grad" names
            case.record("grad_params", {"new": VECTOR, "args": [{"ref": "m"}]})
            case.record("grad_norm", {"new": GRAD_NORM, "args": [{"ref": "m"}]})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            d = case.data
            _raised(result, case, "train_step")
            meta = result.meta(case.id, "loss")
            if meta.get("type") != "float":
                raise Fail(f"train_step should return the loss as a Python float (loss.item()), got "
                           f"{meta.get('type')} ({case.desc}): a tensor would keep the step's graph alive.")
            loss = float(result.get(case.id, "loss", what="train_step's loss"))
            want_loss, want_params = _reference_step(d)
            judges.scalar(loss, want_loss, "the loss train_step returned", case.desc,
                          "The model reads shift_right(tgt_ids, BOS) with src_is_real; sequence_loss(logits, "
                          "tgt_ids, PAD, label_smoothing) scores it; return it before the update.")
            if not bool(result.get(case.id, "training", what="model.training")):
                raise Fail(f"train_step left the model in eval mode ({case.desc}): leave its mode as it is.")
            judges.unchanged(result, case.id, d["before"], "train_step")
            got = result.get(case.id, "grad_params", what="the parameters after the step", kind="tensor",
                             dtype="float", shape=want_params.shape)
            if not np.allclose(got, want_params, rtol=1e-4, atol=1e-6):
                variants = {
                    "the parameters of a step with unclipped gradients: call torch.nn.utils.clip_grad_norm_("
                    "model.parameters(), clip_norm) after loss.backward() and before optimizer.step()":
                        _reference_step(d, clip=False)[1],
                    "the parameters of a step with the stale gradients of an earlier step added in: call "
                    "optimizer.zero_grad() before loss.backward()": _reference_step(d, zero_grad=False)[1],
                }
                hint = judges.diagnose(got, variants, rtol=1e-4, atol=1e-6) or (
                    "Clear old gradients, backward, clip to clip_norm, then exactly one optimizer.step().")
                raise Fail(f"the parameters after train_step are not those of one reference step on a case with "
                           f"{case.desc}. {hint}")
            norm = float(result.get(case.id, "grad_norm", what="the gradient norm after the step"))
            if norm > d["clip_norm"] * (1 + 1e-4) + 1e-6:
                raise Fail(f"after train_step the gradients' joint norm exceeds clip_norm ({case.desc}): clip them "
                           "with torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm) before the step.")


# -- validation_loss: find the bug (autograder.course.bugs), judged relative to the student's shift_right, sequence_loss
# --
def _batch_losses(state: dict, batches: list[dict]) -> list[tuple[float, int, int, int]]:
    """Per batch, with PyTorch's own loss on the eval-mode model: (sum of the real tokens' losses, real tokens,
    sequences, positions)."""
    model = _model(LOSS_MODEL, state=state).eval()
    rows = []
    with torch.no_grad():
        for batch in batches:
            tgt = torch.from_numpy(batch["tgt_ids"])
            decoder_in = torch.cat([torch.full((tgt.shape[0], 1), BOS), tgt[:, :-1]], dim=1)  # (B, T)
            logits = model(torch.from_numpy(batch["src_ids"]), decoder_in, torch.from_numpy(batch["src_is_real"]))
            total = F.cross_entropy(logits.transpose(1, 2).double(), tgt, ignore_index=PAD, reduction="sum")
            rows.append((total.item(), int((tgt != PAD).sum()), tgt.shape[0], tgt.numel()))
    return rows


@exercise(LESSON, "validation_loss")
class ValidationLoss(Exercise):
    """The given loop runs the student's shift_right and sequence_loss; the shown bug averages the batches' losses.
    Against PyTorch's own loss summed over every real token of the set (batches of different sizes, a small last
    one, short and long targets), a model with dropout left in train mode; the mode put back, the batches
    unchanged; known wrong averages named."""

    uses = ("shift_right", "sequence_loss")
    reference = ref_training
    AGAIN = "one"  # the case called twice on the same batch: dropout left on would change the value

    def cases(self, rng):
        rows = [  # (id, situation, each batch's (B, S, T))
            ("sizes", "3 batches of 4, 4 and 2 sequences (a small last batch), targets of different lengths",
             [(4, 6, 6), (4, 5, 5), (2, 4, 7)]),
            ("buckets", "2 batches of 3 sequences, one of short targets and one of long ones (batches grouped by "
                        "length)", [(3, 5, 2), (3, 6, 9)]),
            ("one", "a single batch of 3 sequences", [(3, 6, 6)]),
        ]
        cases = []
        for case_id, what, shapes in rows:
            state = _weights(LOSS_MODEL, rng)
            batches = [_batch(rng, B, S, T) for B, S, T in shapes]
            case = Case(case_id, f"{what}, a 1-layer model with dropout 0.3 in train mode",
                        data={"state": state, "batches": batches})
            _student_model(case, LOSS_MODEL, state)
            case.let("batches", {"list": [{"dict": {k: case.tensor(v) for k, v in b.items()}} for b in batches]})
            for name in ("loss", "again") if case_id == self.AGAIN else ("loss",):
                case.call("validation_loss", {"ref": "m"}, {"ref": "batches"}, record=name)
            case.record("training", {"attr": ["m", "training"]})
            case.data["before"] = _record_batches_after(case, "batches", batches)
            cases.append(case)
        return cases

    def judge(self, result: Result):
        what = "validation_loss(...)"
        for case in result.cases.values():
            _raised(result, case, "validation_loss", "\nIt runs your shift_right and sequence_loss: if one of "
                                                     "their checks fails, fix it first.")
        case = result.cases[self.AGAIN]
        first, again = (float(result.get(case.id, name, what=what, kind="any", dtype="float", shape=()))
                        for name in ("loss", "again"))
        if abs(first - again) > 1e-6 * (1 + abs(first)):
            raise Fail(f"two calls on the same batch gave different losses ({case.desc}): dropout is acting. "
                       "Evaluate in eval mode (model.eval()), then put back the mode the model had.")
        for case in result.cases.values():
            d = case.data
            got = float(result.get(case.id, "loss", what=what, kind="any", dtype="float", shape=()))
            rows = _batch_losses(d["state"], d["batches"])
            sums, reals, seqs, cells = (np.array(column, dtype=np.float64) for column in zip(*rows, strict=True))
            want = float(sums.sum() / max(reals.sum(), 1))
            means = sums / np.maximum(reals, 1)  # each batch's own loss
            mistakes = {
                "the mean of the batches' losses: every batch weighs the same, whatever number of real tokens "
                "it holds": float(means.mean()),
                "the batches' losses weighted by their number of sequences: a long target's tokens count less "
                "than a short one's": float((means * seqs).sum() / seqs.sum()),
                "the batches' losses weighted by all their B × T positions: padded positions count":
                    float((means * cells).sum() / cells.sum()),
            }
            hint = judges.diagnose(got, {m: v for m, v in mistakes.items() if abs(v - want) > 1e-4},
                                   rtol=1e-5, atol=1e-5) or (
                "The loss of the whole set is the sum of every real token's loss divided by the number of real "
                "tokens, whichever batch each sits in; the model runs in eval mode.")
            judges.scalar(got, want, what, case.desc, hint)
            if not bool(result.get(case.id, "training", what="model.training")):
                raise Fail(f"validation_loss left the model in eval mode ({case.desc}): put back the mode it "
                           "found (model.train(was_training)).")
            judges.unchanged(result, case.id, d["before"], "validation_loss")
