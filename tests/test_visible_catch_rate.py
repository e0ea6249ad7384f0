"""The visible checks catch what the hidden ones do: every mutant through its lesson's visible checks.

Each wrong answer (``autograder.course.mutants``) is typed into a kernel-like namespace (``samples.notebook_namespace``)
and its item's visible test cell (the ``# %% test=<item>`` cell of ``solutions/<lesson>.py``) is run there, as
the student would run it before submitting. The rate per lesson is printed; the test fails when the visible
checks catch fewer than 95 % of any lesson's mutants. A catch counts only when the reference passes the same
cell (``test_reference_passes_every_visible_check``), and the namespace holds the lesson's given cells too
(``# %% given=module:names``), so that a missing name is never mistaken for a caught mistake.
"""

import matplotlib
import pytest

from autograder.course import lessons, mutants
from autograder.judge import corpus, verdicts
from autograder.judge.corpus import run_visible, visible_test_cells

matplotlib.use("Agg")
TARGET = 0.95


@pytest.mark.parametrize("lesson", list(lessons.ids()))
def test_reference_passes_every_visible_check(lesson):
    cells = visible_test_cells(lesson)
    failed = {item: run_visible(lesson, item, None, cells[item]) for item in verdicts.exercises_for(lesson)}
    failed = {item: why for item, why in failed.items() if why is not None}
    assert not failed, f"the reference fails its own visible checks in {lesson}: {failed}"


def test_visible_checks_catch_at_least_95_percent_of_each_lessons_mutants(capsys):
    caught_all = total = 0
    lines, missed, under = [], [], []
    for lesson in lessons.ids():
        cells = visible_test_cells(lesson)
        wrong_answers = mutants.of(lesson)
        caught = 0
        for item, description, replacement in wrong_answers:
            if run_visible(lesson, item, replacement, cells[item]) is not None:
                caught += 1
            else:
                missed.append(f"{lesson} {item}: {description}")
        caught_all, total = caught_all + caught, total + len(wrong_answers)
        if caught < TARGET * len(wrong_answers):
            under.append(f"{lesson} {caught}/{len(wrong_answers)}")
        lines.append(f"{lesson:20s} {caught:3d}/{len(wrong_answers):3d} = "
                     f"{100 * caught / len(wrong_answers):5.1f} %")
    lines.append(f"{'all':20s} {caught_all:3d}/{total:3d} = {100 * caught_all / total:5.1f} %")
    with capsys.disabled():
        print("\nvisible checks, mutants caught per lesson:\n  " + "\n  ".join(lines))
        if missed:
            print("missed:\n  " + "\n  ".join(missed))
    assert not under, f"lessons whose visible checks catch under {TARGET:.0%} of the mutants: {under}; missed: {missed}"
    assert caught_all / total >= TARGET, f"the visible checks catch {caught_all}/{total}; missed: {missed}"


@pytest.mark.parametrize("lesson", list(lessons.ids()))
def test_every_graded_item_has_a_visible_test_cell(lesson):
    missing = set(verdicts.exercises_for(lesson)) - set(visible_test_cells(lesson))
    assert not missing, f"graded items without a visible test cell in solutions/{lesson}.py: {sorted(missing)}"


def test_rates_count_the_visible_among_the_hidden_and_the_strict_among_all():
    """The published rates (bench section catch_rate): the visible rate's denominator is what the hidden checks
    catch; the strict rate's is every mistake, and a mistake that costs another item too is not strict."""
    caught = [{"hidden": True, "visible": True, "others": []},
              {"hidden": True, "visible": False, "others": ["train_step"]},
              {"hidden": False, "visible": True, "others": []}]
    counted = corpus.rates(caught)
    assert (counted["mistakes"], counted["hidden"], counted["visible"], counted["strict"]) == (3, 2, 1, 1)
    assert counted["visible_rate"] == 0.5 and counted["strict_rate"] == 1 / 3
    assert corpus.rates([])["visible_rate"] == 1.0


def test_the_catch_rate_section_reports_each_lesson_and_what_was_missed(monkeypatch):
    """bench/catch_rate.py on one lesson, quick: a row per lesson and the total; a mistake the visible cell misses
    is listed by name (here the visible cell is made to miss them all)."""
    from bench import catch_rate

    monkeypatch.setattr(lessons, "ids", lambda: ("00-setup",))
    table = catch_rate.run(quick=True)
    assert "| 00-setup | 3 | 3 | 3/3 = 100.0 % | 3/3 = 100.0 % |" in table and "| **all** |" in table
    assert "not by the visible cell" not in table
    monkeypatch.setattr(corpus, "run_visible", lambda *args, **kwargs: None)
    missed = catch_rate.run(quick=True)
    assert "0/3 = 0.0 %" in missed and "Caught by the hidden checks but not by the visible cell:" in missed
    assert "- 00-setup `flatten_batch`:" in missed
