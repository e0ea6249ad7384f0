"""Hidden checks of lesson 06-model (PyTorch): positional encodings, the decoder stack, the whole model.

Each item is graded apart from the others where the contract allows it:

- ``PositionalEncoding`` gets its table loaded into the buffer ``pe`` (a state dict), so its ``forward`` is judged
  apart from ``sinusoidal_table``; its default table may be the reference's or the student's own table.
- ``Decoder`` is built from the notebook's given ``DecoderLayer`` and compared with PyTorch's own
  ``nn.TransformerDecoder`` carrying the same weights.
- ``sinusoidal_table`` and ``EncoderLayer`` are specs (``decoder_course/visible/l06_model.py``): the table by its
  properties and the reference's values; the layer loads a state dict by the contract's names and is compared
  with PyTorch's own ``nn.TransformerEncoderLayer`` carrying the same weights (its attention and feed-forward are
  the notebook's given blocks, so it stands on its own).
- ``Seq2SeqTransformer`` loads a whole state dict (the positional table included) and is compared with the same
  computation done by PyTorch's own modules (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoder``). It calls
  the student's ``PositionalEncoding``, ``EncoderLayer`` (inside the given ``Encoder``) and ``Decoder``, as the
  contract says: it is judged relative to their answers (``uses``, :mod:`autograder.checks.relative`), so a wrong
  one costs only its own item.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from autograder.checks import judges, spec
from autograder.checks.framework import Case, Exercise, Fail, Raised, Result, exercise, expect_close
from autograder.checks.l05_decoder_layer import (
    _blocked,
    _torch_layer,
)
from autograder.reference import model as ref
from autograder.reference.masks import causal_mask
from decoder_course import twins
from decoder_course.visible import l06_model as visible

LESSON = "06-model"


# -- sinusoidal_table: a spec (decoder_course.visible.l06_model), its mistakes named by its mutants ---------
spec.register(LESSON, visible.SPECS, ref)


def _table(max_len: int, D: int) -> np.ndarray:
    """The reference's table (tests/test_reference_model.py proves it is the paper's formula)."""
    return ref.sinusoidal_table(max_len, D).numpy()


# -- EncoderLayer: a spec (decoder_course.visible.l06_model), registered with sinusoidal_table above ------------
def _torch_encoder_layer(state: dict, H: int, F: int, norm_first: bool) -> nn.TransformerEncoderLayer:
    """PyTorch's own encoder layer (float64, eval) carrying the weights of a contract state dict."""
    return twins.torch_twin(state, "encoder", H, d_ff=F, norm_first=norm_first, dtype=torch.float64)


# -- Decoder ---------------------------------------------------------------------------------------------------
def _torch_stack(state: dict, D: int, H: int, F: int, N: int, norm_first: bool) -> nn.TransformerDecoder:
    """PyTorch's own nn.TransformerDecoder (float64, eval) of twin layers carrying a contract state dict."""
    layers = [_torch_layer({key.removeprefix(f"layers.{i}."): value for key, value in state.items()
                            if key.startswith(f"layers.{i}.")}, H, F, norm_first) for i in range(N)]
    theirs = nn.TransformerDecoder(layers[0], num_layers=N, norm=nn.LayerNorm(D) if norm_first else None)
    theirs.layers = nn.ModuleList(layers)  # each layer its own weights
    if norm_first:
        theirs.norm.load_state_dict({k: torch.from_numpy(state[f"norm.{k}"].astype(np.float64))
                                     for k in ("weight", "bias")})
    return theirs.double().eval()


# Decoder: a spec (decoder_course.visible.l06_model), registered with sinusoidal_table above


# -- Seq2SeqTransformer ----------------------------------------------------------------------------------------
PRE = {"V_src": 11, "V_tgt": 13, "D": 16, "H": 4, "F": 24, "N": 2, "norm_first": True, "tie": True, "scale": False,
       "max_len": 32}  # the pre-LN model both model items are judged on


def _model_sizes(cfg: dict, B: int, S: int, T: int) -> str:
    """A case's sizes and settings, as its description shows them."""
    return (f"B={B}, S={S}, T={T}, src_vocab={cfg['V_src']}, tgt_vocab={cfg['V_tgt']}, D={cfg['D']}, H={cfg['H']}, "
            f"F={cfg['F']}, n_layers={cfg['N']}, {'pre' if cfg['norm_first'] else 'post'}-LN, "
            f"{'tied' if cfg['tie'] else 'untied'}{', scale_embedding=True' if cfg['scale'] else ''}")


def _model_state(rng: np.random.Generator, cfg: dict) -> dict[str, np.ndarray]:
    """A random state dict with the contract's names, made by the reference model (names only) and rng."""
    torch.manual_seed(int(rng.integers(2**31)))
    model = ref.Seq2SeqTransformer(cfg["V_src"], cfg["V_tgt"], cfg["D"], cfg["H"], cfg["F"], cfg["N"],
                                   dropout=0.1, tie_weights=cfg["tie"], norm_first=cfg["norm_first"],
                                   max_len=cfg["max_len"], scale_embedding=cfg["scale"])
    state = {}
    for key, value in model.state_dict().items():
        if key == "pos_encoding.pe":
            state[key] = _table(cfg["max_len"], cfg["D"])
        elif key.endswith(("norm1.weight", "norm2.weight", "norm3.weight", "norm.weight")):
            state[key] = (1.0 + rng.normal(0.0, 0.3, value.shape)).astype(np.float32)  # not the identity
        elif key == "out_proj.weight" and cfg["tie"]:
            continue  # the tied matrix is tgt_embed.weight, set below
        elif value.dim() == 2 and "embed" not in key:
            state[key] = rng.normal(0.0, 1.0 / math.sqrt(value.shape[1]), value.shape).astype(np.float32)
        elif value.dim() == 2:
            state[key] = rng.normal(0.0, 1.0, value.shape).astype(np.float32)  # nn.Embedding's N(0, 1)
        else:
            state[key] = rng.normal(0.0, 0.2, value.shape).astype(np.float32)
    if cfg["tie"]:
        state["out_proj.weight"] = state["tgt_embed.weight"]  # one matrix: both names load the same values
    return state


def _torch_logits(state: dict, cfg: dict, src_ids, tgt_ids, src_is_real, tgt_is_real, *,
                  scale: bool | None = None, use_tgt_mask: bool = True) -> np.ndarray:
    """The model's logits computed with PyTorch's own modules (float64) from a contract state dict."""
    D, H, F, N, norm_first = cfg["D"], cfg["H"], cfg["F"], cfg["N"], cfg["norm_first"]
    factor = math.sqrt(D) if (cfg["scale"] if scale is None else scale) else 1.0
    w = {key: torch.from_numpy(np.asarray(value, np.float64)) for key, value in state.items()}
    pe = w["pos_encoding.pe"]
    src, tgt = torch.from_numpy(src_ids).long(), torch.from_numpy(tgt_ids).long()
    S, T = src.shape[1], tgt.shape[1]
    enc_layers = [_torch_encoder_layer({k.removeprefix(f"encoder.layers.{i}."): np.asarray(v) for k, v in state.items()
                                        if k.startswith(f"encoder.layers.{i}.")}, H, F, norm_first) for i in range(N)]
    decoder = _torch_stack({k.removeprefix("decoder."): v.numpy() for k, v in w.items() if k.startswith("decoder.")},
                           D, H, F, N, norm_first)
    src_pad, tgt_pad = _blocked(src_is_real), _blocked(tgt_is_real if use_tgt_mask else None)  # PyTorch's polarity
    with torch.no_grad():
        x = w["src_embed.weight"][src] * factor + pe[:S]  # (B, S, D)
        for layer in enc_layers:
            x = layer(x, src_key_padding_mask=src_pad)
        if norm_first:
            x = nn.functional.layer_norm(x, (D,), w["encoder.norm.weight"], w["encoder.norm.bias"])
        y = w["tgt_embed.weight"][tgt] * factor + pe[:T]  # (B, T, D)
        y = decoder(y, x, tgt_mask=_blocked(causal_mask(T)), tgt_key_padding_mask=tgt_pad,
                    memory_key_padding_mask=src_pad)
        logits = y @ w["out_proj.weight"].T + w["out_proj.bias"]  # (B, T, V)
    return logits.numpy()


def _right_padded(rng: np.random.Generator, B: int, n: int, min_pads: int) -> np.ndarray:
    """judges.right_padded (row 0 unpadded, every other row padded), row 1 with at least ``min_pads`` pads."""
    is_real = judges.right_padded(rng, B, n)
    is_real[1, n - min_pads:] = False
    return is_real


def _build_model(case: Case, cfg: dict, state: dict | None, dropout: float = 0.1) -> None:
    """Steps building the student's ``Seq2SeqTransformer`` as ``m``, loading ``state`` and switching to eval."""
    case.call("Seq2SeqTransformer", cfg["V_src"], cfg["V_tgt"], cfg["D"], cfg["H"], cfg["F"], cfg["N"],
              dropout=dropout, tie_weights=cfg["tie"], norm_first=cfg["norm_first"], max_len=cfg["max_len"],
              scale_embedding=cfg["scale"], let="m")
    if state is not None:  # the names inside the student's own PositionalEncoding, layers and Decoder are theirs
        case.load_state("m", state, lenient=("pos_encoding.", "encoder.layers.", "decoder."))
    case.eval("m")


def _model_forward(case: Case, src, tgt, src_is_real, tgt_is_real, record: str = "out") -> None:
    """``m(src_ids, tgt_ids, src_is_real=..., tgt_is_real=...)``, the ids bound as ``src_ids`` and ``tgt_ids``."""
    case.let("src_ids", case.tensor(src))
    case.let("tgt_ids", case.tensor(tgt))
    case.method("m", "forward", {"ref": "src_ids"}, {"ref": "tgt_ids"}, record=record,
                **{name: None if mask is None else case.tensor(mask)
                   for name, mask in (("src_is_real", src_is_real), ("tgt_is_real", tgt_is_real))})


@exercise(LESSON, "Seq2SeqTransformer")
class Seq2SeqTransformerCheck(Exercise):
    """Logits against PyTorch's own encoder and decoder modules with the same weights (pre-LN tied with both
    padding masks; post-LN untied with sqrt(D) scaling, B = 1, T > S, no masks); the future and source padding
    do not leak; tied weights share one storage, untied ones do not; dropout reaches the model; inputs
    unchanged."""

    # the model is built from the lesson's own pieces, not from PyTorch's
    forbidden = ("nn.Transformer", "nn.TransformerDecoder", "nn.TransformerDecoderLayer", "nn.TransformerEncoder",
                 "nn.TransformerEncoderLayer")
    # it calls the student's PositionalEncoding, EncoderLayer (inside the given Encoder) and Decoder
    uses = ("PositionalEncoding", "EncoderLayer", "Decoder")
    reference = ref

    def cases(self, rng):
        B, S, T = 3, 7, 5
        state = _model_state(rng, PRE)
        src_is_real, tgt_is_real = _right_padded(rng, B, S, 2), _right_padded(rng, B, T, 2)
        src, tgt = judges.token_ids(rng, B, S, PRE["V_src"], src_is_real), judges.token_ids(rng, B, T, PRE["V_tgt"],
                                                                                           tgt_is_real)
        tgt_full = judges.token_ids(rng, B, T, PRE["V_tgt"])
        t0 = int(rng.integers(0, T - 1))
        tgt_future = tgt_full.copy()
        tgt_future[:, t0 + 1:] = (tgt_full[:, t0 + 1:] - 3 + rng.integers(1, PRE["V_tgt"] - 3, (B, T - t0 - 1))) \
            % (PRE["V_tgt"] - 3) + 3  # other ids at positions > t0
        src_pad = np.where(src_is_real, src, rng.integers(3, PRE["V_src"], (B, S)))  # new ids under the pads
        # post-LN, untied, sqrt(D) scaling, B = 1, T > S, no masks at all
        post = {"V_src": 9, "V_tgt": 7, "D": 12, "H": 3, "F": 20, "N": 1, "norm_first": False, "tie": False,
                "scale": True, "max_len": 16}
        sizes = _model_sizes(PRE, B, S, T)
        rows = [  # id, situation, cfg, weights, src ids, tgt ids, src is_real, tgt is_real
            ("pre", f"{sizes}, source and target padding", PRE, state, src, tgt, src_is_real, tgt_is_real),
            ("pre_srcpad", f"{sizes}, source and target padding, padded source ids changed", PRE, state, src_pad, tgt,
             src_is_real, tgt_is_real),
            ("pre_causal", f"{sizes}, source padding, tgt_is_real=None", PRE, state, src, tgt_full, src_is_real, None),
            ("pre_future", f"{sizes}, source padding, tgt_is_real=None, target ids after a position changed", PRE,
             state, src, tgt_future, src_is_real, None),
            ("post", f"{_model_sizes(post, 1, 4, 6)}, no masks", post, _model_state(rng, post),
             judges.token_ids(rng, 1, 4, post["V_src"]), judges.token_ids(rng, 1, 6, post["V_tgt"]), None, None),
        ]
        cases = []
        for case_id, desc, cfg, weights, s, t, s_real, t_real in rows:
            case = Case(case_id, desc, data={"cfg": cfg, "state": weights, "src": s, "tgt": t, "src_is_real": s_real,
                                             "tgt_is_real": t_real, "t0": t0})
            _build_model(case, cfg, weights)
            _model_forward(case, s, t, s_real, t_real)
            if case_id == "pre":
                judges.record_after(case, ("src_ids", "tgt_ids"))
            if case_id in ("pre", "post"):  # tied weights share one storage, untied ones do not
                for name, module in (("ptr_out", "out_proj"), ("ptr_embed", "tgt_embed")):
                    case.call({"attr": ["m", module, "weight", "data_ptr"]}, record=name)
            cases.append(case)

        # dropout: training mode differs from eval mode
        # random initial weights (no state loaded): judged by its properties only, never against a replay
        case = Case("train", f"{sizes}, dropout=0.5, training mode then eval mode", data={"tgt": tgt},
                    relative=False)
        _build_model(case, PRE, None, dropout=0.5)
        case.steps.append({"train": "m"})
        case.seed(int(rng.integers(2**31)))
        _model_forward(case, src, tgt, src_is_real, tgt_is_real, record="out_train")
        case.eval("m")
        _model_forward(case, src, tgt, src_is_real, tgt_is_real, record="out_eval")
        cases.append(case)
        return cases

    def judge(self, result: Result):
        for case_id in ("pre", "post"):
            error = result.error(case_id)
            if error is not None and "state_dict" in error:
                raise Fail("the model could not load weights by the contract's names (src_embed, tgt_embed, "
                           "pos_encoding, encoder, decoder, out_proj; the table is the buffer pos_encoding.pe): "
                           f"{error.splitlines()[-1][:300]}")
        outs = {case_id: result.get(case_id, "out", what="the logits", kind="tensor", dtype="float",
                                    shape=result.cases[case_id].data["tgt"].shape
                                    + (result.cases[case_id].data["cfg"]["V_tgt"],))
                for case_id in ("pre", "pre_srcpad", "pre_causal", "pre_future", "post")}
        # leakage first: it names the idea that broke more precisely than a value mismatch
        future = result.cases["pre_future"]
        t0 = future.data["t0"]
        judges.leak(outs["pre_causal"][:, : t0 + 1], outs["pre_future"][:, : t0 + 1],
                    f"the logits at positions <= {t0} changed when only target tokens after position {t0} changed "
                    f"({future.desc}): the future leaks. decode must give the decoder a causal self-attention mask, "
                    "also when tgt_is_real is None.")
        judges.leak(outs["pre"], outs["pre_srcpad"],
                    f"the logits changed when only padded source tokens changed ({result.cases['pre_srcpad'].desc}): "
                    "build cross_allowed from src_is_real, (B, 1, 1, S), and pass it to the decoder (the encoder "
                    "gets src_is_real too).")
        for case_id in ("pre", "pre_causal", "post"):
            case = result.cases[case_id]
            d = case.data
            args = (d["state"], d["cfg"], d["src"], d["tgt"], d["src_is_real"], d["tgt_is_real"])
            candidates = {
                ("embeddings multiplied by sqrt(D) although scale_embedding is False (the default follows "
                 "this course, not the paper)" if not d["cfg"]["scale"] else
                 "embeddings not multiplied by sqrt(D) although scale_embedding=True"):
                    _torch_logits(*args, scale=not d["cfg"]["scale"]),
                "a decoder that ignores tgt_is_real: padded target keys must be blocked too (causal & tgt_is_real "
                "on the key axis)": None if d["tgt_is_real"] is None else _torch_logits(*args, use_tgt_mask=False),
            }
            hint = judges.diagnose(outs[case_id], candidates) or (
                "Expected out_proj(decoder(tgt_embed(tgt) * embed_scale + positions, memory, causal & target "
                "padding, source padding)), with memory = encoder(src_embed(src) * embed_scale + positions, "
                "src_is_real).")
            expect_close(outs[case_id], _torch_logits(*args), "the model's logits (vs PyTorch's own modules with the "
                         "same weights)", case.desc, hint=hint, rtol=1e-4, atol=1e-4)
        pre = result.cases["pre"].data
        judges.unchanged(result, "pre", {"src_ids": pre["src"], "tgt_ids": pre["tgt"]}, "the model")
        for case_id, tied in (("pre", True), ("post", False)):
            same = int(result.get(case_id, "ptr_out", what="out_proj.weight.data_ptr()")) == int(
                result.get(case_id, "ptr_embed", what="tgt_embed.weight.data_ptr()"))
            if tied and not same:
                raise Fail("with tie_weights=True, out_proj.weight and tgt_embed.weight are separate tensors: tie "
                           "them by assigning the parameter, self.out_proj.weight = self.tgt_embed.weight.")
            if not tied and same:
                raise Fail("with tie_weights=False, out_proj.weight and tgt_embed.weight share their storage: tie "
                           "only when tie_weights is True.")
        # one eval-mode call: whether eval mode is deterministic is the building blocks' check (their own cells)
        judges.dropout(result, "train", "the model", result.cases["train"].data["tgt"].shape + (PRE["V_tgt"],),
                       "in the positional encoding, the encoder and the decoder: pass dropout to each",
                       evals=("out_eval", "out_eval"))


# -- logits_from_ids: find the bug (autograder.bugs), judged relative to the student's model -------------------
def _reference_logits(d: dict, encode_mask: str | None, decode_src: str | None, decode_tgt: str | None) -> np.ndarray:
    """The reference model's logits (float64) with the case's weights, each mask chosen by name: "real" (ids !=
    pad_id), "pad" (ids == pad_id, the polarity flipped) or None: the outputs of recognisable mistakes."""
    cfg = d["cfg"]
    model = ref.Seq2SeqTransformer(cfg["V_src"], cfg["V_tgt"], cfg["D"], cfg["H"], cfg["F"], cfg["N"], dropout=0.0,
                                   tie_weights=cfg["tie"], norm_first=cfg["norm_first"], max_len=cfg["max_len"],
                                   scale_embedding=cfg["scale"])
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

        src, tgt = ids(S, cfg["V_src"], src_real), ids(T, cfg["V_tgt"], tgt_real)
        case = Case(cid, f"{_model_sizes(cfg, B, S, T)}, pad_id={pad_id}, {situation}",
                    data={"cfg": cfg, "state": state, "src": src, "tgt": tgt, "pad_id": pad_id})
        _build_model(case, cfg, state)
        case.let("src_ids", case.tensor(src))
        case.let("tgt_ids", case.tensor(tgt))
        case.call("logits_from_ids", {"ref": "m"}, {"ref": "src_ids"}, {"ref": "tgt_ids"}, pad_id, record="out")
        judges.record_after(case, ("src_ids", "tgt_ids"))
        return case

    def cases(self, rng):
        post = {"V_src": 9, "V_tgt": 10, "D": 12, "H": 3, "F": 20, "N": 1, "norm_first": False, "tie": False,
                "scale": True, "max_len": 16}
        B, S, T = 3, 7, 5
        state = _model_state(rng, PRE)
        src_real, tgt_real = _right_padded(rng, B, S, 2), _right_padded(rng, B, T, 2)
        rows = [  # id, situation, cfg, weights, B, S, T, pad_id (never 0), source is_real, target is_real
            ("padded", "source and target padding", PRE, state, B, S, T, 4, src_real, tgt_real),
            ("source", "source padding only", PRE, state, B, S, T, 4, src_real, None),
            ("target", "target padding only", PRE, state, B, S, T, 4, None, tgt_real),
            ("none", "no padding at all", PRE, state, B, S, T, 4, None, None),
            ("post", "source and target padding", post, _model_state(rng, post), 2, 4, 6, 5,
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
                                shape=tgt.shape + (cfg["V_tgt"],))
            want = _torch_logits(d["state"], cfg, src, tgt, src != pad_id, tgt != pad_id)
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
