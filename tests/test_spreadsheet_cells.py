"""Every CSV the course writes (grades.csv, roster.csv, ``nbgrader export``) read as a spreadsheet would read it,
with each separator a spreadsheet may guess (``,``, ``;``, tab): no cell starts a formula, whatever text a student
or an LMS put into it (``decoder_course.text.csv_cell``, through the one writer ``csv_writer``)."""

import csv
import io
import re
import unicodedata
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autograder.grading import pipeline
from decoder_course.text import csv_cell, shown
from tests.conftest import ROOT

SEPARATORS = (",", ";", "\t")
FORMULA_START = set("=+-@\t\r")
# What a student or an LMS may write: a formula at the start, after each separator a spreadsheet may split on,
# after spaces or quotes, written with full-width or small look-alikes, DDE, a line break or a tab before it.
ATTACKS = [
    "=HYPERLINK(\"http://evil\",\"x\")",
    "=cmd|' /C calc'!A0",
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A2)",
    "alice;=cmd|' /C calc'!A0",
    "alice,=HYPERLINK(\"x\")",
    "alice\t=1+1",
    "alice; -2+3",
    "a;;@x",
    'a;"=1+1',
    'a,"; =1',
    "a\r=1",
    "a\n@x",
    "\t=1",
    " =1",
    "＝HYPERLINK(\"x\")",
    "a;＋1",
    "﹦1",
    "a,﹫x",
    "－1",
    "\u22121",
    "\x00=1",
    "'=already neutral",
]


def _starts_formula(cell: str) -> bool:
    """Whether a spreadsheet could read ``cell`` as a formula: its first character, after spaces (a spreadsheet may
    trim them), is one OWASP lists or a look-alike of one; a number the course wrote (``-0.5``) is no formula."""
    text = cell.lstrip(" ")
    if not text:
        return False
    with_number = re.fullmatch(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?", text)
    first = text[0]
    return not with_number and (first in FORMULA_START or unicodedata.normalize("NFKC", first)[:1] in FORMULA_START
                                or first == "\u2212")


def _unsafe_cells(path: Path) -> list[str]:
    text = path.read_text()
    found = []
    for separator in SEPARATORS:
        for row in csv.reader(io.StringIO(text, newline=""), delimiter=separator):
            found += [f"{separator!r}: {cell!r}" for cell in row if _starts_formula(cell)]
        # and as a spreadsheet that ignores quotes splits it: every piece between separators and line breaks
        found += [f"{separator!r} unquoted: {piece!r}" for piece in re.split(f"[{separator}\r\n]", text)
                  if _starts_formula(piece.lstrip(' "'))]
    return found


@pytest.mark.parametrize("attack", ATTACKS)
def test_csv_cell_neutralises_a_formula_after_every_separator(attack):
    cell = csv_cell(attack)
    for separator in SEPARATORS:
        pieces = re.split(f"[{separator}\r\n]", cell)
        assert not [p for p in pieces if _starts_formula(p.lstrip(' "'))], (separator, cell)
    assert cell.replace("'", "") == shown(attack).replace("'", ""), "a character was lost or changed"
    assert csv_cell(cell) == cell, "applied twice, it changed again"


def test_csv_cell_leaves_numbers_and_plain_text_alone():
    assert csv_cell(2.5) == 2.5 and csv_cell(-1) == -1
    for text in ("alice", "canvas-201", "2027-01-25T22:59:00Z", "cell 3 timed out; kernel restarted", "a - b",
                 "García José"):
        assert csv_cell(text) == text


def _outcomes():
    return [pipeline.Outcome(student=attack, lesson="01-masks", score=1.0, max_score=4.0, message=attack,
                             notes=[attack, "cell timed out"], late_penalty=0.5,
                             submitted=datetime(2027, 1, 25, tzinfo=UTC), due=datetime(2027, 1, 24, tzinfo=UTC))
            for attack in ATTACKS]


def test_grades_csv_has_no_formula_with_any_separator(tmp_path):
    pipeline.write_csv(tmp_path / "grades.csv", _outcomes())
    assert not _unsafe_cells(tmp_path / "grades.csv")
    rows = list(csv.DictReader(open(tmp_path / "grades.csv", newline="")))
    assert [row["raw_score"] for row in rows] == ["1.5"] * len(ATTACKS)  # the numbers are numbers still
    assert rows[0]["student"] == "'=HYPERLINK(\"http://evil\",\"x\")"


def test_roster_csv_has_no_formula_with_any_separator(tmp_path):
    roster = {f"canvas-{i}": {"lms_id": attack, "name": attack, "email": attack, "note": attack}
              for i, attack in enumerate(ATTACKS)}
    pipeline.write_roster(tmp_path / "roster.csv", roster)
    assert not _unsafe_cells(tmp_path / "roster.csv")
    assert len(list(csv.reader(open(tmp_path / "roster.csv", newline="")))) == len(ATTACKS) + 1


def test_nbgrader_export_has_no_formula_with_any_separator(tmp_path):
    """``nbgrader export`` through the course's config: students whose names and emails an instructor copied from
    the LMS (``nbgrader db student add``), one with a submission; the columns stay nbgrader's."""
    from nbgrader.api import Gradebook
    from traitlets.config import Config

    from autograder.judge.preprocessors import SafeCsvExport

    config = pipeline.tools_config(Config(), tmp_path / "work")
    assert config.ExportApp.plugin_class == "autograder.judge.preprocessors.SafeCsvExport"
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_assignment("01-masks", duedate=datetime(2027, 1, 25))
        for i, attack in enumerate(ATTACKS):
            gb.add_student(f"s{i}", first_name=attack, last_name=attack, email=attack)
        gb.add_submission("01-masks", "s0", timestamp=datetime(2027, 1, 24))
        SafeCsvExport(to=str(tmp_path / "export.csv")).export(gb)
    assert not _unsafe_cells(tmp_path / "export.csv")
    rows = {row["student_id"]: row for row in csv.DictReader(open(tmp_path / "export.csv", newline=""))}
    assert list(rows["s0"]) == list(SafeCsvExport.COLUMNS) and len(rows) == len(ATTACKS)
    assert rows["s0"]["timestamp"] == "2027-01-24 00:00:00" and rows["s1"]["timestamp"] == ""
    assert rows["s0"]["first_name"] == "'=HYPERLINK(\"http://evil\",\"x\")" and rows["s1"]["score"] == "0.0"


def test_every_csv_writer_goes_through_the_course_writer():
    """No module writes a CSV by itself: ``csv.writer`` and ``csv.DictWriter`` appear only in the one helper."""
    allowed = ROOT / "decoder_course" / "text.py"
    found = [f"{path.relative_to(ROOT)}:{number}"
             for folder in ("autograder", "bench", "decoder_course") for path in sorted((ROOT / folder).rglob("*.py"))
             if path != allowed
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bcsv\.(writer|DictWriter)\b|\bwriter\s*=\s*csv\b", line)]
    assert not found, f"CSV written without decoder_course.text.csv_writer: {found}"
