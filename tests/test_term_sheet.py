"""grades.csv as the term's sheet, and what a weekly run says: a run updates its own rows and keeps the others'; the
lessons it was not asked to grade are skipped quietly (one line, never a problem); a run with a term grades the
term's lessons; an empty submissions folder is an error that says what was expected.

The two-run case grades for real (``grade_class.grade``, its canaries and sandbox): week 1 grades 02-attention, week 2
01-masks alone, from a folder that still holds week 1's notebooks; grades.csv then holds both weeks' rows.
"""

import csv
import json
import stat
from datetime import UTC, datetime, timedelta

import nbformat
import pytest

from autograder.__main__ import main
from autograder.course import lessons, samples
from autograder.grading import grade_class, pipeline
from autograder.grading.pipeline import CANARY, Outcome
from autograder.intake import submissions as intake
from autograder.term import schedule as term

WEEK = {"01-masks": 2, "02-attention": 1}


def _rows(path):
    with open(path, newline="") as handle:
        return {(row["student"], row["lesson"]): row for row in csv.DictReader(handle)}


def _submit(root, student, lesson, make=samples.perfect):
    path = root / student / lesson / f"{lesson}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(make(lesson), path)
    return path


# -- the sheet, without grading ----------------------------------------------------------------------------------
def test_a_run_replaces_its_own_rows_and_keeps_every_other(tmp_path):
    sheet = tmp_path / "grades.csv"
    pipeline.write_term_sheet(sheet, [Outcome(CANARY, "02-attention", 4, 4), Outcome("ada", "02-attention", 3, 4),
                                      Outcome("bo", "02-attention", 1, 4, ok=False, message="=HYPERLINK(1)")])
    pipeline.write_term_sheet(sheet, [Outcome("ada", "01-masks", 2, 4, late_penalty=0.5),
                                      Outcome("bo", "02-attention", 4, 4)])
    rows = _rows(sheet)
    assert list(rows) == [("ada", "01-masks"), ("ada", "02-attention"), ("bo", "02-attention")]  # course order
    assert (rows["ada", "02-attention"]["score"], rows["ada", "01-masks"]["raw_score"]) == ("3", "2.5")
    assert (rows["bo", "02-attention"]["score"], rows["bo", "02-attention"]["status"]) == ("4", "ok")
    assert not [name for name in tmp_path.iterdir() if name.name.startswith(".grades-")]  # the temporary is gone


def test_a_kept_row_stays_as_the_course_wrote_it(tmp_path):
    sheet = tmp_path / "grades.csv"
    pipeline.write_term_sheet(sheet, [Outcome("bo", "02-attention", 0, 0, ok=False, message="=HYPERLINK(1)")])
    pipeline.write_term_sheet(sheet, [Outcome("ada", "01-masks", 2, 4)])
    assert _rows(sheet)["bo", "02-attention"]["message"] == "'=HYPERLINK(1)"  # never read as a formula


@pytest.mark.parametrize("earlier", [b"name,grade\nada,3\n", b"\xff\xfe not text", b"x" * (pipeline.SHEET_BYTES + 1)],
                         ids=["another-header", "not-utf8", "too-big"])
def test_an_unreadable_earlier_sheet_is_kept_aside(tmp_path, earlier, caplog):
    sheet = tmp_path / "grades.csv"
    sheet.write_bytes(earlier)
    pipeline.write_term_sheet(sheet, [Outcome("ada", "01-masks", 2, 4)])
    assert list(_rows(sheet)) == [("ada", "01-masks")]
    assert (tmp_path / "grades.csv.unreadable").read_bytes() == earlier
    assert "grades.csv.unreadable" in caplog.text


# -- what a run selects, and says --------------------------------------------------------------------------------
def test_unselected_lessons_are_skipped_quietly_and_counted_once(tmp_path):
    incoming = tmp_path / "incoming"
    for student in ("ada", "bo", "cy"):
        _submit(incoming, student, "01-masks")
        _submit(incoming, student, "02-attention")
    (incoming / "ada_x_02-attention.ipynb").write_text("{}")  # a flat file of the same lesson
    (incoming / "cy" / "99-nothing").mkdir()  # not a lesson of the course: still a problem
    (incoming / "cy" / "99-nothing" / "99-nothing.ipynb").write_text("{}")
    found = intake.collect_submissions(incoming, ["01-masks"], tmp_path / "scratch")
    assert sorted(found.found) == ["ada", "bo", "cy"]
    assert found.unselected == {"02-attention": 4}
    assert [p for p in found.problems if not p.startswith("cy/99-nothing/")] == []
    only_other = intake.collect_submissions(incoming, ["00-setup"], tmp_path / "scratch2")
    assert only_other.problems == [p for p in found.problems if "99-nothing" in p]  # no "no notebook" for them
    assert [p for p in found.problems if "99-nothing" in p and "not a lesson id" in p]
    assert found.skipped_lessons() == "4 notebooks of lessons not graded in this run skipped (02-attention: 4)"


def _term_file(tmp_path, scheduled=("01-masks", "02-attention")):
    now = datetime.now(UTC).replace(microsecond=0)
    path = tmp_path / "term.toml"
    table = "\n".join(f'"{lesson}" = {{ release = {(now - timedelta(days=10 + week * 7)).isoformat()}, '
                      f'due = {(now + timedelta(days=week * 7)).isoformat()} }}'
                      for lesson, week in WEEK.items() if lesson in scheduled)
    path.write_text(f'timezone = "Europe/Berlin"\n[late]\npercent_per_day = 10\ncutoff_days = 7\n[lessons]\n{table}\n')
    return path


def test_a_term_s_run_grades_the_term_s_lessons(tmp_path):
    assert grade_class.default_lessons(term.load(_term_file(tmp_path))) == ["01-masks", "02-attention"]
    assert grade_class.default_lessons(None) == lessons.ids()


@pytest.mark.parametrize("what", ["empty", "other-lessons", "not-notebooks"])
def test_an_empty_submissions_folder_is_an_error_that_says_what_it_expected(tmp_path, capsys, monkeypatch, what):
    monkeypatch.delenv(term.ENV_VAR, raising=False)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    if what == "other-lessons":
        _submit(incoming, "ada", "02-attention")
    elif what == "not-notebooks":
        (incoming / "ada").mkdir()
        (incoming / "ada" / "notes.txt").write_text("hello")
    work = tmp_path / "work"
    with pytest.raises(grade_class.NothingToGrade, match="student/lesson/notebook.ipynb"):
        grade_class.grade(incoming, work, ["01-masks"], term_file="")
    assert not (work / "canary").exists()  # said before any canary ran
    assert main(["grade", str(incoming), "--work", str(work), "--lessons", "01-masks"]) == 2
    err = capsys.readouterr().err
    assert "no notebook to grade" in err and "for 01-masks" in err
    if what == "other-lessons":
        assert "02-attention: 1" in err


# -- two weeks, two runs -----------------------------------------------------------------------------------------
@pytest.mark.pipeline
def test_two_weekly_runs_leave_both_lessons_in_grades_csv(tmp_path, capsys):
    term_file = _term_file(tmp_path)
    incoming, work = tmp_path / "incoming", tmp_path / "work"
    _submit(incoming, "ada", "02-attention")
    _submit(incoming, "bo", "02-attention", samples.untouched)
    week1 = grade_class.grade(incoming, work, ["02-attention"], term_file=term_file, progress=True)
    _submit(incoming, "ada", "01-masks", samples.typical_mistakes)
    week2 = grade_class.grade(incoming, work, ["01-masks"], term_file=term_file, progress=True)
    assert "2 notebooks of lessons not graded in this run skipped (02-attention: 2)" in capsys.readouterr().out
    rows = _rows(work / "grades.csv")
    assert set(rows) == {("ada", "01-masks"), ("ada", "02-attention"), ("bo", "02-attention")}
    for outcome in week1 + week2:
        if outcome.student != CANARY:
            assert float(rows[outcome.student, outcome.lesson]["score"]) == outcome.score
    assert rows["ada", "02-attention"]["score"] != rows["bo", "02-attention"]["score"]
    assert json.loads((work / "problems.json").read_text()) == []  # week 1's notebooks are no problem in week 2
    # what grading wrote is the instructor's alone (tests/test_access.py: what another account can read of it)
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    assert stat.S_IMODE((work / "gradebook.db").stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE((work / "secret").stat().st_mode) & 0o077 == 0
