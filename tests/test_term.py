"""The term (autograder/term/schedule.py) and when a notebook counts as submitted, without grading anything.

Parsing: each mistake in a term file is an error naming the key and what to write. Dates: local times in the
term's zone (winter and summer time), offsets kept, a day alone meaning its end, extensions in days and as dates.
The late policy at its edges: the grace, each day or part of one, the cap, the cutoff, "zero after the due date".
When a lesson closes. The late-penalty plugin and the gradebook sync nbgrader runs (autograder/term/late.py). Intake:
``timestamp.txt`` written by the rule, a zip entry's time read in the term's zone, and a ``timestamp.txt`` a student
uploaded in an LMS export never read. A bad term stops ``./course grade`` before anything is graded.
"""

import copy
import os
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import parse_utc

from autograder.__main__ import main
from autograder.grading import grade_class, pipeline
from autograder.intake import submissions as intake
from autograder.term import late
from autograder.term import schedule as term

GOOD = {
    "timezone": "Europe/Berlin",
    "late": {"grace_minutes": 10, "percent_per_day": 10, "max_percent": 50, "cutoff_days": 7},
    "lessons": {"01-masks": {"release": datetime(2027, 1, 11, 9), "due": datetime(2027, 1, 18, 23, 59)},
                "02-attention": {"due": datetime(2027, 7, 18, 23, 59)}},
    "extensions": {"alice": {"02-attention": 3}, "bob": {"01-masks": datetime(2027, 1, 21, 12)}},
}


def _with(path: str, value) -> dict:
    """GOOD with one key (``a.b.c``) set to ``value`` (``...`` removes it)."""
    data = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    table = data
    for part in parents:
        table = table[part]
    if value is ...:
        del table[last]
    else:
        table[last] = value
    return data


# -- reading a term ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path, value, words", [
    ("holidays", [], ["unknown key(s) holidays"]),
    ("timezone", "Mars/Olympus", ["timezone 'Mars/Olympus'", "IANA name"]),
    ("timezone", 2, ["timezone 2"]),
    ("late", "strict", ["late must be a table"]),
    ("late.percent", 10, ["unknown key(s) in [late]: percent", "percent_per_day"]),
    ("late.percent_per_day", ..., ["[late] percent_per_day is missing"]),
    ("late.cutoff_days", ..., ["[late] cutoff_days is missing"]),
    ("late.percent_per_day", 120, ["[late] percent_per_day = 120", "from 0 to 100"]),
    ("late.grace_minutes", -5, ["[late] grace_minutes = -5", "at least 0"]),
    ("late.max_percent", True, ["[late] max_percent = True"]),
    ("late.cutoff_days", "a week", ["[late] cutoff_days = 'a week'"]),
    ("lessons", {}, ["no [lessons]"]),
    ("lessons.99-magic", {"due": datetime(2027, 1, 1)}, ["[lessons] '99-magic' is not a lesson", "01-masks"]),
    ("lessons.01-masks", {"release": datetime(2027, 1, 1)}, ["[lessons] 01-masks needs due"]),
    ("lessons.01-masks", {"due": datetime(2027, 1, 1), "closes": datetime(2027, 2, 1)}, ["01-masks needs due"]),
    ("lessons.01-masks", {"due": "next monday"}, ["[lessons] 01-masks.due = 'next monday' is not a date"]),
    ("lessons.01-masks", {"release": datetime(2027, 2, 1), "due": datetime(2027, 1, 1)}, ["is released", "after"]),
    ("extensions", [1], ["extensions must be a table"]),
    ("extensions.carol", 3, ["[extensions] carol = 3", '{ "01-masks" = 3 }']),
    ("extensions.carol", {"03-multi-head": 2}, ["[extensions] carol: '03-multi-head' is not a lesson of this term"]),
    ("extensions.carol", {"01-masks": 0}, ["[extensions] carol.01-masks = 0", "positive number of days"]),
    ("extensions.carol", {"01-masks": datetime(2027, 1, 18, 12)}, ["[extensions] carol.01-masks", "is not after"]),
    ("extensions.carol", {"01-masks": "soon"}, ["[extensions] carol.01-masks = 'soon' is not a date"]),
])
def test_a_mistake_in_a_term_names_its_key(path, value, words):
    with pytest.raises(term.TermError) as caught:
        term.parse(_with(path, value), "term.toml")
    message = str(caught.value)
    assert message.startswith("term.toml: ")
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("text, words", [
    (b"timezone = \n", ["is not valid TOML", "2027-01-18T23:59:00"]),
    (b"\xff\xfe", ["is not valid TOML"]),
    (b"#" * ((1 << 20) + 1), ["is over 1024 kB"]),
])
def test_a_term_file_that_cannot_be_read_says_why(tmp_path, text, words):
    path = tmp_path / "term.toml"
    path.write_bytes(text)
    with pytest.raises(term.TermError) as caught:
        term.load(path)
    assert all(word in str(caught.value) for word in words) and str(path) in str(caught.value)
    with pytest.raises(term.TermError, match="cannot read the term file"):
        term.load(tmp_path / "missing.toml")


def test_local_times_are_read_in_the_term_s_zone_and_offsets_kept():
    t = term.parse(GOOD)
    assert t.zone == ZoneInfo("Europe/Berlin")
    assert t.due("01-masks") == datetime(2027, 1, 18, 22, 59, tzinfo=UTC)  # winter: UTC+1
    assert t.due("02-attention") == datetime(2027, 7, 18, 21, 59, tzinfo=UTC)  # summer: UTC+2
    assert t.release("01-masks") == datetime(2027, 1, 11, 8, tzinfo=UTC)
    assert t.release("02-attention") == t.due("02-attention")  # no release date: released when due
    offset = datetime(2027, 1, 18, 23, 59, tzinfo=ZoneInfo("America/New_York"))
    t = term.parse(_with("lessons.01-masks", {"due": offset}))
    assert t.due("01-masks") == datetime(2027, 1, 19, 4, 59, tzinfo=UTC)
    utc = term.parse(_with("timezone", ...))
    assert utc.zone == ZoneInfo("UTC") and utc.due("01-masks") == datetime(2027, 1, 18, 23, 59, tzinfo=UTC)


def test_a_day_alone_means_its_end_in_the_term_s_zone():
    from datetime import date

    t = term.parse(_with("lessons.01-masks", {"due": date(2027, 1, 18)}))
    assert t.due("01-masks") == datetime(2027, 1, 18, 22, 59, 59, tzinfo=UTC)
    t = term.parse(_with("extensions.carol", {"01-masks": date(2027, 1, 20)}))
    assert t.due("01-masks", "carol") == datetime(2027, 1, 20, 22, 59, 59, tzinfo=UTC)


def test_extensions_in_days_and_as_dates():
    t = term.parse(GOOD)
    assert t.due("02-attention", "alice") == t.due("02-attention") + timedelta(days=3)
    assert t.extension("02-attention", "alice") == timedelta(days=3)
    assert t.due("01-masks", "bob") == datetime(2027, 1, 21, 11, tzinfo=UTC)
    assert t.extension("01-masks", "bob") == datetime(2027, 1, 21, 11, tzinfo=UTC) - t.due("01-masks")
    assert t.extension("01-masks", "alice") is None and t.due("01-masks", "alice") == t.due("01-masks")
    assert t.due("03-multi-head", "alice") is None and t.extension("03-multi-head", "alice") is None
    half = term.parse(_with("extensions.carol", {"01-masks": 0.5}))
    assert half.extension("01-masks", "carol") == timedelta(hours=12)
    late_by = t.seconds_late("01-masks", "bob", datetime(2027, 1, 21, 12, tzinfo=UTC))
    assert late_by == 3600 and t.seconds_late("01-masks", "bob", datetime(2027, 1, 20, tzinfo=UTC)) == 0
    assert t.seconds_late("03-multi-head", "bob", datetime(2030, 1, 1, tzinfo=UTC)) == 0


# -- the late policy ---------------------------------------------------------------------------------------------
POLICY = term.LatePolicy(grace=timedelta(minutes=10), percent_per_day=10, max_percent=50, cutoff=timedelta(days=7))
MINUTE, DAY = 60, 86400


@pytest.mark.parametrize("policy, seconds, percent", [
    (POLICY, 0, 0),
    (POLICY, 10 * MINUTE, 0),  # the grace's last second
    (POLICY, 10 * MINUTE + 1, 10),  # past it: a part of a day is a day
    (POLICY, DAY, 10),
    (POLICY, DAY + 1, 20),
    (POLICY, 4 * DAY + 1, 50),  # 50%: at the cap
    (POLICY, 6 * DAY, 50),  # 60%, capped
    (POLICY, 7 * DAY + 10 * MINUTE, 50),  # the cutoff's last second (it counts from the grace's end)
    (POLICY, 7 * DAY + 10 * MINUTE + 1, 100),
    (term.LatePolicy(percent_per_day=0, cutoff=timedelta(0)), 1, 100),  # zero after the due date
    (term.LatePolicy(grace=timedelta(hours=1), percent_per_day=0, cutoff=timedelta(0)), 3600, 0),
    (term.LatePolicy(percent_per_day=0, cutoff=timedelta(days=2)), 2 * DAY, 0),  # no penalty, then a cutoff
    (term.LatePolicy(percent_per_day=0, cutoff=timedelta(days=2)), 2 * DAY + 1, 100),
    (term.LatePolicy(percent_per_day=25, cutoff=timedelta(days=30)), 5 * DAY, 100),  # no cap: up to all of it
])
def test_the_percentage_lost_at_the_policy_s_edges(policy, seconds, percent):
    assert policy.percent(seconds) == percent
    assert policy.penalty(8.0, seconds) == pytest.approx(8.0 * percent / 100)


def test_a_penalty_is_never_more_than_the_score_nor_less_than_zero():
    assert POLICY.penalty(0.0, 30 * DAY) == 0
    assert POLICY.penalty(3.0, 30 * DAY) == 3.0
    assert POLICY.penalty(3.0, -5) == 0


@pytest.mark.parametrize("policy, words", [
    (POLICY, ["10% of its score per day or part of one after a grace of 10 min", "at most 50%",
              "scores zero from 7 days after the due date"]),
    (term.LatePolicy(percent_per_day=0, cutoff=timedelta(0)), ["submitted after its due date scores zero"]),
    (term.LatePolicy(grace=timedelta(hours=2), percent_per_day=0, cutoff=timedelta(days=1)),
     ["loses nothing until 1 day after the due date after a grace of 2 h, then scores zero"]),
])
def test_the_policy_described_in_one_sentence(policy, words):
    assert all(word in policy.describe() for word in words), policy.describe()


def test_a_lesson_closes_after_its_latest_due_date_the_grace_and_the_cutoff():
    t = term.parse(GOOD)
    assert t.closes("01-masks") == datetime(2027, 1, 21, 11, tzinfo=UTC) + timedelta(days=7, minutes=10)  # bob's
    assert t.closes("02-attention") == t.due("02-attention", "alice") + timedelta(days=7, minutes=10)
    assert t.closes("03-multi-head") is None and not t.is_closed("03-multi-head", datetime(2100, 1, 1))
    assert not t.is_closed("01-masks", t.closes("01-masks") - timedelta(seconds=1))
    assert t.is_closed("01-masks", t.closes("01-masks"))
    zero = term.parse(_with("late", {"percent_per_day": 0, "cutoff_days": 0}))
    assert zero.closes("02-attention") == zero.due("02-attention", "alice")


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (59, "59 s"), (60, "1 min"), (11 * 60 + 19, "11 min 19 s"), (11 * 60 + 19.9, "11 min 19 s"),
    (3599, "59 min 59 s"), (3600, "1 h"), (3660, "1 h 1 min"), (3719, "1 h 1 min"), (86400, "1 day"),
    (2 * 86400 + 7200, "2 days 2 h"), (86400 + 59, "1 day"), (3 * 86400 - 1, "2 days 23 h 59 min"),
])
def test_how_late_is_written_for_people_never_more_than_it_was(seconds, text):
    assert term.shown_span(seconds) == text


@pytest.mark.parametrize("moment, zone, text", [
    (datetime(2027, 1, 25, 22, 59, tzinfo=UTC), "Europe/Berlin", "2027-01-25 23:59 CET (22:59 UTC)"),
    (datetime(2027, 7, 25, 21, 59, tzinfo=UTC), "Europe/Berlin", "2027-07-25 23:59 CEST (21:59 UTC)"),
    (datetime(2027, 1, 25, 22, 59, tzinfo=UTC), "America/New_York", "2027-01-25 17:59 EST (22:59 UTC)"),
    (datetime(2027, 1, 25, 22, 59, tzinfo=UTC), "UTC", "2027-01-25 22:59 UTC"),
    (datetime(2027, 1, 25, 22, 59, tzinfo=UTC), None, "2027-01-25 22:59 UTC"),
])
def test_times_are_shown_in_the_term_s_zone_with_utc_beside(moment, zone, text):
    assert term.shown_time(moment, ZoneInfo(zone) if zone else None) == text


# -- which term nbgrader's steps use, and the steps ------------------------------------------------------------------
def test_the_configured_term_explicit_default_or_none(tmp_path, monkeypatch):
    path = tmp_path / "term.toml"
    path.write_text('[late]\npercent_per_day = 10\ncutoff_days = 7\n[lessons]\n"01-masks" = { due = 2027-01-18 }\n')
    monkeypatch.delenv(term.ENV_VAR, raising=False)
    config = pipeline.nbgrader_config(tmp_path / "work", term_file=path)
    step = late.TermLatePenalties(config=config)
    assert term.from_config(step).path == path.resolve()
    assert term.from_config(late.TermLatePenalties(config=pipeline.nbgrader_config(tmp_path / "w", term_file="")))\
        is None
    unset = pipeline.nbgrader_config(tmp_path / "w2")
    monkeypatch.setenv(term.ENV_VAR, str(path))
    assert term.from_config(late.TermLatePenalties(config=unset)).path == path  # the default: the environment's
    assert pipeline.term_file_of(None) == str(path.resolve()) and pipeline.term_file_of("") == ""
    assert term.configured("") is None and term.configured(None).path == path  # "": none, whatever the default
    # nbgrader's own AssignLatePenalties, configured so, uses the term's policy too
    from nbgrader.preprocessors import AssignLatePenalties

    plugin = AssignLatePenalties(config=config).plugin_class(parent=step)
    assert plugin.late_submission_penalty("ada", 4.0, 86400 + 1) == pytest.approx(0.8)
    assert plugin.late_submission_penalty("ada", 4.0, 0) is None
    no_term = pipeline.nbgrader_config(tmp_path, term_file="")
    nothing = late.TermLatePolicy(parent=late.TermLatePenalties(config=no_term))
    assert nothing.late_submission_penalty("ada", 4.0, 30 * DAY) is None
    # nbgrader's own tools (the CLI, formgrader): the same step, the term from the environment
    from traitlets.config import Config

    monkeypatch.setenv("DECODER_COURSE_WORK", str(tmp_path / "tools"))
    tools = pipeline.tools_config(Config())
    assert late.TermLatePenalties in tools.Autograde.autograde_preprocessors
    assert not [step for step in tools.Autograde.autograde_preprocessors if step is AssignLatePenalties]
    assert term.from_config(late.TermLatePenalties(config=tools)).path == path


def test_a_dask_worker_grades_by_the_instructor_s_term_never_its_own(tmp_path, monkeypatch):
    """The term's bytes travel with each task: a worker whose checkout or environment names another term (or none)
    still gives the instructor's penalties and feedback; a task without a term is graded without one."""
    from dataclasses import asdict

    from autograder.grading import cluster as distributed

    text = '[late]\npercent_per_day = {}\ncutoff_days = 7\n[lessons]\n"01-masks" = {{ due = 2027-01-18 }}\n'
    own = tmp_path / "own.toml"
    own.write_text(text.format(50))
    monkeypatch.setenv(term.ENV_VAR, str(own))
    for sent, percent in ((text.format(10).encode(), 10), (None, None)):
        scratch = tmp_path / f"task-{percent}"
        scratch.mkdir()
        task = {"verbose": False, "sandbox": False, "limits": asdict(pipeline.Limits()), "term": sent}
        config = distributed._worker_api(scratch, task).config
        found = term.from_config(late.TermLatePenalties(config=config))
        assert (found and found.late.percent_per_day) == percent


def test_the_gradebook_follows_the_term_due_dates_and_extensions(tmp_path):
    """sync_gradebook (what TermLatePenalties and prepare run): the assignment's due date, the student's extension,
    an extension taken out of the term taken out of the gradebook; a lesson not in the term left as it is."""
    t = term.parse(GOOD)
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    hand_set = datetime(2030, 1, 1)
    with Gradebook(url) as gb:
        for lesson in ("01-masks", "02-attention", "03-multi-head"):
            gb.update_or_create_assignment(lesson, duedate=hand_set)
        for student in ("alice", "bob"):
            gb.update_or_create_student(student)
            gb.update_or_create_submission("02-attention", student, timestamp=datetime(2027, 7, 20))
        gb.grant_extension("02-attention", "bob", days=9)
        for lesson in ("01-masks", "02-attention", "03-multi-head"):
            late.sync_gradebook(gb, t, lesson)
        for student in ("alice", "bob"):
            late.sync_gradebook(gb, t, "02-attention", student)
            late.sync_gradebook(gb, t, "01-masks", student)  # no submission: nothing to write
    with Gradebook(url) as gb:
        assert gb.find_assignment("01-masks").duedate == datetime(2027, 1, 18, 22, 59)
        assert gb.find_assignment("03-multi-head").duedate == hand_set
        alice, bob = (gb.find_submission("02-attention", s) for s in ("alice", "bob"))
        assert alice.extension == timedelta(days=3) and alice.duedate == datetime(2027, 7, 21, 21, 59)
        assert bob.extension is None and bob.duedate == datetime(2027, 7, 18, 21, 59)
        assert alice.total_seconds_late == 0 and bob.total_seconds_late == DAY + 2 * 3600 + 60
    with Gradebook(url) as gb:
        late.sync_gradebook(gb, None, "01-masks", "alice")  # no term: nothing changes
        assert gb.find_assignment("01-masks").duedate == datetime(2027, 1, 18, 22, 59)


# -- when a notebook was submitted (intake) ----------------------------------------------------------------------
LESSON = "01-masks"
FORGED = "2020-01-01 00:00:00.000000 UTC"
ENTRY_TIME = (2027, 1, 18, 23, 30, 0)  # a zip entry's date and time, no zone


def _notebook() -> str:
    return nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("answer")]))


def _zip(path: Path, entries: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=ENTRY_TIME), data)
    return path


GRADESCOPE_META = "submission_301:\n  :submitters:\n  - :name: Ada\n    :sid: '301'\n"


@pytest.mark.parametrize("layout, entries, forged_kept", [
    ("canvas", {"lovelaceada_101_5001_01-masks.ipynb": _notebook()}, False),
    ("moodle", {"Ada Lovelace_201_assignsubmission_file_/01-masks/01-masks.ipynb": _notebook(),
                "Ada Lovelace_201_assignsubmission_file_/01-masks/timestamp.txt": FORGED}, False),
    ("gradescope", {"submission_metadata.yml": GRADESCOPE_META, "submission_301/01-masks/01-masks.ipynb": _notebook(),
                    "submission_301/01-masks/timestamp.txt": FORGED}, False),
    ("nbgrader", {"ada/01-masks/01-masks.ipynb": _notebook(), "ada/01-masks/timestamp.txt": FORGED}, True),
])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "UTC"])
def test_a_zipped_submission_is_dated_by_its_entry_in_the_term_s_zone(tmp_path, layout, entries, forged_kept, zone):
    """A zip stores an entry's time without a zone: it is read in the term's. A ``timestamp.txt`` is nbgrader's
    only in nbgrader's layout; in an LMS export the student uploaded it, and it is never read."""
    collected = intake.collect_submissions(_zip(tmp_path / "export.zip", entries), [LESSON], tmp_path / "scratch",
                                           zone=ZoneInfo(zone))
    assert collected.layout == layout, collected.problems
    [(student, found)] = [(s, lessons[LESSON]) for s, lessons in collected.found.items()]
    assert ((student, LESSON) in collected.exchange) == forged_kept
    intake.place(tmp_path / "submitted", student, LESSON, found, 16 << 20, (student, LESSON) in collected.exchange)
    written = (tmp_path / "submitted" / student / LESSON / "timestamp.txt").read_text()
    if forged_kept:
        assert written == FORGED
    else:
        assert parse_utc(written) == datetime(*ENTRY_TIME, tzinfo=ZoneInfo(zone)).astimezone(UTC).replace(tzinfo=None)


@pytest.mark.parametrize("created_at, expected", [
    ("2027-01-18 14:02:03.123456789 -08:00", datetime(2027, 1, 18, 22, 2, 3, 123456)),  # Gradescope's own form
    ("'2027-01-18T22:02:03Z'", datetime(2027, 1, 18, 22, 2, 3)),  # a string
    ("2027-01-18 23:02:03", datetime(2027, 1, 18, 22, 2, 3)),  # no zone: the term's (Berlin, +01:00)
    ("not a time", datetime(*ENTRY_TIME, tzinfo=ZoneInfo("Europe/Berlin")).astimezone(UTC).replace(tzinfo=None)),
])
@pytest.mark.parametrize("packed", ["zip", "folder"])
def test_a_gradescope_submission_is_dated_by_gradescope_s_own_time(tmp_path, created_at, expected, packed):
    """Gradescope's metadata says when each submission was made (``:created_at``): that dates it, not the export's
    file times; a value that is not a time leaves the file's. The instructor's folder is never touched."""
    meta = GRADESCOPE_META + f"  :created_at: {created_at}\n"
    entries = {"submission_metadata.yml": meta, "submission_301/01-masks.ipynb": _notebook()}
    source = _zip(tmp_path / "export.zip", entries)
    if packed == "folder":
        with zipfile.ZipFile(source) as archive:
            archive.extractall(tmp_path / "export")
        for path in (tmp_path / "export").rglob("*"):
            moment = datetime(*ENTRY_TIME, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
            os.utime(path, (moment, moment))
        source = tmp_path / "export"
    before = {p: p.stat().st_mtime_ns for p in source.rglob("*")} if source.is_dir() else {}
    collected = intake.collect_submissions(source, [LESSON], tmp_path / "scratch", zone=ZoneInfo("Europe/Berlin"))
    assert collected.layout == "gradescope", collected.problems
    found = collected.found["gs-301"][LESSON]
    intake.place(tmp_path / "submitted", "gs-301", LESSON, found, 16 << 20, False)
    assert parse_utc((tmp_path / "submitted" / "gs-301" / LESSON / "timestamp.txt").read_text()) == expected
    assert {p: p.stat().st_mtime_ns for p in source.rglob("*")} == before if source.is_dir() else True


def test_a_folder_submission_is_dated_by_its_file_unless_nbgrader_s_layout_has_a_timestamp(tmp_path):
    """nbgrader's layout: the checked timestamp.txt beside the notebook, else the notebook's modification time (a
    malformed timestamp.txt is not one); a flat file in a folder named for the lesson: its modification time,
    whatever lies beside it."""
    when = datetime(2027, 1, 19, 3, 4, 5, tzinfo=UTC)
    cases = {"with": (True, "2027-01-18 10:00:00.000000 UTC", "2027-01-18 10:00:00.000000 UTC"),
             "without": (True, None, term.timestamp_text(when)),
             "malformed": (True, "yesterday", term.timestamp_text(when)),
             "flat": (False, FORGED, term.timestamp_text(when))}
    for student, (exchange, beside, expected) in cases.items():
        folder = tmp_path / "in" / student / LESSON
        folder.mkdir(parents=True)
        notebook = folder / f"{LESSON}.ipynb"
        notebook.write_text(_notebook())
        if beside is not None:
            (folder / "timestamp.txt").write_text(beside)
        os.utime(notebook, (when.timestamp(), when.timestamp()))
        intake.place(tmp_path / "submitted", student, LESSON, notebook, 16 << 20, exchange)
        assert (tmp_path / "submitted" / student / LESSON / "timestamp.txt").read_text() == expected, student


# -- a term that cannot be used stops grading before it starts ----------------------------------------------------
def test_a_bad_term_stops_grading_before_anything_is_graded(tmp_path, capsys):
    bad = tmp_path / "term.toml"
    bad.write_text('[late]\npercent_per_day = 10\n[lessons]\n"01-masks" = { due = 2027-01-18 }\n')
    (tmp_path / "in").mkdir()
    with pytest.raises(term.TermError, match="cutoff_days is missing"):
        grade_class.grade(tmp_path / "in", tmp_path / "work", ["01-masks"], term_file=bad)
    assert not (tmp_path / "work").exists()
    assert main(["grade", str(tmp_path / "in"), "--work", str(tmp_path / "work2"), "--term", str(bad)]) == 2
    assert "cutoff_days is missing" in capsys.readouterr().err and not (tmp_path / "work2").exists()
    assert main(["grade", str(tmp_path / "in"), "--work", str(tmp_path / "work2"), "--term",
                 str(tmp_path / "none.toml")]) == 2
    assert "cannot read the term file" in capsys.readouterr().err


def test_an_empty_term_option_means_no_term_whatever_the_default(tmp_path, capsys, monkeypatch):
    """``--term ""`` grades without a term even where $DECODER_COURSE_TERM names one (it was read as the folder
    ".", and grading stopped on "cannot read the term file")."""
    bad = tmp_path / "term.toml"
    bad.write_text('[late]\npercent_per_day = 10\n')
    monkeypatch.setenv(term.ENV_VAR, str(bad))
    (tmp_path / "in").mkdir()
    assert main(["grade", str(tmp_path / "in"), "--work", str(tmp_path / "work"), "--term", ""]) == 2
    said = capsys.readouterr().err
    assert "cutoff_days" not in said and "term file" not in said and "no notebook to grade" in said, said
    assert main(["grade", str(tmp_path / "in"), "--work", str(tmp_path / "work")]) == 2  # the default: that term
    assert "cutoff_days is missing" in capsys.readouterr().err


def test_the_term_s_schedule_shows_its_own_clock_with_utc_beside():
    """``./course term`` of a term written in Europe/Berlin: its dates as written there (the issue found UTC)."""
    from autograder.term import integrity

    table = integrity.schedule(term.parse(GOOD), datetime(2027, 1, 12, tzinfo=UTC))
    assert "2027-01-18 23:59 CET (22:59 UTC)" in table  # 01-masks' due date, as the term file writes it
    assert "now: 2027-01-12 01:00 CET (00:00 UTC)" in table
