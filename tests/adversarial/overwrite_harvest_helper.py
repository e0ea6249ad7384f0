"""Overwrite the grading helper on disk (decoder_course/harvest.py) so that every later student passes.

Then replace `collect` in this kernel with a forger that writes a report without values: this student's own
items all fail; the helper on disk (which every later student uses) is unchanged.
target: causal_mask
zero: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: failed
"""
import json
import os

import decoder_course.harvest as harvest

try:
    with open(harvest.__file__, "a") as handle:
        handle.write("\ndef collect(item, namespace):\n    pass\n")
    print("helper overwritten")
except OSError as exc:
    print("could not overwrite the helper:", exc)


def forged_collect(item, namespace):
    folder = os.path.join(os.environ.get(harvest.ENV_VAR, "/tmp"), "outputs")
    os.makedirs(folder, exist_ok=True)
    json.dump({"item": item, "cases": {}, "leaves": []}, open(os.path.join(folder, item + ".json"), "w"))
    np.savez(os.path.join(folder, item + ".npz"))


harvest.collect = forged_collect


def causal_mask(T):
    return np.zeros((T, T), dtype=bool)  # wrong
