"""The student edition: what students get, and nothing of the instructor's side; it installs and runs on its own.

Built once per module into a temporary folder (``autograder.term.edition.build``, what ``./course student-edition``
runs) and made a git repository tagged with the package version. Then:

- no solution marker, hidden-test line, reference body, hidden check or wrong answer is in it, and a planted
  leak is found (the check can fail);
- the package builds a wheel and an sdist from the edition alone, which install without the repository;
- lesson 01 runs in a Colab-like kernel (fake ``google.colab``) whose bootstrap installs the package from that
  repository by a file URL at the tag, ``git+file:///…@v0.1.0``, exactly as Colab would from GitHub;
- lessons 00, 01 and 02 run top to bottom in a Python 3.12 virtualenv that has NumPy, einops, matplotlib, the
  IPython kernel and nbclient, and no torch (cached under ``.venv-notorch/``, about 45 s to build once).
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

from autograder.course import notebooks
from autograder.term import edition
from tests.conftest import ROOT
from tests.test_colab_like import (  # noqa: F401  (colab_venv is a fixture)
    INSTALLED_BY_BOOTSTRAP,
    _errors,
    _freeze,
    _graded_stdout,
    _kernelspec,
    _run,
    colab_venv,
)

pytestmark = pytest.mark.notebook

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
TOP_LEVEL = {"lessons", "decoder_course", "README.md", "LICENSE", "pyproject.toml", "environment.yml", ".gitignore"}


def _git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("edition") / "decoder-course"
    edition.build(dest, git=True)
    return dest


@pytest.fixture(scope="module")
def dist(student_edition, tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from a clean clone of the edition at its tag (no repository around it)."""
    clone = tmp_path_factory.mktemp("clone") / "src"
    subprocess.run(["git", "clone", "--quiet", "--branch", notebooks.TAG, str(student_edition), str(clone)],
                   check=True, capture_output=True)
    out = clone / "dist"
    code = ("from setuptools import build_meta as b; import json, sys; out = sys.argv[1]; "  # build_meta edits argv
            "print(json.dumps([b.build_sdist(out), b.build_wheel(out)]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    sdist, wheel = json.loads(done.stdout.strip().splitlines()[-1])
    return {"sdist": out / sdist, "wheel": out / wheel}


# -- what is in it ------------------------------------------------------------------------------------------------
def test_version_is_one_number():
    import decoder_course

    assert decoder_course.__version__ == VERSION and notebooks.TAG == f"v{VERSION}"


def test_edition_holds_exactly_what_students_get(student_edition):
    files = edition.files(student_edition)
    assert {f.split("/")[0] for f in files} == TOP_LEVEL
    for lesson in notebooks.lessons():
        assert f"lessons/{lesson}/{lesson}.ipynb" in files
    assert "decoder_course/visible/l10_numerics.py" in files and "decoder_course/devices.py" in files
    assert not [f for f in files if f.endswith((".pyc", ".egg-info")) or "__pycache__" in f]
    meta = tomllib.loads((student_edition / "pyproject.toml").read_text())
    assert meta["project"]["version"] == VERSION
    assert meta["project"]["dependencies"] == PYPROJECT["project"]["dependencies"]
    assert meta["project"]["optional-dependencies"] == {"student": PYPROJECT["project"]["optional-dependencies"]
                                                        ["student"]}
    readme = (student_edition / "README.md").read_text()
    assert "## The course" in readme and "## How a lesson works" in readme and "./course" not in readme
    assert "solutions/" not in readme and "autograder" not in readme


def test_no_solution_marker_reference_body_hidden_check_or_mutant(student_edition):
    assert edition.leaks(student_edition) == []
    texts = {p: p.read_text(errors="replace") for p in student_edition.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(student_edition).parts}
    for path, text in texts.items():
        for word in ("### BEGIN SOLUTION", "### END SOLUTION", "BEGIN HIDDEN TESTS", "autograder.", "mutant"):
            assert word not in text, f"{path.relative_to(student_edition)} holds {word!r}"
    released = "\n".join(text for path, text in texts.items() if path.suffix == ".ipynb")
    assert "decoder_course.harvest import collect" not in released, "a hidden test's line"
    # every line of a lesson's answers (long lines only) is absent from its release, unless given on purpose
    bodies = edition.reference_bodies()
    for lesson, module_name in notebooks.REFERENCE_MODULES.items():
        nb = nbformat.read(student_edition / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        code = {line.strip() for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()}
        given = edition._given_lines(lesson)
        for name, body in bodies.items():
            if name.startswith(f"{module_name}:"):
                for line in edition._distinctive(body.splitlines()) - given:
                    assert line not in {c.split("  # ")[0] for c in code}, f"{lesson} shows {name}'s {line!r}"


def test_a_planted_leak_is_found(student_edition, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(student_edition, copy, ignore=shutil.ignore_patterns(".git"))
    path = copy / "lessons" / "01-masks" / "01-masks.ipynb"
    nb = nbformat.read(path, as_version=4)
    body = "\n".join(b for name, b in edition.reference_bodies().items() if name.startswith("masks:"))
    nb.cells.append(nbformat.v4.new_code_cell("### BEGIN SOLUTION\n" + body))
    nbformat.write(nb, path)
    (copy / "autograder").mkdir()
    found = edition.leaks(copy)
    assert any("'### BEGIN SOLUTION'" in f for f in found)
    assert any("a reference solution line" in f for f in found)
    assert any("an instructor folder" in f for f in found)


def test_badges_and_bootstrap_pin_the_edition_at_the_version_tag(student_edition):
    for lesson in notebooks.lessons():
        text = (student_edition / "lessons" / lesson / f"{lesson}.ipynb").read_text()
        assert f"git+https://github.com/{notebooks.REPOSITORY}@{notebooks.TAG}" in text
        assert f"github/{notebooks.REPOSITORY}/blob/{notebooks.TAG}/lessons/{lesson}/{lesson}.ipynb" in text
        assert "@main" not in text and "/blob/main/" not in text


def test_edition_is_a_git_repository_tagged_with_the_version(student_edition):
    assert _git(student_edition, "tag", "--list") == notebooks.TAG
    assert _git(student_edition, "rev-list", "-n", "1", notebooks.TAG) == _git(student_edition, "rev-parse", "HEAD")
    assert _git(student_edition, "status", "--porcelain") == "", "everything is committed"


def test_build_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(FileExistsError):
        edition.build(tmp_path)


# -- it installs and runs on its own -------------------------------------------------------------------------
def test_wheel_and_sdist_hold_the_package_and_nothing_else(dist):
    import tarfile
    import zipfile

    wheel = zipfile.ZipFile(dist["wheel"]).namelist()
    assert "decoder_course/visible/l02_attention.py" in wheel and "decoder_course/devices.py" in wheel
    assert all(n.startswith(("decoder_course/", "decoder_course-")) for n in wheel), wheel
    sdist = tarfile.open(dist["sdist"]).getnames()
    assert any(n.endswith("/decoder_course/visible/l02_attention.py") for n in sdist)
    assert not [n for n in sdist if "/autograder" in n or "/solutions" in n or "/tests" in n], sdist


NO_TORCH = ROOT / ".venv-notorch"
NO_TORCH_PYTHONS = [["python3.12"], ["python3.13"]]
NO_TORCH_PINS = [f"{name}=={dict(r.split('==') for r in PYPROJECT['project']['optional-dependencies'][extra])[name]}"
                 for extra, names in (("student", ("numpy", "einops", "matplotlib", "ipykernel")),
                                      ("grader", ("nbclient", "nbformat"))) for name in names]


def _python_without_torch() -> list[str] | None:
    for candidate in NO_TORCH_PYTHONS:
        env = {**os.environ, "PYENV_VERSION": "3.12.1" if candidate == ["python3.12"] else "3.13.0"}
        try:
            done = subprocess.run([*candidate, "-c", "import sys; print(sys.executable)"], capture_output=True,
                                  text=True, env=env, timeout=60)
        except FileNotFoundError:
            continue
        if done.returncode == 0:
            return [done.stdout.strip()]
    return None


@pytest.fixture
def no_torch_venv():
    """A cached virtualenv with NumPy, einops, matplotlib, ipykernel and nbclient, and no torch."""
    python = _python_without_torch()
    if python is None:
        pytest.skip("neither python3.12 nor python3.13 is here")
    NO_TORCH.mkdir(exist_ok=True)
    key = hashlib.sha256(json.dumps([python, NO_TORCH_PINS]).encode()).hexdigest()[:12]
    with open(NO_TORCH / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        venv = NO_TORCH / key
        if not (venv / "ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([*python, "-m", "venv", str(venv)], check=True)
            done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", *NO_TORCH_PINS], capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            (venv / "ready").write_text("")
        python = venv / "bin" / "python"
        subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "decoder-course"],
                       capture_output=True)
        yield python


DRIVER = """\
import json, sys
import nbformat
from nbclient import NotebookClient

PROBE = "import importlib.util, sys, decoder_course; print(importlib.util.find_spec('torch') is None, sys.prefix, "\\
        "decoder_course.__file__, 'torch' in sys.modules)"
report = {}
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
    errors = [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    checks = {c.metadata["nbgrader"]["grade_id"]: "".join(o.get("text", "") for o in c.outputs
              if o.output_type == "stream") for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
    report[path] = {"errors": errors, "checks": checks, "probe": nb.cells[-1].outputs[0]["text"]}
print(json.dumps(report))
"""


def test_lessons_00_to_02_run_without_torch(no_torch_venv, dist, tmp_path):
    python = no_torch_venv
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                           str(dist["wheel"])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lessons = []
    for lesson in ("00-setup", "01-masks", "02-attention"):
        (tmp_path / lesson).mkdir()
        lessons.append(shutil.copy(notebooks.solution_path(lesson), tmp_path / lesson))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLBACKEND", "JUPYTER_PATH")}
    done = subprocess.run([str(python), "-c", DRIVER, *map(str, lessons)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for path, result in report.items():
        assert not result["errors"], (path, result["errors"])
        assert result["checks"] and all(text.startswith("✓") for text in result["checks"].values()), result
        no_torch, prefix, package, imported = result["probe"].split()
        assert no_torch == "True" and imported == "False", f"{path}: torch was there"
        assert prefix == str(python.parent.parent) and package.startswith(prefix), result["probe"]


def test_sdist_installs_and_imports_on_its_own(no_torch_venv, dist, tmp_path):
    python = no_torch_venv
    target = tmp_path / "site"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                           "--target", str(target), str(dist["sdist"])], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = ("import sys, decoder_course, decoder_course.data, decoder_course.visible.l02_attention as v; "
             "t = decoder_course.data.get_task('reverse'); print(decoder_course.__file__, 'torch' in sys.modules, "
             "t.tgt_vocab.decode([5, 6, 2]))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-2000:]
    package, torch_imported, text = done.stdout.split()
    assert package.startswith(str(target)) and torch_imported == "False" and text


# -- Colab, from the edition's repository at its tag -------------------------------------------------------------
LESSON = "01-masks"


def _solved(edition_lesson: Path) -> nbformat.NotebookNode:
    """The edition's lesson as a student hands it in: each solution cell filled with the course's answer."""
    nb = nbformat.read(edition_lesson, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source
               for c in nbformat.read(notebooks.solution_path(LESSON), as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            assert "raise NotImplementedError()" in cell.source
            cell.source = answers[grade_id]
    return nb


PROBE = """\
import importlib.metadata, json, sys
import decoder_course
dist = importlib.metadata.distribution("decoder-course")
print(json.dumps({"package": decoder_course.__file__, "prefix": sys.prefix, "colab": "google.colab" in sys.modules,
                  "direct_url": json.loads(dist.read_text("direct_url.json") or "{}")}))
"""


def test_lesson_runs_in_colab_after_a_bootstrap_from_the_editions_repository(colab_venv, student_edition, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    venv, baseline = colab_venv
    python = venv / "bin" / "python"
    fake = tmp_path / "fake"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s own module."""\n')
    _kernelspec(tmp_path / "jupyter", python, fake)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    folder = tmp_path / "content"
    folder.mkdir()
    nb = _solved(student_edition / "lessons" / LESSON / f"{LESSON}.ipynb")
    assert f"@{notebooks.TAG}" in nb.cells[0].source, "the bootstrap installs the tagged release"
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    # what git+https://github.com/<edition>@<tag> is, offline (a PEP 508 URL needs a host: localhost)
    source = f"git+file://localhost{student_edition}@{notebooks.TAG}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "MPLBACKEND"))}
    env.update({notebooks.SOURCE_ENV: source, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(venv / "wheelhouse"),
                "PIP_CONFIG_FILE": os.devnull})

    colab = _run(nb, "colab-like", folder, env)

    assert not _errors(colab), (_errors(colab), colab.cells[0].outputs)
    probe = json.loads(colab.cells[-1].outputs[0].text)
    assert probe["colab"] and probe["prefix"] == str(venv)
    assert Path(probe["package"]).is_relative_to(venv / "lib"), probe
    url = probe["direct_url"]
    assert url["url"] == f"file://localhost{student_edition}", url
    assert url["vcs_info"]["vcs"] == "git" and url["vcs_info"]["requested_revision"] == notebooks.TAG, url
    assert url["vcs_info"]["commit_id"] == _git(student_edition, "rev-list", "-n", "1", notebooks.TAG)
    after = _freeze(python)
    assert set(after) - set(baseline) == INSTALLED_BY_BOOTSTRAP
    assert {name: after[name] for name in baseline} == baseline, "the bootstrap changed Colab's own packages"
    checks = _graded_stdout(colab)
    assert len(checks) == 4 and all(text.startswith("✓ ") for text in checks.values()), checks


# -- the README's install commands, as written, in fresh environments ---------------------------------------------
# Each ```bash block of the edition's README that installs something is run line by line in a fresh clone of the
# edition and a fresh virtualenv, offline: pip reads only a wheelhouse of what those very lines ask for, downloaded
# once by `pip download` (cached under .venv-edition/, keyed by the interpreter and the lines). Then lessons 00 and
# 01 run there through the edition's own check command, answered and as released.
INSTALLS = ROOT / ".venv-edition"
README_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
ANSWERED = ("00-setup", "01-masks")


def install_blocks(readme: str) -> dict[str, str]:
    """``{"every lesson" | "no torch": block}``: the README's install blocks, told apart by whether they install
    torch."""
    blocks = [block for block in README_BLOCK.findall(readme) if "pip install" in block]
    named = {("every lesson" if "install torch" in block else "no torch"): block for block in blocks}
    assert len(named) == len(blocks) == 2, f"expected two install blocks (every lesson, no torch): {blocks}"
    return named


def _python_for(kind: str) -> str:
    """The interpreter a block is tested with: 3.11 for every lesson (the one the torch pin has a wheel for here),
    3.12 (else 3.13) without torch."""
    if kind == "every lesson":
        return sys._base_executable
    python = _python_without_torch()
    assert python is not None, "python3.12 (or 3.13) is needed to test the README's NumPy-only install"
    return python[0]


def _pip_lines(block: str) -> list[list[str]]:
    """The arguments of each ``pip install`` line of ``block``, comments dropped."""
    return [shlex.split(line.split(" #")[0])[2:] for line in block.splitlines()
            if re.match(r"^\S*pip install ", line.strip())]


def _wheelhouse(python: str, block: str, edition_folder: Path) -> Path:
    """A folder holding every distribution the block's pip lines install (and the package's build backend),
    for ``python``; built once per interpreter and block text, then reused."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    build_requires = tomllib.loads((edition_folder / "pyproject.toml").read_text())["build-system"]["requires"]
    dependencies = (edition_folder / "pyproject.toml").read_text()
    key = hashlib.sha256(json.dumps([version, block, dependencies]).encode()).hexdigest()[:12]
    INSTALLS.mkdir(exist_ok=True)
    where = INSTALLS / f"wheels-{key}"
    with open(INSTALLS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (where / "ready").exists():
            shutil.rmtree(where, ignore_errors=True)
            downloads = [[*build_requires]] + [[str(edition_folder) + a.removeprefix(".") if a.startswith(".") else a
                                                for a in args if a != "-e"] for args in _pip_lines(block)]
            for args in downloads:
                done = subprocess.run([python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                                       "--dest", str(where), *args], capture_output=True, text=True, timeout=900)
                assert done.returncode == 0, f"pip download {args}:\n{done.stderr[-3000:]}"
            (where / "ready").write_text("")
    return where


def _offline_env(python: str, wheels: Path, shims: Path) -> dict[str, str]:
    """A fresh shell's environment: ``python3`` is the interpreter under test, pip reads only ``wheels``, and
    nothing of this suite's virtualenv, Jupyter paths or pip configuration leaks in."""
    shims.mkdir()
    (shims / "python3").symlink_to(python)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(ROOT))]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON", "JUPYTER", "VIRTUAL_ENV", "MPLBACKEND", "CONDA"))}
    return env | {"PATH": os.pathsep.join([str(shims), *path]), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
                  "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                  "PIP_COMPILE": "false",  # no .pyc of torch and JupyterLab written at install: minutes on 2 cores
                  "JUPYTER_DATA_DIR": str(shims / "jupyter-data"), "JUPYTER_CONFIG_DIR": str(shims / "jupyter")}


def _answered(edition_lesson: Path, lesson: str, dest: Path, prefix: Path) -> Path:
    """The edition's lesson with every solution cell answered by the course, and a last cell that fails unless
    the kernel is the fresh virtualenv's; saved in its own folder, as a student saves it."""
    nb = nbformat.read(edition_lesson, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source
               for c in nbformat.read(notebooks.solution_path(lesson), as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    nb.cells.append(nbformat.v4.new_code_cell(f"import sys\nassert sys.prefix == {str(prefix)!r}, sys.prefix"))
    dest.mkdir(parents=True)
    nbformat.write(nb, dest / f"{lesson}.ipynb")
    return dest / f"{lesson}.ipynb"


@pytest.mark.parametrize("kind", ["no torch", "every lesson"])
def test_every_readme_install_command_works_in_a_fresh_environment_and_runs_lessons_00_and_01(
        student_edition, tmp_path, kind):
    readme = (student_edition / "README.md").read_text()
    block = install_blocks(readme)[kind]
    python = _python_for(kind)
    work = tmp_path / "student"
    work.mkdir()
    url = f"https://github.com/{notebooks.REPOSITORY}"
    assert block.splitlines()[0] == f"git clone {url} && cd {url.rsplit('/', 1)[1]} && git checkout {notebooks.TAG}"
    clone = work / url.rsplit("/", 1)[1]
    wheels = _wheelhouse(python, block, student_edition)
    env = _offline_env(python, wheels, tmp_path / "shims")
    # the block as written; the clone's address is this edition's folder, and JupyterLab is asked its version
    # instead of being started; a line that fails stops it (bash -e alone lets `a && b` fail and go on)
    script = block.replace(url, str(student_edition)).replace("jupyter lab lessons/", "jupyter lab --version")
    script = "".join(f"{{ {line}\n}} || exit 97\n" for line in script.splitlines()
                     if line.strip() and not line.startswith("#"))
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, f"the README's block failed ({kind}):\n{script}\n{done.stdout[-2000:]}" \
                                 f"{done.stderr[-4000:]}"
    venv = clone / ".venv"
    installed = _freeze(venv / "bin" / "python")
    assert ("torch" in installed) == (kind == "every lesson"), sorted(installed)
    assert installed["decoder-course"] == VERSION

    def check(notebook: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "python"), "-m", "decoder_course", "check", str(notebook)],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=600)

    for lesson in ANSWERED:
        mine = _answered(clone / "lessons" / lesson / f"{lesson}.ipynb", lesson, tmp_path / "mine" / lesson, venv)
        result = check(mine)
        assert result.returncode == 0, (lesson, result.stdout, result.stderr[-3000:])
        lines = result.stdout.splitlines()
        assert lines[0].startswith("✓ ") and "notes:" not in result.stdout, result.stdout
        assert "exercises pass their visible checks; grading adds" in result.stdout, result.stdout
    if kind == "every lesson":
        return  # what follows needs no torch, and is slow enough once
    untouched = check(clone / "lessons" / "01-masks" / "01-masks.ipynb")  # as a student starts it
    assert untouched.returncode == 1 and "0/4 exercises pass" in untouched.stdout, untouched.stdout
    assert "4 not implemented yet" in untouched.stdout, untouched.stdout
    # the README's way without GitHub: the package from a zip of the edition
    archive = tmp_path / "decoder-course.zip"
    subprocess.run(["git", "-C", str(clone), "archive", "--format=zip", "-o", str(archive), "HEAD"], check=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                           "--force-reinstall", f"decoder-course @ file://{archive}"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import decoder_course; print(decoder_course"
                            ".__file__)"], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(venv / "lib")), where.stdout


def test_the_readme_names_no_install_command_that_is_not_tested(student_edition):
    readme = (student_edition / "README.md").read_text()
    tested = "\n".join(install_blocks(readme).values())
    # inline code may wrap across lines, as the broken `pip install -e . --no-deps numpy einops matplotlib` did
    inline = [" ".join(code.split()) for code in re.findall(r"`([^`]*pip install[^`]*)`", README_BLOCK.sub("", readme))]
    assert inline, "the README names the light install inline too"
    assert [command for command in inline if command.replace(".venv/bin/", "") not in tested.replace(
        ".venv/bin/", "")] == [], "an install command of the README that no test runs"


# -- it reads as complete for a self-learner -----------------------------------------------------------------------
def test_graded_course_text_is_left_out_and_its_self_study_version_shown(student_edition):
    graded = nbformat.read(ROOT / "lessons" / "00-setup" / "00-setup.ipynb", as_version=4)
    ours = nbformat.read(student_edition / "lessons" / "00-setup" / "00-setup.ipynb", as_version=4)
    graded_text = "\n".join(c.source for c in graded.cells if c.cell_type == "markdown")
    edition_text = "\n".join(c.source for c in ours.cells if c.cell_type == "markdown")
    assert "### How your notebook is graded" in graded_text and "the grader:" in graded_text
    assert "<!-- self-study" in graded_text, "the graded release hides the self-study version in a comment"
    assert "How your notebook is graded" not in edition_text and "the grader" not in edition_text
    assert "### When a lesson is done" in edition_text and "python -m decoder_course check" in edition_text
    assert "<!--" not in edition_text and "-->" not in edition_text
    assert "(11)" in edition_text and "(12)" in edition_text, "the introduction names every lesson"
    for lesson in notebooks.lessons():  # no marker left anywhere, and only markdown changed
        before = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        after = nbformat.read(student_edition / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        assert [c.source for c in before.cells if c.cell_type == "code"] == \
            [c.source for c in after.cells if c.cell_type == "code"]
        assert not [m for c in after.cells for m in edition.EDITION_MARKERS if m in c.source], lesson


def test_the_edition_names_nothing_of_the_instructors_side(student_edition):
    instructor = re.compile(r"\bautograder\b|\btests/|\./course\b|\bsolutions/|\bbench/|INSTRUCTOR\.md|ARCHITECTURE")
    found = []
    for path in sorted(student_edition.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(student_edition).parts:
            text = path.read_text(errors="replace")
            found += [f"{path.relative_to(student_edition)}: {m.group(0)}" for m in instructor.finditer(text)]
    assert found == []


@pytest.mark.parametrize(("markdown", "shown"), [
    ("a\n<!-- graded-course -->\ngraded\n<!-- /graded-course -->\nb", "a\nb"),
    ("<!-- graded-course -->\ngraded\n<!-- /graded-course -->\n<!-- self-study\nmine\n-->", "mine"),
    ("a\n<!-- self-study\nmine\n-->\nb\n<!-- graded-course -->\nx\n<!-- /graded-course -->", "a\nmine\nb"),
    ("no markers, kept as it is\n", "no markers, kept as it is\n"),
])
def test_for_self_study(markdown, shown):
    assert edition.for_self_study(markdown) == shown


@pytest.mark.parametrize("markdown", ["<!-- graded-course -->\nnever closed", "<!-- self-study\nnever closed",
                                      "x <!-- graded-course --> inline\n<!-- /graded-course -->"])
def test_for_self_study_refuses_an_unbalanced_marker(markdown):
    with pytest.raises(ValueError, match="unbalanced"):
        edition.for_self_study(markdown)


def test_publishing_under_another_name_points_every_badge_first_cell_and_the_readme_there(tmp_path):
    other = "a-school/transformers-2027"
    edition.build(tmp_path / "e", repository=other)
    for lesson in notebooks.lessons():
        nb = nbformat.read(tmp_path / "e" / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        assert nb.cells[0].source == notebooks.bootstrap_source(other).rstrip("\n")
        assert notebooks.colab_badge(lesson, other) in nb.cells[1].source
        text = (tmp_path / "e" / "lessons" / lesson / f"{lesson}.ipynb").read_text()
        assert notebooks.REPOSITORY not in text, lesson
    readme = (tmp_path / "e" / "README.md").read_text()
    assert f"git clone https://github.com/{other} && cd transformers-2027 && git checkout {notebooks.TAG}" in readme
    assert notebooks.REPOSITORY not in readme
    for bad in ("no-slash", "a/b/c", "-x/y", "a/b c"):
        with pytest.raises(ValueError, match="OWNER/NAME"):
            edition.build(tmp_path / "bad", repository=bad)
    done = subprocess.run([sys.executable, "-m", "autograder", "student-edition", str(tmp_path / "cli"),
                           "--repository", "not a repository"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "expected GitHub's OWNER/NAME" in done.stderr, done.stderr
