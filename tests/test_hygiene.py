"""Repository hygiene: ruff on the code and on the notebooks' code cells, stripped notebooks, self-contained
images, and a pre-commit configuration that agrees with the pins.

Ruff reads notebooks itself (one cell at a time for import order, IPython magics understood), so the notebooks are
linted as notebooks rather than as extracted cells: a cell that uses ``np`` imported two cells above is fine, as
it is for a student. The instructor notebooks are linted without nbgrader's hidden-test block (one generated
statement, identical in every graded cell, that nbgrader strips from the release); the release is linted whole.
"""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.course import notebooks
from tests.conftest import ROOT

PINS = dict(r.split("==") for r in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["project"]["optional-dependencies"]["dev"])
# Each area is linted on its own, so a failure says whose files need attention.
CODE_AREAS = {
    "decoder_course": (["decoder_course"], ["decoder_course/visible"]),
    "decoder_course/visible": (["decoder_course/visible"], []),
    "autograder": (["autograder"],
                   ["autograder/course/checks", "autograder/course/mutants", "autograder/course/reference"]),
    "autograder/course/reference": (["autograder/course/reference"], []),
    "autograder/course/checks": (["autograder/course/checks"], []),
    "autograder/course/mutants": (["autograder/course/mutants"], []),
    "tests": (["tests"], []),
    "assets": (["assets"], []),
    # the lessons' percent sources, which contributors edit (the built notebooks are linted below, as notebooks)
    "solutions": (["solutions"], []),
}
NOTEBOOK_DIRS = ("solutions", "lessons")


def ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *args], cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=120)


def _notebook_paths() -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_ruff_is_the_pinned_one():
    done = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == PINS["ruff"], done.stdout


@pytest.mark.parametrize("area", CODE_AREAS)
def test_ruff_passes_on_the_code(area):
    paths, excluded = CODE_AREAS[area]
    done = ruff(*paths, *(f"--extend-exclude={e}" for e in excluded))
    assert done.returncode == 0, f"ruff on {area}:\n{done.stdout}{done.stderr}"


def test_ruff_area_exclusion_still_lints(tmp_path):
    # The per-area lint must be able to fail: a known error in a scratch file is reported.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    done = ruff(str(bad))
    assert done.returncode == 1 and "F401" in done.stdout


def _lintable_copy(path: Path, dest: Path) -> Path:
    """The notebook at ``path``, without the generated hidden-test block of its graded cells."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        item = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "code" and item is not None:
            cell.source = cell.source.replace(notebooks.HIDDEN.format(item=item), "").lstrip("\n")
    out = dest / path.relative_to(ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


@pytest.mark.parametrize("folder", NOTEBOOK_DIRS)
def test_ruff_passes_on_the_notebooks_code_cells(folder, tmp_path):
    paths = [p for p in _notebook_paths() if p.relative_to(ROOT).parts[0] == folder]
    assert paths, f"no notebooks in {folder}/"
    copies = [_lintable_copy(p, tmp_path) for p in paths]
    # Same rules as the code: the repository's pyproject.toml, whatever folder the copies are in.
    done = ruff("--config", str(ROOT / "pyproject.toml"), *map(str, copies))
    report = done.stdout.replace(str(tmp_path) + "/", "")
    assert done.returncode == 0, f"ruff on the code cells of {folder}/*.ipynb:\n{report}{done.stderr}"


def test_notebook_lint_sees_code_cells_and_magics(tmp_path):
    """The notebook lint can fail, and IPython magics (the bootstrap's %pip) don't make it fail."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(notebooks.BOOTSTRAP.rstrip()),
                nbformat.v4.new_code_cell("import numpy as np\n"),
                nbformat.v4.new_code_cell("x = np.zeros(3)\nprint(x)\n")]
    good = tmp_path / "good.ipynb"
    nbformat.write(nb, good)
    assert ruff("--config", str(ROOT / "pyproject.toml"), str(good)).returncode == 0
    nb.cells.append(nbformat.v4.new_code_cell("print(undefined_name)\n"))
    nbformat.write(nb, good)
    done = ruff("--config", str(ROOT / "pyproject.toml"), str(good))
    assert done.returncode == 1 and "F821" in done.stdout


def test_hidden_block_removal_keeps_the_visible_checks(tmp_path):
    path = notebooks.solution_path("01-masks")
    copy = nbformat.read(_lintable_copy(path, tmp_path), as_version=4)
    graded = [c for c in copy.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert graded and all("HIDDEN TESTS" not in c.source and "visible.check_" in c.source for c in graded)


@pytest.mark.parametrize("path", _notebook_paths(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebooks_in_git_are_stripped(path):
    """No outputs, no execution counts, no widget state or trust signature in any committed notebook."""
    raw = json.loads(path.read_text())
    for index, cell in enumerate(raw["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name}: cell {index} has outputs (run ./course release)"
            assert cell["execution_count"] is None, f"{path.name}: cell {index} has an execution count"
    assert not {"widgets", "signature"} & set(raw["metadata"]), f"{path.name}: notebook metadata holds run state"


_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)|<img[^>]+src=[\"']([^\"']+)", re.I)


def _images(markdown: str) -> list[str]:
    return [a or b for a, b in _IMAGE.findall(markdown)]


@pytest.mark.parametrize("path", _notebook_paths(), ids=lambda p: str(p.relative_to(ROOT)))
def test_images_render_when_the_notebook_is_opened_alone(path):
    """Colab opens one notebook with no folder around it: an image must be a URL, inline data or an attachment."""
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for src in _images(cell.source):
            assert src.startswith(("https://", "data:", "attachment:")), (
                f"{path.name}: cell {index} shows {src!r}, a file beside the notebook: draw it with matplotlib "
                "in a code cell or attach it to the cell")
            if src.startswith("attachment:"):
                assert src.removeprefix("attachment:") in cell.get("attachments", {}), f"{path.name}: {src}"


def test_image_scan_sees_local_files():
    text = "![a](assets/x.png) and <img src='y.svg'> and ![b](https://example.org/z.png)"
    assert _images(text) == ["assets/x.png", "y.svg", "https://example.org/z.png"]


def _pre_commit() -> dict:
    return yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())


def _hooks() -> dict[str, tuple[dict, dict]]:
    return {hook["id"]: (repo, hook) for repo in _pre_commit()["repos"] for hook in repo["hooks"]}


def test_pre_commit_runs_the_pinned_ruff_on_code_and_notebooks():
    repo, hook = _hooks()["ruff"]
    assert repo["repo"].endswith("/ruff-pre-commit") and repo["rev"] == f"v{PINS['ruff']}", repo
    assert "jupyter" in hook["types_or"] and "python" in hook["types_or"]


def test_pre_commit_strips_notebook_outputs_where_they_live():
    repo, hook = _hooks()["nbstripout"]
    pattern = re.compile(hook["files"])
    for path in _notebook_paths():
        assert pattern.search(str(path.relative_to(ROOT))), path
    assert not pattern.search("docs/notes.md")


def test_pre_commit_rebuilds_the_notebooks_from_their_sources():
    repo, hook = _hooks()["course-release"]
    assert repo["repo"] == "local" and hook["entry"] == "./course release" and hook["pass_filenames"] is False
    pattern = re.compile(hook["files"])
    for changed in ("solutions/01-masks.py", "autograder/course/reference/masks.py", "autograder/course/notebooks.py",
                    "assets/decoder_block.png"):
        assert pattern.search(changed), changed
    assert (ROOT / "course").stat().st_mode & 0o111, "./course must be executable"
