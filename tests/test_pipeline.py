"""The instructor pipeline end to end, through nbgrader: release, canary, autograde, feedback, CSV.

One grading run (module fixture) of every lesson for the canary (the solutions), ``grace`` (the untouched release)
and, for two lessons, ``alan`` (typical mistakes); the tests read its gradebook, notebooks and feedback.
"""

import csv
import re
import time

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import notebooks, samples
from autograder.grading import grade_class, pipeline
from autograder.judge import verdicts
from autograder.judge.preprocessors import HIDDEN_BEGIN

LESSONS = notebooks.lessons()
MISTAKE_LESSONS = [lesson for lesson in ("01-masks", "05-decoder-layer") if lesson in LESSONS]
# hopper submits the solutions with one building block left undone: the items built on it keep their points
LEFT_UNDONE = {lesson: item for lesson, item in (("02-attention", "softmax"), ("03-multi-head", "split_heads"))
               if lesson in LESSONS}
# Every solution notebook grades in 60 s on 2 cores (a graded run skips the demonstration cells: lesson 07's
# training runs, lessons 08 and 09's sweeps).
TIME_LIMIT: dict[str, float] = {}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("grading")
    subs = work / "incoming"
    for lesson in LESSONS:
        path = subs / "grace" / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(samples.untouched(lesson), path)
    for lesson in MISTAKE_LESSONS:
        path = subs / "alan" / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(samples.typical_mistakes(lesson), path)
    for lesson, item in LEFT_UNDONE.items():
        path = subs / "hopper" / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(samples.one_left(lesson, item), path)
    started = time.perf_counter()
    outcomes = grade_class.grade(subs, work / "course")
    return {"work": work / "course", "outcomes": outcomes, "seconds": time.perf_counter() - started}


def _outcome(run, student, lesson):
    return next(o for o in run["outcomes"] if o.student == student and o.lesson == lesson)


def _item_scores(run, student, lesson) -> dict[str, float]:
    with Gradebook(f"sqlite:///{run['work'] / 'gradebook.db'}", pipeline.COURSE_ID) as gb:
        nb = gb.find_submission_notebook(lesson, lesson, student)
        return {grade.name: grade.score for grade in nb.grades}


@pytest.mark.parametrize("lesson", LESSONS)
def test_canary_scores_full_marks_in_time(run, lesson):
    outcome = _outcome(run, pipeline.CANARY, lesson)
    assert outcome.ok and outcome.score == outcome.max_score > 0, outcome
    limit = TIME_LIMIT.get(lesson, 60.0)
    assert outcome.seconds <= limit, f"{lesson}: solution notebook took {outcome.seconds:.0f} s (limit {limit})"


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_release_scores_zero_without_error(run, lesson):
    outcome = _outcome(run, "grace", lesson)
    assert outcome.ok, outcome.message
    assert outcome.score == 0 and outcome.max_score > 0
    nb = nbformat.read(run["work"] / "autograded" / "grace" / lesson / f"{lesson}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    skipped = [c for c in code if notebooks.untouched_demo(c)]  # demonstrations a graded run skips
    assert all(c.execution_count for c in code if c not in skipped), (
        "the kernel stopped before the end of the release notebook")
    for cell in code:
        is_graded = cell.metadata.get("nbgrader", {}).get("grade", False)
        for out in cell.outputs:
            if out.output_type == "error" and not is_graded:
                assert out.ename in ("NotImplementedError", "CheckFailed"), (
                    f"{lesson}: an untouched release cell raised {out.ename}: {out.evalue}")


@pytest.mark.parametrize("lesson", MISTAKE_LESSONS)
def test_typical_mistakes_lose_exactly_their_items(run, lesson):
    scores = _item_scores(run, "alan", lesson)
    first_wrong = {}
    for item, _, _ in samples.mutants_of(lesson):
        first_wrong.setdefault(item, True)
    wrong = set(list(first_wrong)[::2])
    for item, score in scores.items():
        if item in wrong:
            assert score == 0, f"{item} holds a wrong answer but scored {score}"
        else:
            assert score > 0, f"{item} is correct (one of them also warns on stderr) but scored 0"


@pytest.mark.parametrize("lesson", MISTAKE_LESSONS)
def test_feedback_teaches_and_hides_the_hidden_tests(run, lesson):
    html = (run["work"] / "feedback" / "alan" / lesson / f"{lesson}.html").read_text()
    assert "Hidden checks for" in html, "the failing verdict's message is missing from the feedback"
    for secret in (HIDDEN_BEGIN, "harvest", "collect(", "autograder"):
        assert secret not in html, f"feedback shows {secret!r}"


@pytest.mark.parametrize("lesson", list(LEFT_UNDONE))
def test_a_building_block_left_undone_costs_only_itself(run, lesson):
    """Graded in the sandboxed kernel: where the stub raised, a correct one's answers stood in (a second run of
    the dependents' cases right after their cells), so the items built on it are judged on their own."""
    scores = _item_scores(run, "hopper", lesson)
    undone = LEFT_UNDONE[lesson]
    assert scores[undone] == 0, scores
    lost = {item: score for item, score in scores.items() if item != undone and score == 0}
    assert not lost, f"leaving {undone} undone also cost {lost}"
    dependents = [item for item, cls in verdicts.exercises_for(lesson).items() if undone in cls.uses]
    assert dependents and all(scores[item] > 0 for item in dependents), scores


def test_grade_csv_lists_every_student_and_lesson(run):
    with open(run["work"] / "grades.csv") as handle:
        rows = list(csv.DictReader(handle))
    got = {(row["student"], row["lesson"]) for row in rows}
    want = {("grace", lesson) for lesson in LESSONS} | {("alan", lesson) for lesson in MISTAKE_LESSONS}
    assert got == want | {("hopper", lesson) for lesson in LEFT_UNDONE}
    assert all(row["status"] == "ok" for row in rows)


def test_score_table_shows_each_student(run):
    table = pipeline.score_table(run["outcomes"])
    assert re.search(r"^\| grace \| 0/\d+ \|", table, re.M)
    assert "canary" in table


@pytest.mark.parametrize("lesson", LESSONS)
def test_nbgrader_validate_passes_on_the_solution(lesson):
    from nbgrader.validator import Validator

    results = Validator().validate(str(notebooks.solution_path(lesson)))
    problems = {key: value for key, value in results.items() if value}
    assert not problems, f"nbgrader validate: {problems}"
