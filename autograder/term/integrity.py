"""Lesson integrity: a release made during a term holds no graded answer of a lesson that is still open.

Later lessons build on earlier ones: lesson 05's decoder layer needs lesson 03's ``MultiHeadAttention``. The
solution notebooks show those blocks as given code (``# %% given=multi_head:...`` cells,
:mod:`autograder.course.notebooks`), which is right for the self-study edition and wrong during a term: a student could
copy lesson 03's answers out of lesson 05 while lesson 03 still earns points (before its due date, or late, or
with an extension). So, with a term (:mod:`autograder.term.schedule`), a release made at a moment ``at``:

- **withholds** each given name that is a graded answer (an exercise) of a lesson of the term not closed at
  ``at`` (:meth:`autograder.term.schedule.Term.closes`: the latest due date with extensions, the grace and the late
  cutoff), and each helper that is such an answer in another form (a reference module's ``PORTS``: lesson 03's
  ``attention`` is lesson 02's, ported to PyTorch). The cell shows a stand-in instead (:func:`stand_in`): it runs
  the student's own code from their notebook of that lesson (:func:`decoder_course.earlier.use_your_own`), and
  asks them to port their own where the block changes form. The rest of the cell (helpers that are nobody's
  answer) is shown as before;
- **refuses** (:func:`check_release`) a release in which any cell still holds a line of such an answer, naming
  the notebook and the cell: whatever put it there (a hand-edited source, a demonstration cell), it is not
  handed out.

Grading is unchanged by any of this: a given cell is locked (nbgrader's ``locked``), so ``OverwriteCells`` puts
the course's code back before the notebook runs, and a slip in lesson 03 costs nothing in lesson 05. That code
then runs in the student's kernel, which could print it into its own output: the feedback of a lesson whose given
cells hold answers of a lesson still open is therefore held until that lesson closes (:class:`HoldWhileOpen`, in
``./course grade`` and in nbgrader's own ``generate_feedback``).

A lesson not in the term is not graded this term: its answers are not withheld. Without a term (the self-study
edition) nothing is withheld and nothing is held.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import os
import tempfile
import textwrap
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from autograder.course import lessons as lessons_registry
from autograder.course import notebooks
from autograder.term import schedule as term_module
from autograder.term.edition import SOLUTION_BLOCK, _distinctive
from autograder.term.schedule import Term, shown_time

__all__ = ["FeedbackHeld", "HoldWhileOpen", "Withheld", "WithholdOpenAnswers", "answers_shown", "check_release",
           "extensions_after_answers", "feedback_held_until", "handed_out", "handed_out_in", "ledger_of",
           "record_handed_out", "stand_in", "submitted_after_answers", "withheld"]

LESSON_OF_MODULE = {module: lesson for lesson, module in notebooks.REFERENCE_MODULES.items()}
MAX_NOTEBOOK_BYTES = 64 << 20  # a released notebook the check reads (the instructor's own output)


@dataclass(frozen=True)
class Withheld:
    """A given name held back from a release: ``name`` of reference ``module`` is the answer of ``of``; ``port``
    when it is that answer in another form (the student ports their own instead of loading it)."""

    module: str
    name: str
    of: str
    port: bool = False


def ports(module: str) -> dict[str, str]:
    """A reference module's ``PORTS``: given helper -> the lesson whose graded answer it is, in another form."""
    return dict(getattr(importlib.import_module(f"autograder.course.reference.{module}"), "PORTS", {}))


def answers(lesson: str, names: list[str]) -> list[Withheld]:
    """The names of a ``given=`` cell of ``lesson`` that are another lesson's graded answer (or a port of one)."""
    found = []
    for module, name in notebooks.given_names(lesson, names):
        owner = LESSON_OF_MODULE[module]
        if owner != lesson and name in lessons_registry.exercises(owner):
            found.append(Withheld(module, name, owner))
        elif name in ports(module) and ports(module)[name] != lesson:
            found.append(Withheld(module, name, ports(module)[name], port=True))
    return found


def protected(term: Term | None, lesson: str, at: datetime) -> bool:
    """Whether ``lesson``'s answers must stay out of a release made at ``at``: it is in the term and not closed."""
    return term is not None and term.scheduled(lesson) and not term.is_closed(lesson, at)


def withheld(term: Term | None, at: datetime, lesson: str, names: list[str]) -> list[Withheld]:
    """What of a ``given=`` cell of ``lesson`` a release made at ``at`` holds back."""
    return [w for w in answers(lesson, names) if protected(term, w.of, at)]


def _definition(module: str, name: str) -> tuple[list[str], int]:
    """A reference definition's source lines, and how many of them are its head: the signature and docstring."""
    source = textwrap.dedent(inspect.getsource(notebooks.reference_object(LESSON_OF_MODULE[module],
                                                                           f"{module}:{name}")))
    node = ast.parse(source).body[0]
    first = node.body[0]
    has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return source.splitlines(), first.end_lineno if has_docstring else first.lineno - 1


def _signature_stub(module: str, name: str, of: str, closes: datetime | None) -> str:
    """A port's stand-in: its signature and docstring, and a body that says what to write."""
    lines, head = _definition(module, name)
    return ("\n".join(lines[:head]) + f"\n    # YOUR CODE HERE (not graded): your own answer of lesson {of}, written "
            f"for this signature. The course's\n    # version appears here once lesson {of} closes "
            f"({shown_time(closes)}).\n    raise NotImplementedError(\"port your own answer of lesson {of} here\")")


def stand_in(term: Term | None, lesson: str, names: list[str], held: list[Withheld]) -> str:
    """The source a release shows for a ``given=`` cell of ``lesson`` with ``held`` names withheld."""
    by_lesson: dict[str, list[Withheld]] = {}
    for w in held:
        by_lesson.setdefault(w.of, []).append(w)
    held_names = {(w.module, w.name) for w in held}
    parts = []
    for of, items in by_lesson.items():
        closes = term.closes(of) if term else None
        loaded = [w.name for w in items if not w.port]
        ported = [w for w in items if w.port]
        text = (f"Given once lesson {of} closes ({shown_time(closes)}): it is still open, so this release does not "
                "show its answers.")
        if loaded:
            text += (f" Until then this cell runs YOUR OWN {', '.join(loaded)} from your notebook of lesson {of} "
                     f"(../{of}/{of}.ipynb beside this lesson's folder; in Colab, upload {of}.ipynb next to this "
                     f"notebook). Grading runs the course's versions here, so a slip there costs nothing here.")
        if ported:
            text += (f" {', '.join(w.name for w in ported)} is lesson {of}'s answer written for this lesson: port "
                     "your own answer into it below (not graded: grading runs the course's version here).")
        lines = [textwrap.fill(text, 110, initial_indent="# ", subsequent_indent="# ")]
        if loaded:
            lines += ["from decoder_course.earlier import use_your_own", "",
                      f"use_your_own({of!r}, {loaded!r}, globals())"]
        parts.append("\n".join(lines))
        parts += [_signature_stub(w.module, w.name, of, closes) for w in ported]
    rest = [reference for module, name in notebooks.given_names(lesson, names) if (module, name) not in held_names
            for reference in [notebooks.reference_source(lesson, f"{module}:{name}", keep_markers=False).rstrip()]]
    if rest:
        parts.append("# Given: helpers that are no lesson's graded answer.\n\n" + "\n\n".join(rest))
    return "\n\n\n".join(parts) + "\n"


def as_of_moment(text: str) -> datetime:
    """A release's moment from its ISO 8601 text (``WithholdOpenAnswers.as_of``); now when empty."""
    if not text:
        return term_module.now()
    try:
        return term_module.as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"as_of {text!r} is not a time: write 2027-01-25T09:00:00+01:00") from None


class WithholdOpenAnswers(NbGraderPreprocessor):
    """``generate_assignment``'s step (after ``SaveCells``): each given cell with an answer of a lesson
    still open at ``as_of`` shows its stand-in (:func:`stand_in`). Before this step nbgrader saved the course's
    code of the cell in the gradebook, which grading puts back (the cell is locked); the checksum computed after
    it is the stand-in's, so ``nbgrader validate`` sees an untouched cell as untouched."""

    as_of = Unicode("", help="The moment the release is made, ISO 8601 (default: now)").tag(config=True)

    def preprocess(self, nb, resources):
        self._term = term_module.from_config(self)
        self._at = as_of_moment(self.as_of)
        self._lesson = resources["nbgrader"]["assignment"]
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        names = cell.get("metadata", {}).get("course", {}).get("given")
        if self._term is None or cell.cell_type != "code" or not names:
            return cell, resources
        held = withheld(self._term, self._at, self._lesson, list(names))
        if held:
            cell.source = stand_in(self._term, self._lesson, list(names), held)
            cell.metadata.course["withheld"] = sorted({w.of for w in held})
            # a port is the student's to write: the cell must be editable (grading puts the course's code back)
            cell.metadata["editable"] = any(w.port for w in held)
        return cell, resources


# -- the release check ---------------------------------------------------------------------------------------------
def _body_lines(module: str, name: str) -> set[str]:
    """A port's distinctive lines, its signature and docstring left out (its stand-in shows those)."""
    lines, head = _definition(module, name)
    return _distinctive(lines[head:])


def _own_lines(lesson: str) -> dict[str, str]:
    """Distinctive line -> what it is, of each graded answer of ``lesson`` and of each port of one."""
    found: dict[str, str] = {}
    for name in lessons_registry.exercises(lesson):
        source = textwrap.dedent(inspect.getsource(notebooks.reference_object(lesson, name)))
        for block in SOLUTION_BLOCK.findall(source):
            for line in _distinctive(block.splitlines()):
                found.setdefault(line, name)
    for other in notebooks.REFERENCE_MODULES.values():
        for name, of in ports(other).items():
            if of == lesson:
                for line in _body_lines(other, name):
                    found.setdefault(line, f"{name} (a port of its answer)")
    return found


def _helper_lines() -> set[str]:
    """Lines of every given helper that is nobody's answer: the course shows them on purpose, in any release."""
    lines: set[str] = set()
    for lesson, module in notebooks.REFERENCE_MODULES.items():
        for name in lessons_registry.given(lesson):
            if name not in ports(module):
                lines |= _distinctive(notebooks.reference_source(lesson, name, keep_markers=False).splitlines())
    return lines


def fingerprints() -> dict[str, dict[str, str]]:
    """lesson -> {distinctive line -> what it is}: the lines of its graded answers (and ports of them) that a
    release made before it closes must not hold. A line two lessons' answers share counts for the earlier one
    (it is shown once that one closes), and a line of a helper the course shows on purpose counts for none."""
    shown, prints = _helper_lines(), {}
    for lesson in lessons_registry.ids():
        prints[lesson] = {line: what for line, what in _own_lines(lesson).items() if line not in shown}
        shown |= set(prints[lesson])
    return prints


def check_release(folder: Path, lessons: list[str], term: Term | None, at: datetime) -> list[str]:
    """Every cell of the released notebooks in ``folder`` that holds a line of a graded answer of a lesson of
    ``term`` still open at ``at``, as a message naming the notebook, the cell and the lesson; [] when none.
    Without a term, nothing is checked (the self-study edition shows earlier answers on purpose)."""
    if term is None:
        return []
    open_lessons = [other for other in lessons_registry.ids() if protected(term, other, at)]
    prints = fingerprints()
    problems = []
    for lesson in lessons:
        for path in sorted((Path(folder) / lesson).glob("*.ipynb")):
            if path.stat().st_size > MAX_NOTEBOOK_BYTES:
                problems.append(f"{path}: over {MAX_NOTEBOOK_BYTES >> 20} MB, not checked: not released")
                continue
            cells = json.loads(path.read_text()).get("cells", [])
            for index, cell in enumerate(cells):
                source = cell.get("source", "")
                source = "".join(source) if isinstance(source, list) else str(source)
                lines = _distinctive(source.splitlines())
                for other in open_lessons:
                    if other == lesson:
                        continue
                    hits = sorted(line for line in lines if line in prints[other])
                    if hits:
                        what = sorted({prints[other][line] for line in hits})
                        given = cell.get("metadata", {}).get("course", {}).get("given")
                        label = f"given={','.join(given)}" if given else (source.strip().splitlines() or [""])[0][:60]
                        problems.append(
                            f"{path.name}, cell {index} ({label}): holds {', '.join(what)}, a graded answer of "
                            f"{other}, which closes {shown_time(term.closes(other), term.zone)} "
                            f"(line: {hits[0]!r}). Release "
                            f"{lesson} after then, or show that block as a given= cell (a stand-in until it closes)")
    return problems


def schedule(term: Term, at: datetime, ledger: Path | None = None) -> str:
    """The term as a markdown table: each lesson's release, due and closing dates, its extensions, whether its
    answers are withheld from a release made at ``at``, and when a release first showed them (``ledger``); then a
    warning for each extension that came too late (:func:`extensions_after_answers`)."""
    out = handed_out_in(term, ledger)
    rows = ["| lesson | release | due | extensions | closes | answers in a release now | answers first out |",
            "|---|---|---|---|---|---|---|"]
    for lesson in lessons_registry.ids():
        if not term.scheduled(lesson):
            continue
        extended = ", ".join(f"{student} {shown_time(by_lesson[lesson], term.zone)}" for student, by_lesson in
                             sorted(term.extensions.items()) if lesson in by_lesson)
        state = "withheld (open)" if protected(term, lesson, at) else "shown (closed)"
        first = f"{shown_time(out[lesson][0], term.zone)} ({out[lesson][1]})" if lesson in out else ""
        rows.append(f"| {lesson} | {shown_time(term.release(lesson), term.zone)} | "
                    f"{shown_time(term.due(lesson), term.zone)} | "
                    f"{extended} | {shown_time(term.closes(lesson), term.zone)} | {state} | {first} |")
    warnings = [f"warning: {text}" for text in (extensions_after_answers(term, ledger) if ledger is not None else [])]
    tail = f"\n\nlate policy: {term.late.describe()}\nnow: {shown_time(at, term.zone)}"
    return "\n".join(rows + ([""] + warnings if warnings else [])) + tail


# -- what went out ---------------------------------------------------------------------------------------------------
HANDED_OUT = "handed-out.json"  # beside the term's release folder: .grading/handed-out.json by default
MAX_LEDGER_BYTES = 1 << 20


def ledger_of(release_folder: Path) -> Path:
    """Where the record of what releases into ``release_folder`` handed out is kept: beside that folder (nbgrader's
    ``release_assignment`` hands out the lessons' folders in it, never this file)."""
    return Path(release_folder).parent / HANDED_OUT


def answers_shown(term: Term, lesson: str, at: datetime) -> list[str]:
    """The lessons of ``term`` whose graded answers a release of ``lesson`` made at ``at`` shows as given code."""
    shown = {w.of for names in _given_cells(lesson) for w in answers(lesson, list(names))
             if term.scheduled(w.of) and not protected(term, w.of, at)}
    return [other for other in lessons_registry.ids() if other in shown]


def handed_out(ledger: Path) -> dict[str, tuple[datetime, str]]:
    """lesson -> (when its answers first went out, in which release), as :func:`record_handed_out` kept them;
    {} when nothing was recorded. A ledger that cannot be read is an error that says what to do."""
    try:
        with open(ledger, "rb") as handle:
            raw = handle.read(MAX_LEDGER_BYTES + 1)
    except FileNotFoundError:
        return {}
    try:
        if len(raw) > MAX_LEDGER_BYTES:
            raise ValueError(f"over {MAX_LEDGER_BYTES >> 10} kB")
        return {lesson: (term_module.as_utc(datetime.fromisoformat(entry["at"])), str(entry["by"]))
                for lesson, entry in json.loads(raw).items() if lesson in lessons_registry.ids()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise term_module.TermError(f"{ledger} (when each lesson's answers went out) cannot be read ({exc}): restore "
                                    "it from a backup, or delete it to start the record again") from None


def handed_out_in(term: Term, ledger: Path | None) -> dict[str, tuple[datetime, str]]:
    """:func:`handed_out` for the lessons of ``term``, without an entry dated before its lesson's release date (an
    earlier term's); {} without a ledger."""
    if ledger is None:
        return {}
    return {lesson: entry for lesson, entry in handed_out(ledger).items()
            if term.scheduled(lesson) and entry[0] >= term.release(lesson)}


def record_handed_out(ledger: Path, term: Term | None, lessons: list[str], at: datetime,
                      how: str = "the release of") -> dict[str, str]:
    """Keep, for each lesson whose answers a release of ``lessons`` made at ``at`` shows (or their feedback pages,
    ``how="the feedback of"``: the same given cells), the first such moment (an extension granted after it comes
    too late: :func:`extensions_after_answers`). Returns what it added."""
    if term is None:
        return {}
    kept = handed_out(ledger)
    added = {}
    for lesson in lessons:
        for other in answers_shown(term, lesson, at):
            if other not in kept or at < kept[other][0]:
                kept[other] = (term_module.as_utc(at), f"{how} {lesson}")
                added[other] = kept[other][1]
    if added:
        text = json.dumps({lesson: {"at": when.isoformat(), "by": by} for lesson, (when, by) in sorted(kept.items())},
                          indent=1)
        # a whole file or none: written beside it, then renamed over it (two writers never share a partial file)
        with tempfile.NamedTemporaryFile("w", dir=Path(ledger).parent, prefix=f".{HANDED_OUT}.",
                                         delete=False) as partial:
            partial.write(text + "\n")
        os.replace(partial.name, ledger)
    return added


def extensions_after_answers(term: Term, ledger: Path) -> list[str]:
    """Each extension of ``term`` that lets a student earn points on a lesson after its answers went out (the
    ledger), as a warning that says what to do; [] when none (:func:`handed_out_in`: this term's entries)."""
    out = handed_out_in(term, ledger)
    warnings = []
    for student, by_lesson in sorted(term.extensions.items()):
        for lesson in sorted(by_lesson):
            if lesson not in out:
                continue
            when, by = out[lesson]
            if term.due(lesson, student) + term.late.grace + term.late.cutoff > when:
                due = shown_time(term.due(lesson, student), term.zone)
                warnings.append(
                    f"{student}'s extension of {lesson} (due {due}) lets them earn points after "
                    f"{lesson}'s answers went out ({by}, {shown_time(when, term.zone)}): they may have seen them. "
                    "Shorten it "
                    f"so that, with the grace and the cutoff, it ends by then, or grade {student}'s {lesson} by "
                    f"other means; until it ends, a new release shows stand-ins for {lesson} again")
    return warnings


def submitted_after_answers(out: dict[str, tuple[datetime, str]], lesson: str,
                            submitted: datetime | None) -> str:
    """A note for a submission of ``lesson`` made after its answers went out (``out``: :func:`handed_out_in`), which
    only a late extension allows; '' otherwise."""
    if submitted is None or lesson not in out or submitted <= out[lesson][0]:
        return ""
    when, by = out[lesson]
    return (f"submitted {shown_time(submitted)}, after {lesson}'s answers went out ({by}, {shown_time(when)}): "
            "check that this work is the student's own")


# -- feedback ------------------------------------------------------------------------------------------------------
class FeedbackHeld(RuntimeError):
    """Feedback that must wait: the notebook ran answers of a lesson still open."""


def feedback_held_until(term: Term | None, lesson: str, at: datetime) -> datetime | None:
    """When the feedback of ``lesson`` may go out, if not at ``at``: its grading ran the course's code of every
    given cell, so it holds the answers of those lessons, and waits until the last of them closes. None when
    nothing holds it back."""
    if term is None:
        return None
    closing = [term.closes(w.of) for names in _given_cells(lesson) for w in withheld(term, at, lesson, list(names))]
    return max(closing, default=None)


@functools.cache
def _given_cells(lesson: str) -> tuple[tuple[str, ...], ...]:
    """The names of each given cell of ``lesson``'s solution notebook, in order."""
    nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    return tuple(tuple(cell.metadata.course["given"]) for cell in nb.cells
                 if cell.cell_type == "code" and "given" in cell.get("metadata", {}).get("course", {}))


def ledger_from_config(parent) -> Path | None:
    """The record nbgrader's own tools add to (``c.HandedOutFile.file``, which
    :func:`autograder.grading.pipeline.tools_config` sets beside the term's release): their Generate writes what
    students
    get, and their feedback pages go to students. None elsewhere: ``./course release`` and ``./course grade`` record
    themselves, and the trees ``./course grade`` generates for its gradebook are handed to no one."""
    from traitlets.config import Configurable

    class HandedOutFile(Configurable):
        file = Unicode("", help="the record of when each lesson's answers went out ('': none)").tag(config=True)

    file = HandedOutFile(parent=parent).file
    return Path(file) if file else None


class HoldWhileOpen(NbGraderPreprocessor):
    """``generate_feedback``'s first step: no feedback page while :func:`feedback_held_until` holds it back, in
    ``./course grade`` and in nbgrader's own tools alike. In nbgrader's own tools (:func:`ledger_from_config`), a
    page written records the answers it shows (:func:`record_handed_out`); ``./course grade`` records its pages
    itself, where they land."""

    def preprocess(self, nb, resources):
        lesson = resources["nbgrader"]["assignment"]
        term, at = term_module.from_config(self), term_module.now()
        until = feedback_held_until(term, lesson, at)
        if until is not None:
            raise FeedbackHeld(f"feedback for {lesson} is held until {shown_time(until, term.zone)}: its grading "
                               "ran the "
                               "course's code of an earlier lesson still open, which the student's code could "
                               "have printed; generate it again after then")
        ledger = ledger_from_config(self)
        if ledger is not None:
            record_handed_out(ledger, term, [lesson], at, "the feedback of")
        return nb, resources
