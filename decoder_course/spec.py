"""Exercises as specs: one public row per exercise drives both layers of its checks.

A :class:`Spec` says what any correct answer does, without the answer: the situations to try it on (``rows``,
drawn from a random generator), the result's contract (type, dtype, shape) and the properties every correct
result has. The visible checks run it here, in the student's kernel, on draws of a public seed
(:func:`run`); a graded course's hidden checks (on the grader's side, not in this package) run the same
rows on secret draws in the kernel, judge the contract and the properties on the trusted side with this
very code, and add what only the grader knows: the reference's values. So a property is written once, with
its message, for both.

A property raises :class:`~decoder_course.checks.CheckFailed` naming the idea that broke and the case's
situation (sizes, never values: the hidden draws are secret).

A row's arguments are what the exercise is called with, in order: NumPy arrays, torch tensors (a row may mix the
two libraries: ``split_heads`` works on both), numbers, dtypes; :class:`Keyword` marks one passed by name
(``softmax(x, axis=0)``). The spec's own functions (``dtype``, ``shape``, ``properties``) always see NumPy arrays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from decoder_course import guard
from decoder_course.checks import (
    LEAKAGE,
    SHAPE_OR_DTYPE,
    WRONG_VALUES,
    CheckFailed,
    _is_tensor,
    _torch,
    agreeing,
    check,
    expect_close,
    expect_dropout,
    expect_dtype,
    expect_inputs_unchanged,
    expect_shape,
    expect_type,
    expect_unchanged,
    expect_value_error,
    snapshot,
    to_numpy,
)

# (the situation, as messages name it; the arguments, by name, in call order[; a Perturbed second call])
Row = tuple


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
    axes: str | tuple[str, ...] = ""  # the result's dimension names, for the shape message ("B, T, H, Dh")
    # what a wrong shape means, or (arguments, shape) -> that
    shape_hint: str | Callable[[dict, tuple], str] | tuple = ""
    hint: str | dict[str, str] = ""  # what a wrong value most likely means: the hidden comparison with the reference
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
    # the result is a tuple: its items' names, in order ("out", "weights"); ``shape`` then gives one shape per item,
    # ``axes``, ``shape_hint`` may be tuples and ``hint`` a dict by name, as for a ModuleSpec; ``order``: the order
    # the items are compared in
    outputs: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    # a public computation of the right result from the plain arguments (PyTorch's own function, as a module
    # spec's twin): the visible check compares the values with it, the hidden one with the reference's
    twin: Callable[[dict], Any] | None = None
    grad: bool = False  # every row's call is followed by a backward pass (a row alone: its Under's grad)
    # the result is a Python list of ints or of pairs of ints (train_bpe's merges): no dtype, no shape; the
    # properties see it as a list of tuples, the hidden side compares it exactly
    listed: bool = False
    grad_hint: str = ""  # what a NaN gradient on a row whose Under has ``grad`` most likely means


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
    if getattr(spec, "listed", False):
        expect_type(got, (list, tuple), what)
        return
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
        raise CheckFailed(f"{text}{'' if text.endswith(('.', '?')) else '.'} {hint}" if hint else text,
                          kind=SHAPE_OR_DTYPE) from None


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


def call_args(spec: Spec | ModuleSpec, args: dict, modules: dict | None = None) -> tuple[list, dict]:
    """The call as the exercise takes it, (positional, by name): NumPy arrays as they are (as fresh torch tensors
    with ``tensors``: always for a module), torch tensors as fresh copies, a :class:`Built` module built from
    ``modules`` (its classes by name)."""
    tensors = getattr(spec, "tensors", True)

    def value(v):
        if isinstance(v, Built):
            module = modules[v.cls](*v.init.values())
            module.load_state_dict(_tensors(v.state), strict=True)
            return module.eval()
        if isinstance(v, tuple):  # a tuple of arrays (memory_kv), each passed as the others are
            return tuple(value(x) for x in v)
        if _is_tensor(v):
            return v.clone()
        if isinstance(v, New):
            return v.build()
        return _torch().from_numpy(v.copy()) if tensors and isinstance(v, np.ndarray) else v

    positional = [value(v) for v in args.values() if not isinstance(v, (Keyword, Under))]
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


def _decoding(spec: ModuleSpec, call: Callable[[], Any]) -> Any:
    """``call()``, one of a row's cached calls: the call on all the positions at once has already worked, so an
    exception here is the cache's (a cache not passed on, keys not appended) and says so, with the spec's hint."""
    try:
        return call()
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:
        raise CheckFailed(f"{spec.name} raised {type(exc).__name__}: {exc} when decoding with a cache, though the "
                          f"same positions in one call without a cache worked. {spec.cache.hint}".strip()) from None


def _called(spec: Spec, fn: Callable[..., Any], args: dict, modules: dict | None = None) -> Any:
    positional, by_name = call_args(spec, args, modules)
    with autocast(options(args)):
        if spec.keeps_inputs:
            return _explained(spec, lambda: expect_inputs_unchanged(fn, *positional, **by_name), args)
        return _explained(spec, lambda: fn(*positional, **by_name), args)


def run(spec: Spec, fn: Callable[..., Any], seed: int = 0, modules: dict | None = None) -> None:
    """The visible half: ``fn`` on each row drawn from ``seed``, its contract and properties checked (the
    properties see NumPy arrays, as on the hidden side); ``modules``: the classes a :class:`Built` argument names."""
    for desc, args, *probe in spec.rows(np.random.default_rng(seed)):
        with check(f"{spec.name} on a case with {desc}"):
            try:
                if spec.outputs:
                    _run_items(spec, fn, args, desc, probe[0] if probe else None, modules)
                    continue
                got = _called(spec, fn, args)
                contract(spec, args, got, f"{spec.name}(...) ({desc})", tensor=returns_tensor(spec, args))
                if spec.fresh:
                    expect_fresh(tuple(got.shape), got.stride(), f"{spec.name}(...)")
                value = (listed(got) if spec.listed else float(got) if spec.scalar else as_numpy(got)
                         if _is_tensor(got) else to_numpy(got))
                if spec.properties is not None:
                    spec.properties(plain(args), value, desc)
                if spec.twin is not None:
                    expect_close(value, spec.twin(plain(args)), f"{spec.name}(...) (vs PyTorch's own)",
                                 rtol=spec.rtol, atol=spec.atol, hint=spec.hint or None)
                if spec.grad or options(args).grad:
                    grads = _explained(spec, lambda a=args: _function_gradients(spec, fn, a), args)
                    expect_gradients(spec, grads, desc)
            except CheckFailed as failed:  # the check's title names the situation already
                raise CheckFailed(str(failed).replace(f" ({desc})", ""), kind=failed.kind,
                                  mistake=failed.mistake) from None
    for desc, args, why in spec.refused:
        with check(f"{spec.name} refuses a case with {desc}"):
            positional, by_name = call_args(spec, args)
            expect_value_error(lambda: fn(*positional, **by_name), why)  # noqa: B023 - called at once


def _numpy(x: Any) -> np.ndarray:
    return as_numpy(x) if _is_tensor(x) else to_numpy(x)


def judge_parts(spec: Spec, args: dict, got: list, situation: str, declared: list | None = None) -> None:
    """A tuple result's items: the contract of each (on what was returned), then the properties (on NumPy)."""
    for i, value in enumerate(got):
        contract(part(spec, i), args, value, f"{what_of(spec, i)} ({situation})",
                 declared=None if declared is None else declared[i])
    if spec.properties is not None:
        spec.properties(plain(args), [_numpy(v) for v in got], situation)


def _run_items(spec: Spec, fn: Callable[..., Any], args: dict, desc: str, probe: Perturbed | None,
               modules: dict | None = None) -> None:
    """One row of a function whose result is a tuple: each item's type and contract, the properties, the probe."""
    got = items(spec, _called(spec, fn, args, modules), f"{spec.name}(...)")
    for i, value in enumerate(got):
        expect_type(value, _torch().Tensor if returns_tensor(spec, args) else np.ndarray, what_of(spec, i))
    judge_parts(spec, args, got, desc)
    if spec.grad or options(args).grad:
        expect_gradients(spec, _function_gradients(spec, fn, args), desc)
    if probe is not None:
        moved = items(spec, _called(spec, fn, probe.inputs, modules), f"{spec.name}(...)")[0]
        expect_unmoved(probe, _numpy(got[0]), _numpy(moved), what_of(spec, 0), desc)


# -- modules ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Perturbed:
    """A second call whose inputs differ from the row's only where the result must not depend on them (the future,
    the padded keys): the part of the first output it must leave where it was moves only if something leaks."""

    inputs: dict  # forward's arguments of the second call
    kept: Callable[[np.ndarray], np.ndarray]  # the first output -> the part that must not move
    leak: str  # what it means when it moves ("the future leaks: ...")
    moves: bool = False  # the opposite demand: the part must move (two calls without a seed draw different numbers)


@dataclass(frozen=True)
class Build:
    """One situation of a module exercise: the module built with ``init``, holding ``state``, called on ``inputs``."""

    situation: str
    init: dict  # the constructor's arguments, in order (Keyword: by name)
    inputs: dict  # forward's arguments, in order: arrays become fresh tensors
    state: dict | None = None  # parameters by the contract's names (NumPy arrays); None: the module as built
    seed: int | None = None  # training mode, torch seeded with this just before forward (dropout's masks); None: eval
    perturbed: Perturbed | None = None  # a second call that must leave part of the output unmoved
    grad: bool = False  # a backward pass from the (first) output: every float input gets a finite gradient
    # forward's inputs of further calls on the same module sharing one fresh cache (the spec's ``cache``, passed as
    # ``cache``): a prefill, then one position at a time; their outputs joined along axis 1 are the first output
    cached: tuple[dict, ...] = ()
    method: str = ""  # the row calls this method instead of forward, judged by the spec's ``methods[method]``
    refuses: str = ""  # the call must raise a ValueError: why (forward given both memory and memory_kv)


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
    axes: str | tuple[str, ...] = ""
    shape_hint: str | Callable[[dict, tuple], str] | tuple = ""
    properties: Callable[[dict, Any, str], None] | None = None  # (the arguments, plain; result; situation)
    hint: str | dict[str, str] = ""
    keeps_inputs: bool = True
    on_error: Callable[[dict, str], str] | None = None
    uses: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    rtol: float = 1e-4  # float32 code against PyTorch's float32 modules
    atol: float = 1e-5
    # (constructor arguments, state, forward's arguments, training) -> {what a known mistake means: what PyTorch's
    # own modules compute when set up that way}: public wrong twins (the other LayerNorm placement, no padding
    # mask), which name the idea in both layers when the values differ
    variants: Callable[[dict, dict | None, dict, bool], dict[str, Any]] | None = None
    # where the exercise's dropout acts, in its docstring's words: a training row (one with a seed) is then judged
    # as dropout active in training and off in eval, not against the twin (whose dropout draws in its own order)
    dropout: str = ""
    # forward returns a tuple: its items' names, in order ("out", "weights"); then ``shape`` gives one shape per
    # item, ``axes`` and ``shape_hint`` may be tuples too, ``hint`` a dict by name, and the twin returns a tuple
    outputs: tuple[str, ...] = ()
    order: tuple[str, ...] = ()  # the order the items are compared in (the weights before what they make)
    refused: tuple[tuple[str, dict, str], ...] = ()  # (situation, constructor's arguments, why): a ValueError
    grad_hint: str = ""  # what a NaN gradient on a row with ``grad`` most likely means
    cache: Cached | None = None  # how a row's ``cached`` calls are judged (a module that decodes with a cache)
    # state prefixes of submodules built from the student's other exercises (whose own checks judge their names):
    # the hidden side loads those keys only where the student's submodule has them, so a wrong name costs its own item
    lenient: tuple[str, ...] = ()
    # a method other than forward (``CrossAttention.project_memory``): its own contract, twin and hints, for the
    # rows that call it (``Build.method``); built with this spec's constructor and names
    methods: dict[str, ModuleSpec] = field(default_factory=dict)
    # (constructor arguments) -> facts about the built module's tensors, each (name, what it must be, why): "buffer"
    # (not a parameter: saved, moved, never trained), "tied:<other>" (the very tensor of that parameter) or
    # "untied:<other>"; judged on every evaluation row from :func:`members`
    facts: Callable[[dict], tuple[tuple[str, str, str], ...]] | None = None


def _tensors(values: dict) -> dict:
    torch = _torch()
    return {n: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for n, v in values.items()}


def item_names(spec: ModuleSpec) -> tuple[str, ...]:
    """The names of a module's result items: its ``outputs``, or ("output",) for a single tensor."""
    return spec.outputs or ("output",)


def items(spec: ModuleSpec, got: Any, what: str) -> list:
    """A module's result as the list of its items (one for a single tensor); a tuple of another length is refused."""
    if not spec.outputs:
        return [got]
    if isinstance(got, dict):  # a dict result (parameters): its items by the names
        expect_keys(set(got), spec.outputs, what)
        return [got[n] for n in spec.outputs]
    if not isinstance(got, (tuple, list)) or len(got) != len(spec.outputs):
        kind = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
        raise CheckFailed(f"{what} should return ({', '.join(spec.outputs)}), got {kind}")
    return list(got)


def part(spec: ModuleSpec, i: int) -> Any:
    """The contract of item ``i`` of the result, as :func:`contract` reads one."""
    if not spec.outputs:
        return spec

    def pick(value):
        return value[i] if isinstance(value, tuple) else value

    return SimpleNamespace(dtype=spec.dtype, shape=lambda a: spec.shape(a)[i], axes=pick(spec.axes),
                           shape_hint=pick(spec.shape_hint))


def compared(spec: ModuleSpec) -> list[int]:
    """The items' indices in the order they are compared (``order``: the weights before what they make)."""
    names = item_names(spec)
    return [names.index(n) for n in spec.order] if spec.order else list(range(len(names)))


def hint_for(spec: ModuleSpec, i: int) -> str:
    return spec.hint.get(item_names(spec)[i], "") if isinstance(spec.hint, dict) else spec.hint


def what_of(spec: ModuleSpec, i: int) -> str:
    return f"{spec.name}'s {item_names(spec)[i]}"


@contextlib.contextmanager
def seeded(row: Build):
    """The row's random state (training rows: torch seeded with ``row.seed``); the caller's is kept as it was."""
    torch = _torch()
    with torch.random.fork_rng(), torch.no_grad():
        if row.seed is not None:
            torch.manual_seed(row.seed)
        yield


def _plain_call(row: Build) -> tuple[dict, dict | None, dict]:
    return ({n: unwrap(v) for n, v in row.init.items()}, None if row.state is None else _tensors(row.state),
            _tensors({n: unwrap(v) for n, v in row.inputs.items()}))


def expected(spec: ModuleSpec, row: Build) -> list[np.ndarray]:
    """The twin's result items on ``row`` (seeded as the module was), as NumPy."""
    with seeded(row):
        want = spec.twin(*_plain_call(row), row.seed is not None)
    return [as_numpy(w) for w in (want if spec.outputs else [want])]


def agrees(got: Any, want: Any, rtol: float, atol: float) -> bool:
    """``got`` has ``want``'s shape and values within the tolerance (NaN where ``want`` has NaN)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))


def all_agree(got: list, want: list, rtol: float, atol: float) -> bool:
    return len(got) == len(want) and all(agrees(g, w, rtol, atol) for g, w in zip(got, want))


def variant(spec: ModuleSpec, row: Build, got: list[np.ndarray], rtol: float, atol: float) -> str:
    """The known mistake (``spec.variants``) whose result items on ``row`` are ``got``, or ""."""
    if spec.variants is None:
        return ""
    with seeded(row):
        wrong = spec.variants(*_plain_call(row), row.seed is not None)
    for idea, value in wrong.items():
        if all_agree(got, [as_numpy(v) for v in (value if spec.outputs else [value])], rtol, atol):
            return idea
    return ""


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


def forward(spec: ModuleSpec, module: Any, row: Build, inputs: dict | None = None) -> Any:
    """``module`` (or its ``row.method``) on the row's inputs (or ``inputs``: a perturbed call), seeded as the row
    says."""
    positional, by_name = call_args(spec, row.inputs if inputs is None else inputs)
    call = getattr(module, row.method) if row.method else module
    with seeded(row):
        if not spec.keeps_inputs:
            return call(*positional, **by_name)
        kept = {f"{n}[{j}]": (x, snapshot(x)) for n, v in by_name.items() if isinstance(v, tuple)
                for j, x in enumerate(v)}  # a tuple's arrays (memory_kv), unchanged too
        result = expect_inputs_unchanged(call, *positional, **by_name)
        for name, (x, old) in kept.items():
            expect_unchanged(old, x, f"argument `{name}` of {spec.name}")
        return result


def judged_by(spec: ModuleSpec, row: Build) -> ModuleSpec:
    """The spec that judges ``row``: its method's (``methods``), or the module's own for forward."""
    return spec.methods[row.method] if row.method else spec


def judge_items(spec: ModuleSpec, row: Build, got: list[np.ndarray], what: str, declared: list | None = None) -> None:
    """What both layers judge of a row's result items, before the values: the contract of each, the properties,
    and the known mistakes (public wrong twins) where the values differ from the twin's."""
    args = {**row.init, **row.inputs}
    for i, value in enumerate(got):
        contract(part(spec, i), row.inputs | row.init, value, f"{what_of(spec, i)} ({what})",
                 declared=None if declared is None else declared[i])
    if spec.properties is not None and row.seed is None:  # they describe eval mode: dropout breaks a row's sum
        spec.properties(plain(args), got if spec.outputs else got[0], what)
    rtol, atol = tolerance(spec, args)
    if not all_agree(got, expected(spec, row), rtol, atol):
        known = variant(spec, row, got, rtol, atol)
        if known:
            whose = f"{spec.name}'s result" if spec.outputs else what_of(spec, 0)
            raise CheckFailed(f"{whose} ({what}) is what PyTorch's own modules compute when {known}",
                              kind=WRONG_VALUES, mistake=known)


def expect_unmoved(probe: Perturbed, first: np.ndarray, moved: np.ndarray, what: str, situation: str) -> None:
    """The perturbed call left the part of the first output it must not move where it was."""
    same = np.shape(moved) == np.shape(first) and agrees(probe.kept(moved), probe.kept(first), 1e-5, 1e-4)
    if same == probe.moves:
        how = "did not move on the second call" if probe.moves else "moved where it must not"
        raise CheckFailed(f"{what} {how} ({situation}): {probe.leak}", kind=LEAKAGE)


def expect_gradients(spec: ModuleSpec, grads: dict, situation: str) -> None:
    """Every float input got a gradient (None: none reached it), and a finite one."""
    for name, grad in grads.items():
        if grad is None:
            raise CheckFailed(f"no gradient reached the {name} ({situation}): does the code detach (.item(), "
                              ".detach()), or go through NumPy? Gradients must flow through it for training")
        if not np.isfinite(grad).all():
            raise CheckFailed(f"the gradient of the {name} holds NaN or inf ({situation}). "
                              f"{getattr(spec, 'grad_hint', '')}".strip())


def refuse_forbidden(spec: Spec | ModuleSpec, probe: Callable[[], Any]) -> None:
    """The visible side of the grader's policy: ``probe`` runs the student's answer once while
    :func:`decoder_course.guard.watching` looks for what ``spec.forbidden`` names, and a call of one fails the
    check with the rule the grader enforces (which it would otherwise learn only from its feedback)."""
    rules = ", ".join(spec.forbidden)
    with check(f"{spec.name} is written without {rules}"):
        with guard.watching(spec.forbidden) as reached:
            probe()
        if reached:
            raise CheckFailed(
                f"your {spec.name} calls {', '.join(reached)}, which does this exercise's work for you: the grader "
                "refuses it here (the exercise scores nothing). Write it from the operations it is made of; "
                "PyTorch's version is what these checks compare yours against")


def run_module(spec: ModuleSpec, cls: Any, seed: int = 0, given: dict | None = None) -> None:
    """The visible half of a module spec: ``cls`` on each row drawn from ``seed``, its contract, properties and
    agreement with PyTorch's own modules (``twin``) checked (``given``: the lesson's given classes by name, the
    cache of rows that decode with one)."""
    for row in spec.rows(np.random.default_rng(seed)):
        _run_row(judged_by(spec, row), cls, row, given)
    for desc, init, why in spec.refused:
        with check(f"{spec.name} refuses to be built with {desc}"):
            positional, by_name = call_args(spec, init)
            expect_value_error(lambda: cls(*positional, **by_name), why)  # noqa: B023 - called at once


def _run_row(spec: ModuleSpec, cls: Any, row: Build, given: dict | None = None) -> None:
    """One row of :func:`run_module`, judged by ``spec`` (the module's, or its method's)."""
    args = {**row.init, **row.inputs}
    mode = " (training mode)" if row.seed is not None else ""
    with check(f"{spec.name} on a case with {row.situation}{mode}"):
        if row.refuses:
            module = built(spec, cls, row)
            expect_value_error(lambda: forward(spec, module, row), row.refuses)
            return
        if row.seed is not None and spec.dropout:
            module = built(spec, cls, row)
            positional, by_name = call_args(spec, row.inputs)
            with _torch().no_grad():
                expect_dropout(lambda m=module, a=positional, k=by_name: m(*a, **k), module, spec.name,
                               spec.dropout)
            return
        module = _explained(spec, lambda row=row: built(spec, cls, row), args)
        got = items(spec, _explained(spec, lambda m=module, row=row: forward(spec, m, row), args), spec.name)
        for i, value in enumerate(got):
            expect_type(value, _torch().Tensor, what_of(spec, i))
        values = [as_numpy(v) for v in got]
        try:
            expect_facts(spec, row, members(module, fact_names(spec, row)), row.situation)
            judge_items(spec, row, values, row.situation, declared=[str(v.dtype) for v in got])
            if row.perturbed is not None:
                moved = items(spec, forward(spec, module, row, row.perturbed.inputs), spec.name)[0]
                expect_unmoved(row.perturbed, values[0], as_numpy(moved), what_of(spec, 0), row.situation)
            if row.cached:
                cache = given[spec.cache.given](1)
                parts = [items(spec, _decoding(spec, lambda step=step: forward(
                    spec, module, row, {**step, "cache": Keyword(cache)})), spec.name)[0] for step in row.cached]
                keys = None if cache.keys[0] is None else tuple(cache.keys[0].shape)
                expect_cached(spec, row, values[0], [as_numpy(p) for p in parts], keys, row.situation)
        except CheckFailed as failed:  # the check's title names the situation already
            raise CheckFailed(str(failed).replace(f" ({row.situation})", ""), kind=failed.kind,
                                  mistake=failed.mistake) from None
        rtol, atol = tolerance(spec, args)
        want = expected(spec, row)
        for i in compared(spec):
            expect_close(values[i], want[i], f"{what_of(spec, i)} (vs PyTorch's own modules)", rtol=rtol,
                         atol=atol, hint=hint_for(spec, i) or None)
        if row.grad:
            try:
                expect_gradients(spec, _function_gradients(spec, built(spec, cls, row), row.inputs),
                                 row.situation)
            except CheckFailed as failed:
                raise CheckFailed(str(failed).replace(f" ({row.situation})", ""), kind=failed.kind,
                                  mistake=failed.mistake) from None


@dataclass(frozen=True)
class Built:
    """A row's argument that is one of the notebook's modules (``cls``, by name), built with ``init`` (in order),
    holding ``state`` (NumPy arrays by the contract's names), in eval mode: the student's own in the hidden check
    (``causal_self_attention(mha, ...)``), the class ``run`` is given in ``modules`` in the visible one, the
    reference's on the trusted side."""

    cls: str
    init: dict
    state: dict


@dataclass(frozen=True)
class Cached:
    """How a module that decodes with a cache is judged: a row's ``cached`` calls, sharing one fresh cache of the
    lesson's given class, give the row's first output joined along axis 1; the cache then holds keys of the shape
    ``keys`` says (a module that only passes the cache on to a submodule says none: that one's checks judge it)."""

    given: str  # the cache's class as the lesson gives it ("KVCache"), built with one layer
    keys: Callable[[dict], tuple] | None = None  # (the row's arguments, plain) -> the shape of layer 0's cached keys
    hint: str = ""  # what cached outputs that differ from the full forward's most likely mean
    keys_hint: str = ""  # what cached keys of another shape most likely mean


def expect_cached(spec: ModuleSpec, row: Build, first: np.ndarray, parts: list, keys: tuple | None,
                  situation: str) -> None:
    """The cached calls' outputs, each of its own length, joined along axis 1 equal the full forward's ``first``;
    the cache holds keys of the shape the spec's ``cache.keys`` says (if it says one)."""
    lengths = ", ".join(str(np.shape(unwrap(next(iter(step.values()))))[1]) for step in row.cached)
    what = f"{spec.name}'s output with a cache ({situation}: calls of {lengths} new positions in a row on one cache)"
    for step, got in zip(row.cached, parts):
        T = np.shape(unwrap(next(iter(step.values()))))[1]
        expect_shape(got, (first.shape[0], T, *first.shape[2:]), what, names=spec.axes or None)
    if not agrees(np.concatenate(parts, axis=1), first, *tolerance(spec, {**row.init, **row.inputs})):
        raise CheckFailed(f"{agreeing(what, 'differs', 'differ')} from the output of one call on all the positions. "
                          f"{spec.cache.hint}".rstrip())
    want = None if spec.cache.keys is None else tuple(spec.cache.keys(plain({**row.init, **row.inputs})))
    if want is not None and keys != want:
        raise CheckFailed(f"the cache holds keys of shape {keys}, should be {want} ({situation}). "
                          f"{spec.cache.keys_hint}".strip())


def listed(got: list) -> list:
    """A list result as the properties see it: its items as ints, or as tuples of ints (a pair: a merge)."""
    return [tuple(int(i) for i in item) if isinstance(item, (tuple, list)) else int(item) for item in got]


# -- a row's call options -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Under:
    """Not an argument: how a function spec's row makes its call, as a value among the row's arguments (any name):
    inside ``torch.autocast("cpu", dtype=...)`` (``autocast``: a dtype's name), or followed by a backward pass
    from the first result item (``grad``, for a spec with ``outputs``: every float argument then gets a finite
    gradient, and the inputs are not compared after the call)."""

    autocast: str = ""
    grad: bool = False

    @property
    def dtype(self) -> str:  # the precision the call computes in: tolerance() widens for it
        return self.autocast


def options(args: dict) -> Under:
    """The row's :class:`Under` (none: a plain call)."""
    return next((v for v in args.values() if isinstance(v, Under)), Under())


def autocast(under: Under) -> Any:
    """The context the row's call runs in: ``torch.autocast`` on the CPU, or none."""
    torch = _torch()
    return torch.autocast("cpu", dtype=getattr(torch, under.autocast)) if under.autocast else contextlib.nullcontext()


def float_inputs(args: dict) -> list[str]:
    """The arguments a ``grad`` row differentiates (a function's or a module's): its float arrays and tensors."""
    return [n for n, v in args.items() if (_is_tensor(unwrap(v)) and unwrap(v).is_floating_point())
            or (isinstance(unwrap(v), np.ndarray) and np.issubdtype(unwrap(v).dtype, np.floating))]


def _function_gradients(spec: Spec | ModuleSpec, fn: Callable[..., Any], args: dict) -> dict:
    """The gradients of the float arguments of ``fn`` (a function, or a module built for the row) after a backward
    pass (all ones) from the first result item."""
    positional, by_name = call_args(spec, args)
    passed = dict(zip([n for n, v in args.items() if not isinstance(v, (Keyword, Under))], positional)) | by_name
    given = {n: passed[n].requires_grad_() for n in float_inputs(args) if _is_tensor(passed.get(n))}
    with autocast(options(args)):
        first = items(spec, fn(*positional, **by_name), spec.name)[0]
    if getattr(first, "requires_grad", False):  # else: no gradient reached any argument (a detached result)
        first.backward(_torch().ones_like(first))
    return {n: None if x.grad is None else as_numpy(x.grad) for n, x in given.items()}


def numpy_rng(seed: int) -> np.random.Generator:
    """``np.random.default_rng(seed)``: what :func:`Rng` builds, in the kernel and here."""
    return np.random.default_rng(seed)


def torch_generator(seed: int) -> Any:
    """``torch.Generator().manual_seed(seed)``: what :func:`Seeded` builds, in the kernel and here."""
    return _torch().Generator().manual_seed(seed)


def expect_keys(keys: set, names: tuple, what: str) -> None:
    """A dict result holds exactly the contract's keys."""
    missing, extra = sorted(set(names) - keys), sorted(keys - set(names))
    if missing or extra:
        raise CheckFailed(f"{what}'s keys are not those the exercise names: missing {missing}, unexpected {extra}")


@dataclass(frozen=True)
class New:
    """A row's argument built afresh at each call by public code: ``path`` ("decoder_course.module:Name") called
    with ``args`` (a stand-in layer whose answers are PyTorch's), in the kernel as on the trusted side."""

    path: str
    args: tuple = ()

    def build(self) -> Any:
        import importlib

        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)(*self.args)


def Rng(seed: int) -> New:  # noqa: N802 - it reads as the argument it makes
    """A row's argument: a fresh ``np.random.default_rng(seed)`` at each call (two calls draw the same numbers)."""
    return New("decoder_course.spec:numpy_rng", (seed,))


def Seeded(seed: int) -> New:  # noqa: N802 - it reads as the argument it makes
    """A row's argument: a fresh ``torch.Generator`` seeded with ``seed`` at each call (``lm_batches``'s draws): the
    kernel's, the reference's and a known mistake's draw the same numbers."""
    return New("decoder_course.spec:torch_generator", (seed,))
def fact_names(spec: ModuleSpec, row: Build) -> list[str]:
    """The tensors ``spec.facts`` speaks of on ``row``, in order."""
    facts = spec.facts({n: unwrap(v) for n, v in row.init.items()}) if spec.facts else ()
    return list(dict.fromkeys(n for name, kind, _ in facts for n in (name, kind.partition(":")[2]) if n))


def members(module: Any, names: list[str]) -> dict[str, int]:
    """What each of ``names`` is in ``module``: 0 a buffer, -1 neither buffer nor parameter, else 1 + the position
    in ``names`` of the first one that is the very same parameter (tied weights share one number)."""
    params, buffers = dict(module.named_parameters(remove_duplicate=False)), dict(module.named_buffers())
    return {name: 0 if name in buffers else -1 if name not in params else
            1 + next(i for i, other in enumerate(names) if params.get(other) is params[name]) for name in names}


def expect_facts(spec: ModuleSpec, row: Build, layout: dict[str, int], situation: str) -> None:
    """The row's module holds its tensors as ``spec.facts`` says (``layout``: :func:`members` of it)."""
    for name, kind, why in spec.facts({n: unwrap(v) for n, v in row.init.items()}) if spec.facts else ():
        what, _, other = kind.partition(":")
        shared = layout.get(name, 0) > 0 and layout.get(name) == layout.get(other)
        if not (layout.get(name) == 0 if what == "buffer" else shared if what == "tied" else not shared):
            raise CheckFailed(f"{spec.name}'s {name} ({situation}): {why}")
