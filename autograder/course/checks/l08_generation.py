"""Hidden checks of lesson 08-generation (PyTorch): sampling and sample_n.

greedy_decode, beam_search and the three filters are specs (``decoder_course/visible/l08_generation.py``). Sampling
runs on the model-free stand-ins of ``decoder_course.testing``, built in the kernel from plain data (their
``spec``) and again here, so the trusted side knows every logit; it is judged by what any correct sampler
guarantees: a seeded generator reproduces its draws whatever the global random state, no draw falls outside
top-k/top-p, first-token frequencies follow softmax(logits / temperature), and temperature 0 is greedy.

Every decoder case is one :func:`_decode_case` (a stand-in model, the source, the call, the inputs to find
unchanged) and is judged by :func:`_tokens` (type, shape, EOS and padding per row) and :func:`_same_tokens`.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.course.checks import judges, relative, spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result
from autograder.course.reference import generation as ref
from decoder_course.conventions import BOS, EOS
from decoder_course.testing import ScriptedModel
from decoder_course.visible import l08_generation as visible
from decoder_course.visible.l08_generation import hashed_model as _hashed
from decoder_course.visible.l08_generation import padded_source as _padded_source
from decoder_course.visible.l08_generation import scripted_model as _scripted

LESSON = "08-generation"


def _run(fn, model, src: np.ndarray, is_real: np.ndarray | None, *args, **kwargs) -> np.ndarray:
    """A reference decoder on the trusted copy of a model, as NumPy ids."""
    real = None if is_real is None else torch.from_numpy(is_real)
    return fn(model, torch.from_numpy(src), *args, src_is_real=real, **kwargs).numpy()


def _decode_case(case_id: str, desc: str, fn: str, model, src: np.ndarray, is_real: np.ndarray | None, max_len: int,
                 *, n: int | None = None, keep: tuple[str, ...] = (), data: dict | None = None, reference=None,
                 bos_id: int = BOS, **kwargs) -> Case:
    """``fn(m, src_ids, [n,] max_len, BOS, EOS, src_is_real=..., **kwargs)`` on a stand-in ``model`` (built in the
    kernel from its ``spec``), recorded as ``out``; ``src_is_real`` is passed only when given, ``keep`` names the
    inputs (``src_ids``, ``src_is_real``) to find unchanged after the call, and the ``reference`` decoder (if given)
    run with the same arguments gives the expected ids, ``want``."""
    case = Case(case_id, desc, data={"B": len(src), "max_len": max_len, "pad_id": kwargs.get("pad_id", 0), "n": n,
                                     "src": src, "is_real": is_real, "model": model, **(data or {})})
    if reference is not None:
        case.data["want"] = _run(reference, model, src, is_real, max_len, bos_id, EOS, **kwargs)
    case.let("m", model.spec)
    case.let("src_ids", case.tensor(src))
    if is_real is not None:
        case.let("src_is_real", case.tensor(is_real))
        kwargs["src_is_real"] = {"ref": "src_is_real"}
    case.call(fn, {"ref": "m"}, {"ref": "src_ids"}, *(() if n is None else (n,)), max_len, bos_id, EOS, record="out",
              **kwargs)
    judges.record_after(case, keep)
    case.data["kept"] = {name: {"src_ids": src, "src_is_real": is_real}[name] for name in keep}
    return case


def _raise_with_dependencies(result: Result, case: Case, runs: str) -> None:
    """An exception on a case of an exercise built on others: show it, and say which of the student's own pieces
    ran inside it (their bugs surface here too)."""
    error = result.error(case.id)
    if error is not None:
        raise Fail(f"your code raised an exception on a case with {case.desc}:\n    {error.splitlines()[-1]}\n"
                   f"{runs}: if one of their checks fails, fix it first.")


# -- judging outputs -------------------------------------------------------------------------------------------------
def _tokens(result: Result, case: Case, what: str, name: str = "out") -> np.ndarray:
    """The ids (B, L) of a :func:`_decode_case`, with each row's EOS and padding checked (the public property)."""
    d = case.data
    got = result.get(case.id, name, what=what, kind="tensor", dtype="int")
    with spec.shared():
        visible.expect_generated(got, d["B"], d["max_len"], d["pad_id"], what, case.desc)
    return got


def _same_tokens(got: np.ndarray, want: np.ndarray, what: str, desc: str, hint: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        rows = [b for b in range(min(len(got), len(want)))
                if got.shape[1:] != want.shape[1:] or not np.array_equal(got[b], want[b])]
        first = rows[0] if rows else 0
        raise Fail(f"{what} is wrong for {len(rows) or 'some'} of {len(want)} rows, the first being row {first} "
                   f"({desc}). {hint}")


# -- sample ------------------------------------------------------------------------------------------------------------
UNDRAWN = 1e-30  # probability of a token a scripted distribution must never give, even tempered (see "temp")


def _first_step_tree(rng: np.random.Generator, V: int) -> tuple[dict, dict[int, float]]:
    """A one-step tree: five tokens with clearly different probabilities, then EOS."""
    tokens = [int(t) for t in rng.choice(np.arange(3, V), size=5, replace=False)]
    probs = np.array([0.36, 0.26, 0.18, 0.12, 0.08])
    return {t: (float(p), None) for t, p in zip(tokens, probs, strict=True)}, dict(zip(tokens, probs.tolist(),
                                                                                       strict=True))


def _looping(rng: np.random.Generator, best: float, runner_up: tuple[float, float],
             bos_is_best: bool = False) -> tuple[ScriptedModel, int]:
    """A scripted model over 8 tokens that gives two tokens the logits ``best`` and about ``runner_up`` at every
    step (every other token -9): it loops on one token unless penalised. Returns it with its bos_id: BOS, or with
    ``bos_is_best`` the favourite itself (a token the model also generates, as GPT-2's one special token is)."""
    a, b = (int(t) for t in rng.choice(np.arange(3, 8), size=2, replace=False))
    loop = [-9.0] * 8
    loop[a], loop[b] = best, float(rng.uniform(*runner_up))
    bos_id = a if bos_is_best else BOS
    return _scripted(8, table=[[[], loop]], default_logits=loop, bos_id=bos_id), bos_id


def _allowed_tokens(logits: torch.Tensor, prev: list[int], temperature: float, top_k, top_p, penalty: float):
    """Tokens a correct sampler may draw at one step (the nucleus widened by a hair against rounding)."""
    x = logits.float()[None]  # (1, V)
    if penalty != 1.0 and prev:
        x = ref.apply_repetition_penalty(x, torch.tensor([prev]), penalty)
    x = x / temperature
    if top_k is not None:
        x = ref.top_k_filter(x, top_k)
    if top_p is not None:
        x = ref.top_p_filter(x, min(1.0, top_p + 1e-3))
    return set(torch.isfinite(x[0]).nonzero().flatten().tolist())


def _first_excluded(case: Case, b: int, row: list[int]) -> int | None:
    """The step of the first token of ``row`` that a correct sampler with the case's settings could not draw after
    that row's prefix, on source ``b``; None when every token could be drawn."""
    d = case.data
    s = {"temperature": 1.0, "top_k": None, "top_p": None, "repetition_penalty": 1.0, **d["settings"]}
    real = d["src"][b][d["is_real"][b]].tolist()
    prefix: list[int] = []
    for token in row:
        if prefix and prefix[-1] == EOS:
            break
        if token not in _allowed_tokens(d["model"].next_logits(real, [BOS] + prefix), prefix, s["temperature"],
                                        s["top_k"], s["top_p"], s["repetition_penalty"]):
            return len(prefix)
        prefix.append(token)
    return None


@exercise(LESSON, "sample")
class Sample(Exercise):
    """Reproducible with a generator whatever the global seed, varies with the seed; never outside top-k/top-p;
    first-token frequencies follow softmax(logits / temperature); temperature 0 and the repetition penalty against
    the reference; per-row EOS and padding with pad_id != 0 on a padded batch with every knob set."""

    uses = ("top_k_filter", "top_p_filter", "apply_repetition_penalty")  # sample calls all three
    reference = ref

    def cases(self, rng):
        # 1. reproducibility: same generator seed under two different global seeds, then another generator seed
        pad_id = int(rng.integers(4, 9))
        src, is_real = _padded_source(rng, rng.integers(2, 7, size=12), 6, 14, pad_id)
        model = _hashed(14, int(rng.integers(2**31)), eos_bias=0.3, scale=0.7, pad_id=pad_id)
        g1, g2 = (int(s) for s in rng.integers(2**31, size=2))
        case = Case("repro", f"B=12 padded sources, V=14, pad_id={pad_id}, temperature 1, a seeded generator",
                    data={"B": 12, "max_len": 10, "pad_id": pad_id, "src": src, "is_real": is_real,
                          "model": model, "settings": {"temperature": 1.0}})
        case.let("m", model.spec)
        for name, global_seed, generator in (("a", 1, g1), ("b", 2, g1), ("c", 3, g2)):
            case.seed(int(rng.integers(2**31)) + global_seed)  # a different global random state each time
            case.call("sample", {"ref": "m"}, case.tensor(src), 10, BOS, EOS, generator={"generator": generator},
                      src_is_real=case.tensor(is_real), pad_id=pad_id, record=name)
        cases = [case]
        # 2. filters: first tokens drawn with top-k, top-p and both
        V = 10
        tree, first = _first_step_tree(rng, V)
        settings = [{"top_k": int(rng.integers(2, 4))}, {"top_p": float(rng.choice([0.55, 0.7]))},
                    {"temperature": 2.0, "top_k": 4, "top_p": 0.6},
                    {"top_k": 2, "top_p": 0.55}]  # top-k leaves 0.58 on the top token: it alone reaches p
        model = _scripted(V, tree=tree, floor=1e-9)  # the filters exclude every token but the five
        case = Case("filters", "800 first tokens drawn from a scripted five-token distribution, with top-k, top-p "
                               "and both", data={"first": first, "settings": settings, "B": 800, "max_len": 1,
                                                 "pad_id": 0, "model": model})
        case.let("m", model.spec)
        for i, setting in enumerate(settings):
            case.call("sample", {"ref": "m"}, case.tensor(np.zeros((800, 1), np.int64)), 1, BOS, EOS,
                      generator={"generator": int(rng.integers(2**31))}, record=f"s{i}", **setting)
        cases.append(case)
        # 3. temperature: frequencies of 3000 first tokens. The other tokens (BOS among them) get 1e-30: at
        # temperature 2 a floor of 1e-9 is 1.5e-5 a draw, and a correct sampler drew a BOS, which no row may start
        # with, in 4 % of the runs (the canary failed on such a secret)
        tree, first = _first_step_tree(rng, V)
        temperature = float(rng.choice([0.5, 2.0]))
        cases.append(_decode_case(
            "temp", f"3000 first tokens drawn from a scripted five-token distribution, temperature {temperature}",
            "sample", _scripted(V, tree=tree, floor=UNDRAWN), np.zeros((3000, 1), np.int64), None, 1,
            data={"first": first, "temperature": temperature}, temperature=temperature,
            generator={"generator": int(rng.integers(2**31))}))
        # 4. temperature 0 is greedy, on a padded batch
        pad_id = int(rng.integers(4, 9))
        src, is_real = _padded_source(rng, rng.integers(1, 6, size=4), 5, 12, pad_id)
        model = _hashed(12, int(rng.integers(2**31)), eos_bias=0.5, pad_id=pad_id)
        greedy = _run(ref.greedy_decode, model, src, is_real, 9, BOS, EOS, pad_id=pad_id)
        cases.append(_decode_case("greedy", f"B=4 padded sources, pad_id={pad_id}, temperature 0", "sample", model,
                                  src, is_real, 9, data={"want": greedy}, temperature=0, pad_id=pad_id))
        # 5. repetition penalty at temperature 0 on a looping model: two tokens neck and neck
        model, _ = _looping(rng, 1.0, (0.8, 0.9))
        penalty = float(rng.choice([1.5, 2.0]))
        cases.append(_decode_case("penalty", f"a scripted model that loops on one token, temperature 0, "
                                  f"repetition_penalty={penalty}", "sample", model, np.zeros((2, 2), np.int64), None,
                                  6, reference=ref.sample, temperature=0, repetition_penalty=penalty))
        # 5a. BOS is not a generated token: the favourite is bos_id itself, so penalising BOS moves the first token
        model, bos_id = _looping(rng, 1.0, (0.8, 0.9), bos_is_best=True)
        cases.append(_decode_case("bos", f"a scripted model that loops on one token, which is also bos_id={bos_id}, "
                                  f"temperature 0, repetition_penalty={penalty}", "sample", model,
                                  np.zeros((2, 2), np.int64), None, 6, reference=ref.sample, bos_id=bos_id,
                                  temperature=0, repetition_penalty=penalty))
        # 5b. the repetition penalty when sampling: a strong favourite, a runner-up, a heavy penalty
        cases.append(_decode_case("penalty_t", "400 rows of two tokens sampled at temperature 1 from a scripted model "
                                  "that prefers one token, repetition_penalty=10", "sample",
                                  _looping(rng, 8.0, (6.8, 7.2))[0], np.zeros((400, 1), np.int64), None, 2,
                                  temperature=1.0, repetition_penalty=10.0,
                                  generator={"generator": int(rng.integers(2**31))}))
        # 6. every knob on a padded batch: EOS and padding per row, no draw outside the filters
        pad_id = int(rng.integers(4, 9))
        src, is_real = _padded_source(rng, rng.integers(1, 7, size=10), 6, 16, pad_id)
        seed = int(rng.integers(2**31))
        settings = {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}
        cases.append(_decode_case("knobs", f"B=10 padded sources, V=16, pad_id={pad_id}, temperature 0.8, top_k 5, "
                                  "top_p 0.9, repetition_penalty 1.3", "sample",
                                  _hashed(16, seed, eos_bias=0.4, pad_id=pad_id), src, is_real, 12,
                                  data={"settings": settings}, generator={"generator": seed}, pad_id=pad_id,
                                  **settings))
        return cases

    @staticmethod
    def _check_draws(got: np.ndarray, case: Case) -> None:
        """Every token of every row is one a correct sampler may draw after that row's prefix."""
        for b, row in enumerate(got.tolist()):
            step = _first_excluded(case, b, row)
            if step is not None:
                raise Fail(f"sample drew a token that its settings exclude (row {b}, step {step}; {case.desc}). Per "
                           "step: repetition penalty with the tokens so far, divide by the temperature, top_k_filter, "
                           "top_p_filter, softmax, then one draw per row; and pass src_is_real to the model.")

    def judge(self, result: Result):
        for case in result.cases.values():
            _raise_with_dependencies(result, case, "sample runs your top_k_filter, top_p_filter and "
                                                   "apply_repetition_penalty")
        # the most specific diagnosis first: the temperature before the filters that depend on it
        for case_id in ("repro", "temp", "greedy", "penalty", "bos", "penalty_t", "filters", "knobs"):
            getattr(self, f"_judge_{case_id}")(result, result.cases[case_id])

    def _judge_repro(self, result: Result, case: Case):
        outs = {name: _tokens(result, case, "sample(...)", name) for name in "abc"}
        if outs["a"].shape != outs["b"].shape or not np.array_equal(outs["a"], outs["b"]):
            raise Fail(f"two calls with generators of the same seed gave different samples ({case.desc}): draw with "
                       "torch.multinomial(probs, 1, generator=generator), never from the global random state, so "
                       "that a caller's generator decides every draw.")
        if outs["a"].shape == outs["c"].shape and np.array_equal(outs["a"], outs["c"]):
            raise Fail(f"generators with different seeds gave identical samples ({case.desc}): is the next token "
                       "drawn at random from softmax(logits / temperature)?")
        self._check_draws(outs["a"], case)

    def _judge_filters(self, result: Result, case: Case):
        d = case.data
        for i, setting in enumerate(d["settings"]):
            got = _tokens(result, case, "sample(...)", f"s{i}")
            logits = torch.log(torch.tensor([d["first"].get(t, 1e-9) for t in range(10)]))
            allowed = _allowed_tokens(logits, [], setting.get("temperature", 1.0), setting.get("top_k"),
                                      setting.get("top_p"), 1.0)
            drawn = set(got[:, 0].tolist())
            swapped = _allowed_tokens(logits, [], setting.get("temperature", 1.0), None, setting.get("top_p"), 1.0)
            if setting.get("top_k") is not None and setting.get("top_p") is not None:
                swapped &= _allowed_tokens(logits, [], 1.0, setting["top_k"], None, 1.0)
            if not drawn <= allowed and drawn <= swapped:
                raise Fail(f"with {setting}, sample drew {len(drawn - allowed)} token(s) that top-k then top-p "
                           f"exclude ({case.desc}): top-p must take its nucleus from the distribution top-k left "
                           "(renormalised over the k kept tokens), so apply top_k_filter first, then top_p_filter.")
            if not drawn <= allowed:
                raise Fail(f"with {setting}, sample drew {len(drawn - allowed)} token(s) outside the allowed set "
                           f"({case.desc}): filtered logits are -inf and must never be drawn. Divide by the "
                           "temperature, then top_k_filter, then top_p_filter.")
            if drawn != allowed:
                raise Fail(f"with {setting}, only {len(drawn)} of the {len(allowed)} allowed tokens were drawn in "
                           f"{d['B']} draws ({case.desc}): divide by the temperature before filtering (top-p depends "
                           "on it), then draw from the softmax of the filtered logits, not its argmax.")

    def _judge_temp(self, result: Result, case: Case):
        d = case.data
        got = _tokens(result, case, "sample(...)")[:, 0]
        tokens = list(d["first"])
        logits = torch.log(torch.tensor([d["first"][t] for t in tokens], dtype=torch.float64))
        want = torch.softmax(logits / d["temperature"], -1).numpy()  # PyTorch's softmax of the tempered logits
        freq = np.array([(got == t).mean() for t in tokens])
        sigma = np.sqrt(want * (1 - want) / d["B"])
        if np.any(np.abs(freq - want) > 5 * sigma + 0.01):
            raise Fail(f"the frequencies of the first token do not follow softmax(logits / temperature) "
                       f"({case.desc}): divide the logits by the temperature (temperature < 1 sharpens, > 1 "
                       "flattens), then draw from the softmax.")

    def _judge_greedy(self, result: Result, case: Case):
        got = _tokens(result, case, "sample(..., temperature=0)")
        _same_tokens(got, case.data["want"], "sample(..., temperature=0)", case.desc,
                     "temperature == 0 means greedy: take the argmax of the (penalised) logits at each step.")

    def _judge_penalty(self, result: Result, case: Case):
        d = case.data
        got = _tokens(result, case, "sample(..., repetition_penalty=...)")
        _same_tokens(got, d["want"], "sample(..., temperature=0, repetition_penalty=...)", case.desc,
                     "Apply the penalty before choosing, with the tokens generated so far (BOS excluded); a token "
                     "seen several times is penalised once.")

    def _judge_bos(self, result: Result, case: Case):
        d = case.data
        got = _tokens(result, case, "sample(..., bos_id=...)")
        _same_tokens(got, d["want"], "sample(..., temperature=0, repetition_penalty=...)", case.desc,
                     "BOS is excluded from the repetition penalty: it reads the tokens generated so far (tgt[:, 1:]), "
                     "and BOS is the decoder's first input, not a generated token; here bos_id is also a token the "
                     "model generates, so penalising it changes the first token.")

    def _judge_penalty_t(self, result: Result, case: Case):
        got = _tokens(result, case, "sample(..., repetition_penalty=10)")
        repeats = float((got[:, 0] == got[:, 1]).mean())
        if repeats > 0.05:
            raise Fail(f"{repeats:.0%} of the rows drew the same token twice ({case.desc}); penalised, the first "
                       "token's logit falls below the other's and a repeat is rare (under 1 %). Apply the repetition "
                       "penalty at every step whatever the temperature, before dividing by it: not only on the "
                       "greedy path.")

    def _judge_knobs(self, result: Result, case: Case):
        self._check_draws(_tokens(result, case, "sample(...)"), case)


# -- sample_n: find the bug (autograder.course.bugs), judged relative to the student's sample and its filters ----------
def _sample_rows(src: np.ndarray, is_real: np.ndarray | None, n: int, how: str):
    """The batch handed to sample: n copies of each source side by side ("interleave"), or the batch tiled n
    times ("tile"); its padding the same way, or the other way ("mixed": rows interleaved, padding tiled)."""
    rows = np.repeat(src, n, axis=0) if how in ("interleave", "mixed") else np.tile(src, (n, 1))
    if is_real is None:
        return rows, None
    return rows, np.repeat(is_real, n, axis=0) if how == "interleave" else np.tile(is_real, (n, 1))


# known wrong layouts of sample_n's batch: what each returns at temperature 0 is named when a student's matches
LAYOUTS = {
    "tile": "that of the batch tiled (repeat: all sources, then all again), while view(B, n) reads n copies of each "
            "source side by side: sample j of source b came from another source",
    "mixed": "that of the sources copied side by side but their padding tiled: each copy reads another source's "
             "src_is_real",
    "transposed": "that of the right rows read back as (n, B): sample j of source b is row b * n + j of sample's "
                  "output, so view(B, n) is right once the rows are",
}


def _layouts(model, src, is_real, n, max_len, pad_id) -> dict[str, np.ndarray]:
    """What the known wrong layouts (LAYOUTS) return at temperature 0 (greedy rows), as (B, n, L) ids."""
    B = src.shape[0]
    outs = {}
    for how in ("tile", "mixed"):
        rows, real = _sample_rows(src, is_real, n, how)
        outs[LAYOUTS[how]] = _run(ref.greedy_decode, model, rows, real, max_len, BOS, EOS,
                                  pad_id=pad_id).reshape(B, n, -1)
    rows, real = _sample_rows(src, is_real, n, "interleave")
    flat = _run(ref.greedy_decode, model, rows, real, max_len, BOS, EOS, pad_id=pad_id)
    outs[LAYOUTS["transposed"]] = flat.reshape(n, B, -1).transpose(1, 0, 2)  # right rows, read back as (n, B)
    return outs


@exercise(LESSON, "sample_n")
class SampleN(Exercise):
    """The given function hands the student's sample n copies of every source; the shown bug tiles the batch
    (repeat) where view(B, n) expects copies side by side (repeat_interleave). Temperature 0 on padded sources
    against the reference (every sample of a source is its greedy answer), known wrong layouts named; sampled
    cases judged by what any correct sampler gives (every token one that source's settings allow, samples that
    vary); B = 1, src_is_real None; the caller's tensors unchanged."""

    # it calls the student's sample, and through it their three filters
    uses = ("sample", "top_k_filter", "top_p_filter", "apply_repetition_penalty")
    reference = ref

    def cases(self, rng):
        # 1. temperature 0: deterministic, so every sample of source b is source b's greedy answer
        pad_id = int(rng.integers(4, 9))
        for _ in range(50):
            seed = int(rng.integers(2**31))
            src, is_real = _padded_source(rng, [6, int(rng.integers(2, 5)), int(rng.integers(1, 4))], 6, 14, pad_id)
            model = _hashed(14, seed, eos_bias=0.5, pad_id=pad_id)
            want = _run(ref.greedy_decode, model, src, is_real, 8, BOS, EOS, pad_id=pad_id)
            if len({tuple(row) for row in want.tolist()}) == 3:
                break  # three sources, three different answers: a sample of the wrong source shows
        n = 2  # n != B: a tiled batch and rows read back as (n, B) give different wrong answers
        cases = [_decode_case("greedy", f"B=3 padded sources of different lengths, n={n}, temperature 0, "
                              f"pad_id={pad_id}", "sample_n", model, src, is_real, 8, n=n,
                              keep=("src_ids", "src_is_real"), temperature=0, pad_id=pad_id,
                              data={"want": np.repeat(want[:, None], n, axis=1),
                                    "layouts": _layouts(model, src, is_real, n, 8, pad_id)})]
        # 2. sampling with top-k 2: every token of sample (b, j) must be one of source b's two best
        pad_id = int(rng.integers(4, 9))
        src, is_real = _padded_source(rng, [6, int(rng.integers(2, 6)), int(rng.integers(1, 5))], 6, 14, pad_id)
        seed = int(rng.integers(2**31))
        settings = {"temperature": 1.0, "top_k": 2}
        cases.append(_decode_case("sampled", f"B=3 padded sources, n=4, temperature 1, top_k 2, a seeded generator, "
                                  f"pad_id={pad_id}", "sample_n", _hashed(14, seed, eos_bias=0.2, pad_id=pad_id),
                                  src, is_real, 8, n=4, generator={"generator": seed}, pad_id=pad_id,
                                  data={"settings": settings}, **settings))
        # 3. one source, where any layout is right
        src = rng.integers(3, 12, size=(1, 5))
        seed = int(rng.integers(2**31))
        settings = {"temperature": 0.8, "top_p": 0.9}
        cases.append(_decode_case("b1", "B=1, n=5, src_is_real=None, temperature 0.8, top_p 0.9", "sample_n",
                                  _hashed(12, seed, eos_bias=0.3), src, None, 7, n=5, generator={"generator": seed},
                                  data={"is_real": np.ones_like(src, bool), "settings": settings}, **settings))
        # 4. no padding information, temperature 0
        src = rng.integers(3, 12, size=(2, 4))
        model = _hashed(12, int(rng.integers(2**31)), eos_bias=0.4)
        greedy = _run(ref.greedy_decode, model, src, None, 6, BOS, EOS)
        cases.append(_decode_case("nomask", "B=2, S=4, n=2, src_is_real=None, temperature 0", "sample_n", model, src,
                                  None, 6, n=2, temperature=0, data={
                                      "want": np.repeat(greedy[:, None], 2, 1),
                                      "layouts": _layouts(model, src, None, 2, 6, 0)}))
        return cases

    @staticmethod
    def _samples(result: Result, case: Case) -> np.ndarray:
        d = case.data
        _raise_with_dependencies(result, case, "sample_n runs your sample (and its filters)")
        got = result.get(case.id, "out", what="sample_n(...)", kind="tensor", dtype="int")
        if got.ndim != 3 or got.shape[:2] != (d["B"], d["n"]):
            raise Fail(f"sample_n should return (B, n, L) = ({d['B']}, {d['n']}, L) ids, got shape "
                       f"{tuple(got.shape)} ({case.desc}).")
        with spec.shared():
            visible.expect_generated(got.reshape(d["B"] * d["n"], -1), d["B"] * d["n"], d["max_len"], d["pad_id"],
                                     "sample_n's output", case.desc)
        return got

    def judge(self, result: Result):
        for case in result.cases.values():
            self._samples(result, case)
        for case_id in ("greedy", "nomask"):
            case = result.cases[case_id]
            d = case.data
            got = self._samples(result, case)
            if got.shape == d["want"].shape and np.array_equal(got, d["want"]):
                continue
            hint = judges.diagnose(got, d["layouts"]) or (
                "Row b * n + j of the batch given to sample must hold source b and its own padding (repeat_interleave "
                "copies each row n times side by side; repeat tiles the batch).")
            bad = [(b, j) for b in range(d["B"]) for j in range(d["n"])
                   if got.shape != d["want"].shape or not np.array_equal(got[b, j], d["want"][b, j])]
            b, j = bad[0] if bad else (0, 0)
            raise Fail(f"at temperature 0 every sample of a source is that source's greedy answer, but sample "
                       f"{j} of source {b} is not ({case.desc}). {hint}")
        for case_id in ("sampled", "b1"):
            case = result.cases[case_id]
            self._check_draws(self._samples(result, case), case)
        self._check_layout(result, result.cases["sampled"])
        judges.unchanged(result, "greedy", result.cases["greedy"].data["kept"], "sample_n")

    @staticmethod
    def _check_layout(result: Result, case: Case) -> None:
        """The batch handed to the student's sample (as the kernel recorded the call): row b * n + j holds source b
        and its padding. Only the layout the docstring gives decides which draw of the generator lands where."""
        calls = relative.arguments_of(result, case.id, "sample")
        if not calls:
            return  # sample was not called by that name: the outputs above were judged all the same
        args, kwargs = calls[0]
        rows = args[1] if len(args) > 1 else kwargs.get("src_ids")
        rows_real = kwargs.get("src_is_real", args[10] if len(args) > 10 else None)
        if rows is None or isinstance(rows, (int, float, str)) or not hasattr(rows, "shape"):
            return
        d = case.data
        with spec.shared():
            visible.expect_sample_layout(rows, rows_real if hasattr(rows_real, "shape") else None, d["src"],
                                         d["is_real"], d["n"], case.desc)

    @staticmethod
    def _check_draws(got: np.ndarray, case: Case) -> None:
        """Every token of sample (b, j) is one that source b's settings allow; some samples differ."""
        d = case.data
        for b in range(d["B"]):
            for j, row in enumerate(got[b].tolist()):
                step = _first_excluded(case, b, row)
                if step is not None:
                    raise Fail(f"sample {j} of source {b} holds a token that source {b}'s settings exclude (step "
                               f"{step}; {case.desc}): it was drawn for another source. Row b * n + j of the batch "
                               "given to sample must hold source b and its own padding.")
        if d["n"] > 1 and all(len({tuple(row) for row in got[b].tolist()}) == 1 for b in range(d["B"])):
            raise Fail(f"the {d['n']} samples of every source are identical ({case.desc}): draw them in one call "
                       "of sample on n copies of each source, with the generator, not one sample copied n times.")
