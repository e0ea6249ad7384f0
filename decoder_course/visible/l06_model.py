"""Visible checks of lesson 06-model: positional encodings, the decoder stack and the whole encoder-decoder model.

The stack and the model are compared with PyTorch's own ``nn.TransformerDecoder`` carrying the student's own
weights (an independent implementation, not an answer key); the rest are properties any correct answer has: a
worked example of the table, the table is a buffer, the future and padding do not leak, tied weights share
one storage.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from decoder_course import twins
from decoder_course.checks import (
    CheckFailed,
    check,
    expect_close,
    expect_dtype,
    expect_finite,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    randomised,
)
from decoder_course.spec import Build, Keyword, ModuleSpec, Perturbed, Spec, run, run_module
from decoder_course.visible.l05_decoder_layer import WIRING, random_state, stack_twin

# -- sinusoidal_table ----------------------------------------------------------------------------------------
ODD_WIDTH = ("With an odd D the even features 0, 2, ..., D - 1 are (D + 1) // 2 sines and the odd features D // 2 "
             "cosines: the last pair has no cosine, so the cosines take angle[:, : D // 2].")


def _table_rows(rng: np.random.Generator) -> list:
    """A long table, small ones, max_len = 1 and an odd width (one sine more than cosines)."""
    sizes = [(int(rng.integers(40, 90)), 24), (9, 6), (1, 10), (int(rng.integers(200, 300)), 8),
             (int(rng.integers(5, 15)), int(rng.choice([5, 7, 9])))]
    return [(f"max_len={n}, D={D}", {"max_len": n, "d_model": D}) for n, D in sizes]


def _table_properties(args: dict, got: np.ndarray, desc: str) -> None:
    """Position 0 is (sin 0, cos 0) = (0, 1) in every pair; each full pair is the sine and cosine of one angle."""
    D, got = args["d_model"], got.astype(np.float64)
    first, odd = got[0], np.arange(D) % 2  # position 0 should be (sin 0, cos 0) = (0, 1) in every pair
    if not np.allclose(first, odd, atol=1e-5):
        if np.allclose(first, 1 - odd, atol=1e-5):
            why = "the sines and cosines are swapped: sines go on the even features 0, 2, 4, ..., cosines on the odd"
        elif D > 1 and np.allclose(first, np.arange(D) >= (D + 1) // 2, atol=1e-5):
            why = ("all sines come first, then all cosines: the paper interleaves them, sin on features 0::2 and cos "
                   "on 1::2")
        else:
            why = "is position 0 the first row? The angle pos / 10000^(2i/D) is 0 there"
        raise CheckFailed(f"row 0 (position 0) should be 0 on the even features (sin 0) and 1 on the odd ones "
                          f"(cos 0) ({desc}): {why}")
    sin, cos = got[:, 0 : 2 * (D // 2) : 2], got[:, 1::2]  # (max_len, D // 2) each: the full pairs
    if not np.allclose(sin**2 + cos**2, 1.0, atol=1e-4):
        raise CheckFailed(f"features 2i and 2i+1 are not the sine and cosine of one angle: sin² + cos² ≠ 1 "
                          f"({desc}). The frequency belongs to the pair, 1 / 10000^(2i/D), shared by both of its "
                          "features (not one frequency per feature)")


SPECS = {
    "sinusoidal_table": Spec(
        "sinusoidal_table", _table_rows, dtype=lambda a: np.float32, shape=lambda a: (a["max_len"], a["d_model"]),
        axes="max_len, D", properties=_table_properties, tensors=True, keeps_inputs=False, rtol=0.0, atol=2e-4,
        on_error=lambda args, error: ODD_WIDTH if args["d_model"] % 2 else "",
        hint="Feature 2i of position pos is sin(pos / 10000^(2i/D)) and feature 2i+1 the cosine of the same "
             "angle."),
}


def check_sinusoidal_table(sinusoidal_table) -> None:
    """The spec's cases, the worked example D = 4, the angle each pair turns by, an odd width."""
    run(SPECS["sinusoidal_table"], sinusoidal_table)
    with check("sinusoidal_table(3, 4) matches the worked example"):
        got = sinusoidal_table(3, 4)
        expect_type(got, torch.Tensor, "sinusoidal_table(3, 4)")
        expect_shape(got, (3, 4), "sinusoidal_table(3, 4)", names="max_len, D")
        expect_dtype(got, torch.float32, "sinusoidal_table(3, 4)")
        want = torch.tensor([
            [0.0, 1.0, 0.0, 1.0],  # position 0: sin 0 = 0, cos 0 = 1 in every pair
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],  # frequencies 1 and 1/100
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ])
        expect_close(got, want, "sinusoidal_table(3, 4)", atol=1e-5,
                     hint="feature 2i is sin(pos / 10000^(2i/D)) and feature 2i+1 the cos of the same angle: "
                          "sines on the even features, cosines on the odd ones, one frequency per pair")
    with check("sinusoidal_table(50, 16): pair i turns by 1 / 10000^(2i/D) radians per position"):
        table = sinusoidal_table(50, 16)
        expect_shape(table, (50, 16), "sinusoidal_table(50, 16)", names="max_len, D")
        expect_finite(table, "sinusoidal_table(50, 16)")
        sin, cos = table[:, 0::2].double(), table[:, 1::2].double()  # (max_len, D/2) each
        step = torch.atan2(sin[1], cos[1])  # (D/2,): the angle at position 1, read back from the pair
        want = torch.exp(torch.arange(0, 16, 2, dtype=torch.float64) * (-math.log(10000.0) / 16))
        expect_close(step, want, "the angle per position of each pair", atol=1e-5,
                     hint="pair i's frequency is 1 / 10000^(2i/D): the exponent counts features in steps of 2 "
                          "(0, 2, 4, ...) and is divided by D")
    with check("an odd width: sinusoidal_table(4, 5) has three sines and two cosines"):
        try:
            odd = sinusoidal_table(4, 5)
        except (RuntimeError, ValueError, IndexError) as exc:
            raise CheckFailed(f"sinusoidal_table(4, 5) raised {type(exc).__name__}: {exc}. {ODD_WIDTH}") from None
        expect_shape(odd, (4, 5), "sinusoidal_table(4, 5)", names="max_len, D")
        pos = torch.arange(4, dtype=torch.float64)[:, None]
        angle = pos / 10000.0 ** (torch.arange(0, 5, 2, dtype=torch.float64) / 5)  # (4, 3)
        want = torch.zeros(4, 5, dtype=torch.float64)
        want[:, 0::2], want[:, 1::2] = torch.sin(angle), torch.cos(angle[:, :2])
        expect_close(odd.double(), want, "sinusoidal_table(4, 5)", atol=1e-5,
                     hint="the exponent is 2i / D with D = 5 (not D - 1 or D + 1); sines on 0::2, cosines on 1::2")


# -- PositionalEncoding --------------------------------------------------------------------------------------
def _pe_rows(rng: np.random.Generator) -> list[Build]:
    """A random table loaded into the buffer pe (forward judged apart from sinusoidal_table): T < max_len with
    B > 1, T = max_len, B = T = 1, and dropout in training mode."""
    D, max_len = 12, int(rng.integers(15, 25))
    table = {"pe": rng.normal(0.0, 1.0, (max_len, D)).astype(np.float32)}
    rows = []
    for B, T, p, seed in ((3, int(rng.integers(4, max_len - 2)), 0.1, None), (2, max_len, 0.1, None), (1, 1, 0.1, None),
                          (4, max_len - 1, 0.5, int(rng.integers(2**31)))):
        x = rng.standard_normal((B, T, D)).astype(np.float32)
        rows.append(Build(f"B={B}, T={T}, D={D}, max_len={max_len}, dropout={p}, a table loaded into pe",
                          {"d_model": D, "max_len": Keyword(max_len), "dropout": Keyword(p)}, {"x": x},
                          state=table, seed=seed))
    return rows


def _pe_twin(init: dict, state: dict, inputs: dict, train: bool, early: bool = False) -> torch.Tensor:
    """dropout(x + pe[:T]), drawing the masks nn.Dropout draws on (B, T, D); ``early``: dropout(x) + pe[:T]."""
    x, pe = inputs["x"], state["pe"][: inputs["x"].shape[1]]  # (B, T, D), (T, D)
    p = init["dropout"] if train else 0.0
    return F.dropout(x, p) + pe if early else F.dropout(x + pe, p)


def _pe_variants(init: dict, state: dict, inputs: dict, train: bool = False) -> dict:
    p = init["dropout"] if train else 0.0
    with torch.random.fork_rng():  # the next wrong twin draws the very masks the module drew
        wrong = {"pe was not added: the output is x (with dropout)": F.dropout(inputs["x"], p)}
    if train:
        wrong["dropout acts on x before pe is added: apply it to the sum, dropout(x + pe[:T])"] = _pe_twin(
            init, state, inputs, train, early=True)
    return wrong


SPECS["PositionalEncoding"] = ModuleSpec(
    "PositionalEncoding", _pe_rows, _pe_twin, names="pe, the table, a buffer: self.register_buffer('pe', table)",
    dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape, axes="B, T, D", variants=_pe_variants,
    rtol=1e-5, atol=1e-5,
    facts=lambda init: (("pe", "buffer", "the table is fixed, not trained: store it with self.register_buffer('pe', "
                                         "table), not as an nn.Parameter"),),
    on_error=lambda args, error: ("x is (B, T, D): take the first T = x.shape[1] rows of pe, pe[:T] (T, D), which "
                                  "broadcasts over the batch" if "size" in error or "broadcast" in error else ""),
    hint="x + pe[:T] with T = x.shape[1], then dropout (nn.Dropout: active in training mode only); write "
         "`x + self.pe[:T]`, not `x += ...`.")


def check_positional_encoding(PositionalEncoding, sinusoidal_table=None) -> None:  # noqa: N803 - the class
    """The spec's rows (a table loaded into the buffer pe; dropout on the sum in training mode), then the table a
    new module holds: your ``sinusoidal_table``'s, when given."""
    run_module(SPECS["PositionalEncoding"], PositionalEncoding)
    if sinusoidal_table is not None:
        with check("PositionalEncoding(8, max_len=20) holds sinusoidal_table(20, 8) in pe"):
            expect_close(PositionalEncoding(8, max_len=20).pe, sinusoidal_table(20, 8), "pe", atol=1e-6,
                         hint="build pe with sinusoidal_table(max_len, d_model) in __init__")


# -- EncoderLayer --------------------------------------------------------------------------------------------
def _encoder_rows(rng: np.random.Generator) -> list[Build]:
    """Both LayerNorm placements with source padding (whose positions of x hold large values: read, they would
    show), the defaults on B = 1 without a mask, and dropout in training mode."""
    B, S, D, H, F_ = 3, 7, 16, 4, 24  # S != H, Dh = 4, F != D
    lengths = rng.integers(2, S, size=B)
    lengths[rng.integers(B)] = S  # one sequence unpadded
    is_real = np.arange(S)[None, :] < lengths[:, None]  # (B, S)
    x = rng.standard_normal((B, S, D)) * np.geomspace(0.3, 6.0, B)[rng.permutation(B)][:, None, None]
    x[~is_real] = rng.standard_normal((int((~is_real).sum()), D)) * 3.0
    x = x.astype(np.float32)

    def state(D, F_):
        return random_state(rng, D, F_, attention=("self_attn",), norms=("norm1", "norm2"))

    sizes = {"d_model": D, "n_heads": H, "d_ff": F_}
    rows = [Build(f"B={B}, S={S}, D={D}, H={H}, F={F_}, {WIRING[norm_first][0]}, source padding",
                  sizes | {"dropout": Keyword(0.1), "norm_first": Keyword(norm_first)},
                  {"x": x, "src_is_real": is_real}, state=state(D, F_)) for norm_first in (False, True)]
    rows.append(Build("B=1, S=5, D=12, H=3, F=20, the defaults (post-LN), src_is_real=None",
                      {"d_model": 12, "n_heads": 3, "d_ff": 20},
                      {"x": rng.standard_normal((1, 5, 12)).astype(np.float32)}, state=state(12, 20)))
    rows.append(Build(f"B={B}, S={S}, dropout=0.5", sizes | {"dropout": Keyword(0.5)}, {"x": x, "src_is_real": is_real},
                      state=state(D, F_), seed=int(rng.integers(2**31))))
    return rows


def _encoder_twin(init: dict, state: dict, inputs: dict, train: bool, causal: bool = False) -> torch.Tensor:
    """nn.TransformerEncoderLayer in float64 with the same weights; its masks are True where blocked."""
    theirs = twins.torch_twin(state, "encoder", init["n_heads"], d_ff=init["d_ff"],
                              norm_first=init.get("norm_first", False), dtype=torch.float64)
    x, is_real = inputs["x"].double(), inputs.get("src_is_real")
    future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1) if causal else None  # (S, S)
    return theirs(x, src_mask=future, src_key_padding_mask=None if is_real is None else ~is_real)


def _encoder_variants(init: dict, state: dict, inputs: dict, train: bool = False) -> dict:
    """The other LayerNorm placement, padding not masked, a causal mask."""
    norm_first = init.get("norm_first", False)
    wrong = {f"the wiring is {WIRING[not norm_first][0]} for norm_first={norm_first}: post-LN is x = norm(x + "
             "sublayer(x)), pre-LN x = x + sublayer(norm(x))":
             _encoder_twin(init | {"norm_first": not norm_first}, state, inputs, False)}
    if inputs.get("src_is_real") is not None:
        wrong["the padded keys are read: turn src_is_real (B, S) into allowed (B, 1, 1, S), on the key axis, and "
              "pass it to self_attn"] = _encoder_twin(init, state, {"x": inputs["x"]}, False)
    wrong["the self-attention is causal: the source is given in full, every real source token may read every "
          "other; no causal mask here"] = _encoder_twin(init, state, inputs, False, causal=True)
    return wrong


ENCODER_NAMES = "self_attn (q_proj, k_proj, v_proj, out_proj), feed_forward (linear1, linear2), norm1, norm2"
SPECS["EncoderLayer"] = ModuleSpec(
    "EncoderLayer", _encoder_rows, _encoder_twin, names=ENCODER_NAMES, dtype=lambda a: a["x"].dtype,
    shape=lambda a: a["x"].shape, axes="B, S, D", forbidden=("nn.TransformerEncoderLayer", "nn.TransformerEncoder"),
    variants=_encoder_variants, rtol=1e-4, atol=1e-4,
    dropout="inside the attention and the feed-forward (pass them dropout), and with dropout1 and dropout2 on their "
            "outputs",
    hint="self-attention on x with allowed = src_is_real[:, None, None, :] (the keys; no causal mask: the source "
         "is known in full), then the feed-forward; post-LN (norm_first=False): x = norm(x + sublayer(x)), pre-LN: "
         "x = x + sublayer(norm(x)); norm1 and dropout1 with the attention, norm2 and dropout2 with the "
         "feed-forward.")


def check_encoder_layer(EncoderLayer) -> None:  # noqa: N803 - the class under test
    """The spec's rows: the contract's names, nn.TransformerEncoderLayer with the same weights (both LayerNorm
    placements, padding, no mask), dropout in training only, the input unchanged."""
    run_module(SPECS["EncoderLayer"], EncoderLayer)


# -- Decoder -------------------------------------------------------------------------------------------------
def _stack_rows(rng: np.random.Generator) -> list[Build]:
    """Post-LN with causal + memory padding, pre-LN with target and memory padding (3 layers, distinct weights),
    one layer without masks on B = 1, and dropout in training mode."""
    B, T, S, D, H, F_, N = 2, 5, 7, 16, 4, 24, 3  # T != S != H, Dh = 4

    def padded(n):
        lengths = rng.integers(1, n, size=B)
        lengths[rng.integers(B)] = n
        return np.arange(n)[None, :] < lengths[:, None]  # (B, n): real tokens, then padding

    def state(D, F_, N, norm_first):
        layers = {f"layers.{i}.{key}": value for i in range(N) for key, value in random_state(rng, D, F_).items()}
        final = {"norm.weight": (1.0 + rng.normal(0.0, 0.3, D)).astype(np.float32),
                 "norm.bias": rng.normal(0.0, 0.3, D).astype(np.float32)} if norm_first else {}
        return layers | final

    def inputs(B, T, S, D):
        scale = np.geomspace(0.3, 6.0, B)[rng.permutation(B)][:, None, None]  # each sequence on its own scale
        return ((rng.standard_normal((B, T, D)) * scale).astype(np.float32),
                (rng.standard_normal((B, S, D)) * scale[::-1]).astype(np.float32))

    causal = np.tril(np.ones((T, T), bool))  # (T, T)
    sizes = {"d_model": D, "n_heads": H, "d_ff": F_, "n_layers": N}
    rows = []
    for norm_first, situation in ((False, "causal + memory padding"), (True, "causal + target and memory padding")):
        x, memory = inputs(B, T, S, D)
        self_allowed = causal[None, None] & padded(T)[:, None, None, :] if norm_first else causal  # (B, 1, T, T)
        cross_allowed = np.repeat(padded(S)[:, None, None, :], T, axis=2)  # (B, 1, T, S)
        rows.append(Build(f"B={B}, T={T}, S={S}, D={D}, H={H}, F={F_}, n_layers={N}, {WIRING[norm_first][0]}, "
                          f"{situation}", sizes | {"dropout": Keyword(0.1), "norm_first": Keyword(norm_first)},
                          {"x": x, "memory": memory, "self_allowed": self_allowed, "cross_allowed": cross_allowed},
                          state=state(D, F_, N, norm_first)))
    norm_first = bool(rng.integers(2))
    x, memory = inputs(1, 3, 6, 12)
    rows.append(Build(f"B=1, T=3, S=6, D=12, H=2, F=20, n_layers=1, {WIRING[norm_first][0]}, no masks",
                      {"d_model": 12, "n_heads": 2, "d_ff": 20, "n_layers": 1, "norm_first": Keyword(norm_first)},
                      {"x": x, "memory": memory}, state=state(12, 20, 1, norm_first)))
    x, memory = inputs(B, T, S, D)
    rows.append(Build(f"B={B}, T={T}, S={S}, n_layers=2, dropout=0.5", sizes | {"n_layers": 2, "dropout": 0.5},
                      {"x": x, "memory": memory}, state=state(D, F_, 2, True), seed=int(rng.integers(2**31))))
    return rows


def _stack_variants(init: dict, state: dict, inputs: dict, train: bool = False) -> dict:
    N, last = init["n_layers"], init["n_layers"] - 1
    wrong = {}
    if init.get("norm_first", True):
        wrong["the pre-LN stack has no final LayerNorm: nothing normalises the residual stream after the last "
              "layer, so self.norm = nn.LayerNorm(d_model)"] = stack_twin(init, state, inputs, False, final_norm=False)
    if N > 1:
        wrong["the stack is one layer, the first: each layer must read the previous layer's output (x = layer(x, "
              "...))"] = stack_twin(init, state, inputs, False, layers=[0])
        wrong["only the last layer counts: each layer must read the previous layer's output, not the stack's "
              "input x"] = stack_twin(init, state, inputs, False, layers=[last])
        wrong["every layer holds the last layer's weights: one layer object repeated n_layers times shares them; "
              "build n_layers separate DecoderLayer objects"] = stack_twin(init, state, inputs, False,
                                                                          layers=[last] * N)
    if inputs.get("cross_allowed") is not None:
        wrong["memory padding leaks: pass cross_allowed to every layer"] = stack_twin(init, state, inputs, False,
                                                                                      masked_memory=False)
    return wrong


def _stack_names(init: dict) -> str:
    N = init["n_layers"]
    final = ("norm (the final nn.LayerNorm a pre-LN stack needs)" if init.get("norm_first", True) else
             "no norm parameters (post-LN layers end normalised: self.norm = nn.Identity())")
    return f"layers.0 .. layers.{N - 1} (an nn.ModuleList of {N} DecoderLayer objects, by their names), {final}"


SPECS["Decoder"] = ModuleSpec(
    "Decoder", _stack_rows, stack_twin, names=_stack_names, dtype=lambda a: a["x"].dtype,
    shape=lambda a: a["x"].shape, axes="B, T, D", forbidden=("nn.TransformerDecoder", "nn.TransformerDecoderLayer"),
    variants=_stack_variants, rtol=1e-4, atol=1e-4, dropout="in the layers: pass dropout to them",
    hint="run the layers in order, each on the previous layer's output, all with the same memory and masks; then "
         "self.norm (a LayerNorm for pre-LN, nn.Identity() for post-LN).")


def check_decoder(Decoder) -> None:  # noqa: N803 - the class under test
    """The spec's rows: nn.TransformerDecoder with the same weights (both LayerNorm placements, masks, one layer),
    the final norm by the contract's names, dropout in training only, inputs unchanged."""
    run_module(SPECS["Decoder"], Decoder)


# -- Seq2SeqTransformer --------------------------------------------------------------------------------------
def _model_state(rng: np.random.Generator, init: dict, tie: bool, norm_first: bool, max_len: int) -> dict:
    """A random state dict by the contract's names (a random table in pos_encoding.pe: the model is judged apart
    from sinusoidal_table); tied: out_proj.weight holds tgt_embed.weight's values."""
    V_src, V, D, F_, N = (init[k] for k in ("src_vocab", "tgt_vocab", "d_model", "d_ff", "n_layers"))

    def norm(name):
        return {f"{name}.weight": (1.0 + rng.normal(0.0, 0.3, D)), f"{name}.bias": rng.normal(0.0, 0.3, D)}

    state = {f"encoder.layers.{i}.{k}": v for i in range(N)
             for k, v in random_state(rng, D, F_, attention=("self_attn",), norms=("norm1", "norm2")).items()}
    state |= {f"decoder.layers.{i}.{k}": v for i in range(N) for k, v in random_state(rng, D, F_).items()}
    state |= (norm("encoder.norm") | norm("decoder.norm")) if norm_first else {}
    state |= {"src_embed.weight": rng.normal(0.0, 1.0, (V_src, D)), "tgt_embed.weight": rng.normal(0.0, 1.0, (V, D)),
              "pos_encoding.pe": rng.normal(0.0, 1.0, (max_len, D)), "out_proj.bias": rng.normal(0.0, 0.2, V)}
    state["out_proj.weight"] = state["tgt_embed.weight"] if tie else rng.normal(0.0, 1.0 / math.sqrt(D), (V, D))
    return {key: np.asarray(value, np.float32) for key, value in state.items()}


def _model_rows(rng: np.random.Generator) -> list[Build]:
    """Pre-LN, tied, with source and target padding (padded source ids changed: nothing may move), without target
    padding (target ids after a position changed: the logits before it may not move), post-LN untied with
    scale_embedding on B = 1 without masks, and dropout in training mode."""
    B, S, T, max_len = 3, 7, 5, 32
    pre = {"src_vocab": 11, "tgt_vocab": 13, "d_model": 16, "n_heads": 4, "d_ff": 24, "n_layers": 2}
    kw = {"dropout": Keyword(0.1), "tie_weights": Keyword(True), "norm_first": Keyword(True),
          "max_len": Keyword(max_len)}
    state = _model_state(rng, pre, tie=True, norm_first=True, max_len=max_len)

    def padded(n):
        lengths = rng.integers(n - 2, n, size=B)
        lengths[rng.integers(B)] = n  # one sequence unpadded
        return np.arange(n)[None, :] < lengths[:, None]  # (B, n): real tokens, then padding

    def ids(shape, V):
        return rng.integers(3, V, shape).astype(np.int64)

    src_real, tgt_real = padded(S), padded(T)
    src, tgt = ids((B, S), pre["src_vocab"]) * src_real, ids((B, T), pre["tgt_vocab"]) * tgt_real  # pads: id 0
    t0 = int(rng.integers(0, T - 1))
    future = tgt.copy()
    future[:, t0 + 1:] = (tgt[:, t0 + 1:] + rng.integers(1, pre["tgt_vocab"] - 1, (B, T - t0 - 1))) % pre["tgt_vocab"]
    sizes = f"B={B}, S={S}, T={T}, src_vocab=11, tgt_vocab=13, D=16, H=4, F=24, n_layers=2, pre-LN, tied"
    inputs = {"src_ids": src, "tgt_ids": tgt, "src_is_real": src_real, "tgt_is_real": tgt_real}
    src_moved = np.where(src_real, src, ids((B, S), pre["src_vocab"]))  # other ids under the pads
    post = {"src_vocab": 9, "tgt_vocab": 7, "d_model": 12, "n_heads": 3, "d_ff": 20, "n_layers": 1}
    return [
        Build(f"{sizes}, source and target padding", pre | kw, inputs, state=state,
              perturbed=Perturbed(inputs | {"src_ids": src_moved}, lambda out: out,
                                  "it changed when only padded source tokens changed: build cross_allowed from "
                                  "src_is_real, (B, 1, 1, S), and pass it to the decoder (the encoder gets "
                                  "src_is_real too)")),
        Build(f"{sizes}, source padding, tgt_is_real=None", pre | kw,
              {"src_ids": src, "tgt_ids": tgt, "src_is_real": src_real}, state=state,
              perturbed=Perturbed({"src_ids": src, "tgt_ids": future, "src_is_real": src_real},
                                  lambda out: out[:, : t0 + 1],
                                  f"the logits at positions <= {t0} changed when only target tokens after position "
                                  f"{t0} changed: the future leaks. decode must give the decoder a causal "
                                  "self-attention mask, also when tgt_is_real is None")),
        Build("B=1, S=4, T=6, src_vocab=9, tgt_vocab=7, D=12, H=3, F=20, n_layers=1, post-LN, untied, "
              "scale_embedding=True, no masks",
              post | {"dropout": Keyword(0.1), "tie_weights": Keyword(False), "norm_first": Keyword(False),
                      "max_len": Keyword(16), "scale_embedding": Keyword(True)},
              {"src_ids": ids((1, 4), 9), "tgt_ids": ids((1, 6), 7)},
              state=_model_state(rng, post, tie=False, norm_first=False, max_len=16)),
        Build(f"{sizes}, dropout=0.5", pre | kw | {"dropout": Keyword(0.5)}, inputs, state=state,
              seed=int(rng.integers(2**31))),
    ]


def _model_twin(init: dict, state: dict, inputs: dict, train: bool, scale: bool | None = None,
                target_padding: bool = True, causal: bool = True) -> torch.Tensor:
    """The model's logits computed with PyTorch's own layers (the encoder's and the decoder's twins, float64) from
    the same weights; ``scale``, ``target_padding``, ``causal``: known mistakes."""
    D, N, norm_first = init["d_model"], init["n_layers"], init.get("norm_first", True)
    sizes = {"d_model": D, "n_heads": init["n_heads"], "d_ff": init["d_ff"], "n_layers": N, "norm_first": norm_first}
    w = {key: value.double() for key, value in state.items()}
    factor = math.sqrt(D) if (init.get("scale_embedding", False) if scale is None else scale) else 1.0
    src, tgt = inputs["src_ids"], inputs["tgt_ids"]
    src_real = inputs.get("src_is_real")
    tgt_real = inputs.get("tgt_is_real") if target_padding else None
    (B, S), T = src.shape, tgt.shape[1]
    x = w["src_embed.weight"][src] * factor + w["pos_encoding.pe"][:S]  # (B, S, D)
    for i in range(N):
        prefix = f"encoder.layers.{i}."
        layer = {k.removeprefix(prefix): v for k, v in w.items() if k.startswith(prefix)}
        x = _encoder_twin(sizes, layer, {"x": x, "src_is_real": src_real}, False)
    if norm_first:
        x = F.layer_norm(x, (D,), w["encoder.norm.weight"], w["encoder.norm.bias"])
    self_allowed = torch.ones(T, T, dtype=torch.bool).tril(0 if causal else T)  # (T, T)
    if tgt_real is not None:
        self_allowed = self_allowed[None, None] & tgt_real[:, None, None, :]  # (B, 1, T, T)
    cross = None if src_real is None else src_real[:, None, None, :].expand(B, 1, T, S)  # (B, 1, T, S)
    y = stack_twin(sizes, {k.removeprefix("decoder."): v for k, v in w.items() if k.startswith("decoder.")},
                    {"x": w["tgt_embed.weight"][tgt] * factor + w["pos_encoding.pe"][:T], "memory": x,
                     "self_allowed": self_allowed, "cross_allowed": cross}, False)
    return F.linear(y, w["out_proj.weight"], w["out_proj.bias"])  # (B, T, V)


def _model_variants(init: dict, state: dict, inputs: dict, train: bool = False) -> dict:
    scaled = init.get("scale_embedding", False)
    wrong = {("embeddings not multiplied by sqrt(D) although scale_embedding=True" if scaled else
              "embeddings multiplied by sqrt(D) although scale_embedding is False (the default follows this course, "
              "not the paper)"): _model_twin(init, state, inputs, False, scale=not scaled)}
    if inputs.get("tgt_is_real") is not None:
        wrong["decode gives the decoder no causal mask: each position reads the target tokens after it; the "
              "self-attention mask is causal & tgt_is_real"] = _model_twin(init, state, inputs, False, causal=False)
        wrong["the decoder ignores tgt_is_real: padded target keys must be blocked too (causal & tgt_is_real on the "
              "key axis)"] = _model_twin(init, state, inputs, False, target_padding=False)
    return wrong


def _model_facts(init: dict) -> tuple:
    if init.get("tie_weights", True):
        return (("out_proj.weight", "tied:tgt_embed.weight", "with tie_weights=True it is a separate tensor: tie by "
                 "assigning the parameter, self.out_proj.weight = self.tgt_embed.weight (copying the values is not "
                 "tying)"),)
    return (("out_proj.weight", "untied:tgt_embed.weight", "with tie_weights=False it shares tgt_embed.weight's "
             "tensor: tie only when tie_weights is True"),)


SPECS["Seq2SeqTransformer"] = ModuleSpec(
    "Seq2SeqTransformer", _model_rows, _model_twin,
    names="src_embed, tgt_embed, pos_encoding (its table the buffer pos_encoding.pe), encoder, decoder, out_proj",
    dtype=lambda a: np.float32, shape=lambda a: a["tgt_ids"].shape + (a["tgt_vocab"],), axes="B, T, V",
    variants=_model_variants, facts=_model_facts, rtol=1e-4, atol=1e-4,
    forbidden=("nn.Transformer", "nn.TransformerDecoder", "nn.TransformerDecoderLayer", "nn.TransformerEncoder",
               "nn.TransformerEncoderLayer"),
    uses=("PositionalEncoding", "EncoderLayer", "Decoder"), lenient=("pos_encoding.", "encoder.layers.", "decoder."),
    dropout="in the positional encoding, the encoder and the decoder: pass dropout to each",
    hint="out_proj(decoder(tgt_embed(tgt) * embed_scale + positions, memory, causal & target padding, source "
         "padding)), with memory = encoder(src_embed(src) * embed_scale + positions, src_is_real).")


def check_seq2seq_transformer(Seq2SeqTransformer) -> None:  # noqa: N803 - the class under test
    """The spec's rows: the contract's names, PyTorch's own layers with the same weights (pre-LN tied with padding,
    post-LN untied scaled), the future and padded source tokens do not leak, tied weights are one tensor, dropout
    in training only, inputs unchanged."""
    run_module(SPECS["Seq2SeqTransformer"], Seq2SeqTransformer)


# -- logits_from_ids (find the bug) ---------------------------------------------------------------------------
class _TorchSeq2Seq(nn.Module):
    """A stand-in for a Seq2SeqTransformer: PyTorch's own encoder and decoder stacks behind the course's
    ``encode`` / ``decode`` and ``is_real`` masks (True = real), which remembers the masks each call was given."""

    def __init__(self, V: int, D: int, H: int, F_: int, seed: int):
        super().__init__()
        self.embed, self.out = nn.Embedding(V, D), nn.Linear(D, V)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, batch_first=True),
                                             num_layers=1, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, F_, dropout=0.0, batch_first=True),
                                             num_layers=1)
        randomised(self, seed).eval()
        self.calls: list[str] = []  # what each call was given, in words

    @staticmethod
    def _said(mask) -> str:
        return "None" if mask is None else f"a {tuple(mask.shape)} mask"

    def encode(self, src_ids, src_is_real=None):
        self.calls.append(f"encode(src_ids, src_is_real={self._said(src_is_real)})")
        with torch.no_grad():  # PyTorch's boundary: True = padding
            return self.encoder(self.embed(src_ids),
                                src_key_padding_mask=None if src_is_real is None else ~src_is_real)

    def decode(self, tgt_ids, memory, src_is_real=None, tgt_is_real=None):
        self.calls.append(f"decode(tgt_ids, memory, src_is_real={self._said(src_is_real)}, "
                          f"tgt_is_real={self._said(tgt_is_real)})")
        T = tgt_ids.shape[1]
        with torch.no_grad():  # PyTorch's boundary: True = blocked / padding
            y = self.decoder(self.embed(tgt_ids), memory, tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
                             tgt_key_padding_mask=None if tgt_is_real is None else ~tgt_is_real,
                             memory_key_padding_mask=None if src_is_real is None else ~src_is_real)
            return self.out(y)  # (B, T, V)

    def forward(self, src_ids, tgt_ids, src_is_real=None, tgt_is_real=None):
        return self.decode(tgt_ids, self.encode(src_ids, src_is_real), src_is_real, tgt_is_real)


def check_logits_from_ids(logits_from_ids) -> None:
    """Find the bug: padded batches against the model's own forward, the masks each call was given shown."""
    V, D, H, F_, B, S, T, pad_id = 12, 8, 2, 16, 2, 6, 5, 4
    model = _TorchSeq2Seq(V, D, H, F_, seed=11)  # a stand-in whose answers are PyTorch's: only the helper is tested
    g = torch.Generator().manual_seed(12)

    def ids(n, lengths):
        tokens = torch.randint(5, V, (B, n), generator=g)  # real tokens: 5 .. V-1, never pad_id
        return tokens.masked_fill(torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None], pad_id)

    situations = (  # (title, source ids, target ids)
        ("the easy case: no padding anywhere", ids(S, [S, S]), ids(T, [T, T])),
        (f"source padding (pad_id={pad_id}): sequence 1 has 2 real source tokens of {S}", ids(S, [S, 2]),
         ids(T, [T, T])),
        (f"source and target padding (pad_id={pad_id})", ids(S, [4, S]), ids(T, [T, 3])),
    )
    for title, src_ids, tgt_ids in situations:
        with check(title):
            model.calls.clear()
            try:
                got = expect_inputs_unchanged(logits_from_ids, model, src_ids, tgt_ids, pad_id)
            except RuntimeError as exc:
                calls = "\n        ".join(model.calls)
                raise CheckFailed(f"the model raised {type(exc).__name__} ({exc}) on the calls:\n        {calls}"
                                  "\n    A mask of the wrong length? decode takes (tgt_ids, memory, src_is_real, "
                                  "tgt_is_real), in that order: src_is_real is (B, S), tgt_is_real (B, T)") from None
            expect_shape(got, (B, T, V), "the logits", names="B, T, V")
            calls = "\n        ".join(model.calls)
            want = model(src_ids, tgt_ids, src_ids != pad_id, tgt_ids != pad_id)
            if not torch.allclose(got, want, atol=1e-5):
                wrong = ((got - want).abs().amax(dim=-1) > 1e-5).nonzero().tolist()
                raise CheckFailed(f"the logits at positions (b, t) {wrong} differ from model(src_ids, tgt_ids, "
                                  f"src_ids != {pad_id}, tgt_ids != {pad_id}). The calls it made:\n        {calls}"
                                  "\n    Which of these calls reads the padding, and how would it know where it is?")
