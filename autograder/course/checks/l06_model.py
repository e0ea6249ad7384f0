"""Hidden checks of lesson 06-model (PyTorch): positional encodings, the decoder stack, the whole model.

The exercises of this lesson are specs (``decoder_course/visible/l06_model.py``): the table by its properties and
the reference's values; ``PositionalEncoding`` with a random table loaded into its buffer ``pe`` (judged apart from
``sinusoidal_table``); ``EncoderLayer``, ``Decoder`` and ``Seq2SeqTransformer`` loading a state dict by the
contract's names, compared with PyTorch's own modules carrying the same weights. The model calls the student's
``PositionalEncoding``, ``EncoderLayer`` and ``Decoder``: it is judged relative to their answers (``uses``,
:mod:`autograder.course.checks.relative`), so a wrong one costs only its own item. ``logits_from_ids`` (find the bug) is
judged here, on the student's model, against the model's twin with masks made from ``pad_id``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.course.checks import judges, spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Raised, Result, expect_close
from autograder.course.reference import model as ref
from decoder_course.spec import Keyword
from decoder_course.visible import l06_model as visible

LESSON = "06-model"


PRE = {"src_vocab": 11, "tgt_vocab": 13, "d_model": 16, "n_heads": 4, "d_ff": 24, "n_layers": 2, "dropout": 0.1,
       "tie_weights": True, "norm_first": True, "max_len": 32}  # the pre-LN model logits_from_ids is judged on
POST = {"src_vocab": 9, "tgt_vocab": 10, "d_model": 12, "n_heads": 3, "d_ff": 20, "n_layers": 1, "dropout": 0.1,
        "tie_weights": False, "norm_first": False, "max_len": 16, "scale_embedding": True}


def _state(rng: np.random.Generator, init: dict) -> dict[str, np.ndarray]:
    """A random state dict of the model built with ``init`` (the spec's)."""
    return visible._model_state(rng, init, tie=init["tie_weights"], norm_first=init["norm_first"],
                                max_len=init["max_len"])


def _right_padded(rng: np.random.Generator, B: int, n: int, min_pads: int) -> np.ndarray:
    """judges.right_padded (row 0 unpadded, every other row padded), row 1 with at least ``min_pads`` pads."""
    is_real = judges.right_padded(rng, B, n)
    is_real[1, n - min_pads:] = False
    return is_real


# -- logits_from_ids: find the bug (autograder.course.bugs), judged relative to the student's model -------------------
def _reference_logits(d: dict, encode_mask: str | None, decode_src: str | None, decode_tgt: str | None) -> np.ndarray:
    """The reference model's logits (float64) with the case's weights, each mask chosen by name: "real" (ids !=
    pad_id), "pad" (ids == pad_id, the polarity flipped) or None: the outputs of recognisable mistakes."""
    model = ref.Seq2SeqTransformer(**d["cfg"])
    model.load_state_dict({k: torch.from_numpy(v) for k, v in d["state"].items()})
    model = model.double().eval()
    src, tgt = torch.from_numpy(d["src"]), torch.from_numpy(d["tgt"])
    masks = {"src": {"real": src != d["pad_id"], "pad": src == d["pad_id"], None: None},
             "tgt": {"real": tgt != d["pad_id"], "pad": tgt == d["pad_id"], None: None}}
    with torch.no_grad():
        memory = model.encode(src, masks["src"][encode_mask])
        return model.decode(tgt, memory, masks["src"][decode_src], masks["tgt"][decode_tgt]).numpy()


@exercise(LESSON, "logits_from_ids")
class LogitsFromIds(Exercise):
    """The given helper makes the padding masks from pad_id and calls the student's encode and decode; the shown
    bug gives decode no source padding. Judged against PyTorch's own modules with the same weights and the masks
    made from pad_id (pad_id != 0), on padded and unpadded batches, after checks that name the recognisable
    mistakes (a mask missing in decode or encode, the polarity flipped, pad_id ignored)."""

    # built on the student's model, and through it on their PositionalEncoding, EncoderLayer, Decoder (and the
    # table their PositionalEncoding makes): their mistakes cost their own cells
    uses = ("Seq2SeqTransformer", "PositionalEncoding", "EncoderLayer", "Decoder", "sinusoidal_table")
    reference = ref

    def _case(self, rng, cid, situation, cfg, state, B, S, T, pad_id, src_real, tgt_real):
        def ids(n, V, real):
            tokens = rng.integers(3, V - 1, size=(B, n))
            tokens = np.where(tokens >= pad_id, tokens + 1, tokens)  # real tokens in 3 .. V-1, never pad_id
            return tokens if real is None else np.where(real, tokens, pad_id)

        src, tgt = ids(S, cfg["src_vocab"], src_real), ids(T, cfg["tgt_vocab"], tgt_real)
        sizes = ", ".join(f"{name}={value}" for name, value in cfg.items())
        case = Case(cid, f"B={B}, S={S}, T={T}, {sizes}, pad_id={pad_id}, {situation}",
                    data={"cfg": cfg, "state": state, "src": src, "tgt": tgt, "pad_id": pad_id})
        spec._build(case, "Seq2SeqTransformer", {name: Keyword(value) for name, value in cfg.items()}, let="m")
        case.load_state("m", state, lenient=visible.SPECS["Seq2SeqTransformer"].lenient)
        case.eval("m")
        case.let("src_ids", case.tensor(src))
        case.let("tgt_ids", case.tensor(tgt))
        case.call("logits_from_ids", {"ref": "m"}, {"ref": "src_ids"}, {"ref": "tgt_ids"}, pad_id, record="out")
        judges.record_after(case, ("src_ids", "tgt_ids"))
        return case

    def cases(self, rng):
        B, S, T = 3, 7, 5
        state = _state(rng, PRE)
        src_real, tgt_real = _right_padded(rng, B, S, 2), _right_padded(rng, B, T, 2)
        rows = [  # id, situation, cfg, weights, B, S, T, pad_id (never 0), source is_real, target is_real
            ("padded", "source and target padding", PRE, state, B, S, T, 4, src_real, tgt_real),
            ("source", "source padding only", PRE, state, B, S, T, 4, src_real, None),
            ("target", "target padding only", PRE, state, B, S, T, 4, None, tgt_real),
            ("none", "no padding at all", PRE, state, B, S, T, 4, None, None),
            ("post", "source and target padding", POST, _state(rng, POST), 2, 4, 6, 5,
             _right_padded(rng, 2, 4, 1), _right_padded(rng, 2, 6, 2)),
        ]
        return [self._case(rng, *row) for row in rows]

    def judge(self, result: Result):
        what = "logits_from_ids"
        for case in result.cases.values():
            error = result.error(case.id)
            if error is not None and "size of tensor" in error:
                raise Raised(f"your code raised an exception on a case with {case.desc}:\n    "
                             f"{error.splitlines()[-1]}\nA mask of the wrong length? decode takes (tgt_ids, memory, "
                             "src_is_real, tgt_is_real), in that order: src_is_real is (B, S), tgt_is_real (B, T).")
            result.raise_if_error(case.id)
            d = case.data
            src, tgt, pad_id, cfg = d["src"], d["tgt"], d["pad_id"], d["cfg"]
            logits = result.get(case.id, "out", what=f"the logits of {what}", kind="tensor", dtype="float",
                                shape=tgt.shape + (cfg["tgt_vocab"],))
            given = {"src_ids": src, "tgt_ids": tgt, "src_is_real": src != pad_id, "tgt_is_real": tgt != pad_id}
            with torch.no_grad():
                want = visible._model_twin(cfg, {k: torch.from_numpy(v) for k, v in d["state"].items()},
                                           {k: torch.from_numpy(v) for k, v in given.items()}, False).numpy()
            if not np.allclose(logits, want, rtol=1e-4, atol=1e-4):
                for masks, why in (
                    (("real", None, "real"), "decodes without the source padding: the decoder's cross-attention "
                     "reads the padded memory positions. decode builds cross_allowed from the src_is_real it is "
                     "given, and from nothing else"),
                    ((None, "real", "real"), "encodes without the source padding: the encoder's self-attention "
                     "reads the padded source tokens, so every memory vector depends on them"),
                    (("real", "real", None), "decodes without the target padding: padded target keys are read"),
                    (("pad", "pad", "pad"), "makes masks that are True at the padding (ids == pad_id): is_real is "
                     "True for the real tokens"),
                    ((None, None, None), "ignores pad_id: the padding is masked nowhere"),
                ):
                    if np.allclose(logits, _reference_logits(d, *masks), rtol=1e-4, atol=1e-4):
                        raise Fail(f"{what} {why} ({case.desc}).")
            expect_close(logits, want, f"the logits of {what} (vs PyTorch's own modules, masks made from pad_id)",
                         case.desc, rtol=1e-4, atol=1e-4,
                         hint="The logits are model(src_ids, tgt_ids, src_is_real, tgt_is_real) with both masks "
                              "made from pad_id: encode gets the source padding, decode gets both.")
            judges.unchanged(result, case.id, {"src_ids": src, "tgt_ids": tgt}, what)
