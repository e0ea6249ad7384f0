"""The student edition: the tree that students and Colab get, built from this repository.

``./course student-edition DIR`` (``python -m autograder student-edition DIR [--git]``) writes exactly:

- ``lessons/``: the release (``./course release``), every file of every lesson folder;
- ``decoder_course/``: the companion package, as it is (no caches);
- ``pyproject.toml``: build metadata for the package alone (its dependencies, and the student pins as the
  ``student`` extra), so that ``pip install git+https://github.com/<edition>@<tag>`` builds it;
- ``environment.yml``: the conda environment of the student pins;
- ``README.md``: a student README (the course map, where to work, how a lesson works);
- ``LICENSE``.

Nothing of ``solutions/``, ``autograder/`` (references, hidden checks, mutants), ``tests/`` or ``bench/``. The
lessons' Colab badges and bootstrap cells point at :data:`autograder.course.notebooks.REPOSITORY` at
:data:`autograder.course.notebooks.TAG` (``v`` + the package version): push the edition there and tag it (``--git``
makes DIR a git repository with one commit and that tag). Before it returns, :func:`leaks` checks the tree
for every solution marker, hidden-test marker, reference body and mutant; one found is an error.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import textwrap
import tomllib
from pathlib import Path

import nbformat

from autograder.course import lessons as lessons_registry
from autograder.course import notebooks

ROOT = notebooks.ROOT
LESSONS = ROOT / "lessons"
FILES = ("README.md", "LICENSE", "pyproject.toml", "environment.yml")
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
# A graded cell's hidden part: harvest's docstring shows it, a released lesson must not hold it.
HIDDEN_CALL = "from decoder_course.harvest import collect"
# Lines of an answer that a visible check needs too (it drives the student's own class the same way).
SHARED_ON_PURPOSE = {"cache = KVCache(len(model.decoder.layers))"}

PYPROJECT = """\
# The companion package of the course "{title}", alone: what `pip install` builds from this repository.
# Generated from the course's own repository, by its student-edition command; do not edit here.
[build-system]
requires = {build_requires}
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "{description}"
readme = "README.md"
requires-python = "{requires_python}"
license = "{license}"
license-files = ["LICENSE"]
dependencies = {dependencies}

[project.optional-dependencies]
# The versions the course was tested with, for JupyterLab on your machine: pip install -e ".[student]"
student = {student}

[tool.setuptools.packages.find]
include = ["decoder_course*"]
"""


def _toml_list(items: list[str]) -> str:
    return "[\n" + "".join(f'    "{item}",\n' for item in items) + "]"


def pyproject_text() -> str:
    """``pyproject.toml`` of the package alone, from this repository's."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    return PYPROJECT.format(
        title="Build a Transformer decoder, one cell at a time", name=project["name"],
        version=project["version"], description=project["description"],
        requires_python=project["requires-python"], license=project["license"],
        build_requires=_toml_list(meta["build-system"]["requires"]).replace("\n", " ").replace("  ", "")
        .replace(", ]", "]").replace("[ ", "["),
        dependencies=_toml_list(project["dependencies"]),
        student=_toml_list(project["optional-dependencies"]["student"]),
    )


def _section(markdown: str, title: str) -> str:
    """The body of the ``## title`` section of ``markdown``."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    if not match:
        raise ValueError(f"no section '## {title}'")
    return match.group(1).strip("\n")


README = """\
# Build a Transformer decoder, one cell at a time

An autograded notebook course: from an empty cell to a trained encoder–decoder that generates with a KV cache.
NumPy first, PyTorch from multi-head attention on, einops for heads, matplotlib for masks, attention maps and
curves. Every exercise has a visible check under it that tells you which idea broke.

This is the student edition, version {version}: the lessons and their companion package, `decoder_course`
(conventions, toy data, plots, visible checks). It holds no solutions of a lesson's own exercises, but it is the
**self-study edition**: later lessons show earlier lessons' blocks as given code, answers included, so it is **not
for graded use**. A graded course hands out its own release, which shows a lesson's answers only once it closes.

## The course

{table}

## Where to work

**Colab (nothing to install).** Click a lesson's **Open in Colab** badge, under its title, and run the first
cell: in Colab it installs the companion package of this version (`{tag}`, from `github.com/{repository}`) with
`einops` and `tqdm`, and leaves Colab's own Python, torch, numpy and matplotlib alone (newer than the versions
below, which is fine). Use **File › Save a copy in Drive** to keep your work. A GPU runtime is used when there is
one (lessons 06–10 put their models on `decoder_course.device()`); the CPU is enough for every lesson.

**JupyterLab on your machine.** Tested versions: Python 3.11 with every lesson (torch {torch}, the versions of
the `student` extra), and Python 3.12 with lessons 00–02 (NumPy only, the newest numpy, einops and matplotlib);
the course's own tests run the commands below, as written, in a fresh environment. Newer Pythons are expected to
work but are not tested here. Every lesson:

```bash
git clone https://github.com/{repository} && cd {name} && git checkout {tag}
python3 -m venv .venv
# Linux without a GPU: torch's CPU build (about 190 MB) instead of the default CUDA build (several GB)
.venv/bin/pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu
.venv/bin/pip install -e ".[student]"
.venv/bin/jupyter lab lessons/
```

On macOS, Windows, or Linux with an NVIDIA GPU, skip the `--index-url` line: `pip install -e ".[student]"`
installs the right torch. Lessons 00–02 need no torch: NumPy, einops, matplotlib and JupyterLab are enough (the
package itself goes in without its dependencies, which would bring torch):

```bash
git clone https://github.com/{repository} && cd {name} && git checkout {tag}
python3 -m venv .venv
.venv/bin/pip install --no-deps -e .
.venv/bin/pip install numpy einops matplotlib jupyterlab
.venv/bin/jupyter lab lessons/
```

**conda.** `conda env create -f environment.yml && conda activate decoder-course`, then `jupyter lab lessons/`
(not tested by the course's suite).

The environment variable `DECODER_COURSE_DEVICE` (`cpu`, `cuda`, `mps`) overrides the device the lessons pick.

**Without GitHub.** If `github.com/{repository}` does not open (the course has not published this edition there
yet, or you were handed it as a folder or a zip), everything works from your copy:

- on your machine, run the commands above in that folder, without the `git clone` line;
- in Colab, upload the zip of the edition (**Files** pane, upload; make one with `git archive --format=zip -o
  decoder-course.zip HEAD`) and your lesson notebook (**File › Upload notebook**), then run
  `%env DECODER_COURSE_SOURCE=file:///content/decoder-course.zip` in a new cell above the first one, then the
  first cell: it installs the package from that zip instead of GitHub;
- the check command, `python -m decoder_course check NOTEBOOK`, needs only the package (below).

{guide}

## License

{license}: see [LICENSE](LICENSE).
"""


def readme_text(repository: str = notebooks.REPOSITORY) -> str:
    """The student README: the course map of this repository's README and the student guide; ``repository``:
    where the edition is published (GitHub's owner/name)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    course = _section((ROOT / "README.md").read_text(), "The course")
    table = "\n".join(line for line in course.splitlines() if line.startswith("|"))
    guide = (ROOT / "docs" / "STUDENT.md").read_text()
    guide = guide[guide.index("## How a lesson works"):].strip("\n")
    guide = guide.replace("](../README.md#the-course)", "](#the-course)")
    pins = dict(r.split("==") for r in meta["optional-dependencies"]["student"])
    return README.format(version=meta["version"], table=table, tag=notebooks.TAG, repository=repository,
                         name=repository.split("/")[1], torch=pins["torch"], guide=guide,
                         license=meta["license"])


def environment_text() -> str:
    """The conda environment of the edition: this repository's (the student pins, the package from the clone),
    under a header that speaks to a student (the repository's names its test and the grader's extra)."""
    text = (ROOT / "environment.yml").read_text()
    return ("# The course's environment for conda users: the versions of the student extra in pyproject.toml.\n"
            "# Create it with\n#   conda env create -f environment.yml && conda activate decoder-course\n"
            + text[text.index("\nname:") + 1:])


# Text of a lesson's markdown that speaks to a graded course only (how the grader grades, what it refuses): the
# graded releases show it, the edition, read by self-learners, leaves it out. A lesson's source may give a
# self-study version beside it, inside an HTML comment, which the graded releases therefore do not show:
#   # <!-- graded-course -->
#   # ### How your notebook is graded
#   # <!-- /graded-course -->
#   # <!-- self-study
#   # ### Checking your whole notebook
#   # -->
GRADED_ONLY = re.compile(r"^<!-- graded-course -->\n(.*?)^<!-- /graded-course -->\n?", re.M | re.S)
SELF_STUDY = re.compile(r"^<!-- self-study\n(.*?)^-->\n?", re.M | re.S)
EDITION_MARKERS = ("<!-- graded-course -->", "<!-- /graded-course -->", "<!-- self-study")


def for_self_study(markdown: str) -> str:
    """A markdown cell as the edition shows it: graded-course text out, its self-study version (if any) in."""
    if not any(marker in markdown for marker in EDITION_MARKERS):
        return markdown
    text = SELF_STUDY.sub(lambda m: m.group(1), GRADED_ONLY.sub("", markdown + "\n"))
    left = [marker for marker in EDITION_MARKERS if marker in text]
    if left:
        raise ValueError(f"an unbalanced {left[0]!r} (each marker on a line of its own, closed by "
                         "'<!-- /graded-course -->' or a line '-->'): " + markdown[:200])
    return text.strip("\n")


def edition_notebook(lesson: str, nb: nbformat.NotebookNode, repository: str) -> nbformat.NotebookNode:
    """The released notebook of ``lesson`` as the edition holds it: its markdown for self-study
    (:func:`for_self_study`), and its Colab badge and bootstrap cell pointed at ``repository``."""
    retarget = {notebooks.colab_badge(lesson): notebooks.colab_badge(lesson, repository),
                notebooks.bootstrap_source().rstrip("\n"): notebooks.bootstrap_source(repository).rstrip("\n")}
    found = dict.fromkeys(retarget, 0)
    for cell in nb.cells:
        for old, new in retarget.items():
            found[old] += cell.source.count(old)
            cell.source = cell.source.replace(old, new)
        if cell.cell_type == "markdown":
            cell.source = for_self_study(cell.source)
    missing = [old.splitlines()[0] for old, count in found.items() if count != 1]
    if missing:
        raise ValueError(f"{lesson}: expected one Colab badge and one bootstrap cell, each once, pointing at "
                         f"{notebooks.REPOSITORY}; not so for {missing} (run ./course release)")
    return nb


def build(dest: Path, git: bool = False, repository: str = notebooks.REPOSITORY) -> list[str]:
    """Write the student edition into ``dest`` (which must be empty or absent); return its files, relative.
    ``repository``: the GitHub owner/name it will be published at (the badges, first cells and README follow)."""
    if not notebooks.REPOSITORY_FORM.match(repository):
        raise ValueError(f"--repository {repository!r}: expected GitHub's OWNER/NAME, e.g. my-school/decoder-course")
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty: the student edition is written into a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    released = [lesson for lesson in notebooks.lessons() if (LESSONS / lesson / f"{lesson}.ipynb").exists()]
    missing = sorted(set(notebooks.lessons()) - set(released))
    if missing:
        raise FileNotFoundError(f"lessons not released yet: {', '.join(missing)} (run ./course release)")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")
    for lesson in released:
        shutil.copytree(LESSONS / lesson, dest / "lessons" / lesson, ignore=ignore)
        path = dest / "lessons" / lesson / f"{lesson}.ipynb"
        nbformat.write(edition_notebook(lesson, nbformat.read(path, as_version=4), repository), path)
    shutil.copytree(ROOT / "decoder_course", dest / "decoder_course", ignore=ignore)
    (dest / "pyproject.toml").write_text(pyproject_text())
    (dest / "README.md").write_text(readme_text(repository))
    (dest / "environment.yml").write_text(environment_text())
    shutil.copy(ROOT / "LICENSE", dest / "LICENSE")
    (dest / ".gitignore").write_text(".venv/\n__pycache__/\n*.pyc\n*.egg-info/\nbuild/\ndist/\n"
                                     ".ipynb_checkpoints/\n")
    found = leaks(dest)
    if found:
        shutil.rmtree(dest)
        raise RuntimeError("the student edition would leak:\n" + "\n".join(found))
    if git:
        make_repository(dest)
    return files(dest)


def files(dest: Path) -> list[str]:
    """Every file of the edition, relative, sorted (git's own folder left out)."""
    return sorted(str(p.relative_to(dest)) for p in Path(dest).rglob("*") if p.is_file() and ".git" not in
                  p.relative_to(dest).parts)


def make_repository(dest: Path) -> str:
    """Make ``dest`` a git repository with one commit tagged :data:`notebooks.TAG`; return the commit."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(dest), "-c", "user.name=decoder-course",
                               "-c", "user.email=course@localhost", "-c", "commit.gpgsign=false",
                               "-c", "tag.gpgsign=false", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "--quiet", "--initial-branch=main")
    git("add", "--all")
    git("commit", "--quiet", "-m", f"Student edition {notebooks.TAG}")
    git("tag", "-a", notebooks.TAG, "-m", f"Student edition {notebooks.TAG}")
    return git("rev-parse", "HEAD")


# -- leak checks ------------------------------------------------------------------------------------------------
SOLUTION_BLOCK = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)  # what the student writes


def _distinctive(lines) -> set[str]:
    """Code lines long enough to be a fingerprint (``return out`` occurs in any code), comments dropped."""
    out = set()
    for line in lines:
        code = line.split("  # ")[0].strip()
        if len(code) > 30 and not code.startswith("#"):
            out.add(code)
    return out


def _solution_lines(module_name: str) -> set[str]:
    """The distinctive lines between a reference module's solution markers: what the student must write."""
    source = (ROOT / "autograder" / "course" / "reference" / f"{module_name}.py").read_text()
    return _distinctive(m for block in SOLUTION_BLOCK.findall(source)
                        for m in block.splitlines())


def _given_lines(lesson: str | None = None, demos: bool = False) -> set[str]:
    """Lines shown on purpose in given cells (earlier lessons' blocks), of one lesson or of all; with ``demos``
    also the lessons' other code cells that are neither exercises nor tests (a wrong recipe run on purpose)."""
    lines = set()
    for lid in [lesson] if lesson else notebooks.lessons():
        path = notebooks.solution_path(lid)
        if path.exists():
            nb = nbformat.read(path, as_version=4)
            for c in nb.cells:
                course, graded = c.metadata.get("course", {}), c.metadata.get("nbgrader", {})
                shown = "given" in course or (demos and c.cell_type == "code" and "exercise" not in course
                                               and not graded.get("grade") and not graded.get("solution"))
                if shown:
                    lines |= _distinctive(c.source.splitlines())
    return lines


def _mutant_lines() -> set[str]:
    """Lines of the registered wrong answers found nowhere in the references, the package or a given cell."""
    lines = set()
    for path in sorted((ROOT / "autograder" / "course" / "mutants").glob("m*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.decorator_list:
                body = (ast.get_source_segment(text, node) or "").splitlines()[1:]
                lines |= {line for line in _distinctive(body) if not line.startswith(("def ", "class ", '"'))}
    public = set()
    for folder in (ROOT / "autograder" / "course" / "reference", ROOT / "decoder_course"):
        for p in folder.rglob("*.py"):
            public |= _distinctive(p.read_text().splitlines())
    return lines - public - _given_lines(demos=True) - _shown_bug_lines()


def _shown_bug_lines() -> set[str]:
    """Lines a find-the-bug exercise's release shows on purpose (its bug), which a wrong answer may repeat."""
    from autograder.course import bugs

    lines = set()
    for lesson in notebooks.REFERENCE_MODULES:
        for name in lessons_registry.exercises(lesson):
            source = inspect.getsource(notebooks.reference_object(lesson, name))
            if bugs.regions(textwrap.dedent(source)) is not None:
                lines |= _distinctive(notebooks.buggy_source(lesson, name).splitlines())
    return lines


def _code_lines(path: Path) -> set[str]:
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        nb = nbformat.reads(text, as_version=4)
        text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    return _distinctive(text.splitlines())


def leaks(dest: Path) -> list[str]:
    """What of the instructor's side is in the tree ``dest``: markers, reference bodies, mutants, forbidden paths."""
    dest = Path(dest)
    found = []
    for part in ("solutions", "autograder", "tests", "bench", "mutants", "reference", ".grading"):
        for path in dest.rglob(part):
            if ".git" not in path.relative_to(dest).parts:
                found.append(f"{path.relative_to(dest)}: an instructor folder")
    every_solution = set().union(*(_solution_lines(m) for m in set(notebooks.REFERENCE_MODULES.values())))
    mutants = _mutant_lines()
    for path in sorted(dest.rglob("*")):
        rel = path.relative_to(dest)
        if not path.is_file() or ".git" in rel.parts:
            continue
        text = path.read_text(errors="replace")
        for marker in MARKERS + ((HIDDEN_CALL,) if path.suffix == ".ipynb" else ()):
            if marker in text:
                found.append(f"{rel}: {marker!r}")
        code = _code_lines(path) if path.suffix in (".py", ".ipynb") else set()
        if rel.parts[0] == "lessons" and len(rel.parts) > 2 and rel.parts[1] in notebooks.REFERENCE_MODULES:
            lesson = rel.parts[1]
            own = _solution_lines(notebooks.REFERENCE_MODULES[lesson]) - _given_lines(lesson)
        else:  # the package: no line of any answer, except those every lesson shows as given code
            own = every_solution - _given_lines() - SHARED_ON_PURPOSE
        found += [f"{rel}: a reference solution line: {line}" for line in sorted(own & code)]
        found += [f"{rel}: a wrong answer's line: {line}" for line in sorted(mutants & code)]
    return found


def reference_bodies() -> dict[str, str]:
    """``{"module:name": solution body}`` of every exercise (for tests that grep for them)."""
    out = {}
    for lesson, module_name in notebooks.REFERENCE_MODULES.items():
        for name in lessons_registry.exercises(lesson):
            source = textwrap.dedent(inspect.getsource(notebooks.reference_object(lesson, name)))
            match = SOLUTION_BLOCK.search(source)
            if match:
                out[f"{module_name}:{name}"] = match.group(1)
    return out
