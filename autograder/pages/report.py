"""The class report: what a graded class got wrong, item by item and named, who falls behind, which code is too alike.

``./course report [WORK]`` (and ``./course grade`` at the end of each run, local or on a Dask cluster) reads the
class gradebook (nbgrader's, through its own API) and the verdicts the grader wrote beside each graded cell of the
autograded notebooks (``cell.metadata.course.verdict``: the item, passed, the kind of failure and the known mistake,
as data: :func:`autograder.judge.verdicts.apply`), and writes into ``WORK/report/``:

- ``index.html``: one static page (no script, no request outside the folder, a Content-Security-Policy that allows
  neither), with ``students-by-*.html`` (the student table in other orders) and the figures as PNG;
- ``items.csv``: per (lesson, item) the students graded, mean, spread and distribution of points, the shares with
  full and zero marks, the discrimination (item-rest correlation), the mean by fifth of the class, and the failures
  by kind;
- ``mistakes.csv``: per (lesson, item, known mistake) the students, their share and one verdict line;
- ``students.csv``: per student the points per lesson, late notebooks and penalties, notebooks that need attention;
- ``similarity.csv``: pairs of students whose exercise code is alike (:mod:`autograder.pages.similarity`).

For the instructor only: nothing here goes into a student's feedback or release. Everything that came from a
student (ids, code, verdict lines quoting their errors) is escaped on the page (Jinja's autoescape) and in the CSVs
(:func:`decoder_course.text.csv_cell`); every notebook is read bounded, without following a link.
"""

from __future__ import annotations

import csv
import errno
import functools
import json
import logging
import math
import os
import stat
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nbformat
import numpy as np
from jinja2 import Environment, FileSystemLoader, select_autoescape
from nbformat.v4.rwbase import rejoin_lines
from nbgrader.api import (
    Assignment,
    Grade,
    Gradebook,
    GradeCell,
    SubmittedAssignment,
    SubmittedNotebook,
)
from sqlalchemy import func

from autograder.course import lessons as lessons_registry
from autograder.course.checks.framework import KINDS
from autograder.judge import verdicts
from autograder.pages import similarity
from decoder_course.text import csv_cell, csv_writer, shown

log = logging.getLogger("autograder")

# autograder.grading.pipeline.COURSE_ID (not imported: the report must not pull nbgrader's apps)
COURSE_ID = "decoder-course"
UNKNOWN = "unknown"  # a failed item whose verdict carries no kind (graded before verdicts had one, or unreadable)
FAILURE_KINDS = (*KINDS, UNKNOWN)
MAX_NOTEBOOK_BYTES = 50 << 20  # an autograded notebook larger than this is not read (its scores still count)
MAX_LINE = 300  # characters of an example verdict line
TOP_ITEMS = 15  # items in "where the class lost most"
TOP_PAIRS = 10  # pairs shown side by side on the page
SORTS = ("behind", "name", "late")  # the student table's orders: students-by-<sort>.html
TEMPLATES = Path(__file__).with_name("templates")

# What the report cannot know: said on the page, so nobody reads more into it than is there.
LIMITS = (
    "A known mistake is named only where the grader recognised it: a wrong answer that matches none of the item's "
    "known mistakes counts under its kind of failure alone.",
    "A failure's kind is the first check the answer failed; an answer wrong in several ways shows one.",
    "Similarity compares each exercise cell with the same cell of every classmate, after removing the released "
    "notebook's code: it cannot see code copied from elsewhere (the web, last year, an assistant), work done "
    "together and then written apart, or a copy spread across other cells. A high score is a reason to look, not "
    "a finding; it never changes a grade.",
    "Late work and penalties come from the term and the submission times nbgrader recorded; a notebook set apart or "
    "not submitted has no score here.",
    "Scores are the gradebook's at the time the report was written: a later re-grade or manual grade changes them.",
)


# -- reading the class ---------------------------------------------------------------------------------------------
@dataclass
class Cell:
    """One student's one graded item."""

    points: float
    max_points: float
    kind: str = ""  # "" when it earned full points
    mistake: str = ""
    line: str = ""  # the verdict's first line (a failed item), escaped


@dataclass
class Submission:
    student: str
    lesson: str
    score: float  # after the late penalty
    max_score: float
    penalty: float = 0.0
    late: bool = False


@dataclass
class ClassData:
    lessons: list[str] = field(default_factory=list)
    students: list[str] = field(default_factory=list)
    items: dict[str, list[str]] = field(default_factory=dict)  # lesson -> its graded items, in the lesson's order
    submissions: dict[tuple[str, str], Submission] = field(default_factory=dict)  # (student, lesson)
    cells: dict[tuple[str, str], dict[str, Cell]] = field(default_factory=dict)  # (lesson, item) -> student -> cell
    code: dict[str, dict[str, str]] = field(default_factory=dict)  # "lesson/item" -> student -> their code
    released: dict[str, str] = field(default_factory=dict)  # lesson -> the released notebook's code
    attention: Counter = field(default_factory=Counter)  # student -> notebooks grades.csv says need attention
    problems: list[str] = field(default_factory=list)  # problems.json: submissions set apart or skipped


def read_class(work: Path, db_url: str | None = None) -> ClassData:
    """Everything the report shows, read from a grading folder: the gradebook's scores, and the verdicts and code of
    the autograded notebooks."""
    data = ClassData()
    db_url = db_url or f"sqlite:///{work / 'gradebook.db'}"
    if db_url.startswith("sqlite:///") and not Path(db_url[len("sqlite:///"):]).is_file():
        raise FileNotFoundError(f"no gradebook at {db_url[len('sqlite:///'):]}: grade the class first "
                                "(./course grade SUBMISSIONS --work WORK), or name the grading folder")
    with Gradebook(db_url, COURSE_ID) as gb:
        _read_gradebook(gb, data)
    for (student, lesson) in sorted(data.submissions):
        if not _safe_name(student) or not _safe_name(lesson):
            continue
        nb = _read_notebook(work / "autograded" / student / lesson / f"{lesson}.ipynb")
        if nb is not None:
            _read_verdicts(data, student, lesson, nb)
    for lesson in data.lessons:
        released = _read_notebook(work / "release" / lesson / f"{lesson}.ipynb")
        if released is not None:
            data.released[lesson] = "\n\n".join(c.source for c in released.cells if c.cell_type == "code")
    for by_student in data.cells.values():
        for cell in by_student.values():
            if cell.points < cell.max_points and not cell.kind:
                cell.kind = UNKNOWN
    data.attention = _needs_attention(work / "grades.csv")
    data.problems = _problems(work / "problems.json")
    return data


def _read_gradebook(gb: Gradebook, data: ClassData) -> None:
    """Scores from the gradebook in two queries (nbgrader's objects load each score lazily: one query per
    submission and per grade, minutes for a class of 100 over 13 lessons)."""
    grades = (gb.db.query(SubmittedAssignment.student_id, Assignment.name, GradeCell.name, GradeCell.cell_type,
                          Grade.score, GradeCell.max_score)
              .select_from(Grade)
              .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
              .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
              .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
              .join(GradeCell, Grade.cell_id == GradeCell.id)).all()
    submissions = (gb.db.query(SubmittedAssignment.student_id, Assignment.name, SubmittedAssignment.timestamp,
                               SubmittedAssignment.extension, Assignment.duedate,
                               func.coalesce(func.sum(SubmittedNotebook.late_submission_penalty), 0.0))
                   .select_from(SubmittedAssignment)
                   .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                   .outerjoin(SubmittedNotebook, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                   .group_by(SubmittedAssignment.id, Assignment.name, Assignment.duedate)).all()
    data.lessons = sorted(name for (name,) in gb.db.query(Assignment.name))
    raw: Counter = Counter()
    top: Counter = Counter()
    for student, lesson, item, cell_type, score, max_score in grades:
        raw[student, lesson] += float(score or 0.0)
        top[student, lesson] += float(max_score or 0.0)
        if cell_type == "code":
            data.cells.setdefault((lesson, item), {})[student] = Cell(float(score or 0.0), float(max_score or 0.0))
    for student, lesson, timestamp, extension, duedate, penalty in submissions:
        due = duedate + extension if duedate is not None and extension is not None else duedate
        data.submissions[student, lesson] = Submission(student, lesson, raw[student, lesson] - float(penalty),
                                                       top[student, lesson], float(penalty),
                                                       bool(timestamp and due and timestamp > due))
    for lesson in data.lessons:
        order = {name: i for i, name in enumerate(_exercises(lesson))}
        data.items[lesson] = sorted({item for (each, item) in data.cells if each == lesson},
                                    key=lambda n: (order.get(n, len(order)), n))
    data.students = sorted({student for student, _ in data.submissions})


@functools.cache
def _exercises(lesson: str) -> list[str]:
    try:
        return list(lessons_registry.exercises(lesson))
    except Exception:  # noqa: BLE001 - a lesson this checkout does not have: the gradebook's names, sorted
        return []


def _safe_name(name: str) -> bool:
    """A student or lesson id usable as one path component (ids come from the submissions' folder names)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _read_notebook(path: Path) -> nbformat.NotebookNode | None:
    """The notebook at ``path``, read through one descriptor that follows no link, at most
    :data:`MAX_NOTEBOOK_BYTES`; None (and a warning) when it is missing, a link, too large or not a notebook."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("report: %s not read (%s)", shown(path), shown(exc.strerror))
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
            log.warning("report: %s not read (not a plain file, or over %d bytes)", shown(path), MAX_NOTEBOOK_BYTES)
            return None
        raw = handle.read(MAX_NOTEBOOK_BYTES + 1)
    try:
        nb = rejoin_lines(nbformat.from_dict(json.loads(raw)))  # sources and texts as one string each
        if not isinstance(nb.cells, list):
            raise TypeError("its cells are not a list")
        return nb
    except (ValueError, AttributeError, TypeError) as exc:
        log.warning("report: %s is not a notebook (%s)", shown(path), shown(exc))
        return None


def _read_verdicts(data: ClassData, student: str, lesson: str, nb: nbformat.NotebookNode) -> None:
    """The verdicts the grader wrote in ``nb`` (one student's autograded notebook) and the code of its exercise
    cells."""
    for cell in nb.cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        verdict = meta.get("course", {}).get(verdicts.VERDICT_KEY) if isinstance(meta.get("course"), dict) else None
        grade_id = meta.get("nbgrader", {}).get("grade_id") if isinstance(meta.get("nbgrader"), dict) else None
        if isinstance(verdict, dict) and verdict.get("item") == grade_id:
            known = data.cells.get((lesson, str(grade_id)), {}).get(student)
            if known is not None and known.points < known.max_points and not verdict.get("passed"):
                kind = str(verdict.get("kind") or "")
                known.kind = kind if kind in FAILURE_KINDS else UNKNOWN
                known.mistake = shown(str(verdict.get("mistake") or ""))[:MAX_LINE]
                known.line = _verdict_line(cell)
        try:
            solved = verdicts.solved_in(cell)
        except (AttributeError, TypeError):
            solved = set()
        source = cell.get("source", "")
        for item in solved:
            if isinstance(source, str):
                data.code.setdefault(f"{lesson}/{item}", {})[student] = source


def _verdict_line(cell: dict) -> str:
    """The first line of the failed verdict in ``cell`` (the grader's error output), escaped and bounded."""
    for output in cell.get("outputs", []):
        if isinstance(output, dict) and output.get("output_type") == "error" and \
                output.get("ename") == verdicts.FAILED_NAME:
            text = str(output.get("evalue", "")).strip().splitlines()
            return shown(text[0] if text else "")[:MAX_LINE]
    return ""


def _needs_attention(path: Path) -> Counter:
    """Per student, the notebooks grades.csv marks as needing attention (not graded, or graded with a note)."""
    counts: Counter = Counter()
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return counts
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("status", "ok") != "ok":
                counts[row.get("student", "")] += 1
    return counts


def _problems(path: Path) -> list[str]:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return []
    try:
        found = json.loads(path.read_text())
    except ValueError:
        return []
    return [shown(p) for p in found if isinstance(p, str)] if isinstance(found, list) else []


# -- statistics ----------------------------------------------------------------------------------------------------
def correlation(x: list[float], y: list[float]) -> float | None:
    """Pearson's correlation of ``x`` and ``y``; None when either does not vary (or fewer than 3 values)."""
    if len(x) < 3:
        return None
    a, b = np.asarray(x, float), np.asarray(y, float)
    a, b = a - a.mean(), b - b.mean()
    norm = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return None if norm == 0 else float((a * b).sum()) / norm


@dataclass
class ItemStats:
    lesson: str
    item: str
    max_points: float
    graded: int
    mean: float
    sd: float
    full_share: float
    zero_share: float
    discrimination: float | None  # item-rest correlation within the lesson
    lost: float  # points the class lost on it
    distribution: dict[float, int]
    by_fifth: list[float | None]  # mean share of points in each fifth of the class (by the rest of the lesson)
    kinds: Counter
    mistakes: Counter
    examples: dict[str, str]

    @property
    def failed(self) -> int:
        return sum(self.kinds.values())


def item_stats(data: ClassData) -> list[ItemStats]:
    """One row per (lesson, item), in the lessons' order."""
    rows = []
    for lesson in data.lessons:
        items = data.items.get(lesson, [])
        totals: dict[str, float] = defaultdict(float)
        for item in items:
            for student, cell in data.cells.get((lesson, item), {}).items():
                totals[student] += cell.points
        for item in items:
            by_student = data.cells.get((lesson, item), {})
            if not by_student:
                continue
            students = sorted(by_student)
            points = [by_student[s].points for s in students]
            rest = [totals[s] - by_student[s].points for s in students]
            top = max(by_student[s].max_points for s in students)
            kinds: Counter = Counter(c.kind for c in by_student.values() if c.kind)
            mistakes: Counter = Counter(c.mistake for c in by_student.values() if c.mistake)
            examples: dict[str, str] = {}
            for s in students:
                cell = by_student[s]
                if cell.mistake and cell.mistake not in examples:
                    examples[cell.mistake] = cell.line
            rows.append(ItemStats(
                lesson, item, top, len(points), float(np.mean(points)), float(np.std(points)),
                sum(p >= top for p in points) / len(points), sum(p <= 0 for p in points) / len(points),
                correlation(points, rest), float(sum(top - p for p in points)), dict(sorted(Counter(points).items())),
                _by_fifth(points, rest, top), kinds, mistakes, examples))
    return rows


def _by_fifth(points: list[float], rest: list[float], top: float) -> list[float | None]:
    """The item's mean share of points in each fifth of the students ranked by the rest of the lesson, lowest
    first (PrairieLearn's "score by quintile"); None for an empty fifth."""
    order = np.argsort(np.asarray(rest, float), kind="stable")
    fifths = np.array_split(order, 5)
    return [float(np.mean([points[i] for i in part])) / top if len(part) and top else None for part in fifths]


@dataclass
class StudentRow:
    student: str
    scores: dict[str, Submission]
    total: float
    max_total: float
    late: int
    penalty: float
    attention: int

    @property
    def share(self) -> float:
        return self.total / self.max_total if self.max_total else 0.0


def student_rows(data: ClassData) -> list[StudentRow]:
    """One row per student; the lessons they did not hand in count for nothing of their total's maximum."""
    max_of = {lesson: max((s.max_score for (_, l), s in data.submissions.items() if l == lesson), default=0.0)
              for lesson in data.lessons}
    rows = []
    for student in data.students:
        scores = {lesson: data.submissions[student, lesson] for lesson in data.lessons
                  if (student, lesson) in data.submissions}
        rows.append(StudentRow(student, scores, sum(s.score for s in scores.values()), sum(max_of.values()),
                               sum(s.late for s in scores.values()), sum(s.penalty for s in scores.values()),
                               data.attention.get(csv_cell(student), 0)))
    return rows


def sorted_students(rows: list[StudentRow], by: str) -> list[StudentRow]:
    if by == "name":
        return sorted(rows, key=lambda r: r.student)
    if by == "late":
        return sorted(rows, key=lambda r: (-r.late, -r.penalty, r.student))
    return sorted(rows, key=lambda r: (r.share, r.student))  # "behind": who falls behind first


# -- writing -------------------------------------------------------------------------------------------------------
def _write_csv(path: Path, header: list[str], rows) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv_writer(handle)  # every cell through csv_cell
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if value is None else value for value in row])


def _rounded(value: float | None, digits: int = 3):
    return None if value is None else round(value, digits)


def write_items(path: Path, stats: list[ItemStats]) -> None:
    header = ["lesson", "item", "max_points", "students_graded", "mean_points", "sd_points", "full_share",
              "zero_share", "discrimination", "points_lost", "points_distribution", "mean_share_by_fifth",
              *[f"failed_{kind.replace(' ', '_')}" for kind in FAILURE_KINDS]]
    _write_csv(path, header, ([
        s.lesson, s.item, s.max_points, s.graded, _rounded(s.mean), _rounded(s.sd), _rounded(s.full_share),
        _rounded(s.zero_share), _rounded(s.discrimination), s.lost,
        " ".join(f"{p:g}:{n}" for p, n in s.distribution.items()),
        " ".join("" if f is None else f"{f:.2f}" for f in s.by_fifth),
        *[s.kinds.get(kind, 0) for kind in FAILURE_KINDS]] for s in stats))


def mistake_rows(stats: list[ItemStats]) -> list[tuple]:
    """(lesson, item, mistake, students, share, example line), most students first."""
    rows = [(s.lesson, s.item, mistake, n, round(n / s.graded, 3), s.examples.get(mistake, ""))
            for s in stats for mistake, n in s.mistakes.items()]
    return sorted(rows, key=lambda r: (-r[3], r[0], r[1], r[2]))


def write_students(path: Path, data: ClassData, rows: list[StudentRow]) -> None:
    header = ["student", *data.lessons, "total", "max_total", "share", "late_notebooks", "late_penalty",
              "needs_attention"]
    _write_csv(path, header, ([
        r.student, *[r.scores[lesson].score if lesson in r.scores else None for lesson in data.lessons],
        r.total, r.max_total, _rounded(r.share), r.late, r.penalty, r.attention]
        for r in sorted_students(rows, "name")))


def write_similarity(path: Path, pairs: list[similarity.Pair]) -> None:
    _write_csv(path, ["student_a", "student_b", "score", "cells_matched", "flagged", "cells"], ([
        p.a, p.b, p.score, len(p.matched), "yes" if p.flagged else "no",
        " ".join(f"{c.cell}:{c.similarity:.2f}" for c in p.cells)] for p in pairs[:similarity.MAX_PAIRS]))


def lesson_figure(path: Path, lesson: str, stats: list[ItemStats]) -> str:
    """A horizontal bar per item: the share of the class that lost it, split by kind of failure. Returns the alt
    text, which says in words what the bars show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ["#999999", "#E69F00", "#56B4E9", "#D55E00", "#CC79A7", "#0072B2", "#009E73", "#F0E442", "#000000",
               "#777777"]
    hatches = ["", "//", "..", "xx", "\\\\", "--", "++", "oo", "||", "**"]
    height = 0.3 * len(stats) + 1.3
    fig, ax = plt.subplots(figsize=(7, height), dpi=72)
    # margins by hand (tight_layout draws the figure once more): the longest item name on the left, in inches
    left_inches = 0.12 + 0.075 * max(len(s.item) for s in stats)
    fig.subplots_adjust(left=min(0.6, left_inches / 7), right=0.97, top=1 - 0.45 / height, bottom=0.55 / height)
    left = np.zeros(len(stats))
    labels = [s.item for s in stats]
    used = [kind for kind in FAILURE_KINDS if any(s.kinds.get(kind) for s in stats)]
    for kind in used:
        i = FAILURE_KINDS.index(kind)
        width = np.array([s.kinds.get(kind, 0) / s.graded for s in stats])
        ax.barh(labels, width, left=left, color=colours[i], hatch=hatches[i], edgecolor="white", label=kind)
        left += width
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the students graded who lost the item")
    ax.set_title(f"{lesson}: where the class lost points, by kind of failure")
    if used:
        ax.legend(loc="lower right", fontsize="small")
    fig.savefig(path)
    plt.close(fig)
    parts = []
    for s in stats:
        how = ", ".join(f"{kind} {n / s.graded:.0%}" for kind, n in s.kinds.most_common())
        parts.append(f"{s.item}: {s.failed / s.graded:.0%} lost it" + (f" ({how})" if how else ""))
    return f"Bar chart for lesson {lesson}, the share of students who lost each item: " + "; ".join(parts) + "."


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True,
                                                                                        default_for_string=True))
    env.filters["pct"] = lambda v: "" if v is None else f"{v:.0%}"
    env.filters["num"] = lambda v: "" if v is None else f"{v:.2f}"
    return env


def _side_by_side(pair: similarity.Pair, data: ClassData) -> list[dict]:
    """Each matched cell of ``pair``: both students' code as lines, those in a shared run marked."""
    shown_cells = []
    for match in pair.matched:
        sides = []
        for who, slices in zip((pair.a, pair.b), match.slices or (None, None)):
            source = data.code[match.cell][who][:similarity.MAX_CODE_CHARS]
            marked = similarity.matching_lines(source, slices)
            sides.append({"student": who, "lines": [(line, i in marked) for i, line in
                                                    enumerate(source.splitlines())]})
        shown_cells.append({"cell": match.cell, "similarity": match.similarity, "sides": sides})
    return shown_cells


def write(work: Path, db_url: str | None = None, out: Path | None = None) -> Path:
    """Write the class report of the grading folder ``work`` into ``out`` (default ``work/report``); returns the
    page's path."""
    data = read_class(work, db_url)
    out = out or work / "report"
    out.mkdir(parents=True, exist_ok=True)
    stats = item_stats(data)
    rows = student_rows(data)
    pairs = similarity.pairs(data.code, data.released)
    for pair in pairs[:TOP_PAIRS]:
        if pair.flagged or pair.matched:
            similarity.locate(pair, data.code, data.released)
    write_items(out / "items.csv", stats)
    mistakes = mistake_rows(stats)
    _write_csv(out / "mistakes.csv", ["lesson", "item", "mistake", "students", "share", "example"], mistakes)
    write_students(out / "students.csv", data, rows)
    write_similarity(out / "similarity.csv", pairs)
    figures = []
    for lesson in data.lessons:
        mine = [s for s in stats if s.lesson == lesson]
        if mine:
            name = f"lesson-{lesson}.png" if _safe_name(lesson) else f"lesson-{len(figures)}.png"
            figures.append({"lesson": lesson, "file": name, "alt": lesson_figure(out / name, lesson, mine),
                            "items": mine})
    env = _environment()
    common = {
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "work": str(work), "data": data,
        "stats": stats, "ranked": sorted(stats, key=lambda s: (-s.lost, s.lesson, s.item))[:TOP_ITEMS],
        "mistakes": mistakes, "figures": figures, "limits": LIMITS, "kinds": FAILURE_KINDS,
        "pairs": [{"pair": p, "cells": _side_by_side(p, data)} for p in pairs[:TOP_PAIRS]],
        "flagged": sum(p.flagged for p in pairs), "sorts": SORTS, "similarity": similarity,
    }
    page = env.get_template("report.html.j2")
    for by in SORTS:
        (out / f"students-by-{by}.html").write_text(page.render(**common, students=sorted_students(rows, by),
                                                                sort=by, full=False))
    index = out / "index.html"
    index.write_text(page.render(**common, students=sorted_students(rows, "behind"), sort="behind", full=True))
    return index


def after_grading(work: Path, db_url: str | None = None) -> Path | None:
    """The report at the end of ``./course grade``: a report that cannot be written is a warning, never a failed
    grading run (the grades are written already)."""
    try:
        return write(work, db_url)
    except Exception as exc:  # noqa: BLE001 - grading succeeded; say why the report did not
        log.warning("the class report was not written (%s: %s); run ./course report %s", type(exc).__name__,
                    shown(exc), shown(work))
        return None


__all__ = ["ClassData", "after_grading", "correlation", "item_stats", "read_class", "student_rows", "write"]
