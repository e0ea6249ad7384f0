"""Sample submissions for the demo, made from the release so that they never go stale.

- ``ada``: every exercise solved (the reference code typed into the release notebook);
- ``grace``: the untouched release (every exercise raises ``NotImplementedError``);
- ``alan``: typical mistakes: every other exercise holds a realistic wrong answer from ``autograder.course.mutants``,
and
  one correct answer prints a warning on stderr (which must not cost points).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import nbformat

from autograder.course import lessons, notebooks

ROOT = notebooks.ROOT
STUDENTS = ("ada", "grace", "alan")
_DECORATOR = re.compile(r"^@mutant\(.*\)\n", re.M)
_NOQA = re.compile(r"\s*# noqa[^\n]*")


def mutants_of(lesson: str) -> list:
    """The lesson's known wrong answers (:func:`autograder.course.mutants.of`)."""
    from autograder.course import mutants

    return list(mutants.of(lesson))


def mutant_source(obj) -> str:
    """A wrong answer as a student would have typed it: no decorator, no lint comments.

    A mutant module defines the same class name several times; ``inspect.getsource`` finds the first of them
    (before Python 3.13), so a class is found from the line of one of its own methods instead. A string is a
    wrong answer's source already (a find-the-bug exercise's release, ``autograder.course.mutants.shown_bug``).
    """
    if isinstance(obj, str):
        return obj.rstrip() + "\n"
    if isinstance(obj, type):
        lines, _ = inspect.findsource(obj)
        first = min(fn.__code__.co_firstlineno for fn in _functions(obj)) - 1  # 0-based line of a method
        start = next(i for i in range(first, -1, -1) if re.match(rf"class {obj.__name__}\b", lines[i]))
        source = "".join(inspect.getblock(lines[start:]))
    else:
        source = inspect.getsource(obj)
    source = textwrap.dedent(source)
    return _NOQA.sub("", _DECORATOR.sub("", source)).rstrip() + "\n"


def _functions(cls: type) -> list:
    found = []
    for value in vars(cls).values():
        value = getattr(value, "fget", None) or getattr(value, "__func__", None) or value
        if hasattr(value, "__code__"):
            found.append(value)
    return found


def notebook_namespace(lesson: str, wrong: dict | None = None) -> dict:
    """What a notebook's kernel holds: the lesson's reference code typed into cells, then ``wrong`` answers
    (a mutant's replacement) typed after it. Every function looks its helpers up in this one namespace, as a
    student's do: a wrong ``softmax`` is what the student's ``masked_softmax`` calls."""
    module = lessons.module(lesson, "reference")
    namespace: dict = {"__name__": "__main__"}
    exec(compile(inspect.getsource(module), f"<{lesson} cells>", "exec"), namespace)  # noqa: S102 - our own code
    for obj in (wrong or {}).values():
        exec(compile(mutant_source(obj), f"<{lesson} wrong cell>", "exec"), namespace)  # noqa: S102
    return namespace


def _fill(lesson: str, choose) -> nbformat.NotebookNode:
    """The release notebook with each exercise cell's code chosen by ``choose(names) -> source | None``."""
    nb = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    for cell in nb.cells:
        names = cell.get("metadata", {}).get("course", {}).get("exercise")
        if names:
            source = choose(names)
            if source is not None:
                cell.source = source
    return nb


def perfect(lesson: str) -> nbformat.NotebookNode:
    return _fill(lesson, lambda names: "\n\n".join(
        notebooks.reference_source(lesson, name, keep_markers=False).rstrip() for name in names))


def untouched(lesson: str) -> nbformat.NotebookNode:
    return _fill(lesson, lambda names: None)


def one_left(lesson: str, item: str) -> nbformat.NotebookNode:
    """The solutions, but ``item``'s cell left as released (a stub that raises NotImplementedError)."""
    return _fill(lesson, lambda names: None if item in names else "\n\n".join(
        notebooks.reference_source(lesson, name, keep_markers=False).rstrip() for name in names))


def typical_mistakes(lesson: str) -> nbformat.NotebookNode:
    first_wrong: dict[str, object] = {}
    for item, _, replacement in mutants_of(lesson):
        first_wrong.setdefault(item, next(iter(replacement.values())))
    wrong_items = list(first_wrong)[::2]
    warned = False

    def choose(names):
        nonlocal warned
        sources = []
        for name in names:
            if name in wrong_items:
                sources.append(mutant_source(first_wrong[name]))
            else:
                source = notebooks.reference_source(lesson, name, keep_markers=False)
                if not warned and source.startswith("def "):
                    # A correct answer that also warns on stderr: nbgrader alone would zero it (issue 1904).
                    source = "import warnings\n\nwarnings.warn('a harmless warning from a correct answer')\n\n" \
                        + source
                    warned = True
                sources.append(source)
        return "\n\n".join(s.rstrip() for s in sources)

    return _fill(lesson, choose)


def make_samples(dest: Path, lessons: list[str] | None = None) -> Path:
    """Write the three students' submissions in nbgrader's layout: ``dest/student/lesson/lesson.ipynb``."""
    makers = {"ada": perfect, "grace": untouched, "alan": typical_mistakes}
    for lesson in lessons or notebooks.lessons():
        for student, make in makers.items():
            path = dest / student / lesson / f"{lesson}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(make(lesson), path)
    return dest
