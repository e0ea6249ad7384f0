"""A term end to end: three lessons with due dates, a late policy and extensions, graded through ``grade_class.grade``
(two worker processes: the term must reach every one), read back from grades.csv, nbgrader's gradebook and the
feedback pages.

One grading run (module fixture) of a folder in nbgrader's layout, due dates relative to now. Each case is a
submission with a stated lateness and the percentage of its raw score the term's policy must take: on time, in the
grace, a day late, three days late by the file's modification time (no timestamp.txt), past the cutoff, late but
within an extension of days, one day after an extension to a date. The penalties come from nbgrader's own
late-penalty step (``SubmittedNotebook.late_submission_penalty``), which formgrader and ``nbgrader export`` read.
"""

import csv
import html
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import samples
from autograder.grading import grade_class, pipeline
from autograder.term import schedule as term
from tests.conftest import NOW

pytestmark = pytest.mark.pipeline

LESSONS = ["00-setup", "01-masks", "02-attention"]
ZONE = "Europe/Berlin"
DUE = {"00-setup": NOW - timedelta(days=30), "01-masks": NOW - timedelta(days=20),
       "02-attention": NOW - timedelta(days=10)}
EXTENDED_TO = DUE["02-attention"] + timedelta(days=2, hours=6)  # bea's new due date for 02-attention
HOUR, DAY = 3600, 86400


@dataclass
class Case:
    student: str
    lesson: str
    late_by: float  # seconds after the lesson's due date (not the student's)
    percent: float  # of the raw score the policy takes
    make: object = samples.perfect
    timestamp_file: bool = True  # else the notebook file's modification time dates it


CASES = [
    Case("ada", "00-setup", -HOUR, 0),
    Case("ada", "01-masks", -60, 0),
    Case("ada", "02-attention", -DAY, 0),
    Case("gil", "01-masks", 5 * 60, 0),  # in the 10 min grace
    Case("gil", "02-attention", 11 * 60, 10),  # just past it: a part of a day costs a day
    Case("lin", "01-masks", DAY - HOUR, 10, samples.typical_mistakes),  # a percentage of the raw score
    Case("lin", "00-setup", 2 * DAY + 5 * HOUR, 30, timestamp_file=False),
    Case("max", "01-masks", 8 * DAY, 100),  # past the 7-day cutoff
    Case("max", "00-setup", 6 * DAY + HOUR, 50),  # 70% by the days, capped at 50%
    Case("bea", "01-masks", 2 * DAY, 0),  # an extension of 3 days
    Case("bea", "02-attention", 3 * DAY + 6 * HOUR, 10),  # a day after the extension to a date
]


def _local(moment: datetime) -> str:
    """A TOML local date-time in the term's zone (the term file reads it there)."""
    return moment.astimezone(ZoneInfo(ZONE)).replace(tzinfo=None).isoformat()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("term")
    term_file = root / "term.toml"
    lessons = "\n".join(f'"{lesson}" = {{ release = {_local(due - timedelta(days=7))}, due = {_local(due)} }}'
                        for lesson, due in DUE.items())
    term_file.write_text(f'timezone = "{ZONE}"\n[late]\ngrace_minutes = 10\npercent_per_day = 10\n'
                         f'max_percent = 50\ncutoff_days = 7\n[lessons]\n{lessons}\n[extensions]\n'
                         f'bea = {{ "01-masks" = 3, "02-attention" = {_local(EXTENDED_TO)} }}\n')
    incoming = root / "incoming"
    for case in CASES:
        path = incoming / case.student / case.lesson / f"{case.lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(case.make(case.lesson), path)
        when = DUE[case.lesson] + timedelta(seconds=case.late_by)
        if case.timestamp_file:
            (path.parent / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
        else:
            os.utime(path, (when.timestamp(), when.timestamp()))
    work = root / "work"
    work.mkdir()
    # lesson 00's answers went out a day after its due date (as if a release had shown them): within the cutoff
    (work / "handed-out.json").write_text(json.dumps(
        {"00-setup": {"at": (DUE["00-setup"] + timedelta(days=1)).isoformat(), "by": "the release of 01-masks"}}))
    outcomes = grade_class.grade(incoming, work, LESSONS, workers=2, term_file=term_file)
    with open(work / "grades.csv") as handle:
        rows = {(row["student"], row["lesson"]): row for row in csv.DictReader(handle)}
    return {"work": work, "outcomes": outcomes, "rows": rows, "term": term.load(term_file)}


def _when(case: Case) -> datetime:
    return DUE[case.lesson] + timedelta(seconds=case.late_by)


def _id(case: Case) -> str:
    return f"{case.student}-{case.lesson}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_grades_csv_shows_raw_score_penalty_and_final_score(run, case):
    row = run["rows"][(case.student, case.lesson)]
    assert row["status"] == "ok", row
    raw, penalty, final = float(row["raw_score"]), float(row["late_penalty"]), float(row["score"])
    assert 0 < raw <= float(row["max_score"])
    assert penalty == pytest.approx(raw * case.percent / 100)
    assert final == pytest.approx(raw - penalty)
    assert row["submitted"] == _when(case).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert row["due"] == run["term"].due(case.lesson, case.student).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_due_dates_are_the_term_s_read_in_its_zone(run):
    """The term file gives local times in Europe/Berlin; the gradebook and the CSV have the same moments in UTC."""
    for lesson, due in DUE.items():
        assert run["term"].due(lesson) == due
    assert run["term"].due("01-masks", "bea") == DUE["01-masks"] + timedelta(days=3)
    assert run["term"].due("02-attention", "bea") == EXTENDED_TO


def test_the_gradebook_holds_due_dates_extensions_and_nbgrader_s_penalties(run):
    """What formgrader and ``nbgrader export`` read: the assignment's due date, the submission's extension and
    timestamp, its due date with the extension, and each notebook's late penalty (its score stays the raw one)."""
    with Gradebook(f"sqlite:///{run['work'] / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        for lesson, due in DUE.items():
            assert gb.find_assignment(lesson).duedate == due.replace(tzinfo=None)
        for case in CASES:
            submission = gb.find_submission(case.lesson, case.student)
            row = run["rows"][(case.student, case.lesson)]
            assert submission.timestamp == _when(case).replace(tzinfo=None)
            assert submission.duedate == run["term"].due(case.lesson, case.student).replace(tzinfo=None)
            extension = run["term"].extension(case.lesson, case.student)
            assert submission.extension == extension
            assert (extension is not None) == (case.student == "bea")
            notebook = gb.find_submission_notebook(case.lesson, case.lesson, case.student)
            assert notebook.score == pytest.approx(float(row["raw_score"]))
            assert (notebook.late_submission_penalty or 0) == pytest.approx(float(row["late_penalty"]))
            assert submission.score - submission.late_submission_penalty == pytest.approx(float(row["score"]))


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_the_feedback_says_when_it_was_submitted_and_what_lateness_cost(run, case):
    page = (run["work"] / "feedback" / case.student / case.lesson / f"{case.lesson}.html").read_text()
    [line] = re.findall(r'<p data-course-grader="submitted"[^>]*>(.*?)</p>', page)
    line = html.unescape(line)
    due, zone = run["term"].due(case.lesson, case.student), ZoneInfo(ZONE)
    assert line.startswith(f"Submitted {term.shown_time(_when(case), zone)}, ")  # the term's clock, UTC beside
    assert term.shown_time(due, zone) in line and " UTC)" in line and (" CET " in line or " CEST " in line)
    assert ("extension of" in line) == (case.student == "bea")
    penalty = float(run["rows"][(case.student, case.lesson)]["late_penalty"])
    if case.percent:
        assert f"after the due date {term.shown_time(due, zone)}" in line
        assert f": −{penalty:g} points by the late policy: {run['term'].late.describe()}." in line
        assert f"(after a late penalty of {penalty:g})" in page  # the report's title: the final score
    else:
        assert line.endswith("on time.") or line.endswith(")."), line
        assert "late policy" not in line and "after a late penalty" not in page


def test_the_score_table_marks_late_notebooks(run):
    rows = {line.split(" | ")[0].strip("| "): line for line in pipeline.score_table(run["outcomes"]).splitlines()}
    for case in CASES:
        outcome = next(o for o in run["outcomes"] if (o.student, o.lesson) == (case.student, case.lesson))
        assert outcome.late == bool(case.percent)
        assert ("(late, −" in rows[case.student]) == any(c.percent for c in CASES if c.student == case.student)


def test_the_canaries_are_never_late(run):
    """The canary (the solutions, graded now) is in its own tree without a term: full marks, no due date."""
    canaries = [o for o in run["outcomes"] if o.student == pipeline.CANARY]
    assert {o.lesson for o in canaries} == set(LESSONS)
    assert all(o.score == o.max_score and not o.late and o.due is None for o in canaries)


def test_feedback_pages_record_the_answers_they_show(run):
    """Lesson 02's pages show lesson 01's masks (closed): grading records that moment beside the term's release,
    where ./course term and the next release read it. Lesson 01's pages show no graded answer of another lesson."""
    from autograder.term import integrity

    out = integrity.handed_out(integrity.ledger_of(run["work"] / "lessons"))
    assert set(out) == {"00-setup", "01-masks"}, out
    assert out["00-setup"] == (DUE["00-setup"] + timedelta(days=1), "the release of 01-masks")  # kept as it was
    when, by = out["01-masks"]
    assert by == "the feedback of 02-attention" and abs((when - datetime.now(UTC)).total_seconds()) < 3600


def test_work_that_earned_points_after_its_answers_went_out_needs_attention(run):
    """00-setup's answers went out a day after its due date: the two submissions after that which still earn
    points are flagged in grades.csv (and counted as needing attention); the one before, and lessons whose
    answers never went out, are not."""
    flagged = {key for key, row in run["rows"].items() if "answers went out" in row["message"]}
    assert flagged == {("lin", "00-setup"), ("max", "00-setup")}, flagged
    message = run["rows"][("lin", "00-setup")]["message"]
    assert "the release of 01-masks" in message and "check that this work is the student's own" in message
    assert "needs attention 2" in pipeline.summary(run["outcomes"])
