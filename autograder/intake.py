"""Intake: find each student's notebook for each lesson, and refuse what must not be graded, before nbgrader sees it.

Everything here reads files a student made (or an LMS packed), so nothing is trusted:

- **who and what**: in nbgrader's layout (``SUBMISSIONS/student/lesson/notebook.ipynb``) the student is the first
  path part and the lesson the second, nothing else; a notebook deeper down is refused and listed (a student could
  otherwise plant ``aa/01-masks/zz/01-masks/x.ipynb`` and be taken for ``zz``). A flat LMS file is
  ``student_anything_<lesson>.ipynb``. Ids that differ only by case are refused (a case-insensitive file system
  would merge their feedback folders);
- **how big**: a zip entry is judged by its declared size before it is extracted and by its real size while it is
  (at most limit + 1 bytes are copied), with a cap on the whole archive; a notebook is read with the same bound;
- **what else comes along**: only the notebook, and the two small files nbgrader's exchange puts beside it
  (``timestamp.txt``, ``submission_secret.txt``), each checked, so that formgrader and ``release_feedback`` work.

:func:`collect_submissions` returns what was found and the problems, in words; :func:`place` checks one notebook
and writes it into nbgrader's ``submitted/`` tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nbformat

from autograder.text import shown

__all__ = ["ARCHIVE_BYTES", "BadSubmission", "Collected", "STUDENT_ID", "collect_submissions", "place",
           "read_submission"]

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ARCHIVE_BYTES = 2 << 30  # the most one zip may extract, all entries together
ARCHIVE_ENTRIES = 100_000  # entries one zip may hold
SIDE_FILES = {"timestamp.txt": 64, "submission_secret.txt": 512}  # nbgrader exchange files kept, with their bounds
RESERVED = {"canary"}  # ids the grader uses itself


class BadSubmission(Exception):
    """A submitted file that cannot be graded; the message says why and what to do."""


@dataclass
class Collected:
    """Submissions found (student -> lesson -> notebook), refused ones (student -> lesson -> why), and problems."""

    found: dict[str, dict[str, Path]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def refuse(self, student: str, lesson: str, why: str) -> None:
        self.refused.setdefault(student, {})[lesson] = why
        self.problems.append(f"{student}/{lesson}: not graded: {why}")


def _too_big(size: int, limit: int) -> str:
    return (f"the notebook is {size / 2**20:.1f} MB, over the {limit / 2**20:.0f} MB limit: clear its outputs "
            "(Kernel > Restart Kernel and Clear Outputs), save, and submit again")


# -- zip archives ------------------------------------------------------------------------------------------------
def _unzip(source: Path, dest: Path, max_bytes: int, out: Collected, archive_bytes: int = ARCHIVE_BYTES) -> None:
    """Extract the ``.ipynb`` entries of ``source`` (and nbgrader's side files), bounded before and while copying.

    An entry over ``max_bytes`` (declared, or found while copying) is not written: an empty marker file named
    ``*.too-large`` takes its place, so that the student is told why instead of silently missing.
    """
    total = 0
    with zipfile.ZipFile(source) as archive:
        entries = archive.infolist()
        if len(entries) > ARCHIVE_ENTRIES:
            out.problems.append(f"{shown(source.name)}: {len(entries)} entries, over the {ARCHIVE_ENTRIES} limit: "
                                "nothing was extracted")
            return
        for info in entries:
            name = Path(info.filename)
            if info.is_dir() or name.is_absolute() or ".." in name.parts or not name.parts:
                continue
            if name.suffix != ".ipynb" and name.name not in SIDE_FILES:
                continue
            kind = stat.S_IFMT(info.external_attr >> 16)
            if kind and kind != stat.S_IFREG:  # a symbolic link or a device packed into the zip
                out.problems.append(f"{shown(info.filename)}: not a plain file in the zip; skipped")
                continue
            limit = SIDE_FILES.get(name.name, max_bytes)
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if info.file_size > limit:
                target.with_name(target.name + ".too-large").write_text(str(info.file_size))
                continue
            if total + min(info.file_size, limit) > archive_bytes:
                out.problems.append(f"{shown(source.name)}: more than {archive_bytes / 2**30:.0f} GB of notebooks; "
                                    f"entries from {shown(info.filename)} on were not extracted")
                return
            written = 0
            with archive.open(info) as src, open(target, "wb") as dst:
                while written <= limit:
                    chunk = src.read(min(1 << 20, limit + 1 - written))
                    if not chunk:
                        break
                    dst.write(chunk)
                    written += len(chunk)
            total += written
            if written > limit:  # the declared size lied
                target.unlink()
                target.with_name(target.name + ".too-large").write_text(str(written))  # at least limit + 1


# -- finding notebooks -------------------------------------------------------------------------------------------
def _walk(source: Path):
    """Every file below ``source``, as (relative parts, path), without following links."""
    for root, dirs, files in os.walk(source, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files):
            path = Path(root) / name
            yield path.relative_to(source).parts, path


def collect_submissions(source: Path, lessons: list[str], scratch: Path, max_bytes: int = 16 << 20,
                        archive_bytes: int = ARCHIVE_BYTES) -> Collected:
    """Read an nbgrader-layout folder (``student/lesson/*.ipynb``) or a zip of it, or a flat LMS zip or folder
    (``student_anything_<lesson>.ipynb``). See the module docstring for what is refused."""
    out = Collected()
    if source.is_file() and zipfile.is_zipfile(source):
        unpacked = scratch / "unzipped"
        unpacked.mkdir(parents=True, exist_ok=True)
        try:
            _unzip(source, unpacked, max_bytes, out, archive_bytes)
        except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
            out.problems.append(f"{shown(source.name)}: the zip cannot be read ({type(exc).__name__}: "
                                f"{shown(str(exc))[:200]})")
        source = unpacked
    if not source.is_dir():
        out.problems.append(f"{shown(str(source))}: not a folder or a zip file")
        return out

    from_zip = source.name == "unzipped" and source.parent == scratch
    candidates: dict[tuple[str, str], list[Path]] = {}
    too_large: dict[tuple[str, str], str] = {}
    for parts, path in _walk(source):
        name = parts[-1]
        oversized = from_zip and name.endswith(".ipynb.too-large")  # our own marker, never a student's file
        if not (name.endswith(".ipynb") or oversized):
            continue
        where = shown("/".join(parts))
        if len(parts) == 3:
            student, lesson = parts[0], parts[1]
            if lesson not in lessons:
                out.problems.append(f"{where}: {shown(lesson)!s} is not a lesson id; the layout is "
                                    f"student/lesson/notebook.ipynb with a lesson among {', '.join(lessons)}")
                continue
        elif len(parts) == 1:
            matches = [lid for lid in lessons if lid in name]
            student = name.split("_", 1)[0] if "_" in name else ""
            if len(matches) != 1:
                out.problems.append(f"{where}: no single lesson id in its name; a flat file is named "
                                    "student_anything_<lesson>.ipynb")
                continue
            lesson = matches[0]
        else:
            out.problems.append(f"{where}: not in the layout student/lesson/notebook.ipynb (a notebook "
                                f"{'deeper down' if len(parts) > 3 else 'outside a lesson folder'} is never "
                                "graded); move it, or remove it")
            continue
        if not STUDENT_ID.match(student) or student.lower() in RESERVED:
            out.problems.append(f"{where}: student id {shown(student)!r} is not usable (letters, digits, . _ -, "
                                f"at most 64, not {', '.join(sorted(RESERVED))})")
            continue
        if not os.path.isfile(path) or os.path.islink(path):
            out.problems.append(f"{where}: not a plain file; skipped")
            continue
        if oversized:
            too_large[(student, lesson)] = path.read_text()[:32]
            continue
        candidates.setdefault((student, lesson), []).append(path)

    by_folded: dict[str, set[str]] = {}
    for student, _ in list(candidates) + list(too_large):
        by_folded.setdefault(student.casefold(), set()).add(student)
    clashing = {s for group in by_folded.values() if len(group) > 1 for s in group}
    for group in sorted(sorted(g) for g in by_folded.values() if len(g) > 1):
        why = (f"the student ids {', '.join(group)} differ only by case: none of them is graded (their feedback "
               "folders would merge on a case-insensitive file system); rename all but one")
        for student, lesson in sorted(key for key in {*candidates, *too_large} if key[0] in group):
            out.refuse(student, lesson, why)

    for (student, lesson), size in sorted(too_large.items()):
        if student not in clashing:
            out.refuse(student, lesson, _too_big(int(size), max_bytes))
    for (student, lesson), paths in sorted(candidates.items()):
        if student in clashing or lesson in out.refused.get(student, {}):
            continue
        exact = [p for p in paths if p.name == f"{lesson}.ipynb"]
        if len(paths) == 1 or len(exact) == 1:
            chosen = exact[0] if exact else paths[0]
            out.found.setdefault(student, {})[lesson] = chosen
            for other in paths:
                if other != chosen:
                    out.problems.append(f"{shown(str(other.relative_to(source)))}: a second notebook for "
                                        f"{student}/{lesson}; graded {shown(chosen.name)}")
        else:
            out.refuse(student, lesson, f"{len(paths)} notebooks and none named {lesson}.ipynb: submit exactly one")

    for entry in sorted(source.iterdir()) if source.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink() and STUDENT_ID.match(entry.name) and \
                entry.name not in out.found and entry.name not in out.refused and entry.name not in clashing:
            out.problems.append(f"{shown(entry.name)}: no notebook in this student's folder")
    for student, found in sorted(out.found.items()):
        missing = [lesson for lesson in lessons if lesson not in found and lesson not in out.refused.get(student, {})]
        if missing:
            out.problems.append(f"{student}: no notebook for {', '.join(missing)} (nothing to grade there)")
    return out


# -- one notebook ------------------------------------------------------------------------------------------------
def _read_bounded(path: Path, limit: int) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise BadSubmission(_too_big(os.path.getsize(path), limit))
    return data


def read_submission(notebook: Path, max_bytes: int) -> nbformat.NotebookNode:
    """Read a submitted notebook, refusing what nbgrader would choke on, with a message a student understands."""
    try:
        info = os.lstat(notebook)
        if not stat.S_ISREG(info.st_mode):
            raise BadSubmission("the submission is not a plain file (a link or a device): submit the notebook itself")
        if info.st_size > max_bytes:
            raise BadSubmission(_too_big(info.st_size, max_bytes))
        raw = _read_bounded(notebook, max_bytes)
    except OSError as exc:
        raise BadSubmission(f"the notebook cannot be read ({exc.strerror})") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadSubmission("the file is not a notebook: it is not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise BadSubmission(
            f"the file is not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}); it "
            "was probably cut off or edited outside Jupyter") from exc
    except RecursionError as exc:
        raise BadSubmission("the file is not a notebook: its JSON is nested too deeply") from exc
    if not isinstance(data, dict) or "cells" not in data:
        raise BadSubmission("the file is JSON but not a notebook (it has no cells)")
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise BadSubmission(f"the notebook's structure is invalid ({shown(first)}); open it in Jupyter, save it, "
                            "and submit again") from exc
    return nb


def _side_files(folder: Path) -> dict[str, str]:
    """nbgrader's exchange files next to a submitted notebook, kept only when they look as nbgrader writes them."""
    kept = {}
    for name, limit in SIDE_FILES.items():
        path = folder / name
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            text = _read_bounded(path, limit).decode("ascii").strip()
        except (OSError, BadSubmission, UnicodeDecodeError):
            continue
        if name == "timestamp.txt":
            try:
                datetime.fromisoformat(text.replace(" UTC", "").replace("Z", "+00:00"))
            except ValueError:
                continue
        elif not re.fullmatch(r"[0-9a-f]{16,256}", text):
            continue
        kept[name] = text
    return kept


def place(submitted: Path, student: str, lesson: str, notebook: Path, max_bytes: int) -> None:
    """Check a notebook, then write it into nbgrader's ``submitted/student/lesson/lesson.ipynb`` with nbgrader's
    exchange files (if any), and nothing else of the student's folder.

    Everything is read before the destination is replaced, and the new folder is written beside it and swapped
    in by renames: the source may be that very folder (a ``nbgrader collect`` into the work tree), and a failure
    while writing leaves it as it was."""
    nb = read_submission(notebook, max_bytes)
    side = _side_files(notebook.parent) if notebook.parent.name == lesson else {}
    dest = submitted / student / lesson
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{lesson}.", dir=dest.parent))
    old = None
    try:
        staged.chmod(0o755)
        nbformat.write(nb, staged / f"{lesson}.ipynb")
        for name, text in side.items():
            (staged / name).write_text(text)
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            old = dest.rename(staged.with_name(staged.name + ".old"))
        staged.rename(dest)
    except BaseException:
        if old is not None and not os.path.lexists(dest):
            old.rename(dest)  # the submission as it was
        shutil.rmtree(staged, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
