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
    Spec,
    as_numpy,
    call_args,
    contract,
    expect_fresh,
    plain,
    returns_tensor,
    unwrap,
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
    """An argument as the kernel's harvest takes it: arrays sent aside (NumPy ones as tensors: ``tensors``), dtypes
    by name, the rest as JSON."""
    if _is_tensor(value):
        return case.tensor(value)
    if isinstance(value, np.ndarray):
        return case.tensor(value) if tensors else case.array(value)
    if isinstance(value, (type, np.dtype)):
        return {"np_dtype": np.dtype(value).name}
    return value


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or _is_tensor(value)


@functools.cache
def _mistakes(lesson: str, item: str) -> tuple[tuple[str, Callable], ...]:
    """The item's known wrong answers (its mutants), each as the function a notebook holding it would call."""
    from autograder import samples

    return tuple((description, samples.notebook_namespace(lesson, replacement)[item])
                 for name, description, replacement in lessons.module(lesson, "mutants").MUTANTS if name == item)


def diagnose(spec: Spec, lesson: str, args: dict, got: np.ndarray) -> str:
    """The description of the item's known mistake whose result on ``args`` is ``got``, or ""."""
    for description, wrong in _mistakes(lesson, spec.name):
        try:
            positional, by_name = call_args(spec, copy.deepcopy(args))  # a mistake may write into its inputs
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                value = as_numpy(wrong(*positional, **by_name))
        except Exception:  # noqa: BLE001, S112 - a mistake that raises here is not the one the student made
            continue
        value = np.asarray(value)
        if value.shape == got.shape and np.allclose(value.astype(np.float64), got.astype(np.float64),
                                                    rtol=spec.rtol, atol=spec.atol, equal_nan=True):
            return description
    return ""


class SpecExercise(Exercise):
    spec: Spec
    ref: ModuleType

    def cases(self, rng):
        cases = []
        for i, (desc, args) in enumerate(self.spec.rows(rng)):
            case = Case(f"c{i}", desc, data={"args": args})
            arrays = [name for name, value in args.items() if _is_array(unwrap(value))]
            for name in arrays:  # bound, so that they can be recorded again after the call
                case.let(name, _value(case, unwrap(args[name]), self.spec.tensors))
            given = {n: {"ref": n} if n in arrays else _value(case, unwrap(v), False) for n, v in args.items()}
            case.call(self.name, *(given[n] for n, v in args.items() if not isinstance(v, Keyword)), record="out",
                      let="_result" if self.spec.fresh else None,
                      **{n: given[n] for n, v in args.items() if isinstance(v, Keyword)})
            judges.record_after(case, arrays if self.spec.keeps_inputs else [])
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
            error = result.error(case.id)
            if error and spec.on_error is not None and "NotImplementedError" not in error:
                hint = spec.on_error(args, error.strip().splitlines()[-1])
                if hint:
                    raise Raised(f"your code raised an exception on a case with {case.desc}:\n    "
                                 f"{error.strip().splitlines()[-1]}\n{hint}")
            kind = "tensor" if returns_tensor(spec, args) else "ndarray"
            got = result.get(case.id, "out", what=what, kind=kind, finite=False)
            with shared():
                contract(spec, given, got, f"{what} ({case.desc})")
                if spec.properties is not None:
                    spec.properties(given, got, case.desc)
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
                close = got.shape == want.shape and np.allclose(
                    got.astype(np.float64), want.astype(np.float64), rtol=spec.rtol, atol=spec.atol)
                known = "" if close else diagnose(spec, self.lesson, args, got)
                hint = f"Your values are those of a known mistake: {known}. {spec.hint}" if known else spec.hint
                expect_close(got, want, what, case.desc, hint=hint.strip(), rtol=spec.rtol, atol=spec.atol)
            if spec.keeps_inputs:
                judges.unchanged(result, case.id, {n: v for n, v in given.items() if isinstance(v, np.ndarray)},
                                 self.name)


def register(lesson: str, specs: dict[str, Spec], ref: ModuleType) -> None:
    """Register each spec of ``lesson`` as a hidden exercise judged against the reference module ``ref``."""
    for name, spec in specs.items():
        cls = type(f"{name}_spec", (SpecExercise,), {"spec": spec, "ref": ref, "reference": ref, "uses": spec.uses,
                                                     "forbidden": spec.forbidden})
        exercise(lesson, name)(cls)
