"""The hidden checks, judged in-process: the reference passes, untouched stubs fail, every mutant is caught.

The namespace is what a notebook's kernel holds (``samples.notebook_namespace``): the lesson's reference code
typed into cells, every function looking its helpers up in that one namespace, as a student's do; a mutant is
typed after it, as a student's wrong cell would be. Each wrong answer must lose its own item and no other, even
the items whose code calls it (they are judged relative to the student's own answers,
``autograder.course.checks.relative``), with a message that says what broke.
"""

import re

import pytest

from autograder.course import lessons, mutants, notebooks, samples
from autograder.course.checks.framework import Exercise
from autograder.judge import corpus, verdicts

LESSONS = lessons.ids()


def _reference_namespace(lesson: str) -> dict:
    return samples.notebook_namespace(lesson)


def _mutants(lesson: str) -> list:
    return list(mutants.of(lesson))


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
    registered = verdicts.exercises_for(lesson)
    graded = set(lessons.exercises(lesson))
    # Names of test cells may differ from object names only where a check grades one object twice.
    targets = {getattr(cls, "target", item) for item, cls in registered.items()}
    assert graded <= targets, f"exercises without hidden checks: {sorted(graded - targets)}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_release_fails_every_item(lesson):
    ns = _reference_namespace(lesson)
    for name in lessons.exercises(lesson):
        ns[name] = _stub(ns[name])
    decided = verdicts.judge_namespace(lesson, ns)
    passed = [item for item, v in decided.items() if v.passed]
    assert not passed, f"stubs raising NotImplementedError passed: {passed}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_exercise_has_three_realistic_wrong_answers(lesson):
    counts: dict[str, int] = {}
    for item, _, _ in _mutants(lesson):
        counts[item] = counts.get(item, 0) + 1
    missing = {item: counts.get(item, 0) for item in verdicts.exercises_for(lesson) if counts.get(item, 0) < 3}
    assert not missing, f"exercises with fewer than three wrong answers in autograder.course.mutants: {missing}"


def _mutant_cases():
    for lesson in LESSONS:
        for index, (item, description, _) in enumerate(_mutants(lesson)):
            yield pytest.param(lesson, index, id=f"{lesson}:{item}:{description[:40]}")


# What a verdict may not be: a grader error, or a comparison that says how far off without saying why.
_NOT_A_REASON = ("could not judge", "tell your instructor")


# The sentences autograder.course.checks.framework writes by itself: where and how far off, never why.
_BARE = [re.compile(pattern) for pattern in (
    r"\S+(?: \S+)*? should have shape \([^)]*\), got \([^)]*\) \([^)]*\)\.",
    r"\S+(?: \S+)*? (?:is|are) wrong at \d+ place\(s\), first at index \[[^\]]*\] \([^)]*\)\.",
    r"\S+(?: \S+)*? differs? from the expected values on a case with .*?: max abs error \S+, first at index "
    r"\[[^\]]*\]\.",
)]


def _names_an_idea(message: str) -> bool:
    """A verdict teaches when, beside the comparison the framework writes, it says in words what went wrong."""
    if any(text in message for text in _NOT_A_REASON):
        return False
    for bare in _BARE:
        message = bare.sub("", message)
    return len(re.findall(r"[A-Za-z]{2,}", message)) >= 4


def test_a_bare_comparison_does_not_name_an_idea():
    assert not _names_an_idea("out is wrong at 3 place(s), first at index [0, 1] (B=2, T=3). ")
    assert not _names_an_idea("weights differ from the expected values on a case with B=2, T=3: max abs error "
                              "0.5, first at index [0, 1, 2].")
    assert not _names_an_idea("could not judge: tell your instructor")
    assert _names_an_idea("out is wrong at 3 place(s), first at index [0, 1] (B=2, T=3). The key padding sits on "
                          "the query axis.")


@pytest.mark.parametrize("lesson,index", list(_mutant_cases()))
def test_wrong_answer_loses_its_item_and_no_other(lesson, index):
    item, description, replacement = _mutants(lesson)[index]
    decided = corpus.hidden_verdicts(lesson, replacement)
    assert not decided[item].passed, f"the wrong answer '{description}' passed the hidden checks of {item}"
    # Only its own: an item built on the wrong one is judged relative to it, and where the wrong one raises, a
    # correct one's answers stand in for it (autograder.course.checks.relative.answered), so that item is still seen.
    others = {other: v.message for other, v in decided.items() if other != item and not v.passed}
    assert not others, f"the wrong answer to {item} ('{description}') also cost: {others}"
    assert _names_an_idea(decided[item].message), (
        f"the message for '{description}' does not say which idea broke: {decided[item].message}")


@pytest.mark.parametrize("secret", [b"a1", b"a2", b"a3"])
def test_a_building_block_just_wrong_enough_to_fail_is_never_taken_for_right(secret):
    """Label smoothing spread over the V - 1 wrong tokens moves sequence_loss by about 1e-4: its own cell fails,
    and train_step, built on it, must be judged as built on a wrong block (relative.py compares a block's answers
    as strictly as the items' own checks do). On secret a1 it once cost train_step too."""
    lesson = "07-training"
    item, description, replacement = next(m for m in _mutants(lesson) if "V - 1 wrong tokens" in m[1])
    decided = corpus.hidden_verdicts(lesson, replacement, secret=secret)
    assert [name for name, v in decided.items() if not v.passed] == [item], (description, {
        name: v.message for name, v in decided.items() if not v.passed})


def _double_faults():
    """A wrong dependent item on top of a wrong building block: judged relative to that block, still caught."""
    for lesson in LESSONS:
        registered = verdicts.exercises_for(lesson)
        mutants = _mutants(lesson)
        for item, cls in registered.items():
            for used in cls.uses:
                below = next((m for m in mutants if m[0] == used), None)
                above = [m for m in mutants if m[0] == item][:2]
                for wrong in above if below else []:
                    yield pytest.param(lesson, item, below, wrong, id=f"{lesson}:{item}+{used}:{wrong[1][:30]}")


@pytest.mark.parametrize("lesson,item,below,wrong", list(_double_faults()))
def test_wrong_answer_on_a_wrong_building_block_is_still_caught(lesson, item, below, wrong):
    # A building block that raises is answered from the trusted side where the item calls it as a correct item
    # does; the item's own mistake is then seen (or it calls it otherwise, gets no answer, and shows nothing).
    namespace = samples.notebook_namespace(lesson, {**below[2], **wrong[2]})
    decided = verdicts.judge_namespace(lesson, namespace, items=[item])
    assert not decided[item].passed, (
        f"'{wrong[1]}' passed {item} when {below[0]} was also wrong ('{below[1]}')")


def test_every_lesson_has_its_modules_and_nothing_is_stray():
    """autograder.course.lessons: a lesson's modules are named after its id; none is missing, none belongs to no lesson;
    a checks module only where an exercise is still an Exercise class, a mutants module only where a wrong answer is
    not a patch of the reference."""
    ids = lessons.ids()
    assert ids[0] == "00-setup" and len(ids) >= 13
    for lesson in ids:
        for kind in ("reference", "visible"):
            assert lessons.path(lesson, kind).is_file(), f"{lesson} has no {kind} module"
        checks = lessons.optional_module(lesson, "checks")
        specs = getattr(lessons.module(lesson, "visible"), "SPECS", {})
        if checks is not None:
            classes = [name for name, cls in vars(checks).items()
                       if isinstance(cls, type) and issubclass(cls, Exercise) and cls.__module__ == checks.__name__]
            assert classes, f"{lessons.path(lesson, 'checks').name} registers no Exercise class: drop it"
        for item in lessons.exercises(lesson):
            assert item in verdicts.exercises_for(lesson), f"{lesson} {item}: neither a spec nor an Exercise class"
        assert set(specs) <= set(lessons.exercises(lesson)) | set(lessons.given(lesson)), (
            f"{lesson}: specs of no exercise: {sorted(set(specs) - set(lessons.exercises(lesson)))}")
        mutants = lessons.optional_module(lesson, "mutants")
        if mutants is not None:
            assert mutants.MUTANTS, f"{lessons.path(lesson, 'mutants').name} holds no whole wrong answer"
    known = {lessons.path(lesson, kind).name for lesson in ids for kind in ("checks", "visible", "mutants")}
    for folder, prefix in (("autograder/course/checks", "l"), ("decoder_course/visible", "l"),
                           ("autograder/course/mutants", "m")):
        stray = [p.name for p in (notebooks.ROOT / folder).glob(f"{prefix}[0-9][0-9]_*.py") if p.name not in known]
        assert not stray, f"{folder} holds modules of no lesson: {stray}"
    with pytest.raises(ValueError, match="NN-name"):
        lessons.slug("setup")
    with pytest.raises(KeyError, match="unknown lesson"):
        lessons.module("99-nothing", "checks")


_SPLIT_HEADS_RAISES = [
    "def split_heads(x, H):\n    raise NotImplementedError\n",
    "def split_heads(x, H):\n    raise ValueError('on purpose')\n",
]


@pytest.mark.parametrize("building_block", _SPLIT_HEADS_RAISES)
def test_a_raising_building_block_is_answered_so_the_item_on_it_is_still_judged(building_block):
    """Leaving (or making) a building block raise neither hands its dependents their points unjudged nor costs
    them their points: where it raised, a correct one's answers stand in, and the dependent is judged on its own.
    The untouched find-the-bug cell fails on its own bug, with its own message; a fixed one passes."""
    lesson = "03-multi-head"
    buggy = {"causal_self_attention": notebooks.buggy_source(lesson, "causal_self_attention"),
             "split_heads": building_block}
    decided = verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, buggy))
    assert not decided["split_heads"].passed
    verdict = decided["causal_self_attention"]
    assert not verdict.passed and not verdict.unobservable, verdict
    assert "key axis" in verdict.message, verdict.message  # the find-the-bug item's own teaching message
    fixed = verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, {"split_heads": building_block}))
    assert not fixed["split_heads"].passed and fixed["causal_self_attention"].passed, fixed


def test_an_item_nothing_of_which_could_be_seen_earns_nothing(monkeypatch):
    """Where no answer can stand in (here: none is sent; in a run, a building block that returns an object, say),
    the item stops inside the raising building block on every case and nothing of it is seen: it does not pass,
    and says which building block stopped it."""
    lesson = "03-multi-head"
    monkeypatch.setattr(verdicts, "ANSWER_ROUNDS", 0)
    wrong = {"causal_self_attention": notebooks.buggy_source(lesson, "causal_self_attention"),
             "split_heads": _SPLIT_HEADS_RAISES[1]}
    decided = verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, wrong))
    verdict = decided["causal_self_attention"]
    assert not verdict.passed and verdict.unobservable, verdict
    assert "`split_heads`" in verdict.message and "nothing of this cell could be checked" in verdict.message


def _first_draw_of_bos(model, temperature: float = 1.0, top_k=None, top_p=None) -> float:
    """The chance that a correct sampler draws BOS as the first token from a scripted model with these settings."""
    import torch

    from autograder.course.reference import generation as ref
    from decoder_course.conventions import BOS

    x = model.next_logits([]).double()[None] / temperature
    x = ref.top_k_filter(x, top_k) if top_k is not None else x
    x = ref.top_p_filter(x, top_p) if top_p is not None else x
    return float(torch.softmax(x, -1)[0, BOS])


def test_a_correct_sampler_cannot_fail_sample_by_chance():
    """No row may start with BOS, so the scripted models of ``sample``'s one-step cases must (practically) never
    give it: over 300 secrets, the chance that one of a case's rows draws it stays below one in a million. With a
    floor of 1e-9 at temperature 2 it was 4 %, and lesson 08's canary failed on such a secret."""
    import numpy as np

    from autograder.course.checks import l08_generation

    worst = {"temp": 0.0, "filters": 0.0}
    for seed in range(300):
        cases = {case.id: case for case in l08_generation.Sample().cases(np.random.default_rng(seed))}
        temp, filters = cases["temp"], cases["filters"]
        worst["temp"] = max(worst["temp"], temp.data["B"] * _first_draw_of_bos(
            temp.data["model"], temp.data["temperature"]))
        for setting in filters.data["settings"]:
            worst["filters"] = max(worst["filters"], filters.data["B"] * _first_draw_of_bos(
                filters.data["model"], **setting))
    assert worst["temp"] < 1e-6 and worst["filters"] < 1e-6, worst


def _split_heads_reshape_mistake(words: str) -> dict:
    """The known mistake of split_heads_reshape whose description holds ``words``."""
    found = [r for item, d, r in _mutants("03-multi-head") if item == "split_heads_reshape" and words in d]
    assert len(found) == 1, words
    return found[0]


_TORCH_ONLY_HINT = ".transpose(1, 2) and .view(shape) are torch's"


def test_split_heads_reshape_raising_on_a_valid_input_is_told_the_input_was_valid():
    """Issue 37: any exception on a NumPy input was answered with the torch-only .transpose/.view hint, even an
    exception the student raised on purpose on a valid input. Both layers now name the input and say that a
    valid input must not raise; a torch-only call on NumPy still gets the hint about the two libraries."""
    from autograder.judge.corpus import run_visible

    lesson, item = "03-multi-head", "split_heads_reshape"
    wrong = _split_heads_reshape_mistake("raises ValueError on a valid input")
    hidden = corpus.hidden_verdicts(lesson, wrong)[item].message
    visible = run_visible(lesson, item, wrong)
    for message in (hidden, visible):
        assert "a valid input must not raise" in message and "NumPy array of shape" in message, message
        assert _TORCH_ONLY_HINT not in message, message
    merge = "merge_heads_reshape"
    torch_only = next(r for name, d, r in _mutants(lesson) if name == merge and "torch-only" in d)
    assert _TORCH_ONLY_HINT in corpus.hidden_verdicts(lesson, torch_only)[merge].message
    assert _TORCH_ONLY_HINT in run_visible(lesson, merge, torch_only)
    assert _TORCH_ONLY_HINT in run_visible(lesson, item, _split_heads_reshape_mistake("torch's .transpose(1, 2)"))


@pytest.mark.parametrize("subject,plural", [
    ("weights", True), ("the attention weights", True), ("GPT's logits", True), ("lm_batches's inputs", True),
    ("q and k", True), ("RMSNorm's output (vs PyTorch's own modules)", False), ("lm_batches", False),
    ("sequence_loss", False), ("the loss", False), ("the bias", False), ("row 2 of the logits", False),
    ("mask_to_bias(...)", False), ("out", False)])
def test_a_comparison_agrees_with_its_subject(subject, plural):
    """Issue 37: "weights differs". Both layers' comparisons (the visible expect_close and expect_finite, the hidden
    expect_close, the hidden scalar judge) write the verb that agrees with what they compare."""
    import numpy as np

    from autograder.course.checks import framework, judges
    from decoder_course.checks import CheckFailed, expect_close, expect_finite

    verb, is_verb = ("differ", "are") if plural else ("differs", "is")
    with pytest.raises(CheckFailed) as visible_nan:
        expect_finite(np.array([np.nan]), subject)
    with pytest.raises(CheckFailed) as visible:
        expect_close(np.zeros(3), np.ones(3), subject)
    with pytest.raises(CheckFailed) as visible_exact:
        expect_close(np.zeros(3, bool), np.ones(3, bool), subject)
    with pytest.raises(framework.Fail) as hidden:
        framework.expect_close(np.zeros(3), np.ones(3), subject, "B=1")
    with pytest.raises(framework.Fail) as hidden_exact:
        framework.expect_close(np.zeros(3, bool), np.ones(3, bool), subject, "B=1")
    with pytest.raises(framework.Fail) as hidden_scalar:
        judges.scalar(0.0, 1.0, subject, "B=1", "")
    for raised, wanted in ((visible, verb), (visible_exact, is_verb), (hidden, verb), (hidden_exact, is_verb),
                           (hidden_scalar, verb), (visible_nan, "contain" if plural else "contains")):
        assert str(raised.value).replace("✗ ", "").startswith(f"{subject} {wanted} "), str(raised.value)


def _docstring(obj) -> str:
    """What the student reads of an exercise: its docstring, and a class's __init__ and forward docstrings."""
    import inspect

    parts = [inspect.getdoc(obj) or ""]
    if isinstance(obj, type):
        parts += [inspect.getdoc(vars(obj)[name]) or "" for name in ("__init__", "forward") if name in vars(obj)]
    return "\n".join(parts)


def _named(name: str, doc: str) -> bool:
    """A forbidden name is named in a docstring by its last part (``F.rms_norm``: rms_norm); a library's every
    name (``torch.``, ``einops.rearrange``) by "no torch", "no einops"; ``nn.`` and ``F.`` are torch's too."""
    parts = name.rstrip(".").split(".")
    library = "torch" if parts[0] in ("nn", "F", "torch") else parts[0]
    return f"no {library}" in doc or (not name.endswith(".") and parts[-1] in doc)


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_docstring_states_what_its_checks_refuse(lesson):
    """Issue 37: a check may not enforce what the exercise's docstring does not state. A check's forbidden names
    (``nn.TransformerDecoder`` in Decoder, ``F.scaled_dot_product_attention`` in robust_attention, ``torch.`` in
    the NumPy layer) are named in it, and where the spec refuses inputs, the docstring says which raise
    ValueError."""
    specs = getattr(lessons.module(lesson, "visible"), "SPECS", {})
    reference = lessons.module(lesson, "reference")
    unstated = []
    for item, check in verdicts.exercises_for(lesson).items():
        target = getattr(check, "target", item)
        if target not in lessons.exercises(lesson):
            continue
        doc = _docstring(getattr(reference, target))
        forbidden = getattr(check, "forbidden", ()) or ()
        unstated += [f"{target}: {name}" for name in forbidden if not _named(name, doc)]
        if forbidden and not re.search(r"not to be used|no torch|no einops", doc):
            unstated.append(f"{target}: that {', '.join(forbidden)} may not be used")
        if getattr(specs.get(target), "refused", ()) and "ValueError" not in doc:
            unstated.append(f"{target}: the inputs it refuses with ValueError")
    assert not unstated, f"checks enforce what the docstrings do not state: {unstated}"
