"""Build the solution notebooks from their percent sources, taking every exercise's code from its reference.

``solutions/<id>.py`` is a lesson's source in the percent format (diff-friendly, one cell per ``# %%``). Cell
headers understood here, beyond jupytext's plain ``# %%`` and ``# %% [markdown]``:

``# %% exercise=causal_mask``
    a solution cell; its code is the source of ``causal_mask`` in the lesson's reference module, student part
    between nbgrader's ``### BEGIN SOLUTION`` / ``### END SOLUTION`` lines. The cell body in the percent file stays
    empty: the reference is the one source.
    A find-the-bug exercise (:mod:`autograder.course.bugs`) is one whose reference also holds ``### BEGIN BUG`` blocks:
    the cell gets the reference without them, and their buggy lines in its metadata (``course.bug``), which the
    release shows in place of nbgrader's stub.
``# %% test=causal_mask points=2``
    the graded test cell of that exercise: the hidden part (only a call to ``decoder_course.harvest.collect``,
    identical in every cell, stripped from the release and the feedback), then the visible checks written under
    the header.
``# %% given=multi_head:attention,MultiHeadAttention``
    building blocks of an earlier lesson, shown as given code: the references' source without the markers. The
    cell is locked (nbgrader's ``locked``): grading runs this code whatever the submission's copy says. A term's
    release shows a stand-in for an earlier lesson's graded answers until that lesson closes
    (:mod:`autograder.term.integrity`).
``# %% demo``
    a demonstration (an ablation, a timing sweep, a training run whose result no graded item reads): its metadata
    carries the sha256 of its source (``{"course": {"demo": "<digest>"}}``), and a graded run skips it while its
    source still has that digest (:func:`untouched_demo`); a student's edited copy runs. The builder refuses a
    demonstration whose names a later cell that is not one reads (:func:`check_demos`): skipping it must not
    change what any other cell computes.

In a markdown cell, a figure of the course is a line ``# ![what the figure shows](assets/decoder_block.png)``:
the builder attaches the PNG to the cell (``attachment:decoder_block.png``), so it shows in JupyterLab, Colab and
GitHub without a file beside the notebook. The text in brackets is the figure's alt text and must say what it
shows. ``assets/draw_figures.py`` draws every figure.

The built notebook (``solutions/<id>/<id>.ipynb``) is what nbgrader reads; ``tests/test_notebooks.py`` fails
when it has drifted from its source or from the references.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from autograder.course import bugs
from autograder.course import lessons as lessons_registry
from decoder_course import __version__ as _package_version

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
ASSETS = ROOT / "assets"  # the course's figures, drawn by assets/draw_figures.py

# Each lesson's reference module, in autograder/course/reference (autograder.course.lessons: named after the lesson's
# id).
REFERENCE_MODULES = {lesson: lessons_registry.slug(lesson) for lesson in lessons_registry.ids()}

# Where students get the course: the public repository of the *student edition* (``./course student-edition``:
# lessons and the companion package, never solutions, references or hidden checks). The Colab badge of every
# lesson and the bootstrap cell's install both point there, at the tag of the package's version (``v0.1.0``),
# never at a branch: a notebook saved in Drive keeps installing the package it was released with.
REPOSITORY = "decoder-course/decoder-course"  # GitHub owner/name of the student edition
TAG = f"v{_package_version}"
# What Colab lacks of the package's dependencies (it ships torch, numpy and matplotlib): installed beside it.
COLAB_PROVIDES = ("torch", "numpy", "matplotlib")
COLAB_EXTRAS = ("einops>=0.7", "tqdm>=4.60")
# Overrides the install target (a local path instead of GitHub): the Colab-like test installs offline.
SOURCE_ENV = "DECODER_COURSE_SOURCE"

REPOSITORY_FORM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")  # GitHub's owner/name


def bootstrap_source(repository: str = REPOSITORY) -> str:
    """The first cell of every lesson: in Colab, install the companion package from ``repository`` at :data:`TAG`."""
    return f"""\
# Colab only: install the course's companion package. Anywhere else this cell does nothing.
import os
import sys

if "google.colab" in sys.modules:
    # --no-deps keeps Colab's own torch, numpy and matplotlib; the light packages it may lack come along.
    _source = "git+https://github.com/{repository}@{TAG}"
    _source = os.environ.get("{SOURCE_ENV}", _source)  # only the course's own tests set it
    %pip install --quiet --no-deps "decoder-course @ {{_source}}" {" ".join(f'"{r}"' for r in COLAB_EXTRAS)}
"""


BOOTSTRAP = bootstrap_source()

_BADGE_LINE = re.compile(r"^\[!\[Open In Colab\]\(.*\)\]\(https://colab\.research\.google\.com/.*\)\s*$")


def colab_url(lesson: str, repository: str = REPOSITORY) -> str:
    """The address that opens the released notebook of ``lesson`` in Colab, from ``repository`` at :data:`TAG`."""
    notebook = f"lessons/{lesson}/{lesson}.ipynb"
    return f"https://colab.research.google.com/github/{repository}/blob/{TAG}/{notebook}"


def colab_badge(lesson: str, repository: str = REPOSITORY) -> str:
    """The "Open in Colab" badge of ``lesson``, as a markdown line."""
    image = "https://colab.research.google.com/assets/colab-badge.svg"
    return f"[![Open In Colab]({image})]({colab_url(lesson, repository)})"


def with_badge(lesson: str, markdown: str) -> str:
    """``markdown`` with the lesson's badge under its first line (the title); a hand-written badge is dropped."""
    lines = markdown.split("\n")
    kept: list[str] = []
    for i, line in enumerate(lines):
        if _BADGE_LINE.match(line):
            continue
        after_badge = i > 0 and _BADGE_LINE.match(lines[i - 1])
        if after_badge and not line.strip() and kept and not kept[-1].strip():
            continue  # the blank line that followed a removed badge
        kept.append(line)
    title, rest = kept[0], "\n".join(kept[1:]).strip("\n")
    return f"{title}\n\n{colab_badge(lesson)}" + (f"\n\n{rest}" if rest else "")


HIDDEN = """\
### BEGIN HIDDEN TESTS
from decoder_course.harvest import collect; collect({item!r}, globals())
### END HIDDEN TESTS"""

_HEADER = re.compile(r"^# %%(?P<rest>.*)$")
_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*\n", re.M)


def lessons() -> list[str]:
    """Lesson ids that have a percent source."""
    return lessons_registry.ids()


def reference_object(lesson: str, name: str):
    """``name`` from a reference module: ``"causal_mask"`` (the lesson's module) or ``"masks:causal_mask"``."""
    module_name, _, attr = name.rpartition(":")
    module_name = module_name or REFERENCE_MODULES[lesson]
    module = importlib.import_module(f"autograder.course.reference.{module_name}")
    return getattr(module, attr)


def reference_source(lesson: str, name: str, keep_markers: bool = True) -> str:
    """The exact source of a reference object, optionally without the solution markers."""
    source = bugs.strip(textwrap.dedent(inspect.getsource(reference_object(lesson, name))).rstrip() + "\n")
    return source if keep_markers else _MARKERS.sub("", source)


def given_names(lesson: str, names: list[str]) -> list[tuple[str, str]]:
    """(reference module, name) of each name of a ``given=`` cell: ``multi_head:attention,MultiHeadAttention``
    names two of ``multi_head`` (a module carries over to the names after it), ``train`` one of the lesson's own."""
    module, resolved = REFERENCE_MODULES[lesson], []
    for name in names:
        if ":" in name:
            module, _, name = name.rpartition(":")
        resolved.append((module, name))
    return resolved


def bug_regions(lesson: str, names: list[str]) -> list[str | None] | None:
    """A find-the-bug cell's buggy lines, one entry per solution region of ``names`` (None: a region without a
    bug, which gets nbgrader's stub); None when no name is a find-the-bug exercise."""
    found: list[str | None] = []
    for name in names:
        raw = textwrap.dedent(inspect.getsource(reference_object(lesson, name)))
        regions = bugs.regions(raw)
        found += regions if regions is not None else [None] * raw.count("### BEGIN SOLUTION")
    return found if any(region is not None for region in found) else None


def buggy_source(lesson: str, name: str) -> str:
    """What the release shows of a find-the-bug exercise: the reference with the bug in place of the fix."""
    return bugs.buggy_source(textwrap.dedent(inspect.getsource(reference_object(lesson, name))).rstrip() + "\n")


def _cell_id(lesson: str, index: int, header: str) -> str:
    return hashlib.sha1(f"{lesson}:{index}:{header}".encode()).hexdigest()[:12]


def _parse_header(rest: str) -> tuple[str, dict[str, str]]:
    """``" [markdown]"`` → ("markdown", {}); ``" test=x points=2"`` → ("code", {"test": "x", "points": "2"});
    a bare word is a flag: ``" demo"`` → ("code", {"demo": ""})."""
    rest = rest.strip()
    if rest.startswith("[markdown]"):
        return "markdown", {}
    options = dict(part.split("=", 1) if "=" in part else (part, "") for part in rest.split())
    return "code", options


# -- demonstration cells -------------------------------------------------------------------------------------------
DEMO_SKIPPED = "skipped while grading: a demonstration cell (no graded item reads what it computes)\n"


def source_digest(source: str) -> str:
    """The sha256 of a cell's source, exactly as it is: any edit, a space included, changes it."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def untouched_demo(cell) -> bool:
    """A demonstration cell as the builder wrote it: a code cell, neither graded nor a solution, whose source
    still has the digest in its metadata. Skipping it removes only the instructor's code, the code of a cell
    that a student could have deleted anyway, so a skip can never raise a score."""
    if cell.get("cell_type") != "code":
        return False
    meta = cell.get("metadata", {})
    flags = meta.get("nbgrader", {})
    if any(flags.get(k) for k in ("grade", "solution", "task")):
        return False
    digest = meta.get("course", {}).get("demo")
    return isinstance(digest, str) and digest == source_digest(cell.get("source", ""))


def _names(source: str) -> tuple[set[str], set[str]]:
    """(global names a cell binds, global names it reads) of a code cell; empty if it is no Python.

    Python's own scoping decides (``symtable``): a parameter or a local variable of a function is the
    function's, not the notebook's, while a name a function body reads without binding it is a global read
    (when the function runs, it reads what the notebook holds then).
    """
    import symtable

    try:
        top = symtable.symtable(source, "<cell>", "exec")
    except SyntaxError:  # IPython syntax (%pip): not a cell this check is about
        return set(), set()
    bound = {sym.get_name() for sym in top.get_symbols() if sym.is_assigned() or sym.is_imported()
             or sym.is_namespace()}
    read = {sym.get_name() for sym in top.get_symbols() if sym.is_referenced()}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        tables += table.get_children()
        for sym in table.get_symbols():
            if sym.is_global() and sym.is_referenced():
                read.add(sym.get_name())
            if sym.is_declared_global() and sym.is_assigned():  # `global x; x = ...` binds the notebook's x
                bound.add(sym.get_name())
    return bound, read


def check_demos(lesson: str, nb: NotebookNode) -> None:
    """Refuse a notebook where a cell that is not a demonstration reads a name only a demonstration bound:
    grading skips demonstrations, and that cell would then read nothing (or an older value)."""
    from_demo: dict[str, int] = {}  # name -> index of the demonstration cell that bound it last
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        bound, read = _names(cell.source)
        if "demo" in cell.metadata.get("course", {}):
            from_demo.update(dict.fromkeys(bound, index))
            continue
        leaks = sorted((read - bound) & set(from_demo))  # a name the cell binds itself is its own
        if leaks:
            raise ValueError(f"{lesson}: cell {index} reads {', '.join(leaks)}, bound by the demonstration cell "
                             f"{from_demo[leaks[0]]}, which grading skips: do not mark that cell `demo`")
        for name in bound:
            from_demo.pop(name, None)


def _markdown(lines: list[str]) -> str:
    text = []
    for line in lines:
        if line.startswith("# "):
            text.append(line[2:])
        elif line.rstrip() in ("#", ""):
            text.append("")
        else:
            raise ValueError(f"markdown lines must start with '# ': {line!r}")
    return "\n".join(text).strip("\n")


# A figure in a lesson's markdown: ![alt text](assets/name.png), embedded as a cell attachment.
FIGURE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(assets/(?P<name>[A-Za-z0-9_.-]+\.png)\)")


def embed_figures(lesson: str, markdown: str) -> tuple[str, dict]:
    """``markdown`` with each ``assets/`` figure pointing at a cell attachment, and those attachments."""
    attachments = {}

    def attach(match: re.Match) -> str:
        alt, name = " ".join(match["alt"].split()), match["name"]  # alt text may wrap in the source
        if not alt:
            raise ValueError(f"{lesson}: figure {name} needs alt text that says what it shows")
        path = ASSETS / name
        if not path.is_file():
            raise ValueError(f"{lesson}: figure {name} is not in assets/ (run python assets/draw_figures.py)")
        attachments[name] = {"image/png": base64.b64encode(path.read_bytes()).decode("ascii")}
        return f"![{alt}](attachment:{name})"

    return FIGURE.sub(attach, markdown), attachments


def _nbgrader(grade_id: str, *, solution: bool, grade: bool, points: float | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return meta


def build_notebook(lesson: str, text: str) -> NotebookNode:
    """Build the solution notebook of ``lesson`` from its percent source ``text``."""
    chunks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            chunks.append((match["rest"], []))
        elif chunks:
            chunks[-1][1].append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"{lesson}: code before the first '# %%' cell: {line!r}")

    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nb.cells.append(nbformat.v4.new_code_cell(BOOTSTRAP.rstrip(), id=_cell_id(lesson, 0, "bootstrap")))
    seen_tests: set[str] = set()
    for index, (rest, lines) in enumerate(chunks, start=1):
        kind, options = _parse_header(rest)
        body = "\n".join(lines).strip("\n")
        cell_id = _cell_id(lesson, index, rest)
        if kind == "markdown":
            text = _markdown(lines)
            if not any(cell.cell_type == "markdown" for cell in nb.cells):
                text = with_badge(lesson, text)  # the first markdown cell: the title, then the badge
            text, attachments = embed_figures(lesson, text)
            markdown_cell = nbformat.v4.new_markdown_cell(text, id=cell_id)
            if attachments:
                markdown_cell.attachments = attachments
            nb.cells.append(markdown_cell)
            continue
        cell = nbformat.v4.new_code_cell(body, id=cell_id)
        if "exercise" in options:
            if body:
                raise ValueError(f"{lesson}: exercise cell {options['exercise']} must be empty in the source")
            names = options["exercise"].split(",")
            cell.source = "\n\n".join(reference_source(lesson, name).rstrip() for name in names)
            cell.metadata["nbgrader"] = _nbgrader(f"{names[0]}_solution", solution=True, grade=False)
            cell.metadata["course"] = {"exercise": names}
            bug = bug_regions(lesson, names)
            if bug is not None:  # find the bug: the release shows these lines where the fix is
                cell.metadata["course"]["bug"] = bug
        elif "test" in options:
            item = options["test"]
            if item in seen_tests:
                raise ValueError(f"{lesson}: two test cells for {item}")
            seen_tests.add(item)
            points = float(options.get("points", 1))
            # The hidden part comes first: it must collect even when a visible check below fails.
            cell.source = HIDDEN.format(item=item) + ("\n\n" + body if body else "")
            cell.metadata["nbgrader"] = _nbgrader(item, solution=False, grade=True, points=points)
        elif "given" in options:
            names = options["given"].split(",")
            resolved = given_names(lesson, names)
            parts = [reference_source(lesson, f"{module}:{name}", keep_markers=False) for module, name in resolved]
            own = all(module == REFERENCE_MODULES[lesson] for module, _ in resolved)
            header = ("# Given: helpers for this lesson (not exercises).\n\n" if own else
                      "# Given: built in an earlier lesson, shown here so that this lesson runs on its own. A graded "
                      "term's\n# release shows an earlier lesson's answers here only once that lesson has closed.\n\n")
            cell.source = header + (body + "\n\n\n" if body else "") + "\n\n".join(p.rstrip() for p in parts)
            # locked: grading runs the course's code here whatever the submitted copy holds (nbgrader's
            # OverwriteCells), and a term's release may show a stand-in instead (autograder.term.integrity)
            cell.metadata["nbgrader"] = _nbgrader(f"given_{cell_id}", solution=False, grade=False)
            cell.metadata["course"] = {"given": names}
            cell.metadata["jupyter"] = {"source_hidden": False}
        if "demo" in options:
            if any(k in options for k in ("exercise", "test", "given")):
                raise ValueError(f"{lesson}: a demo cell is a plain code cell, not {rest.strip()!r}")
            cell.metadata["course"] = {"demo": source_digest(cell.source)}
        nb.cells.append(cell)
    check_demos(lesson, nb)
    return nb


def solution_path(lesson: str) -> Path:
    return SOLUTIONS / lesson / f"{lesson}.ipynb"


def render(nb: NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def build_all(check: bool = False) -> list[str]:
    """Build every solution notebook; with ``check``, only report those whose committed copy differs."""
    stale = []
    for lesson in lessons():
        text = render(build_notebook(lesson, (SOLUTIONS / f"{lesson}.py").read_text()))
        path = solution_path(lesson)
        if not path.exists() or path.read_text() != text:
            stale.append(lesson)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale
