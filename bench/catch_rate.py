"""Section ``catch_rate``: how much of the corpus of realistic mistakes each layer of checks catches.

The corpus is :func:`autograder.course.mutants.of` (the reference modules' ``MISTAKES`` tables and the ``mNN_*.py``
whole
wrong answers). Each mistake is typed after the lesson's reference, as a student's wrong cell would be, and judged
twice (:func:`autograder.judge.corpus.catch`, the code tests/test_hidden_checks.py and
tests/test_visible_catch_rate.py
run): by the hidden checks, as graded, and by its item's visible test cell, as the student runs it. Two rates per
lesson and overall:

- **visible**: of the mistakes the hidden checks catch, the share the visible test cell catches too (what a student
  who runs the visible checks learns before submitting);
- **strict one-item**: of all the mistakes, the share that cost exactly their own item in the hidden grading and
  nothing else (a wrong building block must not cost the items built on it).

Nothing here is timed; the numbers are the corpus's, the same on any machine. ``--quick`` judges the first
mistake of each exercise only.
"""

from __future__ import annotations

from bench.common import table


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} = {100 * part / whole:.1f} %" if whole else "none"


def run(quick: bool = False) -> str:
    import matplotlib

    matplotlib.use("Agg")  # some visible test cells draw
    from autograder.course import lessons
    from autograder.judge import corpus

    rows, everything, missed, spilled = [], [], [], []
    for lesson in lessons.ids():
        caught = corpus.catch(lesson, first_of_each=quick)
        everything += caught
        counted = corpus.rates(caught)
        rows.append([lesson, len(lessons.exercises(lesson)), counted["mistakes"],
                     _percent(counted["visible"], counted["hidden"]), _percent(counted["strict"],
                                                                               counted["mistakes"])])
        missed += [f"{lesson} `{c['item']}`: {c['description']}" for c in caught if c["hidden"] and not c["visible"]]
        spilled += [f"{lesson} `{c['item']}`: {c['description']}"
                    + (f" (also cost {', '.join(c['others'])})" if c["others"] else " (its own item passed)")
                    for c in caught if c["others"] or not c["hidden"]]
    total = corpus.rates(everything)
    rows.append(["**all**", sum(len(lessons.exercises(lesson)) for lesson in lessons.ids()), total["mistakes"],
                 f"**{_percent(total['visible'], total['hidden'])}**",
                 f"**{_percent(total['strict'], total['mistakes'])}**"])
    lines = [table(["lesson", "exercises", "mistakes", "visible: caught by the visible cell / by the hidden checks",
                    "strict: cost exactly their own item / all"], rows), ""]
    scope = "the first mistake of each exercise" if quick else "every mistake"
    lines.append(f"Over {scope} of the corpus (`autograder.course.mutants.of`, the reference modules' `MISTAKES` "
                 f"and the "
                 f"`mNN_*.py` wrong answers), judged by the hidden checks as graded and by the item's visible test "
                 f"cell as the student runs it.")
    if missed:
        lines += ["", "Caught by the hidden checks but not by the visible cell:", ""]
        lines += [f"- {text}" for text in missed]
    if spilled:
        lines += ["", "Not exactly one item in the hidden grading:", ""]
        lines += [f"- {text}" for text in spilled]
    return "\n".join(lines)
