"""The class report's page in a real (headless) Chromium: no script runs, nothing is fetched, axe-core is clean.

The class is synthetic (bench/report.py builds it without grading: a gradebook and autograded notebooks) and
hostile: a student id, a verdict line (a student's exception message) and a line of exercise code carry markup
that would run script if any of it reached the page as HTML. The page is opened from disk with every request that
is not a file of the report refused. axe-core (axe-playwright-python, which ships axe.min.js) must find no serious
or critical violation. Screenshot: /tmp/report-shots/class-report.png (the path is printed; ``pytest -s``).
"""

from pathlib import Path

import pytest

from bench.report import synthetic_class
from tests import test_browser

pytestmark = pytest.mark.notebook

SHOTS = Path("/tmp/report-shots")
PWNED = "pwned"
HOSTILE_ID = f"<img src=x onerror=\"document.title='{PWNED}'\">"
HOSTILE_LINE = f"<script>document.title='{PWNED}'</script>"
HOSTILE_CODE = f"# </pre><script>document.title='{PWNED}'</script><b onmouseover=alert(1)>"
LESSONS = ["01-masks", "02-attention"]
browser = test_browser.browser  # the same headless Chromium fixture


@pytest.fixture(scope="module")
def page_path(tmp_path_factory):
    from autograder.pages import report

    work = tmp_path_factory.mktemp("class")
    students = ["ada", "bea", "cy", "dee", HOSTILE_ID, "zed"]
    synthetic_class(work, students, LESSONS, seed=3, verdict_lines={HOSTILE_ID: HOSTILE_LINE},
                    code_extra={HOSTILE_ID: HOSTILE_CODE}, copied=("ada", "zed"))
    return report.write(work)


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []
    folder = path.parent.as_uri() + "/"

    def only_the_report(route):
        if route.request.url.startswith(folder):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_report)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, refused, dialogs


def test_no_script_runs_and_student_markup_stays_text(browser, page_path):
    page, refused, dialogs = _open(browser, page_path)
    page.hover("body")
    assert page.title() == "Class report" and not dialogs
    assert page.locator("script").count() == 0
    assert page.locator("img[src='x']").count() == 0 and page.locator("b[onmouseover]").count() == 0
    text = page.inner_text("body")
    assert HOSTILE_ID in text, "the hostile student id must show, as text"
    assert HOSTILE_LINE in text, "the hostile verdict line must show, as text"
    assert not refused, f"the page asked for something outside its folder: {refused}"
    for name in ("students-by-name.html", "students-by-late.html"):
        other, refused, dialogs = _open(browser, page_path.parent / name)
        assert other.title().startswith("Class report") and not dialogs and not refused
        assert other.locator("script").count() == 0 and HOSTILE_ID in other.inner_text("body")
        other.close()
    page.close()


def test_the_copied_code_is_shown_side_by_side_with_its_lines_marked(browser, page_path):
    page, _, _ = _open(browser, page_path)
    heading = page.locator("h3", has_text="ada and zed")
    assert heading.count() == 1, page.inner_text("section[aria-labelledby=similarity]")
    assert "(flagged)" in heading.inner_text()
    assert page.locator("section[aria-labelledby=similarity] mark").count() > 0
    page.close()


def test_every_figure_loads_and_says_what_it_shows(browser, page_path):
    page, refused, _ = _open(browser, page_path)
    figures = page.locator("img")
    assert figures.count() == len(LESSONS)
    for i in range(figures.count()):
        img = figures.nth(i)
        assert img.evaluate("(e) => e.complete && e.naturalWidth > 0"), img.get_attribute("src")
        alt = img.get_attribute("alt") or ""
        assert alt.startswith("Bar chart for lesson") and "lost it" in alt, alt
    assert not refused
    page.close()


def test_axe_finds_no_serious_or_critical_violation_and_a_screenshot_is_taken(browser, page_path):
    from axe_playwright_python.sync_playwright import Axe

    page, _, _ = _open(browser, page_path)
    results = Axe().run(page)
    bad = [(v["id"], v["impact"], v["help"], [n["target"] for n in v["nodes"]][:3])
           for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "class-report.png"
    page.screenshot(path=str(shot), full_page=False)
    print(f"screenshot: {shot}")
    assert results.response["passes"], "axe ran no rule"
    assert not bad, bad
    page.close()
