"""Lessons 11-12: each promise a docstring makes is named, in both layers, by the message of the known mistake that
breaks it (issue 37: the walkthrough's two mistakes, the mode left as it is, the chunk after a prefill, bytes not
code points, the message that sent a student the wrong way).

Each row is a known mistake (the reference's ``MISTAKES``, so ``tests/test_hidden_checks.py`` already proves it
costs exactly its item): here its hidden verdict and its visible failure must both say the words of the promise.
"""

import numpy as np
import pytest
import torch

from autograder.course import samples
from autograder.judge import verdicts
from autograder.judge.corpus import run_visible, visible_test_cells
from decoder_course.checks import CheckFailed, expect_dtype

# (lesson, item, a words of the mistake's description, words the hidden message holds, words the visible one holds)
NAMED = [
    ("11-gpt", "GPT", "aligned to absolute positions", "any number of new positions per call",
     "any number of new positions per call"),
    ("12-modern", "ModernBlock", "without the block's eps", "ignore the block's eps", "ignore the block's eps"),
    ("11-gpt", "generate", "switches the model to eval mode", "leaves the mode as it is", "leaves the mode as it is"),
    ("11-gpt", "generate", "last prompt token twice", "feeds the last prompt token twice",
     "feed no prompt token again"),
    ("11-gpt", "train_bpe", "code points", "not of its UTF-8 bytes", "not of its UTF-8 bytes"),
    ("11-gpt", "lm_batches", "runs past the stream", "runs past the stream", "ran past the end of the stream"),
    ("12-modern", "rotary_embedding", "halves concatenated", "in another order", "in another order"),
    # an exception only in the cached calls is the cache's: the spec's cache hint, not a bare RuntimeError
    ("12-modern", "ModernBlock", "cache not passed on", "Pass cache and layer_idx on to the attention",
     "Pass cache and layer_idx on to the attention"),
    ("11-gpt", "lm_batches", "int32 ids come back int32", "convert it (.long()", "convert it (.long()"),
]


def _mistake(lesson: str, item: str, words: str) -> dict:
    found = [replacement for name, description, replacement in samples.mutants_of(lesson)
             if name == item and words in description]
    assert len(found) == 1, f"no single known mistake of {item} says '{words}'"
    return found[0]


@pytest.mark.parametrize("lesson,item,words,hidden,visible", NAMED, ids=[f"{r[1]}:{r[2]}" for r in NAMED])
def test_the_broken_promise_is_named_in_both_layers(lesson, item, words, hidden, visible):
    replacement = _mistake(lesson, item, words)
    decided = verdicts.judge_namespace(lesson, samples.notebook_namespace(lesson, replacement))
    assert not decided[item].passed
    assert hidden in decided[item].message, decided[item].message
    failure = run_visible(lesson, item, replacement, visible_test_cells(lesson)[item])
    assert failure is not None and visible in failure, failure


def test_a_fixed_width_integer_result_is_not_told_to_keep_the_inputs_width():
    """lm_batches promises int64 whatever the stream's width: int32 ids are told to convert, not 'int32 stays'."""
    with pytest.raises(CheckFailed) as wider:
        expect_dtype(torch.zeros(2, dtype=torch.int32), torch.int64, "inputs")
    assert ".long()" in str(wider.value) and "stays int32" not in str(wider.value)
    with pytest.raises(CheckFailed) as narrower:  # a result that keeps the input's width: that hint stays
        expect_dtype(np.zeros(2, dtype=np.int64), np.int32, "shift_right(int32 ids)")
    assert "int32 stays int32" in str(narrower.value)
