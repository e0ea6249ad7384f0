"""The class report (autograder/pages/report.py) of a small class graded through the pipeline, with planted mistakes.

One grading run (module fixture) of lesson 01 for 11 students: 5 with one known mistake of `causal_mask`, 3 with
one of `combine_masks`, 2 correct, 1 who handed in the release untouched; one of the correct ones forged a verdict
in their notebook's metadata. ``grade_class.grade`` writes the report at its end; the tests read its CSVs.
"""

import csv

import nbformat
import numpy as np
import pytest
from nbgrader.api import Gradebook

from autograder.course import notebooks, samples
from autograder.course.checks import framework
from autograder.grading import grade_class, pipeline
from autograder.judge import verdicts
from autograder.pages import report

pytestmark = pytest.mark.pipeline

LESSON = "01-masks"
PLANTED = {  # item -> (known mistake, students)
    "causal_mask": ("strictly lower triangle: a token cannot see itself", [f"lower{i}" for i in range(5)]),
    "combine_masks": ("OR instead of AND", [f"orer{i}" for i in range(3)]),
}
CORRECT = ["ada", "forger"]
UNTOUCHED = "grace"
FORGED = "a forged mistake"


def _with_mistake(item: str, description: str) -> nbformat.NotebookNode:
    wrong = next(replacement for name, text, replacement in samples.mutants_of(LESSON)
                 if name == item and text == description)
    source = samples.mutant_source(next(iter(wrong.values())))
    return samples._fill(LESSON, lambda names: "\n\n".join(
        source if name == item else notebooks.reference_source(LESSON, name, keep_markers=False).rstrip()
        for name in names))


def _forged() -> nbformat.NotebookNode:
    """The solutions, with a verdict of its own in every cell's metadata (graded or not): only the grader's count."""
    nb = samples.perfect(LESSON)
    for cell in nb.cells:
        cell.metadata.setdefault("course", {})[verdicts.VERDICT_KEY] = {
            "item": cell.metadata.get("nbgrader", {}).get("grade_id", "causal_mask"), "passed": False,
            "kind": "policy", "mistake": FORGED}
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("report")
    subs = work / "incoming"
    made = {student: _with_mistake(item, mistake) for item, (mistake, students) in PLANTED.items()
            for student in students}
    made |= {"ada": samples.perfect(LESSON), "forger": _forged(), UNTOUCHED: samples.untouched(LESSON)}
    for student, nb in made.items():
        path = subs / student / LESSON / f"{LESSON}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    outcomes = grade_class.grade(subs, work / "course", [LESSON], term_file="")
    return work / "course", outcomes


def _rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _verdict_line(work, student: str, item: str) -> str:
    """The first line of ``student``'s failed verdict of ``item``, read from their autograded notebook."""
    nb = nbformat.read(work / "autograded" / student / LESSON / f"{LESSON}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == item)
    return next(o.evalue for o in cell.outputs if o.output_type == "error").splitlines()[0]


def _item_scores(work) -> dict[str, dict[str, float]]:
    """student -> item -> points, read from the gradebook itself."""
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        return {s.student.id: {g.name: float(g.score) for g in s.notebooks[0].grades}
                for s in gb.find_assignment(LESSON).submissions}


def test_grading_writes_the_report(graded):
    work, outcomes = graded
    assert {o.student for o in outcomes if o.ok} >= {"ada", UNTOUCHED, *PLANTED["causal_mask"][1]}
    for name in ("index.html", "items.csv", "mistakes.csv", "students.csv", "similarity.csv",
                 f"lesson-{LESSON}.png"):
        assert (work / "report" / name).is_file(), name
    # for the instructor only: nothing of it in what students get (feedback pages, the release)
    handed_out = [p for folder in ("feedback", "release") for p in (work / folder).rglob("*") if p.is_file()]
    assert handed_out and not [p for p in handed_out if "Class report" in p.read_text(errors="replace")]


def test_mistakes_are_named_with_their_count_and_share(graded):
    work, _ = graded
    rows = {(r["item"], r["mistake"]): r for r in _rows(work / "report" / "mistakes.csv")}
    students = 5 + 3 + len(CORRECT) + 1
    for item, (mistake, planted) in PLANTED.items():
        row = rows.pop((item, mistake))
        assert row["lesson"] == LESSON
        assert int(row["students"]) == len(planted), row
        assert float(row["share"]) == pytest.approx(len(planted) / students, abs=1e-3)
        assert row["example"] == _verdict_line(work, sorted(planted)[0], item), row
    assert not rows, f"mistakes nobody planted: {rows}"


def test_items_have_the_right_means_shares_and_kinds(graded):
    work, _ = graded
    rows = {r["item"]: r for r in _rows(work / "report" / "items.csv")}
    students = 5 + 3 + len(CORRECT) + 1
    for item in ("causal_mask", "padding_mask", "combine_masks", "mask_to_bias"):
        row = rows[item]
        wrong = len(PLANTED.get(item, ("", []))[1])
        full = students - wrong - 1  # the untouched release fails every item
        top = float(row["max_points"])
        assert int(row["students_graded"]) == students
        assert float(row["mean_points"]) == pytest.approx(top * full / students, abs=1e-3), row
        assert float(row["full_share"]) == pytest.approx(full / students, abs=1e-3)
        assert float(row["zero_share"]) == pytest.approx((wrong + 1) / students, abs=1e-3)
        assert int(row["failed_not_attempted"]) == 1, row
        assert int(row["failed_wrong_values"]) == wrong, row
        assert sum(int(row[f"failed_{k.replace(' ', '_')}"]) for k in report.FAILURE_KINDS) == wrong + 1


def test_discrimination_is_the_item_rest_correlation(graded):
    work, _ = graded
    scores = _item_scores(work)
    rows = {r["item"]: r for r in _rows(work / "report" / "items.csv")}
    for item in ("causal_mask", "combine_masks", "padding_mask"):
        students = sorted(scores)
        x = np.array([scores[s][item] for s in students])
        rest = np.array([sum(v for k, v in scores[s].items() if k != item) for s in students])
        by_hand = np.corrcoef(x, rest)[0, 1]
        assert float(rows[item]["discrimination"]) == pytest.approx(by_hand, abs=1e-3), item


def test_a_forged_verdict_counts_for_nothing(graded):
    work, _ = graded
    assert FORGED not in (work / "report" / "mistakes.csv").read_text()
    assert FORGED not in (work / "report" / "index.html").read_text()
    nb = nbformat.read(work / "autograded" / "forger" / LESSON / f"{LESSON}.ipynb", as_version=4)
    for cell in nb.cells:
        verdict = cell.metadata.get("course", {}).get(verdicts.VERDICT_KEY)
        graded_cell = cell.metadata.get("nbgrader", {}).get("grade") and not cell.metadata["nbgrader"].get("solution")
        if graded_cell:
            assert verdict == {"item": cell.metadata.nbgrader.grade_id, "passed": True, "kind": "", "mistake": ""}
        else:
            assert verdict is None, cell.source[:80]


def test_every_graded_cell_carries_its_verdict_as_data(graded):
    work, _ = graded
    nb = nbformat.read(work / "autograded" / UNTOUCHED / LESSON / f"{LESSON}.ipynb", as_version=4)
    found = [c.metadata.course[verdicts.VERDICT_KEY] for c in nb.cells
             if verdicts.VERDICT_KEY in c.metadata.get("course", {})]
    assert found and all(v["kind"] == framework.NOT_ATTEMPTED and not v["passed"] for v in found), found


def test_students_table_lists_everyone(graded):
    work, _ = graded
    rows = {r["student"]: r for r in _rows(work / "report" / "students.csv")}
    assert set(rows) == {*CORRECT, UNTOUCHED, *(s for _, ss in PLANTED.values() for s in ss)}
    assert float(rows[UNTOUCHED]["share"]) == 0 and float(rows["ada"]["share"]) == 1


def test_report_command_rewrites_it(graded, capsys):
    from autograder.__main__ import main

    work, _ = graded
    (work / "report" / "items.csv").unlink()
    assert main(["report", str(work)]) == 0
    assert (work / "report" / "items.csv").is_file()
    assert "class report" in capsys.readouterr().out


def test_report_of_a_folder_without_a_gradebook_says_what_to_do(tmp_path, capsys):
    from autograder.__main__ import main

    assert main(["report", str(tmp_path)]) == 2
    assert "grade the class first" in capsys.readouterr().err


def test_a_linked_or_oversized_notebook_is_not_read(tmp_path, monkeypatch):
    from bench.report import synthetic_class

    work = tmp_path / "class"
    synthetic_class(work, ["ann", "bob", "cy"], [LESSON], seed=1)

    def path(student):
        return work / "autograded" / student / LESSON / f"{LESSON}.ipynb"

    path("bob").unlink()
    path("bob").symlink_to(path("ann"))
    limit = path("ann").stat().st_size
    path("cy").write_text(path("cy").read_text() + " " * limit)  # still a notebook, now over the limit
    monkeypatch.setattr(report, "MAX_NOTEBOOK_BYTES", limit)
    data = report.read_class(work)
    assert all(set(by_student) <= {"ann"} for by_student in data.code.values()), data.code.keys()
    assert data.code and data.submissions.keys() >= {("bob", LESSON), ("cy", LESSON)}  # their scores still count
