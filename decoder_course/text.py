"""Text that came out of a student's kernel or files, made safe to show: a terminal, a log, a CSV, a web page.

A kernel's stderr, an exception message, a file name in a zip: any of them may hold terminal escape sequences
(clear the screen, retitle the window, move the cursor to print a fake score), other control characters, or
Unicode direction overrides that reorder what a reader sees. :func:`shown` writes each such character as a visible
``\\x1b``-style escape, so the text reads the same everywhere and does nothing. :func:`csv_cell` also keeps a
spreadsheet from reading a cell as a formula.
"""

from __future__ import annotations

import re

__all__ = ["csv_cell", "shown", "without_escapes"]

# C0 controls but tab and newline, DEL, C1 controls, and the Unicode format characters that reorder or hide text.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
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


def csv_cell(value: object) -> object:
    """A value for a CSV cell: numbers as they are, text escaped and never read as a spreadsheet formula."""
    if isinstance(value, (int, float)):
        return value
    text = shown(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
