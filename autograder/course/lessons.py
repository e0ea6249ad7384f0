"""The lesson registry: a lesson goes by one name, its id, and every module of it is named after that id.

=================  ====================================================
``03-multi-head``  the id: ``solutions/03-multi-head.py``, ``lessons/03-multi-head/``
``multi_head``     its slug: the id without its number, as a Python name
reference          ``autograder.course.reference.multi_head`` (the code the student writes, the given code, and the
                   known mistakes: ``MISTAKES``, patches of that code)
visible            ``decoder_course.visible.l03_multi_head`` (the checks under each exercise, public: its
                   ``SPECS`` are the hidden checks too)
checks             ``autograder.course.checks.l03_multi_head`` (optional: hidden checks written as ``Exercise`` classes)
mutants            ``autograder.course.mutants.m03_multi_head`` (optional: wrong answers of another structure than a
patch)
=================  ====================================================

A lesson exists when its percent source ``solutions/<id>.py`` does. Its exercises are the definitions of its
reference module that mark a part for the student (``### BEGIN SOLUTION``), in the module's order; the other
definitions are given code. Adding a lesson or an exercise is adding its files and definitions: no list names them.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"


def ids() -> list[str]:
    """Every lesson id, in order: the stems of ``solutions/NN-name.py``."""
    return sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]-*.py"))


def slug(lesson: str) -> str:
    """``"03-multi-head"`` → ``"multi_head"``; a ValueError for a malformed id."""
    number, sep, name = lesson.partition("-")
    if not (sep and len(number) == 2 and number.isdigit() and name):
        raise ValueError(f"a lesson id is NN-name (like 03-multi-head), not {lesson!r}")
    return name.replace("-", "_")


def module_name(lesson: str, kind: str) -> str:
    """The dotted name of one of the lesson's modules: kind is reference, checks, visible or mutants."""
    number, name = lesson[:2], slug(lesson)
    names = {"reference": f"autograder.course.reference.{name}",
             "checks": f"autograder.course.checks.l{number}_{name}",
             "visible": f"decoder_course.visible.l{number}_{name}",
             "mutants": f"autograder.course.mutants.m{number}_{name}"}
    if kind not in names:
        raise ValueError(f"kind is one of {', '.join(names)}, not {kind!r}")
    return names[kind]


def module(lesson: str, kind: str) -> ModuleType:
    """One of the lesson's modules, imported; a KeyError naming the known lessons for an unknown id."""
    if lesson not in ids():
        raise KeyError(f"unknown lesson {lesson!r}; known: {', '.join(ids())}")
    return importlib.import_module(module_name(lesson, kind))


def path(lesson: str, kind: str) -> Path:
    """The file of one of the lesson's modules."""
    return ROOT.joinpath(*module_name(lesson, kind).split(".")).with_suffix(".py")


OPTIONAL = ("checks", "mutants")  # a lesson whose exercises are all specs, and whose mistakes are all patches, has none


def optional_module(lesson: str, kind: str) -> ModuleType | None:
    """One of the lesson's optional modules (``OPTIONAL``), imported, or None where the lesson has none."""
    if kind not in OPTIONAL:
        raise ValueError(f"only {' and '.join(OPTIONAL)} modules are optional, not {kind!r}")
    return module(lesson, kind) if path(lesson, kind).is_file() else None


@functools.cache
def _definitions(lesson: str) -> tuple[tuple[str, bool], ...]:
    """(name, marks a student's part) of each top-level function and class of the reference, in order."""
    source = path(lesson, "reference").read_text()
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.append((node.name, "### BEGIN SOLUTION" in (ast.get_source_segment(source, node) or "")))
    return tuple(found)


@functools.cache
def points(lesson: str) -> dict[str, float]:
    """Each graded cell's points, as the solution marks them (``# %% test=<item> points=<n>``): the one place."""
    source = (SOLUTIONS / f"{lesson}.py").read_text()
    return {item: float(n) for item, n in re.findall(r"(?m)^# %% test=(\S+) points=([0-9.]+)", source)}


def exercises(lesson: str) -> list[str]:
    """The lesson's graded exercises: the reference's definitions with a ``### BEGIN SOLUTION`` region, in order."""
    return [name for name, graded in _definitions(lesson) if graded]


def given(lesson: str) -> list[str]:
    """The reference's other definitions: code the lesson gives the student (a loader, a training loop)."""
    return [name for name, graded in _definitions(lesson) if not graded]
