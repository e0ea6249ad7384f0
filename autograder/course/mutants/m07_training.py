"""Whole wrong answers to lesson 07-training (the patches of the reference are its ``MISTAKES``), written as a
student would type them in the notebook, where ``torch``, ``F``, ``shift_right``, ``sequence_loss``, ``BOS`` and
``PAD`` exist.
"""

from autograder.course.mutants import mutant

MUTANTS: list = []

# -- shift_right ---------------------------------------------------------------------------------------------


@mutant(MUTANTS, "shift_right", "shifted in place: the caller's targets are overwritten")
def shift_right(tgt_ids, bos_id):
    tgt_ids[:, 1:] = tgt_ids[:, :-1].clone()
    tgt_ids[:, 0] = bos_id
    return tgt_ids


