"""Lesson integrity during a term (autograder/term/integrity.py): a release withholds every graded answer of a lesson
still
open, refuses one that holds any, grading still runs the course's blocks, and feedback that ran them waits.

The unit tests run over every given cell of every lesson; the release tests make real releases through nbgrader (a
few seconds each); one grading run (module fixture) grades lesson 02 of a three-lesson term."""

from __future__ import annotations

import csv
import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory

from autograder.__main__ import main
from autograder.course import lessons, notebooks
from autograder.grading import grade_class, pipeline
from autograder.term import integrity
from autograder.term import schedule as term
from decoder_course import earlier
from tests.conftest import NOW

ROOT = Path(__file__).resolve().parent.parent


def _term(tmp_path: Path, dates: dict[str, tuple[datetime, datetime]], extensions: str = "",
          cutoff_days: float = 2) -> Path:
    """A term file of ``lesson -> (release, due)`` (UTC), 10% a day, at most 50%, zero after ``cutoff_days``."""
    lines = ['timezone = "UTC"', "[late]", "grace_minutes = 0", "percent_per_day = 10", "max_percent = 50",
             f"cutoff_days = {cutoff_days}", "[lessons]"]
    lines += [f'"{lesson}" = {{ release = {release:%Y-%m-%dT%H:%M:%S}, due = {due:%Y-%m-%dT%H:%M:%S} }}'
              for lesson, (release, due) in dates.items()]
    path = tmp_path / "term.toml"
    path.write_text("\n".join(lines) + "\n[extensions]\n" + extensions)
    return path


def _given_cells(lesson: str):
    nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
    return [(i, list(c.metadata.course["given"])) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "given" in c.metadata.get("course", {})]


EVERY_GIVEN = [(lesson, index, names) for lesson in lessons.ids() for index, names in _given_cells(lesson)]
WEEK = timedelta(days=7)
# lessons 01-03 one week apart: 01 due a week ago (closes in the past with a 2-day cutoff), 02 due yesterday
# (closes tomorrow), 03 due in six days
TERM3 = {"01-masks": (NOW - 2 * WEEK, NOW - WEEK), "02-attention": (NOW - WEEK, NOW - timedelta(days=1)),
         "03-multi-head": (NOW - timedelta(days=1), NOW + timedelta(days=6))}


# -- what is withheld ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lesson,index,names", EVERY_GIVEN, ids=[f"{l}-cell{i}" for l, i, _ in EVERY_GIVEN])
def test_a_stand_in_holds_no_line_of_what_it_withholds(lesson, index, names):
    """Every given cell, every lesson open: its stand-in has no line of a withheld answer, loads exactly the
    withheld answers from the student's own notebook, stubs the ports, and keeps the helpers."""
    all_open = term.parse({"late": {"percent_per_day": 0, "cutoff_days": 0},
                           "lessons": {other: {"due": NOW + WEEK} for other in lessons.ids()}})
    held = integrity.withheld(all_open, NOW, lesson, names)
    prints = integrity.fingerprints()
    source = integrity.stand_in(all_open, lesson, names, held)
    compile(source, f"{lesson} cell {index}", "exec")  # Python, as released
    for w in held:
        leaked = [line for line in source.splitlines() if line.strip() in prints[w.of]]
        assert not leaked, f"{lesson} cell {index}: the stand-in shows {w.of}'s answer: {leaked[:2]}"
        if w.port:
            assert f"def {w.name}(" in source and "raise NotImplementedError" in source
        else:
            assert f"use_your_own({w.of!r}," in source and repr(w.name) in source
    kept = {name for _, name in notebooks.given_names(lesson, names)} - {w.name for w in held}
    for name in kept:
        assert f"def {name}(" in source or f"class {name}(" in source or f"class {name}:" in source, name
    answers = integrity.answers(lesson, names)
    assert held == answers  # every lesson open: every answer is withheld


@pytest.mark.parametrize("moment,withheld", [
    (NOW - 10 * WEEK, {"split_heads", "merge_heads", "MultiHeadAttention", "attention"}),  # 02 open too: its port
    (NOW + 5 * timedelta(days=1), {"split_heads", "merge_heads", "MultiHeadAttention"}),  # before it
    (NOW + timedelta(days=7), {"split_heads", "merge_heads", "MultiHeadAttention"}),  # late, within the cutoff
    (NOW + timedelta(days=8, hours=1), {"split_heads", "merge_heads", "MultiHeadAttention"}),  # bob's extension
    (NOW + timedelta(days=10, hours=1), set()),  # past bob's extended due date and the cutoff: closed
])
def test_what_is_withheld_follows_due_dates_extensions_and_the_cutoff(tmp_path, moment, withheld):
    path = _term(tmp_path, TERM3, extensions='bob = { "03-multi-head" = 2 }')
    names = ["multi_head:split_heads", "merge_heads", "attention", "MultiHeadAttention", "load_from_torch_mha"]
    held = integrity.withheld(term.load(path), moment, "05-decoder-layer", names)
    assert {w.name for w in held} == withheld
    due = TERM3["03-multi-head"][1].replace(microsecond=0)
    assert term.load(path).closes("03-multi-head") == due + timedelta(days=4)  # bob's 2 days, then the cutoff


def test_a_port_is_withheld_with_its_lesson_and_a_lesson_outside_the_term_is_not(tmp_path):
    t = term.load(_term(tmp_path, TERM3))
    assert [w.name for w in integrity.withheld(t, NOW, "03-multi-head", ["attention"])] == ["attention"]
    assert integrity.withheld(t, NOW + 3 * timedelta(days=1), "03-multi-head", ["attention"]) == []  # 02 closed
    # 04 and later are not in this term: not graded, so nothing of theirs is withheld
    assert integrity.withheld(t, NOW, "06-model", ["cross_attention:CrossAttention"]) == []
    assert integrity.withheld(None, NOW, "05-decoder-layer", ["multi_head:MultiHeadAttention"]) == []


# -- releases ------------------------------------------------------------------------------------------------------
def _cells(folder: Path, lesson: str):
    return nbformat.read(folder / lesson / f"{lesson}.ipynb", as_version=4).cells


def test_a_term_release_withholds_open_answers_and_shows_closed_ones(tmp_path):
    path = _term(tmp_path, TERM3)
    out = tmp_path / "release"
    done = pipeline.release(None, out, work=tmp_path / "work", term_file=path, as_of=NOW)
    assert done == ["01-masks", "02-attention", "03-multi-head"]  # released by now, and nothing else
    assert not (out / "04-cross-attention").exists()
    prints = integrity.fingerprints()
    # 01 closed a week ago (+2 days cutoff): lesson 02 shows its masks as code
    masks = [c for c in _cells(out, "02-attention") if "given" in c.metadata.get("course", {})]
    assert masks and "def causal_mask" in masks[0].source and "use_your_own" not in masks[0].source
    # 02 is open (due yesterday, cutoff tomorrow): lesson 03's ported attention is a stub to fill, editable
    ported = [c for c in _cells(out, "03-multi-head") if c.metadata.get("course", {}).get("given") == ["attention"]]
    assert ported and "raise NotImplementedError" in ported[0].source and ported[0].metadata["editable"] is True
    assert ported[0].metadata["nbgrader"]["locked"] is True  # grading puts the course's code back
    assert not any(line.strip() in prints["02-attention"] for line in ported[0].source.splitlines())
    # the same term a week later: 02 closed, the course's attention is shown
    later = pipeline.release(["03-multi-head"], out, work=tmp_path / "work2", term_file=path,
                             as_of=NOW + WEEK)
    assert later == ["03-multi-head"]
    shown = [c for c in _cells(out, "03-multi-head") if c.metadata.get("course", {}).get("given") == ["attention"]]
    assert "raise NotImplementedError" not in shown[0].source and "torch.softmax" in shown[0].source
    # each lesson's answers went out with the first release that showed them, and that moment is kept
    assert integrity.handed_out(integrity.ledger_of(out)) == {
        "01-masks": (NOW, "the release of 02-attention"), "02-attention": (NOW + WEEK, "the release of 03-multi-head")}


@pytest.mark.parametrize("generate", ["nbgrader's", "staged"])
def test_a_release_holding_an_open_answer_is_refused_naming_the_cell(tmp_path, monkeypatch, generate):
    """Refused by ./course release's own check, whichever class nbgrader's API generates with in this process
    (nbgrader's, or StagedGenerateAssignment once the process has read nbgrader_config.py)."""
    from nbgrader.apps import api as nbgrader_api
    from nbgrader.converters import GenerateAssignment

    monkeypatch.setattr(nbgrader_api, "GenerateAssignment",
                        pipeline.StagedGenerateAssignment if generate == "staged" else GenerateAssignment)
    path = _term(tmp_path, TERM3)
    out = tmp_path / "release"
    (out / "03-multi-head").mkdir(parents=True)
    (out / "03-multi-head" / "kept.txt").write_text("what students have")
    monkeypatch.setattr(integrity, "withheld", lambda *args: [])  # the stand-in step broken: answers stay
    with pytest.raises(pipeline.ReleaseRefused) as refused:
        pipeline.release(["03-multi-head"], out, work=tmp_path / "work", term_file=path, as_of=NOW)
    message = str(refused.value)
    assert "03-multi-head.ipynb, cell" in message and "given=attention" in message and "02-attention" in message
    assert term.shown_time(term.load(path).closes("02-attention")) in message
    assert sorted(p.name for p in (out / "03-multi-head").iterdir()) == ["kept.txt"]  # out is unchanged


def test_nbgraders_own_generate_withholds_and_refuses_too(tmp_path, monkeypatch):
    """formgrader's Generate button and ``nbgrader generate_assignment`` (StagedGenerateAssignment) follow the
    same term: stand-ins while a lesson is open, and nothing moved into place when a cell leaks."""
    path = _term(tmp_path, TERM3)
    pipeline._stage_generate_assignment()  # what nbgrader_config.py does for nbgrader's tools
    release = tmp_path / "release"
    grader = pipeline.api(tmp_path / "work", release_dir=release, term_file=path)
    result = grader.generate_assignment("03-multi-head", force=True, create=True)
    assert result["success"], result["log"]
    ported = [c for c in _cells(release, "03-multi-head") if c.metadata.get("course", {}).get("given") == ["attention"]]
    assert "raise NotImplementedError" in ported[0].source
    before = (release / "03-multi-head" / "03-multi-head.ipynb").read_bytes()
    monkeypatch.setattr(integrity, "withheld", lambda *args: [])
    result = grader.generate_assignment("03-multi-head", force=True, create=True)
    said = result.get("error", "") + result["log"]
    assert not result["success"] and "given=attention" in said and "02-attention" in said
    assert (release / "03-multi-head" / "03-multi-head.ipynb").read_bytes() == before


def test_nbgraders_own_generate_records_what_it_hands_out_and_gradings_trees_do_not(tmp_path, monkeypatch):
    """nbgrader's Generate, configured by the repository's nbgrader_config.py (tools_config), writes the term's
    release, which students get: it records each lesson whose answers it shows. The trees ./course grade generates
    for its gradebook (the same class, once tools_config ran in the process) go to no one: nothing recorded."""
    path = _term(tmp_path, TERM3)
    monkeypatch.setenv(term.ENV_VAR, str(path))
    work = tmp_path / "work"
    config = pipeline.tools_config(pipeline.Config(), work)
    grader = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    ledger = integrity.ledger_of(work / "lessons")
    assert grader.generate_assignment("03-multi-head", force=True, create=True)["success"]
    assert (work / "lessons" / "03-multi-head").is_dir() and not ledger.exists()  # 02 is open: no answer shown
    assert grader.generate_assignment("02-attention", force=True, create=True)["success"]
    assert list(integrity.handed_out(ledger)) == ["01-masks"]  # 01 closed: lesson 02 shows its masks
    grading = tmp_path / "grading"
    assert pipeline.api(grading, term_file=path).generate_assignment("02-attention", force=True, create=True)["success"]
    assert (grading / "release" / "02-attention").is_dir() and not integrity.ledger_of(grading / "release").exists()


@pytest.mark.parametrize("where", ["demo cell", "markdown", "test cell"])
def test_the_check_finds_an_answer_in_any_cell(tmp_path, where):
    """An answer of 01 pasted anywhere into lesson 02 (not a given cell) is found, and the cell is named."""
    folder = tmp_path / "release"
    shutil.copytree(ROOT / "lessons" / "02-attention", folder / "02-attention")
    path = folder / "02-attention" / "02-attention.ipynb"
    nb = nbformat.read(path, as_version=4)
    line = sorted(integrity.fingerprints()["01-masks"])[0]
    cell = (nbformat.v4.new_markdown_cell(f"```python\n{line}\n```") if where == "markdown"
            else nbformat.v4.new_code_cell(f"# {where}\n{line}\n"))
    nb.cells.insert(3, cell)
    nbformat.write(nb, path)
    t = term.load(_term(tmp_path, {**TERM3, "01-masks": (NOW - WEEK, NOW)}))
    problems = integrity.check_release(folder, ["02-attention"], t, NOW)
    assert any("cell 3 " in p and "01-masks" in p for p in problems), problems
    closed = term.load(_term(tmp_path, TERM3))  # 01 closed: the same line is allowed
    assert not [p for p in integrity.check_release(folder, ["02-attention"], closed, NOW) if "cell 3 " in p]


def test_the_self_study_release_is_refused_for_a_term_with_every_lesson_open(tmp_path, capsys):
    """lessons/ (no term: every earlier answer shown) is what a term must never hand out before lessons close."""
    all_open = term.parse({"late": {"percent_per_day": 0, "cutoff_days": 0},
                           "lessons": {other: {"due": NOW + WEEK} for other in lessons.ids()}})
    problems = integrity.check_release(ROOT / "lessons", lessons.ids(), all_open, NOW)
    needing = {lesson for lesson, _, names in EVERY_GIVEN if integrity.answers(lesson, names)}
    assert {p.split(".ipynb")[0] for p in problems} == needing
    # and the CLI says so, exit 2, for a real term release whose stand-in step is off
    path = _term(tmp_path, TERM3)
    code = main(["release", "--term", str(path), "--out", str(tmp_path / "out"), "--lessons", "01-masks"])
    assert code == 0 and "for the term" in capsys.readouterr().out
    code = main(["release", "--term", str(tmp_path / "missing.toml")])
    assert code == 2 and "cannot read the term file" in capsys.readouterr().err


def test_the_self_study_edition_says_it_is_not_for_graded_use():
    from autograder.term import edition

    assert "not\nfor graded use" in edition.readme_text() or "not for graded use" in edition.readme_text()
    released = nbformat.read(ROOT / "lessons" / "05-decoder-layer" / "05-decoder-layer.ipynb", as_version=4)
    headers = [c.source.splitlines()[0] for c in released.cells if "given" in c.metadata.get("course", {})]
    assert any("built in an earlier lesson" in h for h in headers)
    assert "only once that lesson has closed" in "\n".join(c.source for c in released.cells)


def test_the_term_command_shows_what_is_open(tmp_path, capsys):
    path = _term(tmp_path, TERM3, extensions='bob = { "03-multi-head" = 2 }')
    assert main(["term", "--term", str(path), "--out", str(tmp_path / "lessons")]) == 0
    table = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()
             if line.startswith("| 0")}
    assert "shown (closed)" in table["01-masks"] and "withheld (open)" in table["02-attention"]
    assert "bob " + term.shown_time(TERM3["03-multi-head"][1] + timedelta(days=2)) in table["03-multi-head"]
    assert main(["term", "--term", str(tmp_path / "none.toml")]) == 2


# -- what went out, and extensions that come after it --------------------------------------------------------------
# Lesson 02's answers went out an hour ago, with lesson 03's release; 02 was due three days before that, so with
# the 2-day cutoff it had closed a day before, as a release requires.
OUT = (NOW - timedelta(hours=1)).replace(microsecond=0)
TERM_OUT = {"01-masks": (NOW - 3 * WEEK, NOW - 2 * WEEK), "02-attention": (NOW - 2 * WEEK, OUT - timedelta(days=3)),
            "03-multi-head": (OUT, NOW + WEEK)}


def _ledger(tmp_path: Path, text: str | None = None) -> Path:
    ledger = tmp_path / integrity.HANDED_OUT
    ledger.write_text(text if text is not None else json.dumps(
        {"02-attention": {"at": OUT.isoformat(), "by": "the release of 03-multi-head"}}))
    return ledger


@pytest.mark.parametrize("extension,warned", [
    ("{ \"02-attention\" = 2 }", True),  # due OUT - 1 day, + 2 days cutoff: can still earn points after OUT
    (f"{{ \"02-attention\" = {OUT - timedelta(days=2):%Y-%m-%dT%H:%M:%S} }}", False),  # closes exactly at OUT
    (f"{{ \"02-attention\" = {OUT - timedelta(days=2, seconds=-1):%Y-%m-%dT%H:%M:%S} }}", True),  # a second after
    ("{ \"03-multi-head\" = 2 }", False),  # 03's answers never went out
    ("{ \"01-masks\" = 30 }", False),  # nothing recorded for 01
], ids=["2-days-after-the-cutoff", "closes-exactly-then", "closes-a-second-after", "a-lesson-never-out",
        "a-lesson-not-recorded"])  # ids name the case: the values hold clock times, and xdist's workers must agree
def test_an_extension_that_lets_a_student_submit_after_the_answers_went_out_is_flagged(tmp_path, extension, warned):
    chosen = term.load(_term(tmp_path, TERM_OUT, extensions=f"alice = {extension}\n"))
    ledger = _ledger(tmp_path)
    found = integrity.extensions_after_answers(chosen, ledger)
    assert bool(found) == warned, found
    if warned:
        assert found[0].startswith("alice's extension of 02-attention") and "the release of 03-multi-head" in found[0]
        assert term.shown_time(OUT) in found[0] and "Shorten it so that" in found[0]


def test_a_record_from_before_the_lesson_was_released_or_of_a_lesson_outside_the_term_is_an_earlier_terms(tmp_path):
    chosen = term.load(_term(tmp_path, TERM_OUT, extensions='alice = { "02-attention" = 2 }\n'))
    earlier = json.dumps({"02-attention": {"at": (NOW - 60 * WEEK).isoformat(), "by": "the release of 03-multi-head"},
                          "05-decoder-layer": {"at": OUT.isoformat(), "by": "the release of 06-model"}})
    ledger = _ledger(tmp_path, earlier)
    assert integrity.handed_out_in(chosen, ledger) == {}
    assert integrity.extensions_after_answers(chosen, ledger) == []
    table = integrity.schedule(chosen, NOW, ledger)
    assert "answers first out" in table and "the release of" not in table
    # this term's entry is kept, and a submission after it is noted
    this = integrity.handed_out_in(chosen, _ledger(tmp_path))
    assert integrity.submitted_after_answers(this, "02-attention", OUT + timedelta(minutes=1)).startswith(
        f"submitted {term.shown_time(OUT + timedelta(minutes=1))}, after 02-attention's answers went out")
    assert integrity.submitted_after_answers(this, "02-attention", OUT) == ""


def test_a_release_keeps_the_first_moment_and_records_nothing_without_a_term(tmp_path):
    chosen = term.load(_term(tmp_path, TERM_OUT))
    ledger = tmp_path / "handed-out.json"
    assert integrity.record_handed_out(ledger, None, ["03-multi-head"], NOW) == {} and not ledger.exists()
    assert integrity.record_handed_out(ledger, chosen, ["03-multi-head"], NOW) == {
        "02-attention": "the release of 03-multi-head"}
    assert integrity.record_handed_out(ledger, chosen, ["03-multi-head", "02-attention"], NOW + WEEK) == {
        "01-masks": "the release of 02-attention"}  # 02's first moment is kept
    assert integrity.handed_out(ledger)["02-attention"] == (NOW, "the release of 03-multi-head")
    assert integrity.record_handed_out(ledger, chosen, ["03-multi-head"], NOW - timedelta(minutes=5)) == {
        "02-attention": "the release of 03-multi-head"}  # an earlier moment replaces it
    assert integrity.handed_out(ledger)["02-attention"][0] == NOW - timedelta(minutes=5)


@pytest.mark.parametrize("text", ["{ not json", "[1, 2]", json.dumps({"02-attention": {"at": "yesterday", "by": "x"}}),
                                  json.dumps({"02-attention": {"by": "x"}}), " " * (integrity.MAX_LEDGER_BYTES + 1)])
def test_a_record_that_cannot_be_read_stops_a_release_before_anything_changes(tmp_path, capsys, text):
    path = _term(tmp_path, TERM_OUT)
    out = tmp_path / "lessons"
    _ledger(tmp_path, text)
    with pytest.raises(term.TermError, match="delete it to start the record again"):
        integrity.handed_out(integrity.ledger_of(out))
    assert main(["release", "--term", str(path), "--out", str(out), "--lessons", "03-multi-head"]) == 2
    assert "cannot be read" in capsys.readouterr().err and not out.exists()
    assert main(["term", "--term", str(path), "--out", str(out)]) == 2


def test_the_term_command_shows_when_answers_went_out_and_warns_of_late_extensions(tmp_path, capsys):
    path = _term(tmp_path, TERM_OUT, extensions='alice = { "02-attention" = 2 }\n')
    _ledger(tmp_path)
    assert main(["term", "--term", str(path), "--out", str(tmp_path / "lessons")]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| 02-attention"))
    assert row.rstrip(" |").endswith(f"{term.shown_time(OUT)} (the release of 03-multi-head)"), row
    assert "warning: alice's extension of 02-attention" in printed


def test_grading_warns_of_late_extensions_from_the_record_in_its_work_folder(tmp_path, capsys, monkeypatch):
    """``./course grade --work W`` reads W/handed-out.json, the record ``./course release`` keeps beside W/lessons;
    the warning comes before grading and again under the scores. (Grading itself is stubbed: this is the wiring.)"""
    path = _term(tmp_path, TERM_OUT, extensions='alice = { "02-attention" = 2 }\n')
    work = tmp_path / "work"
    work.mkdir()
    _ledger(work)
    (tmp_path / "incoming").mkdir()
    monkeypatch.setattr(grade_class, "grade", lambda *args, **kwargs: [])
    assert main(["grade", str(tmp_path / "incoming"), "--work", str(work), "--term", str(path)]) == 0
    said = capsys.readouterr()
    assert "warning: alice's extension of 02-attention" in said.err
    assert "warning: alice's extension of 02-attention" in said.out.split("graded 0 notebooks")[1]
    (work / integrity.HANDED_OUT).unlink()
    assert main(["grade", str(tmp_path / "incoming"), "--work", str(work), "--term", str(path)]) == 0
    assert "warning" not in str(capsys.readouterr())


# -- the student's side: use_your_own ------------------------------------------------------------------------------
def _notebook(path: Path, *sources: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


MASKS = """\
import numpy as np
%matplotlib inline
WIDTH = 3
T = len("computed")  # a dimension of an example, not a constant: not run

def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))
"""


@pytest.mark.parametrize("layout", ["side by side", "colab upload", "subfolder"])
def test_use_your_own_runs_only_the_definitions_of_the_students_notebook(tmp_path, layout, capsys):
    here = tmp_path / "lessons" / "02-attention"
    here.mkdir(parents=True)
    where = {"side by side": tmp_path / "lessons" / "01-masks" / "01-masks.ipynb",
             "colab upload": here / "01-masks.ipynb", "subfolder": here / "01-masks" / "01-masks.ipynb"}[layout]
    _notebook(where, MASKS, "raise SystemExit('a check of lesson 01 must not run again')",
              "print('a plot')\nmodel = train()", "def padding_mask(x):\n    # YOUR CODE HERE\n"
              "    raise NotImplementedError()")
    namespace: dict = {}
    earlier.use_your_own("01-masks", ["causal_mask", "padding_mask"], namespace, here=here)
    assert np.array_equal(namespace["causal_mask"](3), np.tril(np.ones((3, 3), dtype=bool)))
    assert "model" not in namespace and "WIDTH" not in namespace  # only the names asked for
    out = capsys.readouterr().out
    assert "a plot" not in out and "padding_mask in lesson 01-masks still raise NotImplementedError" in out


@pytest.mark.parametrize("problem,expected", [
    ("missing notebook", "no 01-masks.ipynb was found"),
    ("missing name", "defines no combine_masks"),
    ("syntax error", "could not be read as Python: cell 0"),
    ("raises", "raised ZeroDivisionError"),
    ("not a notebook", "not a notebook that can be read"),
    ("too big", "over 32 MB"),
    ("cycle", "builds on itself"),
])
def test_use_your_own_says_what_to_do(tmp_path, problem, expected):
    here = tmp_path / "02-attention"
    here.mkdir()
    target = tmp_path / "01-masks" / "01-masks.ipynb"
    if problem == "missing name":
        _notebook(target, MASKS)
    elif problem == "syntax error":
        _notebook(target, "def combine_masks(:\n    pass", MASKS)
    elif problem == "raises":
        _notebook(target, "def combine_masks(a, b=1 / 0):\n    return a & b")  # the default runs at def
    elif problem == "not a notebook":
        target.parent.mkdir()
        target.write_text("not json")
    elif problem == "too big":
        target.parent.mkdir()
        with open(target, "wb") as handle:
            handle.truncate(earlier.MAX_BYTES + 1)
    elif problem == "cycle":
        _notebook(target, "from decoder_course.earlier import use_your_own\n"
                          "use_your_own('01-masks', ['causal_mask'], globals())\n" + MASKS)
    with pytest.raises(earlier.EarlierLessonError, match=expected):
        earlier.use_your_own("01-masks", ["causal_mask", "combine_masks"], {}, here=here)


def test_use_your_own_follows_an_earlier_notebooks_own_stand_in(tmp_path):
    """Lesson 02's notebook ran lesson 01's code through its own stand-in: loading 02 loads 01 behind it."""
    _notebook(tmp_path / "01-masks" / "01-masks.ipynb", MASKS)
    _notebook(tmp_path / "02-attention" / "02-attention.ipynb",
              "from decoder_course.earlier import use_your_own\n\nuse_your_own('01-masks', ['causal_mask'], globals())",
              "def blocked(T):\n    return ~causal_mask(T)")
    here = tmp_path / "03-multi-head"
    here.mkdir()
    namespace: dict = {}
    earlier.use_your_own("02-attention", ["blocked"], namespace, here=here)
    assert namespace["blocked"](2).tolist() == [[False, True], [False, False]]


def test_a_released_stand_in_runs_the_students_own_earlier_lesson(tmp_path):
    """The stand-in lesson 05 ships while 03 is open, run beside a student's solved 03 (whose own ported
    attention they wrote into 03's stand-in): the names come from the student's notebook."""
    t = term.parse({"late": {"percent_per_day": 0, "cutoff_days": 0},
                    "lessons": {other: {"due": NOW + WEEK} for other in lessons.ids()}})
    lessons_dir = tmp_path / "lessons"
    for lesson in ("03-multi-head",):
        nb = nbformat.read(notebooks.solution_path(lesson), as_version=4)
        for cell in nb.cells:  # the student's notebook: solved, with the stand-ins their release showed
            names = cell.metadata.get("course", {}).get("given")
            if names and integrity.withheld(t, NOW, lesson, list(names)):
                held = integrity.withheld(t, NOW, lesson, list(names))
                cell.source = integrity.stand_in(t, lesson, list(names), held).replace(
                    '    raise NotImplementedError("port your own answer of lesson 02-attention here")',
                    "    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v, None")
        (lessons_dir / lesson).mkdir(parents=True)
        nbformat.write(nb, lessons_dir / lesson / f"{lesson}.ipynb")
    names = ["multi_head:split_heads", "merge_heads", "attention", "MultiHeadAttention", "load_from_torch_mha"]
    source = integrity.stand_in(t, "05-decoder-layer", names, integrity.withheld(t, NOW, "05-decoder-layer", names))
    here = lessons_dir / "05-decoder-layer"
    here.mkdir()
    import math

    import torch

    # the lesson's own imports, as its first cells give them
    namespace = {"torch": torch, "nn": torch.nn, "math": math, "np": np, "HERE": here}
    exec(compile(source.replace("globals())", "globals(), here=HERE)"), "05 stand-in", "exec"), namespace)
    mha = namespace.get("MultiHeadAttention")
    assert mha is not None and mha.__module__ == "lesson_03_multi_head"  # the student's own class
    assert namespace["split_heads"](np.zeros((1, 2, 4)), 2).shape == (1, 2, 2, 2)


# -- grading and feedback ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Lesson 02 of a term where 01 is still open (due tomorrow): released with a stand-in, then graded for a
    student who solved 02 with no lesson-01 notebook anywhere, and one whose given cell holds a wrong mask."""
    tmp = tmp_path_factory.mktemp("integrity")
    path = _term(tmp, {"01-masks": (NOW - WEEK, NOW + timedelta(days=1)),
                       "02-attention": (NOW - timedelta(days=1), NOW + WEEK)})
    release = tmp / "release"
    pipeline.release(["02-attention"], release, work=tmp / "release-work", term_file=path, as_of=NOW)
    released = nbformat.read(release / "02-attention" / "02-attention.ipynb", as_version=4)
    solution = nbformat.read(notebooks.solution_path("02-attention"), as_version=4)
    answers = {c.id: c.source for c in solution.cells if c.metadata.get("nbgrader", {}).get("solution")}
    submissions = tmp / "submissions"
    for student, wrong in (("solver", False), ("tamperer", True)):
        nb = nbformat.from_dict(json.loads(json.dumps(released)))
        for cell in nb.cells:
            if cell.id in answers:
                cell.source = answers[cell.id]
            if wrong and "given" in cell.metadata.get("course", {}):
                cell.source = "import numpy as np\ndef causal_mask(T):\n    return np.ones((T, T), dtype=bool)\n"
        (submissions / student / "02-attention").mkdir(parents=True)
        nbformat.write(nb, submissions / student / "02-attention" / "02-attention.ipynb")
    work = tmp / "work"
    outcomes = grade_class.grade(submissions, work, ["02-attention"], term_file=path)
    return {"tmp": tmp, "work": work, "term": path, "released": released, "outcomes": {o.student: o for o in outcomes}}


def test_grading_runs_the_courses_blocks_whatever_the_given_cell_holds(graded):
    stand_in = [c for c in graded["released"].cells if "given" in c.metadata.get("course", {})][0]
    assert "use_your_own('01-masks'" in stand_in.source  # what the students had: no lesson-01 answer
    course = notebooks.reference_source("02-attention", "masks:causal_mask", keep_markers=False).strip()
    for student in ("solver", "tamperer"):
        outcome = graded["outcomes"][student]
        assert outcome.ok and outcome.max_score > 0 and outcome.score == outcome.max_score, outcome
        autograded = nbformat.read(graded["work"] / "autograded" / student / "02-attention" / "02-attention.ipynb",
                                   as_version=4)
        ran = [c for c in autograded.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
               .startswith("given_")]
        assert len(ran) == 1 and course in ran[0].source and "use_your_own" not in ran[0].source
        assert "np.ones((T, T), dtype=bool)" not in ran[0].source  # the tampered mask did not run
        assert not [o for o in ran[0].outputs if o.output_type == "error"]


def test_feedback_that_ran_an_open_lessons_answers_waits_until_it_closes(graded, monkeypatch):
    work = graded["work"]
    for student in ("solver", "tamperer"):
        outcome = graded["outcomes"][student]
        assert "feedback held until" in outcome.feedback_held
        assert term.shown_time(term.load(graded["term"]).closes("01-masks")) in outcome.feedback_held
        assert not list((work / "feedback").glob(f"{student}/02-attention/*.html"))
    with open(work / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert rows["solver"]["status"] == "ok" and float(rows["solver"]["score"]) > 0  # the grade itself is there
    assert "feedback held until" in rows["solver"]["message"]
    # nbgrader's own generate_feedback (formgrader, the CLI) is held too
    grader = pipeline.api(work, term_file=graded["term"])
    result = grader.generate_feedback("02-attention", "solver", force=True)
    assert not result["success"] and "held until" in result["log"]
    # once 01 has closed, the page is written, and shows the course's masks that ran
    (graded["tmp"] / "later").mkdir()
    closed = _term(graded["tmp"] / "later", {"01-masks": (NOW - 3 * WEEK, NOW - 2 * WEEK),
                                             "02-attention": (NOW - timedelta(days=1), NOW + WEEK)})
    ledger = integrity.ledger_of(work / "lessons")
    assert not ledger.exists()  # nothing went out while it was held
    monkeypatch.setenv(term.ENV_VAR, str(closed))
    config = pipeline.tools_config(pipeline.Config(), work)  # nbgrader's own tools: they record what their pages show
    grader = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    result = grader.generate_feedback("02-attention", "solver", force=True)
    assert result["success"], result["log"]
    page = (work / "feedback" / "solver" / "02-attention" / "02-attention.html").read_text()
    assert "causal_mask" in page
    assert integrity.handed_out(ledger)["01-masks"][1] == "the feedback of 02-attention"  # the page is recorded
