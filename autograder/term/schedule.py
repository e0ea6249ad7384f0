"""The term: when each lesson is released and due, what lateness costs, who has an extension.

A term is one TOML file (``term.toml`` at the checkout's root, or the file ``$DECODER_COURSE_TERM`` or ``--term``
names; ``term.example.toml`` is a whole one)::

    timezone = "Europe/Berlin"     # dates without an offset are in this zone (an IANA name; default UTC)

    [late]
    grace_minutes = 10             # this close after the due date is on time (a slow upload, a clock)
    percent_per_day = 10           # each day late, or part of one, costs this % of the notebook's raw score
    max_percent = 50               # a late penalty never takes more than this %
    cutoff_days = 7                # later than this after the due date (extension included) scores zero

    [lessons]
    "01-masks" = { release = 2027-01-11T09:00:00, due = 2027-01-18T23:59:00 }
    "02-attention" = { release = 2027-01-18T09:00:00, due = 2027-01-25T23:59:00 }

    [extensions]                   # student id -> lesson -> days more, or a new due date
    alice = { "02-attention" = 3 }
    bob = { "01-masks" = 2027-01-21T12:00:00 }

"Zero after the due date" is ``percent_per_day = 0`` with ``cutoff_days = 0``; no penalty but a cutoff is
``percent_per_day = 0`` with the cutoff wanted.

Three moments per lesson follow from it:

- **due** (per student): the lesson's due date, or the student's extended one;
- **late**: a submission later than its due date plus the grace; it loses ``percent_per_day`` of its raw score per
  day or part of one, at most ``max_percent``, and all of it past ``cutoff_days``
  (:meth:`LatePolicy.penalty`);
- **closes**: the latest due date of any student plus the grace and the cutoff (:meth:`Term.closes`): after it no
  submission can earn a point, so the lesson's graded answers may be handed out. Until then a release must not
  hold them (:mod:`autograder.term.integrity`).

When was a notebook submitted (:mod:`autograder.intake.submissions`, :mod:`autograder.intake.exchange`)? The rule:

1. through nbgrader's exchange: the later of the time ``nbgrader submit`` wrote (``timestamp.txt``, the student's
   account wrote it) and the last change the exchange's file system saw in that submission (the newest ``ctime``
   of its folder and files, which no student can set back), unless that change is within
   :data:`~autograder.intake.exchange.SUBMIT_SLACK` (a minute: an honest submit still writing its folder) of nbgrader's
   time: a submission can be made to look later, never earlier. ``nbgrader collect`` writes it into the collected
   ``timestamp.txt``;
2. a folder of nbgrader's layout (``student/lesson/notebook.ipynb``): the well-formed ``timestamp.txt`` beside the
   notebook when there (``nbgrader collect`` wrote it by rule 1), else the notebook file's modification time (copy
   submissions with ``cp -p`` or ``rsync -t``);
3. a flat file or an LMS export: the file's modification time; in a zip, the entry's date and time, which a zip
   stores without a zone and which this reads in the term's timezone. A ``timestamp.txt`` in an LMS export (or
   beside a flat file) is the student's own upload and is never read. Where the LMS records the time itself
   (Gradescope's ``:created_at`` in ``submission_metadata.yml``), that time dates the submission instead.

Whatever the rule gives is written into ``submitted/<student>/<lesson>/timestamp.txt``, which nbgrader's
``autograde`` reads into the gradebook; its late-penalty step (:mod:`autograder.term.late`) compares it with the
student's due date there.

Without a term there are no due dates: nothing is late, and a release holds every earlier lesson's answers (the
self-study edition, which says it is not for graded use).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from autograder.course import lessons as lessons_registry

__all__ = ["ENV_VAR", "LatePolicy", "Term", "TermError", "as_utc", "configured", "from_config", "load", "now", "path",
           "parse_timestamp", "shown_span", "shown_time", "timestamp_text"]

ROOT = lessons_registry.ROOT
ENV_VAR = "DECODER_COURSE_TERM"
DEFAULT = ROOT / "term.toml"
MAX_BYTES = 1 << 20  # a term file is a few kB


class TermError(ValueError):
    """A term file that cannot be used; the message names the file, the key and what to write instead."""


def now() -> datetime:
    """The time now, aware, in UTC."""
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, aware; a naive one is taken to be in UTC already (nbgrader's gradebook keeps those)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def shown_time(moment: datetime | None, zone: tzinfo | None = None) -> str:
    """How a time is written for people (reports, messages, feedback): in the term's ``zone`` with UTC beside it,
    ``2027-01-25 23:59 CET (22:59 UTC)``, or ``2027-01-25 22:59 UTC`` when the zone is UTC or not given."""
    if moment is None:
        return "never"
    utc = as_utc(moment)
    if zone is None or str(zone) in ("UTC", "Etc/UTC"):
        return utc.strftime("%Y-%m-%d %H:%M UTC")
    local = utc.astimezone(zone)
    return f"{local.strftime('%Y-%m-%d %H:%M')} {local.tzname()} ({utc.strftime('%H:%M')} UTC)"


def timestamp_text(moment: datetime) -> str:
    """``moment`` as nbgrader writes ``timestamp.txt`` (``2027-01-25 22:59:00.000000 UTC``), which ``autograde``
    reads into the gradebook."""
    return as_utc(moment).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


# nbgrader's timestamp (Exchange.timestamp_format "%Y-%m-%d %H:%M:%S.%f %Z"): a date, a time, up to six digits of a
# second, and a zone: a name of letters (what %Z writes) or a numeric offset
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?"
                        r"(?: ?([A-Za-z]{1,6}|[+-]\d{2}:?\d{2}))?")


def parse_timestamp(text: str, zone: tzinfo | None = None) -> datetime:
    """A time as nbgrader's exchange writes it (``2027-01-25 22:59:00.123456 UTC``), aware, in UTC; a
    ``ValueError`` saying what is wrong for anything else.

    The student's account writes this text (a submission's folder name, its ``timestamp.txt``). nbgrader's own
    ``parse_utc`` hands a zone it finds there to dateutil's ``gettz``, which reads a file by that name (``..``
    raises, a path reads any file as a zone), and then guesses at the rest. Here the zone must be UTC (``UTC``,
    ``GMT``, ``Z``, none), a numeric offset (``+0100``), or the abbreviation the instructor's configured ``zone``
    (``Exchange.timezone``) has at that time: nothing is looked up by the student's text."""
    match = _TIMESTAMP.fullmatch(text.strip()) if len(text) <= 64 else None
    if match is None:
        raise ValueError("not a time as nbgrader writes it (2027-01-25 22:59:00.000000 UTC)")
    *fields, fraction, named = match.groups()
    moment = datetime(*map(int, fields), int((fraction or "0").ljust(6, "0")))  # ValueError: month 13
    try:
        if named is None or named.upper() in ("UTC", "GMT", "Z"):
            return moment.replace(tzinfo=UTC)
        if named[0] in "+-":
            hours, minutes = int(named[1:3]), int(named[-2:])
            if hours > 23 or minutes > 59:
                raise ValueError(f"{named} is not a time zone offset")
            offset = timedelta(hours=hours, minutes=minutes) * (-1 if named[0] == "-" else 1)
            return (moment - offset).replace(tzinfo=UTC)
        if zone is not None and moment.replace(tzinfo=zone).tzname() == named:
            return moment.replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:
        raise ValueError("a time out of the calendar's range") from None
    raise ValueError(f"the time zone {named!r} is neither UTC, an offset such as +0100, nor the exchange's own zone")


def shown_span(seconds: float) -> str:
    """How late a notebook is, for people, never more than it was: ``47 s``, ``11 min 19 s`` under an hour (to the
    second: a minute can decide the grace), ``5 h 20 min``, ``3 days 4 h 2 min`` (whole minutes, cut, not
    rounded up)."""
    whole = int(max(0.0, seconds))
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return " ".join(part for part in (f"{minutes} min" if minutes else "", f"{rest} s" if rest or not minutes
                                          else "") if part)
    minutes = whole // 60
    days, hours, minutes = minutes // 1440, minutes % 1440 // 60, minutes % 60
    parts = [f"{days} day{'s' if days != 1 else ''}" if days else "", f"{hours} h" if hours else "",
             f"{minutes} min" if minutes else ""]
    return " ".join(part for part in parts if part)


@dataclass(frozen=True)
class LatePolicy:
    """What lateness costs (see the module doc)."""

    grace: timedelta = timedelta(0)
    percent_per_day: float = 0.0
    max_percent: float = 100.0
    cutoff: timedelta = timedelta(0)

    def percent(self, seconds_late: float) -> float:
        """The percentage of the raw score lost by a notebook ``seconds_late`` after its due date."""
        if seconds_late <= self.grace.total_seconds():
            return 0.0
        if seconds_late > (self.grace + self.cutoff).total_seconds():
            return 100.0
        days = math.ceil(seconds_late / 86400)  # each day or part of one
        return min(self.max_percent, self.percent_per_day * days)

    def penalty(self, raw_score: float, seconds_late: float) -> float:
        """Points taken from ``raw_score`` by the policy; never more than the score, never less than 0."""
        return max(0.0, min(raw_score, raw_score * self.percent(seconds_late) / 100))

    def describe(self) -> str:
        """The policy in one sentence, for feedback and reports."""
        grace = f" after a grace of {_duration(self.grace)}" if self.grace else ""
        cutoff = f"{_duration(self.cutoff)} after the due date"
        if self.percent_per_day <= 0:
            if not self.cutoff:
                return f"a notebook submitted after its due date{grace} scores zero"
            return f"late work loses nothing until {cutoff}{grace}, then scores zero"
        return (f"late work loses {self.percent_per_day:g}% of its score per day or part of one{grace}, at most "
                f"{self.max_percent:g}%, and scores zero from {cutoff}")


def _duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 86400 == 0:
        days = seconds // 86400
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min"


@dataclass(frozen=True)
class Dates:
    release: datetime
    due: datetime


@dataclass(frozen=True)
class Term:
    """A term file, read and checked (:func:`load`). Every time is aware, in UTC."""

    lessons: dict[str, Dates]
    late: LatePolicy = field(default_factory=LatePolicy)
    extensions: dict[str, dict[str, datetime]] = field(default_factory=dict)  # student -> lesson -> due date
    path: Path | None = None
    zone: tzinfo = UTC  # the term's timezone: dates without an offset, and a zip's entry times

    def scheduled(self, lesson: str) -> bool:
        return lesson in self.lessons

    def due(self, lesson: str, student: str | None = None) -> datetime | None:
        """The due date of ``lesson`` for ``student`` (their extension, if any); None for a lesson not in the term."""
        if lesson not in self.lessons:
            return None
        extended = self.extensions.get(student, {}).get(lesson) if student else None
        return max(extended, self.lessons[lesson].due) if extended else self.lessons[lesson].due

    def extension(self, lesson: str, student: str) -> timedelta | None:
        """How much later ``student``'s due date is than the lesson's (nbgrader keeps extensions this way)."""
        if lesson not in self.lessons or lesson not in self.extensions.get(student, {}):
            return None
        return self.due(lesson, student) - self.lessons[lesson].due

    def release(self, lesson: str) -> datetime | None:
        return self.lessons[lesson].release if lesson in self.lessons else None

    def closes(self, lesson: str) -> datetime | None:
        """When the last submission of ``lesson`` that could earn a point is past: the latest due date (extensions
        included), the grace and the cutoff after. None for a lesson not in the term: it is not graded this term,
        so nothing of it is withheld (:mod:`autograder.term.integrity`)."""
        if lesson not in self.lessons:
            return None
        latest = max([self.lessons[lesson].due] + [by_lesson[lesson] for by_lesson in self.extensions.values()
                                                   if lesson in by_lesson])
        return latest + self.late.grace + self.late.cutoff

    def is_closed(self, lesson: str, at: datetime) -> bool:
        closes = self.closes(lesson)
        return closes is not None and as_utc(at) >= closes

    def released_by(self, at: datetime) -> list[str]:
        """The lessons whose release date is not after ``at``, in order."""
        return [lesson for lesson in lessons_registry.ids()
                if lesson in self.lessons and self.lessons[lesson].release <= as_utc(at)]

    def seconds_late(self, lesson: str, student: str, submitted: datetime) -> float:
        """How long after ``student``'s due date ``submitted`` is (0 when on time or not scheduled)."""
        due = self.due(lesson, student)
        return 0.0 if due is None else max(0.0, (as_utc(submitted) - due).total_seconds())


def path(explicit: Path | str | None = None) -> Path | None:
    """The term file in use: ``explicit``, else ``$DECODER_COURSE_TERM``, else ``term.toml`` at the root when
    there; None when there is none (no due dates). ``explicit=""`` says there is none, whatever the default."""
    if explicit is not None and not str(explicit):
        return None
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return DEFAULT if DEFAULT.is_file() else None


def configured(explicit: Path | str | None = None) -> Term | None:
    """The term in use (:func:`path`), read; None when there is none. A named file that is missing is an error."""
    where = path(explicit)
    return None if where is None else load(where)


def load(where: Path | str) -> Term:
    """Read and check a term file; a :class:`TermError` naming the key and what to write for anything wrong."""
    where = Path(where)
    try:
        with open(where, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise TermError(f"cannot read the term file {where}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise TermError(f"{where} is over {MAX_BYTES >> 10} kB: is it the term file?")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TermError(f"{where} is not valid TOML: {exc} (dates are written 2027-01-18T23:59:00)") from None
    return parse(data, where)


def parse(data: dict, where: Path | str = "<term>") -> Term:
    """A :class:`Term` from the TOML's tables (:func:`load` reads the file)."""
    unknown = set(data) - {"timezone", "late", "lessons", "extensions"}
    if unknown:
        raise TermError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}: a term has timezone, [late], "
                        "[lessons] and [extensions]")
    zone_name = data.get("timezone", "UTC")
    try:
        zone = ZoneInfo(zone_name) if isinstance(zone_name, str) else None
    except (ZoneInfoNotFoundError, ValueError):
        zone = None
    if zone is None:
        raise TermError(f"{where}: timezone {zone_name!r} is not a time zone: write an IANA name such as "
                        "'Europe/Berlin' or 'UTC'")

    def moment(value, key: str) -> datetime:
        if isinstance(value, datetime):
            return (value.replace(tzinfo=zone) if value.tzinfo is None else value).astimezone(UTC)
        if isinstance(value, date):  # a day alone: its end, in the term's zone
            return datetime.combine(value, time(23, 59, 59), zone).astimezone(UTC)
        raise TermError(f"{where}: {key} = {value!r} is not a date: write it as 2027-01-18T23:59:00")

    def number(table: dict, key: str, default: float | None, low: float = 0.0, high: float | None = None) -> float:
        value = table.get(key, default)
        if value is None:
            raise TermError(f"{where}: [late] {key} is missing: " + MISSING[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
                (high is not None and value > high):
            bounds = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
            raise TermError(f"{where}: [late] {key} = {value!r}: write a number {bounds}")
        return float(value)

    late = data.get("late", {})
    if not isinstance(late, dict):
        raise TermError(f"{where}: late must be a table [late]")
    unknown = set(late) - set(MISSING)
    if unknown:
        raise TermError(f"{where}: unknown key(s) in [late]: {', '.join(sorted(unknown))} (known: "
                        f"{', '.join(MISSING)})")
    policy = LatePolicy(grace=timedelta(minutes=number(late, "grace_minutes", 0.0)),
                        percent_per_day=number(late, "percent_per_day", None, high=100.0),
                        max_percent=number(late, "max_percent", 100.0, high=100.0),
                        cutoff=timedelta(days=number(late, "cutoff_days", None)))

    lessons_table = data.get("lessons", {})
    if not isinstance(lessons_table, dict) or not lessons_table:
        raise TermError(f"{where}: no [lessons]: give each lesson's dates, "
                        '"01-masks" = { release = 2027-01-11T09:00:00, due = 2027-01-18T23:59:00 }')
    known = lessons_registry.ids()
    dates = {}
    for lesson, entry in lessons_table.items():
        if lesson not in known:
            raise TermError(f"{where}: [lessons] {lesson!r} is not a lesson of this course (known: "
                            f"{', '.join(known)})")
        if not isinstance(entry, dict) or set(entry) - {"release", "due"} or "due" not in entry:
            raise TermError(f"{where}: [lessons] {lesson} needs due (and release): "
                            f'"{lesson}" = {{ release = 2027-01-11T09:00:00, due = 2027-01-18T23:59:00 }}')
        due = moment(entry["due"], f"[lessons] {lesson}.due")
        release = moment(entry["release"], f"[lessons] {lesson}.release") if "release" in entry else due
        if release > due:
            raise TermError(f"{where}: [lessons] {lesson} is released ({shown_time(release, zone)}) after it is due "
                            f"({shown_time(due, zone)})")
        dates[lesson] = Dates(release, due)

    extensions: dict[str, dict[str, datetime]] = {}
    table = data.get("extensions", {})
    if not isinstance(table, dict):
        raise TermError(f"{where}: extensions must be a table [extensions]")
    for student, by_lesson in table.items():
        if not isinstance(by_lesson, dict):
            raise TermError(f"{where}: [extensions] {student} = {by_lesson!r}: write "
                            f'{student} = {{ "01-masks" = 3 }} (days more) or a new due date')
        for lesson, value in by_lesson.items():
            if lesson not in dates:
                raise TermError(f"{where}: [extensions] {student}: {lesson!r} is not a lesson of this term")
            key = f"[extensions] {student}.{lesson}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if value <= 0:
                    raise TermError(f"{where}: {key} = {value}: an extension is a positive number of days")
                extended = dates[lesson].due + timedelta(days=float(value))
            else:
                extended = moment(value, key)
                if extended <= dates[lesson].due:
                    raise TermError(f"{where}: {key} ({shown_time(extended, zone)}) is not after the lesson's due "
                                    f"date ({shown_time(dates[lesson].due, zone)})")
            extensions.setdefault(student, {})[lesson] = extended
    return Term(lessons=dates, late=policy, extensions=extensions, path=Path(where) if where else None, zone=zone)


MISSING = {
    "grace_minutes": "minutes after a due date that still count as on time (0 for none)",
    "percent_per_day": "the percentage of a notebook's raw score each day late costs (0: none, only the cutoff)",
    "max_percent": "the most a late penalty may take, in percent (default 100)",
    "cutoff_days": "how many days after a due date late work is still graded (0: none is)",
}


def from_config(parent) -> Term | None:
    """The term of an nbgrader configuration, for the preprocessors and plugins that nbgrader builds:
    ``c.TermFile.file`` (set by :func:`autograder.grading.pipeline.nbgrader_config`); unset: :func:`path`'s default;
    ``""``: no term (the canary's tree, a worker told there is none)."""
    from traitlets import Unicode
    from traitlets.config import Configurable

    class TermFile(Configurable):
        file = Unicode(None, allow_none=True,
                       help="The term file (autograder/term/schedule.py); unset: $DECODER_COURSE_TERM or term.toml "
                            "at the "
                            "checkout's root when there; empty: no term").tag(config=True)

    return configured(TermFile(parent=parent).file)
