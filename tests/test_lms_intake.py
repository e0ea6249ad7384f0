"""Zipped uploads from an LMS (Canvas, Moodle, Gradescope): every student gets their own grade; no student's upload
is lost, merged with another's, or taken for another's (autograder/intake/submissions.py).

Each layout is a small export with several students: two who share a display name (told apart by the LMS's id), a
late one, a re-upload, an accented name, a student with two notebooks, one with none, and entries written to land
in a classmate's folder. The intake tests check the folders (found), the roster and the refused list; the last
test grades a Canvas zip with ``./course grade``'s own entry point and reads grades.csv.
"""

import csv
import io
import json
import stat
import unicodedata
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.course import samples
from autograder.grading import pipeline
from autograder.intake import submissions as intake

LESSON = "01-masks"


def _nb(tag: str) -> str:
    """A valid notebook that says whose it is (which upload was picked is read back from it)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(tag))
    return nbformat.writes(nb)


def _tag(path: Path) -> str:
    return nbformat.read(path, as_version=4).cells[0].source


def _zip(path: Path, entries: dict[str, str | bytes], links: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name in links:  # a symbolic link entry, as `zip --symlinks` writes it
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "../../etc/passwd")
    return path


def _collect(tmp_path: Path, source: Path, lessons=(LESSON,), **kw) -> intake.Collected:
    return intake.collect_submissions(source, list(lessons), tmp_path / "scratch", **kw)


def _found_tags(collected: intake.Collected) -> dict[str, str]:
    return {student: _tag(lessons[LESSON]) for student, lessons in collected.found.items()}


def _problem(collected: intake.Collected, *words: str) -> list[str]:
    return [p for p in collected.problems if all(w in p for w in words)]


# -- Canvas ------------------------------------------------------------------------------------------------------
CANVAS = {
    "lovelaceada_101_5001_01-masks.ipynb": _nb("ada"),
    "smithjohn_102_5002_01-masks.ipynb": _nb("john 102"),  # two students called John Smith
    "smithjohn_103_5003_Untitled.ipynb": _nb("john 103"),
    "hoppergrace_late_104_5004_01-masks.ipynb": _nb("grace, late"),  # Canvas lowercases the whole prefix
    "turingalan_LATE_105_5005_01-masks.ipynb": _nb("alan, LATE"),
    "curiemarie_106_5006_01-masks.ipynb": _nb("marie, first"),  # re-uploads: Canvas adds -1, -2
    "curiemarie_106_5010_01-masks-1.ipynb": _nb("marie, second"),
    "curiemarie_106_5012_01-masks-2.ipynb": _nb("marie, latest"),
    "garcíajosé_107_5007_01-masks.ipynb": _nb("josé"),
    "noetheremmy_108_5008_scratch.ipynb": _nb("emmy a"),  # two different notebooks, none named 01-masks
    "noetheremmy_108_5009_draft.ipynb": _nb("emmy b"),
    "hamiltonmargaret_109_5013_01-masks.ipynb": _nb("margaret"),  # two notebooks, one named for the lesson
    "hamiltonmargaret_109_5014_notes.ipynb": _nb("margaret notes"),
    "babbagecharles_110_5011_answers.pdf": b"%PDF-1.4",  # no notebook at all
    # entries written to reach a classmate's folder or to take their name
    "mallory_111_5015_x/../../canvas-101/01-masks/01-masks.ipynb": _nb("mallory via .."),
    "canvas-101/01-masks/01-masks.ipynb": _nb("mallory as an nbgrader folder"),
    "LovelaceAda_101_5001_01-masks.ipynb": _nb("mallory, case-only twin"),
    unicodedata.normalize("NFD", "garcíajosé_107_5007_01-masks.ipynb"): _nb("mallory, NFD twin"),
    "mallory_111_5016_01-masks.ipynb": _nb("mallory"),
}


ZIP_ONLY = {"mallory_111_5015_x/../../canvas-101/01-masks/01-masks.ipynb", "LovelaceAda_101_5001_01-masks.ipynb",
            unicodedata.normalize("NFD", "garcíajosé_107_5007_01-masks.ipynb")}  # what a folder cannot hold here


@pytest.mark.parametrize("packed", ["zip", "zip in a folder", "folder"])
def test_canvas_gives_each_user_id_their_own_notebook(tmp_path, packed):
    if packed == "folder":
        source = tmp_path / "export"
        for name, data in CANVAS.items():
            if name not in ZIP_ONLY:
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                (source / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    else:
        prefix = "submissions/" if packed == "zip in a folder" else ""
        source = _zip(tmp_path / "canvas.zip", {prefix + k: v for k, v in CANVAS.items()},
                      links=(prefix + "mallory_111_5017_01-masks.ipynb",))
    collected = _collect(tmp_path, source)
    assert collected.layout == "canvas"
    assert _found_tags(collected) == {
        "canvas-101": "ada", "canvas-102": "john 102", "canvas-103": "john 103", "canvas-104": "grace, late",
        "canvas-105": "alan, LATE", "canvas-106": "marie, latest", "canvas-107": "josé", "canvas-109": "margaret",
        "canvas-111": "mallory"}, collected.problems
    assert set(collected.refused) == {"canvas-108"}
    assert "2 notebooks" in collected.refused["canvas-108"][LESSON]
    assert "none named 01-masks.ipynb" in collected.refused["canvas-108"][LESSON]
    roster = collected.roster
    assert roster["canvas-102"]["name"] == roster["canvas-103"]["name"] == "smithjohn"
    assert roster["canvas-107"]["name"] == "garcíajosé" and roster["canvas-101"]["lms_id"] == "101"
    assert roster["canvas-104"]["note"] == roster["canvas-105"]["note"] == "late"
    assert roster["canvas-101"]["note"] == ""
    assert len(_problem(collected, "an earlier upload", "canvas-106", "01-masks-2.ipynb")) == 2
    assert _problem(collected, "notes.ipynb", "a second notebook for canvas-109")
    assert _problem(collected, "canvas-110 (babbagecharles): no notebook")
    assert _problem(collected, "answers.pdf: not a notebook")
    assert _problem(collected, "canvas-101/01-masks/01-masks.ipynb", "not named as Canvas names")
    if packed != "folder":
        assert _problem(collected, "../../canvas-101", "a path outside the upload")
        assert _problem(collected, "LovelaceAda_101", "second entry")
        assert _problem(collected, "5017", "not a plain file in the zip")
        assert len(_problem(collected, "a second entry of that name")) == 2, collected.problems


def test_a_canvas_notebook_is_named_for_its_lesson_when_several_are_graded(tmp_path):
    """With several lessons graded, the lesson comes from the file's name; a name without one is listed."""
    source = _zip(tmp_path / "c.zip", {"a_1_10_01-masks.ipynb": _nb("a 01"), "a_1_11_02-attention.ipynb": _nb("a 02"),
                                      "b_2_12_Untitled.ipynb": _nb("b")})
    collected = _collect(tmp_path, source, lessons=(LESSON, "02-attention"))
    assert {s: {lesson: _tag(p) for lesson, p in found.items()} for s, found in collected.found.items()} == {
        "canvas-1": {LESSON: "a 01", "02-attention": "a 02"}}
    assert _problem(collected, "b_2_12_Untitled.ipynb", "no lesson id in its name", "--lessons")


# -- Moodle ------------------------------------------------------------------------------------------------------
MOODLE = {
    "Ana López_301_assignsubmission_file_/01-masks.ipynb": _nb("ana"),
    "Ana López_301_assignsubmission_onlinetext_/onlinetext.html": b"<p>hi</p>",
    "John Smith_302_assignsubmission_file_/01-masks.ipynb": _nb("john 302"),
    "John Smith_303_assignsubmission_file_/work/my notebook.ipynb": _nb("john 303"),
    "Émile Zoë_304_assignsubmission_file_/01-masks.ipynb": _nb("émile"),
    "Emmy Noether_305_assignsubmission_file_/a.ipynb": _nb("emmy a"),
    "Emmy Noether_305_assignsubmission_file_/b.ipynb": _nb("emmy b"),
    "Charles Babbage_306_assignsubmission_file_/answers.pdf": b"%PDF",
    "Mallory_307_assignsubmission_file_/John Smith_302_assignsubmission_file_/01-masks.ipynb": _nb("mallory"),
    "Mallory_307_assignsubmission_file_/../John Smith_302_assignsubmission_file_/x.ipynb": _nb("mallory via .."),
    "moodle-302/01-masks/01-masks.ipynb": _nb("mallory as an nbgrader folder"),
}


@pytest.mark.parametrize("folders", [True, False], ids=["folders", "prefixed files"])
def test_moodle_gives_each_participant_their_own_notebook(tmp_path, folders):
    entries = MOODLE if folders else {k.replace("_file_/", "_file_", 1): v for k, v in MOODLE.items()
                                      if k.count("/") == 1 and "onlinetext" not in k}
    collected = _collect(tmp_path, _zip(tmp_path / "moodle.zip", entries))
    assert collected.layout == "moodle"
    expected = {"moodle-301": "ana", "moodle-302": "john 302", "moodle-303": "john 303", "moodle-304": "émile",
                "moodle-307": "mallory"}
    if not folders:
        del expected["moodle-303"], expected["moodle-307"]
    assert _found_tags(collected) == expected, collected.problems
    assert set(collected.refused) == {"moodle-305"} and "2 notebooks" in collected.refused["moodle-305"][LESSON]
    assert collected.roster["moodle-304"]["name"] == "Émile Zoë"
    assert collected.roster["moodle-302"]["name"] == "John Smith" and collected.roster["moodle-301"]["lms_id"] == "301"
    assert _problem(collected, "moodle-306 (Charles Babbage): no notebook")
    if folders:
        assert collected.roster["moodle-303"]["name"] == "John Smith"
        assert _problem(collected, "Mallory_307_assignsubmission_file_/../", "a path outside the upload")
        assert _problem(collected, "onlinetext.html: not a notebook")
        assert _problem(collected, "moodle-302/01-masks/01-masks.ipynb", "not in a Moodle submission")


# -- Gradescope --------------------------------------------------------------------------------------------------
GRADESCOPE_METADATA = """\
submission_1:
  :submitters:
  - :name: Ada Lovelace
    :sid: '1001'
    :email: ada@uni.edu
  :created_at: 2026-11-30 10:00:00 -0800
submission_2:
  :submitters:
  - :name: John Smith
    :sid: '1002'
    :email: john1@uni.edu
submission_3:
  :submitters:
  - :name: John Smith
    :sid: '1003'
    :email: john2@uni.edu
submission_4:
  :submitters:
  - :name: Zoë Émile
    :sid: '1004'
    :email: zoe@uni.edu
  - :name: Bo Without Sid
    :email: Bo@Uni.edu
submission_5:
  :submitters:
  - :name: Emmy Noether
    :sid: '1005'
submission_6:
  :submitters:
  - :name: Charles Babbage
    :sid: '1006'
submission_7:
  :submitters:
  - :name: Twice Listed
    :sid: '1007'
submission_8:
  :submitters:
  - :name: Twice Listed
    :sid: '1007'
submission_9:
  :submitters:
  - :name: Mallory
    :sid: ../../gs-1001
submission_10:
  :submitters:
  - :name: Case One
    :sid: A12
submission_11:
  :submitters:
  - :name: Case Two
    :sid: a12
"""

GRADESCOPE = {
    "submission_metadata.yml": GRADESCOPE_METADATA,
    "submission_1/01-masks.ipynb": _nb("ada"),
    "submission_2/01-masks.ipynb": _nb("john 1002"),
    "submission_3/deep/folder/01-masks.ipynb": _nb("john 1003"),
    "submission_4/01-masks.ipynb": _nb("group 4"),
    "submission_5/a.ipynb": _nb("emmy a"),
    "submission_5/b.ipynb": _nb("emmy b"),
    "submission_6/answers.pdf": b"%PDF",
    "submission_7/01-masks.ipynb": _nb("twice a"),
    "submission_8/01-masks.ipynb": _nb("twice b"),
    "submission_9/01-masks.ipynb": _nb("mallory"),
    "submission_9/../submission_1/01-masks.ipynb": _nb("mallory via .."),
    "submission_10/01-masks.ipynb": _nb("case one"),
    "submission_11/01-masks.ipynb": _nb("case two"),
    "submission_12/01-masks.ipynb": _nb("nobody's"),
}


def test_gradescope_gives_each_submitter_their_own_notebook(tmp_path):
    source = _zip(tmp_path / "gs.zip", {f"assignment_77_export/{k}": v for k, v in GRADESCOPE.items()})
    collected = _collect(tmp_path, source)
    assert collected.layout == "gradescope"
    assert _found_tags(collected) == {
        "gs-1001": "ada", "gs-1002": "john 1002", "gs-1003": "john 1003", "gs-1004": "group 4",
        "gs-bo-uni.edu": "group 4", "gs-..-..-gs-1001": "mallory"}, collected.problems
    assert set(collected.refused) == {"gs-1005", "gs-1007", "gs-A12", "gs-a12"}
    assert "submission_7, submission_8" in collected.refused["gs-1007"][LESSON]
    assert "differ only by case" in collected.refused["gs-a12"][LESSON]
    roster = collected.roster
    assert roster["gs-1004"]["note"] == "group submission_4 with gs-bo-uni.edu"
    assert roster["gs-bo-uni.edu"] == {"lms_id": "bo@uni.edu", "name": "Bo Without Sid", "email": "bo@uni.edu",
                                       "note": "group submission_4 with gs-1004"}
    assert roster["gs-1002"]["name"] == roster["gs-1003"]["name"] == "John Smith"
    assert _problem(collected, "gs-1006 (Charles Babbage): no notebook")
    assert _problem(collected, "submission_12/01-masks.ipynb", "not in a submission folder")


@pytest.mark.parametrize("metadata, why", [
    ("{{{ not yaml", "cannot be read"),
    ("- a list\n- of things\n", "not a mapping of submissions"),
    ("submission_1: &a\n  :submitters: [*a]\n", "no submitter"),  # a submitter that is the record itself
    ("a" * (9 << 20), "over the 8 MB limit"),
])
def test_unreadable_gradescope_metadata_grades_nobody_and_says_why(tmp_path, metadata, why):
    source = _zip(tmp_path / "gs.zip", {"submission_metadata.yml": metadata, "submission_1/01-masks.ipynb": _nb("x")})
    collected = _collect(tmp_path, source)
    assert collected.layout == "gradescope" and not collected.found
    assert _problem(collected, "submission", why), collected.problems


# -- every layout ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, entries", [("canvas", CANVAS), ("moodle", MOODLE), ("gradescope", GRADESCOPE)])
def test_no_two_lms_users_share_a_folder_and_every_id_is_safe(tmp_path, layout, entries):
    """Whatever the names: ids are safe nbgrader ids, unique up to case; each found notebook lies in its own
    student's part of the upload (never a path another student made)."""
    collected = _collect(tmp_path, _zip(tmp_path / "x.zip", entries))
    ids = set(collected.found) | set(collected.refused) | set(collected.roster)
    assert all(intake.STUDENT_ID.match(s) for s in ids), ids
    assert len({s.casefold() for s in collected.found}) == len(collected.found)
    by_path: dict[Path, set[str]] = {}
    for student, lessons in collected.found.items():
        by_path.setdefault(lessons[LESSON], set()).add(student)
    assert all(collected.roster[s]["note"].startswith("group") for group in by_path.values() if len(group) > 1
               for s in group), "two students share a notebook outside a group submission"
    graded = [_tag(path) for path in by_path]
    assert not [tag for tag in graded if tag.startswith(("mallory via", "mallory as", "mallory,"))], graded


@pytest.mark.parametrize("entries, student, why", [
    ({"A B_1_assignsubmission_file_/01-masks.ipynb": _nb("a"), "A B_1_assignsubmission_file_/old/01-masks.ipynb":
      _nb("b"), "C D_2_assignsubmission_file_/01-masks.ipynb": _nb("c")}, "moodle-1", "several named"),
    ({"ab_1_10_first.ipynb": _nb("a"), "ab_1_11_second.ipynb": _nb("b"), "cd_2_12_x.ipynb": _nb("c")},
     "canvas-1", "none named"),
    ({"submission_metadata.yml": "submission_1:\n  :submitters:\n  - {':sid': '9'}\n"
                                 "submission_3:\n  :submitters:\n  - {':sid': '9'}\n"
                                 "submission_2:\n  :submitters:\n  - {':sid': '7'}\n",
      "submission_1/01-masks.ipynb": _nb("a"), "submission_3/01-masks.ipynb": _nb("b"),
      "submission_2/01-masks.ipynb": _nb("c")}, "gs-9", "submission_1, submission_3"),
])
def test_an_ambiguous_upload_is_refused_never_merged_or_picked(tmp_path, entries, student, why):
    """Two candidates the rule cannot order: nothing is graded for that student, the classmate is unaffected."""
    collected = _collect(tmp_path, _zip(tmp_path / "x.zip", entries))
    assert [_tag(found[LESSON]) for found in collected.found.values()] == ["c"], collected.problems
    assert why in collected.refused[student][LESSON]


def test_a_submitter_listed_twice_in_one_gradescope_submission_is_one_student(tmp_path):
    metadata = "submission_1:\n  :submitters:\n  - {':sid': '9', ':name': A}\n  - {':sid': '9', ':name': A}\n"
    source = _zip(tmp_path / "x.zip", {"submission_metadata.yml": metadata, "submission_1/01-masks.ipynb": _nb("a")})
    collected = _collect(tmp_path, source)
    assert _found_tags(collected) == {"gs-9": "a"} and not collected.refused, collected.problems
    assert collected.roster["gs-9"]["note"] == ""


@pytest.mark.parametrize("layout, big, small", [
    ("canvas", "bigbob_1_10_01-masks.ipynb", "ada_2_11_01-masks.ipynb"),
    ("moodle", "Big Bob_1_assignsubmission_file_/01-masks.ipynb", "Ada_2_assignsubmission_file_/01-masks.ipynb"),
])
def test_an_oversized_lms_notebook_costs_only_its_student(tmp_path, layout, big, small):
    """The zip's bounds hold in every layout: the notebook over the limit is not extracted and its student is told
    why; the classmate is graded."""
    source = _zip(tmp_path / "x.zip", {big: _nb("bob") + " " * (3 << 20), small: _nb("ada")})
    collected = _collect(tmp_path, source, max_bytes=2 << 20)
    assert collected.layout == layout and _found_tags(collected) == {f"{layout}-2": "ada"}, collected.problems
    assert "over the 2 MB limit" in collected.refused[f"{layout}-1"][LESSON]
    assert max(p.stat().st_size for p in (tmp_path / "scratch").rglob("*") if p.is_file()) < 1 << 20


def test_an_explicit_layout_is_obeyed_and_an_unknown_one_refused(tmp_path):
    source = _zip(tmp_path / "c.zip", {"lovelaceada_101_5001_01-masks.ipynb": _nb("ada")})
    assert set(_collect(tmp_path / "a", source).found) == {"canvas-101"}
    assert set(_collect(tmp_path / "b", source, layout="flat").found) == {"lovelaceada"}  # the old reading
    assert not _collect(tmp_path / "c", source, layout="moodle").found
    with pytest.raises(ValueError, match="unknown layout"):
        _collect(tmp_path / "d", source, layout="blackboard")


def test_the_roster_csv_escapes_what_the_lms_gave(tmp_path):
    roster = {"moodle-1": {"lms_id": "1", "name": "=HYPERLINK(\"x\")\x1b[2J", "email": "", "note": "late"}}
    pipeline.write_roster(tmp_path / "roster.csv", roster)
    rows = list(csv.reader(io.StringIO((tmp_path / "roster.csv").read_text())))
    assert rows == [["student", "lms_id", "name", "email", "note"],
                    ["moodle-1", "1", "'=HYPERLINK(\"x\")\\x1b[2J", "", "late"]]


# -- end to end --------------------------------------------------------------------------------------------------
@pytest.mark.pipeline
def test_course_grade_gives_every_canvas_student_their_own_grade(tmp_path):
    """``./course grade canvas.zip``: same display name, a late one, a re-upload (the older one untouched, the
    latest solved), an accented name; each gets their own row in grades.csv and their own feedback page."""
    from autograder.__main__ import main

    perfect, untouched = nbformat.writes(samples.perfect(LESSON)), nbformat.writes(samples.untouched(LESSON))
    source = _zip(tmp_path / "canvas.zip", {
        "smithjohn_201_7001_01-masks.ipynb": perfect,
        "smithjohn_202_7002_01-masks.ipynb": untouched,
        "hoppergrace_LATE_203_7003_01-masks.ipynb": perfect,
        "curiemarie_204_7004_01-masks.ipynb": untouched,
        "curiemarie_204_7009_01-masks-1.ipynb": perfect,
        "garcíajosé_205_7005_Untitled.ipynb": untouched,
    })
    work = tmp_path / "work"
    assert main(["grade", str(source), "--work", str(work), "--lessons", LESSON, "--workers", "1"]) == 0
    rows = list(csv.DictReader(open(work / "grades.csv")))
    scores = {row["student"]: (float(row["score"]), float(row["max_score"])) for row in rows}
    assert len(rows) == len(scores) == 5, rows
    full = scores["canvas-201"][1]
    assert full > 0 and all(row["status"] == "ok" for row in rows), rows
    assert scores == {"canvas-201": (full, full), "canvas-202": (0.0, full), "canvas-203": (full, full),
                      "canvas-204": (full, full), "canvas-205": (0.0, full)}
    roster = {row["student"]: row for row in csv.DictReader(open(work / "roster.csv"))}
    assert roster["canvas-201"]["name"] == roster["canvas-202"]["name"] == "smithjohn"
    assert roster["canvas-203"]["note"] == "late" and roster["canvas-205"]["name"] == "garcíajosé"
    assert all((work / "feedback" / s / LESSON / f"{LESSON}.html").is_file() for s in scores)
    problems = json.loads((work / "problems.json").read_text())
    assert any("an earlier upload" in p and "canvas-204" in p for p in problems), problems
