"""formgrader's view of a submission is sanitised, and every page of a notebook is made within a bound.

formgrader (nbgrader's server extension) renders ``autograded/<student>/<lesson>/<nb>.ipynb`` in the instructor's
Jupyter session, whose page holds the XSRF token: ``pipeline.tools_config`` makes it build
:class:`autograder.pages.exporters.FormgradeExporter`, which runs :class:`SafeFormgrade` (the feedback's sanitiser).
Each attack is shown live with formgrader's stock exporter first. The page must keep formgrader's own scripts,
score inputs and comment boxes, each id once.

The bound (:class:`autograder.pages.exporters.BoundedExporter`): sanitising and rendering one notebook runs in a child
with a time, memory and size limit; past it the page is plain text with a note saying why, the log says so, and
the next student's page is the usual one. Variants: deeply nested HTML (nh3 takes time quadratic in the depth),
the same inside a markdown cell, markdown that is slow to parse, a notebook over the size limit, many outputs,
many cells, a renderer that raises.
"""

from __future__ import annotations

import copy
import time

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell, new_notebook
from nbgrader.converters import GenerateFeedback
from nbgrader.server_extensions.formgrader import formgrader
from traitlets.config import Config

from autograder.grading import pipeline
from autograder.judge import preprocessors as nbgrader_plugins
from autograder.pages.exporters import FeedbackExporter, FormgradeExporter, Unrendered, bounded
from autograder.pages.feedback import SafeFeedback
from tests.test_feedback import FORGED, attack_notebook, problems

BASE = "/user/instructor"
RESOURCES = {"assignment_id": "01-masks", "notebook_id": "01-masks", "submission_id": "abc123", "index": 0,
             "total": 2, "base_url": BASE, "student": "mallory", "last_name": "M", "first_name": "Mal",
             "notebook_path": "/tree/autograded/mallory/01-masks/01-masks.ipynb"}
GRADED = ("causal_mask", "padding_mask")


# -- formgrader's view -----------------------------------------------------------------------------------------
def _formgrader_exporter(tmp_path, monkeypatch, exporter_class=None):
    """formgrader's exporter as its extension builds it: the repository's config (tools_config), its own extra
    config (the ``formgrade`` template), then ``formgrader.HTMLExporter(config=…)``."""
    monkeypatch.setattr(pipeline, "_stage_generate_assignment", lambda: None)
    monkeypatch.setattr(formgrader, "HTMLExporter", HTMLExporter)  # as nbgrader ships it, until tools_config runs
    monkeypatch.delenv("DECODER_COURSE_WORK", raising=False)
    config = pipeline.tools_config(Config(), tmp_path)
    config.merge(formgrader.FormgradeExtension(config=config).build_extra_config())
    return (exporter_class or formgrader.HTMLExporter)(config=config)


def _view(exporter, nb, tmp_path) -> str:
    path = tmp_path / "autograded.ipynb"
    nbformat.write(nb, path)
    return exporter.from_filename(str(path), resources=copy.deepcopy(RESOURCES))[0]


def _clean(nb):
    """The same cells and grading metadata, no outputs and plain markdown: what formgrader's page holds anyway."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
        else:
            cell.source = "text"
    return nb


def test_tools_config_makes_formgrader_use_the_course_exporter(tmp_path, monkeypatch):
    exporter = _formgrader_exporter(tmp_path, monkeypatch)
    assert type(exporter) is FormgradeExporter and exporter.template_name == "formgrade"


def test_each_attack_is_live_in_formgraders_own_view(tmp_path, monkeypatch):
    stock = _formgrader_exporter(tmp_path, monkeypatch, HTMLExporter)
    nb = attack_notebook()
    found = "\n".join(set(problems(_view(stock, nb, tmp_path))) - set(problems(_view(stock, _clean(nb), tmp_path))))
    for marker in ("html-script", "var element", "handler onerror on <img>", "handler onmouseover",
                   "<iframe>", "<form>", "id=causal_mask", "href=javascript:", "a <style> element in the body"):
        assert marker in found, f"{marker!r} not live in formgrader's stock view:\n{found}"


def test_formgraders_view_is_inert_and_keeps_its_grading_form(tmp_path, monkeypatch):
    exporter = _formgrader_exporter(tmp_path, monkeypatch)
    nb = attack_notebook()
    page, clean = _view(exporter, nb, tmp_path), _view(exporter, _clean(nb), tmp_path)
    # Everything the page has that a clean notebook's has not: nothing (formgrader's own scripts and inputs are
    # in both, and the same).
    assert sorted(problems(page)) == sorted(problems(clean)), set(problems(page)) - set(problems(clean))
    soup = BeautifulSoup(page, "html.parser")
    for script in soup.find_all("script"):
        assert "alert" not in str(script) and "__pwned" not in str(script), str(script)[:200]
        assert not script.get("src") or script["src"].startswith((f"{BASE}/formgrader/static/", "https://cdnjs"))
    assert not [tag.name for tag in soup.find_all(True) if any("alert" in str(v) for v in tag.attrs.values())]
    for item in GRADED:  # formgrader's score input holds each item's id, and nothing else does
        [score] = soup.find_all(id=item)
        assert score.name == "input" and "score" in score["class"]
        assert len(soup.find_all(id=f"{item}_extra_credit")) == 1
    # the verdicts are the grader's sealed boxes; the forged pass is labelled as the notebook's own output
    boxes = soup.find_all(attrs={"data-course-grader": "verdict"})
    assert len(boxes) == 2 and "allowed is wrong at 6 place(s)" in boxes[0].get_text()
    assert "Grader's verdict · causal_mask · seal" in boxes[0].get_text()
    framed = soup.find_all(attrs={"data-course-grader": "student-output"})
    assert framed and all(FORGED in f.get_text() for f in framed)
    assert "widget" not in str(soup.find("body")).lower() or "not shown" in page  # no widget state or view


def test_formgraders_comment_box_stays_on_answer_cells(tmp_path, monkeypatch):
    exporter = _formgrader_exporter(tmp_path, monkeypatch)
    answer = new_markdown_cell("My answer: <script>alert('answer')</script><b>bold</b>", metadata={
        "nbgrader": {"solution": True, "grade": True, "grade_id": "explain", "points": 2, "locked": False,
                     "schema_version": 3}})
    nb = new_notebook(cells=[answer])
    soup = BeautifulSoup(_view(exporter, nb, tmp_path), "html.parser")
    assert [t.name for t in soup.find_all(id="explain-comment")] == ["textarea"]
    assert [t.name for t in soup.find_all(id="explain")] == ["input"]
    assert soup.find("b", string="bold") and "alert('answer')" not in str(soup.find_all("script"))


# -- the bound -------------------------------------------------------------------------------------------------
def test_bounded_returns_the_text_or_says_which_limit_it_passed():
    assert bounded(lambda: "é" * 10, 5, 100, 1 << 30) == "é" * 10
    started = time.monotonic()
    with pytest.raises(Unrendered, match="longer than the 1 s limit"):
        bounded(lambda: time.sleep(30) or "", 1, 100, 1 << 30)
    assert time.monotonic() - started < 5
    with pytest.raises(Unrendered, match="larger than the"):
        bounded(lambda: "x" * (3 << 20), 5, 1 << 20, 1 << 30)
    with pytest.raises(Unrendered, match="more than 0.25 GB of memory"):
        bounded(lambda: str(len(bytearray(1 << 30))), 5, 100, 1 << 28)
    with pytest.raises(Unrendered, match=r"failed \(ValueError: broken\)"):
        bounded(lambda: (_ for _ in ()).throw(ValueError("broken")), 5, 100, 1 << 30)


def _graded_notebook(extra: list) -> nbformat.NotebookNode:
    """Two graded items as GetGrades leaves them (one passed, one failed), after ``extra`` cells."""
    nb = attack_notebook()
    nb.cells = extra + [cell for cell in nb.cells if cell.metadata.get("nbgrader")]
    return nb


def _feedback(nb, student: str, **bound) -> tuple[str, float]:
    """The feedback page as GenerateFeedback makes it with the course's exporter, and its time."""
    config = copy.deepcopy(GenerateFeedback(coursedir=None, config=Config()).config)
    config.Exporter.default_preprocessors = []
    for name, value in bound.items():
        setattr(config.BoundedExporter, name, value)
    exporter = FeedbackExporter(config=config)
    exporter.register_preprocessor(SafeFeedback(), enabled=True)
    resources = {"nbgrader": {"notebook": "01-masks", "assignment": "01-masks", "student": student, "score": 1,
                              "max_score": 2, "late_penalty": 0}}
    started = time.monotonic()
    page = exporter.from_notebook_node(copy.deepcopy(nb), resources)[0]
    return page, time.monotonic() - started


NESTED = "<div>" * 60_000 + "<b>deep</b>"  # nh3 needs about 10 s for this on this machine, 0.3 s for 1/4 of it


def _html(text: str) -> NotebookNode:  # (new_output validates each output: seconds for thousands of them)
    return NotebookNode(output_type="display_data", metadata=NotebookNode(), data=NotebookNode({"text/html": text}))


def _code(source: str, outputs: list) -> NotebookNode:
    return NotebookNode(cell_type="code", metadata=NotebookNode(), source=source, outputs=outputs,
                        execution_count=None)


# name: the cells before the graded ones, what the note says, the bound's size limit (MB)
PATHOLOGICAL = {
    "nested HTML output": (lambda: [_code("display(HTML(nested))", [_html(NESTED)])], "longer than the 2 s", 1),
    "nested HTML in markdown": (lambda: [new_markdown_cell("# Intro\n\n" + NESTED)], "longer than the 2 s", 1),
    # mistune's slowest input found (about 35 µs a character here, 10 s for this cell): no closing delimiter
    "unclosed emphasis": (lambda: [new_markdown_cell("*_" * 150_000)], "longer than the 2 s", 1),
    "a huge markdown cell": (lambda: [new_markdown_cell("*a* <b>b</b> " * 200_000)], "over the 1 MB limit", 1),
    "many outputs": (lambda: [_code("for i in range(50_000): display(HTML('<b>i</b>'))",
                                    [_html("<b>i</b>") for _ in range(50_000)])], "longer than the 2 s", 16),
    "many cells": (lambda: [_code(f"x = {i}", []) for i in range(20_000)], "longer than the 2 s", 16),
    "too many outputs": (lambda: [_code("for i in range(50_000): display(HTML('<b>i</b>'))",
                                        [_html("<b>i</b>") for _ in range(50_000)])], "over the 1 MB limit", 1),
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_a_notebook_past_the_bound_gets_a_plain_page_on_time_and_classmates_do_not(name):
    make, reason, megabytes = PATHOLOGICAL[name]
    extra = make()
    bound = {"render_seconds": 2.0, "render_bytes": megabytes << 20}
    nbgrader_plugins.NOTES.clear()
    before, before_seconds = _feedback(_graded_notebook([new_markdown_cell("# Ada's notes\n\n<b>fine</b>")]),
                                       "ada", **bound)
    page, seconds = _feedback(_graded_notebook(extra), "mallory", **bound)
    after, _ = _feedback(_graded_notebook([new_markdown_cell("# Lin's notes\n\n<b>fine</b>")]), "lin", **bound)
    assert seconds < 2.0 + 6, f"the plain page took {seconds:.1f} s"  # the bound, then the plain page
    soup = BeautifulSoup(page, "html.parser")
    [plain] = soup.find_all(attrs={"data-course-grader": "plain-note"})
    assert reason in plain.get_text() and "plain text" in plain.get_text()
    # the grader's report and verdicts, whole; the student's markup only as text
    report = soup.find(attrs={"data-course-grader": "report"}).get_text()
    assert "Grader's report · 01-masks · mallory · 1 / 2 points" in report
    assert "allowed is wrong at 6 place(s)" in report
    assert len(soup.find_all(attrs={"data-course-grader": "verdict"})) == 2
    assert not soup.find_all("b") and not soup.find_all("script") and problems(page) == []
    assert len(page) < 4 << 20
    [note] = nbgrader_plugins.NOTES[("01-masks", "mallory")]
    assert reason in note and "feedback page is plain text" in note
    # classmates before and after: their usual page, no note
    for other, student in ((before, "ada"), (after, "lin")):
        assert "plain-note" not in other and ("01-masks", student) not in nbgrader_plugins.NOTES
        assert BeautifulSoup(other, "html.parser").find("b", string="fine"), student
    assert before_seconds < 2.0


def test_formgraders_view_past_the_bound_is_plain_text(tmp_path, monkeypatch):
    exporter = _formgrader_exporter(tmp_path, monkeypatch)
    exporter.render_seconds = 2.0
    nb = _graded_notebook([_code("x", [_html(NESTED)])])
    started = time.monotonic()
    page = _view(exporter, nb, tmp_path)
    assert time.monotonic() - started < 2.0 + 6
    soup = BeautifulSoup(page, "html.parser")
    note = soup.find(attrs={"data-course-grader": "plain-note"}).get_text()
    assert "formgrader page is plain text" in note and "longer than the 2 s limit" in note
    assert not soup.find_all("script") and not soup.find_all("b") and problems(page) == []
    assert len(soup.find_all(attrs={"data-course-grader": "verdict"})) == 2
    exporter.render_bytes = 1 << 10  # over the size limit: not even read
    note = BeautifulSoup(_view(exporter, nb, tmp_path), "html.parser").find(attrs={"data-course-grader": "plain-note"})
    assert "the notebook is" in note.get_text() and "MB limit" in note.get_text()


def test_a_renderer_error_gives_a_plain_page_that_quotes_it(monkeypatch):
    """A page the template cannot make (here: it raises, with braces in its message) is plain text too."""
    def broken(self, nb, resources=None, **kw):
        raise KeyError("{cell} \x1b[2J")

    monkeypatch.setattr(FeedbackExporter, "_render", broken)
    nbgrader_plugins.NOTES.clear()
    page, _ = _feedback(_graded_notebook([]), "mallory")
    note = BeautifulSoup(page, "html.parser").find(attrs={"data-course-grader": "plain-note"}).get_text()
    assert "making its page failed (KeyError: '{cell} \\x1b[2J')" in note
    assert "\x1b" not in page
    assert len(BeautifulSoup(page, "html.parser").find_all(attrs={"data-course-grader": "verdict"})) == 2


def test_a_plain_page_without_the_sanitiser_is_plain_text_too():
    """The plain page does not rely on SafeFeedback having run: an exporter configured without it still shows
    student markup only as text."""
    config = copy.deepcopy(GenerateFeedback(coursedir=None, config=Config()).config)
    config.Exporter.default_preprocessors = []
    config.BoundedExporter.render_bytes = 1 << 10
    page, _ = FeedbackExporter(config=config).from_notebook_node(attack_notebook(), {})
    assert problems(page) == [] and "<script" not in page and "&lt;script&gt;alert(&#x27;html-script" not in page
    assert "&lt;script&gt;alert(" in page  # the markdown and raw cells' text, escaped
