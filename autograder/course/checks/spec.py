"""The hidden half of an exercise written as a :class:`decoder_course.spec.Spec`.

The same rows as the visible checks, drawn from the secret generator, run in the kernel; here the result's
contract and the spec's properties are judged by the spec's own (public) code on what the kernel handed in, and
then, what only the grader has, its values against the reference's on the same arguments. Values that differ are
diagnosed: the item's known wrong answers (its mutants, ``autograder/course/mutants``) run here on the same arguments,
and
the message names the one the student's values match. A lesson's checks module registers its specs with
:func:`register`; nothing else is written per exercise.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Callable
from types import ModuleType

import numpy as np

from autograder.course.checks import framework, judges
from autograder.course.checks.exercises import exercise
from autograder.course.checks.framework import REGISTRY, Case, Exercise, Fail, Raised, Result, expect_close
from decoder_course.checks import CheckFailed, _is_tensor
from decoder_course.spec import (
    Built,
    Keyword,
    ModuleSpec,
    New,
    Spec,
    Under,
    agrees,
    all_agree,
    as_numpy,
    autocast,
    built,
    call_args,
    compared,
    contract,
    expect_cached,
    expect_facts,
    expect_fresh,
    expect_gradients,
    expect_keys,
    expect_unmoved,
    expected,
    fact_names,
    float_inputs,
    forward,
    hint_for,
    items,
    judge_items,
    judge_parts,
    judged_by,
    names_for,
    options,
    plain,
    returns_tensor,
    tolerance,
    unwrap,
    what_of,
)


@contextlib.contextmanager
def shared():
    """A failure of the spec's public code is a hidden check's failure, with the same message."""
    try:
        yield
    except CheckFailed as failed:
        text = str(failed)
        raise Fail(text if text.endswith((".", "?", "!")) else f"{text}.", kind=failed.kind,
                   mistake=failed.mistake) from None


def _value(case: Case, value, tensors: bool, grad: bool = False):
    """An argument as the kernel's harvest takes it: arrays sent aside (NumPy ones as tensors: ``tensors``; a
    bfloat16 tensor widened, with its dtype named), dtypes (NumPy's, torch's) by name, a notebook module
    (:class:`Built`) built in the kernel, an object that says how to build it (a ``spec`` attribute: a stand-in model)
    as that, the rest as JSON."""
    if isinstance(value, Built):  # one of the notebook's modules, built, loaded and in eval mode in the kernel
        name = f"_built{len(case.steps)}"
        _build(case, value.cls, value.init, let=name)
        case.load_state(name, value.state)
        case.eval(name)
        return {"ref": name}
    if isinstance(getattr(value, "spec", None), dict):
        return value.spec
    if _is_tensor(value):
        bf16 = str(value.dtype) == "torch.bfloat16"
        return case.tensor(value.float() if bf16 else value, dtype="bfloat16" if bf16 else None,
                           requires_grad=grad and value.is_floating_point())
    if isinstance(value, np.ndarray):
        if tensors:
            return case.tensor(value, requires_grad=grad and np.issubdtype(value.dtype, np.floating))
        return case.array(value)
    if isinstance(value, (type, np.dtype)):
        return {"np_dtype": np.dtype(value).name}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return {"torch_dtype": str(value).removeprefix("torch.")}
    if isinstance(value, New):
        return {"new": value.path, "args": list(value.args)}
    if isinstance(value, dict) and value and all(map(_is_array, value.values())):  # a parameter dict: sent aside
        return {"dict": {key: _value(case, item, tensors, grad) for key, item in value.items()}}
    return value


def _is_array(value) -> bool:
    """An array, a tensor, or a dict holding them (bound in the kernel, so that it can be recorded after the call)."""
    if isinstance(value, dict):
        return any(_is_array(item) for item in value.values())
    return isinstance(value, np.ndarray) or _is_tensor(value)


def _call(case: Case, fn, args: dict, tensors: bool, keeps_inputs: bool, grad: bool = False, **step) -> None:
    """``fn(*args)`` in the kernel, its arrays bound first so that they can be recorded again after the call (float
    arrays that require a gradient: ``grad``); a row's :class:`Under` is no argument (its ``autocast``: the call's)."""
    under, args = options(args), {n: v for n, v in args.items() if not isinstance(v, Under)}
    arrays = [name for name, value in args.items() if _is_array(unwrap(value))]
    for name, value in (args | _parts(args)).items():
        if name in arrays or name not in args:
            case.let(name, _value(case, unwrap(value), tensors, grad))
    given = {n: {"ref": n} if n in arrays else _value(case, unwrap(v), False) for n, v in args.items()}
    given |= {n: {"tuple": [{"ref": f"{n}_{j}"} for j in range(len(unwrap(args[n])))]} for n in args
              if isinstance(unwrap(args[n]), tuple)}
    case.call(fn, *(given[n] for n, v in args.items() if not isinstance(v, Keyword)),
              **{n: given[n] for n, v in args.items() if isinstance(v, Keyword)}, **step)
    if under.autocast:
        case.steps[-1]["autocast"] = under.autocast  # the call runs inside torch.autocast("cpu", dtype=...)
    judges.record_after(case, [*arrays, *_parts(args)] if keeps_inputs else [])


def _parts(args: dict) -> dict:
    """A tuple argument's items (memory_kv), by the names the kernel binds them to: ``memory_kv_0``, ..."""
    return {f"{n}_{j}": x for n, v in args.items() if isinstance(unwrap(v), tuple) for j, x in enumerate(unwrap(v))}


@functools.cache
def _mistakes(lesson: str, item: str) -> tuple[tuple[str, Callable], ...]:
    """The item's known wrong answers (its mutants), each as the object a notebook holding it would use."""
    from autograder.course import samples

    return tuple((description, samples.notebook_namespace(lesson, replacement)[item])
                 for name, description, replacement in samples.mutants_of(lesson) if name == item)


def known_mistake(lesson: str, item: str, got: np.ndarray | list, produce: Callable, rtol: float,
                  atol: float, same_kind: bool = False) -> str:
    """The description of the item's known mistake whose result (``produce(mistake)``) is ``got``, or "" (a list:
    the items of a tuple result, which must all agree). ``same_kind``: the dtypes' kinds must agree too (a result
    that failed its contract: 0/1 integers are not the booleans of a mistake that has the same values)."""
    for description, wrong in _mistakes(lesson, item):
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                value = produce(wrong)
                value = [as_numpy(v) for v in value] if isinstance(got, list) else np.asarray(as_numpy(value))
        except Exception:  # noqa: BLE001, S112 - a mistake that raises here is not the one the student made
            continue
        if same_kind and [np.asarray(v).dtype.kind for v in (value if isinstance(got, list) else [value])] != \
                [np.asarray(g).dtype.kind for g in (got if isinstance(got, list) else [got])]:
            continue
        if all_agree(got, value, rtol, atol) if isinstance(got, list) else agrees(got, value, rtol, atol):
            framework.name_mistake(description)
            return description
    return ""


def _compare(lesson: str, item: str, got: np.ndarray, want: np.ndarray, what: str, case: Case, hint: str,
             tol: tuple[float, float], produce: Callable | None, scalar: bool = False, known: str = "") -> None:
    """Values against ``want``; where they differ, the known mistake they match (``known``, or the one ``produce``
    finds) is named first. A scalar's message says what broke, never the expected value."""
    rtol, atol = tol
    if not known and produce is not None and not agrees(got, want, *tol):
        known = known_mistake(lesson, item, got, produce, rtol, atol)
    hint = f"Your values are those of a known mistake: {known}. {hint}" if known else hint
    if scalar:
        judges.scalar(got, float(want), what, case.desc, hint.strip(), rtol, atol)
    else:
        expect_close(got, want, what, case.desc, hint=hint.strip(), rtol=rtol, atol=atol)


def _raise_hint(spec, result: Result, case: Case, args: dict) -> None:
    """An exception the spec recognises (``on_error``): the student's error, then its likely cause."""
    error = result.error(case.id)
    if error and spec.on_error is not None and "NotImplementedError" not in error:
        last = error.strip().splitlines()[-1]
        hint = spec.on_error(args, last)
        if hint:
            raise Raised(f"your code raised an exception on a case with {case.desc}:\n    {last}\n{hint}")


def _raised_decoding(spec, result: Result, case: Case) -> None:
    """A module that raised only in the row's cached calls (its call on all the positions had been recorded, and
    its perturbed call if any): the exception is the cache's, and the spec's cache hint says what to look at."""
    error, row = result.error(case.id), case.data["row"]
    if error is None or not row.cached or "NotImplementedError" in error:
        return
    done = result.recorded(case.id)
    if "out" in done and (row.perturbed is None or "moved" in done):
        raise Raised(f"your code raised an exception when decoding with a cache on a case with {case.desc}, "
                     f"though the same positions in one call without a cache worked:\n    "
                     f"{error.strip().splitlines()[-1]}\n{spec.cache.hint}".rstrip())


def _unrefused(result: Result) -> list[Case]:
    """The cases built to be refused (a ``why``) are judged first: each must have raised a ValueError; the others
    are returned for the exercise's judge."""
    for case in result.cases.values():
        if "why" in case.data:
            judges.value_error(result, case.id, case.data["why"])
    return [case for case in result.cases.values() if "why" not in case.data]


class SpecExercise(Exercise):
    spec: Spec
    ref: ModuleType

    def cases(self, rng):
        cases = []
        for i, (desc, args, *probe) in enumerate(self.spec.rows(rng)):
            unseeded = bool(probe) and probe[0].moves  # two calls that must draw differently: fresh entropy
            case = Case(f"unseeded{i}" if unseeded else f"c{i}", desc,
                        data={"args": args, "probe": probe[0] if probe else None})
            under = options(args)  # a row's backward pass (Under): its inputs are not compared after the call
            grad = self.spec.grad or under.grad
            _call(case, self.name, args, self.spec.tensors, self.spec.keeps_inputs and not under.grad, record="out",
                  let="_result" if self.spec.fresh or grad else None, grad=grad)
            if grad:  # backward from the (first) result item, then each float argument's gradient
                first = self.spec.shape(plain(args))
                case.let("_first", {"index": ["_result", 0]} if self.spec.outputs else {"ref": "_result"})
                case.backward("_first", np.ones(first[0] if self.spec.outputs else first, np.float32))
                for name in float_inputs(args):
                    case.record(f"grad_{name}", {"grad": name})
            if self.spec.fresh:  # 0 in a stride: an expand view, not a new tensor
                case.call({"attr": ["_result", "stride"]}, record="strides")
            if probe:  # a second call that changes only what must not matter
                _call(case, self.name, probe[0].inputs, self.spec.tensors, False, record="moved")
            cases.append(case)
        for i, (desc, args, why) in enumerate(self.spec.refused):
            case = Case(f"r{i}", desc, data={"why": why}, relative=False)
            _build(case, self.name, args, tensors=self.spec.tensors)
            cases.append(case)
        return cases

    def judge(self, result: Result):
        spec = self.spec
        for case in _unrefused(result):
            args, what = case.data["args"], f"{self.name}(...)"
            given = plain(args)
            _raise_hint(spec, result, case, args)
            if spec.outputs:
                self._judge_items(result, case)
                continue
            kind = "any" if spec.scalar else "tensor" if returns_tensor(spec, args) else "ndarray"
            meta = result.meta(case.id, "out")
            got = (_read_list(result, case, "out", what) if spec.listed
                   else result.get(case.id, "out", what=what, kind=kind, finite=False))

            def produce(wrong, args=args):
                positional, by_name = call_args(spec, copy.deepcopy(args), vars(self.ref))  # mistakes may write
                return wrong(*positional, **by_name)

            with self._naming(got, produce, args), shared():
                contract(spec, args, got, f"{what} ({case.desc})",
                         declared=meta.get("type") if spec.scalar else meta.get("dtype"))
                if spec.properties is not None:
                    spec.properties(given, float(got) if spec.scalar else got, case.desc)
                if spec.fresh:
                    strides = [int(result.get(case.id, f"strides/{i}", what="the result's strides", kind="any"))
                               for i in range(got.ndim)]
                    expect_fresh(got.shape, strides, f"{what} ({case.desc})")
            if spec.grad or options(args).grad:
                with shared():
                    expect_gradients(spec, _grads(result, case, float_inputs(args)), case.desc)
            if spec.compare:
                positional, by_name = call_args(spec, args, vars(self.ref))
                want = as_numpy(getattr(self.ref, self.name)(*positional, **by_name))
                if callable(spec.compare):
                    with shared():
                        spec.compare(given, got, want, case.desc)

                _compare(self.lesson, self.name, np.asarray(got), np.asarray(want), what, case, spec.hint,
                         tolerance(spec, args), produce, scalar=spec.scalar)
            if spec.keeps_inputs:
                judges.unchanged(result, case.id, {n: v for n, v in given.items() if isinstance(v, np.ndarray)},
                                 self.name)
                _dicts_unchanged(result, case, given, self.name)

    @contextlib.contextmanager
    def _naming(self, got, produce: Callable, args: dict):
        """A failure of the contract or the properties (which come before the values) still records the known
        mistake the values are, as data (``Fail.mistake``: the class report counts it); the message is unchanged."""
        try:
            yield
        except Fail as fail:
            if not fail.mistake and self.spec.compare:
                values = got if isinstance(got, list) else np.asarray(got)
                fail.mistake = known_mistake(self.lesson, self.name, values, produce, *tolerance(self.spec, args),
                                             same_kind=True)
            raise

    def _judge_items(self, result: Result, case: Case) -> None:
        """A tuple result: each item's contract, the properties, the probe, then each item against the reference's
        (the known mistake named is the one whose every item matches), then the inputs unchanged."""
        spec, args = self.spec, case.data["args"]
        got = _recorded_items(result, case, spec, self.name, "out", kind="tensor" if returns_tensor(spec, args)
                              else "ndarray")
        declared = [result.meta(case.id, f"out/{key}").get("dtype") for key in _keys(result, case, spec, "out")]

        def produce(wrong, args=args):
            positional, by_name = call_args(spec, copy.deepcopy(args), vars(self.ref))  # a mistake may write into them
            with autocast(options(args)):
                return list(wrong(*positional, **by_name))

        with self._naming(got, produce, args), shared():
            judge_parts(spec, args, got, case.desc, declared)
            probe = case.data["probe"]
            if probe is not None:
                moved = _recorded_items(result, case, spec, self.name, "moved", kind="any")[0]
                expect_unmoved(probe, got[0], np.asarray(moved), what_of(spec, 0), case.desc)
        if not spec.compare:  # any of many results is right (random parameters): the properties decided
            return
        positional, by_name = call_args(spec, args, vars(self.ref))
        with autocast(options(args)):
            want = [np.asarray(as_numpy(w)) for w in getattr(self.ref, self.name)(*positional, **by_name)]
        tol = tolerance(spec, args)
        known = "" if all_agree(got, want, *tol) else known_mistake(self.lesson, self.name, got, produce, *tol)
        for i in compared(spec):
            _compare(self.lesson, self.name, got[i], want[i], what_of(spec, i), case, hint_for(spec, i), tol, None,
                     known=known)
        if spec.grad or options(args).grad:
            with shared():
                expect_gradients(spec, _grads(result, case, float_inputs(args)), case.desc)
        if options(args).grad:  # its inputs required a gradient: not recorded after the call
            return
        if spec.keeps_inputs:
            judges.unchanged(result, case.id, {n: v for n, v in plain(args).items() if isinstance(v, np.ndarray)},
                             self.name)


def _grads(result: Result, case: Case, names: list[str]) -> dict:
    """The recorded gradient of each of the inputs ``names`` (None where none reached it)."""
    return {name: result.get(case.id, f"grad_{name}", what=f"the gradient of the {name}", kind="tensor", finite=False)
            if result.meta(case.id, f"grad_{name}").get("type") == "torch.Tensor" else None
            for name in names}


def _recorded_items(result: Result, case: Case, spec, name: str, record: str, kind: str) -> list[np.ndarray]:
    """The recorded tuple result's items, its kind and length judged first."""
    meta = result.meta(case.id, record)
    if meta.get("type") == "dict":  # a dict result: its items by the names
        with shared():
            expect_keys(set(meta.get("keys", [])), spec.outputs, f"{name}(...) ({case.desc})")
        return [result.get(case.id, f"{record}/{key}", what=f"{name}'s {key}", kind=kind, finite=False)
                for key in spec.outputs]
    if meta.get("type") not in ("tuple", "list") or meta.get("len") != len(spec.outputs):
        got = f"{meta.get('len')} values" if meta.get("type") in ("tuple", "list") else f"a {meta.get('type')}"
        raise Fail(f"{name} should return ({', '.join(spec.outputs)}), got {got} ({case.desc}).")
    return [result.get(case.id, f"{record}/{i}", what=what_of(spec, i), kind=kind, finite=False)
            for i in range(len(spec.outputs))]


class ModuleSpecExercise(Exercise):
    """The hidden half of a :class:`decoder_course.spec.ModuleSpec`: the student's module built, loaded by the
    contract's names and called in the kernel; judged here against PyTorch's own modules (the spec's twin)."""

    spec: ModuleSpec

    def cases(self, rng):
        cases = []
        for i, row in enumerate(self.spec.rows(rng)):
            spec = judged_by(self.spec, row)
            case = Case(f"c{i}", row.situation + (" (training mode)" if row.seed is not None else ""),
                        data={"row": row} | ({"why": row.refuses} if row.refuses else {}))
            _build(case, self.name, row.init, let="m")
            if row.state is not None:
                case.load_state("m", row.state, lenient=self.spec.lenient)
            if self.spec.facts is not None:  # its tensors by name: buffers, tied parameters
                case.record("members", {"new": "decoder_course.spec:members",
                                         "args": [{"ref": "m"}, {"list": fact_names(self.spec, row)}]})
            if row.seed is None:
                case.eval("m")
            else:
                case.steps.append({"train": "m"})
                case.seed(row.seed)
            if row.seed is not None and spec.dropout:  # training, then eval twice: judges.dropout
                _call(case, {"ref": "m"}, row.inputs, True, False, record="out_train")
                case.eval("m")
                for record in ("out_eval", "out_eval2"):
                    _call(case, {"ref": "m"}, row.inputs, True, False, record=record)
                cases.append(case)
                continue
            call = {"attr": ["m", row.method]} if row.method else {"ref": "m"}
            _call(case, call, row.inputs, True, spec.keeps_inputs and not row.grad, record="out", let="res",
                  grad=row.grad)
            if row.grad:  # backward from the first output, then each float input's gradient
                first = spec.shape(plain({**row.init, **row.inputs}))
                first = first[0] if spec.outputs else first
                if spec.outputs:
                    case.let("first", {"index": ["res", 0]})
                case.backward("first" if spec.outputs else "res", np.ones(first, dtype=np.float32))
                for name in float_inputs(row.inputs):
                    case.record(f"grad_{name}", {"grad": name})
            if row.perturbed is not None:
                _call(case, call, row.perturbed.inputs, True, False, record="moved")
            if row.cached:  # one fresh cache of the lesson's given class, then each cached call
                case.call(self.spec.cache.given, 1, let="cache")
                for j, step in enumerate(row.cached):
                    _call(case, {"ref": "m"}, {**step, "cache": Keyword({"ref": "cache"})}, True, False,
                          record=f"cached{j}")
                if self.spec.cache.keys is not None:
                    case.record("cache_keys", {"attr": ["cache", "keys"]})
            cases.append(case)
        for i, (desc, init, why) in enumerate(self.spec.refused):
            case = Case(f"r{i}", f"{self.name} built with {desc}", data={"why": why}, relative=False)
            _build(case, self.name, init)
            cases.append(case)
        return cases

    @staticmethod
    def _items(spec: ModuleSpec, result: Result, case: Case, record: str) -> list[np.ndarray]:
        """The recorded result's items (one for a single tensor)."""
        if not spec.outputs:
            return [result.get(case.id, record, what=f"{spec.name}'s output", kind="tensor", finite=False)]
        return _recorded_items(result, case, spec, spec.name, record, kind="tensor")

    def judge(self, result: Result):
        for case in _unrefused(result):
            row = case.data["row"]
            spec = judged_by(self.spec, row)
            args = {**row.init, **row.inputs}
            error = result.error(case.id)
            if error is not None and "state_dict" in error:
                raise Fail(f"the weights could not be loaded into your {self.name} ({case.desc}):\n    "
                           f"{error.strip().splitlines()[-1]}\nThe names are part of the contract: "
                           f"{names_for(spec, row)}.")
            _raise_hint(spec, result, case, args)
            _raised_decoding(spec, result, case)
            if row.seed is not None and spec.dropout:
                judges.dropout(result, case.id, self.name, spec.shape(plain(args)), spec.dropout)
                continue
            got = self._items(spec, result, case, "out")
            n = len(got)
            declared = [result.meta(case.id, f"out/{i}" if spec.outputs else "out").get("dtype") for i in range(n)]
            with shared():
                if spec.facts is not None:
                    expect_facts(spec, row, _members(result, case), case.desc)
                judge_items(spec, row, got, case.desc, declared)
                if row.perturbed is not None:
                    expect_unmoved(row.perturbed, got[0], self._items(spec, result, case, "moved")[0], what_of(spec, 0),
                                   case.desc)
                if row.cached:
                    keys = result.meta(case.id, "cache_keys/0") if spec.cache.keys else {}  # None: nothing cached
                    expect_cached(spec, row, got[0], [self._items(spec, result, case, f"cached{j}")[0]
                                                      for j in range(len(row.cached))],
                                  tuple(keys["shape"]) if keys.get("type") == "torch.Tensor" else None, case.desc)
            want, tol = expected(spec, row), tolerance(spec, args)

            def produce(wrong, row=row, spec=spec):
                return items(spec, forward(spec, built(spec, wrong, row), row), spec.name)

            # the known mistake whose every item is the student's (two mistakes may share the weights)
            known = "" if all_agree(got, want, *tol) else known_mistake(self.lesson, self.name, got, produce, *tol)
            for i in compared(spec):
                _compare(self.lesson, self.name, got[i], want[i], f"{what_of(spec, i)} (vs PyTorch's own modules)",
                         case, hint_for(spec, i), tol, None, known=known)
            if row.grad:
                with shared():
                    expect_gradients(spec, _grads(result, case, float_inputs(row.inputs)), case.desc)
            if spec.keeps_inputs and not row.grad:
                judges.unchanged(result, case.id, {n: v for n, v in (plain(row.inputs) | _parts(row.inputs)).items()
                                                   if isinstance(v, np.ndarray)}, self.name)


def _build(case: Case, name: str, init: dict, tensors: bool = True, **step) -> None:
    """``name(*init)`` in the kernel (a module's constructor, or a call that must be refused), its arrays sent aside
    (as tensors: ``tensors``)."""
    given = {n: _value(case, unwrap(v), tensors) for n, v in init.items()}
    case.call(name, *(given[n] for n, v in init.items() if not isinstance(v, Keyword)),
              **{n: given[n] for n, v in init.items() if isinstance(v, Keyword)}, **step)


def register(lesson: str, specs: dict[str, Spec | ModuleSpec], ref: ModuleType) -> None:
    """Register each spec of ``lesson`` as a hidden exercise (a function's judged against the reference module
    ``ref``, a module's against its PyTorch twin)."""
    for name, spec in specs.items():
        if name in REGISTRY.get(lesson, {}):  # registered already (by the lesson's checks module, or before)
            continue
        base = ModuleSpecExercise if isinstance(spec, ModuleSpec) else SpecExercise
        cls = type(f"{name}_spec", (base,), {"spec": spec, "ref": ref, "reference": ref, "uses": spec.uses,
                                             "forbidden": spec.forbidden})
        exercise(lesson, name)(cls)


def _read_list(result: Result, case: Case, name: str, what: str) -> list:
    """A recorded list of ints or of pairs of ints (a ``listed`` spec's result), each a Python int."""
    meta = result.meta(case.id, name)
    if meta.get("type") not in ("list", "tuple"):
        raise Fail(f"{what} should return a list, got `{meta.get('type')}` ({case.desc}).")
    items = []
    for i in range(int(meta.get("len", 0))):
        item = result.meta(case.id, f"{name}/{i}")
        if item.get("type") in ("tuple", "list"):
            items.append(tuple(int_at(result, case, f"{name}/{i}/{j}", f"item {i} of {what}")
                               for j in range(int(item.get("len", 0)))))
        else:
            items.append(int_at(result, case, f"{name}/{i}", f"item {i} of {what}"))
    return items


def int_at(result: Result, case: Case, key: str, what: str) -> int:
    """The recorded Python int at ``key`` (another type is refused: int(...) converts it)."""
    if result.meta(case.id, key).get("type") != "int":
        raise Fail(f"{what} should be a Python int, got `{result.meta(case.id, key).get('type')}` ({case.desc}): "
                   "convert with int(...).")
    return int(result.leaves[f"{case.id}/{key}"])


def _dicts_unchanged(result: Result, case: Case, given: dict, what: str) -> None:
    """Each array of a dict argument (a parameter dict) equals the value passed: the code never writes into it."""
    for name, value in given.items():
        for key, item in value.items() if isinstance(value, dict) else ():
            if isinstance(item, np.ndarray):
                after = result.get(case.id, f"{name}_after/{key}", what=f"{name}[{key!r}] after the call",
                                   kind="array", finite=False)
                if after.shape != item.shape or not np.array_equal(after, item, equal_nan=True):
                    raise Fail(f"{what} changed {name}[{key!r}] in place ({case.desc}): never write into the "
                               "caller's arrays.")


def _keys(result: Result, case: Case, spec, record: str) -> list:
    """Where a recorded result's items are: by name in a dict, by position in a tuple."""
    return list(spec.outputs) if result.meta(case.id, record).get("type") == "dict" else list(range(len(spec.outputs)))
def _members(result: Result, case: Case) -> dict[str, int]:
    """The recorded :func:`decoder_course.spec.members` of the case's module."""
    return {key: int(result.get(case.id, f"members/{key}", what=f"the kind of {key}", kind="any"))
            for key in result.meta(case.id, "members").get("keys", [])}
