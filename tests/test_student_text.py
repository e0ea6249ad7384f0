"""What a student reads: no internal names, no hand-written badges, and lessons that run without a warning.

Students see the released lessons, the docstrings of the exercises and given blocks (they are in the lessons),
the companion package (visible checks and their messages) and the hidden checks' verdict messages (in their
feedback). None of it may speak of the team's own documents: the course contract ("SPEC"), the notes the course
was planned from, issue numbers or the shared folder.
"""

import ast
import re
import warnings

import nbformat
import pytest
from nbclient import NotebookClient

from autograder.course import notebooks
from tests.conftest import ROOT

LESSONS = notebooks.lessons()
INTERNAL = re.compile(r"\bSPEC\b|SPEC's|SPEC\.md|[Ee]ngineering notes?\b|\bthe course started from\b|\bshared/"
                      r"|\b[Ii]ssue \d+\b|\bthe seed's\b")


def _hits(text: str) -> list[str]:
    return [m.group(0) for m in INTERNAL.finditer(text)]


def _string_literals(path) -> list[tuple[int, str]]:
    """Every string constant of a Python file (messages, docstrings, f-string parts), with its line."""
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_internal_words_are_found():
    for text in ("the SPEC's measurement", "SPEC's form", "the engineering notes the course started from",
                 "see issue 14", "as in ../shared/SPEC.md"):
        assert _hits(text), text
    for text in ("SPECIAL_TOKENS", "a spec of cases", "special tokens", "the seed of the run"):
        assert not _hits(text), text


@pytest.mark.parametrize("lesson", LESSONS)
def test_released_lessons_say_no_internal_name(lesson):
    nb = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    found = [(i, hit) for i, cell in enumerate(nb.cells) for hit in _hits(cell.source)]
    assert not found, f"lessons/{lesson}: internal names a student has never seen (cell, word): {found}"


@pytest.mark.parametrize("area", ["decoder_course", "autograder/course/reference", "autograder/course/checks"])
def test_docstrings_and_check_messages_say_no_internal_name(area):
    """The package is public (visible checks, their messages); reference docstrings are in the lessons; hidden
    checks' messages reach the feedback."""
    found = []
    for path in sorted((ROOT / area).rglob("*.py")):
        found += [f"{path.relative_to(ROOT)}:{line}: {hit}" for line, text in _string_literals(path)
                  for hit in _hits(text)]
    assert not found, "internal names in text students read:\n" + "\n".join(found)


def test_sources_hold_no_hand_written_colab_badge():
    """The builder writes each lesson's badge (pointing at the release tag); a copy in the source goes stale."""
    for lesson in LESSONS:
        text = (ROOT / "solutions" / f"{lesson}.py").read_text()
        assert "colab-badge.svg" not in text, f"solutions/{lesson}.py: remove the hand-written Colab badge"


# -- every solution notebook runs with warnings turned into errors ---------------------------------------------------
# A cell that shows a warning on purpose says so with this comment line; warnings are allowed there and only there.
WARNS_ON_PURPOSE = re.compile(r"^# warns on purpose\b", re.M)
STRICT = ('import warnings\nwarnings.simplefilter("error")  # inserted by tests/test_student_text.py\n'
          'warnings.filterwarnings("default", module="ipykernel")  # the kernel\'s own machinery, not the lesson')
LENIENT = 'import warnings\nwarnings.simplefilter("default")  # the next cell warns on purpose'


def _strict(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with warnings turned into errors from its first cell on, except in cells that warn on purpose."""
    cells = [nbformat.v4.new_code_cell(STRICT)]
    for cell in nb.cells:
        on_purpose = cell.cell_type == "code" and WARNS_ON_PURPOSE.search(cell.source)
        cells += [nbformat.v4.new_code_cell(LENIENT)] if on_purpose else []
        cells.append(cell)
        cells += [nbformat.v4.new_code_cell(STRICT)] if on_purpose else []
    nb.cells = cells
    return nb


def _run(nb: nbformat.NotebookNode, allow_errors: bool = False) -> nbformat.NotebookNode:
    # NBGRADER_EXECUTION: the budgets of a graded run (training and timing cut short) run the same cells faster
    env = {**__import__("os").environ, "NBGRADER_EXECUTION": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "default", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute(env=env)
    return nb


def _stderr_warnings(nb: nbformat.NotebookNode) -> list[str]:
    """Warnings printed rather than raised (by C code, or a library that writes them itself), outside the cells
    that warn on purpose."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or WARNS_ON_PURPOSE.search(cell.source):
            continue
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stderr" and "Warning" in out.text:
                found.append(f"cell {i}: {out.text.strip()[:300]}")
    return found


def test_the_warning_test_catches_a_warning_outside_a_marked_cell():
    overflow = "import numpy as np\nnp.full(1, -1e9, dtype=np.float16)"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# warns on purpose: -1e9 does not exist in float16\n" + overflow),
                nbformat.v4.new_code_cell(overflow)]
    nb = _run(_strict(nb), allow_errors=True)
    marked, unmarked = (c for c in nb.cells if "np.full" in c.source)
    assert not [o for o in marked.outputs if o.output_type == "error"], "a marked cell may warn"
    errors = [o for o in unmarked.outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "RuntimeWarning", unmarked.outputs


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_notebook_runs_without_a_warning(lesson):
    """Top to bottom in a fresh kernel, as a student runs it (with a graded run's short budgets), with every
    warning an error except in a cell that says it warns on purpose."""
    nb = _strict(nbformat.read(notebooks.solution_path(lesson), as_version=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the test's own Jupyter client, not the lesson
        nb = _run(nb)
    printed = _stderr_warnings(nb)
    assert not printed, f"{lesson} prints warnings:\n" + "\n".join(printed)
