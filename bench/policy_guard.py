"""8. The run-time policy guard (decoder_course.guard): what it costs a notebook's restricted items.

For each lesson with restricted items (an exercise with ``forbidden`` rules), the reference answers' restricted
items are judged in process (``verdicts.judge_namespace``: the harvest's forked child runs the hidden cases, the
verdicts are made outside it) with the guard as it grades, and with its arming turned off, in turn in the same run
(medians). Apart, in a forked child each (the arming is for the whole process), the time to arm it: the
dispatcher's refusals (``Guard.arm_dispatcher``: the forbidden fused operators, or every operator for a NumPy-only
item) and the whole ``Guard.install`` (stand-ins, replaced code, profile function). Wall-clock times: on a shared
machine both sides are slowed alike, the arming times not.
"""

from __future__ import annotations

import functools
import os
import struct
import time

from bench.common import seconds, side_by_side, table

LESSONS = ("03-multi-head", "05-decoder-layer", "07-training", "10-numerics", "12-modern")


def _restricted(lesson: str) -> dict[str, tuple[str, ...]]:
    from autograder.judge import verdicts

    return {item: tuple(ex.forbidden) for item, ex in verdicts.exercises_for(lesson).items() if ex.forbidden}


def _arming_seconds(rules: tuple[str, ...]) -> tuple[float, float]:
    """(arming the dispatcher, the whole install) in seconds, each measured in a forked child of its own."""
    from decoder_course.guard import Guard

    def measure(arm) -> float:
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: arm, report the time, leave without running anything else
            try:
                guard = Guard(list(rules), lambda rule: os._exit(3))
                started = time.perf_counter()
                arm(guard)
                os.write(writable, struct.pack("d", time.perf_counter() - started))
            finally:
                os._exit(0)
        os.close(writable)
        data = os.read(readable, 8)
        os.close(readable)
        os.waitpid(pid, 0)
        return struct.unpack("d", data)[0] if len(data) == 8 else float("nan")

    return measure(lambda guard: guard.arm_dispatcher()), measure(lambda guard: guard.install({}))


def _judged(lesson: str, namespace: dict, items: list[str], mode: str) -> None:
    """Judge ``items`` with the guard ``mode``: "guarded", "before the dispatcher" (the profile function and the
    stand-ins only, as before issue 36) or "unguarded"."""
    from autograder.judge import verdicts
    from decoder_course import guard

    saved = {name: getattr(guard.Guard, name) for name in ("install", "arm_dispatcher", "replace_code")}
    if mode == "unguarded":
        guard.Guard.install = lambda self, namespace: None
    elif mode == "before the dispatcher":
        guard.Guard.arm_dispatcher = guard.Guard.replace_code = lambda self: None
    try:
        decided = verdicts.judge_namespace(lesson, namespace, items=items)
    finally:
        for name, value in saved.items():
            setattr(guard.Guard, name, value)
    assert all(v.passed for v in decided.values()), {k: v.message for k, v in decided.items()}


MODES = ("unguarded", "before the dispatcher", "guarded")


def run(quick: bool = False, repeats: int = 3) -> str:
    from autograder.course import samples

    rows = []
    for lesson in LESSONS[:2] if quick else LESSONS:
        restricted = _restricted(lesson)
        if not restricted:
            continue
        namespace = samples.notebook_namespace(lesson)
        times = side_by_side({mode: functools.partial(_judged, lesson, namespace, list(restricted), mode)
                              for mode in MODES}, max(1, repeats), number=1)
        arming = [_arming_seconds(rules) for rules in restricted.values()]
        rows.append([lesson, ", ".join(f"`{item}`" for item in restricted),
                     *(seconds(times[mode]) for mode in MODES),
                     f"{seconds(times['guarded'] - times['unguarded'])} "
                     f"({times['guarded'] / times['unguarded']:.2f}×)",
                     f"{(times['guarded'] - times['before the dispatcher']) * 1000:+.0f} ms",
                     seconds(sum(a for a, _ in arming)), seconds(sum(b for _, b in arming))])
    return table(["lesson", "restricted items", "judged unguarded", "guarded before the dispatcher", "guarded",
                  "guard's cost per notebook", "of which the dispatcher and replaced code",
                  "arming the dispatcher (its items, summed)", "whole install (its items, summed)"], rows)


if __name__ == "__main__":
    print(run())
