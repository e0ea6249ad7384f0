"""Hidden checks of lesson 11-gpt (PyTorch): the BPE tokenizer, the GPT model, next-token batches, generation.

- ``train_bpe`` and ``lm_batches`` are specs (``decoder_course/visible/l11_gpt.py``);
- ``BPETokenizer`` is built from merges computed *here* (never from the student's ``train_bpe``): encoding the
  training text must give training's own sequence, any text must round-trip (Unicode, emoji the merges never
  saw, the empty string), decoding cut multi-byte characters gives U+FFFD, a bad id raises;
- ``GPT`` is loaded (strictly, by the contract's names) with random weights and compared with the reference,
  itself proven equal to ``nn.TransformerEncoderLayer(norm_first=True)`` with a causal mask: B >= 2, T != max_len,
  biases far from 0; the output projection must *be* the embedding (same storage); the cached path (prefill, a chunk
  of several tokens, then one token at a time) must give the full forward's logits; embeddings start small; more
  than max_len raises;
- ``generate`` on ``decoder_course.testing.HashedLM``, a stand-in whose logits are fixed by the prefix and whose
  past lives only in the cache it is handed: greedy tokens exactly, positions run (the cache used, each token
  fed once), the model's mode left as it is, reproducible draws, nothing outside top-k, first-token frequencies =
  softmax(logits / T).

Generic judges (inputs unchanged, ValueError, the known mistakes' diagnosis) come from
:mod:`autograder.course.checks.judges`.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.course.checks import spec
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import Case, Exercise, Fail, Result, expect_close
from autograder.course.checks.judges import diagnose, record_after, unchanged, value_error
from autograder.course.reference import generation as ref_gen
from autograder.course.reference import gpt as ref
from decoder_course.testing import HashedLM

LESSON = "11-gpt"
CODES = "decoder_course.testing:text_codes"
HASHED_LM = "decoder_course.testing:HashedLM"
UNICODE = "aé λ→😀漢字\n\t ß"  # 1- to 4-byte characters


def _read_ints(result: Result, case: Case, name: str, what: str) -> list[int]:
    meta = result.meta(case.id, name)
    if meta.get("type") != "list":
        raise Fail(f"{what} should return a list of ints, got `{meta.get('type')}` ({case.desc}).")
    return [spec.int_at(result, case, f"{name}/{i}", what) for i in range(int(meta.get("len", 0)))]


# -- BPETokenizer ------------------------------------------------------------------------------------------------------
def _codes(case: Case, name: str, source: str) -> None:
    """Record the string bound to ``source`` as code points (text is handed back as data)."""
    case.record(name, {"new": CODES, "args": [{"ref": source}]})


@exercise(LESSON, "BPETokenizer")
class BPETokenizerCheck(Exercise):
    """Built from merges computed here: encode reproduces training's sequence, merges apply in the order learned,
    vocab_size; round trips on Unicode, unseen emoji and the empty string; decode of cut characters (U+FFFD),
    of a 1-D tensor; a bad id raises."""

    def cases(self, rng):
        train = "".join(rng.choice(list("the cat sat on a mat\n"), size=500)) + " ".join(["ab"] * 6 + ["bab"] * 4)
        merges = ref.train_bpe(train, 256 + int(rng.integers(30, 40)))
        vocab_size = 256 + len(merges)
        texts = {"train": train, "unicode": "".join(rng.choice(list(UNICODE), size=60)),
                 "unseen": "🙂 the mat 🙂\x00\x7f", "empty": "", "one": "t"}
        lam, emoji = list("λ".encode()), list("😀".encode())  # two and four bytes
        # id lists that no encode produced: cut multi-byte characters, and (as a 1-D tensor) a training prefix
        lists = {"cut2": [lam[0]], "cut4": emoji[:3] + [ord("a")], "mixed": [ord("o"), 256, lam[0], lam[1]],
                 "tensor": ref.BPETokenizer(merges).encode(train[:40])}
        cases = [Case("encode", f"a tokenizer of {len(merges)} merges learned here, the training text and others",
                      data={"merges": merges, "texts": texts}),
                 Case("decode", "decode of id lists cut inside multi-byte characters, and of a 1-D tensor",
                      data={"lists": lists}),
                 Case("bad_id", f"decode([{vocab_size}]) with vocab_size={vocab_size}")]
        for case in cases:
            case.call("BPETokenizer", [list(p) for p in merges], let="tok")
        encode, decode, bad_id = cases
        encode.record("vocab_size", {"attr": ["tok", "vocab_size"]})
        for name, text in texts.items():
            encode.method("tok", "encode", text, let=f"ids_{name}", record=f"enc_{name}")
            encode.method("tok", "decode", {"ref": f"ids_{name}"}, let=f"back_{name}")
            _codes(encode, f"dec_{name}", f"back_{name}")
        for name, ids in lists.items():
            decode.method("tok", "decode", decode.tensor(np.array(ids, dtype=np.int64)) if name == "tensor" else ids,
                          let=f"s_{name}")
            _codes(decode, name, f"s_{name}")
        bad_id.method("tok", "decode", [ord("a"), vocab_size], record="out")  # an id outside the vocabulary
        return cases

    def judge(self, result: Result):
        enc, dec, bad = (result.cases[k] for k in ("encode", "decode", "bad_id"))
        tok = ref.BPETokenizer(enc.data["merges"])
        size = result.get(enc.id, "vocab_size", what="tok.vocab_size", kind="any")
        if int(size) != tok.vocab_size:
            raise Fail(f"vocab_size is {int(size)}, should be 256 + len(merges) = {tok.vocab_size} ({enc.desc}).")
        for name, text in enc.data["texts"].items():
            ids = _read_ints(result, enc, f"enc_{name}", f"encode({name} text)")
            want = tok.encode(text)
            if ids != want:
                if ids and all(0 <= i < 256 for i in ids):
                    idea = "No merge was applied: replay every merge of the list, in order, on the bytes."
                elif len(ids) > len(want):
                    idea = ("Fewer merges than due were applied: apply merge k everywhere it occurs, for every k, "
                            "in the order the merges were learned (merge k may need tokens made by earlier merges).")
                else:
                    idea = ("Apply the merges in the order they were learned (merge k makes token 256 + k), each "
                            "everywhere, left to right without overlaps; start from text.encode('utf-8').")
                raise Fail(f"encode is wrong on the {name} text ({enc.desc}). {idea}")
            back = _read_text(result, enc, f"dec_{name}", f"decode(encode({name} text))")
            if back != text:
                raise Fail(f"decode(encode(text)) is not the text for the {name} text ({enc.desc}): join the tokens' "
                           "bytes (vocab[256 + k] = vocab[a] + vocab[b]) and decode them once, as UTF-8.")
        for name, ids in dec.data["lists"].items():
            got = _read_text(result, dec, name, f"decode of the {name} ids")
            want = tok.decode(ids)
            if got != want:
                raise Fail(f"decode is wrong for ids that cut a multi-byte character or come as a tensor ({name}; "
                           f"{dec.desc}): join all the bytes first, then decode them once with "
                           "bytes.decode('utf-8', errors='replace'), so a cut character becomes one U+FFFD.")
        if result.error(bad.id) is None:
            raise Fail(f"decode returned for an id outside the vocabulary ({bad.desc}): raise (e.g. ValueError) "
                       "instead of inventing bytes for it.")


def _read_text(result: Result, case: Case, name: str, what: str) -> str:
    error = result.error(case.id)
    if error is not None and "expected a str" in error:
        raise Fail(f"{what} should return a str ({case.desc}): {error.splitlines()[-1]}")
    codes = result.get(case.id, name, what=what, kind="ndarray", dtype="int")
    return "".join(chr(int(c)) for c in codes)


# -- GPT ---------------------------------------------------------------------------------------------------------------
V, D, H, F, LAYERS, MAX_LEN = 37, 24, 3, 40, 2, 12  # Dh = 8; T != max_len != H


def _random_gpt(rng: np.random.Generator) -> tuple[ref.GPT, dict[str, np.ndarray]]:
    with torch.random.fork_rng():
        torch.manual_seed(int(rng.integers(2**31)))
        model = ref.GPT(V, D, H, F, LAYERS, MAX_LEN, dropout=0.1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.2)  # far from 0, so a forgotten bias shows
                elif "embed" in name:
                    p.normal_(0.0, 0.5)  # positions and tokens both matter
                elif "norm" in name:
                    p.normal_(1.0, 0.2)
    model.eval()
    state = {key: value.detach().numpy().astype(np.float32) for key, value in model.state_dict().items()}
    return model, state


def _build_gpt(case: Case, state: dict) -> None:
    case.call("GPT", V, D, H, F, LAYERS, MAX_LEN, dropout=0.1, let="m")
    case.load_state("m", state)
    case.eval("m")


def _gpt_mistakes(model: ref.GPT, ids: torch.Tensor) -> dict[str, np.ndarray]:
    """What the usual mistakes compute, by the idea each one misses."""
    T = ids.shape[1]

    def run(h: torch.Tensor, allowed, final_norm: bool = True) -> np.ndarray:
        for layer in model.layers:
            h = layer(h, self_allowed=allowed)
        return model.out_proj(model.norm(h) if final_norm else h).numpy()

    with torch.no_grad():
        tokens = model.tok_embed(ids)  # (B, T, D)
        x, causal = tokens + model.pos_embed(torch.arange(T)), ref.causal_allowed(T)
        return {"a model without the causal mask (its logits at a position depend on later tokens): pass the causal "
                "mask (T, T) as self_allowed to every layer": run(x, None),
                "a model without the final LayerNorm: apply self.norm before out_proj, pre-LN layers leave the stream "
                "unnormalised": run(x, causal, final_norm=False),
                "a model without positions: add the learned position embeddings pos_embed(arange(T)) to the token "
                "embeddings": run(tokens, causal)}


def _load_error(result: Result, case: Case) -> None:
    error = result.error(case.id)
    if error is not None and "state_dict" in error:
        raise Fail(f"the weights could not be loaded into your GPT ({case.desc}):\n    {error.splitlines()[-1]}\n"
                   "The names are part of the contract: tok_embed, pos_embed, layers (DecoderLayer with "
                   "cross_attn=False), norm, out_proj (no bias).")


@exercise(LESSON, "GPT")
class GPTCheck(Exercise):
    """Logits against the reference (= PyTorch's encoder layers with a causal mask) with copied weights, B >= 2,
    T != max_len; the causal mask, learned positions, the final norm; out_proj.weight is tok_embed.weight; the
    cached path equals the full forward; small initial embeddings; more than max_len positions raise."""

    forbidden = ("nn.TransformerEncoderLayer", "nn.TransformerEncoder", "nn.TransformerDecoderLayer",
                 "nn.Transformer")
    # the cached case: a prefill of 4 positions, a chunk of 3 (several new queries after a non-empty cache, so the
    # mask must be (T_new, S) aligned to absolute positions), then one at a time up to 9
    PREFILL, CHUNK, TOTAL = 4, 3, 9

    def cases(self, rng):
        cases = []
        model, state = _random_gpt(rng)
        for case_id, B, T, desc in (
                ("full", 3, 7, f"GPT(V={V}, D={D}, H={H}, F={F}, n_layers={LAYERS}, max_len={MAX_LEN}) with random "
                               "weights, B=3, T=7, eval mode"),
                ("max_len", 2, MAX_LEN, f"B=2, T=max_len={MAX_LEN}")):
            ids = torch.from_numpy(rng.integers(0, V, size=(B, T)))
            with torch.no_grad():
                want = model(ids).numpy()
            case = Case(case_id, desc, data={"want": want, "mistakes": _gpt_mistakes(model, ids)})
            _build_gpt(case, state)
            case.call({"ref": "m"}, case.tensor(ids), record="out")
            cases.append(case)
        for name in ("out_proj", "tok_embed"):  # the tied weight: one storage
            cases[0].call({"attr": ["m", name, "weight", "data_ptr"]}, record=f"ptr_{name}")
        ids = rng.integers(0, V, size=(2, self.TOTAL))
        with torch.no_grad():
            want = model(torch.from_numpy(ids)).numpy()
        case = Case("cache", f"B=2, a KVCache prefilled with {self.PREFILL} positions, then a chunk of "
                             f"{self.CHUNK} tokens, then {self.TOTAL - self.PREFILL - self.CHUNK} single tokens",
                    data={"want": want})
        _build_gpt(case, state)
        case.call("KVCache", LAYERS, let="cache")
        for step, (a, b) in enumerate(self._cuts()):
            case.call({"ref": "m"}, case.tensor(ids[:, a:b]), {"ref": "cache"}, record=f"step{step}")
        cases.append(case)
        case = Case("init", "a freshly built GPT(300, 64, 4, 128, 1, 32)")
        case.seed(int(rng.integers(2**31)))
        case.call("GPT", 300, 64, 4, 128, 1, 32, let="fresh")
        for name in ("tok_embed", "pos_embed"):
            case.record(name, {"attr": ["fresh", name, "weight", "data"]})
        cases.append(case)
        case = Case("too_long", f"T = max_len + 1 = {MAX_LEN + 1}")
        _build_gpt(case, state)
        case.call({"ref": "m"}, case.tensor(rng.integers(0, V, size=(2, MAX_LEN + 1))), record="out")
        cases.append(case)
        return cases

    def _cuts(self) -> list[tuple[int, int]]:
        """The cached case's calls: the prefill, the chunk, then single positions."""
        chunk_end = self.PREFILL + self.CHUNK
        return [(0, self.PREFILL), (self.PREFILL, chunk_end), *((t, t + 1) for t in range(chunk_end, self.TOTAL))]

    def judge(self, result: Result):
        for case_id in ("full", "max_len"):
            case, d = result.cases[case_id], result.cases[case_id].data
            _load_error(result, case)
            got = result.get(case.id, "out", what="GPT's logits", kind="tensor", dtype="float", shape=d["want"].shape)
            hint = diagnose(got, d["mistakes"], rtol=1e-4, atol=1e-4) or (
                "Token embedding + position embedding (rows 0 .. T-1 of pos_embed), the layers with the causal mask, "
                "the final norm, then out_proj.")
            expect_close(got, d["want"], "GPT's logits", case.desc, hint=hint, rtol=1e-4, atol=1e-4)
        ptrs = [result.get("full", f"ptr_{name}", what=f"{name}.weight.data_ptr()", kind="any")
                for name in ("out_proj", "tok_embed")]
        if int(ptrs[0]) != int(ptrs[1]):
            raise Fail("out_proj.weight is not tok_embed.weight: tie them (self.out_proj.weight = "
                       "self.tok_embed.weight), one Parameter that both embeds and scores tokens.")
        case = result.cases["cache"]
        _load_error(result, case)
        error = result.error(case.id)
        if error is not None:
            raise Fail(f"GPT raised with a KVCache ({case.desc}):\n    {error.splitlines()[-1]}\nThe docstring "
                       "promises any number of new positions per call after a non-empty cache, not only a prefill "
                       "and then one token at a time: the mask is (T_new, S), aligned to absolute positions "
                       "(cached_causal_mask(positions, S)), not a (T_new, T_new) causal mask.")
        B = case.data["want"].shape[0]
        steps = [result.get(case.id, f"step{s}", what=f"GPT's logits at cached call {s} ({b - a} new positions)",
                            kind="tensor", dtype="float", shape=(B, b - a, V))
                 for s, (a, b) in enumerate(self._cuts())]
        expect_close(np.concatenate(steps, axis=1), case.data["want"], "GPT's logits with a KVCache", case.desc,
                     rtol=1e-4, atol=1e-4, hint="With a cache the new tokens sit at positions cache.length .. (read "
                     "it before the first layer updates it); each layer appends its new keys and values "
                     "(cache.update(k, v, i)) and attends over all of them with cached_causal_mask(positions, S): "
                     "a chunk of several new tokens sees the cached past and its own earlier tokens.")
        case = result.cases["init"]
        for name in ("tok_embed", "pos_embed"):
            w = result.get(case.id, name, what=f"{name}.weight", kind="tensor", dtype="float")
            if float(np.std(w)) > 0.1:
                raise Fail(f"a fresh GPT's {name}.weight has std {float(np.std(w)):.2f} ({case.desc}): start the "
                           "embeddings at N(0, 0.02²) (nn.init.normal_(w, std=0.02)); tied to the output, N(0, 1) "
                           "gives huge initial logits.")
        value_error(result, "too_long", f"GPT was handed {MAX_LEN + 1} positions with max_len={MAX_LEN}, and there "
                                        "is no learned position embedding past max_len - 1")


# -- generate ----------------------------------------------------------------------------------------------------------
def _lm(case: Case, name: str, seed: int, vocab: int = 14, **kwargs) -> HashedLM:
    """Bind a HashedLM in the kernel; the same stand-in on the trusted side is returned."""
    case.let(name, {"new": HASHED_LM, "args": [vocab, seed], "kwargs": kwargs})
    return HashedLM(vocab, seed, **kwargs)


def _allowed(model: HashedLM, prefix: list[int], temperature: float, top_k) -> set[int]:
    x = model.next_logits(prefix)[None] / temperature
    if top_k is not None:
        x = ref_gen.top_k_filter(x, top_k)
    return set(torch.isfinite(x[0]).nonzero().flatten().tolist())


def _prompt_head(result: Result, case: Case, got: np.ndarray, what: str) -> None:
    """The output starts with the prompt, and the caller's prompt_ids (bound, see record_after) are unchanged."""
    prompt = case.data["prompt"]
    if not np.array_equal(got[:, :prompt.shape[1]], prompt):
        raise Fail(f"the first T columns of {what}'s output are not the prompt ({case.desc}).")
    unchanged(result, case.id, {"prompt_ids": prompt}, what)


@exercise(LESSON, "generate")
class Generate(Exercise):
    """On HashedLM (past only in the cache): greedy tokens at temperature 0 exactly, the prompt kept and unchanged,
    one forward position per new token (the cache used); reproducible with a generator whatever the global seed;
    never outside top-k; first-token frequencies = softmax(logits / temperature)."""

    def cases(self, rng):
        cases = []
        # 1. greedy, a batch, the cache used
        seed, T, new = int(rng.integers(2**31)), 3, int(rng.integers(5, 8))
        prompt = rng.integers(0, 14, size=(3, T))
        case = Case("greedy", f"B=3, a prompt of T={T}, max_new_tokens={new}, temperature=0, a 3-layer stand-in",
                    data={"prompt": prompt, "T": T, "new": new, "lm": (seed, 3, 16)})
        model = _lm(case, "m", seed, n_layers=3, max_len=16)
        case.data["want"] = ref.generate(model, torch.from_numpy(prompt), new, temperature=0).numpy()
        case.let("prompt_ids", case.tensor(prompt))
        case.call("generate", {"ref": "m"}, {"ref": "prompt_ids"}, new, temperature=0, record="out")
        record_after(case, ["prompt_ids"])
        case.record("positions", {"attr": ["m", "positions_run"]})
        case.record("training", {"attr": ["m", "training"]})  # a stand-in left in training mode: still so after
        cases.append(case)
        # 2. reproducible draws
        seed, g1, g2 = (int(s) for s in rng.integers(2**31, size=3))
        case = Case("repro", "B=8, a prompt of T=2, max_new_tokens=8, temperature 1, seeded generators")
        _lm(case, "m", seed, max_len=16)
        prompt = rng.integers(0, 14, size=(8, 2))
        for name, global_seed, g in (("a", 1, g1), ("b", 2, g1), ("c", 3, g2)):
            case.seed(int(rng.integers(2**31)) + global_seed)
            case.call("generate", {"ref": "m"}, case.tensor(prompt), 8, generator={"generator": g}, record=name)
        cases.append(case)
        # 3. top-k: nothing outside the k best; 4. temperature: first-token frequencies
        k, temperature = int(rng.integers(2, 4)), float(rng.choice([0.5, 2.0]))
        for case_id, vocab, B, T, new, temp, top_k, scale, desc in (
                ("top_k", 14, 400, 1, 2, 0.8, k, 2.0,
                 f"B=400 copies of one prompt, max_new_tokens=2, top_k={k}, temperature 0.8"),
                ("temperature", 8, 3000, 2, 1, temperature, None, 1.2,
                 f"B=3000 copies of one prompt, one new token, temperature {temperature}")):
            prompt = np.tile(rng.integers(0, vocab, size=(1, T)), (B, 1))
            case = Case(case_id, desc, data={"prompt": prompt, "k": top_k, "temperature": temp})
            case.data["model"] = _lm(case, "m", int(rng.integers(2**31)), vocab=vocab, max_len=8, scale=scale)
            case.call("generate", {"ref": "m"}, case.tensor(prompt), new, temperature=temp, record="out",
                      generator={"generator": int(rng.integers(2**31))}, **({} if top_k is None else {"top_k": top_k}))
            cases.append(case)
        return cases

    def judge(self, result: Result):
        case = result.cases["greedy"]
        d = case.data
        B, T, new = d["prompt"].shape[0], d["T"], d["new"]
        error = result.error(case.id)
        if error is not None and ("max_len" in error or "cache holds" in error or "one slot per layer" in error):
            raise Fail(f"generate fed the stand-in model wrongly ({case.desc}):\n    {error.splitlines()[-1]}\n"
                       "Make one KVCache(len(model.layers)), run the prompt once with it, then only each new "
                       "token, (B, 1), with the same cache.")
        got = result.get(case.id, "out", what="generate(...)", kind="tensor", dtype="int")
        if got.shape != (B, T + new):
            raise Fail(f"generate should return (B, T + max_new_tokens) = {(B, T + new)}, got {got.shape} "
                       f"({case.desc}): the prompt, then the new tokens.")
        _prompt_head(result, case, got, "generate")
        if not bool(result.get(case.id, "training", what="model.training after generate", kind="any")):
            raise Fail(f"generate switched the model out of training mode ({case.desc}): the caller puts the model "
                       "in eval mode before calling, and generate leaves the mode as it is (no model.eval() inside; "
                       "a caller that trains on after sampling would train without dropout).")
        positions = int(result.get(case.id, "positions", what="positions run", kind="any"))
        if not np.array_equal(got, d["want"]):
            idea = "At temperature 0 take the argmax of the last position's logits, each step."
            seed, layers, max_len = d["lm"]
            known = spec.known_mistake(LESSON, "generate", got, lambda wrong: wrong(
                HashedLM(14, seed, n_layers=layers, max_len=max_len), torch.from_numpy(d["prompt"]), new,
                temperature=0), rtol=0, atol=0)
            if known:
                idea = f"Your tokens are those of a known mistake: {known}."
            elif positions > T + new:
                idea = ("The model saw more positions than the prompt plus one per new token: with a cache feed the "
                        "prompt once, then only the newest token (B, 1); never the whole sequence again.")
            raise Fail(f"generate's tokens are wrong ({case.desc}). {idea}")
        if positions > T + new:
            raise Fail(f"the model ran {positions} positions per row for a prompt of {T} and {new} new tokens "
                       f"({case.desc}): that is recomputing the past. Pass a KVCache and feed the prompt once, then "
                       "one new token per step.")
        case = result.cases["repro"]
        outs = {n: result.get(case.id, n, what="generate(...)", kind="tensor", dtype="int", shape=(8, 10))
                for n in "abc"}
        if not np.array_equal(outs["a"], outs["b"]):
            raise Fail(f"two calls with generators of the same seed gave different tokens ({case.desc}): draw with "
                       "torch.multinomial(probs, 1, generator=generator), never from the global random state.")
        if np.array_equal(outs["a"], outs["c"]):
            raise Fail(f"generators with different seeds gave the same tokens ({case.desc}): at temperature 1, draw "
                       "the next token at random from softmax(logits), not its argmax.")
        case = result.cases["top_k"]
        d = case.data
        got = result.get(case.id, "out", what="generate(...)", kind="tensor", dtype="int", shape=(400, 3))
        first_allowed = _allowed(d["model"], d["prompt"][0].tolist(), d["temperature"], d["k"])
        for row in got.tolist():
            for t in (1, 2):
                if row[t] not in _allowed(d["model"], row[:t], d["temperature"], d["k"]):
                    raise Fail(f"generate drew a token outside the top {d['k']} ({case.desc}): divide the logits by "
                               "the temperature, keep the top_k largest (top_k_filter), then draw from the softmax.")
        if set(got[:, 1].tolist()) != first_allowed:
            raise Fail(f"only {len(set(got[:, 1].tolist()))} of the {d['k']} allowed first tokens were drawn in 400 "
                       f"rows ({case.desc}): draw from the softmax of the filtered logits, not their argmax.")
        case = result.cases["temperature"]
        d = case.data
        got = result.get(case.id, "out", what="generate(...)", kind="tensor", dtype="int", shape=(3000, 3))
        logits = d["model"].next_logits(d["prompt"][0].tolist()).double()
        want = torch.softmax(logits / d["temperature"], -1).numpy()
        freq = np.bincount(got[:, 2], minlength=len(want)) / len(got)
        sigma = np.sqrt(want * (1 - want) / len(got))
        if np.any(np.abs(freq - want) > 5 * sigma + 0.01):
            raise Fail(f"the first new token's frequencies do not follow softmax(logits / temperature) ({case.desc}): "
                       "divide the last position's logits by the temperature, then draw from the softmax.")


# -- generate_long: find the bug (autograder.course.bugs), judged relative to the student's generate -------------------
def _windows_by_start(model: HashedLM, prompt: np.ndarray, new: int, keep: int) -> np.ndarray:
    """What the shown bug computes (each round handed the first ``keep`` tokens), for the diagnosis."""
    ids = torch.from_numpy(prompt)
    T = ids.shape[1]
    while ids.shape[1] < T + new:
        context = ids[:, :keep]
        n = min(model.max_len - context.shape[1], T + new - ids.shape[1])
        ids = torch.cat([ids, ref.generate(model, context, n, temperature=0)[:, context.shape[1]:]], dim=1)
    return ids.numpy()


@exercise(LESSON, "generate_long")
class GenerateLong(Exercise):
    """The given rounds call the student's generate; the shown bug hands each round the first keep tokens instead of
    the last. Greedy on HashedLM (logits fixed by the tokens a cache was fed): one round, several rounds with a
    prompt shorter than keep, a prompt longer than keep; the output (B, T + max_new_tokens) against the reference
    built on the student's generate; the prompt unchanged."""

    uses = ("generate",)
    reference = ref

    def cases(self, rng):
        cases = []
        for case_id, B, T, new, keep, max_len, what in (
                ("one", 2, 3, 5, 6, 10, "one round: the continuation fits in max_len"),
                ("rounds", 3, 3, int(rng.integers(13, 17)), 5, 8, "several rounds, a prompt shorter than keep"),
                ("long_prompt", 2, 7, 6, 4, 9, "a prompt longer than keep")):
            seed = int(rng.integers(2**31))
            prompt = rng.integers(0, 14, size=(B, T))
            case = Case(case_id, f"B={B}, a prompt of T={T}, max_new_tokens={new}, keep={keep}, a stand-in model "
                                 f"with max_len={max_len}, temperature=0 ({what})", data={"prompt": prompt})
            model = _lm(case, "m", seed, n_layers=2, max_len=max_len)
            case.data["want"] = ref.generate_long(model, torch.from_numpy(prompt), new, keep, temperature=0).numpy()
            case.data["first"] = _windows_by_start(model, prompt, new, keep)
            case.let("prompt_ids", case.tensor(prompt))
            case.call("generate_long", {"ref": "m"}, {"ref": "prompt_ids"}, new, keep, temperature=0, record="out")
            record_after(case, ["prompt_ids"])
            cases.append(case)
        return cases

    def judge(self, result: Result):
        for case in result.cases.values():
            d = case.data
            error = result.error(case.id)
            if error is not None and "max_len" in error:
                raise Fail(f"a round handed generate more tokens than fit ({case.desc}):\n    "
                           f"{error.splitlines()[-1]}\nEach round's prompt is at most keep tokens and asks for "
                           "min(max_len - len(prompt), tokens still due) new ones.")
            want = d["want"]
            got = result.get(case.id, "out", what="generate_long(...)", kind="tensor", dtype="int")
            if got.shape != want.shape:
                raise Fail(f"generate_long should return (B, T + max_new_tokens) = {want.shape}, got {got.shape} "
                           f"({case.desc}): the whole prompt, then every round's new tokens (each round's output "
                           "minus the prompt it was handed).")
            _prompt_head(result, case, got, "generate_long")
            if not np.array_equal(got, want):
                hint = diagnose(got, {
                    "rounds that are handed the *first* keep tokens of the sequence: every round continues the start "
                    "of the text again (a greedy model then writes the same continuation twice). Hand each round the "
                    "latest tokens, the last keep of them": d["first"]}, rtol=0, atol=0) or (
                    "Each round's prompt is the last keep tokens of the sequence so far (the prompt, then every "
                    "earlier round's new tokens), and only the round's new tokens are appended.")
                first = int(np.argwhere((got != want).any(axis=0))[0][0])
                raise Fail(f"generate_long's tokens are wrong from position {first} on ({case.desc}). {hint}")
