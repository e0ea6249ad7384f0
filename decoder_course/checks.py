"""Building blocks of the visible checks under every exercise: assertions whose messages say which idea broke.

A visible check reads like this::

    with check("causal_mask(4) has the right shape and dtype"):
        allowed = causal_mask(4)
        expect_type(allowed, np.ndarray, "causal_mask(4)")
        expect_shape(allowed, (4, 4), "causal_mask(4)", names="T, S")
        expect_bool(allowed, "causal_mask(4)")

It prints ``✓ <title>`` when every expectation holds, and otherwise raises :class:`CheckFailed` with
``✗ <title>: <what broke and the likely reason>``. Every helper works on NumPy arrays and PyTorch tensors
alike, never changes its inputs, and holds no reference answer: the probes test *properties* (the future does
not leak, padding does not leak, rows sum to one), which any correct answer has.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "CheckFailed",
    "causal_leakage_probe",
    "check",
    "expect_bool",
    "expect_close",
    "expect_dropout",
    "expect_dtype",
    "expect_finite",
    "expect_inputs_unchanged",
    "expect_rows_sum_to_one",
    "expect_shape",
    "expect_type",
    "expect_unchanged",
    "expect_value_error",
    "grid",
    "not_implemented_message",
    "padding_leakage_probe",
    "randomised",
    "run_checks",
    "snapshot",
    "to_numpy",
]


# What kind of failure a check found, as data beside its message: the grader records it with each verdict and
# the instructor's class report counts by it, so no one reads the prose back.
SHAPE_OR_DTYPE = "wrong shape or dtype"
NOT_FINITE = "NaN or inf"
LEAKAGE = "leakage"
WRONG_VALUES = "wrong values"


class CheckFailed(AssertionError):
    """A visible check failed; the message says which idea broke. ``kind``: one of the kinds above ("" when none
    fits); ``mistake``: the known mistake the values are, where one was recognised."""

    def __init__(self, *args, kind: str = "", mistake: str = ""):
        super().__init__(*args)
        self.kind, self.mistake = kind, mistake

    def _render_traceback_(self) -> list[str]:
        # IPython (JupyterLab, Colab) shows these lines instead of a traceback through the checker's internals:
        # the student needs the message, and the cell above is where the bug is.
        first, *rest = str(self).splitlines() or [""]
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {first}", *rest]


# ------------------------------------------------------------------------------------------------------------
# Running checks
# ------------------------------------------------------------------------------------------------------------


class check(contextlib.ContextDecorator):
    """Run a block (or decorate a function) as one named check: print ``✓ title`` or raise ``✗ title: why``.

    A failed expectation (any ``AssertionError``) becomes :class:`CheckFailed` with the title in front; a
    ``NotImplementedError`` says the exercise is not written yet. Other errors (a bug that crashes) are
    announced with the title and re-raised unchanged, so the traceback still points at the line that crashed.
    """

    def __init__(self, title: str):
        self.title = title

    def __enter__(self) -> check:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            print(f"✓ {self.title}")
            return False
        if isinstance(exc, NotImplementedError):
            raise CheckFailed(f"✗ {self.title}: {not_implemented_message(exc)}") from None
        if isinstance(exc, CheckFailed):
            # Our own message says it all; the helper's traceback would only distract.
            raise CheckFailed(f"✗ {self.title}: {exc}") from None
        if isinstance(exc, AssertionError):
            # A plain assert: keep the original, whose traceback shows the failing line.
            raise CheckFailed(f"✗ {self.title}: {exc or 'an assertion failed'}") from exc
        if isinstance(exc, Exception):  # not for KeyboardInterrupt and the like
            print(f"✗ {self.title}: raised {type(exc).__name__}: {exc}")
        return False


def run_checks(*checks: Callable[[], Any] | tuple[str, Callable[[], Any]]) -> int:
    """Run several checks in order, each as :class:`check`; the first failure raises. Returns how many passed.

    Each check is a function of no arguments (its title is the first line of its docstring, else its name)
    or a ``(title, function)`` pair.
    """
    for item in checks:
        if isinstance(item, tuple):
            title, fn = item
        else:
            fn = item
            doc = (fn.__doc__ or "").strip()
            title = doc.splitlines()[0] if doc else getattr(fn, "__name__", "check").replace("_", " ")
        with check(title):
            fn()
    if len(checks) > 1:
        print(f"all {len(checks)} checks passed")
    return len(checks)


def expect_building_blocks(item: Callable[..., Any], checks: Mapping[str, Callable[[Any], Any]]) -> None:
    """Before an item's own checks: each of the student's exercises it calls by name (found where ``item`` was
    defined: the notebook, behind any decorator) passes its own visible check, run quietly; else fail naming it.

    An item built on a wrong building block fails too, and its own messages would send the student looking for the
    cause in the item; the building block's cell above says what is wrong. ``checks`` maps each name, in the order
    to try them, to its visible check; a name the notebook does not define is skipped.
    """
    namespace = getattr(inspect.unwrap(item), "__globals__", None) or {}  # a decorator's wrapper: its function's
    for name, check_block in checks.items():
        block = namespace.get(name)
        if block is None:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its ✓ lines belong to its own cell
                check_block(block)
        except Exception:  # noqa: BLE001 - whatever stops a building block's check, its own cell shows it
            raise CheckFailed(f"this uses your `{name}`: its check above fails; fix it first") from None


def not_implemented_message(exc: BaseException | None = None, name: str | None = None) -> str:
    """The message for an exercise that still raises ``NotImplementedError``, naming the function."""
    if name is None and exc is not None and exc.__traceback__ is not None:
        tb = exc.__traceback__
        while tb.tb_next is not None:  # the innermost frame raised it
            tb = tb.tb_next
        # "FeedForward.__init__", not just "__init__"; a function defined inside another keeps its own name
        code_name = tb.tb_frame.f_code.co_qualname.rsplit("<locals>.", 1)[-1]
        name = None if code_name.startswith("<") else code_name
    who = f"`{name}`" if name else "this exercise"
    detail = f" ({exc})" if exc is not None and str(exc) else ""
    return (f"{who} is not implemented yet{detail}: replace `raise NotImplementedError()` with your code, "
            "run that cell, then run this check again.")


# ------------------------------------------------------------------------------------------------------------
# Conversions
# ------------------------------------------------------------------------------------------------------------


def _torch():
    """The torch module if it has been imported (a tensor can only exist then), else None."""
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of an array, a tensor (any device, with grad; half precision as float32) or a list."""
    if _is_tensor(x):
        torch = _torch()
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy().copy()
    return np.array(x)


def snapshot(x: Any) -> Any:
    """A deep copy of an array, tensor or container of them, for :func:`expect_unchanged` to compare."""
    if _is_tensor(x):
        return x.detach().clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    return copy.deepcopy(x)


_SINGULAR_IN_S = ("bias", "mass", "loss", "its", "this")  # singular nouns a subject may end with that end in "s"


def is_plural(subject: str) -> bool:
    """Whether a message's subject takes a plural verb ("the weights differ", "RMSNorm's output differs"): judged
    on its head noun, after dropping parenthesised asides and what follows " on ", " of ", " for ", " with " or
    " at ". Names of code (with ``_``, ``.`` or a call) are one thing: ``lm_batches`` differs, its ``inputs``
    differ; two things joined by "and" are plural."""
    head = subject
    while re.search(r"\([^()]*\)", head):
        head = re.sub(r"\([^()]*\)", "", head)
    head = re.split(r" (?:on|of|for|with|at) ", head.strip(), maxsplit=1)[0].strip().strip("`'\"")
    if " and " in head:
        return True
    last = head.split()[-1].strip("`'\"") if head.split() else ""
    if not last or "_" in last or "." in last or last.endswith("'s") or last.lower() in _SINGULAR_IN_S:
        return False
    return last.endswith("s") and not last.endswith(("ss", "us", "is"))


def agreeing(subject: str, singular: str, plural: str) -> str:
    """``subject`` followed by the verb that agrees with it: ``agreeing("weights", "differs", "differ")``."""
    return f"{subject} {plural if is_plural(subject) else singular}"


def _index(idx: Sequence[int]) -> str:
    """(0, 2, 1) → "[0, 2, 1]", the way you would index the array."""
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _number(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, (float, np.floating)) else str(v)


def _shape(x: Any, what: str) -> tuple[int, ...]:
    if x is None:
        raise CheckFailed(f"{agreeing(what, 'is', 'are')} None: did you forget to `return` the result?",
                          kind=SHAPE_OR_DTYPE)
    if not hasattr(x, "shape"):
        raise CheckFailed(f"{what} should be an array or a tensor, got {type(x).__name__}", kind=SHAPE_OR_DTYPE)
    return tuple(int(n) for n in x.shape)


# ------------------------------------------------------------------------------------------------------------
# Type, shape, dtype
# ------------------------------------------------------------------------------------------------------------


def _type_name(t: type) -> str:
    if t is np.ndarray:
        return "a NumPy array"
    if t.__module__ == "builtins":
        return f"a {t.__name__}"
    return f"a {t.__module__.split('.')[0]}.{t.__name__}"


def expect_type(x: Any, types: type | tuple[type, ...], what: str = "the result") -> None:
    """Fail unless ``x`` is an instance of ``types`` (a type or a tuple of types)."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(x, types):
        return
    wanted = " or ".join(_type_name(t) for t in types)
    got = type(x).__name__
    hint = ""
    if x is None:
        hint = ": did you forget to `return` the result?"
    elif np.ndarray in types and _is_tensor(x):
        hint = ": this exercise works in NumPy; use np functions, not torch"
    elif _torch() is not None and _torch().Tensor in types and isinstance(x, np.ndarray):
        hint = ": this exercise works in PyTorch; keep tensors (torch functions) and don't convert to NumPy"
    elif tuple in types and hasattr(x, "shape"):
        hint = ": return all the values as a tuple, e.g. `return out, weights`"
    elif isinstance(x, (list, tuple)) and (np.ndarray in types or (_torch() and _torch().Tensor in types)):
        hint = ": build an array, not a Python list"
    raise CheckFailed(f"{what} should be {wanted}, got {got}{hint}", kind=SHAPE_OR_DTYPE)


def _parse_names(names: str | Sequence[str] | None, ndim: int) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = names.strip("()[] ").replace(",", " ").split()
    names = list(names)
    if len(names) != ndim:
        raise ValueError(f"{len(names)} dimension names {names} for a shape of {ndim} dimensions")
    return names


def _matches(got: Sequence[int], want: Sequence[int | None]) -> bool:
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=True))


def _merged(shape: list[int | None]) -> list[tuple[int, int, list[int]]]:
    """Every way to merge two axes i < j of ``shape`` into one (placed anywhere), nearest pairs first."""
    out = []
    pairs = [(i, j) for i in range(len(shape)) for j in range(i + 1, len(shape))]
    pairs.sort(key=lambda pair: pair[1] - pair[0])
    for i, j in pairs:
        if shape[i] is None or shape[j] is None:
            continue
        rest = [n for k, n in enumerate(shape) if k not in (i, j)]
        out += [(i, j, rest[:pos] + [shape[i] * shape[j]] + rest[pos:]) for pos in range(len(rest) + 1)]
    return out


def _diagnose_shape(got: tuple[int, ...], want: list[int | None], names: list[str] | None) -> str:
    """Say, in the course's dimension letters, how ``got`` differs from ``want``."""
    label = (lambda i: names[i]) if names else (lambda i: f"axis {i}")
    if len(got) == len(want):
        bad = [i for i in range(len(want)) if want[i] is not None and got[i] != want[i]]
        if len(bad) == 2:
            i, j = bad
            if got[i] == want[j] and got[j] == want[i]:
                return f"did you swap {label(j)} and {label(i)}?"
        fixed = all(w is not None for w in want)
        if names and fixed and len(set(want)) == len(want) and sorted(got) == sorted(want):
            order = ", ".join(names[want.index(g)] for g in got)
            return f"your axes are in the order ({order}): a transpose or rearrange is missing or wrong"
        return "; ".join(f"{label(i)} is {got[i]}, expected {want[i]}" for i in bad)
    if len(got) == len(want) - 1:
        for i, j, merged in _merged(want):
            if _matches(got, merged):
                return (f"{label(i)} and {label(j)} are merged into one axis of size {want[i] * want[j]}: "
                        "keep them as two axes")
        for i in range(len(want)):
            if _matches(got, want[:i] + want[i + 1:]):
                return f"the {label(i)} axis is missing: was it summed, indexed or squeezed away?"
    if len(got) == len(want) + 1:
        for i in range(len(got)):
            if _matches(got[:i] + got[i + 1:], want):
                size_one = " (of size 1: squeeze it, or don't add it)" if got[i] == 1 else ""
                return f"there is an extra axis at position {i}{size_one}"
        for i, j, merged in _merged(list(got)):
            if _matches(merged, want):
                k = merged.index(got[i] * got[j])
                return f"{label(k)} is split into two axes of sizes {got[i]} and {got[j]}"
    return f"expected {len(want)} dimensions, got {len(got)}"


def expect_shape(
    x: Any,
    shape: Sequence[int | None] | Mapping[str, int | None],
    what: str = "the result",
    names: str | Sequence[str] | None = None,
) -> None:
    """Fail unless ``x.shape`` equals ``shape`` (None matches any size), saying which dimension is wrong.

    ``names`` gives the dimension letters, e.g. ``"B, H, T, S"``; or pass ``shape`` as
    ``{"B": 2, "H": 3, ...}``.
    The message reads like "expected (B, H, T, S) = (2, 3, 4, 5), got (2, 4, 3, 5): did you swap T and H?".
    """
    if isinstance(shape, Mapping):
        names, want = list(shape.keys()), list(shape.values())
    else:
        want = list(shape)
    names = _parse_names(names, len(want))
    got = _shape(x, what)
    if _matches(got, want):
        return
    sizes = "(" + ", ".join("?" if w is None else str(w) for w in want) + ")"
    expected = f"({', '.join(names)}) = {sizes}" if names else f"shape {sizes}"
    raise CheckFailed(f"{what}: expected {expected}, got {got}: {_diagnose_shape(got, want, names)}",
                      kind=SHAPE_OR_DTYPE)


def _dtype_name(dtype: Any) -> str:
    """A dtype's short name, the same for NumPy and torch: "float32", "int64", "bool", "bfloat16"."""
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    if isinstance(dtype, str) and dtype.removeprefix("torch.") == "bfloat16":  # a name, as the harvest declares it
        return "bfloat16"
    return np.dtype(dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype).name


def _dtype_of(x: Any) -> str:
    if not hasattr(x, "dtype"):
        raise CheckFailed(f"expected an array or a tensor, got {type(x).__name__}")
    return _dtype_name(x.dtype)


def _kind_name(option: Any) -> str:
    """A dtype option's name, or the kind itself ("float", "integer", "bool")."""
    return option if option in _KINDS else _dtype_name(option)


_KINDS = {
    "float": lambda name: name.startswith(("float", "bfloat")),
    "integer": lambda name: name.startswith(("int", "uint")),
    "bool": lambda name: name == "bool",
}


def expect_dtype(x: Any, dtype: Any, what: str = "the result") -> None:
    """Fail unless ``x``'s dtype is ``dtype``: a NumPy or torch dtype, a tuple of them, or a kind.

    The kinds are "float", "integer" and "bool".
    """
    got = _dtype_of(x)
    wanted = dtype if isinstance(dtype, tuple) else (dtype,)
    for option in wanted:
        is_kind = option in _KINDS
        if (is_kind and _KINDS[option](got)) or (not is_kind and got == _dtype_name(option)):
            return
    names = " or ".join(option if option in _KINDS else _dtype_name(option) for option in wanted)
    hint = ""
    if any(option == "bool" or (option not in _KINDS and _dtype_name(option) == "bool") for option in wanted):
        hint = (": a mask in this course is boolean (True = this query may attend to this key), not 0/1 "
                "numbers or an additive bias; comparisons give booleans")
    elif _KINDS["float"](got) and all(_KINDS["integer"](_kind_name(option)) for option in wanted):
        hint = ": token ids and positions are integers; did a division or np.mean turn them into floats?"
    elif _KINDS["integer"](got) and all(_KINDS["integer"](_kind_name(option)) for option in wanted):
        explicit = [_dtype_name(option) for option in wanted if option not in _KINDS]
        if explicit and all(_bits(name) > _bits(got) for name in explicit):
            # a result whose width is fixed (int64 ids from int32 ones): the input's dtype is not the answer
            hint = (f": this result is {names} whatever the input's integer width; convert it (.long() in "
                    "PyTorch, .astype(np.int64) in NumPy)")
        else:
            hint = (": integer widths matter too; make new tensors with the input's dtype (dtype=x.dtype: int32 "
                    "stays int32)")
    elif got == "float64" and "float32" in names:
        hint = ": float32 inputs became float64, which happens when they meet a float64 array or constant"
    elif not _KINDS["float"](got) and "float" in names:
        hint = ": integer or boolean values need converting to floats before this arithmetic"
    raise CheckFailed(f"{what} should have dtype {names}, got {got}{hint}", kind=SHAPE_OR_DTYPE)


def _bits(dtype_name: str) -> int:
    """The width in bits a dtype's name states ("int32" -> 32; 0 when it states none)."""
    digits = "".join(c for c in dtype_name.rsplit(".", 1)[-1] if c.isdigit())
    return int(digits) if digits else 0


def expect_bool(x: Any, what: str = "the mask") -> None:
    """Fail unless ``x`` is a boolean array or tensor (the course's masks: True = may attend / is real)."""
    expect_dtype(x, "bool", what)


# ------------------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------------------


def expect_finite(x: Any, what: str = "the result", hint: str | None = None) -> None:
    """Fail if ``x`` holds NaN or ±inf, saying where the first one is and the usual reason."""
    _shape(x, what)
    values = to_numpy(x)
    if values.dtype == bool or np.issubdtype(values.dtype, np.integer):
        return
    nan, inf = np.isnan(values), np.isinf(values)
    if nan.any():
        first = _index(np.argwhere(nan)[0])
        why = hint or "a fully masked row divided 0 by 0?"
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} NaN at {first} ({int(nan.sum())} NaN values in "
                          f"all): {why}",
                          kind=NOT_FINITE)
    if inf.any():
        first = np.argwhere(inf)[0]
        why = hint or "did -inf scores reach the output, or did exp() overflow on large scores?"
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} {_number(values[tuple(first)])} at {_index(first)} "
                          f"({int(inf.sum())} infinite values in all): {why}", kind=NOT_FINITE)


def expect_close(
    got: Any,
    want: Any,
    what: str = "the result",
    hint: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    names: str | Sequence[str] | None = None,
) -> None:
    """Fail unless ``got`` has ``want``'s shape and values: |got - want| <= atol + rtol * |want| everywhere.

    Booleans and integers must match exactly. The message gives the largest error, where it is, and ``hint``.
    """
    expected = to_numpy(want)
    expect_shape(got, expected.shape, what, names=names)
    values = to_numpy(got)
    suffix = f": {hint}" if hint else ""
    n = values.size
    exact = expected.dtype == bool or values.dtype == bool or (
        np.issubdtype(expected.dtype, np.integer) and np.issubdtype(values.dtype, np.integer))
    if exact:
        wrong = values != expected
        if wrong.any():
            first = np.argwhere(wrong)[0]
            raise CheckFailed(f"{agreeing(what, 'is', 'are')} wrong at {int(wrong.sum())} of {n} entries, the first at "
                              f"{_index(first)}: got {values[tuple(first)].item()!r}, expected "
                              f"{expected[tuple(first)].item()!r}{suffix}", kind=WRONG_VALUES)
        return
    values, expected = values.astype(np.float64), expected.astype(np.float64)
    surprise_nan = np.isnan(values) & ~np.isnan(expected)
    if surprise_nan.any():
        first = np.argwhere(surprise_nan)[0]
        why = suffix or ": a fully masked row divided 0 by 0?"
        raise CheckFailed(f"{agreeing(what, 'contains', 'contain')} NaN at {_index(first)} where "
                          f"{_number(expected[tuple(first)])} "
                          f"is expected ({int(surprise_nan.sum())} NaN values in all){why}", kind=NOT_FINITE)
    with np.errstate(invalid="ignore"):
        error = np.abs(values - expected)  # NaN where both are NaN, or inf - inf
    same = (values == expected) | (np.isnan(values) & np.isnan(expected))  # equal infinities count as equal
    wrong = ~same & ~(error <= atol + rtol * np.abs(expected))
    if wrong.any():
        # The wrong entry with the largest error (an error of NaN, from inf - inf, counts as largest).
        ranked = np.where(wrong, np.nan_to_num(error, nan=np.inf), -1.0)
        worst = np.unravel_index(np.argmax(ranked), ranked.shape)
        raise CheckFailed(
            f"{agreeing(what, 'differs', 'differ')} from the expected values: max abs error {_number(error[worst])} at "
            f"{_index(worst)} (got {_number(values[worst])}, expected {_number(expected[worst])}); "
            f"{int(wrong.sum())} of {n} entries are off by more than {atol:g} + {rtol:g}·|expected|{suffix}",
            kind=WRONG_VALUES)


def expect_rows_sum_to_one(
    weights: Any, allowed: Any = None, what: str = "the attention weights", atol: float = 1e-5
) -> None:
    """Fail unless every row (last axis) of ``weights`` is a probability distribution over its allowed keys.

    With ``allowed`` (broadcastable to ``weights``): blocked keys get exactly zero weight, and a row with no
    allowed key is all zeros. Without it, every row must sum to one.

    Shape:
        weights: (..., T, S); allowed: broadcastable to it, e.g. (B, 1, T, S) or (T, S).
    """
    _shape(weights, what)
    w = to_numpy(weights).astype(np.float64)
    expect_finite(w, what)
    if (w < -atol).any():
        first = np.argwhere(w < -atol)[0]
        raise CheckFailed(f"{agreeing(what, 'has', 'have')} a negative weight {_number(w[tuple(first)])} at "
                          f"{_index(first)}: "
                          "attention weights are probabilities, never negative")
    sums = w.sum(axis=-1)  # (..., T)
    if allowed is None:
        has_key, mask = np.ones(sums.shape, dtype=bool), None
    else:
        expect_bool(allowed, "allowed")
        try:
            mask = np.broadcast_to(to_numpy(allowed), w.shape)  # (..., T, S)
        except ValueError:
            raise CheckFailed(f"allowed of shape {tuple(allowed.shape)} does not broadcast to {what} of "
                              f"shape {w.shape}") from None
        has_key = mask.any(axis=-1)  # (..., T)
    empty_rows = ~has_key & (np.abs(sums) > atol)
    if empty_rows.any():
        row = tuple(np.argwhere(empty_rows)[0])
        S = w.shape[-1]
        uniform = np.allclose(w[row], 1.0 / S, atol=atol)
        why = " (a uniform average over all keys: a large negative fill alone gives that)" if uniform else ""
        raise CheckFailed(f"row {_index(row)} of {what} has no allowed key, so it must be all zeros, but it "
                          f"sums to {_number(sums[row])}{why}")
    if mask is not None:
        leaked = ~mask & (np.abs(w) > atol)
        if leaked.any():
            first = np.argwhere(leaked)[0]
            raise CheckFailed(
                f"{what} put weight {_number(w[tuple(first)])} on a blocked key at {_index(first)}: the "
                "mask was not applied before the softmax, or with the wrong polarity (True = this query may "
                "attend to this key)")
    off = has_key & (np.abs(sums - 1.0) > atol)
    if off.any():
        row = tuple(np.argwhere(off)[0])
        raise CheckFailed(f"row {_index(row)} of {what} sums to {_number(sums[row])}, not 1: did you "
                          "normalise over the wrong axis? The softmax runs over the keys, the last axis (S)")


def expect_unchanged(before: Any, after: Any, what: str = "your input") -> None:
    """Fail if ``after`` differs from the copy ``before`` taken earlier (see :func:`snapshot`)."""
    old, new = to_numpy(before), to_numpy(after)
    message = f"{agreeing(what, 'was', 'were')} changed: you modified the caller's input in place"
    if old.shape != new.shape or old.dtype != new.dtype:
        raise CheckFailed(f"{message} (it went from {old.dtype} {old.shape} to {new.dtype} {new.shape})")
    changed = old != new
    if old.dtype.kind in "fc":
        changed &= ~(np.isnan(old) & np.isnan(new))  # NaN stayed NaN
    if changed.any():
        first = tuple(np.argwhere(changed)[0])
        raise CheckFailed(f"{message} (first at {_index(first)}: it was {_number(old[first])}, now "
                          f"{_number(new[first])}). Work on a new array: `x = x + 1` makes one, `x += 1` and "
                          "`x[...] = ...` write into the caller's")


def _array_like(x: Any) -> bool:
    return isinstance(x, np.ndarray) or _is_tensor(x)


def expect_inputs_unchanged(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)``, fail if it modified an array argument in place, and return its result."""
    named = [*enumerate(args), *kwargs.items()]
    before = {key: snapshot(value) for key, value in named if _array_like(value)}
    result = fn(*args, **kwargs)
    for key, old in before.items():
        new = args[key] if isinstance(key, int) else kwargs[key]
        name = f"argument {key}" if isinstance(key, int) else f"argument `{key}`"
        expect_unchanged(old, new, f"{name} of {getattr(fn, '__name__', 'the function')}")
    return result


# ------------------------------------------------------------------------------------------------------------
# Probes: properties any correct answer has
# ------------------------------------------------------------------------------------------------------------


def _no_grad():
    torch = _torch()
    return torch.no_grad() if torch is not None else contextlib.nullcontext()


def _primary(out: Any) -> np.ndarray:
    """The output a probe compares: the first item of a tuple such as (out, weights), as float64 NumPy."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    return to_numpy(out).astype(np.float64)


def _like(values: np.ndarray, x: Any) -> Any:
    """``values`` as the same kind of object as ``x`` (array or tensor, same dtype and device)."""
    if _is_tensor(x):
        torch = _torch()
        return torch.from_numpy(values).to(dtype=x.dtype, device=x.device)
    return values.astype(x.dtype)


def _perturbed(x: Any, where: np.ndarray, rng: np.random.Generator) -> Any:
    """A copy of ``x`` whose entries at ``where`` are replaced by different values of the same kind."""
    values = to_numpy(x)
    new = values.copy()
    if values.dtype == bool:
        new[where] = ~values[where]
    elif np.issubdtype(values.dtype, np.integer):
        # Token ids: other ids within the range the input already uses, never the same id.
        low, high = int(values.min()), int(values.max())
        high = max(high, low + 1)
        draw = rng.integers(low, high + 1, size=values.shape)
        draw = np.where(draw == values, np.where(values < high, values + 1, low), draw)
        new[where] = draw[where]
    else:
        scale = float(values.std()) or 1.0
        new[where] = values[where] + scale * (1.0 + rng.random(size=int(where.sum())))
    return _like(new, x)


def _call(fn: Callable[[Any], Any], x: Any) -> np.ndarray:
    with _no_grad():
        return _primary(fn(snapshot(x)))


def _differs(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Where a and b differ beyond the tolerance; NaN == NaN and inf == inf count as unchanged."""
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore"):
        # (a != b) keeps equal infinities, whose difference is NaN, from counting as a change.
        return ~both_nan & (a != b) & ~(np.abs(a - b) <= atol + rtol * np.abs(b))


def _baseline(fn: Callable[[Any], Any], x: Any, atol: float, rtol: float) -> np.ndarray:
    """fn(x), after checking that calling it twice gives the same output (else no probe can judge it)."""
    first, second = _call(fn, x), _call(fn, x)
    if first.shape != second.shape or _differs(second, first, atol, rtol).any():
        raise CheckFailed("the function gives different outputs for the same input, so leakage cannot be "
                          "tested: turn off dropout (model.eval() or dropout=0.0) or other randomness")
    return first


def causal_leakage_probe(
    fn: Callable[[Any], Any],
    x: Any,
    time_axis: int = 1,
    seed: int = 0,
    out_time_axis: int | None = None,
    what: str = "the output",
    atol: float = 1e-6,
    rtol: float = 1e-5,
) -> None:
    """Fail if output position t depends on any input position after t.

    For each t, changes every input position > t (along ``time_axis``) to other values and checks that the
    outputs at positions <= t (along ``out_time_axis``, by default the same axis) did not change. ``fn`` gets
    ``x`` (array, tensor or token ids) and returns an output, or a tuple whose first item is the output.

    Shape:
        x: (..., T, ...) with T along ``time_axis``; fn(x): (..., T, ...) with T along ``out_time_axis``.
    """
    rng = np.random.default_rng(seed)
    base = _baseline(fn, x, atol, rtol)
    shape = _shape(x, "the probe's input")
    axis = time_axis % len(shape)
    out_axis = axis if out_time_axis is None else out_time_axis % base.ndim
    T = shape[axis]
    if base.ndim <= out_axis or base.shape[out_axis] != T:
        raise CheckFailed(f"{agreeing(what, 'has', 'have')} shape {base.shape}, but the input has T = {T} "
                          f"positions along axis "
                          f"{axis}: the output should keep one position per input position along axis "
                          f"{out_axis}")
    positions = np.arange(T).reshape([-1 if i == axis else 1 for i in range(len(shape))])  # T along `axis`
    for t in range(T - 1):
        future = np.broadcast_to(positions > t, shape)  # True at every entry after position t
        out = _call(fn, _perturbed(x, future, rng))
        changed = _differs(out, base, atol, rtol)
        # Any change at an output position p <= t is a leak from the future.
        changed_at = np.moveaxis(changed, out_axis, 0).reshape(T, -1).any(axis=1)  # (T,)
        leaked = np.flatnonzero(changed_at[: t + 1])
        if leaked.size:
            raise CheckFailed(f"position {leaked[0]} changed when only positions > {t} were changed: your "
                              f"mask lets the future leak (in {what})")


def padding_leakage_probe(
    fn: Callable[[Any], Any],
    x: Any,
    is_real: Any,
    key_axis: int = 1,
    seed: int = 0,
    out_is_real: Any = None,
    what: str = "the output",
    trials: int = 2,
    atol: float = 1e-6,
    rtol: float = 1e-5,
) -> None:
    """Fail if changing the padded positions of ``x`` changes any real output.

    ``is_real`` marks the real positions of ``x`` (batch on axis 0, positions on ``key_axis``). The outputs
    compared are those at ``out_is_real`` (B, T) if given; else, when the output's first two axes match
    ``is_real`` (self-attention), those at the real positions; else all of them (cross-attention, where the
    padded positions are keys only).

    Shape:
        x: (B, S, ...) with S along ``key_axis``; is_real: (B, S); fn(x): (B, T, ...).
    """
    rng = np.random.default_rng(seed)
    shape = _shape(x, "the probe's input")
    real = to_numpy(is_real).astype(bool)
    axis = key_axis % len(shape)
    if axis == 0:
        raise ValueError("key_axis must not be 0: axis 0 is the batch")
    if real.shape != (shape[0], shape[axis]):
        raise ValueError(f"is_real has shape {real.shape}, expected (B, S) = {(shape[0], shape[axis])}")
    if real.all():
        raise ValueError("padding_leakage_probe needs at least one padded position (is_real False)")
    # is_real laid out on x's batch axis and key axis, broadcast over the others.
    layout = [shape[0] if i == 0 else shape[axis] if i == axis else 1 for i in range(len(shape))]
    padded = np.broadcast_to(~real.reshape(layout), shape)
    base = _baseline(fn, x, atol, rtol)
    if out_is_real is not None:
        compare = to_numpy(out_is_real).astype(bool)
        if compare.shape != base.shape[:2]:
            raise ValueError(f"out_is_real has shape {compare.shape}, expected (B, T) = {base.shape[:2]}")
    elif base.shape[:2] == real.shape:
        compare = real
    else:
        compare = np.ones(base.shape[:2], dtype=bool)
    for _ in range(trials):
        out = _call(fn, _perturbed(x, padded, rng))
        changed = _differs(out, base, atol, rtol).reshape(*base.shape[:2], -1).any(axis=-1)  # (B, T)
        leaked = np.argwhere(changed & compare)
        if leaked.size:
            b, t = leaked[0]
            raise CheckFailed(f"{what} at batch item {b}, position {t} changed when only padded "
                              "positions were changed: padded keys leak into real outputs (is the padding "
                              "mask applied, with True = real token?)")



# ------------------------------------------------------------------------------------------------------------
# Modules and contracts: shared by the visible checks of every lesson with an nn.Module
# ------------------------------------------------------------------------------------------------------------


def expect_value_error(fn: Callable[[], Any], why: str) -> None:
    """``fn()`` must raise ``ValueError``: ``why`` says what is wrong with its arguments ("D=10 is not divisible
    by H=3"). Not written yet (``NotImplementedError``) is passed on, so :class:`check` says so."""
    try:
        fn()
    except ValueError:
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - any other exception is the wrong one
        raise CheckFailed(f"{why}: raise a ValueError that says so, not {type(exc).__name__} ({exc})") from None
    raise CheckFailed(f"{why}, yet it was accepted: raise a ValueError that says so")


def randomised(module: Any, seed: int, scale: float | None = None) -> Any:
    """``module`` with every parameter re-drawn from a seeded generator, in place, and returned.

    Weights get N(0, 1 / fan_in) (or N(0, scale²)), biases are far from 0, and norm gains lie around 1, so that a
    missing bias, an unused projection or a norm left out all change the output."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif p.dim() == 1:
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * (scale if scale is not None else max(1, p.shape[-1]) ** -0.5))
    return module


def expect_dropout(run: Callable[[], Any], module: Any, what: str, where: str) -> None:
    """``run()`` (a forward pass of ``module``) differs between training and eval mode, and eval mode gives the
    same output twice: dropout acts ``where`` the exercise says ("on the attention weights") and only in training.
    Leaves the module in eval mode."""
    torch = _torch()
    module.train()
    torch.manual_seed(0)
    trained = _primary(run())
    module.eval()
    first, second = _primary(run()), _primary(run())
    if not np.array_equal(first, second):
        raise CheckFailed(f"in eval mode {what} gave two different outputs for the same input: dropout must be off "
                          "in eval mode (use nn.Dropout modules, which follow .train() and .eval())")
    if first.shape == trained.shape and np.allclose(trained, first, rtol=1e-6, atol=1e-6):
        raise CheckFailed(f"in training mode with dropout > 0 {what} equals its eval-mode output: dropout never "
                          f"acted. Apply it {where}")


def grid(mask: Any, indent: int = 8) -> str:
    """A (T, S) boolean mask drawn as rows of ``1`` (may attend) and ``.`` (blocked), for a message."""
    return "\n".join(" " * indent + " ".join("1" if a else "." for a in row) for row in to_numpy(mask).tolist())
