"""Trusted side of grading: build each exercise's cases, then judge what the kernel handed back.

An exercise is a class registered with :func:`exercise`. ``cases(rng)`` builds :class:`Case` objects (steps in the
small language of :mod:`decoder_course.harvest`, arrays kept aside); ``judge(result)`` reads the student's outputs
through :class:`Result`, which checks type, dtype, shape and finiteness before any value, and raises :class:`Fail`
with a message that teaches. Reference code runs only here, never in the student's kernel.
"""

from __future__ import annotations

import contextvars
import errno
import io
import json
import math
import os
import re
import stat
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from decoder_course import harvest
from decoder_course.checks import LEAKAGE, NOT_FINITE, SHAPE_OR_DTYPE, WRONG_VALUES, agreeing

REGISTRY: dict[str, dict[str, type[Exercise]]] = {}
MAX_REPORT_BYTES = 4 << 20  # the most of a kernel's JSON report the grader reads
# The most of one exercise's arrays the grader reads: the kernel side refuses to hand in more than
# harvest.MAX_OUTPUT_BYTES of arrays; headers get room of their own.
MAX_OUTPUT_BYTES = harvest.MAX_OUTPUT_BYTES + (16 << 20)
MAX_LEAVES = 50_000  # arrays in one .npz


PASSED_MESSAGE = "all {n} hidden cases passed"  # a passed item's verdict (autograder.pages.feedback reads it back)


# The kinds of failure a verdict records beside its message (autograder.pages.report counts by them): the public checks'
# (decoder_course.checks) and the grader's own. A failure no kind fits is OTHER.
RAISED = "raised"
POLICY = "policy"
TIMED_OUT = "timed out"
NOT_ATTEMPTED = "not attempted"
OTHER = "other check"
KINDS = (NOT_ATTEMPTED, RAISED, SHAPE_OR_DTYPE, WRONG_VALUES, LEAKAGE, NOT_FINITE, POLICY, TIMED_OUT, OTHER)


class Fail(Exception):
    """A hidden check failed; the message is shown to the student and must say which idea broke. ``kind`` (one of
    :data:`KINDS`) and ``mistake`` (the known mistake the values are) travel beside it as data."""

    kind = OTHER

    def __init__(self, *args, kind: str = "", mistake: str = ""):
        super().__init__(*args)
        self.kind, self.mistake = kind or type(self).kind, mistake


class Raised(Fail):
    """The student's code raised where it should have returned: nothing of what it computes can be observed."""

    kind = RAISED


class Unobservable(Raised):
    """Nothing of an item could be seen: on every case its code stopped inside a building block of the student's
    that raised (autograder.course.checks.relative). Not a pass: a cell no check could see earns nothing."""


@dataclass
class Case:
    """One call sequence to run in the kernel, with the inputs kept for the reference."""

    id: str
    desc: str  # shown to the student: sizes and situation, never values
    steps: list[dict] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # trusted side only: anything judge() needs
    # judged relative to the student's building blocks (autograder.course.checks.relative) when the item ``uses`` any;
    # False for a case whose verdict no wrong building block can change (a constructor's ValueError, say)
    relative: bool = True

    def _key(self) -> str:
        return f"{self.id}_a{len(self.arrays)}"

    def array(self, value) -> dict:
        """A NumPy array argument (the kernel gets a fresh copy)."""
        key = self._key()
        self.arrays[key] = np.ascontiguousarray(value)
        return {"array": key}

    def tensor(self, value, requires_grad: bool = False, dtype: str | None = None) -> dict:
        """A torch tensor argument, made from ``value`` (NumPy or torch) in the kernel."""
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        key = self._key()
        self.arrays[key] = np.ascontiguousarray(value)
        spec: dict[str, Any] = {"tensor": key}
        if dtype:
            spec["dtype"] = dtype
        if requires_grad:
            spec["requires_grad"] = True
        return spec

    def call(self, fn: dict | str, *args, let: str | None = None, record: str | None = None, **kwargs) -> None:
        """Call ``fn`` (a global name or a value spec) with value specs or JSON literals."""
        spec = {"global": fn} if isinstance(fn, str) else fn
        step: dict[str, Any] = {"call": spec, "args": list(args), "kwargs": kwargs}
        if let:
            step["let"] = let
        if record:
            step["record"] = record
        self.steps.append(step)

    def method(self, obj: str, name: str, *args, let: str | None = None, record: str | None = None,
               **kwargs) -> None:
        """Call ``obj.name(*args, **kwargs)`` on an object bound earlier with ``let``."""
        self.call({"attr": [obj, name]}, *args, let=let, record=record, **kwargs)

    def load_state(self, obj: str, state: dict[str, Any], lenient: tuple[str, ...] = ()) -> None:
        """Load a state dict (strict) into a bound module: the names are part of the exercise's contract.

        Keys under a ``lenient`` prefix belong to a submodule built from another exercise (whose own cell checks
        its names): they are loaded where that submodule has them.
        """
        step: dict[str, Any] = {"load_state": obj, "state": {k: self.tensor(v) for k, v in state.items()}}
        if lenient:
            step["lenient"] = list(lenient)
        self.steps.append(step)

    def eval(self, obj: str) -> None:
        self.steps.append({"eval": obj})

    def seed(self, value: int) -> None:
        self.steps.append({"seed": int(value)})

    def backward(self, obj: str, weights) -> None:
        self.steps.append({"backward": obj, "weights": self.tensor(weights)})

    def let(self, name: str, value: dict) -> None:
        """Bind a value spec to a name, e.g. an input to record again after the call."""
        self.steps.append({"let": name, "value": value})

    def record(self, name: str, value: dict) -> None:
        self.steps.append({"record": name, "value": value})


def write_cases(folder: Path, item: str, cases: list[Case], forbidden: tuple[str, ...] = ()) -> None:
    """Write ``cases`` for the kernel as JSON plus one ``.npz`` (plain arrays only), with the item's ``forbidden``
    rules, which the harvest's child enforces while they run (:mod:`decoder_course.guard`)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {key: value for case in cases for key, value in case.arrays.items()}
    np.savez(folder / f"{item}.npz", **arrays)
    payload = {"item": item, "cases": [{"id": c.id, "steps": c.steps} for c in cases], "forbidden": list(forbidden)}
    (folder / f"{item}.json").write_text(json.dumps(payload))


# -- reading results --------------------------------------------------------------------------------------------


class Result:
    """What the kernel handed back for one exercise, read without trusting any of it."""

    def __init__(self, folder: Path, item: str, cases: list[Case], outputs: tuple | None = None):
        """``outputs`` is what :func:`read_outputs` returned for ``folder`` and ``item``, when the caller has it."""
        self.item = item
        self.cases = {case.id: case for case in cases}
        try:
            report, self.leaves = outputs if outputs is not None else read_outputs(folder, item)
        except Unreadable as exc:
            raise Fail(f"the grader refused to read what was handed in for this exercise ({exc}): it was not "
                       "written by the course's hidden checks.") from exc
        if report is None or self.leaves is None:
            raise Fail(
                "the hidden checks never ran for this exercise: the cell was not reached (an earlier cell hung, "
                "crashed the kernel or exited), or the test cell was changed."
            )
        try:
            self.report_cases = dict(report["cases"])
            if set(self.leaves) != {f"leaf{i}" for i in range(len(report["leaves"]))}:
                raise ValueError("the report and the arrays do not match")
            self.leaves = {key: self.leaves[f"leaf{i}"] for i, key in enumerate(report["leaves"])}
        except Exception as exc:
            raise Fail(f"the grader could not read this exercise's outputs ({type(exc).__name__}).") from exc

    def _entry(self, case_id: str) -> dict:
        entry = self.report_cases.get(case_id)
        if not isinstance(entry, dict):
            raise Fail(f"no result for the case {self.cases[case_id].desc}: did the cell finish?")
        return entry

    def error(self, case_id: str) -> str | None:
        """The exception the student's code raised on this case, if any."""
        error = self._entry(case_id).get("error")
        return str(error) if error is not None else None

    def recorded(self, case_id: str) -> set[str]:
        """The names this case recorded before it finished or raised: where it raised, what had worked."""
        return set(self._entry(case_id).get("outputs", {}))

    def raise_if_error(self, case_id: str) -> None:
        error = self.error(case_id)
        if error is not None:
            desc = self.cases[case_id].desc
            raise Raised(f"your code raised an exception on a case with {desc}:\n    {error.splitlines()[-1]}")

    def meta(self, case_id: str, name: str) -> dict:
        self.raise_if_error(case_id)
        outputs = self._entry(case_id).get("outputs", {})
        if name not in outputs:
            raise Fail(f"nothing was returned for `{name}` on a case with {self.cases[case_id].desc}.")
        return outputs[name]

    def get(self, case_id: str, name: str, *, what: str, kind: str = "any", dtype: str | None = None,
            shape: tuple | None = None, finite: bool = True) -> np.ndarray:
        """One returned array, after checking its exact type, dtype, shape and finiteness.

        ``kind`` is ``"ndarray"``, ``"tensor"``, ``"array"`` (either) or ``"any"`` (also Python scalars);
        ``dtype`` is ``"bool"``, ``"float"``, ``"int"`` or an exact name such as ``"torch.float16"``.
        """
        desc = self.cases[case_id].desc
        meta = self.meta(case_id, name)
        got_type = meta.get("type", "?")
        allowed_types = {
            "ndarray": {"numpy.ndarray"},
            "tensor": {"torch.Tensor"},
            "array": {"numpy.ndarray", "torch.Tensor"},
            "any": {"numpy.ndarray", "torch.Tensor", "float", "int", "bool"},
        }[kind]
        if got_type not in allowed_types:
            wanted = {"ndarray": "a NumPy array", "tensor": "a torch.Tensor", "array": "an array",
                      "any": "an array or a number"}[kind]
            raise Fail(f"{what} should be {wanted}, but your code returned `{got_type}` ({desc}).", kind=SHAPE_OR_DTYPE)
        key = f"{case_id}/{name}"
        if key not in self.leaves:
            raise Fail(f"{what}: the returned value could not be read ({desc}).")
        array = self.leaves[key]
        if list(array.shape) != list(meta.get("shape", array.shape)):
            raise Fail(f"{what}: the returned value could not be read ({desc}).")
        if dtype is not None:
            _check_dtype(array, meta.get("dtype", ""), dtype, what, desc)
        if shape is not None and tuple(array.shape) != tuple(shape):
            raise Fail(f"{what} should have shape {tuple(shape)}, got {tuple(array.shape)} ({desc}).",
                       kind=SHAPE_OR_DTYPE)
        if finite and array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0].tolist()
            raise Fail(
                f"{agreeing(what, 'contains', 'contain')} NaN or inf (first at index {bad}) on a case with {desc}. "
                f"A fully masked row "
                "or huge scores? Subtract the row max before exp, and give fully masked rows zeros.", kind=NOT_FINITE
            )
        return array


class Unreadable(Exception):
    """A file the kernel handed in is not one the harvest writes (a link, a FIFO, too large, forged): not read."""


def _read_plain(path: Path, limit: int) -> bytearray | None:
    """The bytes of a plain file of at most ``limit`` bytes, read through one descriptor (None if it is missing).

    The kernel may still run and may swap the file at any moment: it is opened once, without following a link or
    blocking on a FIFO, judged by ``fstat`` of that very descriptor, and read from it, so no check can be raced."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP for a link, ENXIO for a socket, ...
        raise Unreadable(f"{path.name} is not a plain file") from exc
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise Unreadable(f"{path.name} is not a plain file")
        if info.st_size > limit:
            raise Unreadable(f"{path.name} is {info.st_size / 2**20:.0f} MB, over the {limit / 2**20:.0f} MB limit")
        data = bytearray(info.st_size)
        view, done = memoryview(data), 0
        while done < len(data):
            got = handle.readinto(view[done:])
            if not got:
                raise Unreadable(f"{path.name} shrank while it was read")
            done += got
    return data


def take_out(handed_in: Path, dest: Path) -> None:
    """Move a file the kernel handed in to ``dest``, out of its reach, as it is: a link or anything but one plain
    file arrives as a link (which :func:`read_outputs` refuses); a plain file arrives with at most one byte more
    than :func:`read_outputs` would read (so one too large is still refused as too large).

    A rename where it can (one file system); else a copy through one descriptor opened without following a link
    or waiting on a FIFO (as root, the outputs are a capped file system of their own: ``autograder.sandbox.launch``).
    Either replaces what ``dest`` held: an item whose building block raised hands its outputs in again, once per
    answer round (``verdicts.answer_rounds``)."""
    try:
        os.replace(handed_in, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    dest.unlink(missing_ok=True)  # the grader's own folder: what is there is the previous round's, as taken out
    try:
        fd = os.open(handed_in, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = -1
    try:
        info = os.fstat(fd) if fd >= 0 else None
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.symlink("not a plain file", dest)
            return
        left = max(MAX_REPORT_BYTES, MAX_OUTPUT_BYTES) + 1
        with open(dest, "xb") as out:
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
    finally:
        if fd >= 0:
            os.close(fd)
        handed_in.unlink(missing_ok=True)


class _Reader(io.RawIOBase):
    """A seekable reader over a buffer, without copying it (zipfile reads the directory through it)."""

    def __init__(self, data: bytearray):
        self._view, self._at = memoryview(data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = max(0, {0: 0, 1: self._at, 2: len(self._view)}[whence] + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer) -> int:
        chunk = self._view[self._at: self._at + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._at += len(chunk)
        return len(chunk)


def _zip_entries(data: bytearray) -> int | None:
    """How many entries a zip's end-of-central-directory record declares (None if there is none, or zip64)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - (1 << 16) - 22))
    if at < 0 or len(data) < at + 22:
        return None
    entries = int.from_bytes(data[at + 10: at + 12], "little")
    return None if entries == 0xFFFF else entries


# The header np.save writes for a plain dtype: its dict literal, padded with spaces, ending in a newline.
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][a-zA-Z]\d{0,3})', 'fortran_order': (True|False), "
                         rb"'shape': \(((?:\d{1,18}, )*\d{0,18},?)\), \} *\n")


def _npy_header(data: bytearray, start: int, end: int) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order, dtype, where the values start) of the ``.npy`` in ``data[start:end]``. A header as
    np.save writes it for a plain dtype is matched whole by :data:`_NPY_HEADER` (numpy's own reader evaluates it
    as a literal: most of the time spent reading a report); any other goes to numpy's reader."""
    major = data[start + 6] if data[start: start + 6] == b"\x93NUMPY" and end - start > 12 else 0
    width = {1: 2, 2: 4, 3: 4}.get(major)
    if width is not None:
        at = start + 8 + width
        size = int.from_bytes(data[start + 8: at], "little")
        match = _NPY_HEADER.fullmatch(bytes(data[at: at + size])) if size <= (1 << 16) and at + size <= end else None
        if match is not None:
            shape = tuple(int(n) for n in match[3].split(b",") if n.strip())
            return shape, match[2] == b"True", np.dtype(match[1].decode("ascii")), at + size
    head = io.BytesIO(bytes(data[start: min(end, start + (1 << 16) + 16)]))
    version = np.lib.format.read_magic(head)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(head)
    return shape, fortran, dtype, start + head.tell()


def _arrays(name: str, data: bytearray, limit: int) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz`` in ``data``, as views into it; :class:`Unreadable` for anything the
    harvest's ``np.savez`` would not write (checked from the zip directory before any array is made)."""
    entries = _zip_entries(data)
    if entries is None or entries > MAX_LEAVES:
        raise Unreadable(f"{name} is not a plain .npz file of at most {MAX_LEAVES} arrays")
    try:
        with zipfile.ZipFile(_Reader(data)) as archive:
            members = archive.infolist()
        if len(members) != entries or sum(m.file_size for m in members) > limit:
            raise Unreadable(f"{name} holds more than {limit / 2**20:.0f} MB")
        arrays = {}
        for member in members:
            if member.compress_type != zipfile.ZIP_STORED or not member.filename.endswith(".npy"):
                raise Unreadable(f"{name} is compressed")
            at = member.header_offset
            if data[at: at + 4] != b"PK\x03\x04":
                raise ValueError("no local header")
            start = at + 30 + int.from_bytes(data[at + 26: at + 28], "little") \
                + int.from_bytes(data[at + 28: at + 30], "little")  # past the name and the extra field
            end = start + member.file_size
            if end > len(data):
                raise ValueError("a member runs past the end")
            shape, fortran, dtype, offset = _npy_header(data, start, end)
            count = math.prod(shape)
            if dtype.hasobject or count * dtype.itemsize > end - offset:
                raise Unreadable(f"{name} holds an array whose header does not match its data")
            values = (np.frombuffer(data, dtype, count, offset) if dtype.itemsize else np.empty(count, dtype))
            arrays[member.filename[: -len(".npy")]] = values.reshape(shape, order="F" if fortran else "C")
        return arrays
    except Unreadable:
        raise
    except Exception as exc:  # not a zip, a broken header: the kernel did not write it with np.savez
        raise Unreadable(f"{name} is not a plain .npz file ({type(exc).__name__})") from exc


def read_outputs(folder: Path, item: str, max_bytes: int = MAX_OUTPUT_BYTES) -> tuple[dict | None, dict | None]:
    """What the kernel handed in for ``item``: (its JSON report, its arrays by name), each None when missing.

    Raises :class:`Unreadable` for a file the harvest would not have written (a link, a FIFO, a hard link, too
    large, too many arrays, a compressed or object array, a header that claims more than its bytes). Each file is
    read once, through one descriptor, and bounded before a byte of it is parsed: a forged file costs no more
    memory than its capped size, and nothing the kernel does meanwhile changes what was judged."""
    raw = _read_plain(folder / f"{item}.json", min(max_bytes, MAX_REPORT_BYTES))
    data = _read_plain(folder / f"{item}.npz", min(max_bytes, MAX_OUTPUT_BYTES))
    report = None
    if raw is not None:
        try:
            report = json.loads(bytes(raw))
            if not isinstance(report, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise Unreadable(f"{item}.json is not a report the harvest writes") from exc
    return report, (None if data is None else _arrays(f"{item}.npz", data, min(max_bytes, MAX_OUTPUT_BYTES)))


def _check_dtype(array: np.ndarray, declared: str, want: str, what: str, desc: str) -> None:
    if want == "bool":
        ok = array.dtype == np.bool_
    elif want == "float":
        ok = array.dtype.kind == "f"
    elif want == "int":
        ok = array.dtype.kind in "iu"
    else:
        ok = declared == want
    if not ok:
        raise Fail(f"{what} should have a {want} dtype, got {declared or array.dtype} ({desc}).", kind=SHAPE_OR_DTYPE)


# -- comparing ----------------------------------------------------------------------------------------------------
def expect_close(got: np.ndarray, want: np.ndarray, what: str, desc: str, hint: str = "",
                 rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Values must agree with the reference; say how far off and where, never what the reference is."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise Fail(f"{what} should have shape {want.shape}, got {got.shape} ({desc}).", kind=SHAPE_OR_DTYPE)
    if got.dtype == np.bool_ or want.dtype == np.bool_:
        wrong = got.astype(bool) != want.astype(bool)
        if wrong.any():
            where = np.argwhere(wrong)[0].tolist()
            raise Fail(f"{agreeing(what, 'is', 'are')} wrong at {int(wrong.sum())} place(s), first at index {where} "
                       f"({desc}). {hint}",
                       kind=WRONG_VALUES)
        return
    close = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    if not close.all():
        where = np.argwhere(~close)[0].tolist()
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        raise Fail(
            f"{agreeing(what, 'differs', 'differ')} from the expected values on a case with {desc}: max abs error "
            f"{err:.3g}, first at index {where}. {hint}".rstrip(), kind=WRONG_VALUES
        )


@dataclass
class Verdict:
    passed: bool
    message: str
    raised: bool = False  # failed because the student's code raised (tests/test_hidden_checks.py's double faults)
    unobservable: bool = False  # not judged: every case stopped inside another item that raised (Unobservable)
    kind: str = ""  # a failure's kind (one of KINDS), as data beside the message; "" when it passed
    mistake: str = ""  # the known mistake (its description in the reference's MISTAKES) the answer was found to be


# The known mistakes named while one item is judged (name_mistake): run_judge records the last with its verdict.
_NAMED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("named_mistakes", default=None)


def name_mistake(description: str) -> None:
    """Note that the item being judged gave a known mistake's values (``description``, its MISTAKES text): the
    verdict carries it as data (:attr:`Verdict.mistake`), beside the message that names it in prose."""
    named = _NAMED.get()
    if named is not None and description:
        named.append(description)


class Exercise:
    """Base class: subclasses set ``cases`` and ``judge``; ``lesson``, ``name`` and ``points`` come from @exercise."""

    lesson: str = ""
    name: str = ""
    points: float = 1.0
    # Calls that would make the exercise trivial: found in the submitted source by the static policy check, and
    # stopped while the hidden cases run (decoder_course.guard).
    forbidden: tuple[str, ...] = ()
    # Other items of the lesson the student's code may call (their functions or classes, by name), and the
    # reference module that defines them: the verdict is made relative to the student's own answers of those
    # (autograder.course.checks.relative), so that a mistake there costs only its own item.
    uses: tuple[str, ...] = ()
    # Calls that pass state on (a beam search's cache.reorder): judged relative to wrong building blocks, the
    # recorded answers cannot show them, so the replay requires the student's code to make each of them too.
    required_calls: tuple[str, ...] = ()
    required_message: str = "a call your code must make, as the exercise's docstring says, was not made"
    reference: Any = None

    def cases(self, rng: np.random.Generator) -> list[Case]:
        raise NotImplementedError

    def judge(self, result: Result) -> None:
        raise NotImplementedError


def each(cases: Iterable[Case], fn: Callable[[Case], None]) -> None:
    for case in cases:
        fn(case)
