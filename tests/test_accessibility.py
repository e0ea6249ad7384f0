"""A feedback page and a released lesson in JupyterLab, read by axe-core in a real (headless) Chromium (issue 37).

axe-core (axe-playwright-python, which ships axe.min.js) must find no serious or critical violation, and the
violations found are listed in the failure's message.

- **The feedback page** of a graded submission (``./course grade``, :func:`autograder.grading.grade_class.grade`):
the
  release of 01-masks with typical mistakes and a cell of the student's own that plots their mask. It is opened
  from disk with every request outside its folder refused (MathJax's CDN). Besides axe: a language, one ``<main>``
  that holds the page, the page's title as its first heading, no heading level skipped, and the student's figure
  shown with its description as ``alt``.
- **A released lesson in JupyterLab**: 02-attention's release with every exercise answered (the reference code
  typed in, ``samples.perfect``), executed first with nbclient so that its figures are there, then opened in a real
  JupyterLab server (token, loopback, no browser). Every figure of its outputs is an ``<img>`` whose ``alt`` is the
  description the plotting code computed. axe is scoped to the notebook's cells (``.jp-Notebook .jp-Cell``) without
  their code editors (``.jp-InputArea-editor``): JupyterLab's own chrome (menus, side bars, status bar), the
  notebook's list that holds the cells and its CodeMirror editor are not the course's to fix, and axe reports
  violations there whatever the notebook holds (the editor's scroller is an ARIA input field without a name,
  ``aria-input-field-name``, serious; the windowed list, ``.jp-WindowedPanel-viewport``, has children that are not
  list items, ``aria-required-children``, critical). Everything the course writes stays in scope: markdown,
  prompts, outputs and the figures' alt text.

Screenshots: /tmp/browser-shots/feedback.png and lesson-in-lab.png (the paths are printed; ``pytest -s``).
"""

import shutil
import time
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

from autograder.course import samples
from autograder.grading import grade_class
from autograder.sandbox import launch as sandbox
from tests import test_browser
from tests.test_feedback import LIMITS

pytestmark = pytest.mark.notebook

SHOTS = test_browser.SHOTS
SERIOUS = ("serious", "critical")
FEEDBACK_LESSON = "01-masks"
LAB_LESSON = "02-attention"
# A student's own plot in the graded notebook: not a demonstration cell, so grading runs it and the feedback
# shows it.
STUDENT_PLOT = "plot_mask(causal_mask(5), title='my causal mask');"
# ... and one drawn with pyplot alone, in a graded kernel forked from the warm sandbox's zygote (which imported the
# package before the kernel's shell existed): its description must reach the page too.
PLAIN_PLOT = "import matplotlib.pyplot as plt\nplt.plot([3.0, 1.0, 2.0])\nplt.title('my own curve')\nplt.show()"
browser = test_browser.browser  # the same headless Chromium fixture
# What axe reads of a lesson in JupyterLab: the notebook's cells, but JupyterLab's code editor (see the docstring).
LESSON_SCOPE = {"include": [[".jp-Notebook .jp-Cell"]], "exclude": [[".jp-InputArea-editor"]]}
# Headings in document order, each as its level and text, from the page's own DOM.
HEADINGS_JS = """(root) => Array.from((root ? document.querySelector(root) : document)
    .querySelectorAll('h1, h2, h3, h4, h5, h6')).map(h => [Number(h.tagName[1]), h.textContent.trim()])"""


def serious_violations(page, context: str | None = None) -> tuple[list, dict]:
    """axe-core's serious and critical violations on ``page`` (within ``context``, a CSS selector, when given):
    each as its rule, impact, help text and up to three of its nodes; and axe's whole response."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page, context=context)
    bad = [(v["id"], v["impact"], v["help"], [n["target"] for n in v["nodes"]][:3])
           for v in results.response["violations"] if v["impact"] in SERIOUS]
    return bad, results.response


def skipped_levels(headings: list) -> list:
    """The headings that go down more than one level from the one before (h1 then h3)."""
    return [(before, after) for before, after in zip(headings, headings[1:], strict=False) if after[0] > before[0] + 1]


@pytest.fixture(scope="module")
def feedback_page(tmp_path_factory):
    sandbox.check_available()
    home = tmp_path_factory.mktemp("feedback")
    nb = samples.typical_mistakes(FEEDBACK_LESSON)
    last_exercise = max(i for i, c in enumerate(nb.cells) if c.metadata.get("course", {}).get("exercise"))
    nb.cells.insert(last_exercise + 2, new_code_cell(STUDENT_PLOT))  # after the exercise's test cell
    nb.cells.insert(1, new_code_cell(PLAIN_PLOT))  # before any helper has drawn (a helper registers it too)
    path = home / "incoming" / "alan" / FEEDBACK_LESSON / f"{FEEDBACK_LESSON}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MPLBACKEND", raising=False)  # the kernel draws inline, as for a student (conftest: Agg)
        outcomes = grade_class.grade(home / "incoming", home / "work", [FEEDBACK_LESSON], limits=replace(LIMITS))
    assert all(o.ok for o in outcomes), outcomes
    page = home / "work" / "feedback" / "alan" / FEEDBACK_LESSON / f"{FEEDBACK_LESSON}.html"
    assert page.exists(), f"no feedback page: {sorted(p.name for p in page.parent.parent.rglob('*'))}"
    return page


def _open_file(browser, path: Path):
    """``path`` in a new page that may load only files of its own folder."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    folder, refused = path.parent.as_uri() + "/", []

    def only_the_folder(route):
        if route.request.url.startswith(folder) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_folder)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, refused


def test_the_feedback_page_has_a_language_landmarks_and_headings_in_order(browser, feedback_page):
    page, _ = _open_file(browser, feedback_page)
    assert page.evaluate("document.documentElement.lang") == "en"
    assert page.locator("main").count() == 1
    # everything the page shows is inside <main>: nothing of the body's text outside it
    outside = page.evaluate("""() => Array.from(document.body.children)
        .filter(e => !['MAIN', 'SCRIPT', 'STYLE'].includes(e.tagName) && e.textContent.trim())
        .map(e => e.outerHTML.slice(0, 80))""")
    assert outside == [], outside
    headings = page.evaluate(HEADINGS_JS, None)
    assert headings and headings[0][0] == 1 and FEEDBACK_LESSON in headings[0][1], headings[:3]
    assert any(level == 2 and text.startswith("Grader's report") for level, text in headings), headings[:5]
    assert skipped_levels(headings) == [], skipped_levels(headings)
    page.close()


def test_the_students_figure_reaches_the_feedback_with_its_description(browser, feedback_page):
    page, _ = _open_file(browser, feedback_page)
    images = page.locator("main img")
    alts = [images.nth(i).get_attribute("alt") or "" for i in range(images.count())]
    # alan's causal_mask is one of the typical mistakes (the diagonal blocked): the description says what it drew
    assert any(alt.startswith("'my causal mask': mask 5×5") and "query 0: no key; query 1: key 0;" in alt
               for alt in alts), alts
    assert all(alt.strip() for alt in alts), alts
    assert any("my own curve" in alt for alt in alts), f"the pyplot figure came without its description: {alts}"
    loaded = page.evaluate("() => Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    assert loaded, "an image of the feedback page did not load"
    page.close()


def test_axe_finds_no_serious_or_critical_violation_on_the_feedback_page(browser, feedback_page):
    page, _ = _open_file(browser, feedback_page)
    bad, response = serious_violations(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "feedback.png"))
    print(f"screenshot: {SHOTS / 'feedback.png'}")
    assert response["passes"], "axe ran no rule"
    assert not bad, bad
    page.close()


@pytest.fixture(scope="module")
def lab_with_an_executed_lesson(tmp_path_factory):
    """JupyterLab serving 02-attention's release, answered and executed (its outputs saved in the file)."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    root.mkdir()
    nb = samples.perfect(LAB_LESSON)
    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MPLBACKEND", raising=False)  # inline figures, as in a student's kernel
        patch.setenv("OMP_NUM_THREADS", "1")
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    print(f"\n{LAB_LESSON} executed in {time.perf_counter() - started:.1f} s")
    nbformat.write(nb, root / f"{LAB_LESSON}.ipynb")
    shutil.copy(root / f"{LAB_LESSON}.ipynb", home / "executed.ipynb")  # what the server serves, kept apart
    server = test_browser.Lab(home, root)
    yield server, nb
    server.close()


def _figures(nb) -> list[str]:
    """The alt text of each figure output of the executed notebook, in order."""
    import html
    import re

    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            page = output.get("data", {}).get("text/html", "")
            found += [html.unescape(alt) for alt in re.findall(r'<img src="data:image/png[^"]*" alt="([^"]*)"', page)]
    return found


def test_a_released_lesson_in_jupyterlab_shows_every_figure_with_its_description(browser, lab_with_an_executed_lesson):
    lab, nb = lab_with_an_executed_lesson
    expected = _figures(nb)
    assert len(expected) >= 3 and all(alt.strip() for alt in expected), expected
    page, _ = test_browser.loopback_page(browser, lab, width=1280)
    page.goto(f"{lab.base}/lab/tree/{LAB_LESSON}.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # JupyterLab renders cells as they scroll into view: show every one, then read the figures' alt text.
    page.evaluate("""async () => { const nb = window.jupyterapp.shell.currentWidget.content;
        for (let i = 0; i < nb.widgets.length; i++) { await nb.scrollToItem(i, 'start'); } }""")
    page.wait_for_function(f"document.querySelectorAll('.jp-OutputArea-output img').length >= {len(expected)}",
                           timeout=60_000)
    shown = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
                          ".map(i => i.getAttribute('alt'))")
    assert shown == expected, (shown, expected)
    page.close()


def test_axe_finds_no_serious_or_critical_violation_in_the_lessons_cells(browser, lab_with_an_executed_lesson):
    lab, _ = lab_with_an_executed_lesson
    page, _ = test_browser.loopback_page(browser, lab, width=1280)
    page.goto(f"{lab.base}/lab/tree/{LAB_LESSON}.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output img", timeout=60_000)
    test_browser._wait_idle(page)
    bad, response = serious_violations(page, context=LESSON_SCOPE)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "lesson-in-lab.png"))
    print(f"screenshot: {SHOTS / 'lesson-in-lab.png'}")
    assert response["passes"], "axe ran no rule"
    assert any(rule["id"] == "image-alt" for rule in response["passes"]), "axe did not check the figures' alt"
    assert not bad, bad
    page.close()
