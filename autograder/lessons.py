"""The lesson registry: a lesson goes by one name, its id, and every module of it is named after that id.

=================  ====================================================
``03-multi-head``  the id: ``solutions/03-multi-head.py``, ``lessons/03-multi-head/``
``multi_head``     its slug: the id without its number, as a Python name
reference          ``autograder.reference.multi_head`` (the code the student writes, and the given code)
checks             ``autograder.checks.l03_multi_head`` (hidden checks, registered with ``@exercise``)
visible            ``decoder_course.visible.l03_multi_head`` (the checks under each exercise, public)
mutants            ``autograder.mutants.m03_multi_head`` (realistic wrong answers)
=================  ====================================================

A lesson exists when its percent source ``solutions/<id>.py`` does; its exercises are its reference module's
``EXERCISES``, whose cells the source names (``# %% exercise=...``). Adding a lesson is adding those files: no
table lists them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
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
    names = {"reference": f"autograder.reference.{name}", "checks": f"autograder.checks.l{number}_{name}",
             "visible": f"decoder_course.visible.l{number}_{name}", "mutants": f"autograder.mutants.m{number}_{name}"}
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
