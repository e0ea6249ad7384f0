"""nbgrader's views of the gradebook as the course gives them: formgrader's pages with the final score (the late
penalty taken), and ``nbgrader export`` with each student's own due date.

nbgrader keeps a late notebook's penalty beside its raw score (``SubmittedNotebook.late_submission_penalty``,
:mod:`autograder.term.late`); its export and the feedback's ``GetGrades`` subtract it, but formgrader's API hands its
pages the raw ``score`` (Manage Submissions, Manual Grading, a student's pages, Manage Students' totals), so a late
student showed 2/4 where grades.csv and ``nbgrader export`` said 1.8/4. :class:`FinalScoreAPI` is nbgrader's API
with each ``score`` the final one and the raw score and penalty beside it (``raw_score``, ``late_penalty``):

- every page's *Score* column is the final score; the detail pages keep nbgrader's *Code Score* (the raw score
  the tests gave), so the two side by side show the penalty;
- Manage Submissions' *Timestamp* of a late submission says so: ``… (late: 2 − 0.2 = 1.8)``;
- Manage Assignments' and Manual Grading's averages are of the final scores (nbgrader's raw one kept beside, as
  ``raw_average_score``);
- a student with no name in the gradebook is shown by their id, not "None, None";
- with a term, the assignments are the term's lessons (not every lesson of the course, the rest as drafts).

:func:`install` makes formgrader build this API (``autograder.grading.pipeline.tools_config``, for the repository's
``nbgrader_config.py``); formgrader has no setting for its API class.

The export (``nbgrader export``) is :class:`autograder.judge.preprocessors.SafeCsvExport`: every cell through the
course's CSV writer, and each student's own due date, extension included.
"""

from __future__ import annotations

from nbgrader.api import MissingEntry
from nbgrader.apps import NbGraderAPI

from autograder.term import schedule as term_module

__all__ = ["FinalScoreAPI", "install"]


def _final(entry: dict, penalty: float) -> dict:
    """``entry`` (one of nbgrader's API dicts) with its final score, and its raw score and penalty beside it; an
    entry already made final (nbgrader's methods call one another) stays as it is."""
    if "raw_score" in entry:
        return entry
    raw = float(entry.get("score") or 0.0)
    entry.update(raw_score=raw, late_penalty=penalty, score=max(0.0, raw - penalty))
    return entry


def _named(entry: dict, student_key: str) -> dict:
    """A student with no name in the gradebook is shown by their id (formgrader writes a missing name "None")."""
    if entry.get("last_name") is None and entry.get("first_name") is None and entry.get(student_key):
        entry.update(last_name=entry[student_key], first_name="")
    return entry


class FinalScoreAPI(NbGraderAPI):
    """nbgrader's formgrader API with final scores (see the module doc)."""

    def _penalties(self, assignment_id: str | None = None, student_id: str | None = None) -> dict:
        """{(assignment, student): penalty} and {(assignment, student, notebook): penalty} in one dict, of the
        submissions of ``assignment_id`` (or of ``student_id``)."""
        found: dict = {}
        with self.gradebook as gb:
            try:
                submissions = (gb.find_assignment(assignment_id).submissions if assignment_id else
                               gb.find_student(student_id).submissions)
            except MissingEntry:
                return found
            for submission in submissions:
                key = (submission.assignment.name, submission.student.id)
                found[key] = float(submission.late_submission_penalty or 0.0)
                for notebook in submission.notebooks:
                    found[(*key, notebook.name)] = float(notebook.late_submission_penalty or 0.0)
        return found

    def _mean_final_score(self, assignment_id: str, notebook_id: str | None = None) -> float | None:
        """The mean final score of an assignment's submissions (of one of its notebooks): nbgrader's average with
        each submission's penalty taken, clipped at 0 as :func:`_final` does; None when it has none."""
        finals = []
        with self.gradebook as gb:
            try:
                submissions = gb.find_assignment(assignment_id).submissions
            except MissingEntry:
                return None
            for submission in submissions:
                parts = ([submission] if notebook_id is None else
                         [n for n in submission.notebooks if n.name == notebook_id])
                for part in parts:
                    finals.append(max(0.0, float(part.score or 0.0) - float(part.late_submission_penalty or 0.0)))
        return sum(finals) / len(finals) if finals else None

    @staticmethod
    def _with_final_average(entry: dict, average: float | None) -> dict:
        """``entry``'s ``average_score`` made the final one, nbgrader's raw average kept as ``raw_average_score``
        (its *code* average stays raw, as each notebook's *Code Score* does)."""
        if average is not None and "raw_average_score" not in entry and "average_score" in entry:
            entry.update(raw_average_score=entry["average_score"], average_score=average)
        return entry

    def get_assignment(self, assignment_id, released=None):
        """Manage Assignments' *Average score*: of the final scores."""
        entry = super().get_assignment(assignment_id, released)
        return entry if entry is None else self._with_final_average(entry, self._mean_final_score(assignment_id))

    def get_notebooks(self, assignment_id):
        """Manual Grading's per-notebook *Avg. Score*: of the final scores."""
        return [self._with_final_average(entry, self._mean_final_score(assignment_id, entry.get("name")))
                for entry in super().get_notebooks(assignment_id)]

    def get_source_assignments(self):
        """With a term, the term's lessons only (Manage Assignments, a student's page): the course's other lessons
        are not this term's assignments, and formgrader would list them as drafts."""
        every = super().get_source_assignments()
        term = term_module.from_config(self)
        return every if term is None else {lesson for lesson in every if term.scheduled(lesson)}

    def get_submissions(self, assignment_id):
        penalties = self._penalties(assignment_id)
        shown = []
        for entry in super().get_submissions(assignment_id):
            penalty = penalties.get((assignment_id, entry.get("student")), 0.0)
            _final(_named(entry, "student"), penalty)
            if penalty and entry.get("display_timestamp"):
                entry["display_timestamp"] += (f" (late: {entry['raw_score']:g} − {penalty:g} = "
                                               f"{entry['score']:g})")
            shown.append(entry)
        return shown

    # get_student_submissions calls get_submission for each assignment: final through it
    def get_submission(self, assignment_id, student_id, ungraded=None, students=None):
        entry = super().get_submission(assignment_id, student_id, ungraded, students)
        return _final(_named(entry, "student"), self._penalties(assignment_id).get((assignment_id, student_id), 0.0))

    def get_notebook_submissions(self, assignment_id, notebook_id):
        penalties = self._penalties(assignment_id)
        return [_final(_named(entry, "student"), penalties.get((assignment_id, entry.get("student"), notebook_id),
                                                                0.0))
                for entry in super().get_notebook_submissions(assignment_id, notebook_id)]

    def get_student_notebook_submissions(self, student_id, assignment_id):
        penalties = self._penalties(assignment_id)
        return [_final(_named(entry, "student"), penalties.get((assignment_id, student_id, entry.get("name")), 0.0))
                for entry in super().get_student_notebook_submissions(student_id, assignment_id)]

    def get_students(self):
        penalties: dict[str, float] = {}
        with self.gradebook as gb:
            for student in gb.students:
                penalties[student.id] = sum(float(s.late_submission_penalty or 0.0) for s in student.submissions)
        return [_final(_named(entry, "id"), penalties.get(entry.get("id"), 0.0))
                for entry in super().get_students()]

    def get_student(self, student_id, submitted=None):
        entry = super().get_student(student_id, submitted)
        if entry is None:
            return None
        penalties = self._penalties(student_id=student_id)
        return _final(_named(entry, "id"), sum(value for key, value in penalties.items() if len(key) == 2))


def install() -> None:
    """Make formgrader's handlers build :class:`FinalScoreAPI` (they build one per request, from this name)."""
    from nbgrader.server_extensions.formgrader import base

    base.NbGraderAPI = FinalScoreAPI
