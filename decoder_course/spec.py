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
    expect_close,
    expect_dropout,
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
    scalar: bool = False  # the result is a Python float (no dtype, no shape); the hidden side never shows its value


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


@dataclass(frozen=True)
class Declared:
    """The dtype the kernel declared for a result the grader read (``"torch.bfloat16"``), which the values it handed
    in no longer show (NumPy has no bfloat16: they arrive widened to float32)."""

    dtype: str


def contract(spec: Spec | ModuleSpec, args: dict, got: Any, what: str, tensor: bool | None = None,
             declared: str | None = None) -> None:
    """The result's type (a tensor: ``tensor=True``, an array: ``False``, unless the caller checked it: ``None``),
    dtype (``spec.dtype`` of the arguments as passed, tensors included; against ``declared`` where the grader read
    the result) and shape (``spec.shape`` of the plain arguments)."""
    if getattr(spec, "scalar", False):
        if declared not in (None, "float") or (declared is None and not isinstance(got, float)):
            kind = declared or type(got).__name__
            raise CheckFailed(f"{what} should return a Python float, got {kind}: a tensor's .item() is one")
        return
    if tensor is not None:
        expect_type(got, _torch().Tensor if tensor else np.ndarray, what)
    expect_dtype(Declared(declared) if declared else got, spec.dtype({n: unwrap(v) for n, v in args.items()}), what)
    given = plain(args)
    try:
        expect_shape(got, spec.shape(given), what, names=spec.axes or None)
    except CheckFailed as wrong:
        hint = spec.shape_hint(given, tuple(got.shape)) if callable(spec.shape_hint) else spec.shape_hint
        text = str(wrong)
        raise CheckFailed(f"{text}{'' if text.endswith(('.', '?')) else '.'} {hint}" if hint else text) from None


def tolerance(spec: Spec | ModuleSpec, args: dict) -> tuple[float, float]:
    """The comparison's (rtol, atol): the spec's, widened to what a half precision argument can hold."""
    rtol, atol = spec.rtol, spec.atol
    names = {str(getattr(unwrap(v), "dtype", "")).removeprefix("torch.") for v in args.values()}
    for name, floor in (("float16", 2e-3), ("bfloat16", 2e-2)):
        if name in names:
            rtol, atol = max(rtol, floor), max(atol, floor)
    return rtol, atol


def expect_fresh(shape: tuple, strides: tuple, what: str) -> None:
    """A result that promises a new tensor has no 0 stride along an axis longer than 1 (an ``expand`` view's)."""
    shared = [axis for axis, (n, step) in enumerate(zip(shape, strides)) if step == 0 and n > 1]
    if shared:
        raise CheckFailed(f"{what} is a view whose entries along axis {shared[0]} share one row's memory (strides "
                          f"{tuple(strides)}): `expand` makes no copy, so writing into one row writes into all of "
                          "them and into the caller's tensor. Return a new tensor: `.repeat(...)` or "
                          "`.expand(...).clone()`")


def call_args(spec: Spec | ModuleSpec, args: dict) -> tuple[list, dict]:
    """The call as the exercise takes it, (positional, by name): NumPy arrays as they are (as fresh torch tensors
    with ``tensors``: always for a module), torch tensors as fresh copies."""
    tensors = getattr(spec, "tensors", True)

    def value(v):
        if _is_tensor(v):
            return v.clone()
        return _torch().from_numpy(v.copy()) if tensors and isinstance(v, np.ndarray) else v

    positional = [value(v) for v in args.values() if not isinstance(v, Keyword)]
    return positional, {name: value(v.value) for name, v in args.items() if isinstance(v, Keyword)}


def _explained(spec: Spec | ModuleSpec, call: Callable[[], Any], args: dict) -> Any:
    """``call()``; an exception the spec recognises (``on_error``) becomes a CheckFailed naming its likely cause."""
    try:
        return call()
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        hint = spec.on_error(args, f"{type(exc).__name__}: {exc}") if spec.on_error else ""
        if not hint:
            raise
        raise CheckFailed(f"{spec.name} raised {type(exc).__name__}: {exc}. {hint}") from None


def _called(spec: Spec, fn: Callable[..., Any], args: dict) -> Any:
    positional, by_name = call_args(spec, args)
    if spec.keeps_inputs:
        return _explained(spec, lambda: expect_inputs_unchanged(fn, *positional, **by_name), args)
    return _explained(spec, lambda: fn(*positional, **by_name), args)


def run(spec: Spec, fn: Callable[..., Any], seed: int = 0) -> None:
    """The visible half: ``fn`` on each row drawn from ``seed``, its contract and properties checked (the
    properties see NumPy arrays, as on the hidden side)."""
    for desc, args in spec.rows(np.random.default_rng(seed)):
        with check(f"{spec.name} on a case with {desc}"):
            try:
                got = _called(spec, fn, args)
                contract(spec, args, got, f"{spec.name}(...) ({desc})", tensor=returns_tensor(spec, args))
                if spec.fresh:
                    expect_fresh(tuple(got.shape), got.stride(), f"{spec.name}(...)")
                if spec.properties is not None:
                    value = float(got) if spec.scalar else as_numpy(got) if _is_tensor(got) else to_numpy(got)
                    spec.properties(plain(args), value, desc)
            except CheckFailed as failed:  # the check's title names the situation already
                raise CheckFailed(str(failed).replace(f" ({desc})", "")) from None
    for desc, args, why in spec.refused:
        with check(f"{spec.name} refuses a case with {desc}"):
            positional, by_name = call_args(spec, args)
            expect_value_error(lambda: fn(*positional, **by_name), why)  # noqa: B023 - called at once


# -- modules ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Build:
    """One situation of a module exercise: the module built with ``init``, holding ``state``, called on ``inputs``."""

    situation: str
    init: dict  # the constructor's arguments, in order (Keyword: by name)
    inputs: dict  # forward's arguments, in order: arrays become fresh tensors
    state: dict | None = None  # parameters by the contract's names (NumPy arrays); None: the module as built
    seed: int | None = None  # training mode, torch seeded with this just before forward (dropout's masks); None: eval


@dataclass(frozen=True)
class ModuleSpec:
    """One module exercise, compared with what PyTorch's own modules compute with the same weights (``twin``: a
    public computation, not an answer key), on rows of both layers like a :class:`Spec`'s."""

    name: str
    rows: Callable[[np.random.Generator], list[Build]]
    # (constructor arguments, state as torch tensors or None, forward's arguments as tensors, training) -> PyTorch's
    # result: in training mode it runs right after the same seed, so its dropout draws the same masks
    twin: Callable[[dict, dict | None, dict, bool], Any]
    # the contract's parameters, for a state that does not load (or a function of the constructor's arguments)
    names: str | Callable[[dict], str]
    dtype: Callable[[dict], Any]  # forward's arguments as passed -> the result's dtype
    shape: Callable[[dict], tuple[int, ...]]  # the constructor's and forward's arguments (plain) -> the result's shape
    axes: str = ""
    shape_hint: str | Callable[[dict, tuple], str] = ""
    properties: Callable[[dict, Any, str], None] | None = None  # (the arguments, plain; result; situation)
    hint: str = ""
    keeps_inputs: bool = True
    on_error: Callable[[dict, str], str] | None = None
    uses: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    rtol: float = 1e-4  # float32 code against PyTorch's float32 modules
    atol: float = 1e-5
    # (constructor arguments, state, forward's arguments) -> {what a known mistake means: what PyTorch's own modules
    # compute when set up that way}: public wrong twins (the other LayerNorm placement, no padding mask), which
    # name the idea in both layers when the values differ
    variants: Callable[[dict, dict | None, dict], dict[str, Any]] | None = None
    # where the exercise's dropout acts, in its docstring's words: a training row (one with a seed) is then judged
    # as dropout active in training and off in eval, not against the twin (whose dropout draws in its own order)
    dropout: str = ""


def _tensors(values: dict) -> dict:
    torch = _torch()
    return {n: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for n, v in values.items()}


def expected(spec: ModuleSpec, row: Build) -> np.ndarray:
    """The twin's result on ``row`` (seeded as the module was), as NumPy."""
    torch = _torch()
    with torch.random.fork_rng(), torch.no_grad():  # the caller's random state stays as it was
        if row.seed is not None:
            torch.manual_seed(row.seed)
        want = spec.twin({n: unwrap(v) for n, v in row.init.items()}, None if row.state is None else
                         _tensors(row.state), _tensors({n: unwrap(v) for n, v in row.inputs.items()}),
                         row.seed is not None)
    return as_numpy(want)


def agrees(got: Any, want: Any, rtol: float, atol: float) -> bool:
    """``got`` has ``want``'s shape and values within the tolerance (NaN where ``want`` has NaN)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))


def variant(spec: ModuleSpec, row: Build, got: np.ndarray, rtol: float, atol: float) -> str:
    """The known mistake (``spec.variants``) whose values on ``row`` are ``got``, or ""."""
    if spec.variants is None:
        return ""
    torch = _torch()
    with torch.no_grad():
        wrong = spec.variants({n: unwrap(v) for n, v in row.init.items()}, None if row.state is None else
                              _tensors(row.state), _tensors({n: unwrap(v) for n, v in row.inputs.items()}))
    return next((idea for idea, value in wrong.items() if agrees(got, as_numpy(value), rtol, atol)), "")


def load(module: Any, state: dict, names: str, what: str) -> Any:
    """``module`` holding ``state`` (strict: the names are the contract); a name it lacks says which it has."""
    try:
        module.load_state_dict(_tensors(state), strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:400]
        raise CheckFailed(f"{what}'s parameters do not have the contract's names ({names}): PyTorch says "
                          f"{detail}") from None
    return module


def names_for(spec: ModuleSpec, row: Build) -> str:
    """The contract's parameter names for ``row``'s module."""
    return spec.names({n: unwrap(v) for n, v in row.init.items()}) if callable(spec.names) else spec.names


def built(spec: ModuleSpec, cls: Any, row: Build) -> Any:
    """``cls`` built, loaded and put in the row's mode (a mistake's class, on the trusted side, as well)."""
    positional, by_name = call_args(spec, row.init)
    module = cls(*positional, **by_name)
    if row.state is not None:
        load(module, row.state, names_for(spec, row), spec.name)
    return module.train() if row.seed is not None else module.eval()


def forward(spec: ModuleSpec, module: Any, row: Build) -> Any:
    torch = _torch()
    positional, by_name = call_args(spec, row.inputs)
    with torch.random.fork_rng(), torch.no_grad():  # the caller's random state stays as it was
        if row.seed is not None:
            torch.manual_seed(row.seed)
        if spec.keeps_inputs:
            return expect_inputs_unchanged(module, *positional, **by_name)
        return module(*positional, **by_name)


def run_module(spec: ModuleSpec, cls: Any, seed: int = 0) -> None:
    """The visible half of a module spec: ``cls`` on each row drawn from ``seed``, its contract, properties and
    agreement with PyTorch's own modules (``twin``) checked."""
    for row in spec.rows(np.random.default_rng(seed)):
        args = {**row.init, **row.inputs}
        mode = " (training mode)" if row.seed is not None else ""
        with check(f"{spec.name} on a case with {row.situation}{mode}"):
            if row.seed is not None and spec.dropout:
                module = built(spec, cls, row)
                positional, by_name = call_args(spec, row.inputs)
                with _torch().no_grad():
                    expect_dropout(lambda m=module, a=positional, k=by_name: m(*a, **k), module, spec.name,
                                   spec.dropout)
                continue
            got = _explained(spec, lambda row=row: forward(spec, built(spec, cls, row), row), args)
            contract(spec, row.inputs | row.init, got, f"{spec.name}'s output", tensor=True)
            if spec.properties is not None:
                spec.properties(plain(args), as_numpy(got), row.situation)
            rtol, atol = tolerance(spec, args)
            want, values = expected(spec, row), as_numpy(got)
            known = "" if agrees(values, want, rtol, atol) else variant(spec, row, values, rtol, atol)
            if known:
                raise CheckFailed(f"{spec.name}'s output is what PyTorch's own modules compute when {known}")
            expect_close(values, want, f"{spec.name}'s output (vs PyTorch's own modules)", rtol=rtol, atol=atol,
                         hint=spec.hint or None)
