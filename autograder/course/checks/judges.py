"""Generic judges and case makers shared by every lesson's hidden checks (trusted side only).

A lesson's checks module says *what* an exercise must do; the judges here say *how* a property is checked and how
its failure reads, once for the whole course:

================================  ==============================================================================
``right_padded(rng, B, n)``       an ``is_real`` (B, n) mask: padding at the end, one row unpadded
``token_ids(rng, B, n, V)``       ids in 3 .. V-1 (0, 1, 2 are PAD, BOS, EOS), PAD where a position is not real
``record_after(case, names)``     record each bound input again after the call (``{name}_after``)
``unchanged(result, id, ...)``    those inputs equal what was passed: the caller's arrays were not written
``value_error(result, id, why)``  a call built to be refused raised a ``ValueError``
``diagnose(got, candidates)``     "Your output matches <a known mistake>." for the first candidate that matches
``dropout(result, id, ...)``      dropout active in training mode, off (and deterministic) in eval mode
``leak(before, after, ...)``      a perturbation of what must not matter (the future, padding) moved the output
``scalar(got, want, ...)``        a scalar agrees; the message never gives the expected value or the gap
================================  ==============================================================================

Every message names the idea that broke and the case's situation (sizes, never values).
"""

from __future__ import annotations

import numpy as np

from autograder.course.checks.framework import Case, Fail, Result, name_mistake
from decoder_course.checks import LEAKAGE, agreeing


# -- case makers ------------------------------------------------------------------------------------------------
def right_padded(rng: np.random.Generator, B: int, n: int, min_real: int = 1, empty_row: int | None = None,
                 full_row: int = 0) -> np.ndarray:
    """``is_real`` (B, n): real tokens then padding, row ``full_row`` unpadded, every other row with between
    ``min_real`` and n - 1 real tokens; ``empty_row`` (if given) has no real token at all."""
    lengths = rng.integers(min_real, n, size=B) if n > min_real else np.full(B, n)
    lengths[full_row] = n
    is_real = np.arange(n)[None, :] < lengths[:, None]  # (B, n)
    if empty_row is not None:
        is_real[empty_row] = False
    return is_real


def token_ids(rng: np.random.Generator, B: int, n: int, V: int, is_real: np.ndarray | None = None,
              pad_id: int = 0) -> np.ndarray:
    """Ids (B, n) in 3 .. V-1 (0, 1, 2 are PAD, BOS, EOS), ``pad_id`` where ``is_real`` is False."""
    ids = rng.integers(3, V, size=(B, n))
    return ids if is_real is None else np.where(is_real, ids, pad_id)


def record_after(case: Case, names) -> None:
    """Record each input bound with ``let`` again, after the calls so far: :func:`unchanged` reads them."""
    for name in names:
        case.record(f"{name}_after", {"ref": name})


# -- judges -----------------------------------------------------------------------------------------------------
def unchanged(result: Result, case_id: str, before: dict, what: str) -> None:
    """Each input recorded by :func:`record_after` equals the value passed (``before``: name -> array)."""
    desc = result.cases[case_id].desc
    for name, value in before.items():
        if value is None:
            continue
        after = result.get(case_id, f"{name}_after", what=f"`{name}` after the call", kind="array", finite=False)
        if after.shape != np.shape(value) or not np.array_equal(after, value, equal_nan=True):
            raise Fail(f"{what} changed the caller's `{name}` in place ({desc}). Work on a new array or tensor: "
                       "`x = x - m` makes one; `x -= m` or `x[...] = ...` write into the caller's.")


def value_error(result: Result, case_id: str, why: str) -> None:
    """The case was built to be refused: its call must have raised a ValueError (``why`` says what was wrong)."""
    error = result.error(case_id)
    if error is not None and "NotImplementedError" in error:
        result.raise_if_error(case_id)
    if error is None:
        raise Fail(f"{why}, yet your code accepted it: raise a ValueError that says so, instead of failing later "
                   "with a less helpful message (or not at all).")
    if "ValueError" not in error:
        raise Fail(f"{why}: raise a ValueError, but your code raised:\n    {error.splitlines()[-1]}")


def diagnose(got: np.ndarray, candidates: dict, rtol: float = 1e-4, atol: float = 1e-4) -> str:
    """Name the known mistake (a key of ``candidates``: its output on the trusted side) that the student's output
    matches, if any; never a value."""
    for mistake, want in candidates.items():
        if want is not None and np.shape(got) == np.shape(want) and np.allclose(got, want, rtol=rtol, atol=atol):
            name_mistake(mistake)
            return f"Your output matches {mistake}."
    return ""


def dropout(result: Result, case_id: str, what: str, shape: tuple, where: str,
            train: str = "out_train", evals: tuple[str, str] = ("out_eval", "out_eval2")) -> None:
    """Training mode (dropout > 0) differs from eval mode, and eval mode gives the same output twice.

    ``where`` says where the exercise's dropout acts, as its docstring does ("on the weights, after the
    softmax")."""
    desc = result.cases[case_id].desc
    trained = result.get(case_id, train, what=f"{what} in training mode", kind="tensor", dtype="float", shape=shape)
    first, second = (result.get(case_id, name, what=what, kind="tensor", shape=shape) for name in evals)
    if not np.array_equal(first, second):
        raise Fail(f"in eval mode {what} gave two different outputs for the same input ({desc}): dropout must be "
                   "off in eval mode (use nn.Dropout modules, which follow .train() and .eval()).")
    if np.allclose(trained, first, rtol=1e-6, atol=1e-6):
        raise Fail(f"in training mode with dropout > 0 {what} equals its eval-mode output ({desc}): dropout never "
                   f"acted. Apply it {where}.")


def leak(base: np.ndarray, moved: np.ndarray, message: str, atol: float = 1e-5) -> None:
    """``moved`` is the output after perturbing only what must not matter; any change there is a leak."""
    if np.shape(base) != np.shape(moved) or not np.allclose(base, moved, rtol=1e-5, atol=atol):
        raise Fail(message, kind=LEAKAGE)


def scalar(got, want: float, what: str, desc: str, hint: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """A scalar must agree with the expected one; the message never gives the expected value or the gap."""
    value = float(np.asarray(got, dtype=np.float64))
    if not abs(value - want) <= atol + rtol * abs(want):
        raise Fail(f"{agreeing(what, 'differs', 'differ')} from the expected value on a case with {desc}. "
                   f"{hint}".rstrip())
