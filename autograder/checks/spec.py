"""The hidden half of an exercise written as a :class:`decoder_course.spec.Spec`.

The same rows as the visible checks, drawn from the secret generator, run in the kernel; here the result's
contract and the spec's properties are judged by the spec's own (public) code on what the kernel handed in, and
then, what only the grader has, its values against the reference's on the same arguments. A lesson's checks
module registers its specs with :func:`register`; nothing else is written per exercise.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

import numpy as np

from autograder.checks import judges
from autograder.checks.framework import Case, Exercise, Fail, Result, exercise, expect_close
from decoder_course.checks import CheckFailed, to_numpy
from decoder_course.spec import Spec, call_args, contract


@contextlib.contextmanager
def shared():
    """A failure of the spec's public code is a hidden check's failure, with the same message."""
    try:
        yield
    except CheckFailed as failed:
        text = str(failed)
        raise Fail(text if text.endswith((".", "?", "!")) else f"{text}.") from None


def _value(case: Case, value, tensors: bool):
    """An argument as the kernel's harvest takes it: arrays sent aside (as tensors: ``tensors``), dtypes by name,
    the rest as JSON."""
    if isinstance(value, np.ndarray):
        return case.tensor(value) if tensors else case.array(value)
    if isinstance(value, (type, np.dtype)):
        return {"np_dtype": np.dtype(value).name}
    return value


class SpecExercise(Exercise):
    spec: Spec
    ref: ModuleType

    def cases(self, rng):
        cases = []
        for i, (desc, args) in enumerate(self.spec.rows(rng)):
            case = Case(f"c{i}", desc, data={"args": args})
            arrays = [name for name, value in args.items() if isinstance(value, np.ndarray)]
            for name in arrays:  # bound, so that they can be recorded again after the call
                case.let(name, _value(case, args[name], self.spec.tensors))
            case.call(self.name, *({"ref": n} if n in arrays else _value(case, v, False) for n, v in args.items()),
                      record="out")
            judges.record_after(case, arrays if self.spec.keeps_inputs else [])
            cases.append(case)
        for i, (desc, args, why) in enumerate(self.spec.refused):
            case = Case(f"r{i}", desc, data={"why": why}, relative=False)
            case.call(self.name, *(_value(case, v, self.spec.tensors) for v in args.values()))
            cases.append(case)
        return cases

    def judge(self, result: Result):
        spec = self.spec
        for case in result.cases.values():
            if "why" in case.data:
                judges.value_error(result, case.id, case.data["why"])
                continue
            args = case.data["args"]
            what = f"{self.name}(...)"
            got = result.get(case.id, "out", what=what, kind="tensor" if spec.tensors else "ndarray", finite=False)
            with shared():
                contract(spec, args, got, f"{what} ({case.desc})", typed=False)
                if spec.properties is not None:
                    spec.properties(args, got, case.desc)
            if spec.compare:
                want = to_numpy(getattr(self.ref, self.name)(*call_args(spec, args)))
                expect_close(got, want, what, case.desc, hint=spec.hint)
            if spec.keeps_inputs:
                judges.unchanged(result, case.id, {n: v for n, v in args.items() if isinstance(v, np.ndarray)},
                                 self.name)


def register(lesson: str, specs: dict[str, Spec], ref: ModuleType, points: dict[str, float] | None = None) -> None:
    """Register each spec of ``lesson`` as a hidden exercise judged against the reference module ``ref``."""
    for name, spec in specs.items():
        cls = type(f"{name}_spec", (SpecExercise,), {"spec": spec, "ref": ref})
        exercise(lesson, name, (points or {}).get(name, 1.0))(cls)
