"""The grader's name for :mod:`decoder_course.text`, the one sanitiser of text that came out of a student's kernel
or files (the public package holds it, so that ``python -m decoder_course check`` uses it too)."""

from decoder_course.text import csv_cell, csv_writer, shown, without_escapes

__all__ = ["csv_cell", "csv_writer", "shown", "without_escapes"]
