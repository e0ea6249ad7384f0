"""Toy sequence-to-sequence tasks made by code: digit copy, reverse and sort, and date normalisation.

Nothing is downloaded: every example comes from a seeded ``numpy.random.Generator``, so the same seed gives
the same data on every machine. Every task has a held-out split decided by a stable hash (see
:func:`split_of`), so no held-out example is ever seen in training.

Quick start (lesson 07)::

    task = get_task("reverse")
    for step, batch in zip(range(1000), task.batches(batch_size=128, seed=0)):
        batch["src_ids"]      # (B, S) int64, PAD after the real tokens
        batch["src_is_real"]  # (B, S) bool, True for real tokens
        batch["tgt_ids"]      # (B, T) int64, the target followed by EOS, then PAD
        batch["tgt_is_real"]  # (B, T) bool, True for the target and its EOS
    test = task.make_batch(task.make_pairs(500, rng=1, split="test"))

Tasks (``get_task(name)``)
    ``copy``     "30417" → "30417"
    ``reverse``  "30417" → "71403"
    ``sort``     "30417" → "01347"
    ``dates``    "the 3rd of march, 1999" → "1999-03-03", from the written formats of :data:`DATE_FORMATS`.

Every vocabulary is character-level and starts with the special tokens ``PAD``, ``BOS``, ``EOS`` (ids 0, 1, 2,
from :mod:`decoder_course.conventions`).

Real text for a language model (lessons 11 and 12): :func:`python_source_text` reads Python's own standard
library, which every Python installation holds, at run time (nothing is downloaded or committed)::

    text = python_source_text(max_chars=300_000)   # a fixed list of modules, read in order, then cut
"""

from __future__ import annotations

import datetime
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from decoder_course.conventions import BOS, EOS, PAD

if TYPE_CHECKING:
    import torch

__all__ = [
    "DATE_FORMATS",
    "DIGITS",
    "TASKS",
    "ToyTask",
    "Vocab",
    "as_rng",
    "format_date",
    "get_task",
    "make_batch",
    "python_source_text",
    "split_of",
]

# The printed names of the special tokens, at ids PAD, BOS, EOS.
SPECIAL_TOKEN_NAMES = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"}
DIGITS = "0123456789"
TASKS = ("copy", "reverse", "sort", "dates")
SPLITS = ("train", "test", "all")

# A seed or a generator: every function that draws random data accepts either.
RngLike = int | np.random.Generator | None
# One side of a pair: a string (one token per character) or a list of tokens.
TextLike = str | Sequence[str]


def as_rng(rng: RngLike) -> np.random.Generator:
    """An int seed (None: fresh entropy) as a ``numpy.random.Generator``; a generator passes through."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    raise TypeError(f"expected an int seed or a numpy.random.Generator, got {type(rng).__name__}")


# ------------------------------------------------------------------------------------------------------------
# Vocabulary
# ------------------------------------------------------------------------------------------------------------


class Vocab:
    """A token ↔ id table whose ids 0, 1, 2 are PAD, BOS, EOS, followed by the given tokens in order.

    With one-character tokens (the course's vocabularies) a string is encoded character by character and
    decoded by joining the characters; with longer tokens a string is split on whitespace and decoded with
    spaces.

    Shape:
        ``encode``: str or list of L tokens → list of L ids (L + 1 with ``add_eos``).
        ``decode``: ids (L,) → str. ``decode_batch``: ids (B, L) → list of B strings.
    """

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        specials = [SPECIAL_TOKEN_NAMES[i] for i in (PAD, BOS, EOS)]
        if sorted((PAD, BOS, EOS)) != [0, 1, 2]:
            raise ValueError("the special ids PAD, BOS, EOS must be 0, 1 and 2 in some order")
        if len(set(tokens)) != len(tokens):
            raise ValueError("tokens must be distinct")
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(f"every token must be a non-empty string, got {token!r}")
            if token in specials:
                raise ValueError(f"{token!r} is a special token; pass only the ordinary tokens")
        # id → token: the specials at their conventional ids, then the ordinary tokens.
        self.tokens: list[str] = [""] * 3 + tokens
        for special_id, name in SPECIAL_TOKEN_NAMES.items():
            self.tokens[special_id] = name
        self.token_to_id: dict[str, int] = {token: i for i, token in enumerate(self.tokens)}
        self.char_level = all(len(token) == 1 for token in tokens)
        self.pad_id, self.bos_id, self.eos_id = PAD, BOS, EOS

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self.token_to_id

    def __repr__(self) -> str:
        shown = "".join(self.tokens[3:]) if self.char_level else " ".join(self.tokens[3:])
        return f"Vocab(V={len(self)}, tokens={shown!r} after <pad> <bos> <eos>)"

    def split(self, text: TextLike) -> list[str]:
        """The tokens of ``text``: its characters, or its words for multi-character tokens."""
        if isinstance(text, str):
            return list(text) if self.char_level else text.split()
        return list(text)

    def encode(self, text: TextLike, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text`` (a string or a list of tokens), optionally with BOS first and EOS last.

        Shape:
            text of L tokens → list of L ids, plus one for each of ``add_bos`` and ``add_eos``.
        """
        try:
            ids = [self.token_to_id[token] for token in self.split(text)]
        except KeyError as exc:
            raise KeyError(f"token {exc.args[0]!r} of {text!r} is not in this vocabulary: {self!r}") from None
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, ids: Any) -> str:
        """The text of ``ids``: stops at the first EOS, skips PAD and BOS.

        Shape:
            ids: (L,) list, NumPy array or tensor → str.
        """
        if _is_tensor(ids):
            ids = ids.detach().cpu().reshape(-1).tolist()
        elif isinstance(ids, np.ndarray):
            ids = ids.reshape(-1).tolist()
        tokens = []
        for token_id in ids:
            token_id = int(token_id)
            if token_id == self.eos_id:
                break
            if token_id in (self.pad_id, self.bos_id):
                continue
            if not 0 <= token_id < len(self.tokens):
                raise IndexError(f"id {token_id} is outside this vocabulary of V = {len(self)} tokens")
            tokens.append(self.tokens[token_id])
        return ("" if self.char_level else " ").join(tokens)

    def decode_batch(self, ids: Any) -> list[str]:
        """Decode each row of a batch of ids.

        Shape:
            ids: (B, L) → list of B strings.
        """
        if _is_tensor(ids):
            ids = ids.detach().cpu().numpy()
        return [self.decode(row) for row in np.asarray(ids)]


# ------------------------------------------------------------------------------------------------------------
# Held-out split and batches
# ------------------------------------------------------------------------------------------------------------


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


def split_of(key: str, holdout: float = 0.1) -> str:
    """``"test"`` for about a ``holdout`` fraction of keys, ``"train"`` for the rest, by a stable hash.

    CRC-32 is the same on every machine and in every Python run (unlike ``hash``): a key always lands in the
    same split.
    """
    return "test" if zlib.crc32(key.encode("utf-8")) < holdout * 2**32 else "train"


def make_batch(
    pairs: Sequence[tuple[TextLike, TextLike]],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    pad_to: int | tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Encode (source, target) pairs into padded id tensors; the target gets EOS appended, neither gets BOS.

    ``pad_to`` pads to a fixed length, as an int for both sides or ``(S, T)``; by default each side is padded
    to its longest sequence in the batch. The decoder input (BOS + target, shifted right) is lesson 07's.

    The values are CPU tensors (lessons move them to their device), or NumPy arrays where torch is not
    installed (lessons 00–02 run without it).

    Shape:
        src_ids, src_is_real: (B, S); tgt_ids, tgt_is_real: (B, T), with T counting the EOS.
    """
    try:
        import torch  # here, not at the top: lessons 00–02 run without torch
    except ModuleNotFoundError:
        torch = None
    if len(pairs) == 0:
        raise ValueError("make_batch needs at least one pair")
    src_seqs = [src_vocab.encode(src) for src, _ in pairs]
    tgt_seqs = [tgt_vocab.encode(tgt, add_eos=True) for _, tgt in pairs]
    src_pad_to, tgt_pad_to = pad_to if isinstance(pad_to, tuple) else (pad_to, pad_to)
    src_ids, src_is_real = _pad(src_seqs, src_pad_to, "source")  # (B, S) each
    tgt_ids, tgt_is_real = _pad(tgt_seqs, tgt_pad_to, "target (with its EOS)")  # (B, T) each
    batch = {"src_ids": src_ids, "src_is_real": src_is_real, "tgt_ids": tgt_ids, "tgt_is_real": tgt_is_real}
    if torch is None:
        return batch
    return {name: torch.from_numpy(array) for name, array in batch.items()}  # on the CPU


def _pad(seqs: list[list[int]], pad_to: int | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Stack id lists into a PAD-filled (B, L) int64 array and its (B, L) is_real mask."""
    lengths = np.array([len(seq) for seq in seqs])
    longest = int(lengths.max())
    width = longest if pad_to is None else int(pad_to)
    if longest > width:
        raise ValueError(f"a {what} has {longest} tokens, more than pad_to = {width}")
    # is_real[b, i] is True for the first lengths[b] positions of row b.
    is_real = np.arange(width)[None, :] < lengths[:, None]  # (B, L)
    ids = np.full((len(seqs), width), PAD, dtype=np.int64)  # (B, L)
    # Row-major order of the True cells of is_real is exactly the order of the concatenated sequences.
    flat = np.fromiter((token for seq in seqs for token in seq), dtype=np.int64, count=int(lengths.sum()))
    ids[is_real] = flat
    return ids, is_real


# ------------------------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------------------------

# Draws n (source, target) pairs; the task filters them by split.
Sampler = Callable[[int, np.random.Generator], list[tuple[str, str]]]
# How many candidates a task draws at a time: fixed, so make_pairs(n) is a prefix of make_pairs(n + k).
_CHUNK = 256


@dataclass(frozen=True)
class ToyTask:
    """A toy seq2seq task: its vocabularies, longest lengths and a seeded generator of (source, target) pairs.

    The held-out split holds the examples whose ``split_key(source, target)`` hashes into the ``holdout``
    fraction (see :func:`split_of`); for the digit tasks the key is the source, for dates it is the date
    itself, so a held-out date never appears in training in any format.
    """

    name: str  # "copy", "reverse", "sort" or "dates"
    description: str  # one line with an example
    src_vocab: Vocab  # source tokens (characters)
    tgt_vocab: Vocab  # target tokens (characters)
    max_src_len: int  # longest source, in tokens
    max_tgt_len: int  # longest target, in tokens, without the EOS that make_batch appends
    sampler: Sampler = field(repr=False)  # draws candidate pairs, before the split filter
    # What the held-out split hashes, from (source, target): by default the source.
    split_key: Callable[[str, str], str] = field(default=lambda src, tgt: src, repr=False)
    holdout: float = 0.1  # fraction of keys in the held-out "test" split

    def make_pairs(self, n: int, rng: RngLike, split: str = "train") -> list[tuple[str, str]]:
        """``n`` (source, target) string pairs of ``split`` ("train", "test" or "all"), drawn with ``rng``.

        The same int seed gives the same pairs; a generator continues where it was. Pairs may repeat.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        rng = as_rng(rng)
        pairs: list[tuple[str, str]] = []
        while len(pairs) < n:
            for src, tgt in self.sampler(_CHUNK, rng):
                if split == "all" or split_of(self.split_key(src, tgt), self.holdout) == split:
                    pairs.append((src, tgt))
        return pairs[:n]

    def make_batch(self, pairs: Sequence[tuple[TextLike, TextLike]], pad_to=None) -> dict[str, torch.Tensor]:
        """:func:`make_batch` with this task's vocabularies."""
        return make_batch(pairs, self.src_vocab, self.tgt_vocab, pad_to=pad_to)

    def batches(
        self, batch_size: int, seed: RngLike = 0, split: str = "train", pad_to=None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """An endless stream of fresh batches (see :func:`make_batch`) for a training loop.

        Shape:
            each batch: src_ids, src_is_real (B, S); tgt_ids, tgt_is_real (B, T), with B = batch_size.
        """
        rng = as_rng(seed)
        while True:
            yield self.make_batch(self.make_pairs(batch_size, rng, split=split), pad_to=pad_to)


def _digit_sampler(transform: Callable[[str], str], min_len: int, max_len: int) -> Sampler:
    """A sampler of random digit strings of length in [min_len, max_len] and their transform."""

    def sample_digits(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
        lengths = rng.integers(min_len, max_len + 1, size=n)  # (n,)
        # Digits as ASCII bytes: one row per example, cut to its length below.
        codes = (rng.integers(0, 10, size=(n, max_len)) + ord("0")).astype(np.uint8)  # (n, max_len)
        sources = [row[:length].tobytes().decode("ascii") for row, length in zip(codes, lengths, strict=True)]
        return [(src, transform(src)) for src in sources]

    return sample_digits


def _digit_task(
    name: str, transform: Callable[[str], str], example: str, min_len: int, max_len: int
) -> ToyTask:
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    vocab = Vocab(DIGITS)
    return ToyTask(
        name=name,
        description=f"{example!r} → {transform(example)!r}: digit strings of length {min_len} to {max_len}",
        src_vocab=vocab,
        tgt_vocab=vocab,
        max_src_len=max_len,
        max_tgt_len=max_len,
        sampler=_digit_sampler(transform, min_len, max_len),
    )


# ------------------------------------------------------------------------------------------------------------
# Dates
# ------------------------------------------------------------------------------------------------------------

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
MONTH_ABBREVIATIONS = tuple(month[:3] for month in MONTHS)


def _ordinal(day: int) -> str:
    """3 → "3rd", 11 → "11th", 22 → "22nd"."""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


# The written formats of the dates task, each with how 3 March 1999 reads. All are unambiguous: either the
# month is a word, or the numbers run year-month-day. (Day/month orders such as 03/04/1999 and two-digit years
# are left out: their date depends on a convention the source does not state.)
_DATE_RENDERERS: dict[str, Callable[[int, int, int], str]] = {
    "month_day_year": lambda y, m, d: f"{MONTHS[m - 1]} {d}, {y}",  # march 3, 1999
    "month_ordinal_year": lambda y, m, d: f"{MONTHS[m - 1]} {_ordinal(d)}, {y}",  # march 3rd, 1999
    "day_month_year": lambda y, m, d: f"{d} {MONTHS[m - 1]} {y}",  # 3 march 1999
    # the 3rd of march, 1999
    "the_ordinal_of_month": lambda y, m, d: f"the {_ordinal(d)} of {MONTHS[m - 1]}, {y}",
    "abbr_day_year": lambda y, m, d: f"{MONTH_ABBREVIATIONS[m - 1]} {d} {y}",  # mar 3 1999
    "abbr_dot_day_year": lambda y, m, d: f"{MONTH_ABBREVIATIONS[m - 1]}. {d}, {y}",  # mar. 3, 1999
    "day_abbr_year_dashes": lambda y, m, d: f"{d}-{MONTH_ABBREVIATIONS[m - 1]}-{y}",  # 3-mar-1999
    "padded_day_abbr_year": lambda y, m, d: f"{d:02d} {MONTH_ABBREVIATIONS[m - 1]} {y}",  # 03 mar 1999
    "ymd_dots": lambda y, m, d: f"{y}.{m:02d}.{d:02d}",  # 1999.03.03
    "ymd_slashes": lambda y, m, d: f"{y}/{m}/{d}",  # 1999/3/3
}
# Format name → how 3 March 1999 reads in it.
DATE_FORMATS: dict[str, str] = {name: render(1999, 3, 3) for name, render in _DATE_RENDERERS.items()}


def format_date(date: datetime.date, fmt: str) -> str:
    """``date`` written in the format named ``fmt`` (a key of :data:`DATE_FORMATS`), lower case."""
    if fmt not in _DATE_RENDERERS:
        raise KeyError(f"unknown date format {fmt!r}; the formats are {list(DATE_FORMATS)}")
    return _DATE_RENDERERS[fmt](date.year, date.month, date.day)


def _dates_task(
    formats: Sequence[str] | None = None, first_year: int = 1950, last_year: int = 2049, holdout: float = 0.1
) -> ToyTask:
    formats = tuple(DATE_FORMATS) if formats is None else tuple(formats)
    for fmt in formats:
        if fmt not in _DATE_RENDERERS:
            raise KeyError(f"unknown date format {fmt!r}; the formats are {list(DATE_FORMATS)}")
    if not 1000 <= first_year <= last_year <= 9999:
        raise ValueError("need four-digit years with first_year <= last_year")
    first = datetime.date(first_year, 1, 1).toordinal()
    last = datetime.date(last_year, 12, 31).toordinal()

    def sample_dates(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
        days = rng.integers(first, last + 1, size=n)  # (n,) proleptic Gregorian ordinals
        which = rng.integers(0, len(formats), size=n)  # (n,) index into formats
        pairs = []
        for ordinal, k in zip(days.tolist(), which.tolist(), strict=True):
            date = datetime.date.fromordinal(ordinal)
            pairs.append((_DATE_RENDERERS[formats[k]](date.year, date.month, date.day), date.isoformat()))
        return pairs

    # Every month and day in every format, with a four-digit year: the characters and the longest source.
    every_written = [render(2000, m, d) for render in _DATE_RENDERERS.values() for m in range(1, 13)
                     for d in range(1, 32)]
    chosen_written = [_DATE_RENDERERS[fmt](2000, m, d) for fmt in formats for m in range(1, 13)
                      for d in range(1, 32)]
    # The source vocabulary covers all formats, so a model trained on some can still read the others.
    characters = sorted(set("".join(every_written)) | set(DIGITS))
    return ToyTask(
        name="dates",
        description=f"{DATE_FORMATS['the_ordinal_of_month']!r} → '1999-03-03': {len(formats)} written "
                    f"formats, years {first_year}–{last_year}",
        src_vocab=Vocab(characters),
        tgt_vocab=Vocab(DIGITS + "-"),
        max_src_len=max(len(text) for text in chosen_written),
        max_tgt_len=len("1999-03-03"),
        sampler=sample_dates,
        split_key=lambda src, tgt: tgt,  # split by the date: a held-out date is held out in every format
        holdout=holdout,
    )


def get_task(name: str, **options: Any) -> ToyTask:
    """The toy task called ``name`` ("copy", "reverse", "sort" or "dates").

    Options: the digit tasks take ``min_len`` (default 3) and ``max_len`` (default 10); ``dates`` takes
    ``formats`` (names from :data:`DATE_FORMATS`, default all), ``first_year`` (1950) and ``last_year``
    (2049).
    """
    if name == "dates":
        return _dates_task(**options)
    transforms = {
        "copy": lambda s: s,
        "reverse": lambda s: s[::-1],
        "sort": lambda s: "".join(sorted(s)),
    }
    if name not in transforms:
        raise KeyError(f"unknown task {name!r}; the tasks are {TASKS}")
    min_len = options.pop("min_len", 3)
    max_len = options.pop("max_len", 10)
    if options:
        raise TypeError(f"unexpected options for {name!r}: {sorted(options)}")
    return _digit_task(name, transforms[name], "30417", min_len, max_len)


# -- real text: Python's standard library, read where Python is installed --------------------------------------------
# Modules present in every CPython 3.9-3.13, read in this order: plain, well-commented library code (no tests, no
# generated tables). Python's own source is under the PSF licence and is never copied into this repository.
PYTHON_SOURCE_FILES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "code.py", "codecs.py",
    "colorsys.py", "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py",
    "dis.py", "enum.py", "filecmp.py", "fnmatch.py", "fractions.py", "functools.py", "getopt.py", "gettext.py",
    "glob.py", "gzip.py", "heapq.py", "hmac.py", "inspect.py", "ipaddress.py", "keyword.py", "linecache.py",
    "locale.py", "numbers.py", "operator.py", "optparse.py", "pathlib.py", "pprint.py", "queue.py", "random.py",
    "reprlib.py", "sched.py", "secrets.py", "selectors.py", "shlex.py", "shutil.py", "statistics.py",
    "string.py", "textwrap.py", "threading.py", "timeit.py", "tokenize.py", "traceback.py", "types.py",
    "typing.py", "uuid.py", "warnings.py", "weakref.py", "zipfile.py",
)  # fmt: skip


def python_source_text(max_chars: int | None = 300_000, files: Sequence[str] = PYTHON_SOURCE_FILES) -> str:
    """Python source code from this interpreter's standard library: ``files`` read in order, joined, then cut.

    The files are found beside the ``os`` module (``Path(os.__file__).parent``); a name missing there is skipped,
    so the text depends only on the Python version. Files are joined by a blank line; ``max_chars`` (None: no
    limit) cuts the result at a line end, so no line is cut in half. Read as UTF-8 (undecodable bytes, if any,
    become U+FFFD).

    Shape:
        -> str of at most ``max_chars`` characters
    """
    import os
    from pathlib import Path

    root = Path(os.__file__).parent
    parts, total = [], 0
    for name in files:
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace").strip("\n") + "\n\n"
        parts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    text = "".join(parts)
    if max_chars is not None and len(text) > max_chars:
        text = text[: text.rfind("\n", 0, max_chars) + 1]  # end on a whole line
    if not text:
        raise FileNotFoundError(f"none of the standard library files were found in {root}")
    return text
