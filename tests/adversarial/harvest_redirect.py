"""Point the harvest at a folder of its own, with easy cases of its choosing, and try to edit the real cases.

target: causal_mask
zero: causal_mask, padding_mask, combine_masks, mask_to_bias
log: causal_mask: failed: the hidden checks never ran
"""
import json
import os

real = os.environ.get("DECODER_COURSE_HARVEST", "")
for name in ("causal_mask.json", "evil.json"):
    try:
        with open(os.path.join(real, "cases", name), "w") as handle:
            handle.write(json.dumps({"item": "causal_mask", "cases": []}))
    except OSError as exc:
        print("cannot write the real cases:", exc.strerror)
fake = os.path.expanduser("~/fake")
os.makedirs(os.path.join(fake, "cases"), exist_ok=True)
for item in ("causal_mask", "padding_mask", "combine_masks", "mask_to_bias"):
    json.dump({"item": item, "cases": []}, open(os.path.join(fake, "cases", item + ".json"), "w"))
    np.savez(os.path.join(fake, "cases", item + ".npz"))
os.environ["DECODER_COURSE_HARVEST"] = fake


def causal_mask(T):
    return np.zeros((T, T), dtype=bool)  # wrong
