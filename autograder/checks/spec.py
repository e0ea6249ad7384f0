"""The hidden half of an exercise written as a :class:`decoder_course.spec.Spec`.

The same rows as the visible checks, drawn from the secret generator, run in the kernel; here the result's
contract and the spec's properties are judged by the spec's own (public) code on what the kernel handed in, and
then, what only the grader has, its values against the reference's on the same arguments. Values that differ are
diagnosed: the item's known wrong answers (its mutants, ``autograder/mutants``) run here on the same arguments, and
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

from autograder import lessons
from autograder.checks import judges
from autograder.checks.framework import Case, Exercise, Fail, Raised, Result, exercise, expect_close
from decoder_course.checks import CheckFailed, _is_tensor
from decoder_course.spec import (
    Keyword,
    ModuleSpec,
    Spec,
    agrees,
    as_numpy,
    built,
    call_args,
    contract,
    expect_fresh,
    expected,
    forward,
    names_for,
    plain,
    returns_tensor,
    tolerance,
    unwrap,
    variant,
)


@contextlib.contextmanager
def shared():
    """A failure of the spec's public code is a hidden check's failure, with the same message."""
    try:
        yield
    except CheckFailed as failed:
        text = str(failed)
        raise Fail(text if text.endswith((".", "?", "!")) else f"{text}.") from None


def _value(case: Case, value, tensors: bool):
    """An argument as the kernel's harvest takes it: arrays sent aside (NumPy ones as tensors: ``tensors``; a
    bfloat16 tensor widened, with its dtype named), dtypes by name, the rest as JSON."""
    if _is_tensor(value):
        bf16 = str(value.dtype) == "torch.bfloat16"
        return case.tensor(value.float() if bf16 else value, dtype="bfloat16" if bf16 else None)
    if isinstance(value, np.ndarray):
        return case.tensor(value) if tensors else case.array(value)
    if isinstance(value, (type, np.dtype)):
        return {"np_dtype": np.dtype(value).name}
    return value


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or _is_tensor(value)


def _call(case: Case, fn, args: dict, tensors: bool, keeps_inputs: bool, **step) -> None:
    """``fn(*args)`` in the kernel, its arrays bound first so that they can be recorded again after the call."""
    arrays = [name for name, value in args.items() if _is_array(unwrap(value))]
    for name in arrays:
        case.let(name, _value(case, unwrap(args[name]), tensors))
    given = {n: {"ref": n} if n in arrays else _value(case, unwrap(v), False) for n, v in args.items()}
    case.call(fn, *(given[n] for n, v in args.items() if not isinstance(v, Keyword)),
              **{n: given[n] for n, v in args.items() if isinstance(v, Keyword)}, **step)
    judges.record_after(case, arrays if keeps_inputs else [])


@functools.cache
def _mistakes(lesson: str, item: str) -> tuple[tuple[str, Callable], ...]:
    """The item's known wrong answers (its mutants), each as the object a notebook holding it would use."""
    from autograder import samples

    return tuple((description, samples.notebook_namespace(lesson, replacement)[item])
                 for name, description, replacement in lessons.module(lesson, "mutants").MUTANTS if name == item)


def known_mistake(lesson: str, item: str, got: np.ndarray, produce: Callable, rtol: float, atol: float) -> str:
    """The description of the item's known mistake whose result (``produce(mistake)``) is ``got``, or ""."""
    for description, wrong in _mistakes(lesson, item):
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                value = np.asarray(as_numpy(produce(wrong)))
        except Exception:  # noqa: BLE001, S112 - a mistake that raises here is not the one the student made
            continue
        if agrees(got, value, rtol, atol):
            return description
    return ""


def _compare(lesson: str, item: str, got: np.ndarray, want: np.ndarray, what: str, case: Case, hint: str,
             tol: tuple[float, float], produce: Callable, scalar: bool = False) -> None:
    """Values against ``want``; where they differ, the known mistake they match is named first. A scalar's message
    says what broke, never the expected value."""
    rtol, atol = tol
    known = "" if agrees(got, want, *tol) else known_mistake(lesson, item, got, produce, rtol, atol)
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


class SpecExercise(Exercise):
    spec: Spec
    ref: ModuleType

    def cases(self, rng):
        cases = []
        for i, (desc, args) in enumerate(self.spec.rows(rng)):
            case = Case(f"c{i}", desc, data={"args": args})
            _call(case, self.name, args, self.spec.tensors, self.spec.keeps_inputs, record="out",
                  let="_result" if self.spec.fresh else None)
            if self.spec.fresh:  # 0 in a stride: an expand view, not a new tensor
                case.call({"attr": ["_result", "stride"]}, record="strides")
            cases.append(case)
        for i, (desc, args, why) in enumerate(self.spec.refused):
            case = Case(f"r{i}", desc, data={"why": why}, relative=False)
            given = {n: _value(case, unwrap(v), self.spec.tensors) for n, v in args.items()}
            case.call(self.name, *(given[n] for n, v in args.items() if not isinstance(v, Keyword)),
                      **{n: given[n] for n, v in args.items() if isinstance(v, Keyword)})
            cases.append(case)
        return cases

    def judge(self, result: Result):
        spec = self.spec
        for case in result.cases.values():
            if "why" in case.data:
                judges.value_error(result, case.id, case.data["why"])
                continue
            args, what = case.data["args"], f"{self.name}(...)"
            given = plain(args)
            _raise_hint(spec, result, case, args)
            kind = "any" if spec.scalar else "tensor" if returns_tensor(spec, args) else "ndarray"
            got = result.get(case.id, "out", what=what, kind=kind, finite=False)
            meta = result.meta(case.id, "out")
            with shared():
                contract(spec, args, got, f"{what} ({case.desc})",
                         declared=meta.get("type") if spec.scalar else meta.get("dtype"))
                if spec.properties is not None:
                    spec.properties(given, float(got) if spec.scalar else got, case.desc)
                if spec.fresh:
                    strides = [int(result.get(case.id, f"strides/{i}", what="the result's strides", kind="any"))
                               for i in range(got.ndim)]
                    expect_fresh(got.shape, strides, f"{what} ({case.desc})")
            if spec.compare:
                positional, by_name = call_args(spec, args)
                want = as_numpy(getattr(self.ref, self.name)(*positional, **by_name))
                if callable(spec.compare):
                    with shared():
                        spec.compare(given, got, want, case.desc)

                def produce(wrong, args=args):
                    positional, by_name = call_args(spec, copy.deepcopy(args))  # a mistake may write into them
                    return wrong(*positional, **by_name)

                _compare(self.lesson, self.name, got, np.asarray(want), what, case, spec.hint, tolerance(spec, args),
                         produce, scalar=spec.scalar)
            if spec.keeps_inputs:
                judges.unchanged(result, case.id, {n: v for n, v in given.items() if isinstance(v, np.ndarray)},
                                 self.name)


class ModuleSpecExercise(Exercise):
    """The hidden half of a :class:`decoder_course.spec.ModuleSpec`: the student's module built, loaded by the
    contract's names and called in the kernel; judged here against PyTorch's own modules (the spec's twin)."""

    spec: ModuleSpec

    def cases(self, rng):
        cases = []
        for i, row in enumerate(self.spec.rows(rng)):
            case = Case(f"c{i}", row.situation + (" (training mode)" if row.seed is not None else ""),
                        data={"row": row})
            init = {n: _value(case, unwrap(v), True) for n, v in row.init.items()}
            case.call(self.name, *(init[n] for n, v in row.init.items() if not isinstance(v, Keyword)), let="m",
                      **{n: init[n] for n, v in row.init.items() if isinstance(v, Keyword)})
            if row.state is not None:
                case.load_state("m", row.state)
            if row.seed is None:
                case.eval("m")
            else:
                case.steps.append({"train": "m"})
                case.seed(row.seed)
            if row.seed is not None and self.spec.dropout:  # training, then eval twice: judges.dropout
                _call(case, {"ref": "m"}, row.inputs, True, False, record="out_train")
                case.eval("m")
                for record in ("out_eval", "out_eval2"):
                    _call(case, {"ref": "m"}, row.inputs, True, False, record=record)
            else:
                _call(case, {"ref": "m"}, row.inputs, True, self.spec.keeps_inputs, record="out")
            cases.append(case)
        return cases

    def judge(self, result: Result):
        spec = self.spec
        for case in result.cases.values():
            row = case.data["row"]
            args, what = {**row.init, **row.inputs}, f"{self.name}'s output"
            error = result.error(case.id)
            if error is not None and "state_dict" in error:
                raise Fail(f"the weights could not be loaded into your {self.name} ({case.desc}):\n    "
                           f"{error.strip().splitlines()[-1]}\nThe names are part of the contract: "
                           f"{names_for(spec, row)}.")
            _raise_hint(spec, result, case, args)
            if row.seed is not None and spec.dropout:
                judges.dropout(result, case.id, self.name, spec.shape(plain(args)), spec.dropout)
                continue
            got = result.get(case.id, "out", what=what, kind="tensor", finite=False)
            with shared():
                contract(spec, row.inputs | row.init, got, f"{what} ({case.desc})",
                         declared=result.meta(case.id, "out").get("dtype"))
                if spec.properties is not None:
                    spec.properties(plain(args), got, case.desc)
            def produce(wrong, row=row):
                return forward(spec, built(spec, wrong, row), row)

            want, tol = expected(spec, row), tolerance(spec, args)
            with shared():  # where the values differ, a public wrong twin names the idea as the visible check does
                known = "" if agrees(got, want, *tol) else variant(spec, row, got, *tol)
                if known:
                    raise CheckFailed(f"{what} ({case.desc}) is what PyTorch's own modules compute when {known}")
            _compare(self.lesson, self.name, got, want, f"{what} (vs PyTorch's own modules)", case, spec.hint, tol,
                     produce)
            if spec.keeps_inputs:
                judges.unchanged(result, case.id, {n: v for n, v in plain(row.inputs).items()
                                                   if isinstance(v, np.ndarray)}, self.name)


def register(lesson: str, specs: dict[str, Spec | ModuleSpec], ref: ModuleType) -> None:
    """Register each spec of ``lesson`` as a hidden exercise (a function's judged against the reference module
    ``ref``, a module's against its PyTorch twin)."""
    for name, spec in specs.items():
        base = ModuleSpecExercise if isinstance(spec, ModuleSpec) else SpecExercise
        cls = type(f"{name}_spec", (base,), {"spec": spec, "ref": ref, "reference": ref, "uses": spec.uses,
                                             "forbidden": spec.forbidden})
        exercise(lesson, name)(cls)
