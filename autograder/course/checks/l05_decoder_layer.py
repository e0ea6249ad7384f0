"""Hidden checks of lesson 05-decoder-layer (PyTorch, and the NumPy-only layer).

``DecoderLayer`` is graded apart from the student's own attention and feed-forward: its cases inject the
notebook's given ``MultiHeadAttention`` / ``CrossAttention`` and a plain ``nn.Sequential`` feed-forward (named
``linear1``, ``relu``, ``linear2``, so the contract's parameter names load), then compare with PyTorch's own
``nn.TransformerDecoderLayer`` carrying the same weights. Only one case builds the default sublayers, and it
looks at their types and the output's shape, so a wrong ``FeedForward`` costs only its own item.

``FeedForward``, ``numpy_decoder_layer``, ``init_numpy_decoder_params`` and ``run_with_torch_masks`` are specs
(``decoder_course/visible/l05_decoder_layer.py``), registered below with one line.

``DecoderLayer``'s cases are a table of rows (sizes, LayerNorm placement, inputs, masks) fed to one loop; the
generic judges (inputs unchanged, leakage, dropout, a known mistake's output) are
:mod:`autograder.course.checks.judges`'.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.course.checks import judges
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Raised, Result, expect_close
from autograder.course.reference import cross_attention as ref_cross
from autograder.course.reference import decoder_layer as ref
from autograder.course.reference import multi_head as ref_mh
from autograder.course.reference.masks import causal_mask
from decoder_course import twins
from decoder_course.visible import l05_decoder_layer as visible

LESSON = "05-decoder-layer"
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")
NORMS = ("norm1", "norm2", "norm3")


# -- inputs --------------------------------------------------------------------------------------------------
def _inputs(rng: np.random.Generator, B: int, T: int, S: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    """x (B, T, D) and memory (B, S, D), float32, each batch item on a very different scale."""
    scales = np.geomspace(0.3, 6.0, B)[rng.permutation(B)][:, None, None]  # (B, 1, 1)
    x = (rng.standard_normal((B, T, D)) * scales).astype(np.float32)
    memory = (rng.standard_normal((B, S, D)) * scales[::-1]).astype(np.float32)
    return x, memory


def _padded(rng: np.random.Generator, B: int, n: int, min_real: int = 1) -> np.ndarray:
    """is_real (B, n): padding at the end, at least ``min_real`` real tokens a row, a random row unpadded."""
    return judges.right_padded(rng, B, n, min_real=min_real, full_row=int(rng.integers(B)))


def _perturbed(rng: np.random.Generator, x: np.ndarray, memory: np.ndarray, mem_is_real: np.ndarray):
    """(t0, x with the positions after t0 redrawn, memory with its padded positions redrawn): what must not
    matter to the outputs at positions <= t0, and to every output."""
    B, T, D = x.shape
    t0 = int(rng.integers(1, T - 1))
    x_future, memory_pad = x.copy(), memory.copy()
    x_future[:, t0 + 1:] = rng.standard_normal((B, T - t0 - 1, D)) * 3.0
    memory_pad[~mem_is_real] = rng.standard_normal((int((~mem_is_real).sum()), D)) * 3.0
    return t0, x_future, memory_pad


def leak_rows(sizes: str, dims: tuple, post: dict, pre: dict, x, x_future, memory, memory_pad, causal,
              tgt_is_real, mem_is_real) -> list[tuple]:
    """The situations a layer and a stack of them share: post-LN (and its future and memory-padding twins, judged
    by :func:`_leaks`), then pre-LN with target padding. Each row: id, situation, sizes, weights, norm_first, x,
    memory, causal, target padding, memory padding."""
    return [
        ("post", f"{sizes}, post-LN, causal + memory padding", dims, post, False, x, memory, causal, None,
         mem_is_real),
        ("post_future", f"{sizes}, post-LN, causal + memory padding, positions after a query changed", dims, post,
         False, x_future, memory, causal, None, mem_is_real),
        ("post_pad", f"{sizes}, post-LN, causal + memory padding, padded memory positions changed", dims, post,
         False, x, memory_pad, causal, None, mem_is_real),
        ("pre", f"{sizes}, pre-LN, causal + target and memory padding", dims, pre, True, x, memory, causal,
         tgt_is_real, mem_is_real),
    ]


def _layer_state(rng: np.random.Generator, D: int, F: int) -> dict[str, np.ndarray]:
    """A random state dict of the contract's ``DecoderLayer`` (float32), LayerNorms not the identity."""
    return visible.random_state(rng, D, F)


# -- PyTorch's side, and the reference's ---------------------------------------------------------------------
def _blocked(allowed) -> torch.Tensor | None:
    """Our polarity (True = may attend) to PyTorch's (True = blocked): the one place it is inverted."""
    return None if allowed is None else ~torch.from_numpy(np.asarray(allowed, bool))


def _torch_layer(state: dict, H: int, F: int, norm_first: bool) -> torch.nn.TransformerDecoderLayer:
    """PyTorch's own decoder layer (float64, eval) carrying the weights of a contract state dict."""
    return twins.torch_twin(state, "decoder", H, d_ff=F, norm_first=norm_first, dtype=torch.float64)


def _torch_forward(theirs, x, memory, causal=None, tgt_is_real=None, mem_is_real=None) -> np.ndarray:
    """Run PyTorch's decoder layer or stack on our inputs and masks (inverted at the boundary)."""
    with torch.no_grad():
        return theirs(torch.from_numpy(np.asarray(x, np.float64)), torch.from_numpy(np.asarray(memory, np.float64)),
                      tgt_mask=_blocked(causal), tgt_key_padding_mask=_blocked(tgt_is_real),
                      memory_key_padding_mask=_blocked(mem_is_real)).numpy()


def _reference_layer_out(d: dict, self_allowed, cross_allowed) -> np.ndarray:
    """The reference layer (float64, eval) with the case's weights and the given masks of our polarity: where a
    mask leaves a query with no key (a known mistake's, or a sequence without memory), PyTorch would give NaN."""
    D, H, F = d["D"], d["H"], d["F"]
    ours = ref.DecoderLayer(D, H, F, dropout=0.0, norm_first=d["norm_first"],
                            self_attn=ref_mh.MultiHeadAttention(D, H), cross_attn=ref_cross.CrossAttention(D, H))
    ours.load_state_dict({k: torch.from_numpy(v) for k, v in d["state"].items()})

    def tensor(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    with torch.no_grad():
        return ours.double().eval()(torch.from_numpy(d["x"].astype(np.float64)),
                                    torch.from_numpy(d["memory"].astype(np.float64)),
                                    tensor(self_allowed), tensor(cross_allowed)).numpy()


def _self_allowed(causal: np.ndarray | None, tgt_is_real: np.ndarray | None) -> np.ndarray | None:
    """Our self-attention mask: (T, T) causal alone, or (B, 1, T, T) with target padding on the keys."""
    if tgt_is_real is None:
        return causal
    return causal[None, None] & tgt_is_real[:, None, None, :]


def _cross_allowed(mem_is_real: np.ndarray | None, T: int) -> np.ndarray | None:
    return None if mem_is_real is None else np.repeat(mem_is_real[:, None, None, :], T, axis=2)  # (B, 1, T, S)


# -- judges of this lesson (and the next, which builds stacks of these layers) --------------------------------
def _unchanged(result: Result, case_id: str, before: dict, what: str, hint: str = "") -> None:
    """judges.unchanged, its message followed by ``hint``: how this exercise's input was written into."""
    try:
        judges.unchanged(result, case_id, before, what)
    except Fail as fail:
        raise type(fail)(f"{fail} {hint}".rstrip()) from None


def _leaks(outs: dict, case: Case, future: str, pad: str, tol: float = 1e-5) -> None:
    """The outputs at positions <= t0 ignore x after t0 ("_future"), and every output ignores the padded memory
    ("_pad"); ``future`` and ``pad`` say what to pass where."""
    t0 = case.data["t0"]
    for base, moved, message in (
        (outs["post"][:, : t0 + 1], outs["post_future"][:, : t0 + 1],
         f"positions <= {t0} changed when only later positions of x changed ({case.desc}): the future leaks. "
         f"{future}"),
        (outs["post"], outs["post_pad"],
         f"the output changed when only padded memory positions changed ({case.desc}): {pad}"),
    ):
        judges.leak(base, moved, message, atol=tol)
        if not np.allclose(base, moved, rtol=tol, atol=tol):  # the float64 NumPy layer: tighter than judges.leak
            raise Fail(message)


def _placement(norm_first: bool) -> str:
    """The recognisable output of the other LayerNorm placement, named."""
    other = "pre-LN (norm_first=True)" if not norm_first else "post-LN (norm_first=False)"
    return f"a {other} layer: check where the LayerNorms sit for norm_first={norm_first}"


# -- DecoderLayer --------------------------------------------------------------------------------------------
def _build_injected(case: Case, D: int, H: int, F: int, norm_first: bool, dropout: float = 0.1,
                    state: dict | None = None, cross: bool = True) -> None:
    """Steps building ``layer`` from the notebook's given attention modules and an nn.Sequential FFN
    (``cross=False``: a decoder-only layer, ``cross_attn=False``)."""
    case.call("MultiHeadAttention", D, H, let="sa")
    if cross:
        case.call("CrossAttention", D, H, let="ca")
    case.let("nn_", {"global": "nn"})
    case.call({"attr": ["nn_", "Sequential"]}, let="ff")
    for name, kind, args in (("linear1", "Linear", [D, F]), ("relu", "ReLU", []), ("linear2", "Linear", [F, D])):
        case.call({"attr": ["nn_", kind]}, *args, let=f"ff_{name}")
        case.method("ff", "add_module", name, {"ref": f"ff_{name}"})
    case.call("DecoderLayer", D, H, F, dropout=dropout, norm_first=norm_first, self_attn={"ref": "sa"},
              cross_attn={"ref": "ca"} if cross else False, feed_forward={"ref": "ff"}, let="layer")
    if state is not None:
        case.load_state("layer", state)


def _forward(case: Case, obj: str, *args, record: str = "out") -> None:
    """``obj.forward(*args)``, trailing None arguments left out (the defaults); an array becomes a tensor."""
    args = list(args)
    while args and args[-1] is None:
        args.pop()
    case.method(obj, "forward", *(a if a is None or isinstance(a, dict) else case.tensor(a) for a in args),
                record=record)


@exercise(LESSON, "DecoderLayer")
class DecoderLayerCheck(Exercise):
    """Against nn.TransformerDecoderLayer with copied weights (eval; both LN placements; causal + memory
    padding; T != S; B = 1), leakage of the future and of memory padding, injected sublayers used, dropout
    active in training, default sublayers of the right kinds, inputs unchanged."""

    # wrapping PyTorch's own layer would skip the exercise
    forbidden = ("nn.TransformerDecoderLayer", "nn.TransformerDecoder")

    def cases(self, rng):
        B, T, S, D, H, F = 2, 5, 7, 16, 4, 24  # T != S != H, Dh = 4, F != D
        causal = causal_mask(T)
        mem_is_real, tgt_is_real = _padded(rng, B, S), _padded(rng, B, T)
        x, memory = _inputs(rng, B, T, S, D)
        t0, x_future, memory_pad = _perturbed(rng, x, memory, mem_is_real)
        mem_empty = mem_is_real.copy()
        mem_empty[1] = False  # one sequence with no real memory token: finite, zeros from the attention
        post, pre, empty = (_layer_state(rng, D, F) for _ in range(3))
        B1, T1, S1, D1, H1, F1 = 1, 3, 6, 12, 2, 20  # B = 1, T != S, another width and head count
        x1, memory1 = _inputs(rng, B1, T1, S1, D1)
        nf1 = bool(rng.integers(2))
        sizes, dims = f"B={B}, T={T}, S={S}, D={D}, H={H}, F={F}", (D, H, F)
        # id, situation, (D, H, F), weights, norm_first, x, memory, causal, target padding, memory padding
        rows = [
            *leak_rows(sizes, dims, post, pre, x, x_future, memory, memory_pad, causal, tgt_is_real, mem_is_real),
            ("b1", f"B=1, T={T1}, S={S1}, D={D1}, H={H1}, F={F1}, {'pre' if nf1 else 'post'}-LN, no masks",
             (D1, H1, F1), _layer_state(rng, D1, F1), nf1, x1, memory1, None, None, None),
            ("empty", f"{sizes}, post-LN, batch item 1 has no real memory token", dims, empty, False, x, memory,
             causal, None, mem_empty),
        ]
        cases = []
        for case_id, desc, (Dc, Hc, Fc), state, norm_first, xs, ms, cm, tgt, mem in rows:
            case = Case(case_id, desc, data={"state": state, "D": Dc, "H": Hc, "F": Fc, "norm_first": norm_first,
                                             "x": xs, "memory": ms, "causal": cm, "tgt_is_real": tgt,
                                             "mem_is_real": mem, "t0": t0})
            _build_injected(case, Dc, Hc, Fc, norm_first, state=state)
            case.eval("layer")
            case.let("x", case.tensor(xs))
            case.let("memory", case.tensor(ms))
            _forward(case, "layer", {"ref": "x"}, {"ref": "memory"}, _self_allowed(cm, tgt),
                     _cross_allowed(mem, xs.shape[1]))
            if case_id == "post":
                judges.record_after(case, ("x", "memory"))
                # the injected modules must be the ones used: the state dict was loaded into them
                for name, path in (("sa_q", ["sa", "q_proj"]), ("ca_q", ["ca", "q_proj"]),
                                   ("ff_w1", ["ff", "linear1"])):
                    case.record(name, {"attr": [*path, "weight", "data"]})
            cases.append(case)

        # Dropout: active in training mode, off in eval mode
        case = Case("train", f"B={B}, T={T}, S={S}, dropout=0.5, training mode then eval mode",
                    data={"x": x, "memory": memory})
        _build_injected(case, D, H, F, False, dropout=0.5, state=_layer_state(rng, D, F))
        case.steps.append({"train": "layer"})
        case.seed(int(rng.integers(2**31)))
        for record in ("out_train", "out_eval", "out_eval2"):
            if record == "out_eval":
                case.eval("layer")
            _forward(case, "layer", x, memory, causal, record=record)
        cases.append(case)

        # Nothing injected: the layer builds its own sublayers of the contract's kinds
        case = Case("default", f"DecoderLayer({D}, {H}, {F}) with no sublayer given",
                    data={"x": x, "call": f"DecoderLayer({D}, {H}, {F})"})
        case.call("DecoderLayer", D, H, F, let="layer")
        for sub in ("self_attn", "cross_attn", "feed_forward", *NORMS):
            case.record(sub, {"attr": ["layer", sub]})
        case.eval("layer")
        _forward(case, "layer", x, memory, causal)
        cases.append(case)

        # cross_attn=False: a decoder-only layer (lesson 11's GPT), no cross-attention sublayer and no memory
        only = {key: value for key, value in _layer_state(rng, D, F).items()
                if not key.startswith(("cross_attn.", "norm2."))}
        case = Case("decoder_only", f"DecoderLayer({D}, {H}, {F}, norm_first=True, cross_attn=False), B={B}, "
                    f"T={T}, causal mask, no memory", data={"state": only, "x": x, "causal": causal, "H": H, "F": F})
        _build_injected(case, D, H, F, True, state=only, cross=False)  # the given sublayers: only the layer on trial
        case.eval("layer")
        _forward(case, "layer", x, None, causal)
        cases.append(case)
        return cases

    def judge(self, result: Result):
        self._judge_default(result)
        outs = {case_id: result.get(case_id, "out", what="DecoderLayer's output", kind="tensor", dtype="float",
                                    shape=result.cases[case_id].data["x"].shape)
                for case_id in ("post", "post_future", "post_pad", "pre", "b1", "empty")}
        post = result.cases["post"]
        # The injected sublayers are the ones that run
        for name, key, what in (("sa_q", "self_attn.q_proj.weight", "self_attn"),
                                ("ca_q", "cross_attn.q_proj.weight", "cross_attn"),
                                ("ff_w1", "feed_forward.linear1.weight", "feed_forward")):
            got, want = result.get("post", name, what=f"the injected {what}'s weights", kind="tensor"), \
                post.data["state"][key]
            if got.shape != want.shape or not np.allclose(got, want):
                raise Fail(f"the `{what}` passed to DecoderLayer(...) was not used: store the module you are given "
                           f"(self.{what} = {what} when it is not None) and build your own only when it is None.")
        # Leakage, before values: it names the idea that broke
        _leaks(outs, post, "Only the self-attention may mix positions of x, under self_allowed: pass it along; the "
               "cross-attention's keys and values come from the memory.",
               "pass cross_allowed to the cross-attention sublayer.")
        # Values against PyTorch's nn.TransformerDecoderLayer with the same weights
        for case_id in ("post", "pre", "b1"):
            case = result.cases[case_id]
            d = case.data
            masks = (d["x"], d["memory"], d["causal"], d["tgt_is_real"], d["mem_is_real"])
            other = _torch_forward(_torch_layer(d["state"], d["H"], d["F"], not d["norm_first"]), *masks)
            hint = judges.diagnose(outs[case_id], {_placement(d["norm_first"]): other}) or (
                "Post-LN (norm_first=False): x = norm(x + sublayer(x)); pre-LN (norm_first=True): "
                "x = x + sublayer(norm(x)); the sublayers run in the order self-attention (norm1), "
                "cross-attention over the memory (norm2), feed-forward (norm3).")
            expect_close(outs[case_id], _torch_forward(_torch_layer(d["state"], d["H"], d["F"], d["norm_first"]),
                                                       *masks),
                         "DecoderLayer's output (vs nn.TransformerDecoderLayer with the same weights)", case.desc,
                         rtol=1e-4, atol=1e-4, hint=hint)
        # A sequence without memory: our attention gives zeros, PyTorch's NaN, so the reference layer judges
        d = result.cases["empty"].data
        expect_close(outs["empty"], _reference_layer_out(d, d["causal"], _cross_allowed(d["mem_is_real"],
                                                                                        d["x"].shape[1])),
                     "DecoderLayer's output", result.cases["empty"].desc, rtol=1e-4, atol=1e-4,
                     hint="Pass cross_allowed to the cross-attention unchanged: the given CrossAttention already "
                          "returns zeros for a query with no allowed key.")
        _unchanged(result, "post", {"x": post.data["x"], "memory": post.data["memory"]}, "DecoderLayer",
                   "In a layer: `x = x + ...`, not `x += ...`.")
        judges.dropout(result, "train", "DecoderLayer", result.cases["train"].data["x"].shape,
                       "with dropout1..3, to each sublayer's output before its residual addition")
        self._judge_decoder_only(result)

    @staticmethod
    def _judge_default(result: Result):
        case = result.cases["default"]
        kinds = {"self_attn": "MultiHeadAttention", "cross_attn": "CrossAttention", "feed_forward": "FeedForward",
                 **{norm: "LayerNorm" for norm in NORMS}}
        for sub, kind in kinds.items():
            got = result.meta("default", sub).get("type", "None")
            if not got.endswith(kind):
                raise Fail(f"{case.data['call']}, built without sublayers given, should make `self.{sub}` a {kind}, "
                           f"but it is `{got.rsplit('.', 1)[-1]}`.")
        result.get("default", "out", what="DecoderLayer's output", kind="tensor", dtype="float",
                   shape=case.data["x"].shape)

    @staticmethod
    def _judge_decoder_only(result: Result) -> None:
        case = result.cases["decoder_only"]
        d = case.data
        error = result.error(case.id)
        if error is not None:
            raise Raised(f"DecoderLayer(..., cross_attn=False) raised on a case with {case.desc}:\n    "
                         f"{error.splitlines()[-1]}\nWith cross_attn=False the layer has no cross-attention "
                         "sublayer at all (no cross_attn, norm2 or dropout2 parameters to load), and forward(x, None, "
                         "self_allowed) runs masked self-attention, then the feed-forward.")
        got = result.get(case.id, "out", what="DecoderLayer(..., cross_attn=False)'s output", kind="tensor",
                         dtype="float", shape=d["x"].shape)
        # PyTorch's encoder layer is the decoder-only layer: its norm2 is our norm3 (the feed-forward's)
        state = {("norm2." + key[len("norm3."):] if key.startswith("norm3.") else key): value
                 for key, value in d["state"].items()}
        theirs = twins.torch_twin(state, "encoder", d["H"], d_ff=d["F"], norm_first=True, dtype=torch.float64)
        with torch.no_grad():
            want = theirs(torch.from_numpy(np.asarray(d["x"], np.float64)), src_mask=_blocked(d["causal"])).numpy()
        expect_close(got, want, "DecoderLayer(..., cross_attn=False)'s output", case.desc, rtol=1e-4, atol=1e-4,
                     hint="A decoder-only layer is PyTorch's encoder layer with a causal mask: masked "
                          "self-attention, then the feed-forward, each with its residual and norm (norm1, norm3), "
                          "and no cross-attention step between them.")
