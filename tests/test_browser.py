"""Lesson 01 in JupyterLab 4, in a real (headless) Chromium, as a student runs it: Run > Run All Cells.

JupyterLab serves a copy of the released lesson and of its solution notebook on 127.0.0.1 with a token; Playwright
drives Debian's Chromium (``./course setup`` installs it). Every request that leaves loopback is blocked (the
Colab badge's image is the only one a lesson makes, so it shows as a broken image). The notebook is then saved
from the browser and read back through the Jupyter contents API.

Screenshots: /tmp/browser-shots/release.png (the first unfinished exercise's check) and solution.png (a mask
plot under the checks that passed); the paths and timings are printed (``pytest -s`` shows them).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.notebook

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LESSON = "01-masks"
SHOTS = Path("/tmp/browser-shots")
# Kernel status and how many code cells are running, read from JupyterLab's own objects.
STATE_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || !w.sessionContext || !w.content.model) return 'loading';
  const kernel = w.sessionContext.session?.kernel;
  const running = Array.from(w.content.model.cells).filter(c => c.type === 'code' && c.executionState === 'running');
  return (kernel ? kernel.status : 'no-kernel') + ':' + running.length;
}"""
# What a student does after Run All stops at an unfinished exercise: select the next cell, Run > Run Selected
# Cell and All Below. Done through JupyterLab's command of that menu item.
RUN_BELOW_JS = """(index) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = index;
  return window.jupyterapp.commands.execute('notebook:run-all-below');
}"""
# Whether the cell at ``index`` has started (running now, or run): the command above only asks JupyterLab to run it.
STARTED_JS = """(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.model.cells.get(index);
  return cell.executionState === 'running' || cell.executionCount !== null;
}"""
SCROLL_TO_JS = """(index) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = index;
  return nb.scrollToItem(index, 'start');
}"""
# The student's JupyterLab: no nbgrader (an instructor's extension), no announcements pop-up, no update check.
PAGE_CONFIG = {"disabledExtensions": {"@jupyter/nbgrader": True,
                                      "@jupyterlab/apputils-extension:announcements": True}}
SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {
    f"nbgrader.server_extensions.{name}": False
    for name in ("formgrader", "validate_assignment", "assignment_list", "course_list")}}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on loopback, with its own config, settings and runtime folders under ``home``.

    By default the student's (no nbgrader); tests/test_formgrader.py passes the instructor's page and server
    config, its own working folder (where nbgrader finds ``nbgrader_config.py``) and environment.
    """

    def __init__(self, home: Path, root: Path, *, cwd: Path | None = None, page_config: dict = PAGE_CONFIG,
                 server_config: dict = SERVER_CONFIG, env: dict | None = None):
        self.port, self.token, self.root = _free_port(), os.urandom(12).hex(), root
        self.base = f"http://127.0.0.1:{self.port}"
        config = home / "config"
        (config / "labconfig").mkdir(parents=True)
        (config / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
        (config / "jupyter_server_config.json").write_text(json.dumps(server_config))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
               "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "ws"),
               "OMP_NUM_THREADS": "1", **(env or {})}
        env.pop("MPLBACKEND", None)  # the kernel draws inline, as for a student
        self.log = home / "jupyterlab.log"
        self._log_file = open(self.log, "w")  # closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None"],
            cwd=cwd or home, env=env, stdout=self._log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited: {self.log.read_text()[-3000:]}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise RuntimeError(f"JupyterLab did not answer in 60 s: {self.log.read_text()[-3000:]}")

    def api(self, path: str) -> dict:
        request = urllib.request.Request(f"{self.base}/api/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def saved(self, relpath: str) -> dict:
        """The notebook as saved on the server (the contents API's JSON model).

        A read that races the server's own write answers 400 ("Unreadable Notebook"): try again briefly.
        """
        for attempt in range(25):
            try:
                return self.api(f"contents/{relpath}?content=1")["content"]
            except urllib.error.HTTPError as error:
                if error.code != 400 or attempt == 24:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self.process.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run ./course setup (it installs Debian's chromium)"
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    for name, source in (("release", ROOT / "lessons"), ("solution", ROOT / "solutions")):
        (root / name).mkdir(parents=True)
        shutil.copy(source / LESSON / f"{LESSON}.ipynb", root / name / f"{LESSON}.ipynb")
    started = time.perf_counter()
    server = Lab(home, root)
    print(f"\nJupyterLab up in {time.perf_counter() - started:.1f} s")
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


def _wait_idle(page, timeout: float = 60.0) -> None:
    """Wait until the kernel is idle and no cell runs, three polls in a row; accept the kernel dialog if shown."""
    deadline, stable = time.monotonic() + timeout, 0
    while stable < 3:
        assert time.monotonic() < deadline, f"the notebook did not finish in {timeout} s: {page.evaluate(STATE_JS)}"
        dialog = page.locator(".jp-Dialog")
        if dialog.count() and "Select Kernel" in dialog.inner_text():
            dialog.locator(".jp-mod-accept").click()  # "Python 3 (ipykernel)", what a student clicks
        stable = stable + 1 if page.evaluate(STATE_JS) == "idle:0" else 0
        page.wait_for_timeout(250)


def loopback_page(browser, lab, width: int) -> tuple:
    """A new page that may reach only ``lab``'s server: (the page, the list every other URL it asked for goes to,
    refused)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    blocked: list[str] = []

    def only_loopback(route):
        if route.request.url.startswith(lab.base):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", only_loopback)
    return page, blocked


def _open_and_run_all(lab, browser, relpath: str):
    """Open ``relpath`` in JupyterLab and click Run > Run All Cells; returns the page and the blocked requests."""
    page, blocked = loopback_page(browser, lab, width=1280)
    page.goto(f"{lab.base}/lab/tree/{relpath}?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _wait_idle(page)
    _menu(page, "Run", "Run All Cells")
    page.wait_for_timeout(500)
    _wait_idle(page)
    return page, blocked


def _menu(page, menu: str, item: str) -> None:
    """Click ``menu`` in JupyterLab's menu bar, then ``item`` in it."""
    page.locator(".lm-MenuBar-itemLabel").get_by_text(menu, exact=True).click()
    page.locator(".lm-Menu").get_by_text(item, exact=True).click()


def _save(lab, page, relpath: str) -> dict:
    """File > Save Notebook in the browser, then the notebook as the server has it (outputs included)."""
    # content=0: the file's metadata only; reading the content while the server writes it answers 400
    before = lab.api(f"contents/{relpath}?content=0")["last_modified"]
    _menu(page, "File", "Save Notebook")  # (Ctrl+S goes nowhere while focus sits on the load spinner)
    deadline = time.monotonic() + 20
    while lab.api(f"contents/{relpath}?content=0")["last_modified"] == before:
        if time.monotonic() > deadline:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "failed-save.png"))
            raise AssertionError(f"File > Save Notebook did not save the notebook; see {SHOTS / 'failed-save.png'}")
        page.wait_for_timeout(200)  # (time.sleep would stall Playwright's request routing)
    return lab.saved(relpath)


def _code_cells(nb: dict) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _errors(cell: dict) -> list[dict]:
    return [o for o in cell["outputs"] if o["output_type"] == "error"]


def _is_graded(cell: dict) -> bool:
    return bool(cell["metadata"].get("nbgrader", {}).get("grade"))


def _stdout(cell: dict) -> str:
    return "".join(o["text"] for o in cell["outputs"] if o["output_type"] == "stream" and o["name"] == "stdout")


def _shoot(page, index: int, name: str) -> Path:
    page.evaluate(SCROLL_TO_JS, index)
    page.wait_for_timeout(500)  # let the scroll settle and images decode
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def test_release_runs_in_jupyterlab_with_only_not_implemented_errors(lab, browser):
    started = time.perf_counter()
    relpath = f"release/{LESSON}.ipynb"
    page, blocked = _open_and_run_all(lab, browser, relpath)
    nb = _save(lab, page, relpath)
    cells = _code_cells(nb)
    graded = [i for i, c in cells if _is_graded(c)]
    assert len(graded) == 4, "lesson 01 has four graded exercises"
    # Run All stops at the first unfinished exercise, whose check says so (JupyterLab stops on an error).
    ran = [i for i, c in cells if c["execution_count"] is not None]
    assert ran and ran[-1] == graded[0], f"Run All should stop at the first check, ran {ran}"
    first = _errors(nb["cells"][graded[0]])
    assert first and first[0]["ename"] == "CheckFailed" and "is not implemented yet" in first[0]["evalue"], first
    shot = _shoot(page, graded[0], "release")

    # Then, as a student who reads on: run from the next cell down, again after each stop.
    while True:
        pending = [i for i, c in cells if c["execution_count"] is None]
        if not pending:
            break
        page.evaluate(RUN_BELOW_JS, pending[0])
        # started before idle counts: on a loaded machine the kernel may still be idle 300 ms after the command
        page.wait_for_function(STARTED_JS, arg=pending[0], timeout=30_000)
        _wait_idle(page)
        nb = _save(lab, page, relpath)
        cells = _code_cells(nb)
        assert [i for i, c in cells if c["execution_count"] is None] != pending, "nothing ran"

    for i, cell in cells:
        for error in _errors(cell):
            expected = error["ename"] == "NotImplementedError" or (
                error["ename"] == "CheckFailed" and "is not implemented yet" in error["evalue"])
            assert expected, f"cell {i} raised {error['ename']}: {error['evalue']}"
    for i in graded:
        [error] = _errors(nb["cells"][i])
        # The visible check ran: its message names the check and the function still to write.
        assert error["ename"] == "CheckFailed" and error["evalue"].startswith("✗ "), error
        name = nb["cells"][i]["metadata"]["nbgrader"]["grade_id"]
        assert f"`{name}` is not implemented yet" in error["evalue"], error["evalue"]
    assert all(url.startswith("https://colab.research.google.com/") for url in blocked), blocked
    page.close()
    print(f"release: {time.perf_counter() - started:.1f} s in the browser; {shot}")
    assert shot.stat().st_size > 10_000  # a real picture, not an empty page


def test_solution_runs_in_jupyterlab_without_any_error(lab, browser):
    started = time.perf_counter()
    relpath = f"solution/{LESSON}.ipynb"
    page, _ = _open_and_run_all(lab, browser, relpath)
    nb = _save(lab, page, relpath)
    cells = _code_cells(nb)
    assert all(c["execution_count"] is not None for _, c in cells), "Run All must run every cell"
    for i, cell in cells:
        assert not _errors(cell), f"cell {i} raised {_errors(cell)[0]['ename']}: {_errors(cell)[0]['evalue']}"
    graded = [c for _, c in cells if _is_graded(c)]
    assert len(graded) == 4
    for cell in graded:
        lines = _stdout(cell).splitlines()
        assert lines and all(line.startswith("✓ ") for line in lines), lines  # every visible check printed ✓
    # Images are inline PNGs inside the notebook: they render wherever this one file is opened.
    plots = [i for i, c in cells if any("image/png" in o.get("data", {}) for o in c["outputs"])]
    assert len(plots) >= 2, "the mask plots must be displayed inline"
    shot = _shoot(page, plots[0] - 1, "solution")
    page.close()
    print(f"solution: {time.perf_counter() - started:.1f} s in the browser; {shot}")
    assert shot.stat().st_size > 10_000
