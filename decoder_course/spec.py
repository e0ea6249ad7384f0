"""Exercises as specs: one public row per exercise drives both layers of its checks.

A :class:`Spec` says what any correct answer does, without the answer: the situations to try it on (``rows``,
drawn from a random generator), the result's contract (type, dtype, shape) and the properties every correct
result has. The visible checks run it here, in the student's kernel, on draws of a public seed
(:func:`run`); the hidden checks (``autograder/checks/spec.py``) run the same rows on secret draws in the
kernel, judge the contract and the properties on the trusted side with this very code, and add what only the
grader knows: the reference's values. So a property is written once, with its message, for both.

A property raises :class:`~decoder_course.checks.CheckFailed` naming the idea that broke and the case's
situation (sizes, never values: the hidden draws are secret).

A row's arguments are what the exercise is called with, in order: NumPy arrays, torch tensors (a row may mix the
two libraries: ``split_heads`` works on both), numbers, dtypes; :class:`Keyword` marks one passed by name
(``softmax(x, axis=0)``). The spec's own functions (``dtype``, ``shape``, ``properties``) always see NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from decoder_course.checks import (
    CheckFailed,
    _is_tensor,
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
class Keyword:
    """A row's argument passed by name (``softmax(x, axis=0)``) rather than by position."""

    value: Any


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
    # the hidden side compares the values with the reference's (False: the properties decide), or a function
    # (arguments, result, the reference's result, situation) that says what differs without quoting a value
    compare: bool | Callable[[dict, Any, Any, str], None] = True
    tensors: bool = False  # the rows' arrays are passed as torch tensors, and the result is one
    refused: tuple[tuple[str, dict, str], ...] = ()  # (situation, arguments, why): calls that must raise ValueError
    # what an exception the student's code raised most likely means: (the row's arguments as passed, "Error: text")
    # -> a hint, or ""
    on_error: Callable[[dict, str], str] | None = None
    uses: tuple[str, ...] = ()  # the student's other exercises it may call: judged relative to their answers
    forbidden: tuple[str, ...] = ()  # names the exercise's code may not use (its docstring says why)
    rtol: float = 1e-5  # the hidden comparison with the reference's values
    atol: float = 1e-6
    fresh: bool = False  # the docstring promises a new tensor, not an ``expand`` view sharing one row's memory


def unwrap(value: Any) -> Any:
    return value.value if isinstance(value, Keyword) else value


def as_numpy(x: Any) -> Any:
    """A tensor's values as a NumPy array of its dtype (bfloat16, which NumPy lacks, widened to float32), as the
    grader's harvest hands them in; anything else as it is."""
    if not _is_tensor(x):
        return x
    x = x.detach().cpu()
    return (x.float() if x.dtype == _torch().bfloat16 else x).numpy().copy()


def plain(args: dict) -> dict:
    """The arguments as the spec's functions see them: NumPy arrays (a tensor's values), keywords unwrapped."""
    return {name: as_numpy(unwrap(v)) for name, v in args.items()}


def returns_tensor(spec: Spec, args: dict) -> bool:
    """A torch tensor is what the exercise returns on this row: ``tensors``, or a tensor among its arguments."""
    return spec.tensors or any(_is_tensor(unwrap(v)) for v in args.values())


def contract(spec: Spec, args: dict, got: Any, what: str, tensor: bool | None = None) -> None:
    """The result's type (a tensor: ``tensor=True``, an array: ``False``, unless the caller checked it: ``None``),
    dtype and shape on the (plain) ``args``."""
    if tensor is not None:
        expect_type(got, _torch().Tensor if tensor else np.ndarray, what)
    expect_dtype(got, spec.dtype(args), what)
    try:
        expect_shape(got, spec.shape(args), what, names=spec.axes or None)
    except CheckFailed as wrong:
        hint = spec.shape_hint(args, tuple(got.shape)) if callable(spec.shape_hint) else spec.shape_hint
        text = str(wrong)
        raise CheckFailed(f"{text}{'' if text.endswith(('.', '?')) else '.'} {hint}" if hint else text) from None


def expect_fresh(shape: tuple, strides: tuple, what: str) -> None:
    """A result that promises a new tensor has no 0 stride along an axis longer than 1 (an ``expand`` view's)."""
    shared = [axis for axis, (n, step) in enumerate(zip(shape, strides)) if step == 0 and n > 1]
    if shared:
        raise CheckFailed(f"{what} is a view whose entries along axis {shared[0]} share one row's memory (strides "
                          f"{tuple(strides)}): `expand` makes no copy, so writing into one row writes into all of "
                          "them and into the caller's tensor. Return a new tensor: `.repeat(...)` or "
                          "`.expand(...).clone()`")


def call_args(spec: Spec, args: dict) -> tuple[list, dict]:
    """The call as the exercise takes it, (positional, by name): NumPy arrays as they are (as fresh torch tensors
    with ``tensors``), torch tensors as fresh copies."""
    def value(v):
        if _is_tensor(v):
            return v.clone()
        return _torch().from_numpy(v.copy()) if spec.tensors and isinstance(v, np.ndarray) else v

    positional = [value(v) for v in args.values() if not isinstance(v, Keyword)]
    return positional, {name: value(v.value) for name, v in args.items() if isinstance(v, Keyword)}


def _called(spec: Spec, fn: Callable[..., Any], args: dict, desc: str) -> Any:
    positional, by_name = call_args(spec, args)
    try:
        if spec.keeps_inputs:
            return expect_inputs_unchanged(fn, *positional, **by_name)
        return fn(*positional, **by_name)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        hint = spec.on_error(args, f"{type(exc).__name__}: {exc}") if spec.on_error else ""
        if not hint:
            raise
        raise CheckFailed(f"{spec.name} raised {type(exc).__name__}: {exc} ({desc}). {hint}") from None


def run(spec: Spec, fn: Callable[..., Any], seed: int = 0) -> None:
    """The visible half: ``fn`` on each row drawn from ``seed``, its contract and properties checked (the
    properties see NumPy arrays, as on the hidden side)."""
    for desc, args in spec.rows(np.random.default_rng(seed)):
        with check(f"{spec.name} on a case with {desc}"):
            try:
                got = _called(spec, fn, args, desc)
                given = plain(args)
                contract(spec, given, got, f"{spec.name}(...) ({desc})", tensor=returns_tensor(spec, args))
                if spec.fresh:
                    expect_fresh(tuple(got.shape), got.stride(), f"{spec.name}(...)")
                if spec.properties is not None:
                    spec.properties(given, as_numpy(got) if _is_tensor(got) else to_numpy(got), desc)
            except CheckFailed as failed:  # the check's title names the situation already
                raise CheckFailed(str(failed).replace(f" ({desc})", "")) from None
    for desc, args, why in spec.refused:
        with check(f"{spec.name} refuses a case with {desc}"):
            expect_value_error(lambda args=args: fn(*call_args(spec, args)[0], **call_args(spec, args)[1]), why)
