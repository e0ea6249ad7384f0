"""Find-the-bug exercises: the release shows a given implementation with one realistic mistake; the student fixes it.

A find-the-bug exercise is an ordinary exercise (a reference with ``### BEGIN SOLUTION`` / ``### END SOLUTION``,
which make it one, a test cell, hidden checks, mutants) whose every solution region is followed by the buggy lines
the release shows instead, commented out between ``### BEGIN BUG`` / ``### END BUG``::

    scores = q @ k.swapaxes(-1, -2) / math.sqrt(Dh)  # (..., T, S)
    ### BEGIN SOLUTION
    weights = e / e.sum(axis=-1, keepdims=True)  # the fix: normalise over the keys
    ### END SOLUTION
    ### BEGIN BUG
    # weights = e / e.sum(axis=-2, keepdims=True)
    ### END BUG

Keep the solution region to the lines that differ: everything around it is shown in the release as it is.
Where the bug lives:

- the reference module: the fix (between the solution markers) and the bug (comments, so the module runs correct);
- the solution notebook: the reference without the bug block (:func:`strip`; so the canary runs the fix), and the
  buggy lines in the cell's metadata, ``{"course": {"bug": [lines of each region]}}`` (:func:`regions`);
- the release: nbgrader's ``generate_assignment`` with :class:`ShowBug` in place of its ``ClearSolutions``, which
  puts each region's buggy lines where the stub would go (and drops the metadata), so the student's cell starts
  with a complete, runnable, wrong implementation, and the fixed lines are nowhere in it;
- the mutants: :func:`shown_bug` registers the release's version as one of the exercise's wrong answers, so the
  tests prove that the untouched release fails its item, and no other, and that the visible check catches it.

A find-the-bug function either keeps the contract of one of the lesson's exercises and calls nothing the student
writes (lesson 02's ``fixed_attention``, judged by that exercise's checks,
:mod:`autograder.course.checks.find_the_bug`),
or, so that its given code cannot spell out a main exercise's answer, it *combines* the student's own exercises
and its bug lies in how (lesson 03's ``causal_self_attention`` hands the student's ``MultiHeadAttention`` a mask).
The latter declares ``uses`` (every item it reaches, through the ones it calls too) and is judged relative to the
student's answers (:mod:`autograder.course.checks.relative`), so that its item is not lost for another exercise's
mistake, nor the other way round.
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import ClearSolutions

BEGIN, END = "### BEGIN BUG", "### END BUG"
_BLOCK = re.compile(r"^[ \t]*### BEGIN BUG[ \t]*\n(?P<body>.*?)^[ \t]*### END BUG[ \t]*\n?", re.M | re.S)
_SOLUTION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*\n?",
                       re.M | re.S)


def strip(source: str) -> str:
    """``source`` without its bug blocks: the correct code, as the solution notebook shows it."""
    return _BLOCK.sub("", source)


def _uncomment(body: str) -> str:
    lines = []
    for line in body.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        code = line.lstrip()
        if not code.startswith("#"):
            raise ValueError(f"a bug block holds commented-out lines only: {line!r}")
        code = code[1:]
        lines.append(indent + (code[1:] if code.startswith(" ") else code) if code.strip() else "")
    return "\n".join(lines)


def regions(source: str) -> list[str] | None:
    """The buggy lines of each solution region of ``source``, in order; None when it has no bug block.

    Every solution region must be followed directly by its bug block (an empty one deletes the region's lines).
    """
    if BEGIN not in source:
        return None
    found = []
    for match in _SOLUTION.finditer(source):
        block = _BLOCK.match(source, match.end())
        if block is None:
            raise ValueError("in a find-the-bug exercise every solution region is followed by its bug block:\n"
                             + match.group(0))
        found.append(_uncomment(block["body"]))
    if len(found) != source.count(BEGIN):
        raise ValueError("a bug block that does not follow a solution region")
    return found


def show(source: str, bugs: list[str | None]) -> str:
    """``source`` (no bug blocks, solution markers kept) with region ``i`` replaced by ``bugs[i]``, markers gone;
    a region whose entry is None keeps its markers (nbgrader's stub goes there)."""
    parts, last = [], 0
    matches = list(_SOLUTION.finditer(source))
    if len(matches) != len(bugs):
        raise ValueError(f"{len(bugs)} buggy regions for {len(matches)} solution regions")
    for match, bug in zip(matches, bugs, strict=True):
        parts.append(source[last:match.start()])
        if bug is None:
            parts.append(match.group(0))
        elif bug:
            parts.append(bug + "\n")
        last = match.end()
    parts.append(source[last:])
    return "".join(parts)


def buggy_source(source: str) -> str:
    """What the release shows of a reference's ``source`` (bug blocks included): the bug in place of the fix."""
    bugs = regions(source)
    if bugs is None:
        raise ValueError("not a find-the-bug exercise: no bug block")
    return show(strip(source), bugs)


class ShowBug(ClearSolutions):
    """nbgrader's ClearSolutions, except in a find-the-bug cell: there each solution region becomes the buggy lines
    that the builder put in the cell's metadata (``course.bug``), and that metadata is not released."""

    def preprocess_cell(self, cell, resources, cell_index):
        bugs = cell.get("metadata", {}).get("course", {}).get("bug")
        if bugs and cell.cell_type == "code":
            cell.source = show(cell.source, bugs)
            del cell.metadata["course"]["bug"]
            if any(bug is None for bug in bugs):  # regions without a bug get nbgrader's stub as usual
                return super().preprocess_cell(cell, resources, cell_index)
            return cell, resources
        return super().preprocess_cell(cell, resources, cell_index)
