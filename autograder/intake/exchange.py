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
:func:`autograder.grading.pipeline.tools_config`). For each student it takes the latest submission (before the due date
with ``--before-duedate``, as nbgrader does; the student's own due date in the term, extension included, when
there is one) that passes, and sets apart every one that does not, with a warning in collect's log and a file in
``set_apart_directory`` naming the folder and why; the student's own earlier submission is collected instead. A
submission passes when its folder and every file and folder in it are owned by the unix account of the student
its name claims, no file has a second name (a hard link), nothing is a symbolic link, a FIFO,
a socket or a device, and nothing inside is writable by other accounts (nbgrader's submit writes files 0644 and
folders 0755: a student who opened theirs to a classmate did it by hand). Everything is opened without following
links, checked on the open descriptor and read from it, so what was checked is what is copied.

One submission never stops the class's collect: whatever a submission raises (a check, an error nobody expected)
sets that submission apart with a note, and the rest are collected. Names are bytes until proven text (an inbound
name or a file name that is not UTF-8 is set apart by its escaped bytes), notes are written with a replacing
encoder, and a time is read only in nbgrader's own format (:func:`autograder.term.schedule.parse_timestamp`: nbgrader's
``parse_utc`` would look a zone the student wrote up as a file). Listings are bounded while they are read, never
listed whole and then cut: a submission's folders stop at :data:`_MAX_ENTRIES` names, and the inbound folder
keeps per student the latest :data:`_MAX_OWN` entries the student's account owns and :data:`_MAX_NOTES` others
(forgeries, links, names that are no submission's), counting the rest in one note.

When was it submitted (the rule is :mod:`autograder.term.schedule`'s)? ``nbgrader submit`` writes the time into the
folder's name and ``timestamp.txt``, from the student's account: a student can write any time there. The exchange's
file system also records, in each entry's ``ctime``, the last change to it, and no account but root can set that
back. The collected ``timestamp.txt`` is the later of the two: nbgrader's time, unless something in the submission
(its folder, a file in it, ``timestamp.txt`` itself) changed more than :data:`SUBMIT_SLACK` after it, and then
the newest ``ctime`` (read from the descriptors the copy opens, and again after each file is read and each folder
listed: a submission that changed while it was copied is copied afresh, so the times date what the copy holds, and
set apart after :data:`_COPY_TRIES` copies that each changed). A submission can be made to look later, never
earlier. A ``chmod -R`` or ``chown -R`` over the exchange changes every ``ctime``: every submission it touched
then dates from it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import heapq
import itertools
import os
import pwd
import re
import shutil
import stat
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dateutil.tz import gettz
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.collect import ExchangeCollect
from traitlets import Dict, Unicode

from autograder.term import schedule as term_module
from autograder.term.late import naive_utc
from autograder.term.schedule import as_utc, parse_timestamp, timestamp_text
from decoder_course.text import shown

__all__ = ["CourseExchangeCollect", "Refused"]

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO swapped in never hangs
_MAX_ENTRIES = 10_000  # files and folders in one submission: a lesson has a handful
_MAX_DEPTH = 32
_MAX_OWN = 256  # a student's own submissions of one lesson examined, the latest by their names' times
_MAX_NOTES = 1_000  # submissions set apart with a note each in one collect; the rest are counted in one note
_COPY_TRIES = 3  # copies of a submission that changed while it was copied, before it is set apart
_CHUNK = 1 << 20
# How long after nbgrader's time an honest submit may still be changing its folder (copying the files, its chmod):
# a change later than this dates the submission instead
SUBMIT_SLACK = timedelta(seconds=60)


class Refused(Exception):
    """Why one submission in the exchange is not collected: a sentence for the instructor."""


class _Changed(Refused):
    """A submission changed while it was copied (a file's size or ``ctime`` after reading it, a folder's after
    listing it): the copy may hold the change, which the times read before it do not date."""


def _readable(name: bytes) -> str:
    """A name as text for a message, whatever its bytes (an undecodable one shows them as ``\\xff``)."""
    return shown(name.decode("utf-8", "backslashreplace"))


def _text_name(name: str, shown_path: str) -> None:
    """Raise :class:`Refused` unless a name read from the file system is UTF-8 text (Python reads other bytes as
    lone surrogates, which no message, note or log can write)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"{shown_path} has a name that is not UTF-8 text: rename it and submit again") from None


def _unexpected(exc: Exception) -> str:
    """Why a submission that raised something no check expected is set apart."""
    return (f"collect could not read it ({type(exc).__name__}: {shown(exc)}); the rest of the class is collected: "
            "look at this folder, and report the error if the submission looks ordinary")


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

    def listing(self, fd: int) -> list[str]:
        """The names in the folder ``fd``, counted as they are read: past :data:`_MAX_ENTRIES` in the whole
        submission the reading stops (a folder of 600,000 names is never held, nor sorted, and all the folders'
        lists together hold at most that many)."""
        names = []
        with os.scandir(fd) as listing:
            for entry in listing:
                self.entries += 1
                if self.entries > _MAX_ENTRIES:
                    raise Refused(f"the submission holds more than {_MAX_ENTRIES} files and folders")
                names.append(entry.name)
        return sorted(names)

    def folder(self, fd: int, shown_path: str, dest: Path | None, depth: int,
               opened: os.stat_result | None = None) -> None:
        if depth > _MAX_DEPTH:
            raise Refused(f"{shown_path} is nested more than {_MAX_DEPTH} folders deep")
        for name in self.listing(fd):
            path = f"{shown_path}/{shown(name)}" if shown_path else shown(name)
            _text_name(name, path)
            child, st = _open(fd, name, path, self.uid, self.expected, True)
            self.changed_ns = max(self.changed_ns, st.st_ctime_ns)
            try:
                excluded = any(fnmatch.fnmatch(name, pattern) for pattern in self.coursedir.ignore or ())
                target = None if dest is None or excluded else dest / name
                if stat.S_ISDIR(st.st_mode):
                    if target is not None:
                        target.mkdir(mode=0o700)
                    self.folder(child, path, target, depth + 1, st)
                    if target is not None:
                        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755)
                else:
                    self.file(child, st, path, name, target)
            finally:
                os.close(child)
        if dest is not None and opened is not None:
            self.unchanged(fd, opened, shown_path or "its folder")

    @staticmethod
    def unchanged(fd: int, before: os.stat_result, shown_path: str) -> None:
        """Raise :class:`_Changed` when ``fd`` changed (size, ``mtime`` or ``ctime``) since ``before`` was read."""
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (before.st_size, before.st_mtime_ns,
                                                                     before.st_ctime_ns):
            raise _Changed(f"{shown_path} changed while it was being collected")

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
                    raise _Changed(f"{shown_path} grew while it was being collected")
                out.write(chunk)
        self.unchanged(fd, st, shown_path)  # an edit while it was read: the copy may hold it
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
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.notes_left = _MAX_NOTES
        self.src_records = []
        for _, records in sorted(self._inbound_records().items()):
            chosen = None
            for record in self._in_order([r for r in records if "why" not in r]):
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

    def _inbound_records(self) -> dict[str, list[dict]]:
        """The lesson's entries of the inbound folder, by the student id their names claim, read as bytes and
        bounded while they are read: per student the latest :data:`_MAX_OWN` entries that student's account owns,
        and :data:`_MAX_NOTES` others in all (forgeries, links, names that are no submission's: each set apart
        with its reason); what is past a bound is counted, in the log and one note.

        A name must be UTF-8 text and hold a time in nbgrader's own format
        (:func:`autograder.term.schedule.parse_timestamp`:
        no zone is looked up by what a student wrote); one that does not is a record with its reason (``why``)."""
        zone = gettz(self.timezone)  # the instructor's config: nbgrader's own submit writes its names in this zone
        lesson = os.fsencode(self.coursedir.assignment_id)
        wanted = os.fsencode(self.coursedir.student_id or "*")  # a pattern, as in nbgrader's collect
        own: dict[str, list] = {}  # student id -> a heap of (time, n, record): the latest _MAX_OWN
        others: dict[str, list[dict]] = {}
        order, dropped, kept_others = itertools.count(), 0, 0
        with os.scandir(os.fsencode(self.inbound_path)) as listing:
            for entry in listing:
                parts = entry.name.rsplit(b"+", 3)
                if len(parts) < 3 or parts[1] != lesson or entry.name.startswith(b".") \
                        or not fnmatch.fnmatchcase(parts[0], wanted):
                    continue  # another lesson's, as nbgrader's own pattern leaves it
                record = self._record(entry.name, parts, zone)
                if "why" not in record and self._owned(entry, record["username"]):
                    heap = own.setdefault(record["username"], [])
                    item = (record["timestamp"], next(order), record)
                    if len(heap) < _MAX_OWN:
                        heapq.heappush(heap, item)
                    else:
                        heapq.heappushpop(heap, item)
                        dropped += 1
                elif kept_others < _MAX_NOTES:
                    others.setdefault(record["username"], []).append(record)
                    kept_others += 1
                else:
                    dropped += 1
        if dropped:
            self._over_bounds(dropped)
        records = {student: [item[-1] for item in heap] for student, heap in own.items()}
        for student, refused in others.items():
            records.setdefault(student, []).extend(refused)
        return records

    def _record(self, filename: bytes, parts: list[bytes], zone) -> dict:
        """The student id and time a folder's name claims; with ``why`` when it is not a submission's name."""
        username = parts[0].decode("utf-8", "backslashreplace")
        record = {"username": username, "filename": _readable(filename), "timestamp": None}
        try:
            record["filename"] = filename.decode("utf-8")
        except UnicodeDecodeError:
            record["why"] = "its name is not UTF-8 text (nbgrader's submit writes a student id, the lesson and a time)"
            return record
        try:
            record["timestamp"] = parse_timestamp(parts[2].decode(), zone).replace(tzinfo=None)  # as nbgrader's
        except ValueError as exc:
            record["why"] = (f"it is not a submission's name ({{student_id}}+{self.coursedir.assignment_id}+"
                             f"{{time}}): {shown(exc)}")
        return record

    def _owned(self, entry: os.DirEntry, student_id: str) -> bool:
        """Whether the inbound entry is owned by the account of the student its name claims (no link followed):
        the cheap first look that keeps forgeries out of that student's own bounded share."""
        try:
            uid, _ = self._expected(student_id)
            return uid is None or entry.stat(follow_symlinks=False).st_uid == uid
        except (Refused, OSError):
            return False

    def _over_bounds(self, dropped: int) -> None:
        text = (f"{dropped} entries of {self.coursedir.assignment_id} in {self.inbound_path} were not examined: "
                f"past {_MAX_OWN} of one student's own submissions (the latest are examined) or {_MAX_NOTES} "
                "others (forgeries, links, names that are no submission's). Remove what is not a student's "
                "submission from the inbound folder and collect again.")
        self.log.warning("%s", text)
        self._note("_more_entries.txt", text + "\n")

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
        """Why ``record``'s folder may not be collected, or ``None``: a check of everything in it, nothing copied.
        Whatever one submission raises costs that submission only."""
        try:
            self._walk(record, None)
        except Refused as why:
            return str(why)
        except Exception as exc:  # noqa: BLE001 - one student's submission never stops the class's collect
            return _unexpected(exc)
        return None

    def _expected(self, student_id: str) -> tuple[int | None, str]:
        """The uid that must own a submission of ``student_id`` (``None``: not checked), and how to name it."""
        if not re.fullmatch(r"[^/\s]+", student_id) or student_id in (".", "..") or shown(student_id) != student_id:
            raise Refused(f"'{shown(student_id)}' is not a student id")
        user = self.unix_user(student_id)
        if not self.check_owner:
            return None, user
        uids = self.__dict__.setdefault("_uids", {})  # this collect's lookups: an inbound of forged names is read once
        if user not in uids:
            try:
                uid = pwd.getpwnam(user).pw_uid
            except (KeyError, ValueError):  # ValueError: a name pwd cannot take
                uid = None
            if len(uids) < 4096:
                uids[user] = uid
        else:
            uid = uids[user]
        if uid is None:
            raise Refused(f"there is no unix account {shown(user)!r} for student {student_id}: set "
                          "CourseExchangeCollect.unix_user_template or unix_users in nbgrader_config.py")
        return uid, f"{student_id}'s account {user}"

    def _walk(self, record: dict, dest: Path | None) -> _Walk:
        """Check the whole folder of ``record`` (and copy it into ``dest``, which must not exist)."""
        if "owner" not in record:  # the copy checks by the account its check found (copy_files turns check_owner off)
            record["owner"] = self._expected(record["username"])
        uid, expected = record["owner"]
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
            walk.folder(top, "", dest, 0, st)
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
            with open(path, "rb") as handle:  # nbgrader's format only: no zone looked up by the student's text
                claimed = parse_timestamp(handle.read(65).decode("utf-8"), gettz(self.timezone))
        except (OSError, ValueError):  # none, a folder, not UTF-8, not a time as nbgrader writes it: the name's
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
        """Tell the instructor, in collect's log and in a file, which submission was not collected and why (past
        :data:`_MAX_NOTES` notes in one collect, in the log only)."""
        student = shown(record["username"])
        claimed = "no time" if record["timestamp"] is None else record["timestamp"]
        if not instead and chosen is None:
            instead = f"no submission of {student}'s passed, so none is collected"
        elif not instead:
            later = ("own submission" if record["timestamp"] is None or chosen["timestamp"] < record["timestamp"]
                     else "later submission")
            instead = f"{student}'s {later} of {chosen['timestamp']} is collected instead"
        name = re.sub(r"[^\w.+-]", "_", record["filename"]).encode()[:200].decode(errors="ignore") + ".txt"  # bytes
        text = (f"nbgrader collect set this submission of {self.coursedir.assignment_id} apart: it is not collected "
                f"and not graded.\n\nfolder: {shown(os.path.join(self.inbound_path, record['filename']))}\n"
                f"claims to be: {student}'s, of {claimed}\nwhy: {record['why']}\n{instead}\n")
        self.notes_left = getattr(self, "notes_left", _MAX_NOTES) - 1
        where = self._note(name, text) if self.notes_left >= 0 else " (no note: too many in this collect)"
        self.log.warning("Set apart %s: %s; %s%s", shown(record["filename"]), record["why"], instead, where)

    def _note(self, name: str, text: str) -> str:
        """Write ``text`` into the set-apart folder as ``name``, every character encodable (a replacing encoder:
        nothing a student named can make the note fail); where it went, for the log."""
        folder = self._set_apart_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / name, "w", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(text)
            return f" ({folder / name})"
        except OSError as exc:
            return f" (could not write {folder / name}: {exc.strerror})"

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
        read, into a staging folder that becomes ``dest`` by a rename. One that changed while it was copied is
        copied afresh (at most :data:`_COPY_TRIES` times), so that its date is that of what the copy holds; one that
        fails a check since it was chosen, or raises anything, is set apart and leaves no ``dest``."""
        filename = os.path.basename(src)
        record = next(r for r in self.src_records if r["filename"] == filename)
        dest = Path(dest)
        again = f"so nothing is collected for {shown(record['username'])}: run collect again"
        for _ in range(_COPY_TRIES):
            staging = dest.parent / f".collect-{uuid.uuid4().hex}"
            try:
                walk = self._walk(record, staging)
                self._date(record, staging, walk.changed_ns)  # the newest ctime, read after every file's copy
                staging.rename(dest)
                break
            except _Changed as why:  # copied afresh: the next copy's times date what it holds
                record["why"] = f"{why}, {_COPY_TRIES} copies in a row"
                self.log.info("%s: %s; copying it again", shown(filename), why)
            except Refused as why:
                record["why"] = str(why)
                self._set_apart(record, None, f"it changed after it was checked, {again}")
                break
            except Exception as exc:  # noqa: BLE001 - one student's submission never stops the class's collect
                record["why"] = _unexpected(exc)
                self._set_apart(record, None, again)
                break
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        else:
            self._set_apart(record, None, f"it kept changing while it was copied, {again} once the student has "
                                          "finished")
        if not dest.is_dir():
            with contextlib.suppress(OSError):  # the student's folder nbgrader made for it, when it is empty
                dest.parent.rmdir()
        if self.coursedir.groupshared and dest.is_dir():  # as nbgrader's do_copy: the instructors' group writes
            for folder, _, files in os.walk(dest):
                os.chmod(folder, os.stat(folder).st_mode & 0o2777 | 0o2770)
                for name in files:
                    os.chmod(os.path.join(folder, name), os.stat(os.path.join(folder, name)).st_mode & 0o777 | 0o660)
