"""Answers for a building block that raised (harvest's spy step, ``autograder.course.checks.relative.answered``).

Kernel side: an answer stands in for a watched call only on the arguments it was sent for. Trusted side: answers
are sent only after a building block raised, and they are a correct building block's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from autograder.course import samples
from autograder.course.checks import relative
from autograder.course.checks.framework import Case, Result, write_cases
from autograder.judge import verdicts
from decoder_course import harvest

SOURCE = '''
def double(x):
    if x.shape == (3,):
        raise ValueError("not for three")
    return 2 * x + 100  # wrong, but it returns


def top(x):
    return double(x) + 1
'''


def _namespace() -> dict:
    namespace = {"np": np}
    exec(compile(SOURCE, "<cell>", "exec"), namespace)  # noqa: S102 - the test's own code
    return namespace


def _spied(x: np.ndarray, answer_for: np.ndarray, out: np.ndarray) -> tuple[harvest._Runner, Case]:
    case = Case("c0", "a test")
    case.call("top", case.array(x), record="res")
    case.steps = [{"spy": ["double"], "steps": case.steps,
                   "answers": {"double": [{"args": [case.array(answer_for)], "kwargs": {}, "out": case.array(out)}]}}]
    runner = harvest._Runner(_namespace(), case.arrays)
    return runner, case


def test_an_answer_stands_in_for_a_call_that_raised_on_its_arguments():
    x = np.arange(3.0)
    runner, case = _spied(x, x, 2 * x)
    runner.step(case.steps[0])
    np.testing.assert_array_equal(runner.leaves["res"], 2 * x + 1)  # the student's top, on the answer
    assert "~double/0/answered" in runner.meta and "~double/0/out" in runner.meta


def test_no_answer_for_other_arguments_the_call_still_raises():
    x = np.arange(3.0)
    runner, case = _spied(x, x + 1, 2 * x)
    with pytest.raises(ValueError, match="not for three"):
        runner.step(case.steps[0])
    assert "~double/0/answered" not in runner.meta


def test_an_answer_replaces_only_the_calls_it_was_sent_for():
    x = np.arange(2.0)
    runner, case = _spied(x, x + 1, 2 * x)  # sent for other arguments: the student's own answer stays
    runner.step(case.steps[0])
    np.testing.assert_array_equal(runner.leaves["res"], 2 * x + 101)
    assert "~double/0/answered" not in runner.meta
    runner, case = _spied(x, x, 2 * x)  # sent for these: it stands in, although the student's returned
    runner.step(case.steps[0])
    np.testing.assert_array_equal(runner.leaves["res"], 2 * x + 1)
    assert "~double/0/answered" in runner.meta


@pytest.mark.parametrize("left", ["softmax", "masked_softmax"])
def test_the_answers_are_a_correct_building_blocks_on_the_students_arguments(left):
    """Trusted side: after a first run in which the student's stub raised, every answer sent for it is the
    reference's value on the arguments of a recorded call; and the second run passes the item built on it."""
    lesson = "02-attention"
    reference = verdicts.exercises_for(lesson)["scaled_dot_product_attention"]().reference
    namespace = samples.notebook_namespace(lesson, {left: f"def {left}(*args, **kwargs):\n    raise "
                                                           "NotImplementedError\n"})
    ex = verdicts.exercises_for(lesson)["scaled_dot_product_attention"]()
    cases = ex.cases(np.random.default_rng(3))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_cases(folder / "cases", ex.name, cases)
        os.environ[harvest.ENV_VAR] = tmp
        try:
            harvest.collect(ex.name, namespace)
            again = verdicts.answered_cases(ex, cases, folder / "outputs")
            first = Result(folder / "outputs", ex.name, cases)
            recorded = {case.id: relative._recorded_calls(first, case.id) for case in cases}
        finally:
            os.environ.pop(harvest.ENV_VAR)
    assert again is not None
    sent = 0
    for case in again:
        spy = case.steps[0]
        for label, answers in spy.get("answers", {}).items():
            assert label in ex.uses
            for answer in answers:
                runner = harvest._Runner({}, case.arrays)
                args = [runner.value(spec) for spec in answer["args"]]
                kwargs = {k: runner.value(spec) for k, spec in answer["kwargs"].items()}
                want = getattr(reference, label)(*args, **kwargs)
                np.testing.assert_allclose(np.asarray(runner.value(answer["out"])), np.asarray(want), rtol=1e-6)
                # only the student's own calls are answered: these are the arguments of one the first run made
                assert any(relative._same(args, call.args) and relative._same(kwargs, call.kwargs)
                           for call in recorded[case.id].get(label, [])), label
                sent += 1
    assert sent, "no answer was sent for a building block that raised on every case"
    decided = verdicts.judge_namespace(lesson, namespace)
    assert not decided[left].passed
    assert decided["scaled_dot_product_attention"].passed, decided["scaled_dot_product_attention"]


def test_an_object_cannot_be_sent_as_an_answer():
    case = Case("c0", "a test")
    with pytest.raises(relative._Unencodable):
        relative._encode(case, object())
    assert relative._encode(case, object(), loose=True) == {"anything": True}
    assert relative._encode(case, (1, None, [2.5])) == {"tuple": [1, None, {"list": [2.5]}]}


def test_an_answer_round_reruns_only_the_cases_it_answers_and_judges_the_merged_outputs(monkeypatch):
    """masked_softmax raising on 4-D scores only: the next run sends just the cases that stopped there (with
    answers), every other case keeps the outputs of the first run, and scaled_dot_product_attention (correct)
    passes on the merged outputs."""
    lesson = "02-attention"
    namespace = samples.notebook_namespace(lesson, {"masked_softmax": (
        "def masked_softmax(scores, allowed=None, axis=-1):\n"
        "    if scores.ndim == 4:\n"
        "        raise ValueError('not for four axes')\n"
        "    return softmax(np.where(allowed, scores, -1e9) if allowed is not None else scores, axis=axis)\n")})
    sent: list[list[Case]] = []
    run = verdicts._run_in_process

    def spied(*arguments):  # (scratch, item, namespace, forbidden, cases)
        sent.append(list(arguments[-1]))
        run(*arguments)

    monkeypatch.setattr(verdicts, "_run_in_process", spied)
    decided = verdicts.judge_namespace(lesson, namespace, items=["softmax", "masked_softmax",
                                                                "scaled_dot_product_attention"])
    ex = verdicts.exercises_for(lesson)["scaled_dot_product_attention"]()
    # the cases judge_namespace sends (its default secret and student)
    n_cases = len(ex.cases(np.random.default_rng(verdicts.derive_seed(b"in-process", lesson, "test", ex.name))))
    assert sent, "no answer round ran for an item whose building block raised on some of its cases"
    for cases in sent:
        assert 0 < len(cases) < n_cases, "an answer round sent every case again, or none"
        for case in cases:
            spy = next(step for step in case.steps if "spy" in step)
            assert spy.get("answers"), f"case {case.id} was sent again without answers"
    assert not decided["masked_softmax"].passed
    assert decided["scaled_dot_product_attention"].passed, decided["scaled_dot_product_attention"].message
