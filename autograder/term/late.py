"""Late penalties through nbgrader's own machinery, from the term (:mod:`autograder.term.schedule`).

nbgrader keeps what decides lateness in its gradebook: each assignment's ``duedate``, each submission's
``timestamp`` (read from ``submitted/<student>/<lesson>/timestamp.txt`` by ``autograde``) and ``extension``; its
``AssignLatePenalties`` preprocessor asks a ``LateSubmissionPlugin`` for the penalty of each notebook from the
seconds late (extension included) and stores it as ``SubmittedNotebook.late_submission_penalty``, which formgrader,
``nbgrader export`` and the feedback's ``GetGrades`` subtract from the raw score. The course fills those from the
term, so that ``./course grade``, formgrader and the gradebook agree:

- :func:`sync_gradebook` writes the term's due date into the assignment and the student's extension into the
  submission (or none: an extension taken out of the term is taken out of the gradebook);
- :class:`TermLatePenalties` (in place of ``AssignLatePenalties`` in ``Autograde.autograde_preprocessors``, see
  :func:`autograder.grading.pipeline.nbgrader_config`) syncs, then does nbgrader's work with :class:`TermLatePolicy`;
- :class:`TermLatePolicy` is the term's :class:`~autograder.term.schedule.LatePolicy` as nbgrader's plugin.

Without a term nothing is synced and no penalty is given.
"""

from __future__ import annotations

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import LateSubmissionPlugin
from nbgrader.preprocessors import AssignLatePenalties
from traitlets import Type

from autograder.term import schedule as term_module
from autograder.term.schedule import Term

__all__ = ["TermLatePenalties", "TermLatePolicy", "naive_utc", "sync_gradebook"]


def naive_utc(moment):
    """``moment`` as nbgrader's gradebook keeps times: naive, in UTC (None stays None)."""
    return None if moment is None else term_module.as_utc(moment).replace(tzinfo=None)


def sync_gradebook(gb: Gradebook, term: Term | None, lesson: str, student: str | None = None) -> None:
    """Write the term's due date of ``lesson`` into the gradebook's assignment, and ``student``'s extension (or
    none) into their submission when it exists. Without a term, or for a lesson not in it, nothing is written:
    a due date set by hand in formgrader stays. Committed here (nbgrader's ``Gradebook`` does not on closing)."""
    if term is None or not term.scheduled(lesson):
        return
    assignment = gb.find_assignment(lesson)
    due = naive_utc(term.due(lesson))
    if assignment.duedate != due:
        assignment.duedate = due
    if student is not None:
        try:
            submission = gb.find_submission(lesson, student)
        except MissingEntry:
            submission = None
        extension = term.extension(lesson, student)
        if submission is not None and submission.extension != extension:
            submission.extension = extension
    gb.db.commit()


class TermLatePolicy(LateSubmissionPlugin):
    """nbgrader's late-submission plugin with the term's policy: the penalty of a notebook ``total_seconds_late``
    after the student's due date (nbgrader counts from the due date with the extension). None (no penalty)
    without a term."""

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float | None:
        term = term_module.from_config(self)
        if term is None or total_seconds_late <= 0:
            return None
        return term.late.penalty(float(score or 0), float(total_seconds_late))


class TermLatePenalties(AssignLatePenalties):
    """nbgrader's ``AssignLatePenalties`` after syncing the gradebook from the term (:func:`sync_gradebook`):
    the assignment's due date and this student's extension, so that what nbgrader computes (and formgrader
    shows) follows the term even when the gradebook was made before it, or by nbgrader's own tools."""

    plugin_class = Type(TermLatePolicy, klass=LateSubmissionPlugin,
                        help="The plugin that gives each late notebook its penalty (the term's policy)."
                        ).tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        term = term_module.from_config(self)
        with Gradebook(info["db_url"]) as gb:
            sync_gradebook(gb, term, info["assignment"], info["student"])
        return super().preprocess(nb, resources)
