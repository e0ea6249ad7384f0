"""Text that came out of a student's kernel or files, made safe to show: a terminal, a log, a CSV, a web page.

A kernel's stderr, an exception message, a file name in a zip: any of them may hold terminal escape sequences
(clear the screen, retitle the window, move the cursor to print a fake score), other control characters, or
Unicode direction overrides that reorder what a reader sees. :func:`shown` writes each such character as a visible
``\\x1b``-style escape, so the text reads the same everywhere and does nothing. :func:`csv_cell` also keeps a
spreadsheet from reading a cell as a formula, whatever separator it splits the file on, and :func:`csv_writer` is
the one way the course writes a CSV.
"""

from __future__ import annotations

import csv
import re
import unicodedata

__all__ = ["csv_cell", "csv_writer", "shown", "without_escapes"]

# C0 controls but tab and newline, DEL, C1 controls, the Unicode format characters that reorder or hide text, and
# lone surrogates (a file name's undecodable bytes, as Python's surrogateescape reads them: no encoder writes them).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufeff]")
_LINES = re.compile("[\t\n]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, multiline: bool = False) -> str:
    """``text`` with every control or direction-changing character written as an escape (``\\x1b``, ``\\u202e``);
    newlines and tabs kept only when ``multiline``."""
    text = _UNSAFE.sub(_escape, str(text))
    return text if multiline else _LINES.sub(_escape, text)


# Terminal escapes: CSI (colours, cursor moves), OSC (titles, links), any other ESC pair, and C0 controls.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?"
                      r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def without_escapes(text: str) -> str:
    """``text`` with its terminal escapes and control characters removed (a traceback's colours, say)."""
    return _ESCAPES.sub("", text)


# What a spreadsheet reads as the start of a formula (OWASP's CSV injection list: = + - @, tab, carriage return),
# and after NFKC normalisation their full-width and small look-alikes (＝ ＋ － ＠ ﹦ ﹢ ﹣ ﹫), which some spreadsheets
# turn into the ASCII ones as they read a cell; the minus sign (−) too.
_FORMULA_START = frozenset("=+-@\t\r\u2212")
# Where a spreadsheet may start a cell: the field's start, and after every separator one may guess (comma,
# semicolon, tab) or a line break. Tabs and line breaks never reach a cell (shown() escapes them).
_PIECE = re.compile(r"(?:^|(?<=[,;\t\r\n]))[ \"]*(.)", re.S)


def _starts_formula(char: str) -> bool:
    return char in _FORMULA_START or unicodedata.normalize("NFKC", char)[:1] in _FORMULA_START


def csv_cell(value: object) -> object:
    """A value for a CSV cell: numbers as they are, text escaped and never read as a spreadsheet formula, whatever
    separator a spreadsheet splits the file on.

    A cell safe when read with ``,`` may hold ``;`` followed by ``=cmd|...`` (the cell a spreadsheet that guesses
    ``;`` makes of it). So every piece a separator (``,`` ``;`` tab) could start, after spaces and double quotes,
    begins with an apostrophe when it would begin with a formula's first character: the text keeps every character
    and reads the same (the apostrophe marks text, and shows only where a reader looks for it); replacing the
    separators instead would change names and the messages' ``; `` lists. Already neutral text is left alone (the
    function may be applied twice)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return _PIECE.sub(lambda piece: "'" + piece.group(0) if _starts_formula(piece.group(1)) else piece.group(0),
                      shown(value))


def csv_writer(handle):
    """The course's CSV writer: ``csv.writer`` whose every cell goes through :func:`csv_cell`, so no writer of a
    CSV can forget a cell (grades.csv, roster.csv, nbgrader's export)."""
    return _SafeWriter(csv.writer(handle))


class _SafeWriter:
    def __init__(self, writer):
        self._writer = writer

    def writerow(self, row) -> None:
        self._writer.writerow([csv_cell(cell) for cell in row])

    def writerows(self, rows) -> None:
        for row in rows:
            self.writerow(row)
