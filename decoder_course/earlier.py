"""Your own code from an earlier lesson, for a lesson that builds on it while that lesson is still open.

During a graded term, a lesson released before an earlier one closes does not show that lesson's answers: its
given cell calls::

    from decoder_course.earlier import use_your_own
    use_your_own("03-multi-head", ["split_heads", "merge_heads", "MultiHeadAttention"], globals())

which finds your notebook of lesson 03 and runs its definitions, so this lesson runs on your own blocks. Only
definitions run: imports, ``def``, ``class``, constants in CAPITALS written out (``WIDTH = 3``), and the same
kind of call for the lessons that one builds on; a training loop, a plot or a check of that lesson does not run
again. When the lesson is graded the course's own blocks run in that cell instead, so a slip in lesson 03 costs
nothing in a later lesson; but the visible checks here use yours, and a failure may come from there.

Where it looks, first found first: ``../<lesson>/<lesson>.ipynb`` (the lessons side by side, as released),
``./<lesson>.ipynb`` (Colab: upload it next to this notebook), ``./<lesson>/<lesson>.ipynb``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

__all__ = ["EarlierLessonError", "candidates", "use_your_own"]

MAX_BYTES = 32 << 20  # a notebook with its outputs; more is not read
_MAGIC = re.compile(r"^\s*[%!]")  # IPython lines (%pip, !ls): not Python, skipped
_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]+$")  # WIDTH = 3, not T = len(tokens) (a dimension of an example)
_STUB = "raise NotImplementedError()"


class EarlierLessonError(RuntimeError):
    """Your earlier notebook could not give what this lesson needs; the message says what to do."""


def candidates(lesson: str, here: Path | None = None) -> list[Path]:
    """Where :func:`use_your_own` looks for ``lesson``'s notebook, in order."""
    here = Path.cwd() if here is None else Path(here)
    name = f"{lesson}.ipynb"
    return [here.parent / lesson / name, here / name, here / lesson / name]


def _kept(tree: ast.Module) -> list[ast.stmt]:
    """The statements of a cell that define something (see the module doc), in order."""
    kept = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "decoder_course.earlier":
            continue  # the caller's own use_your_own stands in (relative to that notebook, with a cycle guard)
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if targets and all(isinstance(t, ast.Name) and _CONSTANT.match(t.id) for t in targets) \
                    and node.value is not None and _literal(node.value):
                kept.append(node)
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "use_your_own"):
            kept.append(node)
    return kept


def _literal(node: ast.expr) -> bool:
    """A constant written out (``3``, ``"<pad>"``, ``(1, 2)``, ``-1e9``): nothing that computes."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _is_stub(node: ast.stmt, source: str) -> bool:
    segment = ast.get_source_segment(source, node) or ""
    return isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _STUB in segment and "YOUR CODE HERE" in segment


def _read(path: Path) -> list[str]:
    """The source of each cell of a notebook, "" for a cell that is not code (so that cell numbers are the
    notebook's own), read within :data:`MAX_BYTES`."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise EarlierLessonError(f"{path} is over {MAX_BYTES >> 20} MB: clear its outputs (Kernel > Restart Kernel "
                                 "and Clear Outputs), save it, and run this cell again")
    try:
        cells = json.loads(raw.decode("utf-8")).get("cells", [])
    except (UnicodeDecodeError, ValueError, AttributeError):
        raise EarlierLessonError(f"{path} is not a notebook that can be read (is it saved?)") from None
    sources = []
    for cell in cells if isinstance(cells, list) else []:
        source = cell.get("source", "") if isinstance(cell, dict) and cell.get("cell_type") == "code" else ""
        sources.append("".join(source) if isinstance(source, list) else str(source))  # "" keeps the numbering
    return sources


def use_your_own(lesson: str, names: list[str], namespace: dict, *, here: Path | None = None,
                 _seen: tuple[str, ...] = ()) -> None:
    """Run the definitions of your notebook of ``lesson`` and put ``names`` from it into ``namespace`` (this
    notebook's ``globals()``). An :class:`EarlierLessonError` says what is missing and what to do."""
    if lesson in _seen:
        raise EarlierLessonError(f"lesson {lesson} builds on itself through {' -> '.join(_seen)}: run the lessons "
                                 "as released")
    found = next((path for path in candidates(lesson, here) if path.is_file()), None)
    if found is None:
        looked = ", ".join(str(path) for path in candidates(lesson, here))
        raise EarlierLessonError(
            f"this lesson needs your {', '.join(names)} from lesson {lesson}, and no {lesson}.ipynb was found "
            f"(looked in: {looked}). Keep the lessons side by side as released (lessons/{lesson}/{lesson}.ipynb), "
            f"or in Colab upload your {lesson}.ipynb next to this notebook; then run this cell again.")
    # an earlier notebook's own stand-in loads relative to that notebook, with this call's chain against cycles
    own: dict = {"__name__": f"lesson_{lesson.replace('-', '_')}", "use_your_own": _nested(found.parent,
                                                                                          (*_seen, lesson))}
    stubs, broken = set(), []
    for index, source in enumerate(_read(found)):
        code = "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            broken.append(f"cell {index} (line {exc.lineno}: {exc.msg})")
            continue
        kept = _kept(tree)
        for node in kept:
            if _is_stub(node, code):
                stubs.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                stubs.discard(node.name)
        if not kept:
            continue
        try:
            exec(compile(ast.Module(body=kept, type_ignores=[]), f"{found} (cell {index})", "exec"), own)
        except Exception as exc:  # your code of that lesson: say where, and let it be fixed there
            raise EarlierLessonError(f"running the definitions of {found}, cell {index}, raised "
                                     f"{type(exc).__name__}: {exc}. Fix that cell in lesson {lesson}, save, and "
                                     "run this cell again") from exc
    missing = [name for name in names if name not in own]
    if missing:
        hint = f"; these cells could not be read as Python: {', '.join(broken)}" if broken else ""
        raise EarlierLessonError(f"{found} defines no {', '.join(missing)}{hint}: finish those exercises in lesson "
                                 f"{lesson}, save it, and run this cell again")
    for name in names:
        namespace[name] = own[name]
    unwritten = [name for name in names if name in stubs]
    if unwritten:
        print(f"Note: your {', '.join(unwritten)} in lesson {lesson} still raise NotImplementedError: write them "
              "there first, or this lesson's checks will fail on them.")


def _nested(folder: Path, seen: tuple[str, ...]):
    """``use_your_own`` as an earlier notebook's own stand-in calls it: relative to that notebook's lesson."""
    def call(lesson: str, names: list[str], namespace: dict) -> None:
        use_your_own(lesson, names, namespace, here=folder, _seen=seen)
    return call
