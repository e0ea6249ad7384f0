"""One score for a late submission: grades.csv, ``nbgrader export`` and formgrader (read in Chromium) agree.

A term (Europe/Berlin) with 01-masks and 02-attention, 10% a day late. ``./course grade`` grades three students
of 01-masks: ``ada`` on time, ``lin`` five hours late (every answer right: 4 raw, 0.4 penalty, 3.6 final) and
``bea`` two days after the lesson's due date but within her three-day extension. Then:

- grades.csv says 4 / 0.4 / 3.6 for lin;
- ``nbgrader export`` (the repository's nbgrader_config.py) says the same, and gives bea's due date with her
  extension;
- formgrader, as the instructor's JupyterLab serves it with that config, shows 3.6 / 4 on Manage Submissions
  (its timestamp says "late: 4 − 0.4 = 3.6"), on Manual Grading, on Manage Students and the student's pages (the
  notebook's *Code Score* stays the raw 4) and in Manual Grading's averages (3.87 / 4, not 4 / 4), lists the term's
  two lessons and no other, and shows a student with no name by the id, never "None, None".
"""

import csv
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import nbformat
import pytest

from autograder.course import samples
from tests import test_browser
from tests.conftest import NOW, ROOT
from tests.test_browser import Lab, loopback_page

pytestmark = [pytest.mark.notebook, pytest.mark.pipeline]

browser = test_browser.browser
LESSON = "01-masks"
ZONE = ZoneInfo("Europe/Berlin")
DUE = NOW - timedelta(days=3)
LATE = {"ada": -timedelta(hours=1), "lin": timedelta(hours=5), "bea": timedelta(days=2)}
SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": True}}}


def _local(moment: datetime) -> str:
    return moment.astimezone(ZONE).replace(tzinfo=None).isoformat()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("late")
    term_file = tmp / "term.toml"
    term_file.write_text(f'timezone = "Europe/Berlin"\n[late]\npercent_per_day = 10\ncutoff_days = 7\n[lessons]\n'
                         f'"01-masks" = {{ release = {_local(DUE - timedelta(days=7))}, due = {_local(DUE)} }}\n'
                         f'"02-attention" = {{ release = {_local(NOW)}, due = {_local(NOW + timedelta(days=7))} }}\n'
                         '[extensions]\nbea = { "01-masks" = 3 }\n')
    for student, late in LATE.items():
        folder = tmp / "submissions" / student / LESSON
        folder.mkdir(parents=True)
        nbformat.write(samples.perfect(LESSON), folder / f"{LESSON}.ipynb")
        (folder / "timestamp.txt").write_text((DUE + late).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    work = tmp / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DECODER_COURSE_TERM": str(term_file),
           "DECODER_COURSE_WORK": str(work), "NBGRADER_EXCHANGE_ROOT": str(tmp / "exchange")}
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp / "submissions"), "--work", str(work)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    export = tmp / "export.csv"
    subprocess.run([str(ROOT / ".venv" / "bin" / "nbgrader"), "export", f"--CsvExportPlugin.to={export}"], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=120)
    with open(work / "grades.csv") as handle:
        sheet = {row["student"]: row for row in csv.DictReader(handle)}
    with open(export) as handle:
        exported = {row["student_id"]: row for row in csv.DictReader(handle) if row["assignment"] == LESSON}
    return {"tmp": tmp, "env": env, "work": work, "sheet": sheet, "export": exported, "out": done.stdout}


def test_grades_csv_and_nbgrader_export_agree_on_the_late_score(course):
    sheet, export = course["sheet"], course["export"]
    assert (sheet["lin"]["raw_score"], sheet["lin"]["late_penalty"], sheet["lin"]["score"]) == ("4.0", "0.4", "3.6")
    assert float(export["lin"]["raw_score"]) == 4.0 and float(export["lin"]["late_submission_penalty"]) == 0.4
    assert float(export["lin"]["score"]) == pytest.approx(3.6)
    for student in LATE:
        assert float(export[student]["score"]) == pytest.approx(float(sheet[student]["score"])), student
    assert sheet["bea"]["late_penalty"] == "0.0"  # within her extension
    # the student's own due date: bea's with the extension, as grades.csv has it
    assert export["bea"]["duedate"] == (DUE + timedelta(days=3)).replace(tzinfo=None).isoformat(" ")
    assert export["ada"]["duedate"] == DUE.replace(tzinfo=None).isoformat(" ")
    assert sheet["bea"]["due"] == (DUE + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _table(page, url: str, has_text: str) -> dict[str, list[str]]:
    page.goto(url)
    page.locator("table tbody tr", has_text=has_text).first.wait_for(timeout=60_000)
    page.wait_for_timeout(500)
    rows = {}
    for row in page.locator("table tbody tr").all():
        cells = [text.strip() for text in row.locator("td").all_inner_texts()]
        rows[" | ".join(cells)] = cells
    return rows


def _row(rows: dict, needle: str) -> list[str]:
    found = [cells for key, cells in rows.items() if needle in key]
    assert len(found) == 1, (needle, list(rows))
    return found[0]


def test_formgrader_shows_the_final_score_with_the_penalty(course, browser):
    home = course["tmp"] / "lab"
    home.mkdir()
    lab = Lab(home, ROOT, cwd=ROOT, server_config=SERVER_CONFIG,
              env={key: course["env"][key] for key in ("DECODER_COURSE_TERM", "DECODER_COURSE_WORK",
                                                       "NBGRADER_EXCHANGE_ROOT")})
    page, blocked = loopback_page(browser, lab, width=1400)
    try:
        page.goto(f"{lab.base}/lab?token={lab.token}")  # the instructor's session
        page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=60_000)
        base = f"{lab.base}/formgrader"
        started = time.perf_counter()

        assignments = _table(page, f"{base}/manage_assignments", LESSON)
        listed = sorted(cells[0] for cells in assignments.values())
        assert listed == ["01-masks", "02-attention"], listed  # the term's lessons, no drafts of the others

        submissions = _table(page, f"{base}/manage_submissions/{LESSON}", "lin")
        lin = _row(submissions, "lin")
        assert "3.6 / 4" in lin and "late: 4 − 0.4 = 3.6" in " ".join(lin), lin
        assert "4 / 4" in _row(submissions, "ada") and "4 / 4" in _row(submissions, "bea")
        assert "None" not in " ".join(lin)  # no "None, None" for a student without a name

        averages = _table(page, f"{base}/gradebook", LESSON)  # Manual Grading's assignments: (4 + 4 + 3.6) / 3
        assert "3.87 / 4" in _row(averages, LESSON), averages
        averages = _table(page, f"{base}/gradebook/{LESSON}", LESSON)  # ... and the assignment's notebooks
        assert "3.87 / 4" in _row(averages, LESSON), averages
        manual = _table(page, f"{base}/gradebook/{LESSON}/{LESSON}", "Submission")
        assert sorted(cells[2] for cells in manual.values() if cells[2].endswith("/ 4")) == ["3.6 / 4", "4 / 4",
                                                                                             "4 / 4"], manual
        students = _table(page, f"{base}/manage_students", "lin")
        totals = {cells[1]: cells[3] for cells in students.values()}  # over the term's lessons in the gradebook
        assert [totals[name].split(" / ")[0] for name in ("ada", "bea", "lin")] == ["4", "4", "3.6"], totals
        mine = _table(page, f"{base}/manage_students/lin", LESSON)
        assert "3.6 / 4" in _row(mine, LESSON), mine
        notebooks = _table(page, f"{base}/manage_students/lin/{LESSON}", LESSON)
        cells = _row(notebooks, LESSON)
        assert cells[1:3] == ["3.6 / 4", "4 / 4"], cells  # the final score, then the raw code score
        print(f"formgrader pages read in {time.perf_counter() - started:.0f} s")
    finally:
        page.close()
        lab.close()
    assert not blocked, blocked


def test_formgrader_s_api_gives_final_scores_beside_raw_ones(course, monkeypatch):
    """What formgrader's pages are built from (the API the repository's nbgrader_config.py installs), every route:
    the final score, with the raw score and penalty beside it."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.server_extensions.formgrader import base
    from traitlets.config.loader import PyFileConfigLoader

    for key in ("DECODER_COURSE_TERM", "DECODER_COURSE_WORK", "NBGRADER_EXCHANGE_ROOT"):
        monkeypatch.setenv(key, course["env"][key])
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    api = base.NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    assert type(api) is not NbGraderAPI  # formgrader builds the course's
    lin = {s["student"]: s for s in api.get_submissions(LESSON)}["lin"]
    assert (lin["score"], lin["raw_score"], lin["late_penalty"]) == pytest.approx((3.6, 4.0, 0.4))
    assert api.get_submission(LESSON, "lin")["score"] == pytest.approx(3.6)
    assert [s["score"] for s in api.get_student_submissions("lin") if s["name"] == LESSON] == [pytest.approx(3.6)]
    assert [s["score"] for s in api.get_notebook_submissions(LESSON, LESSON) if s["student"] == "lin"] == \
        [pytest.approx(3.6)]
    [notebook] = api.get_student_notebook_submissions("lin", LESSON)
    assert (notebook["score"], notebook["code_score"]) == pytest.approx((3.6, 4.0))
    assert {s["id"]: s["score"] for s in api.get_students()}["lin"] == pytest.approx(3.6)
    assert api.get_student("lin")["score"] == pytest.approx(3.6)
    assert sorted(api.get_source_assignments()) == ["01-masks", "02-attention"]
    assert {s["student"]: s["score"] for s in api.get_submissions(LESSON)} == pytest.approx(
        {"ada": 4.0, "bea": 4.0, "lin": 3.6})
    assignment = api.get_assignment(LESSON)  # Manage Assignments' average: of the final scores, the raw one beside
    assert (assignment["average_score"], assignment["raw_average_score"]) == pytest.approx((11.6 / 3, 4.0))
    assert {a["name"]: a["average_score"] for a in api.get_assignments()}[LESSON] == pytest.approx(11.6 / 3)
    [notebook] = api.get_notebooks(LESSON)  # Manual Grading's per-notebook average
    assert (notebook["average_score"], notebook["raw_average_score"]) == pytest.approx((11.6 / 3, 4.0))
