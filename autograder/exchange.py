"""nbgrader's ``collect`` for this course: a submission in the exchange counts for the student its folder names only
when that student's unix account wrote every part of it, and nothing in it is a link.

The exchange's ``inbound`` folder is writable by every account, and a submission is a folder named
``{student_id}+{assignment}+{timestamp}+{random}``: ``nbgrader submit --student alice`` run from bob's account
writes ``alice+…``, later than alice's own, and nbgrader's collect takes the latest per name, only warning about
its owner. It also copies with ``shutil.copytree``, which follows symbolic links: a submission that is, or holds, a
link to a file the instructor's account may read (the course's secret, a classmate's draft) is copied from the
link's target. nbgrader makes each submission's folder writable by everyone (so that the instructor may delete it),
so whoever knows its name can put files into it after it was submitted.

:class:`CourseExchangeCollect` replaces nbgrader's collect class (``ExchangeFactory.collect``, set by
:func:`autograder.pipeline.tools_config`). For each student it takes the latest submission (before the due date
with ``--before-duedate``, as nbgrader does; the student's own due date in the term, extension included, when
there is one) that passes, and sets apart every one that does not, with a warning in collect's log and a file in
``set_apart_directory`` naming the folder and why; the student's own earlier submission is collected instead. A
submission passes when its folder and every file and folder in it are owned by the unix account of the student
its name claims, no file has a second name (a hard link), nothing is a symbolic link, a FIFO,
a socket or a device, and nothing inside is writable by other accounts (nbgrader's submit writes files 0644 and
folders 0755: a student who opened theirs to a classmate did it by hand). Everything is opened without following
links, checked on the open descriptor and read from it, so what was checked is what is copied.

When was it submitted (the rule is :mod:`autograder.term`'s)? ``nbgrader submit`` writes the time into the
folder's name and ``timestamp.txt``, from the student's account: a student can write any time there. The exchange's
file system also records, in each entry's ``ctime``, the last change to it, and no account but root can set that
back. The collected ``timestamp.txt`` is the later of the two: nbgrader's time, unless something in the submission
(its folder, a file in it, ``timestamp.txt`` itself) changed more than :data:`SUBMIT_SLACK` after it, and then
the newest ``ctime`` (read from the descriptors the copy opens). A submission can be made to look later, never
earlier. A ``chmod -R`` or ``chown -R`` over the exchange changes every ``ctime``: every submission it touched
then dates from it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import pwd
import re
import shutil
import stat
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import parse_utc
from traitlets import Dict, Unicode

from autograder import term as term_module
from autograder.late import naive_utc
from autograder.term import as_utc, timestamp_text
from autograder.text import shown

__all__ = ["CourseExchangeCollect", "Refused"]

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO swapped in never hangs
_MAX_ENTRIES = 10_000  # files and folders in one submission: a lesson has a handful
_MAX_DEPTH = 32
_CHUNK = 1 << 20
# How long after nbgrader's time an honest submit may still be changing its folder (copying the files, its chmod):
# a change later than this dates the submission instead
SUBMIT_SLACK = timedelta(seconds=60)


class Refused(Exception):
    """Why one submission in the exchange is not collected: a sentence for the instructor."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check(st: os.stat_result, shown_path: str, uid: int | None, expected: str, inside: bool) -> None:
    """Raise :class:`Refused` unless ``st`` is a plain folder or file that ``uid`` owns, with one name, that other
    accounts may not write (``inside`` the submission's folder: nbgrader makes that folder itself writable)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise Refused(f"{shown_path} is a symbolic link: links are never followed")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device file"
        raise Refused(f"{shown_path} is {kind}, not a file or folder")
    if not inside and not stat.S_ISDIR(mode):
        raise Refused(f"{shown_path} is a file, not a folder")
    if uid is not None and st.st_uid != uid:
        raise Refused(f"{shown_path} is owned by {_owner(st.st_uid)}, not by {expected}: another account wrote it "
                      f"(nbgrader submit --student, or a file put into the student's folder)")
    if stat.S_ISREG(mode) and st.st_nlink > 1:
        raise Refused(f"{shown_path} is a hard link ({st.st_nlink} names): its content is shared with a file "
                      "elsewhere")
    if inside and mode & 0o022:
        raise Refused(f"{shown_path} is writable by other accounts (mode {stat.S_IMODE(mode):04o}): nbgrader's "
                      "submit writes 0644 files and 0755 folders, so it was opened to others after submitting")


def _open(parent: int, name: str, shown_path: str, uid: int | None, expected: str, inside: bool):
    """Open ``name`` in the folder ``parent`` without following a link; check it before and on the descriptor."""
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
        _check(before, shown_path, uid, expected, inside)  # never opens a link, a FIFO or a device
        fd = os.open(name, _OPEN | (os.O_DIRECTORY if stat.S_ISDIR(before.st_mode) else 0), dir_fd=parent)
    except OSError as exc:
        raise Refused(f"{shown_path} could not be opened ({exc.strerror}; links are not followed)") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise Refused(f"{shown_path} was replaced while it was being collected")
        _check(opened, shown_path, uid, expected, inside)
    except BaseException:
        os.close(fd)
        raise
    return fd, opened


class _Walk:
    """One pass over one submission: checks everything (also what ``CourseDirectory.ignore`` leaves out), and with
    ``dest`` copies what nbgrader's own collect would copy (``ignore``, ``include``, ``max_file_size``)."""

    def __init__(self, collect: CourseExchangeCollect, uid: int | None, expected: str):
        self.coursedir, self.log = collect.coursedir, collect.log
        self.uid, self.expected = uid, expected
        self.entries, self.size = 0, 0
        self.changed_ns = 0  # the newest ctime of the folder and everything in it
        self.max_size = 1000 * self.coursedir.max_dir_size

    def folder(self, fd: int, shown_path: str, dest: Path | None, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise Refused(f"{shown_path} is nested more than {_MAX_DEPTH} folders deep")
        with os.scandir(fd) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            self.entries += 1
            if self.entries > _MAX_ENTRIES:
                raise Refused(f"the submission holds more than {_MAX_ENTRIES} files and folders")
            path = f"{shown_path}/{shown(name)}" if shown_path else shown(name)
            child, st = _open(fd, name, path, self.uid, self.expected, True)
            self.changed_ns = max(self.changed_ns, st.st_ctime_ns)
            try:
                excluded = any(fnmatch.fnmatch(name, pattern) for pattern in self.coursedir.ignore or ())
                target = None if dest is None or excluded else dest / name
                if stat.S_ISDIR(st.st_mode):
                    if target is not None:
                        target.mkdir(mode=0o700)
                    self.folder(child, path, target, depth + 1)
                    if target is not None:
                        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755)
                else:
                    self.file(child, st, path, name, target)
            finally:
                os.close(child)

    def file(self, fd: int, st: os.stat_result, shown_path: str, name: str, target: Path | None) -> None:
        self.size += st.st_size
        if self.size > self.max_size:
            raise Refused(f"the submission is larger than CourseDirectory.max_dir_size ({self.max_size} bytes)")
        if target is None:
            return
        include = self.coursedir.include
        if include and not any(fnmatch.fnmatch(name, pattern) for pattern in include):
            return
        limit = 1000 * self.coursedir.max_file_size if self.coursedir.max_file_size else None
        if limit is not None and st.st_size > limit:
            self.log.warning("Ignoring file too large %s (see config option CourseDirectory.max_file_size)",
                             shown_path)
            return
        copied = 0
        with open(target, "xb") as out:
            while chunk := os.read(fd, _CHUNK):
                copied += len(chunk)
                if copied > st.st_size:
                    raise Refused(f"{shown_path} grew while it was being collected")
                out.write(chunk)
        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o644)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


class CourseExchangeCollect(ExchangeCollect):
    """nbgrader's collect, taking per student the latest submission that the student's own account wrote, with no
    link in it; every other one is set apart with a message (see the module's docstring)."""

    unix_user_template = Unicode(
        "{student_id}",
        help="The unix account of a student id, where the hub names accounts after students differently "
             "(The Littlest JupyterHub: 'jupyter-{student_id}'). Its submissions must be owned by that account."
    ).tag(config=True)

    unix_users = Dict(
        value_trait=Unicode(), default_value={},
        help="Student id -> unix account, for the students whose account unix_user_template does not give."
    ).tag(config=True)

    set_apart_directory = Unicode(
        "", help="Where a file says why each submission was not collected (default: 'set_apart' beside the "
                 "submitted directory)."
    ).tag(config=True)

    def unix_user(self, student_id: str) -> str:
        return self.unix_users.get(student_id) or self.unix_user_template.format(student_id=student_id)

    # -- which submissions ---------------------------------------------------------------------------------------
    def init_src(self):
        """nbgrader's choice of one submission per student, among those that pass (:meth:`_examine`)."""
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        try:
            inbound = os.stat(self.inbound_path, follow_symlinks=False)
        except OSError:
            self.fail(f"Course not found: {self.inbound_path}")
        if not stat.S_ISDIR(inbound.st_mode):
            self.fail(f"{self.inbound_path} is not a folder: was the course's exchange folder replaced?")
        instructors = {os.geteuid(), os.stat(self.coursedir.root).st_uid}  # you, or whose course this is
        if not self.coursedir.groupshared and inbound.st_uid not in instructors:
            self.fail(f"{self.inbound_path} is owned by {_owner(inbound.st_uid)}, not by you: another account "
                      "created or replaced the course's exchange folder. Move it away, run release_assignment "
                      "again, and make the exchange's root sticky (chmod 1777) as docs/INSTRUCTOR.md says.")
        student = self.coursedir.student_id or "*"  # a pattern, as in nbgrader's collect
        pattern = os.path.join(glob.escape(self.inbound_path),
                               f"{student}+{glob.escape(self.coursedir.assignment_id)}+*")
        by_student: dict[str, list[dict]] = {}
        for path in glob.glob(pattern):
            record = self._record(os.path.basename(path))
            if record is not None:
                by_student.setdefault(record["username"], []).append(record)
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for _, records in sorted(by_student.items()):
            chosen = None
            for record in self._in_order(records):
                why = self._examine(record)
                if why is None and chosen is None:
                    chosen = record
                elif why is not None:
                    record["why"] = why
            for record in records:
                if "why" in record:
                    self._set_apart(record, chosen)
            if chosen is not None:
                self.src_records.append(chosen)

    def _record(self, filename: str) -> dict | None:
        """The student id and time a folder's name claims; ``None`` (with a warning) when it says neither."""
        parts = filename.rsplit("+", 3)
        try:
            if len(parts) < 3 or parts[1] != self.coursedir.assignment_id:
                raise ValueError(f"not {{student_id}}+{self.coursedir.assignment_id}+{{timestamp}}")
            timestamp = parse_utc(parts[2])
        except (ValueError, OverflowError, TypeError) as exc:
            self.log.warning("Not collected: %s in %s is not a submission's name: %s", shown(filename),
                             self.inbound_path, shown(exc))
            return None
        return {"username": parts[0], "filename": filename, "timestamp": timestamp}

    def _in_order(self, records: list[dict]) -> list[dict]:
        """Latest first; with ``--before-duedate`` those before the due date come first, as nbgrader picks. The due
        date is the student's own in the term (their extension included), else the gradebook's."""
        latest = sorted(records, key=lambda record: record["timestamp"], reverse=True)
        if not self.before_duedate or not latest:
            return latest
        term = term_module.from_config(self)
        lesson, student = self.coursedir.assignment_id, latest[0]["username"]
        due = naive_utc(term.due(lesson, student)) if term and term.scheduled(lesson) else self.duedate
        if due is None:
            return latest
        return sorted(latest, key=lambda record: record["timestamp"] > due)  # stable: latest first

    def _examine(self, record: dict) -> str | None:
        """Why ``record``'s folder may not be collected, or ``None``: a check of everything in it, nothing copied."""
        try:
            self._walk(record, None)
        except Refused as why:
            return str(why)
        return None

    def _expected(self, student_id: str) -> tuple[int | None, str]:
        """The uid that must own a submission of ``student_id`` (``None``: not checked), and how to name it."""
        if not re.fullmatch(r"[^/\s]+", student_id) or student_id in (".", "..") or shown(student_id) != student_id:
            raise Refused(f"'{shown(student_id)}' is not a student id")
        user = self.unix_user(student_id)
        if not self.check_owner:
            return None, user
        try:
            return pwd.getpwnam(user).pw_uid, f"{student_id}'s account {user}"
        except KeyError:
            raise Refused(f"there is no unix account {shown(user)!r} for student {student_id}: set "
                          "CourseExchangeCollect.unix_user_template or unix_users in nbgrader_config.py") from None

    def _walk(self, record: dict, dest: Path | None) -> _Walk:
        """Check the whole folder of ``record`` (and copy it into ``dest``, which must not exist)."""
        uid, expected = self._expected(record["username"])
        inbound = os.open(self.inbound_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            top, st = _open(inbound, record["filename"], "it", uid, expected, False)
        finally:
            os.close(inbound)
        try:
            if dest is not None:
                dest.mkdir(mode=0o700)
            walk = _Walk(self, uid, expected)
            walk.changed_ns = st.st_ctime_ns
            walk.folder(top, "", dest, 0)
            if dest is not None:
                os.chmod(dest, 0o755)
            return walk
        finally:
            os.close(top)

    def _date(self, record: dict, folder: Path, changed_ns: int) -> None:
        """Write ``folder/timestamp.txt`` by the rule in the module's docstring: nbgrader's time (the copied
        ``timestamp.txt``, else the folder's name), or the submission's last change when that is later by more
        than :data:`SUBMIT_SLACK`."""
        path = folder / "timestamp.txt"  # in the staging folder: what the copy wrote, no link
        claimed = record["timestamp"]
        try:
            with open(path) as handle:
                claimed = parse_utc(handle.read(64).strip())
        except (OSError, ValueError, OverflowError, TypeError):  # none, a folder, not a time: the name's
            pass
        claimed = as_utc(claimed)
        changed = datetime.fromtimestamp(changed_ns / 1e9, UTC)
        submitted = claimed
        if changed - SUBMIT_SLACK > claimed:
            submitted = changed
            self.log.warning("%s: nbgrader's time is %s, but the submission last changed at %s: it is dated %s",
                             shown(record["filename"]), timestamp_text(claimed), timestamp_text(changed),
                             timestamp_text(changed))
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
        path.write_text(timestamp_text(submitted))
        os.chmod(path, 0o644)

    # -- what is set apart ---------------------------------------------------------------------------------------
    def _set_apart(self, record: dict, chosen: dict | None, instead: str = "") -> None:
        """Tell the instructor, in collect's log and in a file, which submission was not collected and why."""
        student = shown(record["username"])
        if not instead and chosen is None:
            instead = f"no submission of {student}'s passed, so none is collected"
        elif not instead:
            later = "own submission" if chosen["timestamp"] < record["timestamp"] else "later submission"
            instead = f"{student}'s {later} of {chosen['timestamp']} is collected instead"
        folder = self._set_apart_folder()
        name = re.sub(r"[^\w.+-]", "_", record["filename"])[:200] + ".txt"
        text = (f"nbgrader collect set this submission of {self.coursedir.assignment_id} apart: it is not collected "
                f"and not graded.\n\nfolder: {shown(os.path.join(self.inbound_path, record['filename']))}\n"
                f"claims to be: {student}'s, of {record['timestamp']}\nwhy: {record['why']}\n{instead}\n")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
            where = f" ({folder / name})"
        except OSError as exc:
            where = f" (could not write {folder / name}: {exc.strerror})"
        self.log.warning("Set apart %s: %s; %s%s", shown(record["filename"]), record["why"], instead, where)

    def _set_apart_folder(self) -> Path:
        if self.set_apart_directory:
            base = Path(self.set_apart_directory)
        else:
            submitted = Path(self.coursedir.root) / self.coursedir.submitted_directory
            base = submitted.parent / "set_apart"
        return base / self.coursedir.assignment_id

    # -- copying -------------------------------------------------------------------------------------------------
    def copy_files(self):
        checked, self.check_owner = self.check_owner, False  # checked by uid in init_src: no name-based warning
        try:
            super().copy_files()
        finally:
            self.check_owner = checked

    def do_copy(self, src, dest, log=None):
        """Copy the chosen submission from descriptors opened without following links, checked again as they are
        read, into a staging folder that becomes ``dest`` by a rename; a submission changed since it was chosen
        is set apart and leaves no ``dest``."""
        filename = os.path.basename(src)
        record = next(r for r in self.src_records if r["filename"] == filename)
        dest = Path(dest)
        staging = dest.parent / f".collect-{uuid.uuid4().hex}"
        try:
            walk = self._walk(record, staging)
            self._date(record, staging, walk.changed_ns)
            staging.rename(dest)
        except Refused as why:
            record["why"] = str(why)
            self._set_apart(record, None, "it changed after it was checked, so nothing is collected for "
                                          f"{shown(record['username'])}: run collect again")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if not dest.is_dir():
            with contextlib.suppress(OSError):  # the student's folder nbgrader made for it, when it is empty
                dest.parent.rmdir()
        if self.coursedir.groupshared and dest.is_dir():  # as nbgrader's do_copy: the instructors' group writes
            for folder, _, files in os.walk(dest):
                os.chmod(folder, os.stat(folder).st_mode & 0o2777 | 0o2770)
                for name in files:
                    os.chmod(os.path.join(folder, name), os.stat(os.path.join(folder, name)).st_mode & 0o777 | 0o660)
