"""Lesson 01 as Colab runs it: a clean virtualenv, a fake ``google.colab``, the bootstrap cell, then every cell.

The virtualenv has only what Colab ships that the course relies on: torch (the pinned CPU wheel), numpy,
matplotlib, and the IPython kernel (ipykernel). It is cached under ``.venv-colab/<hash>`` (ignored by git; about a
minute to build the first time, needing the package index once) and reset to that state before each run.

The notebook runs in a real IPython kernel of that virtualenv, not in an ``exec`` loop: Colab runs an IPython
kernel, the bootstrap's ``%pip`` line is IPython syntax, and inline figures come from ipykernel's matplotlib
backend, so this is the closest to Colab we can get offline. The kernel imports a fake ``google.colab`` at start,
as Colab's does, and ``DECODER_COURSE_SOURCE`` points the bootstrap's install at a copy of this checkout's package;
pip runs with no index (a local wheelhouse holds the light dependencies and the build backend), so nothing is
downloaded while the lesson runs.
"""

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder.course import notebooks
from tests.conftest import ROOT

pytestmark = pytest.mark.notebook

LESSON = "01-masks"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STUDENT_PINS = dict(r.split("==") for r in PYPROJECT["project"]["optional-dependencies"]["student"])
# Colab's own packages (torch, numpy, matplotlib) and its IPython kernel, at the course's pinned versions.
BASE = [f"{name}=={STUDENT_PINS[name]}" for name in (*notebooks.COLAB_PROVIDES, "ipykernel")]
# What the bootstrap installs from the index in Colab, here from a wheelhouse: its extras and the build backend.
WHEELHOUSE = [*notebooks.COLAB_EXTRAS, *PYPROJECT["build-system"]["requires"]]
CACHE = ROOT / ".venv-colab"
KEY = hashlib.sha256(json.dumps([sys.version_info[:2], BASE, WHEELHOUSE]).encode()).hexdigest()[:12]
INSTALLED_BY_BOOTSTRAP = {"decoder-course", "einops", "tqdm"}
KERNEL_START = "import google.colab; from ipykernel import kernelapp; kernelapp.launch_new_instance()"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze(python: Path) -> dict[str, str]:
    """``{distribution: version}`` installed in the virtualenv of ``python``."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return {_normalise(d["name"]): d["version"] for d in json.loads(out)}


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "--quiet", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stderr[-3000:]}"


@pytest.fixture
def colab_venv():
    """The cached clean virtualenv, built if missing, reset to its baseline; held under a lock while in use."""
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker or engineer may run this test at the same time
        venv = CACHE / KEY
        python = venv / "bin" / "python"
        if not (venv / "baseline.json").exists():
            for old in CACHE.iterdir():
                if old.is_dir():
                    shutil.rmtree(old)  # a virtualenv of older pins
            # No --system-site-packages: nothing of this machine's Python leaks in.
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            _pip(python, "install", *BASE)  # torch: the local CPU wheel pip finds by itself
            _pip(python, "download", "--no-deps", "--dest", str(venv / "wheelhouse"), *WHEELHOUSE)
            (venv / "baseline.json").write_text(json.dumps(_freeze(python)))
        baseline = json.loads((venv / "baseline.json").read_text())
        leftovers = INSTALLED_BY_BOOTSTRAP & set(_freeze(python))
        if leftovers:  # the previous run's bootstrap installed them
            _pip(python, "uninstall", "--yes", *sorted(leftovers))
        assert _freeze(python) == baseline, "the Colab-like virtualenv is not clean; delete .venv-colab/"
        yield venv, baseline


def _kernelspec(where: Path, python: Path, fake: Path) -> None:
    """A kernel of the clean virtualenv that imports the fake ``google.colab`` at start, as Colab's kernel does."""
    spec = where / "kernels" / "colab-like"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [str(python), "-c", KERNEL_START, "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python", "env": {"PYTHONPATH": str(fake)},
    }))


def _package_copy(dest: Path) -> Path:
    """What ``pip install git+https://…`` gets from the repository: the package and its build files."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "decoder_course", dest / "decoder_course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


PROBE = """\
import importlib.metadata, json, sys
import decoder_course
print(json.dumps({"package": decoder_course.__file__, "prefix": sys.prefix, "colab": "google.colab" in sys.modules}))
"""


def _run(nb, kernel: str, folder: Path, env: dict) -> nbformat.NotebookNode:
    client = NotebookClient(nb, timeout=300, kernel_name=kernel, allow_errors=True,
                            resources={"metadata": {"path": str(folder)}},
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])
    client.execute(env=env)
    return nb


def _graded_stdout(nb) -> dict[str, str]:
    return {cell.metadata["nbgrader"]["grade_id"]: "".join(
        o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        for cell in nb.cells if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")}


def _errors(nb) -> list[str]:
    return [f"cell {i}: {o.ename}: {o.evalue}" for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for o in cell.outputs if o.output_type == "error"]


def test_lesson_runs_in_a_colab_like_kernel_after_the_bootstrap(colab_venv, tmp_path, monkeypatch):
    venv, baseline = colab_venv
    python = venv / "bin" / "python"
    torch_record = next((venv / "lib").glob("python3.*/site-packages/torch-*.dist-info/RECORD"))
    torch_stamp = torch_record.stat().st_mtime_ns
    fake = tmp_path / "fake"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s own module."""\n')
    _kernelspec(tmp_path / "jupyter", python, fake)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    source = _package_copy(tmp_path / "decoder-course")
    folder = tmp_path / "content"  # Colab's working folder, holding only the notebook
    folder.mkdir()
    nb = nbformat.read(notebooks.solution_path(LESSON), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "MPLBACKEND"))}
    env.update({
        notebooks.SOURCE_ENV: source.as_uri(),
        # Offline: no index, only the wheelhouse; no pip.conf of this machine.
        "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(venv / "wheelhouse"), "PIP_CONFIG_FILE": os.devnull,
    })

    colab = _run(nb, "colab-like", folder, env)

    assert not _errors(colab), _errors(colab)
    probe = json.loads(colab.cells[-1].outputs[0].text)
    assert probe["colab"], "the fake google.colab must be imported at kernel start"
    assert probe["prefix"] == str(venv)
    # The package came from the bootstrap's install into site-packages, not from the checkout or the cwd.
    assert Path(probe["package"]).is_relative_to(venv / "lib"), probe
    after = _freeze(python)
    assert set(after) - set(baseline) == INSTALLED_BY_BOOTSTRAP, sorted(set(after) - set(baseline))
    assert {name: after[name] for name in baseline} == baseline, "the bootstrap changed Colab's own packages"
    assert torch_record.stat().st_mtime_ns == torch_stamp, "the bootstrap reinstalled torch"
    # Visible checks ran and passed; figures are inline PNGs, as Colab shows them.
    checks = _graded_stdout(colab)
    assert len(checks) == 4 and all(text.startswith("✓ ") for text in checks.values()), checks
    pngs = [c for c in colab.cells if c.cell_type == "code" and any("image/png" in o.get("data", {})
                                                                     for o in c.outputs)]
    assert len(pngs) >= 2, "the mask plots must display inline"

    # The same notebook in the course's own JupyterLab kernel: the bootstrap does nothing, the checks say the same.
    lab = _run(nbformat.read(notebooks.solution_path(LESSON), as_version=4), "python3", folder,
               {key: value for key, value in os.environ.items() if key != "MPLBACKEND"})
    assert not _errors(lab), _errors(lab)
    assert lab.cells[0].outputs == [], "outside Colab the bootstrap cell must do nothing"
    assert _graded_stdout(lab) == checks, "visible checks must give the same feedback in Colab and JupyterLab"


def test_bootstrap_installs_only_what_colab_lacks():
    """The bootstrap's extras are exactly the package's dependencies minus Colab's own, with the same ranges."""
    lines = notebooks.BOOTSTRAP.splitlines()
    [pip] = [line.strip() for line in lines if line.strip().startswith("%pip")]
    assert "--no-deps" in pip.split(), "without --no-deps pip may replace Colab's torch"
    words = shlex.split(pip)
    assert "decoder-course @ {_source}" in words
    extras = [word for word in words[2:] if not word.startswith("-") and "@" not in word]
    dependencies = PYPROJECT["project"]["dependencies"]
    provided = {_normalise(name) for name in notebooks.COLAB_PROVIDES}
    wanted = [d for d in dependencies if _normalise(re.split(r"[<>=!~ ]", d)[0]) not in provided]
    assert sorted(extras) == sorted(wanted), (extras, wanted)
    assert provided <= {_normalise(re.split(r"[<>=!~ ]", d)[0]) for d in dependencies}
    # It only acts in Colab, and its default source is the course's repository.
    pip_at = next(i for i, line in enumerate(lines) if "%pip" in line)
    assert lines[pip_at - 1].startswith(f'    _source = os.environ.get("{notebooks.SOURCE_ENV}", _source)')
    assert 'if "google.colab" in sys.modules:' in lines
    assert f"git+https://github.com/{notebooks.REPOSITORY}@{notebooks.TAG}" in notebooks.BOOTSTRAP


@pytest.mark.parametrize("lesson", notebooks.lessons())
def test_every_lesson_opens_with_the_bootstrap_and_its_own_colab_badge(lesson):
    for path in (notebooks.solution_path(lesson), ROOT / "lessons" / lesson / f"{lesson}.ipynb"):
        if not path.exists():
            continue  # a lesson not released yet: tests/test_notebooks.py reports it
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[0].cell_type == "code" and nb.cells[0].source == notebooks.BOOTSTRAP.rstrip(), path
        first_markdown = next(cell for cell in nb.cells if cell.cell_type == "markdown")
        title, blank, badge, *_ = first_markdown.source.split("\n")
        assert title.startswith("# ") and blank == "" and badge == notebooks.colab_badge(lesson), path
        text = path.read_text()
        assert text.count("colab-badge.svg") == 1, f"{path}: one badge, under the title"
        # The badge opens this very notebook, as released in the repository.
        assert notebooks.colab_url(lesson).endswith(f"/blob/{notebooks.TAG}/lessons/{lesson}/{lesson}.ipynb")


def test_builder_puts_the_badge_under_the_title_and_drops_a_hand_written_one():
    old = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
           "(https://colab.research.google.com/github/someone/else/blob/main/lessons/x/x.ipynb)")
    assert notebooks.with_badge("01-masks", f"# Title\n\n{old}\n\nText.\n\n\n```\ncode\n```") == (
        f"# Title\n\n{notebooks.colab_badge('01-masks')}\n\nText.\n\n\n```\ncode\n```")
    assert notebooks.with_badge("01-masks", "# Title\n\nText.") == (
        f"# Title\n\n{notebooks.colab_badge('01-masks')}\n\nText.")
    assert notebooks.with_badge("01-masks", "# Title") == f"# Title\n\n{notebooks.colab_badge('01-masks')}"
    nb = notebooks.build_notebook("01-masks", "# %% [markdown]\n# # T\n#\n# Intro.\n\n# %% [markdown]\n# # Later\n")
    assert nb.cells[1].source == f"# T\n\n{notebooks.colab_badge('01-masks')}\n\nIntro."
    assert nb.cells[2].source == "# Later", "only the first markdown cell gets the badge"
