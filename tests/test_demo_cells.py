"""Demonstration cells (``# %% demo``): the builder's digest, what a graded run skips and what it still runs.

A graded run skips a demonstration cell (an ablation, a timing sweep, a training run no graded item reads) while
its source is the instructor's, and runs it once a student edited it. Skipping removes only the instructor's code
from a cell the student could have deleted anyway, so it can never raise a score; the builder refuses a
demonstration whose names a later ordinary cell reads, so it cannot lower one either.
"""

import copy
import hashlib

import nbformat
import pytest

from autograder.course import notebooks, samples
from autograder.grading import grade_class
from autograder.judge import verdicts
from tests.conftest import ROOT

SOURCE = """\
# %% [markdown]
# # A lesson

# %% demo
x = 1

# %%
y = 2
"""


def _demos(nb):
    return [c for c in nb.cells if "demo" in c.metadata.get("course", {})]


def test_a_demo_header_stores_the_digest_of_the_cell_source():
    nb = notebooks.build_notebook("01-masks", SOURCE)
    (demo,) = _demos(nb)
    assert demo.source == "x = 1"
    assert demo.metadata["course"]["demo"] == hashlib.sha256(b"x = 1").hexdigest()
    assert notebooks.untouched_demo(demo)
    for edit in (" ", "\n", "\nprint(x)"):
        edited = copy.deepcopy(demo)
        edited.source += edit
        assert not notebooks.untouched_demo(edited), f"an edit ({edit!r}) must make the cell run"
    plain = [c for c in nb.cells if c.cell_type == "code" and c.source == "y = 2"]
    assert plain and not notebooks.untouched_demo(plain[0])


def test_a_forged_digest_never_skips_a_graded_or_solution_cell():
    nb = nbformat.read(notebooks.solution_path("01-masks"), as_version=4)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
              or c.metadata.get("nbgrader", {}).get("solution")]
    assert graded
    for cell in graded:
        forged = copy.deepcopy(cell)
        forged.metadata.setdefault("course", {})["demo"] = notebooks.source_digest(forged.source)
        assert not notebooks.untouched_demo(forged)


def test_the_builder_refuses_a_demo_whose_names_a_later_cell_reads():
    with pytest.raises(ValueError, match="reads x"):
        notebooks.build_notebook("01-masks", SOURCE.replace("y = 2", "y = x + 1"))
    # a later cell that binds the name itself does not depend on the demonstration
    notebooks.build_notebook("01-masks", SOURCE.replace("y = 2", "x = 3\ny = x + 1"))
    # a later demonstration may read it: both are skipped together
    notebooks.build_notebook("01-masks", SOURCE.replace("# %%\ny = 2", "# %% demo\ny = x + 1"))
    with pytest.raises(ValueError, match="plain code cell"):
        notebooks.build_notebook("01-masks", SOURCE.replace("# %% demo", "# %% demo test=causal_mask"))


def test_the_builder_follows_python_scopes_not_spellings():
    # a parameter or local named x is the function's own: it neither hides a read of the notebook's x ...
    with pytest.raises(ValueError, match="reads x"):
        notebooks.build_notebook("01-masks", SOURCE.replace("y = 2", "def f(x):\n    return x\ny = f(x)"))
    # ... nor is a binding of the notebook's x that a later cell could depend on
    notebooks.build_notebook("01-masks", SOURCE.replace("y = 2", "def f(x):\n    return x\ny = f(2)"))
    # a function body that reads x without binding it reads the notebook's x when it runs
    with pytest.raises(ValueError, match="reads x"):
        notebooks.build_notebook("01-masks", SOURCE.replace("y = 2", "def f():\n    return x + 1\ny = f()"))


@pytest.mark.parametrize("lesson", ["07-training", "08-generation", "09-kv-cache"])
def test_the_long_lessons_mark_their_demonstrations_and_the_release_keeps_them(lesson):
    solution = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    release = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    assert _demos(solution), f"{lesson} marks no demonstration cell"
    assert [c.source for c in _demos(release)] == [c.source for c in _demos(solution)]
    assert all(notebooks.untouched_demo(c) for c in _demos(release))
    # no demonstration is graded, holds a solution, or feeds a graded cell (the builder's check, re-run here)
    assert not any(c.metadata.get("nbgrader") for c in _demos(solution))
    notebooks.check_demos(lesson, solution)


def test_grading_skips_untouched_demos_and_runs_an_edited_one(tmp_path):
    lesson = "09-kv-cache"
    nb = samples.perfect(lesson)
    demos = _demos(nb)
    assert len(demos) >= 2
    demos[0].source += '\nprint("the student edited this demonstration")'
    path = tmp_path / "incoming" / "ada" / lesson / f"{lesson}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    outcomes = grade_class.grade(tmp_path / "incoming", tmp_path / "course", lessons=[lesson])
    ada = next(o for o in outcomes if o.student == "ada")
    assert ada.ok and ada.score == ada.max_score > 0, ada
    graded = nbformat.read(tmp_path / "course" / "autograded" / "ada" / lesson / f"{lesson}.ipynb", as_version=4)
    ran, skipped = _demos(graded)[0], _demos(graded)[1:]
    printed = "".join(out.get("text", "") for out in ran.outputs)
    assert "the student edited this demonstration" in printed and ran.execution_count
    for cell in skipped:
        assert [out.get("text") for out in cell.outputs] == [notebooks.DEMO_SKIPPED]
        assert cell.execution_count is None
    # every graded cell ran
    assert all(c.execution_count for c in verdicts.graded_test_cells(graded))
