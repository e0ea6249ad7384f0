"""Which students' exercise code is too alike: winnowed fingerprints per graded exercise cell, pairs ranked over cells.

For the instructor's class report (:mod:`autograder.report`) only: it reports, it never changes a grade.

Each exercise cell a student submitted is fingerprinted by ``copydetect`` (the maintained implementation of MOSS's
winnowing, Schleimer et al. 2003): pygments tokenises the code, names become one letter (a variable, a function, a
class), strings and comments go, and the k-grams of what is left are hashed and winnowed. Every fingerprint of the
lesson's released notebook is *boilerplate* and discarded, so the given code, the stubs and the lesson's scaffolding
never count. A fingerprint more than :data:`COMMON_SHARE` of the class has in one cell (with at least
:data:`COMMON_MIN_STUDENTS` students) is how everyone writes that line, and counts for no pair.

A pair's per-cell similarity is the share of the smaller cell's fingerprints that the other cell also has; a cell with
fewer than :data:`MIN_FINGERPRINTS` fingerprints left is too short to tell anything and is not scored. A pair's
score is the sum of its cells' similarities of at least :data:`CELL_MATCH`, and it is *flagged* only when
:data:`MIN_CELLS` cells or more match: attention code converges to a few lines, so one alike cell proves nothing.
"""

from __future__ import annotations

import bisect
import functools
import io
import itertools
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

K = 12  # characters of the filtered code per k-gram (a name is one character there): part of a short line
WINDOW = 4  # winnowing window: every shared run of K + WINDOW - 1 characters is found
COMMON_SHARE = 0.5  # a fingerprint in more than this share of a cell's students is the usual way to write it
COMMON_MIN_STUDENTS = 8  # ... judged so only with at least this many students in the cell
MIN_FINGERPRINTS = 4  # a cell with fewer fingerprints of the student's own is too short to compare
CELL_MATCH = 0.5  # a cell's similarity from which it counts for the pair
MIN_CELLS = 2  # cells that must match for a pair to be flagged
MAX_PAIRS = 200  # pairs written to similarity.csv (the highest scores); the page shows fewer
MAX_CODE_CHARS = 20_000  # of one cell, fingerprinted (a longer cell is cut: nobody copies by the megabyte)

log = logging.getLogger("autograder")
logging.getLogger("copydetect").setLevel(logging.ERROR)


def fingerprint(code: str, boilerplate: list[int] | None = None, limit: int = MAX_CODE_CHARS):
    """copydetect's fingerprint (a ``CodeFingerprint``) of Python ``code`` (its first ``limit`` characters),
    without ``boilerplate``. copydetect is imported here: it imports matplotlib, which grading does not need."""
    from copydetect import CodeFingerprint

    return CodeFingerprint("cell.py", K, WINDOW, boilerplate=boilerplate or [], language="python",
                           fp=io.StringIO(code[:limit]))


@dataclass
class CellMatch:
    """One cell of a pair: how alike, and where (character slices of each student's code)."""

    cell: str  # "lesson/item"
    similarity: float
    slices: tuple = ()  # (slices of a, slices of b), copydetect's 2xN arrays of the raw code; filled for shown pairs


@dataclass
class Pair:
    a: str
    b: str
    score: float = 0.0
    cells: list[CellMatch] = field(default_factory=list)

    @property
    def matched(self) -> list[CellMatch]:
        return [c for c in self.cells if c.similarity >= CELL_MATCH]

    @property
    def flagged(self) -> bool:
        return len(self.matched) >= MIN_CELLS


def pairs(code: dict[str, dict[str, str]], boilerplate: dict[str, str]) -> list[Pair]:
    """Every pair of students who share a fingerprint in some cell, highest score first.

    ``code``: cell ("lesson/item") -> student -> the student's code of that cell; ``boilerplate``: lesson -> the
    code of its released notebook (everything in it is discarded from the students' fingerprints)."""
    found: dict[tuple[str, str], Pair] = {}
    for cell, by_student in sorted(code.items()):
        given = _given(boilerplate.get(cell.split("/")[0], ""))
        prints = {student: set(fingerprint(source).hashes) - given for student, source in by_student.items()}
        counts = Counter(h for hashes in prints.values() for h in hashes)
        common = ({h for h, n in counts.items() if n > COMMON_SHARE * len(prints)}
                  if len(prints) >= COMMON_MIN_STUDENTS else set())
        owners: dict[int, list[str]] = defaultdict(list)
        own = {}
        for student, hashes in prints.items():
            own[student] = hashes - common
            if len(own[student]) >= MIN_FINGERPRINTS:
                for h in own[student]:
                    owners[h].append(student)
        shared: Counter = Counter()
        for students in owners.values():
            for a, b in itertools.combinations(sorted(students), 2):
                shared[a, b] += 1
        for (a, b), n in shared.items():
            similarity = n / min(len(own[a]), len(own[b]))
            pair = found.setdefault((a, b), Pair(a, b))
            pair.cells.append(CellMatch(cell, round(similarity, 3)))
    ranked = list(found.values())
    for pair in ranked:
        pair.cells.sort(key=lambda c: -c.similarity)
        pair.score = round(sum(c.similarity for c in pair.matched), 3)
    ranked.sort(key=lambda p: (-p.score, -max(c.similarity for c in p.cells), p.a, p.b))
    return ranked


@functools.lru_cache(maxsize=64)
def _given(released: str) -> frozenset[int]:
    """The fingerprints of a lesson's released code (cached: every cell of the lesson discards them)."""
    return frozenset(fingerprint(released, limit=len(released)).hashes) if released else frozenset()


def locate(pair: Pair, code: dict[str, dict[str, str]], boilerplate: dict[str, str]) -> None:
    """Fill each matched cell's slices: where in each student's code the shared fingerprints are (copydetect's
    ``compare_files``, with the released code as boilerplate)."""
    from copydetect import compare_files

    for match in pair.matched:
        given = sorted(_given(boilerplate.get(match.cell.split("/")[0], "")))
        first, second = (fingerprint(code[match.cell][who], given) for who in (pair.a, pair.b))
        _, _, slices = compare_files(first, second)
        match.slices = slices


def matching_lines(source: str, slices) -> set[int]:
    """The 0-based line numbers of ``source`` that a shared run of copydetect's ``slices`` (2xN) touches."""
    lines: set[int] = set()
    if slices is None or len(slices) == 0 or len(slices[0]) == 0:
        return lines
    starts = [0]
    for i, char in enumerate(source):
        if char == "\n":
            starts.append(i + 1)
    for start, end in zip(slices[0], slices[1]):
        first = _line_of(starts, int(start))
        last = _line_of(starts, max(int(start), int(end) - 1))
        lines.update(range(first, last + 1))
    return lines


def _line_of(starts: list[int], at: int) -> int:
    return bisect.bisect_right(starts, at) - 1
