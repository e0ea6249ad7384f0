"""The course's figures: drawn by one script, embedded in the notebooks as attachments, each with alt text.

``assets/draw_figures.py`` draws every PNG in ``assets/``; a lesson shows one with a markdown line
``![alt text](assets/<name>.png)`` in its percent source, which the builder turns into a cell attachment.
"""

import base64
import importlib.util
import io
import re
import subprocess
import sys

import nbformat
import numpy as np
import pytest
from PIL import Image

from autograder.course import notebooks
from tests.conftest import ROOT

ASSETS = ROOT / "assets"
LESSONS = notebooks.lessons()

# Figures drawn ahead of the lesson that will show them: name -> that lesson's id. A figure may stay here only
# while its lesson has no source yet (test_figures_waiting_for_a_lesson_wait_for_one_that_does_not_exist_yet).
AWAITING_LESSON: dict[str, str] = {}  # figure -> the lesson that will show it


def _draw_figures():
    """assets/draw_figures.py as a module (assets/ is not a package)."""
    if "course_draw_figures" not in sys.modules:
        spec = importlib.util.spec_from_file_location("course_draw_figures", ASSETS / "draw_figures.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # before running it: dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["course_draw_figures"]


FIGURES = sorted(_draw_figures().FIGURES)


def _referenced(lesson: str) -> dict[str, str]:
    """The figures a lesson's source shows: name -> alt text (whitespace collapsed)."""
    markdown = notebooks._markdown([line for line in (notebooks.SOLUTIONS / f"{lesson}.py").read_text().splitlines()
                                    if line.startswith("#") and not line.startswith("# %%")])
    return {m["name"]: " ".join(m["alt"].split()) for m in notebooks.FIGURE.finditer(markdown)}


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))


def test_every_png_in_assets_is_drawn_by_the_script():
    on_disk = sorted(p.name for p in ASSETS.glob("*.png"))
    assert on_disk == FIGURES, (
        f"assets/ holds {on_disk} but draw_figures.FIGURES draws {FIGURES}: every figure needs its source")


def test_regenerating_the_figures_reproduces_the_committed_files(tmp_path):
    done = subprocess.run([sys.executable, str(ASSETS / "draw_figures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for name in FIGURES:
        fresh, committed = (tmp_path / name).read_bytes(), (ASSETS / name).read_bytes()
        if fresh == committed:
            continue
        # Not byte-identical (another zlib, say): then the decoded pixels must be.
        a, b = _pixels(fresh), _pixels(committed)
        assert a.shape == b.shape and np.array_equal(a, b), (
            f"assets/{name} is not what assets/draw_figures.py draws now: run `python assets/draw_figures.py`"
            " and `./course release`, then commit both")


def test_drawing_twice_gives_the_same_bytes(tmp_path):
    """The PNGs carry no date or version metadata: the same script writes the same file."""
    module = _draw_figures()
    first = module.draw(tmp_path / "a", ["attention_masks.png"])[0].read_bytes()
    second = module.draw(tmp_path / "b", ["attention_masks.png"])[0].read_bytes()
    assert first == second
    assert b"Software" not in first and b"matplotlib" not in first.lower()


@pytest.mark.parametrize("lesson", LESSONS)
def test_figures_a_lesson_shows_are_embedded_with_alt_text(lesson):
    wanted = _referenced(lesson)
    for name, alt in wanted.items():
        assert len(alt.split()) >= 8, f"{lesson}: the alt text of {name} should say what the figure shows: {alt!r}"
        committed = (ASSETS / name).read_bytes()
        for path in (notebooks.solution_path(lesson), ROOT / "lessons" / lesson / f"{lesson}.ipynb"):
            nb = nbformat.read(path, as_version=4)
            cells = [c for c in nb.cells if c.cell_type == "markdown" and name in c.get("attachments", {})]
            where = path.relative_to(ROOT)
            assert len(cells) == 1, f"{where}: {name} should be attached to one markdown cell, found {len(cells)}"
            cell = cells[0]
            assert f"![{alt}](attachment:{name})" in cell.source, f"{where}: {name} is attached but not shown"
            assert f"assets/{name}" not in cell.source, f"{where}: {name} still points at a file beside it"
            data = base64.b64decode(cell.attachments[name]["image/png"])
            assert data == committed, f"{where}: the attached {name} is not assets/{name}: run `./course release`"


@pytest.mark.parametrize("lesson", LESSONS)
def test_notebooks_attach_only_the_figures_their_source_shows(lesson):
    wanted = set(_referenced(lesson))
    for path in (notebooks.solution_path(lesson), ROOT / "lessons" / lesson / f"{lesson}.ipynb"):
        nb = nbformat.read(path, as_version=4)
        attached = {name for c in nb.cells for name in c.get("attachments", {})}
        assert attached == wanted, f"{path.relative_to(ROOT)}: attachments {attached}, source shows {wanted}"


def test_every_figure_is_shown_by_a_lesson():
    shown = {name for lesson in LESSONS for name in _referenced(lesson)}
    unshown = set(FIGURES) - shown - set(AWAITING_LESSON)
    assert not unshown, f"figures no lesson shows: {sorted(unshown)} (show them, or add them to AWAITING_LESSON)"
    assert shown <= set(FIGURES), f"lessons show figures the script does not draw: {sorted(shown - set(FIGURES))}"


def test_figures_waiting_for_a_lesson_wait_for_one_that_does_not_exist_yet():
    for name, lesson in AWAITING_LESSON.items():
        assert name in FIGURES, f"{name} waits for {lesson} but is not drawn"
        if (notebooks.SOLUTIONS / f"{lesson}.py").exists():
            assert name in _referenced(lesson), f"{lesson} exists now: show {name} there and drop it from the list"


def test_the_builder_embeds_a_figure_as_an_attachment():
    name = FIGURES[0]
    text, attachments = notebooks.embed_figures("x", f"Before.\n\n![a figure of\nthe thing](assets/{name})\n")
    assert text == f"Before.\n\n![a figure of the thing](attachment:{name})\n"
    assert base64.b64decode(attachments[name]["image/png"]) == (ASSETS / name).read_bytes()
    assert notebooks.embed_figures("x", "![a plot](https://example.org/a.png)") == (
        "![a plot](https://example.org/a.png)", {})


@pytest.mark.parametrize("markdown, error", [
    ("![](assets/{name})", "alt text"),
    ("![   ](assets/{name})", "alt text"),
    ("![a figure that is not there](assets/no_such_figure.png)", "not in assets"),
])
def test_the_builder_refuses_a_figure_without_alt_text_or_file(markdown, error):
    with pytest.raises(ValueError, match=error):
        notebooks.embed_figures("x", markdown.format(name=FIGURES[0]))


def test_a_released_figure_renders_in_html():
    """nbconvert (as JupyterLab, Colab and GitHub do) resolves the attachment into the page: no file needed."""
    from nbconvert import HTMLExporter

    lesson = next(lesson for lesson in LESSONS if _referenced(lesson))
    nb = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    html, _ = HTMLExporter().from_notebook_node(nb)
    name, alt = next(iter(_referenced(lesson).items()))
    data = re.escape(nb.cells[[i for i, c in enumerate(nb.cells) if name in c.get("attachments", {})][0]]
                     .attachments[name]["image/png"][:200])
    assert re.search(r'<img[^>]+src="data:image/png;base64,' + data, html), f"{name} is not inlined in the HTML"
    assert f'alt="{alt[:40]}' in html
