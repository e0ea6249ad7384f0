"""Intake: find each student's notebook for each lesson, and refuse what must not be graded, before nbgrader sees it.

Everything here reads files a student made (or an LMS packed), so nothing is trusted:

- **which layout**: nbgrader's (``SUBMISSIONS/student/lesson/notebook.ipynb``, flat ``student_…<lesson>….ipynb``
  files beside it), or an LMS's export: Canvas, Moodle, Gradescope (:func:`detect_layout`, or ``--layout``);
- **who**: in nbgrader's layout the student is the first path part (the lesson the second, nothing else; a notebook
  deeper down is refused and listed: a student could otherwise plant ``aa/01-masks/zz/01-masks/x.ipynb`` and be
  taken for ``zz``), in a flat file the name up to its first ``_``. In an LMS export the student is the LMS's own
  id for the user (Canvas's user id, Moodle's participant id, Gradescope's sid or email), never a display name
  (two students may share one), made a safe nbgrader id (:func:`safe_id`); the names and emails the LMS gave go to
  :attr:`Collected.roster`, so grades can go back. No file of one submission can count for another's student: the
  student comes from the LMS's own part of the path (its prefix, its folder, its metadata), never from what is
  inside. Ids that differ only by case (a case-insensitive file system would merge their feedback folders), and
  ids two LMS users would share, are refused;
- **which notebook**: re-uploads of one file count as one, the latest; of several notebooks the one named
  ``<lesson>.ipynb``; else none, with a message (:func:`_choose`). Nothing is merged or picked without a word;
- **how big**: a zip entry is judged by its declared size before it is extracted and by its real size while it is
  (at most limit + 1 bytes are copied), with a cap on the whole archive; a notebook is read with the same bound;
- **what else comes along**: only the notebook, and, in nbgrader's ``student/lesson/`` layout alone, the two small
  files nbgrader's exchange puts beside it (``timestamp.txt``, ``submission_secret.txt``), each checked, so that
  formgrader and ``release_feedback`` work. In an LMS export or a flat file such files would be the student's own
  upload, and are never taken;
- **when it was submitted** (the rule is :mod:`autograder.term.schedule`'s): :func:`place` always writes
``timestamp.txt``,
  the checked one beside the notebook in nbgrader's layout, else the notebook file's modification time; a zip's
  entries get theirs from the entry's date and time, read in the term's timezone (:func:`_unzip`).

:func:`collect_submissions` returns what was found, the roster and the problems, in words; :func:`place` checks
one notebook and writes it into nbgrader's ``submitted/`` tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path

import nbformat
import yaml

from autograder.course.lessons import ids as lesson_ids
from autograder.term.schedule import timestamp_text
from decoder_course.text import shown

__all__ = ["ARCHIVE_BYTES", "LAYOUTS", "BadSubmission", "Collected", "STUDENT_ID", "collect_submissions",
           "detect_layout", "place", "read_submission", "safe_id"]

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ARCHIVE_BYTES = 2 << 30  # the most one zip may extract, all entries together
ARCHIVE_ENTRIES = 100_000  # entries one zip may hold
SIDE_FILES = {"timestamp.txt": 64, "submission_secret.txt": 512}  # nbgrader exchange files kept, with their bounds
RESERVED = {"canary"}  # ids the grader uses itself
GRADESCOPE_METADATA = "submission_metadata.yml"  # who submitted each submission_<id>/ folder of its export
METADATA_BYTES = 8 << 20
EXTRACTED = {**SIDE_FILES, GRADESCOPE_METADATA: METADATA_BYTES}  # what a zip gives besides notebooks, bounded
TOO_LARGE = ".too-large"  # the grader's marker for a zip entry over its bound
# Canvas names each downloaded file <lastfirst>_[LATE_]<user id>_<file id>_<file name> (lastfirst: the sortable
# name without non-word characters, lowercased with the rest, and never holding _<digits>_, so the first match is
# Canvas's own); a re-upload of x.ipynb is named x-1.ipynb, x-2.ipynb
CANVAS_FILE = re.compile(r"^(?P<name>.*?)_(?:(?P<late>late)_)?(?P<user>\d{1,20})_(?P<file>\d{1,20})_(?P<original>.+)$",
                         re.IGNORECASE)
REUPLOAD = re.compile(r"^(?P<base>.+?)(?:-\d{1,4})?\.ipynb$")
# Moodle names each submission <Full Name>_<participant id>_assignsubmission_<plugin>_ (a folder, or a prefix of
# each file); the full name has its _ made spaces, so the first _ ends it
MOODLE_ENTRY = re.compile(r"^(?P<name>[^_]+)_(?P<participant>\d{1,20})_assignsubmission_(?P<plugin>[a-z]+)_"
                          r"(?P<rest>.*)$")
GRADESCOPE_FOLDER = re.compile(r"^submission_\d{1,20}$")


class BadSubmission(Exception):
    """A submitted file that cannot be graded; the message says why and what to do."""


@dataclass
class Collected:
    """Submissions found (student -> lesson -> notebook), refused ones (student -> lesson -> why), problems, the
    layout read, and the roster an LMS gave (student -> lms_id, name, email, note: "late", a group)."""

    found: dict[str, dict[str, Path]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    layout: str = ""
    roster: dict[str, dict[str, str]] = field(default_factory=dict)
    # (student, lesson) whose notebook is in nbgrader's student/lesson/ layout: only there are the exchange's files
    # beside it (timestamp.txt, submission_secret.txt) nbgrader's; anywhere else a student could have uploaded them
    exchange: set[tuple[str, str]] = field(default_factory=set)
    # lesson -> how many notebooks of it were left alone: a lesson of the course this run was not asked to grade
    # (``--lessons``, the term's); not a problem, said once (:meth:`skipped_lessons`)
    unselected: dict[str, int] = field(default_factory=dict)

    def skipped_lessons(self) -> str:
        """One line for the notebooks of lessons not graded in this run ("" when none)."""
        if not self.unselected:
            return ""
        count = sum(self.unselected.values())
        return (f"{count} notebook{'s' if count != 1 else ''} of lessons not graded in this run skipped "
                f"({', '.join(f'{lesson}: {n}' for lesson, n in sorted(self.unselected.items()))})")

    def refuse(self, student: str, lesson: str, why: str) -> None:
        self.refused.setdefault(student, {})[lesson] = why
        self.problems.append(f"{student}/{lesson}: not graded: {why}")


def _too_big(size: int, limit: int) -> str:
    return (f"the notebook is {size / 2**20:.1f} MB, over the {limit / 2**20:.0f} MB limit: clear its outputs "
            "(Kernel > Restart Kernel and Clear Outputs), save, and submit again")


# -- zip archives ------------------------------------------------------------------------------------------------
def _unzip(source: Path, dest: Path, max_bytes: int, out: Collected, archive_bytes: int = ARCHIVE_BYTES,
           zone: tzinfo = UTC) -> None:
    """Extract the ``.ipynb`` entries of ``source`` (and nbgrader's side files, Gradescope's metadata), bounded
    before and while copying. Every other plain file becomes an empty placeholder of its name, so that an upload
    that is not a notebook is listed by name instead of missing without a word.

    An entry over its bound (declared, or found while copying) is not written: an empty marker file named
    ``*.too-large`` takes its place, so that the student is told why. No entry replaces another: a second entry
    of the same name, or of one a case-insensitive or normalising file system would take for it, is listed and
    skipped.

    Each extracted file's modification time is its entry's date and time, which a zip stores without a zone: it
    is read in ``zone`` (the term's), so that :func:`place` dates the submission as the LMS packed it.
    """
    total = 0
    with zipfile.ZipFile(source) as archive:
        entries = archive.infolist()
        if len(entries) > ARCHIVE_ENTRIES:
            out.problems.append(f"{shown(source.name)}: {len(entries)} entries, over the {ARCHIVE_ENTRIES} limit: "
                                "nothing was extracted")
            return
        taken: set[str] = set()  # every path written, NFC-normalised and case-folded
        for info in entries:
            name = Path(info.filename)
            if info.is_dir() or not name.parts:
                continue
            if name.is_absolute() or ".." in name.parts:
                out.problems.append(f"{shown(info.filename)}: a path outside the upload; skipped")
                continue
            kind = stat.S_IFMT(info.external_attr >> 16)
            if kind and kind != stat.S_IFREG:  # a symbolic link or a device packed into the zip
                out.problems.append(f"{shown(info.filename)}: not a plain file in the zip; skipped")
                continue
            folded = unicodedata.normalize("NFC", name.as_posix()).casefold()
            if folded in taken:
                out.problems.append(f"{shown(info.filename)}: a second entry of that name (up to case and Unicode "
                                    "normalisation) in the zip; skipped, the first is kept")
                continue
            if name.name.endswith(TOO_LARGE):  # the grader's own marker
                out.problems.append(f"{shown(info.filename)}: a name the grader keeps for itself; skipped")
                continue
            taken.add(folded)
            target = dest / name
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                if name.suffix != ".ipynb" and name.name not in EXTRACTED:
                    target.open("xb").close()
                    _date(target, info, zone)
                    continue
            except OSError:  # a file of that name is where its folder would be, or the other way round
                out.problems.append(f"{shown(info.filename)}: clashes with another entry of the zip; skipped")
                continue
            limit = EXTRACTED.get(name.name, max_bytes)
            if info.file_size > limit:
                target.with_name(target.name + TOO_LARGE).write_text(str(info.file_size))
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
                target.with_name(target.name + TOO_LARGE).write_text(str(written))  # at least limit + 1
            else:
                _date(target, info, zone)


def _date(path: Path, info: zipfile.ZipInfo, zone: tzinfo) -> None:
    """Give ``path`` the entry's date and time as its modification time (read in ``zone``); an impossible date
    (a zip tool that wrote zeros) leaves the time of extraction."""
    try:
        moment = datetime(*info.date_time, tzinfo=zone).timestamp()
    except (ValueError, OverflowError):
        return
    os.utime(path, (moment, moment))


def _unpack(source: Path, scratch: Path, max_bytes: int, archive_bytes: int, out: Collected,
            zone: tzinfo = UTC) -> Path | None:
    """The folder to read: ``source`` itself, or ``scratch/unzipped`` holding a zip's entries (:func:`_unzip`)."""
    if source.is_file() and zipfile.is_zipfile(source):
        unpacked = scratch / "unzipped"
        unpacked.mkdir(parents=True, exist_ok=True)
        try:
            _unzip(source, unpacked, max_bytes, out, archive_bytes, zone)
        except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
            out.problems.append(f"{shown(source.name)}: the zip cannot be read ({type(exc).__name__}: "
                                f"{shown(str(exc))[:200]})")
        source = unpacked
    if not source.is_dir():
        out.problems.append(f"{shown(str(source))}: not a folder or a zip file")
        return None
    return source


# -- the layouts -------------------------------------------------------------------------------------------------
@dataclass
class _Upload:
    """One notebook a student uploaded: whose, for which lesson, and what decides between several."""

    student: str
    lesson: str
    path: Path
    where: str  # its path in the upload, escaped, for messages
    base: str  # its file name as the student meant it (an LMS's re-upload suffix removed)
    version: str | None = None  # re-uploads of one file share it; the highest ``order`` is the latest
    order: tuple = ()
    oversized: int | None = None  # its size, when the zip's marker stands for it
    exchange: bool = False  # in nbgrader's student/lesson/ layout: the exchange's files beside it are kept
    submitted: datetime | None = None  # when the LMS itself says it was submitted (Gradescope's :created_at)


@dataclass
class _Reading:
    """What a layout's reader found: the uploads, every student it saw (with a notebook or not), and the ids it
    cannot give to one person alone (student -> why)."""

    root: Path
    from_zip: bool
    lessons: list[str]
    out: Collected
    zone: tzinfo = UTC  # the term's: an LMS's time without a zone is read in it
    uploads: list[_Upload] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    conflicts: dict[str, str] = field(default_factory=dict)
    elsewhere: set[str] = field(default_factory=set)  # students with notebooks of lessons this run does not grade

    def unselected(self, student: str, lesson: str) -> None:
        """A notebook of a lesson of the course that this run does not grade: counted, not a problem."""
        self.out.unselected[lesson] = self.out.unselected.get(lesson, 0) + 1
        self.elsewhere.add(student)

    def enrol(self, student: str, lms_id: str, name: str = "", email: str = "", note: str = "") -> None:
        """Add a student the LMS named to the roster; an id that two of the LMS's users would get is refused."""
        self.seen.add(student)
        entry = self.out.roster.setdefault(student, {"lms_id": lms_id, "name": name, "email": email, "note": ""})
        if entry["lms_id"] != lms_id:
            self.conflicts[student] = (f"the LMS ids {shown(entry['lms_id'])!r} and {shown(lms_id)!r} both give "
                                       f"the id {student}: neither is graded; give them ids that differ in the LMS")
        if note and note not in entry["note"].split("; "):
            entry["note"] = "; ".join(filter(None, [entry["note"], note]))

    def notebook(self, path: Path, name: str) -> tuple[str, int | None] | None:
        """(the notebook's name, its size when the zip's too-large marker stands for it), or None (not a
        notebook). ``name`` is the file's name as the student gave it (an LMS's prefix removed)."""
        if self.from_zip and name.endswith(".ipynb" + TOO_LARGE):  # our own marker, never a student's file
            try:
                return name[:-len(TOO_LARGE)], int(path.read_text()[:32])
            except (OSError, ValueError):
                return None
        return (name, None) if name.endswith(".ipynb") else None

    def lesson_of(self, name: str, where: str) -> str | None:
        """The lesson an LMS upload is for: the one lesson id in its file name, or the only lesson graded."""
        matches = [lesson for lesson in self.lessons if lesson.casefold() in name.casefold()]
        if len(matches) == 1:
            return matches[0]
        if not matches and len(self.lessons) == 1:  # an LMS export holds one assignment
            return self.lessons[0]
        self.out.problems.append(f"{where}: {'no' if not matches else 'more than one'} lesson id in its name; "
                                 "an LMS export holds one assignment: grade it with --lessons LESSON")
        return None

    def add(self, student: str, parts: tuple[str, ...], path: Path, name: str, base: str | None = None,
            version: str | None = None, order: tuple = (), submitted: datetime | None = None) -> None:
        """One file of ``student``'s upload (``name`` as the student gave it): a notebook for a lesson, or listed as
        not graded."""
        where = shown("/".join(parts))
        found = self.notebook(path, name)
        if found is None:
            self.out.problems.append(f"{where}: not a notebook (.ipynb); not graded")
            return
        name, oversized = found
        if not os.path.isfile(path) or os.path.islink(path):
            self.out.problems.append(f"{where}: not a plain file; skipped")
            return
        lesson = self.lesson_of(name, where)
        if lesson:
            self.uploads.append(_Upload(student, lesson, path, where, base or name, version, order, oversized,
                                        submitted=submitted))


def _walk(source: Path):
    """Every file below ``source``, as (relative parts, path), without following links."""
    for root, dirs, files in os.walk(source, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files):
            path = Path(root) / name
            yield path.relative_to(source).parts, path


def _read_nbgrader(reading: _Reading, shapes: set[int]) -> None:
    """nbgrader's ``student/lesson/notebook.ipynb`` (3 parts) and flat ``student_anything_<lesson>.ipynb`` files
    (1 part): the student is the first path part or the name up to its first ``_``, nothing else."""
    out, lessons = reading.out, reading.lessons
    for parts, path in _walk(reading.root):
        found = reading.notebook(path, parts[-1])
        if found is None:
            continue
        name, oversized = found
        where = shown("/".join(parts))
        if len(parts) == 3 and 3 in shapes:
            student, lesson = parts[0], parts[1]
            if lesson not in lessons and lesson in lesson_ids():  # a lesson of the course this run does not grade
                reading.unselected(student, lesson)
                continue
            if lesson not in lessons:
                out.problems.append(f"{where}: {shown(lesson)!s} is not a lesson id; the layout is "
                                    f"student/lesson/notebook.ipynb with a lesson among {', '.join(lesson_ids())}")
                continue
        elif len(parts) == 1 and 1 in shapes:
            matches = [lid for lid in lessons if lid in name]
            student = name.split("_", 1)[0] if "_" in name else ""
            others = [lid for lid in lesson_ids() if lid in name and lid not in lessons]
            if not matches and len(others) == 1:  # a lesson of the course this run does not grade
                reading.unselected(student, others[0])
                continue
            if len(matches) != 1:
                out.problems.append(f"{where}: no single lesson id in its name; a flat file is named "
                                    "student_anything_<lesson>.ipynb")
                continue
            lesson = matches[0]
        else:
            shape = "student/lesson/notebook.ipynb" if 3 in shapes else "student_anything_<lesson>.ipynb"
            spot = "deeper down" if len(parts) > 3 else "outside a lesson folder" if 3 in shapes else "in a folder"
            out.problems.append(f"{where}: not in the layout {shape} (a notebook {spot} is never graded); move "
                                "it, or remove it")
            continue
        if not STUDENT_ID.match(student) or student.lower() in RESERVED:
            out.problems.append(f"{where}: student id {shown(student)!r} is not usable (letters, digits, . _ -, "
                                f"at most 64, not {', '.join(sorted(RESERVED))})")
            continue
        if not os.path.isfile(path) or os.path.islink(path):
            out.problems.append(f"{where}: not a plain file; skipped")
            continue
        reading.uploads.append(_Upload(student, lesson, path, where, name, oversized=oversized,
                                       exchange=len(parts) == 3))
    if 3 in shapes:
        reading.seen |= {entry.name for entry in reading.root.iterdir() if entry.is_dir() and not entry.is_symlink()
                         and STUDENT_ID.match(entry.name) and entry.name.lower() not in RESERVED}


def _read_canvas(reading: _Reading) -> None:
    """Canvas's "Download Submissions": flat files ``<lastfirst>_[LATE_]<user id>_<file id>_<file name>``. The
    student is Canvas's user id; a re-uploaded ``x.ipynb`` is ``x-1.ipynb``, ``x-2.ipynb``, and the file id
    grows with each upload, so the highest file id of one file is the latest."""
    for parts, path in _walk(reading.root):
        match = CANVAS_FILE.match(parts[0]) if len(parts) == 1 else None
        if not match:
            reading.out.problems.append(f"{shown('/'.join(parts))}: not named as Canvas names a download "
                                        "(<name>_<user id>_<file id>_<file name>); not graded")
            continue
        student = f"canvas-{match['user']}"
        reading.enrol(student, match["user"], name=match["name"], note="late" if match["late"] else "")
        original = match["original"]
        again = REUPLOAD.match(original.removesuffix(TOO_LARGE))
        base = f"{again['base']}.ipynb" if again else original
        reading.add(student, parts, path, original, base=base, version=base, order=(int(match["file"]),))


def _read_moodle(reading: _Reading) -> None:
    """Moodle's "Download all submissions": a folder ``<Full Name>_<participant id>_assignsubmission_file_/`` per
    student (or files prefixed so, with "Download submissions in folders" off). The student is the participant
    id; the names may hold spaces and accents and are only shown."""
    for parts, path in _walk(reading.root):
        match = MOODLE_ENTRY.match(parts[0])
        if not match:
            reading.out.problems.append(f"{shown('/'.join(parts))}: not in a Moodle submission "
                                        "(<Full Name>_<participant id>_assignsubmission_file_…); not graded")
            continue
        student = f"moodle-{match['participant']}"
        reading.enrol(student, match["participant"], name=match["name"])
        reading.add(student, parts, path, parts[-1] if len(parts) > 1 else match["rest"])


def _gradescope_text(record: dict, key: str) -> str:
    value = record.get(f":{key}", record.get(key))
    return str(value).strip()[:200] if isinstance(value, (str, int)) and not isinstance(value, bool) else ""


def _read_gradescope(reading: _Reading) -> None:
    """Gradescope's "Export Submissions": ``submission_<id>/`` folders and ``submission_metadata.yml``, which names
    each submission's submitters (name, email, sid). The student is the sid, or the email without one; each
    member of a group submission gets the group's notebook graded as their own."""
    out = reading.out
    meta = reading.root / GRADESCOPE_METADATA
    if reading.from_zip and not os.path.lexists(meta):  # the zip's marker stands for it
        out.problems.append(f"{GRADESCOPE_METADATA}: over the {METADATA_BYTES >> 20} MB limit: nothing is graded "
                            "without it; export the submissions again")
        return
    try:
        if os.lstat(meta).st_size > METADATA_BYTES or not stat.S_ISREG(os.lstat(meta).st_mode):
            raise ValueError(f"not a plain file of at most {METADATA_BYTES >> 20} MB")
        records = yaml.load(meta.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # no tags
        if not isinstance(records, dict):
            raise ValueError("not a mapping of submissions")
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:
        out.problems.append(f"{GRADESCOPE_METADATA}: cannot be read ({shown(str(exc).splitlines()[0][:200])}): "
                            "nothing is graded without it; export the submissions again")
        return
    members: dict[str, list[str]] = {}
    in_submissions: dict[str, list[str]] = {}
    created: dict[str, datetime | None] = {}
    for key, record in records.items():
        if not isinstance(key, str) or not GRADESCOPE_FOLDER.match(key) or not isinstance(record, dict):
            out.problems.append(f"{GRADESCOPE_METADATA}: entry {shown(str(key))[:80]!r} is not a submission; "
                                "skipped")
            continue
        created[key] = _gradescope_time(record.get(":created_at", record.get("created_at")), reading.zone)
        submitters = record.get(":submitters", record.get("submitters"))
        for submitter in submitters if isinstance(submitters, list) else []:
            submitter = submitter if isinstance(submitter, dict) else {}
            sid, email = _gradescope_text(submitter, "sid"), _gradescope_text(submitter, "email").casefold()
            lms_id = sid or email
            if not lms_id:
                out.problems.append(f"{key}: a submitter has neither a sid nor an email; not graded for them")
                continue
            student = safe_id("gs", lms_id)
            reading.enrol(student, lms_id, name=_gradescope_text(submitter, "name"), email=email)
            if student not in members.setdefault(key, []):  # one submitter listed twice is one student
                members[key].append(student)
                in_submissions.setdefault(student, []).append(key)
        if not members.get(key):
            out.problems.append(f"{key}: no submitter in {GRADESCOPE_METADATA}; nobody to grade it for")
    for student, keys in in_submissions.items():
        if len(keys) > 1:
            reading.conflicts[student] = (f"a submitter of {', '.join(keys)}: graded in none of them; keep one "
                                          "active submission per student in Gradescope and export again")
    for key, group in members.items():
        if len(group) > 1:
            for student in group:
                out.roster[student]["note"] = f"group {key} with {', '.join(s for s in group if s != student)}"
    for parts, path in _walk(reading.root):
        if parts == (GRADESCOPE_METADATA,):
            continue
        if len(parts) < 2 or parts[0] not in members:
            out.problems.append(f"{shown('/'.join(parts))}: not in a submission folder that "
                                f"{GRADESCOPE_METADATA} names; not graded")
            continue
        for student in members[parts[0]]:
            reading.add(student, parts, path, parts[-1], submitted=created.get(parts[0]))


def _gradescope_time(value, zone: tzinfo) -> datetime | None:
    """A submission's ``:created_at`` (``2027-01-18 14:02:03.123456789 -08:00``, which YAML may already have
    read as a time), aware; a time without a zone is in the term's; None when it is not a time."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and len(value) < 64:
        match = re.fullmatch(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?",
                             value.strip())
        if not match:
            return None
        day, clock, fraction, offset = match.groups()
        text = f"{day}T{clock}" + (f".{fraction[:6]}" if fraction else "") + (
            "+00:00" if offset == "Z" else offset or "")
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment


def _dated(path: Path, moment: datetime, scratch: Path, max_bytes: int) -> Path:
    """A copy of ``path`` in ``scratch`` whose modification time is ``moment`` (the LMS's own time of the
    submission, which place() then writes as its timestamp); ``path`` itself when it is too big to copy (place()
    refuses it) or cannot be read. The instructor's folder is never touched."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError:
        return path
    if len(data) > max_bytes:
        return path
    scratch.mkdir(parents=True, exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="dated-", dir=scratch)) / path.name
    copy.write_bytes(data)
    os.utime(copy, (moment.timestamp(), moment.timestamp()))
    return copy


def safe_id(prefix: str, lms_id: str) -> str:
    """An nbgrader student id made from an LMS's own id for a user: ``prefix-`` then the id, NFKC-normalised,
    with every character but ASCII letters, digits, ``.``, ``_``, ``-`` written as ``-``, at most 64 long. Two
    LMS ids that give the same student id are caught by :meth:`_Reading.enrol`."""
    text = re.sub(r"[^A-Za-z0-9._-]", "-", unicodedata.normalize("NFKC", lms_id))
    return f"{prefix}-{text}"[:64]


def detect_layout(root: Path) -> tuple[str, Path]:
    """Which layout ``root`` holds, and the folder to read (an LMS export zipped inside one folder is unwrapped).

    Gradescope: ``submission_metadata.yml`` beside ``submission_<id>/`` folders. Moodle: entries named
    ``<Full Name>_<participant id>_assignsubmission_<plugin>_…``. Canvas: mostly files named
    ``<lastfirst>_[late_]<user id>_<file id>_<file name>``. Anything else is nbgrader's layout (with flat files
    beside it, as before)."""
    entries = list(root.iterdir())
    inner = entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else None
    for folder in filter(None, (root, inner)):
        children = list(folder.iterdir())
        if {GRADESCOPE_METADATA, GRADESCOPE_METADATA + TOO_LARGE} & {child.name for child in children}:
            return "gradescope", folder
        if any(MOODLE_ENTRY.match(child.name) for child in children):
            return "moodle", folder
        canvas = sum(1 for child in children if child.is_file() and CANVAS_FILE.match(child.name))
        if canvas and 2 * canvas > len(children):  # a stray folder or file is listed, not taken for a layout
            return "canvas", folder
    return "nbgrader", root


# -- choosing one notebook per student and lesson ----------------------------------------------------------------
def _choose(reading: _Reading, max_bytes: int) -> None:
    """One notebook per student and lesson, or a refusal that says why; every notebook not graded is listed.

    The rule: re-uploads of one file (an LMS's ``-1``, ``-2``) count as one, the latest; then a single notebook is
    graded; of several, the one named ``<lesson>.ipynb`` (the others listed); else none (the student is told to
    submit exactly one). Ids that differ only by case, or that the LMS gave two users, are never graded."""
    out = reading.out
    by_folded: dict[str, set[str]] = {}
    for student in {upload.student for upload in reading.uploads} | reading.seen:
        by_folded.setdefault(student.casefold(), set()).add(student)
    for group in sorted(sorted(g) for g in by_folded.values() if len(g) > 1):
        why = (f"the student ids {', '.join(group)} differ only by case: none of them is graded (their feedback "
               "folders would merge on a case-insensitive file system); rename all but one")
        for student in group:
            reading.conflicts.setdefault(student, why)

    groups: dict[tuple[str, str], list[_Upload]] = {}
    for upload in reading.uploads:
        groups.setdefault((upload.student, upload.lesson), []).append(upload)
    for student, why in sorted(reading.conflicts.items()):
        lessons = sorted({lesson for (s, lesson) in groups if s == student})
        for lesson in lessons:
            out.refuse(student, lesson, why)
        if not lessons:
            out.problems.append(f"{student}: {why}")
    for (student, lesson), uploads in sorted(groups.items()):
        if student in reading.conflicts:
            continue
        latest: dict[object, _Upload] = {}
        for upload in sorted(uploads, key=lambda u: u.order):
            latest[upload.version or upload.path] = upload
        kept = sorted(latest.values(), key=lambda u: u.where)
        for upload in uploads:
            if not any(upload is k for k in kept):
                newest = latest[upload.version]
                out.problems.append(f"{upload.where}: an earlier upload of {shown(upload.base)} for "
                                    f"{student}/{lesson}; graded the latest, {newest.where}")
        exact = [upload for upload in kept if upload.base == f"{lesson}.ipynb"]
        if len(kept) == 1 or len(exact) == 1:
            chosen = kept[0] if len(kept) == 1 else exact[0]
            for other in kept:
                if other is not chosen:
                    out.problems.append(f"{other.where}: a second notebook for {student}/{lesson}; graded "
                                        f"{chosen.where}")
        else:
            names = ", ".join(upload.where for upload in kept[:5]) + (", …" if len(kept) > 5 else "")
            out.refuse(student, lesson, f"{len(kept)} notebooks ({names}) and {'none' if not exact else 'several'} "
                                        f"named {lesson}.ipynb: submit exactly one")
            continue
        if chosen.oversized is not None:
            out.refuse(student, lesson, _too_big(chosen.oversized, max_bytes))
        else:
            out.found.setdefault(student, {})[lesson] = chosen.path
            if chosen.exchange:
                out.exchange.add((student, lesson))

    for student in sorted(reading.seen - set(out.found) - set(out.refused) - set(reading.conflicts)
                          - reading.elsewhere):
        name = out.roster.get(student, {}).get("name")
        out.problems.append(f"{student} ({shown(name)}): no notebook in their upload" if student in out.roster
                            else f"{shown(student)}: no notebook in this student's folder")
    submitted = {upload.lesson for upload in reading.uploads}
    for student, found in sorted(out.found.items()):
        missing = [lesson for lesson in reading.lessons if lesson in submitted and lesson not in found
                   and lesson not in out.refused.get(student, {})]
        if missing:
            out.problems.append(f"{student}: no notebook for {', '.join(missing)} (nothing to grade there)")


READERS = {"nbgrader": lambda reading: _read_nbgrader(reading, {3}), "flat": lambda reading: _read_nbgrader(
    reading, {1}), "canvas": _read_canvas, "moodle": _read_moodle, "gradescope": _read_gradescope}
LAYOUTS = tuple(READERS)


def collect_submissions(source: Path, lessons: list[str], scratch: Path, max_bytes: int = 16 << 20,
                        archive_bytes: int = ARCHIVE_BYTES, layout: str | None = None,
                        zone: tzinfo = UTC) -> Collected:
    """Read a folder or a zip in ``layout`` (one of :data:`LAYOUTS`; found by :func:`detect_layout` when None):
    nbgrader's ``student/lesson/*.ipynb`` (with flat ``student_anything_<lesson>.ipynb`` files beside it when
    detected), or an LMS's export (Canvas, Moodle, Gradescope). See the module docstring for what is refused.
    ``zone`` is the term's timezone, in which a zip's entry times are read."""
    if layout is not None and layout not in READERS:
        raise ValueError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    out = Collected()
    root = _unpack(source, scratch, max_bytes, archive_bytes, out, zone)
    if root is None:
        return out
    from_zip = root == scratch / "unzipped"
    if layout is None:
        out.layout, root = detect_layout(root)
        read = READERS[out.layout] if out.layout != "nbgrader" else lambda reading: _read_nbgrader(reading, {1, 3})
    else:
        out.layout, read = layout, READERS[layout]
        if layout in ("canvas", "moodle", "gradescope"):
            root = detect_layout(root)[1]  # unwrapped from its one folder, if it is
    reading = _Reading(root, from_zip, lessons, out, zone=zone)
    read(reading)
    _choose(reading, max_bytes)
    for upload in reading.uploads:  # the LMS's own time of a graded submission dates it, not its file's
        if upload.submitted is not None and out.found.get(upload.student, {}).get(upload.lesson) == upload.path:
            out.found[upload.student][upload.lesson] = _dated(upload.path, upload.submitted, scratch, max_bytes)
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


def place(submitted: Path, student: str, lesson: str, notebook: Path, max_bytes: int,
          exchange_files: bool = True) -> None:
    """Check a notebook, then write it into nbgrader's ``submitted/student/lesson/lesson.ipynb`` with nbgrader's
    exchange files, and nothing else of the student's folder.

    The exchange's files are taken from beside the notebook only with ``exchange_files`` (the notebook is in
    nbgrader's ``student/lesson/`` layout: :attr:`Collected.exchange`), and only from a folder named for the
    lesson. ``timestamp.txt`` is always written (what ``autograde`` dates the submission by): the checked one
    taken, else the notebook file's modification time, in UTC.

    Everything is read before the destination is replaced, and the new folder is written beside it and swapped
    in by renames: the source may be that very folder (a ``nbgrader collect`` into the work tree), and a failure
    while writing leaves it as it was."""
    nb = read_submission(notebook, max_bytes)
    side = _side_files(notebook.parent) if exchange_files and notebook.parent.name == lesson else {}
    if "timestamp.txt" not in side:
        side["timestamp.txt"] = timestamp_text(datetime.fromtimestamp(os.lstat(notebook).st_mtime, UTC))
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
