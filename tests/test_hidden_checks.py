"""The hidden checks, judged in-process: the reference passes, untouched stubs fail, every mutant is caught.

The namespace is the lesson's reference module (what a perfect notebook defines); a mutant rebinds one name, as a
student's wrong cell would. Each wrong answer must lose its own item and no other, except items declared to build
on it (``depends_on``): a student's composite code is graded as it is.
"""

import importlib

import pytest

from autograder import notebooks, samples, verdicts

LESSONS = [
    lesson for lesson in verdicts.LESSON_CHECK_MODULES
    if importlib.util.find_spec(verdicts.LESSON_CHECK_MODULES[lesson]) is not None
]


def _reference_namespace(lesson: str) -> dict:
    module = importlib.import_module(f"autograder.reference.{notebooks.REFERENCE_MODULES[lesson]}")
    return dict(vars(module))


def _mutants(lesson: str) -> list:
    return samples.mutants_of(lesson)


def _stub(obj):
    """What an untouched release defines: the same name, raising NotImplementedError when used."""
    if isinstance(obj, type):
        return type(obj.__name__, (obj,), {"__init__": lambda self, *a, **k: (_ for _ in ()).throw(
            NotImplementedError())})

    def stub(*args, **kwargs):
        raise NotImplementedError()

    return stub


@pytest.mark.parametrize("lesson", LESSONS)
@pytest.mark.parametrize("secret", [b"run-1", b"run-2"])
def test_reference_passes_every_hidden_check(lesson, secret):
    decided = verdicts.judge_namespace(lesson, _reference_namespace(lesson), secret=secret)
    failed = {item: v.message for item, v in decided.items() if not v.passed}
    assert not failed, f"the reference fails its own hidden checks: {failed}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_reference_exercise_has_hidden_checks(lesson):
    module = importlib.import_module(f"autograder.reference.{notebooks.REFERENCE_MODULES[lesson]}")
    registered = verdicts.exercises_for(lesson)
    graded = set(module.EXERCISES)
    # Names of test cells may differ from object names only where a check grades one object twice.
    targets = {getattr(cls, "target", item) for item, cls in registered.items()}
    assert graded <= targets, f"exercises without hidden checks: {sorted(graded - targets)}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_release_fails_every_item(lesson):
    ns = _reference_namespace(lesson)
    module = importlib.import_module(f"autograder.reference.{notebooks.REFERENCE_MODULES[lesson]}")
    for name in module.EXERCISES:
        ns[name] = _stub(ns[name])
    decided = verdicts.judge_namespace(lesson, ns)
    passed = [item for item, v in decided.items() if v.passed]
    assert not passed, f"stubs raising NotImplementedError passed: {passed}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_exercise_has_two_realistic_wrong_answers(lesson):
    counts: dict[str, int] = {}
    for item, _, _ in _mutants(lesson):
        counts[item] = counts.get(item, 0) + 1
    missing = {item: counts.get(item, 0) for item in verdicts.exercises_for(lesson) if counts.get(item, 0) < 2}
    assert not missing, f"exercises with fewer than two wrong answers in autograder.mutants: {missing}"


def _mutant_cases():
    for lesson in LESSONS:
        for index, (item, description, _) in enumerate(_mutants(lesson)):
            yield pytest.param(lesson, index, id=f"{lesson}:{item}:{description[:40]}")


@pytest.mark.parametrize("lesson,index", list(_mutant_cases()))
def test_wrong_answer_loses_its_item_and_no_other(lesson, index):
    item, description, replacement = _mutants(lesson)[index]
    ns = _reference_namespace(lesson)
    ns.update(replacement)
    decided = verdicts.judge_namespace(lesson, ns)
    assert not decided[item].passed, f"the wrong answer '{description}' passed the hidden checks of {item}"
    registered = verdicts.exercises_for(lesson)
    others = {
        other: v.message for other, v in decided.items()
        if other != item and not v.passed and item not in getattr(registered[other], "depends_on", ())
    }
    assert not others, f"the wrong answer to {item} also cost: {others}"
