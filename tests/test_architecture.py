"""The layout's promises (docs/ARCHITECTURE.md, the map), read from the source with ``ast``, nothing imported:

- no import circle among the modules of ``autograder/``, ``bench/`` and ``decoder_course/``, counting imports made
  inside functions too (a circle broken only by a late import is still a circle to whoever reads the code);
- no import that runs against the order of rooms that ``autograder/__init__.py`` declares (``ROOMS``): a room
  imports only rooms before it; no room imports ``autograder.__main__`` or a compatibility name; ``decoder_course``
  (what students get) imports nothing of ``autograder`` or ``bench``, and ``autograder`` nothing of ``bench``;
- no module over 700 lines unless docs/ARCHITECTURE.md names it, with its reason.

Each checker is also run on a small tree planted in ``tmp_path`` whose faults it must find.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("autograder", "bench", "decoder_course")
MAX_LINES = 700
LONG_MODULES_HEADING = "### Modules over 700 lines"


# -- reading the source ------------------------------------------------------------------------------------------
def modules(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root``, by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The known modules one import statement names: ``from package import module`` names the module."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target:
            found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which known modules each module imports, at any depth of its code (functions, ``if`` blocks included)."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[name] |= _imported(name, path, node, known)
        graph[name].discard(name)
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as the modules on it, the first repeated at the end; [] when there is none."""
    state: dict[str, str] = {}  # "open" while on the path being walked, "done" after
    path: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (circle := walk(nxt)):
                return circle
        state[node] = "done"
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (circle := walk(start)):
            return circle
    return []


def declared_rooms(root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``ROOMS`` and ``COMPATIBILITY_NAMES`` as ``autograder/__init__.py`` writes them (read, not imported)."""
    values = {}
    for node in ast.parse((root / "autograder" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return tuple(values["ROOMS"]), tuple(values["COMPATIBILITY_NAMES"])


def _room(module: str, rooms: tuple[str, ...]) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "autograder" and len(parts) > 1 and parts[1] in rooms else None


def against_the_order(graph: dict[str, set[str]], rooms: tuple[str, ...],
                      compatibility: tuple[str, ...]) -> list[str]:
    """Each import that runs against the documented order, in words."""
    wrong = []
    tops = {"autograder.__main__", *(f"autograder.{name}" for name in compatibility)}
    for importer, imported in sorted((a, b) for a, targets in graph.items() for b in targets):
        package, target = importer.split(".")[0], imported.split(".")[0]
        if package == "decoder_course" and target in ("autograder", "bench"):
            wrong.append(f"{importer} imports {imported}: the students' package imports nothing of the grader")
        elif package == "autograder" and target == "bench":
            wrong.append(f"{importer} imports {imported}: the grader imports nothing of the benchmarks")
        elif (room := _room(importer, rooms)) is not None:
            if imported in tops:
                wrong.append(f"{importer} imports {imported}: rooms never import the command line or a "
                             "compatibility name")
            elif (other := _room(imported, rooms)) is not None and rooms.index(other) > rooms.index(room):
                wrong.append(f"{importer} imports {imported}: room {room!r} comes before {other!r} in "
                             "autograder/__init__.py's ROOMS, so it may not import it")
    return wrong


def explained_long_modules(architecture: str) -> dict[str, str]:
    """The modules docs/ARCHITECTURE.md lets run over the limit, each with its reason (``- `path` …: reason``)."""
    section = architecture.partition(LONG_MODULES_HEADING)[2].split("\n#")[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^- `([^`]+\.py)`[^:\n]*:(.+)$", section, re.M)}


def too_long(root: Path, explained: dict[str, str], limit: int = MAX_LINES) -> list[str]:
    """Modules over ``limit`` lines that ``explained`` does not name, and names there that no longer need it."""
    lengths = {str(path.relative_to(root)): len(path.read_text().splitlines()) for path in modules(root).values()}
    wrong = [f"{path} has {n} lines (over {limit}): split it, or say why in docs/ARCHITECTURE.md, "
             f"{LONG_MODULES_HEADING!r}" for path, n in sorted(lengths.items()) if n > limit and path not in explained]
    wrong += [f"docs/ARCHITECTURE.md explains {path}, which has {lengths.get(path, 0)} lines: drop it from the list"
              for path in sorted(explained) if lengths.get(path, 0) <= limit]
    return wrong


# -- the repository ----------------------------------------------------------------------------------------------
def test_no_import_circle():
    circle = find_circle(import_graph(ROOT))
    assert not circle, "import circle: " + " -> ".join(circle)


def test_imports_follow_the_order_of_rooms():
    rooms, compatibility = declared_rooms(ROOT)
    assert against_the_order(import_graph(ROOT), rooms, compatibility) == []


def test_every_folder_of_autograder_is_a_declared_room_that_says_what_it_may_import():
    rooms, compatibility = declared_rooms(ROOT)
    folders = {p.parent.name for p in (ROOT / "autograder").glob("*/__init__.py")}
    assert folders == set(rooms), "autograder/'s sub-packages and ROOMS in autograder/__init__.py must agree"
    top = {p.stem for p in (ROOT / "autograder").glob("*.py")} - {"__init__", "__main__"}
    assert top == set(compatibility), "a module at autograder/'s top is a compatibility name, or goes into a room"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((ROOT / "autograder" / room / "__init__.py").read_text())) or ""
        assert "May import:" in doc, f"autograder/{room}/__init__.py's docstring says what the room may import"


def test_no_module_over_700_lines_unless_architecture_says_why():
    explained = explained_long_modules((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    assert all(len(reason) > 20 for reason in explained.values()), explained
    assert too_long(ROOT, explained) == []


@pytest.mark.parametrize(("old", "new"), [
    ("autograder.pipeline.tools_config", "autograder.grading.pipeline.tools_config"),
    ("autograder.pipeline.grade", "autograder.grading.grade_class.grade"),
    ("autograder.nbgrader_plugins.TrustedExecute", "autograder.judge.preprocessors.TrustedExecute"),
    ("autograder.nbgrader_plugins.SafeCsvExport", "autograder.judge.preprocessors.SafeCsvExport"),
    ("autograder.feedback.SafeFeedback", "autograder.pages.feedback.SafeFeedback"),
    ("autograder.feedback.FeedbackExporter", "autograder.pages.exporters.FeedbackExporter"),
    ("autograder.feedback.FormgradeExporter", "autograder.pages.exporters.FormgradeExporter"),
    ("autograder.exchange.CourseExchangeCollect", "autograder.intake.exchange.CourseExchangeCollect"),
])
def test_compatibility_names_are_the_rooms_objects(old, new):
    """Class paths an instructor's nbgrader config may hold from before the rooms still load, as the same object."""

    def load(dotted):
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)

    assert load(old) is load(new)


# -- the checkers find what they are for -------------------------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    init = 'ROOMS = ("low", "high")\nCOMPATIBILITY_NAMES = ("old",)\n'
    for name, text in {"autograder/__init__.py": init, "autograder/low/__init__.py": "",
                       "autograder/high/__init__.py": "", "bench/__init__.py": "", "decoder_course/__init__.py": "",
                       **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files", [
    {"autograder/low/a.py": "from autograder.low import b\n", "autograder/low/b.py": "import autograder.low.a\n"},
    {"autograder/low/a.py": "from autograder.low.b import f\n",
     "autograder/low/b.py": "def g():\n    from autograder.low.a import h  # late, still a circle\n"},
    {"autograder/low/a.py": "from . import b\n", "autograder/low/b.py": "from .c import x\n",
     "autograder/low/c.py": "from .a import y\n"},
    {"bench/__main__.py": "from bench import publish\n", "bench/publish.py": "if True:\n    import bench.__main__\n"},
], ids=["module level", "function-local", "relative, three long", "bench"])
def test_a_planted_circle_is_found_and_named(tmp_path, files):
    circle = find_circle(import_graph(_tree(tmp_path, files)))
    assert circle and circle[0] == circle[-1] and len(circle) >= 3, circle


def test_the_circle_finder_on_a_graph():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"a2"}, "a2": set(), "x": {"y"}, "y": {"x"}}) == ["x", "y", "x"]


@pytest.mark.parametrize(("files", "found"), [
    ({"autograder/low/a.py": "from autograder.high import b\n", "autograder/high/b.py": ""}, "comes before 'high'"),
    ({"autograder/low/a.py": "def f():\n    from autograder.high.b import g\n", "autograder/high/b.py": ""},
     "comes before 'high'"),
    ({"autograder/high/a.py": "from autograder import old\n", "autograder/old.py": ""}, "compatibility name"),
    ({"autograder/low/a.py": "import autograder.__main__\n", "autograder/__main__.py": ""}, "command line"),
    ({"decoder_course/a.py": "from autograder.low import b\n", "autograder/low/b.py": ""}, "students' package"),
    ({"autograder/low/a.py": "import bench.x\n", "bench/x.py": ""}, "nothing of the benchmarks"),
], ids=["upward", "upward, function-local", "compatibility name", "__main__", "decoder_course", "bench"])
def test_an_import_against_the_order_is_found(tmp_path, files, found):
    root = _tree(tmp_path, files)
    wrong = against_the_order(import_graph(root), *declared_rooms(root))
    assert len(wrong) == 1 and found in wrong[0], wrong


def test_the_order_allows_downward_imports(tmp_path):
    root = _tree(tmp_path, {"autograder/high/a.py": "from autograder.low import b\n", "autograder/low/b.py": "",
                            "autograder/old.py": "from autograder.high.a import x\n",
                            "autograder/__main__.py": "from autograder.high import a\n"})
    assert against_the_order(import_graph(root), *declared_rooms(root)) == []


def test_a_long_module_needs_its_reason(tmp_path):
    root = _tree(tmp_path, {"autograder/low/long.py": "x = 1\n" * 701, "autograder/low/short.py": "x = 1\n" * 700})
    assert too_long(root, {}) == [f"autograder/low/long.py has 701 lines (over {MAX_LINES}): split it, or say why "
                                  f"in docs/ARCHITECTURE.md, {LONG_MODULES_HEADING!r}"]
    assert too_long(root, {"autograder/low/long.py": "a reason"}) == []
    assert "drop it" in too_long(root, {"autograder/low/long.py": "r", "autograder/low/short.py": "r"})[0]
    doc = f"## x\n{LONG_MODULES_HEADING}\n\n- `autograder/low/long.py` (701 lines): why it is long.\n\n## next\n"
    assert explained_long_modules(doc) == {"autograder/low/long.py": "why it is long."}
