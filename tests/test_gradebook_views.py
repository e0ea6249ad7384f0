"""nbgrader's export as the course writes it, and the names formgrader shows (autograder/pages/gradebook_views.py,
``grade_class.name_students``), on a gradebook made here: no grading needed. The graded, late case (formgrader in
Chromium, export and grades.csv agreeing) is tests/test_formgrader_late.py."""

import csv
import logging
from datetime import datetime

from nbgrader.api import Gradebook

from autograder.grading import grade_class, pipeline
from autograder.judge.preprocessors import SafeCsvExport
from autograder.pages import gradebook_views


def _export(tmp_path, url):
    out = tmp_path / "export.csv"
    plugin = SafeCsvExport(to=str(out), log=logging.getLogger("autograder.tests"))
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        plugin.export(gb)
    with open(out, newline="") as handle:
        return list(csv.DictReader(handle))


def test_export_cells_stay_in_their_columns_and_are_never_formulas(tmp_path):
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        gb.add_assignment("01-masks", duedate=datetime(2027, 1, 18, 22, 59))
        gb.add_student("ada", last_name="=HYPERLINK(\"x\"),Lovelace", first_name="Ada, Countess", email="+a@b")
    [row] = _export(tmp_path, url)
    assert list(row) == list(SafeCsvExport.COLUMNS)  # nbgrader's columns, in its order
    assert (row["last_name"], row["first_name"], row["email"]) == ("'=HYPERLINK(\"x\"),Lovelace", "Ada, Countess",
                                                                   "'+a@b")
    assert (row["duedate"], row["score"], row["timestamp"]) == ("2027-01-18 22:59:00", "0.0", "")


def test_roster_names_reach_the_gradebook(tmp_path):
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        gb.add_student("canvas-7")
    grade_class.name_students(url, {"canvas-7": {"name": "Ada King Lovelace", "email": "ada@example.org"},
                                 "canvas-8": {"name": "Grace", "email": ""}, "moodle-1": {"name": "", "email": ""}})
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        ada, grace = gb.find_student("canvas-7"), gb.find_student("canvas-8")
        assert (ada.first_name, ada.last_name, ada.email) == ("Ada King", "Lovelace", "ada@example.org")
        assert (grace.first_name, grace.last_name) == (None, "Grace")
        assert "moodle-1" not in {s.id for s in gb.students}  # nothing to say of them: not made here


def test_a_student_without_a_name_is_shown_by_the_id():
    assert gradebook_views._named({"id": "ada", "last_name": None, "first_name": None}, "id")["last_name"] == "ada"
    named = {"id": "bo", "last_name": "Diddley", "first_name": None}
    assert gradebook_views._named(dict(named), "id") == named
