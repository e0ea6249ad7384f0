"""Visible checks of lesson 05-decoder-layer.

The decoder layer's checks compare with PyTorch's own ``nn.TransformerDecoderLayer`` carrying the same weights
(an independent implementation, not an answer key), and test properties any correct layer has: with every
sublayer returning zeros a pre-LN layer is the identity, the future and memory padding do not leak, dropout
follows ``.train()`` / ``.eval()``.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from decoder_course import twins
from decoder_course.checks import (
    CheckFailed,
    causal_leakage_probe,
    check,
    expect_close,
    expect_dropout,
    expect_finite,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    padding_leakage_probe,
    randomised,
)
from decoder_course.spec import Build, Keyword, ModuleSpec, New, Perturbed, Rng, Spec, load, run, run_module

ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")
SUBLAYERS = ("self_attn", "cross_attn", "feed_forward")
LAYER_NAMES = "self_attn, cross_attn, feed_forward, norm1, norm2, norm3"
# norm_first -> the wiring's name and its update, one per sublayer
WIRING = {False: ("post-LN", "x = norm(x + sublayer(x))"), True: ("pre-LN", "x = x + sublayer(norm(x))")}


# -- helpers (lesson 06's checks use them too) ---------------------------------------------------------------
def random_state(rng: np.random.Generator, D: int, F: int, attention: tuple[str, ...] = ("self_attn", "cross_attn"),
                 norms: tuple[str, ...] = ("norm1", "norm2", "norm3")) -> dict[str, np.ndarray]:
    """A random state dict of a layer by the contract's names (float32): projections N(0, 1/fan_in), biases far
    from 0, LayerNorms not the identity, so that a missing bias, projection or norm changes the output."""
    state = {}
    for sub in attention:
        for proj in ATTN_PROJ:
            state[f"{sub}.{proj}.weight"] = rng.normal(0.0, 1.0 / np.sqrt(D), (D, D))
            state[f"{sub}.{proj}.bias"] = rng.normal(0.0, 0.2, D)
    for name, n_in, n_out in (("linear1", D, F), ("linear2", F, D)):
        state[f"feed_forward.{name}.weight"] = rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_out, n_in))
        state[f"feed_forward.{name}.bias"] = rng.normal(0.0, 0.2, n_out)
    for norm in norms:
        state[f"{norm}.weight"], state[f"{norm}.bias"] = 1.0 + rng.normal(0.0, 0.3, D), rng.normal(0.0, 0.3, D)
    return {key: value.astype(np.float32) for key, value in state.items()}


def _torch_layer(D: int, H: int, F: int, norm_first: bool, seed: int) -> nn.TransformerDecoderLayer:
    """PyTorch's decoder layer with random weights, in eval mode."""
    theirs = nn.TransformerDecoderLayer(D, H, F, dropout=0.1, batch_first=True, norm_first=norm_first)
    return randomised(theirs, seed).eval()


def _plain_feed_forward(D: int, F: int) -> nn.Module:
    """A feed-forward from PyTorch parts, with the course's names (so this check does not need yours)."""
    return nn.Sequential(OrderedDict(linear1=nn.Linear(D, F), relu=nn.ReLU(), linear2=nn.Linear(F, D)))


def _load(module: nn.Module, state: dict, what: str = "your layer", names: str = LAYER_NAMES) -> nn.Module:
    """``module`` holding ``state`` (strict), in eval mode; a name it lacks says which names the contract has."""
    return load(module, state, names, what).eval()


def _masks(B: int, T: int, S: int, mem_lengths: list[int]):
    """Causal (T, T) and memory padding (B, 1, T, S) in our polarity, plus PyTorch's inverted versions."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = may attend
    mem_is_real = torch.arange(S)[None, :] < torch.tensor(mem_lengths)[:, None]  # (B, S)
    cross_allowed = mem_is_real[:, None, None, :].expand(B, 1, T, S)  # (B, 1, T, S)
    # PyTorch's masks mean True = BLOCKED: invert at this boundary only
    return causal, mem_is_real, cross_allowed, {"tgt_mask": ~causal, "memory_key_padding_mask": ~mem_is_real}


class _StandIn(nn.Module):
    """A stand-in sublayer with no weights and no dropout of its own: ``fn`` of its first input, and a record of
    how it was called in ``log``."""

    def __init__(self, name: str, fn, log: list):
        super().__init__()
        self.name, self.fn, self.log = name, fn, log

    def forward(self, x, *args, **kwargs):
        self.log.append((self.name, x, args, kwargs))
        out = self.fn(x)
        return out if self.name == "feed_forward" else (out, None)  # attention returns (out, weights)


def _stand_ins(fn, log: list) -> dict[str, _StandIn]:
    """The three sublayers as stand-ins, as keyword arguments of DecoderLayer."""
    return {name: _StandIn(name, fn, log) for name in SUBLAYERS}


class _SpyDropout(nn.Dropout):
    """An nn.Dropout that remembers that it ran, and on what shape."""

    def __init__(self, name: str, log: list, p: float):
        super().__init__(p)
        self.name, self.log = name, log

    def forward(self, x):
        self.log.append((self.name, tuple(x.shape)))
        return super().forward(x)


# -- FeedForward ---------------------------------------------------------------------------------------------
def _ff_rows(rng: np.random.Generator) -> list[Build]:
    """Two sizes in eval mode (dropout passed by position, the contract's third argument), one in training."""
    rows = []
    for B, T, D, F_, p, train in ((2, 5, 12, 20, 0.1, False), (1, 3, 8, 32, 0.1, False), (3, 7, 10, 6, 0.5, True)):
        state = {}
        for name, n_in, n_out in (("linear1", D, F_), ("linear2", F_, D)):
            state[f"{name}.weight"] = rng.normal(0, 1 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)
            state[f"{name}.bias"] = rng.normal(0, 0.5, n_out).astype(np.float32)  # far from 0: a lost bias shows
        x = (rng.standard_normal((B, T, D)) * rng.choice([0.3, 1.0, 6.0])).astype(np.float32)
        rows.append(Build(f"B={B}, T={T}, D={D}, F={F_}, dropout={p}",
                          {"d_model": D, "d_ff": F_, "dropout": Keyword(p) if train else p}, {"x": x}, state=state,
                          seed=int(rng.integers(2**31)) if train else None))
    return rows


def _ff_twin(init: dict, state: dict, inputs: dict, train: bool) -> torch.Tensor:
    """PyTorch's own linear, ReLU and dropout: after the same seed, dropout draws the same mask on (B, T, F)."""
    hidden = torch.relu(F.linear(inputs["x"], state["linear1.weight"], state["linear1.bias"]))  # (B, T, F)
    hidden = F.dropout(hidden, init["dropout"], training=train)
    return F.linear(hidden, state["linear2.weight"], state["linear2.bias"])  # (B, T, D)


SPECS = {
    "FeedForward": ModuleSpec(
        "FeedForward", _ff_rows, _ff_twin, names="linear1 (D -> F), dropout, linear2 (F -> D)",
        dtype=lambda a: a["x"].dtype, shape=lambda a: a["x"].shape, axes="B, T, D",
        hint="linear2(dropout(relu(linear1(x)))), linear1: D -> F and linear2: F -> D, the same at every position; "
             "dropout acts on the hidden (B, T, F) activations after the ReLU, in training mode only (and ReLU, "
             "not GELU: PyTorch's default)."),
}


def check_feed_forward(FeedForward) -> None:
    """A worked example by hand, then the spec's rows: PyTorch's own layers with the same weights, in eval and in
    training mode (dropout on the hidden activations draws PyTorch's masks after the same seed)."""
    with check("a worked example: D = 2, F = 3, by hand"):
        ff = FeedForward(2, 3).eval()
        with torch.no_grad():
            ff.linear1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            ff.linear1.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
            ff.linear2.weight.copy_(torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
            ff.linear2.bias.copy_(torch.tensor([0.5, 0.0]))
            got = ff(torch.tensor([[[1.0, -2.0], [3.0, 1.0]]]))  # (B=1, T=2, D=2)
        # position 0: linear1 -> [1, -2, -2], ReLU -> [1, 0, 0], linear2 -> [1 + 0.5, 0]
        # position 1: linear1 -> [3, 1, 3],   ReLU keeps it,   linear2 -> [3 + 1 + 0.5, 3]
        expect_close(got, torch.tensor([[[1.5, 0.0], [4.5, 3.0]]]), "FeedForward on the worked example",
                     hint="linear2(relu(linear1(x))): position 0's hidden layer is [1, -2, -2] before the ReLU "
                          "and [1, 0, 0] after it")
    run_module(SPECS["FeedForward"], FeedForward)


# -- DecoderLayer --------------------------------------------------------------------------------------------
def check_decoder_layer(DecoderLayer) -> None:
    """Structure, sublayer order, residual paths, PyTorch's layer with the same weights, leakage, dropout."""
    D, H, F, B, T, S = 16, 4, 32, 2, 5, 7
    with check("DecoderLayer(16, 4, 32) builds its sublayers, three LayerNorms and three dropouts"):
        layer = DecoderLayer(D, H, F)
        for name in SUBLAYERS:
            if not isinstance(getattr(layer, name, None), nn.Module):
                raise CheckFailed(f"layer.{name} should be a module (built when none is given)")
        for i in (1, 2, 3):
            norm = getattr(layer, f"norm{i}", None)
            expect_type(norm, nn.LayerNorm, f"layer.norm{i}")
            if tuple(norm.normalized_shape) != (D,):
                raise CheckFailed(f"layer.norm{i} normalises {tuple(norm.normalized_shape)}, expected ({D},)")
            expect_type(getattr(layer, f"dropout{i}", None), nn.Dropout, f"layer.dropout{i}")

    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)
    causal, mem_is_real, cross_allowed, blocked = _masks(B, T, S, [S, 4])
    for norm_first, (kind, wiring) in WIRING.items():
        with check(f"{kind}: the injected sublayers run once each, in order, on the right inputs"):
            log: list = []
            layer = DecoderLayer(D, H, F, dropout=0.0, norm_first=norm_first, **_stand_ins(torch.zeros_like, log))
            with torch.no_grad():
                out = layer(x, memory, causal, cross_allowed)
            order = [name for name, *_ in log]
            if order != list(SUBLAYERS):
                raise CheckFailed(f"the sublayers ran as {order}; expected self_attn, cross_attn, feed_forward, "
                                  "once each (did you use the modules passed in?)")
            given = {name: (*args, *kwargs.values()) for name, _, args, kwargs in log}
            for name, needed, why in (
                ("self_attn", causal, "self_attn was not given self_allowed: without it the future leaks"),
                ("cross_attn", memory, "cross_attn was not given the memory: its keys and values come from the "
                                       "encoder"),
                ("cross_attn", cross_allowed, "cross_attn was not given cross_allowed: memory padding would leak"),
            ):
                if not any(a is needed for a in given[name]):
                    raise CheckFailed(why)
        with check(f"{kind}: with every sublayer returning zeros, only the residual path is left"):
            if norm_first:  # x + 0 + 0 + 0: the residual stream passes through untouched
                want, atol, hint = x, 1e-6, "x itself. Add the sublayer's output to the raw x, not to norm(x)"
            else:  # norm3(norm2(norm1(x + 0))): LayerNorm of an already normalised vector changes it very little
                want, atol, hint = torch.nn.functional.layer_norm(x, (D,)), 1e-4, "LayerNorm(x)"
            expect_close(out, want, f"the {kind} layer's output", atol=atol,
                         hint=f"{kind} is {wiring}: with zero sublayers the output is {hint}")

    for norm_first, (kind, wiring) in WIRING.items():
        with check(f"{kind} equals nn.TransformerDecoderLayer(batch_first=True, norm_first={norm_first}) with the "
                   "same weights (eval, causal + memory padding, T != S)"):
            theirs = _torch_layer(D, H, F, norm_first, seed=5 + norm_first)
            layer = _load(DecoderLayer(D, H, F, norm_first=norm_first, feed_forward=_plain_feed_forward(D, F)),
                          twins.from_torch(theirs.state_dict(), "decoder"))
            with torch.no_grad():
                got = expect_inputs_unchanged(layer, x, memory, causal, cross_allowed)
                want = theirs(x, memory, **blocked)  # PyTorch gets its own polarity (True = blocked)
            expect_shape(got, (B, T, D), "DecoderLayer's output", names="B, T, D")
            expect_finite(got, "DecoderLayer's output")
            expect_close(got, want, "DecoderLayer's output", rtol=1e-4, atol=1e-5,
                         hint=f"{kind} is {wiring}, three times: self-attention (norm1), cross-attention (norm2), "
                              "feed-forward (norm3); dropout1..3 on each sublayer's output")

    with check("the future and memory padding do not leak; eval mode is deterministic"):
        layer = _load(DecoderLayer(D, H, F, feed_forward=_plain_feed_forward(D, F)),
                      twins.from_torch(_torch_layer(D, H, F, False, seed=9).state_dict(), "decoder"))
        causal_leakage_probe(lambda q: layer(q, memory, causal, cross_allowed), x, what="DecoderLayer's output",
                             atol=1e-5)
        padding_leakage_probe(lambda m: layer(x, m, causal, cross_allowed), memory, mem_is_real,
                              what="DecoderLayer's output", atol=1e-5)

    with check("dropout acts in training mode only"):
        layer = DecoderLayer(D, H, F, dropout=0.5, feed_forward=_plain_feed_forward(D, F))
        with torch.no_grad():
            expect_dropout(lambda: layer(x, memory, causal), layer, "DecoderLayer",
                           "to the sublayers' outputs with dropout1..3")
    for norm_first, (kind, _) in WIRING.items():
        with check(f"{kind}, training mode: the layer's own dropout1, dropout2, dropout3 each act once, in order"):
            # sublayers without dropout of their own: any randomness left is the layer's own dropout
            layer = DecoderLayer(D, H, F, dropout=0.5, norm_first=norm_first,
                                 **_stand_ins(lambda h: 0.5 * h + 0.25, []))
            log: list = []
            for i in (1, 2, 3):
                setattr(layer, f"dropout{i}", _SpyDropout(f"dropout{i}", log, 0.5))
            with torch.no_grad():
                layer.train()(x, memory, causal, cross_allowed)
            order = [name for name, _ in log]
            if order != ["dropout1", "dropout2", "dropout3"]:
                raise CheckFailed(f"in training mode the layer's dropouts ran as {order}; expected dropout1 (on the "
                                  "self-attention's output), dropout2 (cross-attention), dropout3 (feed-forward), "
                                  "once each. Apply self.dropout1..3 to each sublayer's output before its residual "
                                  "addition")
            for name, shape in log:
                if shape != (B, T, D):
                    raise CheckFailed(f"{name} got a tensor of shape {shape}; it belongs on the sublayer's "
                                      f"output, (B, T, D) = {(B, T, D)}")
            with torch.no_grad():
                expect_dropout(partial(layer, x, memory, causal, cross_allowed), layer, "the layer",
                               "to each sublayer's output and add what dropout1..3 return (they ran), not their "
                               "inputs")

    with check("cross_attn=False: a decoder-only layer is PyTorch's encoder layer with a causal mask"):
        layer = DecoderLayer(D, H, F, norm_first=True, cross_attn=False, feed_forward=_plain_feed_forward(D, F))
        extra = sorted({key.split(".")[0] for key in layer.state_dict()} - {"self_attn", "feed_forward", "norm1",
                                                                            "norm3"})
        if extra:
            raise CheckFailed(f"DecoderLayer(..., cross_attn=False) holds {extra}: without cross-attention there is "
                              "no cross_attn, norm2 or dropout2 (set them to None); norm1 and norm3 remain")
        theirs = randomised(nn.TransformerEncoderLayer(D, H, F, batch_first=True, norm_first=True), 11).eval()
        ours = twins.from_torch(theirs.state_dict(), "encoder")  # its norm2 is the feed-forward's: our norm3
        _load(layer, {("norm3." + key[6:] if key.startswith("norm2.") else key): v for key, v in ours.items()})
        with torch.no_grad():
            got = layer(x, None, causal)
            want = theirs(x, src_mask=~causal)  # PyTorch's boundary: True = blocked
        expect_close(got, want, "DecoderLayer(..., cross_attn=False)(x, None, causal)", atol=1e-5,
                     hint="without cross-attention the layer is masked self-attention (norm1), then the "
                          "feed-forward (norm3), each with its residual: nothing runs between them")


# -- NumPy layer ---------------------------------------------------------------------------------------------
PARAM_SHAPES = {
    **{f"{prefix}_W{n}": ("D", "D") for prefix in ("sa", "ca") for n in "qkvo"},
    **{f"{prefix}_b{n}": ("D",) for prefix in ("sa", "ca") for n in "qkvo"},
    "ff_W1": ("D", "F"), "ff_b1": ("F",), "ff_W2": ("F", "D"), "ff_b2": ("D",),
    **{f"ln{i}_{k}": ("D",) for i in (1, 2, 3) for k in "gb"},
}


def _init_rows(rng: np.random.Generator) -> list[tuple]:
    """Twice with the same seed (the same numbers), twice without an rng (different numbers)."""
    seed = int(rng.integers(2**31))
    rows = []
    for D, H, F_, given in ((64, 4, 256, Rng(seed)), (12, 3, 20, None)):
        args = {"D": D, "H": H, "F": F_} | ({} if given is None else {"rng": given})
        again = "with np.random.default_rng(the same seed)" if given else "without an rng"
        leak = ("two calls with the same seed gave different parameters: draw every number from the rng you are "
                "given" if given else "two calls without an rng gave the same parameters: with rng=None use a fresh "
                "np.random.default_rng(), not a fixed seed")
        rows.append((f"D={D}, H={H}, F={F_}, twice {again}", args, Perturbed(args, lambda p: p, leak,
                                                                               moves=given is None)))
    return rows


def _init_properties(args: dict, got: list, situation: str) -> None:
    """LayerNorms start as the identity; each weight matrix drawn separately, with standard deviation 1/sqrt(fan_in)."""
    params = dict(zip(PARAM_SHAPES, got, strict=True))
    for i in (1, 2, 3):
        if not (np.all(params[f"ln{i}_g"] == 1) and np.all(params[f"ln{i}_b"] == 0)):
            raise CheckFailed(f"ln{i}_g should start at ones and ln{i}_b at zeros ({situation}): a LayerNorm starts "
                              "as a plain normalisation (as nn.LayerNorm does)")
    for key in (k for k in PARAM_SHAPES if "_W" in k):
        fan_in, std = params[key].shape[0], float(params[key].std())
        if not 0.5 / np.sqrt(fan_in) < std < 2.0 / np.sqrt(fan_in):
            raise CheckFailed(f"params[{key!r}] has standard deviation {std:.3g} for fan-in {fan_in} ({situation}): "
                              "draw weights with standard deviation 1/sqrt(fan_in), so that x @ W keeps the scale of x")
    if np.allclose(params["sa_Wq"], params["sa_Wk"]) or np.allclose(params["sa_Wq"], params["ca_Wq"]):
        raise CheckFailed(f"two weight matrices are equal ({situation}): draw every matrix separately")


SPECS["init_numpy_decoder_params"] = Spec(
    "init_numpy_decoder_params", _init_rows, dtype=lambda a: "float", outputs=tuple(PARAM_SHAPES),
    shape=lambda a: tuple(tuple(a[n] for n in dims) for dims in PARAM_SHAPES.values()),
    axes=tuple(", ".join(dims) for dims in PARAM_SHAPES.values()), compare=False, properties=_init_properties,
    forbidden=("torch.",), shape_hint="Weights are stored (in, out): a layer is x @ W + b, so ff_W1 is (D, F) and "
    "ff_W2 (F, D), the transpose of nn.Linear's (out, in).",
    refused=(("D=10, H=3", {"D": 10, "H": 3, "F": 8, "rng": Rng(0)},
              "D = 10 cannot be split into 3 heads of equal width"),))


def check_init_numpy_decoder_params(init_numpy_decoder_params) -> None:
    """Keys and (in, out) shapes, LayerNorms as the identity, weight scale 1/sqrt(fan_in), the rng honoured."""
    run(SPECS["init_numpy_decoder_params"], init_numpy_decoder_params)


# numpy_decoder_layer's parameter -> the contract's DecoderLayer key (weights (in, out) there, (out, in) here)
NP_NAMES = {
    **{f"{prefix}_{w}{n}": f"{sub}.{proj}.{what}" for prefix, sub in (("sa", "self_attn"), ("ca", "cross_attn"))
       for n, proj in zip("qkvo", ATTN_PROJ, strict=True) for w, what in (("W", "weight"), ("b", "bias"))},
    **{f"ff_{w}{i}": f"feed_forward.linear{i}.{what}" for i in (1, 2) for w, what in (("W", "weight"), ("b", "bias"))},
    **{f"ln{i}_{k}": f"norm{i}.{what}" for i in (1, 2, 3) for k, what in (("g", "weight"), ("b", "bias"))},
}
MATMUL = ("Weights are stored (in, out): activations go on the left, h @ W with (B, T, D) @ (D, F) -> (B, T, F); "
          "W @ h multiplies the wrong axes.")


def _np_rows(rng: np.random.Generator) -> list[tuple]:
    """Post-LN with causal + memory padding (and its future and padded-memory probes), pre-LN, a sequence without
    memory, B = 1 without masks; each sequence on its own scale, biases and LayerNorms not trivial."""
    rows = []
    for B, T, S, D, H, F_, kinds in ((2, 5, 7, 12, 3, 20, ("post", "post", "pre", "empty")),
                                     (1, 3, 4, 8, 2, 16, ("b1",))):  # Dh = 4, T != S != H, F != D
        scale = np.geomspace(0.3, 6.0, B)[rng.permutation(B)][:, None, None]  # (B, 1, 1)
        x, memory = rng.standard_normal((B, T, D)) * scale, rng.standard_normal((B, S, D)) * scale[::-1]
        # .T: an (out, in) weight becomes (in, out); a vector is left as it is
        params = {k: np.ascontiguousarray(random_state(rng, D, F_)[key].T, np.float64) for k, key in NP_NAMES.items()}
        lengths = rng.integers(1, S, size=B)
        lengths[rng.integers(B)] = S
        mem_is_real = np.arange(S)[None, :] < lengths[:, None]  # (B, S): real tokens, then padding
        t0 = int(rng.integers(1, T - 1))
        for i, kind in enumerate(kinds):
            norm_first = kind == "pre" or (kind in ("empty", "b1") and bool(rng.integers(2)))
            real = mem_is_real.copy()
            if kind == "empty":
                real[0] = False  # one sequence with no real memory token: zeros from its cross-attention
            args = {"x": x, "memory": memory, "params": params, "n_heads": H}
            if kind != "b1":
                args |= {"self_allowed": np.tril(np.ones((T, T), bool)),  # (T, T)
                         "cross_allowed": np.repeat(real[:, None, None, :], T, axis=2)}  # (B, 1, T, S)
            args["norm_first"] = Keyword(norm_first)
            what = {"post": "causal + memory padding", "pre": "causal + memory padding", "b1": "no masks",
                    "empty": "causal, sequence 0 has no real memory token"}[kind]
            desc = f"B={B}, T={T}, S={S}, D={D}, H={H}, F={F_}, {WIRING[norm_first][0]}, {what}"
            if kind != "post":
                rows.append((desc, args))
                continue
            moved = x.copy() if i == 0 else memory.copy()
            if i == 0:  # the positions after t0 redrawn: the outputs at t0 and before must not move
                moved[:, t0 + 1:] = rng.standard_normal((B, T - t0 - 1, D)) * 3.0
                probe = Perturbed(args | {"x": moved}, lambda out, t0=t0: out[:, : t0 + 1],
                                  f"positions <= {t0} changed when only later positions of x changed: the future "
                                  "leaks. Only the self-attention mixes positions of x, under self_allowed; "
                                  "LayerNorm and the feed-forward work on each position alone (over D)")
            else:  # the padded memory redrawn: no output may move
                moved[~mem_is_real] = rng.standard_normal((int((~mem_is_real).sum()), D)) * 3.0
                probe = Perturbed(args | {"memory": moved}, lambda out: out,
                                  "the output changed when only padded memory positions changed: pass "
                                  "cross_allowed to the cross-attention, whose keys and values come from the memory")
            again = "later positions of x" if i == 0 else "the padded memory"
            rows.append((f"{desc}; again with {again} redrawn", args, probe))
    return rows


def _blocked(allowed: torch.Tensor | None, B: int, H: int) -> torch.Tensor | None:
    """Our mask (True = may attend; (T, S) or (B, 1, T, S)) as PyTorch's (True = blocked; (T, S) or (B·H, T, S))."""
    if allowed is None:
        return None
    allowed = torch.as_tensor(allowed, dtype=torch.bool)
    if allowed.dim() == 2:
        return ~allowed
    return ~allowed.expand(B, H, *allowed.shape[-2:]).reshape(B * H, *allowed.shape[-2:])


def stack_twin(init: dict, state: dict, inputs: dict, train: bool, layers: list[int] | None = None,
                final_norm: bool = True, masked_memory: bool = True) -> torch.Tensor:
    """nn.TransformerDecoder in float64 over twin layers with the same weights (``layers``: which of them, in order;
    the flags make known mistakes). Lesson 06's stack check uses it; this lesson's NumPy layer is a stack of one."""
    N, H, norm_first = init["n_layers"], init["n_heads"], init.get("norm_first", True)
    twins_ = [twins.torch_twin({k.removeprefix(f"layers.{i}."): v for k, v in state.items()
                                if k.startswith(f"layers.{i}.")}, "decoder", H, d_ff=init["d_ff"],
                               norm_first=norm_first, dtype=torch.float64) for i in (layers or range(N))]
    norm = None
    if norm_first and final_norm:
        norm = nn.LayerNorm(init["d_model"], dtype=torch.float64)
        norm.load_state_dict({k: state[f"norm.{k}"].double() for k in ("weight", "bias")})
    theirs = nn.TransformerDecoder(twins_[0], num_layers=len(twins_), norm=norm)
    theirs.layers = nn.ModuleList(twins_)  # each layer its own weights
    x, memory = inputs["x"].double(), inputs["memory"].double()
    cross = inputs.get("cross_allowed") if masked_memory else None
    return theirs.eval()(x, memory, tgt_mask=_blocked(inputs.get("self_allowed"), x.shape[0], H),
                         memory_mask=_blocked(cross, x.shape[0], H))


def _np_twin(args: dict, norm_first: bool) -> np.ndarray:
    """nn.TransformerDecoderLayer (float64) with the parameters' weights, on the row's inputs and masks."""
    D, F_ = args["params"]["ff_W1"].shape
    state = {f"layers.0.{key}": np.asarray(args["params"][k]).T for k, key in NP_NAMES.items()}
    init = {"n_layers": 1, "n_heads": args["n_heads"], "d_ff": F_, "d_model": D, "norm_first": norm_first}
    inputs = {n: torch.from_numpy(np.asarray(args[n])) for n in ("x", "memory", "self_allowed", "cross_allowed")
              if args.get(n) is not None}
    with torch.no_grad():
        return stack_twin(init, state, inputs, False, final_norm=False).numpy()


def _np_twin_agrees(args: dict, got: np.ndarray, situation: str) -> None:
    """Equal to PyTorch's own layer with the same weights, wherever every query has a memory key to read (where
    none has, PyTorch gives NaN, and the hidden comparison with the course's layer decides)."""
    cross = args.get("cross_allowed")
    if cross is not None and not cross.any(axis=-1).all():
        return
    norm_first = bool(args.get("norm_first", False))
    if np.allclose(got, _np_twin(args, norm_first), rtol=1e-6, atol=1e-6):
        return
    kind, wiring = WIRING[norm_first]
    if np.allclose(got, _np_twin(args, not norm_first), rtol=1e-6, atol=1e-6):
        raise CheckFailed(f"numpy_decoder_layer's output ({situation}) is PyTorch's {WIRING[not norm_first][0]} "
                          f"layer's: norm_first={norm_first} asks for {kind}, {wiring}")
    raise CheckFailed(f"numpy_decoder_layer's output ({situation}) differs from nn.TransformerDecoderLayer with the "
                      f"same weights. {NP_HINT}")


NP_HINT = ("LayerNorm over the last axis D (biased variance, eps 1e-5, then * g + b); every linear map is "
           "activations @ W + b (h @ W, never W @ h); the cross-attention's keys and values come from the memory; "
           "post-LN: x = LN(x + sublayer(x)); pre-LN: x = x + sublayer(LN(x)).")

SPECS["numpy_decoder_layer"] = Spec(
    "numpy_decoder_layer", _np_rows, dtype=lambda a: "float", shape=lambda a: a["x"].shape, axes="B, T, D",
    properties=_np_twin_agrees, forbidden=("torch.", "nn.TransformerDecoderLayer"), rtol=1e-6, atol=1e-6,
    on_error=lambda args, error: MATMUL if "matmul" in error or "not aligned" in error else "",
    hint=NP_HINT + " A query with no allowed key gets a zero attention output (the given "
    "scaled_dot_product_attention does it): pass cross_allowed to it unchanged.")


def check_numpy_decoder_layer(numpy_decoder_layer) -> None:
    """PyTorch's layer with the same weights, both placements, leakage of the future and of padded memory."""
    run(SPECS["numpy_decoder_layer"], numpy_decoder_layer)


# -- run_with_torch_masks (find the bug) ---------------------------------------------------------------------
class TorchDecoderLayer(nn.Module):
    """A stand-in for a DecoderLayer: PyTorch's own layer (random weights from ``seed``) behind the course's masks
    (True = may attend), so that only the masks are tested."""

    def __init__(self, D: int, H: int, F: int, seed: int):
        super().__init__()
        self.H, self.torch_layer = H, _torch_layer(D, H, F, False, seed)

    def forward(self, x, memory, self_allowed=None, cross_allowed=None):
        B, T, _ = x.shape

        def blocked(allowed, S):  # PyTorch's boundary: its masks say True = blocked, per head (B * H, T, S)
            return None if allowed is None else ~torch.broadcast_to(allowed, (B, self.H, T, S)).reshape(-1, T, S)

        with torch.no_grad():
            return self.torch_layer(x, memory, tgt_mask=blocked(self_allowed, T),
                                    memory_mask=blocked(cross_allowed, memory.shape[1]))


def _masks_rows(rng: np.random.Generator) -> list[tuple]:
    """Every mix of PyTorch's three masks (True = blocked), a causal window among them, on the stand-in layer."""
    def pads(B, n, real=1):  # (B, n): True at the padding, at the end; one sequence unpadded
        lengths = rng.integers(real, n, size=B)
        lengths[rng.integers(B)] = n
        return np.arange(n)[None, :] >= lengths[:, None]

    index = np.arange(5)
    future = index[None, :] > index[:, None]  # (T, T): True above the diagonal
    window = future | (index[:, None] - index[None, :] > 2)  # (T, T): 3 keys back
    rows = []
    for situation, B, T, S, masks in (
        ("a causal tgt_mask, target and memory padding", 3, 5, 6,
         {"tgt_mask": future, "tgt_key_padding_mask": pads(3, 5), "memory_key_padding_mask": pads(3, 6)}),
        ("target padding alone, no tgt_mask", 3, 5, 6, {"tgt_key_padding_mask": pads(3, 5)}),
        ("tgt_mask a causal window of 3 keys, target padding", 3, 5, 6,
         {"tgt_mask": window, "tgt_key_padding_mask": pads(3, 5, real=3)}),
        ("a causal tgt_mask alone", 2, 4, 7, {"tgt_mask": future[:4, :4]}),
        ("memory padding alone", 3, 5, 6, {"memory_key_padding_mask": pads(3, 6)}),
    ):
        x, memory = (rng.standard_normal((B, n, 8)).astype(np.float32) for n in (T, S))
        layer = New("decoder_course.visible.l05_decoder_layer:TorchDecoderLayer", (8, 2, 16, int(rng.integers(99))))
        rows.append((f"B={B}, T={T}, S={S}, D=8, H=2, F=16, {situation}", {"layer": layer, "tgt": x, "memory": memory}
                     | {name: Keyword(mask) for name, mask in masks.items()}))
    return rows


def _torch_layer_twin(args: dict) -> np.ndarray:
    """The stand-in's PyTorch layer given the very same masks: a key is hidden when any mask blocks it."""
    masks = {n: torch.from_numpy(args[n]) for n in ("tgt_mask", "tgt_key_padding_mask", "memory_key_padding_mask")
             if n in args}
    with torch.no_grad():
        return args["layer"].build().torch_layer(torch.from_numpy(args["tgt"]), torch.from_numpy(args["memory"]),
                                                 **masks).numpy()


def _no_nan_rows(args: dict, got: np.ndarray, situation: str) -> None:
    """With these masks every query may read a real key: a NaN row was handed none."""
    if np.isnan(got).any():
        rows = np.argwhere(np.isnan(got).any(axis=-1)).tolist()
        raise CheckFailed(f"positions (b, t) {rows} came out NaN ({situation}): those queries were handed no key at "
                          "all (PyTorch's layer gives NaN for such a row), yet with these masks every query may read "
                          "a real key. " + MASKS_HINT)


MASKS_HINT = ("Which keys may each query read, when a key is blocked by tgt_mask, by the padding, or by both? A key "
              "is hidden when any mask blocks it; PyTorch's masks say True = blocked and ours True = may attend, so "
              "each is inverted once, at the call.")
SPECS["run_with_torch_masks"] = Spec(
    "run_with_torch_masks", _masks_rows, dtype=lambda a: "float", shape=lambda a: a["tgt"].shape, axes="B, T, D",
    tensors=True, properties=_no_nan_rows, twin=_torch_layer_twin, hint=MASKS_HINT, atol=1e-5)


def check_run_with_torch_masks(run_with_torch_masks) -> None:
    """Find the bug: every mix of PyTorch's masks against PyTorch's layer itself, behind a stand-in layer."""
    run(SPECS["run_with_torch_masks"], run_with_torch_masks)
