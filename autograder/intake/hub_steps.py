"""nbgrader's exchange steps that say what they did, one line each on success.

nbgrader's ``release_assignment``, ``collect`` and ``release_feedback`` log at INFO, which the course's config
keeps quiet (``Application.log_level = WARN``), so on success they printed nothing, and ``release_feedback`` of a
lesson whose feedback is held (:class:`~autograder.term.integrity.HoldWhileOpen`: it found no page) did nothing,
silently. These classes (``ExchangeFactory``'s, set by :func:`autograder.grading.pipeline.tools_config`) do nbgrader's
work
unchanged (collect's checks are :class:`~autograder.intake.exchange.CourseExchangeCollect`'s) and then print one line:

- ``released 01-masks to the exchange (…/outbound/01-masks): students can fetch it``;
- ``collected 01-masks: 3 submissions into .grading/submitted, 1 set apart (see …/set_apart/01-masks)``;
- ``released the feedback of 01-masks: 3 pages for 3 students …``, or, with none to release, why: held until a
  time (in the term's zone), or not graded yet.
"""

from __future__ import annotations

import glob
import os

from nbgrader.exchange.default import ExchangeReleaseAssignment, ExchangeReleaseFeedback

from autograder.intake.exchange import CourseExchangeCollect
from autograder.term import integrity
from autograder.term import schedule as term_module
from decoder_course.text import shown

__all__ = ["SayingCollect", "SayingReleaseAssignment", "SayingReleaseFeedback"]


def say(line: str) -> None:
    """One line for the instructor, on the terminal of nbgrader's command (formgrader shows it in its log)."""
    print(line, flush=True)


class SayingReleaseAssignment(ExchangeReleaseAssignment):
    """nbgrader's ``release_assignment``, then one line: what went where."""

    def start(self):
        result = super().start()
        say(f"released {self.coursedir.assignment_id} to the exchange ({self.dest_path}): students can fetch it "
            "(Assignments › Fetch)")
        return result


class SayingCollect(CourseExchangeCollect):
    """The course's collect, then one line: how many submissions came in, how many were set apart."""

    def start(self):
        self._collected, self._apart = 0, 0
        result = super().start()
        lesson = self.coursedir.assignment_id
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, "*", lesson)
        apart = f", {self._apart} set apart (see {self._set_apart_folder()})" if self._apart else ""
        say(f"collected {lesson}: {self._collected} submission{'s' if self._collected != 1 else ''} into "
            f"{os.path.dirname(os.path.dirname(submitted))}{apart}"
            + ("" if self._collected else " (nothing new since the last collect, or nothing submitted)"))
        return result

    def do_copy(self, src, dest, log=None):
        super().do_copy(src, dest, log)
        self._collected += os.path.isdir(dest)

    def _set_apart(self, record, chosen, instead=""):
        self._apart += 1
        super()._set_apart(record, chosen, instead)


class SayingReleaseFeedback(ExchangeReleaseFeedback):
    """nbgrader's ``release_feedback``, then one line: how many pages went out, or why none did."""

    def copy_files(self):
        pages = glob.glob(os.path.join(self.src_path, "*.html"))
        super().copy_files()
        lesson = self.coursedir.assignment_id
        students = {os.path.basename(os.path.dirname(os.path.dirname(page))) for page in pages}
        if pages:
            say(f"released the feedback of {lesson}: {len(pages)} page{'s' if len(pages) != 1 else ''} for "
                f"{len(students)} student{'s' if len(students) != 1 else ''} (students: Assignments › Fetch "
                "Feedback)")
            return
        term = term_module.from_config(self)
        until = integrity.feedback_held_until(term, lesson, term_module.now())
        if until is not None:
            say(f"released no feedback of {lesson}: it is held until {term_module.shown_time(until, term.zone)}, "
                "when every lesson its given cells come from has closed; grade it again after then "
                f"(./course grade … --lessons {lesson}), then release_feedback")
        else:
            say(f"released no feedback of {lesson}: there is none in {shown(self.src_path)}; grade it first "
                f"(./course grade … --lessons {lesson}, or nbgrader generate_feedback {lesson})")
