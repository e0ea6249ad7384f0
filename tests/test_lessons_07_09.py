"""Lessons 07 to 09 as a student meets them: each promise a docstring makes is checked, and each message names the
step that broke.

Every known mistake below is also run by ``test_hidden_checks`` (it loses its own item and no other) and
``test_visible_catch_rate`` (the visible cell catches it); here each one's *message* must name the promise or the
step: the hidden verdict, and the visible cell's failure. A visible check of an item built on an earlier exercise
names the earlier one when that one is wrong ("this uses your `shift_right`"). The given ``train`` reads the token
accuracy however ``train_step`` calls the model.
"""

import math

import pytest
import torch

from autograder.course import samples
from autograder.course.reference import training
from autograder.judge import verdicts
from autograder.judge.corpus import run_visible, visible_test_cells
from decoder_course import data

# (lesson, item, a fragment of its known mistake's description, what the hidden verdict says, what its visible
# cell says)
NAMED = [
    ("08-generation", "sample", "counts BOS", "BOS is excluded from the repetition penalty", "BOS excluded"),
    ("08-generation", "sample_n", "tiled and read back as (n, B)", "row b * n + j of the batch sample_n hands",
     "row b * n + j of the batch"),
    ("08-generation", "beam_search", "len ** length_penalty", "len ** length_penalty",
     "GNMT's: divide by ((5 + len) / 6)"),
    ("09-kv-cache", "decode_step", "no dropout of its own", "known mistake: no dropout of its own in training mode",
     "applies dropout as in the layers"),
    ("09-kv-cache", "greedy_decode_cached", "position never advances", "the position never advances",
     "at position = tokens generated so far"),
    ("09-kv-cache", "KVCache", "heads axis (dim 1)", "sequence axis", "appended on the sequence axis"),
    ("09-kv-cache", "KVCache", "layer 0 only", "reorder every layer", "reorder every layer"),
    ("09-kv-cache", "beam_search_cached", "unrepeated src_is_real", "repeat_interleave(beam_size",
     "repeat_interleave(beam"),
]

# (lesson, the item whose visible cell runs, the earlier exercise made wrong, a fragment of its mistake): the cell
# names the earlier exercise
BUILT_ON = [
    ("07-training", "train_step", "shift_right", ""),
    ("07-training", "train_step", "sequence_loss", ""),
    ("07-training", "validation_loss", "shift_right", ""),
    ("09-kv-cache", "prefill", "decode_step", "src_is_real ignored"),
    ("09-kv-cache", "prefill", "KVCache", "heads axis (dim 1)"),
    ("09-kv-cache", "beam_search_cached", "KVCache", "layer 0 only"),
]


def _mistake(lesson: str, item: str, fragment: str) -> tuple[str, dict]:
    found = [(description, replacement) for name, description, replacement in samples.mutants_of(lesson)
             if name == item and fragment in description]
    assert found, f"no known mistake of {item} in {lesson} says {fragment!r}"
    return found[0]


@pytest.mark.parametrize("lesson,item,fragment,hidden,visible", NAMED, ids=[f"{r[1]}:{r[2]}" for r in NAMED])
def test_the_hidden_verdict_names_the_promise(lesson, item, fragment, hidden, visible):
    description, replacement = _mistake(lesson, item, fragment)
    verdict = verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, replacement))[item]  # as graded
    assert not verdict.passed, f"'{description}' passed {item}"
    assert hidden in verdict.message, (description, verdict.message)


def _visible_failure(lesson: str, cell: str, item: str, fragment: str) -> tuple[str, str]:
    """The visible cell of ``cell`` run on the known mistake of ``item``: the mistake, and what the cell raised."""
    description, replacement = _mistake(lesson, item, fragment)
    failure = run_visible(lesson, cell, replacement, visible_test_cells(lesson)[cell])
    assert failure is not None, f"the visible cell of {cell} passed with '{description}' in {item}"
    return description, failure


@pytest.mark.parametrize("lesson,item,fragment,hidden,visible", NAMED, ids=[f"{r[1]}:{r[2]}" for r in NAMED])
def test_the_visible_check_names_the_promise(lesson, item, fragment, hidden, visible):
    description, failure = _visible_failure(lesson, item, item, fragment)
    assert visible in failure, (description, failure)


@pytest.mark.parametrize("lesson,cell,item,fragment", BUILT_ON, ids=[f"{r[1]}<-{r[2]}" for r in BUILT_ON])
def test_a_visible_check_names_the_wrong_earlier_exercise_it_uses(lesson, cell, item, fragment):
    description, failure = _visible_failure(lesson, cell, item, fragment)
    assert f"this uses your `{item}`: its check above fails; fix it first" in failure, (description, failure)


def test_train_reads_the_token_accuracy_whichever_way_train_step_calls_the_model(monkeypatch):
    """A train_step that calls model.encode and model.decode meets its docstring; the given train must still see
    its logits (the accuracy curve and the no-causal-mask ablation read them)."""

    def train_step(model, batch, optimizer, clip_norm, label_smoothing=0.0):
        memory = model.encode(batch["src_ids"], batch["src_is_real"])
        logits = model.decode(training.shift_right(batch["tgt_ids"], 1), memory, src_is_real=batch["src_is_real"])
        loss = training.sequence_loss(logits, batch["tgt_ids"], 0, label_smoothing)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        return loss.item()

    monkeypatch.setattr(training, "train_step", train_step)
    task = data.get_task("reverse")
    V = len(task.tgt_vocab)
    torch.manual_seed(0)
    model = training.Seq2SeqTransformer(V, V, 16, 2, 32, 1, dropout=0.0, tie_weights=False)
    history = training.train(model, task, steps=3, batch_size=8, eval_every=2, eval_pairs=4, progress=False,
                             live=False)
    accuracy = history["token_accuracy"][1]
    assert len(accuracy) == 3 and all(math.isfinite(a) for a in accuracy), accuracy
