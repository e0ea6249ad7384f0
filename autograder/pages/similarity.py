"""Which students' exercise code is too alike: winnowed fingerprints per graded exercise cell, pairs ranked over cells.

For the instructor's class report (:mod:`autograder.pages.report`) only: it reports, it never changes a grade.

Each exercise cell a student submitted is fingerprinted as MOSS and copydetect do (winnowing, Schleimer et al. 2003):
the code is tokenised, comments and whitespace go, every name becomes ``V`` and every string ``S``, and the k-grams
of what is left are hashed and winnowed (``copydetect``'s ``winnow``; the overlap and the slices of the matching
code are its functions too). Two parts are ours. The tokenising (:func:`filtered`): copydetect's own, through
pygments, costs about 20 ms a cell, over two minutes for 100 students x 13 lessons, where a regular expression of
Python's tokens takes a fraction of a millisecond. And the k-gram hash (:func:`kgram_hashes`): copydetect's
``hashed_kgrams`` uses Python's ``hash()``, which is salted anew in every process, so the same class scored a copied
cell 0.33 in one run and 0.54 in the next, and a pair was flagged or not by chance; a polynomial hash (Karp-Rabin,
as the winnowing paper has it) gives the same report every time. Every fingerprint of the lesson's released notebook
is *boilerplate* and discarded, so the given code, the stubs and the lesson's scaffolding never count. A fingerprint
more than :data:`COMMON_SHARE` of the class has in one cell (with at least :data:`COMMON_MIN_STUDENTS` students) is
how everyone writes that line, and counts for no pair.

A pair's per-cell similarity is the share of the smaller cell's fingerprints that the other cell also has; a cell with
fewer than :data:`MIN_FINGERPRINTS` fingerprints left is too short to tell anything and is not scored. A pair's
score is the sum of its cells' similarities of at least :data:`CELL_MATCH`, and it is *flagged* only when
:data:`MIN_CELLS` cells or more match: attention code converges to a few lines, so one alike cell proves nothing.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import keyword
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

K = 12  # characters of the filtered code per k-gram (a name is one character there): part of a short line
WINDOW = 4  # winnowing window: every shared run of K + WINDOW - 1 characters is found
COMMON_SHARE = 0.5  # a fingerprint in more than this share of a cell's students is the usual way to write it
COMMON_MIN_STUDENTS = 8  # ... judged so only with at least this many students in the cell
MIN_FINGERPRINTS = 4  # a cell with fewer fingerprints of the student's own is too short to compare
CELL_MATCH = 0.5  # a cell's similarity from which it counts for the pair
MIN_CELLS = 2  # cells that must match for a pair to be flagged
_BASE = 1_000_003  # the k-gram hash's base: a prime past every code point
MAX_PAIRS = 200  # pairs written to similarity.csv (the highest scores); the page shows fewer
MAX_CODE_CHARS = 20_000  # of one cell, fingerprinted (a longer cell is cut: nobody copies by the megabyte)

# Python's tokens, as far as fingerprints need them: comments, strings (an unterminated one runs to the end of its
# line, or of the cell for a triple quote), names, numbers, whitespace, and any other character alone.
_TOKEN = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)
                               |"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?))
  | (?P<name>[^\W\d]\w*)
  | (?P<number>\d[\w.]*)
  | (?P<space>\s+)
  | (?P<op>.)
""", re.VERBOSE)
_KEYWORDS = frozenset(keyword.kwlist)


@dataclass
class Fingerprint:
    """What copydetect's ``CodeFingerprint`` holds, from :func:`filtered` code: the hashes, each hash's positions in
    the filtered code, and where each filtered character came from in the raw code."""

    hashes: set
    hash_idx: dict
    origin: np.ndarray  # filtered position -> raw position


def filtered(code: str) -> tuple[str, np.ndarray]:
    """``code`` as fingerprints see it (copydetect's filter, for Python): no comment or whitespace, each name not a
    keyword ``V``, each string ``S``; and for each character kept, its position in ``code``."""
    out: list[str] = []
    origin: list[int] = []
    for match in _TOKEN.finditer(code):
        kind, text = match.lastgroup, match[0]
        if kind in ("comment", "space"):
            continue
        if kind == "string":
            text = "S"
        elif kind == "name" and text not in _KEYWORDS:
            text = "V"
        out.append(text)
        origin.extend(range(match.start(), match.start() + len(text)))
    return "".join(out), np.asarray(origin, dtype=np.int64)


def fingerprint(code: str, boilerplate: frozenset | None = None, limit: int = MAX_CODE_CHARS) -> Fingerprint:
    """The winnowed fingerprint of Python ``code`` (its first ``limit`` characters), without the ``boilerplate``
    hashes: copydetect's winnowing over :func:`filtered` code (imported here: copydetect imports matplotlib)."""
    from copydetect.utils import winnow

    text, origin = filtered(code[:limit])
    if len(text) < K:
        return Fingerprint(set(), {}, origin)
    hashes, positions = winnow(kgram_hashes(text), WINDOW, remove_duplicates=False)
    if boilerplate:
        kept = ~np.isin(hashes, np.fromiter(boilerplate, dtype=np.int64, count=len(boilerplate)))
        hashes, positions = hashes[kept], positions[kept]
    where: dict[int, list[int]] = defaultdict(list)  # copydetect's hash_idx: each hash's positions
    for value, position in zip(hashes.tolist(), positions.tolist()):
        where[value].append(position)
    return Fingerprint(set(where), dict(where), origin)


def kgram_hashes(text: str) -> np.ndarray:
    """The hash of every ``K``-character window of ``text`` (``len(text) - K + 1`` int64s): the polynomial
    ``sum(text[i + j] * BASE ** (K - 1 - j))`` modulo 2**64, the same in every process (unlike ``hash()``)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    windows = max(len(codes) - K + 1, 0)
    hashes = np.zeros(windows, dtype=np.uint64)
    with np.errstate(over="ignore"):  # modulo 2**64 is the point
        for offset in range(K):
            hashes = hashes * np.uint64(_BASE) + codes[offset:offset + windows]
    return hashes.view(np.int64)


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
        prints = {student: fingerprint(source).hashes - given for student, source in by_student.items()}
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
    ``find_fingerprint_overlap`` and ``get_copied_slices``, mapped back to the raw code)."""
    from copydetect.utils import find_fingerprint_overlap, get_copied_slices

    for match in pair.matched:
        given = _given(boilerplate.get(match.cell.split("/")[0], ""))
        first, second = (fingerprint(code[match.cell][who], given) for who in (pair.a, pair.b))
        overlap = find_fingerprint_overlap(first.hashes, second.hashes, first.hash_idx, second.hash_idx)
        match.slices = tuple(_raw_slices(get_copied_slices(idx, K), side.origin)
                             for idx, side in zip(overlap, (first, second)))


def _raw_slices(slices, origin: np.ndarray) -> np.ndarray:
    """copydetect's slices (2xN: starts, exclusive ends, in the filtered code) as positions in the raw code."""
    if len(slices) == 0 or len(slices[0]) == 0 or len(origin) == 0:
        return np.zeros((2, 0), dtype=np.int64)
    starts = origin[np.clip(slices[0].astype(np.int64), 0, len(origin) - 1)]
    ends = origin[np.clip(slices[1].astype(np.int64) - 1, 0, len(origin) - 1)] + 1
    return np.array([starts, ends])


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
