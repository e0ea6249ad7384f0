"""The feedback page of :class:`autograder.pages.exporters.FeedbackExporter` is nbconvert's ``HTMLExporter`` page.

``HTMLExporter`` parses its whole rendered page with BeautifulSoup only to give ``<img>`` tags without one an
``alt`` and lab-template cells a ``tabindex``, then prints the tree again; ``FeedbackExporter`` makes the same
edits on the template's text (:func:`autograder.pages.exporters.accessibility_edits`) and leaves the page to nbconvert's
pass where its scanner does not plainly read the markup. Both pages, read with BeautifulSoup's html.parser (what
the feedback tests read them with), are the same tree: for real graded notebooks of two lessons (every kind of
image: a matplotlib plot, markdown images with and without a description, an image in HTML output), for the
hostile notebook of tests/test_feedback.py, and for the lab template, whose cells get a ``tabindex``. The
comparison is shown to catch an exporter that drops an ``alt`` or a ``tabindex``.
"""

from __future__ import annotations

import base64
import copy
import io
import types
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup, NavigableString, Tag
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbgrader.converters import GenerateFeedback
from traitlets.config import Config

from autograder.course import samples
from autograder.grading import grade_class, pipeline
from autograder.pages import exporters, feedback
from autograder.pages.exporters import NO_ALT, FeedbackExporter, accessibility_edits
from autograder.pages.feedback import SafeFeedback
from autograder.sandbox import launch as sandbox
from tests.test_feedback import LIMITS, PNG, attack_notebook, problems

LESSONS = ("01-masks", "05-decoder-layer")
PLOT_CELL = ("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2))\nplt.plot([0, 1], [1, 0])\nplt.show()\n"
             "print('<img src=x> is printed text')")
IMAGES_MARKDOWN = (
    "Images: ![a drawn line](data:image/png;base64,{png}) described, and one without a description:\n\n"
    '<img src="data:image/png;base64,{png}">\n\n'
    '<img src="https://example.com/pixel.png" alt="remote"> (not shown), `<img src=x>` in code, and '
    '<a href="#top" title="<img src=x>">a link whose title names an image</a>.\n'
)
IMAGES_HTML = ('from IPython.display import HTML, display\n'
               'display(HTML(\'<p>an image in HTML output:</p><img src="data:image/png;base64,{png}">'
               '<img alt="given" src="data:image/png;base64,{png}">\'))')


# -- comparing pages -------------------------------------------------------------------------------------------
def _children(node: Tag) -> list:
    """A node's children; at the top of the document, without blank text (BeautifulSoup prints a newline after
    the doctype; a browser skips blank text before <html>)."""
    if isinstance(node, BeautifulSoup):
        return [child for child in node.contents if type(child) is not NavigableString or child.strip()]
    return node.contents


def differences(page: str, other: str, most: int = 5) -> list[str]:
    """Where the two pages' html.parser trees differ (node kind, tag name, attributes, text), in document order."""
    found, pending = [], [(BeautifulSoup(page, "html.parser"), BeautifulSoup(other, "html.parser"), "")]
    while pending and len(found) < most:
        mine, theirs, path = pending.pop()
        if type(mine) is not type(theirs):
            found.append(f"{path}: {type(mine).__name__} {str(mine)[:80]!r} != {type(theirs).__name__} "
                         f"{str(theirs)[:80]!r}")
        elif isinstance(mine, Tag):
            ours, others = _children(mine), _children(theirs)
            if mine.name != theirs.name or mine.attrs != theirs.attrs:
                found.append(f"{path}: <{mine.name} {mine.attrs}> != <{theirs.name} {theirs.attrs}>"[:400])
            elif len(ours) != len(others):
                found.append(f"{path}/{mine.name}: {len(ours)} children != {len(others)}")
            else:
                here = f"{path}/{mine.name}"
                pending += reversed([(a, b, f"{here}[{i}]") for i, (a, b) in enumerate(zip(ours, others))])
        elif isinstance(mine, NavigableString) and str(mine) != str(theirs):
            found.append(f"{path}: text {str(mine)[:80]!r} != {str(theirs)[:80]!r}")
    return found


def _count(page: str, attribute: str, value: str | None = None) -> int:
    return sum(1 for tag in BeautifulSoup(page, "html.parser").find_all(True)
               if attribute in tag.attrs and (value is None or tag[attribute] == value))


def _images(page: str) -> list[Tag]:
    return BeautifulSoup(page, "html.parser").find_all("img")


def _plot_png() -> str:
    """A matplotlib plot as a notebook holds it (drawn here, so the page has one whatever the kernel draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(2, 2))
    figure.gca().plot([0, 1], [0, 1])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


# -- real graded notebooks -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Lessons 01 and 05 graded through the pipeline: 01 perfect, with typical mistakes, and with every kind of
    image; 05 perfect (its plots and its figure); the canary of each. Their autograded notebooks and gradebooks."""
    sandbox.check_available()
    root = tmp_path_factory.mktemp("exporter")
    extra = samples.perfect("01-masks")
    extra.cells[2:2] = [new_markdown_cell(IMAGES_MARKDOWN.format(png=PNG)),
                        new_code_cell(IMAGES_HTML.format(png=PNG)), new_code_cell(PLOT_CELL)]
    submissions = {("ada", "01-masks"): samples.perfect("01-masks"),
                   ("alan", "01-masks"): samples.typical_mistakes("01-masks"),
                   ("mallory", "01-masks"): extra,
                   ("ada", "05-decoder-layer"): samples.perfect("05-decoder-layer")}
    for (student, lesson), nb in submissions.items():
        path = root / "incoming" / student / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    work = root / "work"
    outcomes = grade_class.grade(root / "incoming", work, list(LESSONS), limits=replace(LIMITS, deadline=120))
    assert all(o.ok for o in outcomes), outcomes
    # A plot output with no description, as the inline backend writes it, in the plot cell's outputs.
    path = work / "autograded" / "mallory" / "01-masks" / "01-masks.ipynb"
    nb = nbformat.read(path, as_version=4)
    plot_cell = next(cell for cell in nb.cells if cell.source == PLOT_CELL)
    plot_cell.outputs.append(new_output("display_data", data={"image/png": _plot_png(),
                                                              "text/plain": "<Figure size 200x200 with 1 Axes>"}))
    nbformat.write(nb, path)
    return {"work": work, "jobs": [(work, student, lesson) for student, lesson in submissions] +
            [(pipeline.canary_work(work), pipeline.CANARY, lesson) for lesson in LESSONS]}


def _page(work: Path, student: str, lesson: str, exporter_class) -> str:
    """The feedback page as ``./course grade`` writes it, with ``exporter_class``."""
    grader = pipeline.api(work)
    if exporter_class is HTMLExporter:  # the stock exporter, with the course's template as FeedbackExporter has it
        exporter_class = type("StockExporter", (HTMLExporter,), {})
        grader.config.StockExporter = copy.deepcopy(grader.config.FeedbackExporter)
    grader.config.GenerateFeedback.exporter_class = exporter_class
    result = grader.generate_feedback(lesson, student, force=True)
    assert result["success"], result["log"]
    return (work / "feedback" / student / lesson / f"{lesson}.html").read_text()


@pytest.fixture
def fixed_seal(monkeypatch):
    """The same seal on every page, so that two renders of a notebook can be compared."""
    monkeypatch.setattr(feedback, "secrets", types.SimpleNamespace(token_hex=lambda n: "5e" * n))


def test_the_course_writes_feedback_with_the_feedback_exporter(tmp_path, monkeypatch):
    """./course grade (nbgrader_config) and nbgrader's own tools (tools_config, from nbgrader_config.py)."""
    monkeypatch.setattr(pipeline, "_stage_generate_assignment", lambda: None)  # nbgrader's modules untouched
    monkeypatch.delenv("DECODER_COURSE_WORK", raising=False)
    for config in (pipeline.nbgrader_config(tmp_path), pipeline.tools_config(Config(), tmp_path)):
        converter = GenerateFeedback(coursedir=None, config=config)
        assert converter.exporter_class is FeedbackExporter
        exporter = converter.exporter_class(parent=converter, config=converter.config)  # as converter.start does
        # its own section: the course's page (nbgrader's, with a language, <main> and headings in order)
        assert (exporter.template_name, exporter.template_file) == (exporters.PAGE_TEMPLATE, exporters.PAGE_FILE)
        assert converter.preprocessors[-1] == "autograder.pages.feedback.SafeFeedback"


@pytest.mark.pipeline
def test_graded_pages_are_the_html_exporters(graded, fixed_seal):
    """For every graded notebook, the same tree as HTMLExporter's page, with every kind of image in it."""
    pages = {}
    for work, student, lesson in graded["jobs"]:
        stock = _page(work, student, lesson, HTMLExporter)
        ours = _page(work, student, lesson, FeedbackExporter)
        assert differences(stock, ours) == [], (student, lesson)
        assert _count(ours, "alt") == _count(stock, "alt") and _count(ours, "tabindex") == _count(stock, "tabindex")
        pages[student, lesson] = ours
    assert "seal 5E5E-5E5E" in pages["ada", "01-masks"]
    images = {key: _images(page) for key, page in pages.items()}
    assert all(img.get("alt") is not None for found in images.values() for img in found)
    mine = images["mallory", "01-masks"]
    described = {img["alt"] for img in mine}
    assert {"a drawn line", "given"} <= described  # a markdown image's and an HTML output's own description
    no_alt = [img for img in mine if img["alt"] == NO_ALT]
    # the plot, the markdown <img> and the HTML output's <img> (and the kernel's plot, where it draws inline)
    assert len(no_alt) >= 3 and all(img["src"].startswith("data:image/png;base64,") for img in no_alt)
    lesson_05 = images["ada", "05-decoder-layer"]
    assert any(img["alt"] not in ("", NO_ALT) for img in lesson_05), "lesson 05's described figure"
    assert problems(pages["mallory", "01-masks"]) == []


@pytest.mark.pipeline
def test_the_comparison_catches_an_exporter_that_drops_an_alt(graded, fixed_seal):
    class DropsAnAlt(FeedbackExporter):
        def from_notebook_node(self, nb, resources=None, **kw):
            page, resources = super().from_notebook_node(nb, resources, **kw)
            return page.replace(f' alt="{NO_ALT}"', "", 1), resources

    work = graded["work"]
    stock = _page(work, "mallory", "01-masks", HTMLExporter)
    broken = _page(work, "mallory", "01-masks", DropsAnAlt)
    assert differences(stock, broken) != []
    assert _count(broken, "alt") == _count(stock, "alt") - 1


# -- constructed notebooks -------------------------------------------------------------------------------------
def _render(exporter_class, nb, safe: bool = True, **traits) -> str:
    """As tests/test_feedback.py renders: nbgrader's feedback template and paths, SafeFeedback, no default steps."""
    config = copy.deepcopy(GenerateFeedback(coursedir=None, config=Config()).config)
    config.Exporter.default_preprocessors = []
    for name, value in traits.items():
        setattr(config.HTMLExporter, name, value)
    exporter = exporter_class(config=config)
    if safe:
        exporter.register_preprocessor(SafeFeedback(), enabled=True)
    resources = {"nbgrader": {"notebook": "01-masks", "assignment": "01-masks", "student": "mallory", "score": 1,
                              "max_score": 2, "late_penalty": 0}}
    return exporter.from_notebook_node(copy.deepcopy(nb), resources)[0]


def test_the_hostile_notebooks_page_is_the_html_exporters_and_inert(fixed_seal):
    nb = attack_notebook()
    stock, ours = _render(HTMLExporter, nb), _render(FeedbackExporter, nb)
    assert differences(stock, ours) == []
    assert problems(ours) == []


def _lab_notebook() -> nbformat.NotebookNode:
    return new_notebook(cells=[
        new_markdown_cell("# A title\n\nAn image: <img src=\"data:image/png;base64," + PNG + "\">"),
        new_code_cell("print(1)", execution_count=1, outputs=[
            new_output("stream", name="stdout", text="1\n"),
            new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})]),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def test_lab_template_cells_get_their_tabindex(monkeypatch):
    """The lab template's cells are made focusable: the page is nbconvert's own pass, the same tree."""
    nb = _lab_notebook()
    stock = _render(HTMLExporter, nb, safe=False, template_name="lab")
    ours = _render(FeedbackExporter, nb, safe=False, template_name="lab")
    assert _count(stock, "tabindex", "0") >= 3 and _count(stock, "alt", NO_ALT) == 2
    assert differences(stock, ours) == []
    # A scanner that does not know which divs nbconvert makes focusable drops their tabindex: the test sees it.
    monkeypatch.setattr(exporters, "FOCUSABLE", ())
    broken = _render(FeedbackExporter, nb, safe=False, template_name="lab")
    assert differences(stock, broken) != []
    assert _count(broken, "tabindex", "0") < _count(stock, "tabindex", "0")
    assert _count(broken, "alt", NO_ALT) == 2  # the scanner still gave both images their alt


# -- the scanner -----------------------------------------------------------------------------------------------
READ = [
    '<p>x</p><img src="a">',
    '<img src="a" alt="">',
    "<img ALT src=a>",
    "<IMG SRC=x><img/src=y><img\nsrc=z><imgx src=1>",
    '<img src="data:image/png;base64,AAA\nBBB"\nwidth=20\n>',
    "<style>p{}</style><img><SCRIPT>x</script ><img>",
    '<!DOCTYPE html><!-- a comment --><a title="x > y" href=\'#\'>t</a><img src=1 title="a &quot;b&quot;">',
    '<div class="highlight"><pre><span class="n">x</span> &lt;img src=x&gt;</pre></div><br/><img>',
]
NOT_READ = [  # a <img that is not the start of an image tag, or markup opened in a way the scanner does not read
    '<a title="<img onclick=x>">t</a>',
    "<a title='<img onclick=x>'>t</a>",
    '<a x"y="<img onclick=1>">',
    "<a title=<img onclick=1>",
    '</a title="<img>">',
    "<!-- <img src=x> --><p>",
    '<script>var a = "<img src=x>";</script>',
    "<title><img src=x></title>",
    "<textarea><img src=x></textarea>",
    "<script>never closed <img>",
    '<img src="x"',
    "<p>a <!-- comment never closed <img>",
    "<plaintext><img>",
    "<img src=x>\x00",
    '<div class="jp-Cell-inputWrapper">x</div>',
    '<div class="a jp-OutputArea&#45;output">x</div>',
]


@pytest.mark.parametrize("page", READ)
def test_the_scanner_makes_nbconverts_edits(page):
    edited = accessibility_edits(page)
    assert edited is not None
    stock, missing = exporters._soup_edits(page)
    assert differences(stock, edited[0]) == [] and edited[1] == missing


@pytest.mark.parametrize("page", NOT_READ)
def test_the_scanner_leaves_what_it_does_not_read_to_nbconvert(page):
    assert accessibility_edits(page) is None
