"""Exercises as specs: one public row per exercise drives both layers of its checks.

A :class:`Spec` says what any correct answer does, without the answer: the situations to try it on (``rows``,
drawn from a random generator), the result's contract (type, dtype, shape) and the properties every correct
result has. The visible checks run it here, in the student's kernel, on draws of a public seed
(:func:`run`); the hidden checks (``autograder/checks/spec.py``) run the same rows on secret draws in the
kernel, judge the contract and the properties on the trusted side with this very code, and add what only the
grader knows: the reference's values. So a property is written once, with its message, for both.

A property raises :class:`~decoder_course.checks.CheckFailed` naming the idea that broke and the case's
situation (sizes, never values: the hidden draws are secret).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from decoder_course.checks import (
    CheckFailed,
    _torch,
    check,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    expect_value_error,
    to_numpy,
)

Row = tuple[str, dict]  # (the situation, as messages name it; the arguments, by name, in call order)


@dataclass(frozen=True)
class Spec:
    """One exercise: where to try it, what it returns, what any correct result satisfies."""

    name: str
    rows: Callable[[np.random.Generator], list[Row]]
    # the result's contract on these arguments: its type (np.ndarray), dtype (np.bool_, a float dtype) and shape
    dtype: Callable[[dict], Any]
    shape: Callable[[dict], tuple[int, ...]]
    properties: Callable[[dict, Any, str], None] | None = None  # (arguments, result, situation): raise CheckFailed
    axes: str = ""  # the result's dimension names, for the shape message ("B, T, H, Dh")
    shape_hint: str | Callable[[dict, tuple], str] = ""  # what a wrong shape means, or (arguments, shape) -> that
    hint: str = ""  # what a wrong value most likely means: the hidden comparison with the reference says it
    keeps_inputs: bool = True  # the docstring promises the caller's arrays unchanged
    compare: bool = True  # the hidden side compares the values with the reference's (else the properties decide)
    tensors: bool = False  # the rows' arrays are passed as torch tensors, and the result is one
    refused: tuple[tuple[str, dict, str], ...] = ()  # (situation, arguments, why): calls that must raise ValueError


def contract(spec: Spec, args: dict, got: Any, what: str, typed: bool = True) -> None:
    """The result's type (unless the caller checked it: ``typed=False``), dtype and shape on ``args``."""
    if typed:
        expect_type(got, _torch().Tensor if spec.tensors else np.ndarray, what)
    expect_dtype(got, spec.dtype(args), what)
    try:
        expect_shape(got, spec.shape(args), what, names=spec.axes or None)
    except CheckFailed as wrong:
        hint = spec.shape_hint(args, tuple(got.shape)) if callable(spec.shape_hint) else spec.shape_hint
        text = str(wrong)
        raise CheckFailed(f"{text}{'' if text.endswith(('.', '?')) else '.'} {hint}" if hint else text) from None


def call_args(spec: Spec, args: dict) -> list:
    """The arguments as the exercise takes them: NumPy arrays, or fresh torch tensors of them (``tensors``)."""
    if not spec.tensors:
        return list(args.values())
    return [_torch().from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for v in args.values()]


def run(spec: Spec, fn: Callable[..., Any], seed: int = 0) -> None:
    """The visible half: ``fn`` on each row drawn from ``seed``, its contract and properties checked (the
    properties see NumPy arrays, as on the hidden side)."""
    for desc, args in spec.rows(np.random.default_rng(seed)):
        with check(f"{spec.name} on a case with {desc}"):
            call = call_args(spec, args)
            got = expect_inputs_unchanged(fn, *call) if spec.keeps_inputs else fn(*call)
            contract(spec, args, got, f"{spec.name}(...) ({desc})")
            if spec.properties is not None:
                spec.properties(args, to_numpy(got), desc)
    for desc, args, why in spec.refused:
        with check(f"{spec.name} refuses a case with {desc}"):
            expect_value_error(lambda args=args: fn(*call_args(spec, args)), why)
