"""Solutions are built from their sources and the references; lessons/ is nbgrader's release of them, unedited."""

import json
import re

import nbformat
import pytest

from autograder.course import notebooks
from autograder.grading import pipeline
from autograder.judge import verdicts
from autograder.judge.preprocessors import HIDDEN_BEGIN
from tests.conftest import ROOT

LESSONS = notebooks.lessons()
VOLATILE = re.compile(r'"(checksum|id)": "[^"]*"')


def test_the_course_has_lessons():
    assert "01-masks" in LESSONS


def test_solution_notebooks_are_built_from_sources_and_references():
    stale = notebooks.build_all(check=True)
    assert not stale, f"solutions/<id>/<id>.ipynb out of date for {stale}: run `./course release`"


@pytest.mark.parametrize("lesson", LESSONS)
def test_graded_cells_match_registered_hidden_checks(lesson):
    nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    items = [cell.metadata["nbgrader"]["grade_id"] for cell in verdicts.graded_test_cells(nb)]
    registered = verdicts.exercises_for(lesson)
    assert len(items) == len(set(items)), "a graded test cell is duplicated"
    assert set(items) == set(registered), "every graded cell needs hidden checks, and every check a cell"
    for cell in verdicts.graded_test_cells(nb):
        meta = cell.metadata["nbgrader"]
        assert meta["points"] == registered[meta["grade_id"]].points, f"{meta['grade_id']}: points disagree"
        hidden = notebooks.HIDDEN.format(item=meta["grade_id"])
        assert cell.source.startswith(hidden), "the hidden part comes first and only collects"
        assert cell.source.count(HIDDEN_BEGIN) == 1


def test_committed_release_is_what_nbgrader_generates(tmp_path):
    pipeline.release(out=tmp_path / "release", work=tmp_path / "work")
    for lesson in LESSONS:
        fresh = (tmp_path / "release" / lesson / f"{lesson}.ipynb").read_text()
        committed_path = ROOT / "lessons" / lesson / f"{lesson}.ipynb"
        assert committed_path.exists(), f"lessons/{lesson} is missing: run `./course release`"
        committed = committed_path.read_text()
        assert json.loads(committed) == json.loads(fresh), (
            f"lessons/{lesson} differs from nbgrader's release of solutions/{lesson}: never edit lessons/ by hand;"
            " run `./course release`"
        )


@pytest.mark.parametrize("lesson", LESSONS)
def test_release_holds_no_solution_or_hidden_test(lesson):
    text = (ROOT / "lessons" / lesson / f"{lesson}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "autograder", "harvest"):
        assert marker not in text, f"lessons/{lesson} contains {marker!r}"
    # Every line a student must write is absent (ignoring trivial lines such as `return out`).
    nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    released = nbformat.reads(text, as_version=4)
    released_code = "\n".join(c.source for c in released.cells if c.cell_type == "code")
    # Lines shown on purpose in given cells (earlier lessons' blocks) are not leaks of this lesson's answers.
    given_code = "\n".join(c.source for c in nb.cells if "given" in c.metadata.get("course", {}))
    for cell in nb.cells:
        if "exercise" not in cell.metadata.get("course", {}):
            continue
        inside = False
        for line in cell.source.splitlines():
            if "BEGIN SOLUTION" in line:
                inside = True
            elif "END SOLUTION" in line:
                inside = False
            elif inside and len(line.strip()) > 30 and not line.strip().startswith("#") \
                    and line.strip() not in given_code:
                assert line.strip() not in released_code, f"solution line leaked into lessons/{lesson}: {line!r}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_outputs_and_execution_counts_are_stripped(lesson):
    for path in (notebooks.solution_path(lesson), ROOT / "lessons" / lesson / f"{lesson}.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path} has outputs"
