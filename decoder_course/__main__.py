"""Run a lesson's checks on your saved notebook, without nbgrader: ``python -m decoder_course check NOTEBOOK``.

The notebook runs top to bottom in a fresh kernel, in its own folder, the way the grader will run it; then every
graded exercise gets one line: ``✓ name`` when its visible checks pass, ``✗ name: what broke`` (the check's own
message), ``✗ name: not implemented yet``, or, for a find-the-bug exercise whose cell is still the given code,
``✗ name: bug not fixed yet``. The exit status is 0 only when every exercise passes.

Only the visible checks run here: they are the ones under each exercise in the notebook. Grading adds hidden checks
on other inputs, so a ✓ here is necessary, not sufficient. Your file is read, never written.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoder_course.text import shown

DEFAULT_TIMEOUT = 300  # seconds per cell: every lesson's training cell caps itself well below (about a minute)
HARVEST_ENV = "DECODER_COURSE_HARVEST"  # set only during a grading run (decoder_course.harvest)
NOT_IMPLEMENTED = "is not implemented yet"  # how decoder_course.checks words an unwritten exercise


@dataclass(frozen=True)
class Verdict:
    """What the visible checks of one graded exercise said."""

    name: str  # the exercise (nbgrader's grade_id)
    passed: bool
    message: str = ""  # why it failed, in the check's own words; empty when it passed
    not_implemented: bool = False
    checks_passed: int = 0  # how many "✓" lines its cell printed
    bug_to_find: bool = False  # a find-the-bug exercise whose cell still holds the given (buggy) code


def _text_of(cell: Any) -> str:
    """Everything a code cell printed on stdout (its stream outputs)."""
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream"
                   and out.get("name") == "stdout")


def _error_of(cell: Any) -> tuple[str, str] | None:
    """``(ename, evalue)`` of the error a code cell raised, or None."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", "Error"), out.get("evalue", "")
    return None


def _is_not_implemented(ename: str, evalue: str) -> bool:
    return ename == "NotImplementedError" or (ename == "CheckFailed" and NOT_IMPLEMENTED in evalue)


def as_released(cell: Any) -> bool:
    """Whether a solution cell still holds what the release put there: the checksum the release recorded in its
    metadata is the cell's own, computed as nbgrader computes it (``nbgrader.utils.compute_checksum``, for a
    solution cell: source, type, the roles grade/solution/locked and the cell's id; the course's tests hold the two
    to each other). Anything typed into the cell changes it."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if not meta.get("solution") or meta.get("grade") or "checksum" not in meta:
        return False
    digest = hashlib.md5()  # noqa: S324 - nbgrader's checksum, not a security measure
    for part in (cell.get("source", ""), cell.get("cell_type", ""), "False", "True", "False", meta.get("grade_id", "")):
        digest.update(str(part).encode("utf-8"))
    return digest.hexdigest() == meta["checksum"]


def bugs_to_find(nb: Any) -> set[str]:
    """The find-the-bug exercises whose cell is still as released: a solution cell that came with code (not
    nbgrader's ``raise NotImplementedError()``) and has not been touched."""
    return {cell.metadata["nbgrader"]["grade_id"].removesuffix("_solution") for cell in nb.cells
            if cell.cell_type == "code" and as_released(cell) and "raise NotImplementedError()" not in cell.source}


def graded_cells(nb: Any) -> list[tuple[int, Any]]:
    """``(index, cell)`` of every graded test cell: nbgrader metadata with ``grade: true`` on a code cell."""
    return [(i, cell) for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("grade")]


def cell_name(nb: Any, index: int) -> str:
    """A code cell as JupyterLab shows it: ``cell [7]`` by its execution count, which JupyterLab prints beside it,
    or "the 7th code cell" when it never ran; never an index that counts markdown cells too."""
    cell = nb.cells[index]
    if cell.get("execution_count") is not None:
        return f"cell [{cell['execution_count']}]"
    nth = sum(c.cell_type == "code" for c in nb.cells[:index + 1])
    suffix = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    return f"the {nth}{suffix} code cell"


def _timed_out(timeout: int | None) -> str:
    """What a cell interrupted by this command was: it hit the per-cell time limit (the only interrupt we send)."""
    limit = f"the time limit of {timeout} s a cell" if timeout else "the time limit a cell has"
    return f"hit {limit} and was stopped (an endless loop? or a slow machine: --timeout gives more)"


def verdict_of(cell: Any, bugs: set[str] = frozenset(), timeout: int | None = None) -> Verdict:
    """The verdict of one executed graded cell, from its outputs only; ``bugs``: the find-the-bug exercises not
    started yet (:func:`bugs_to_find`), whose failure is where the exercise begins; ``timeout``: the per-cell limit
    it ran under, to name it when the cell was stopped."""
    name = cell.metadata["nbgrader"].get("grade_id", "?")
    verdict = _verdict_of(cell, name, timeout)
    if name in bugs and not verdict.passed and not verdict.not_implemented:
        return Verdict(name, False, f"bug not fixed yet (find the bug: the cell above holds the given code with one "
                       f"mistake; its check says: {verdict.message})", checks_passed=verdict.checks_passed,
                       bug_to_find=True)
    return verdict


def _verdict_of(cell: Any, name: str, timeout: int | None) -> Verdict:
    passed = sum(line.startswith("✓") for line in _text_of(cell).splitlines())
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return Verdict(name, False, "did not run (the kernel stopped before this cell; see the notes below)")
    error = _error_of(cell)
    if error is None:
        return Verdict(name, True, checks_passed=passed)
    ename, evalue = error
    if _is_not_implemented(ename, evalue):
        return Verdict(name, False, "not implemented yet", not_implemented=True, checks_passed=passed)
    if ename == "CheckFailed":
        # The check's message already says which idea broke: "✗ <title>: <why>".
        return Verdict(name, False, evalue.removeprefix("✗").strip(), checks_passed=passed)
    if ename == "NameError":
        hint = " (run the cell that defines it; did you rename it?)"
        return Verdict(name, False, f"{evalue}{hint}", checks_passed=passed)
    if ename == "KeyboardInterrupt":
        return Verdict(name, False, _timed_out(timeout), checks_passed=passed)
    return Verdict(name, False, f"raised {ename}: {evalue.strip()}", checks_passed=passed)


def notes_on_other_cells(nb: Any, timeout: int | None = None) -> list[str]:
    """Errors in cells that are not graded (your exercise cells, plots), except "not implemented yet"; a cell this
    command stopped is said to have hit the time limit, and the names it never defined are why later cells fail."""
    notes = []
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or meta.get("grade"):
            continue
        error = _error_of(cell)
        if error is None or _is_not_implemented(*error):
            continue
        where = f"your cell for {meta['grade_id'].removesuffix('_solution')}" if meta.get("solution") \
            else cell_name(nb, i)
        if error[0] == "KeyboardInterrupt":
            notes.append(f"{where} {_timed_out(timeout)}; what it had not yet defined is missing in the cells "
                         "after it (a NameError there comes from this)")
            continue
        first_line = shown((error[1].splitlines() or [""])[0][:200])
        notes.append(f"{where} raised {error[0]}: {first_line}")
    return notes


def execute(path: Path, timeout: int = DEFAULT_TIMEOUT, kernel_name: str | None = None) -> tuple[Any, str]:
    """Run the notebook at ``path`` top to bottom in a fresh kernel; return it executed and a note if it stopped.

    Every cell runs even when an earlier one raised (as nbgrader does); a cell over ``timeout`` seconds is
    interrupted. The file itself is not written.
    """
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import DeadKernelError
    except ImportError as exc:  # JupyterLab brings both; a bare Python may not
        raise SystemExit(f"error: {exc.name} is needed to run a notebook: pip install nbclient nbformat") from None
    nb = nbformat.read(path, as_version=4)
    # The kernel the notebook asks for (the course's is "python3"); a grading run's variable never leaks in.
    name = kernel_name or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    env = {key: value for key, value in os.environ.items() if key != HARVEST_ENV}
    client = NotebookClient(nb, timeout=timeout, kernel_name=name, allow_errors=True, interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(path.parent)}},
                            # the kernel's start-up warnings ("running over TCP without encryption") are noise here
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])
    stopped = ""
    # The kernel process's own stderr (not a cell's output, which comes back in the notebook) holds only the
    # kernel's machinery: a shutdown race in ipykernel can log a traceback there after every cell has run. It is
    # kept aside and shown only when the kernel died, where its last lines say why.
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as kernel_stderr:
        try:
            client.execute(env=env, stderr=kernel_stderr)
        except DeadKernelError as exc:
            kernel_stderr.seek(0)
            last = [line for line in kernel_stderr.read()[-4000:].splitlines() if line.strip()][-3:]
            stopped = f"the kernel died ({exc}): out of memory, or a crash in native code" + "".join(
                f"\n      kernel: {shown(line[:200])}" for line in last)
    return nb, stopped


def report(verdicts: list[Verdict], notes: list[str]) -> str:
    """The lines printed for the student: one per exercise, notes, then a summary."""
    lines = []
    for v in verdicts:
        lines.append(f"✓ {v.name}" if v.passed else f"✗ {v.name}: {v.message}")
    if notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in notes]
    passed = sum(v.passed for v in verdicts)
    todo = sum(v.not_implemented for v in verdicts)
    bugs = sum(v.bug_to_find for v in verdicts)
    summary = f"{passed}/{len(verdicts)} exercises pass their visible checks"
    if passed < len(verdicts):
        wrong = len(verdicts) - passed - todo - bugs
        parts = ([f"{wrong} to fix"] if wrong else []) + ([f"{todo} not implemented yet"] if todo else []) + (
            [f"{bugs} bug{'s' if bugs > 1 else ''} to find"] if bugs else [])
        summary += f" ({', '.join(parts)}); fix the first ✗, save, and run this again"
    else:
        summary += "; grading adds hidden checks on other inputs"
    return "\n".join(lines + ["", summary])


def check(path: Path, timeout: int = DEFAULT_TIMEOUT, kernel_name: str | None = None) -> int:
    """Run ``path`` and print one line per graded exercise; 0 when all pass, 1 otherwise, 2 when unusable."""
    if not path.is_file():
        print(f"error: {path} is not a file", file=sys.stderr)
        return 2
    print(f"running {path} in a fresh kernel (at most {timeout} s a cell)...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        nb, stopped = execute(path, timeout, kernel_name)
    except (ValueError, OSError) as exc:  # not JSON, not a notebook, unreadable
        print(f"error: cannot run {path}: {exc}", file=sys.stderr)
        return 2
    bugs = bugs_to_find(nb)
    verdicts = [verdict_of(cell, bugs, timeout) for _, cell in graded_cells(nb)]
    if not verdicts:
        print(f"error: {path} has no graded exercise (is it a lesson notebook of this course?)", file=sys.stderr)
        return 2
    notes = ([stopped] if stopped else []) + notes_on_other_cells(nb, timeout)
    print(report(verdicts, notes))
    print(f"(ran in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0 if all(v.passed for v in verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decoder_course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="run a lesson notebook and report each exercise's visible checks",
                             description="Run NOTEBOOK top to bottom in a fresh kernel and report, per graded "
                                         "exercise, whether its visible checks pass.")
    p_check.add_argument("notebook", type=Path, help="a lesson notebook, e.g. lessons/01-masks/01-masks.ipynb")
    p_check.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT,
                         help=f"seconds a cell may run before it is interrupted (default {DEFAULT_TIMEOUT})")
    p_check.add_argument("--kernel", default=None,
                         help="Jupyter kernel name (default: the notebook's own, normally python3)")
    args = parser.parse_args(argv)
    # ✓ and ✗ on a console that is not UTF-8 (an old Windows code page) must not crash the report.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    return check(args.notebook, args.timeout, args.kernel)


if __name__ == "__main__":
    sys.exit(main())
