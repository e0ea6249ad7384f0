"""Feedback HTML that is inert and unforgeable: the last preprocessor of nbgrader's ``GenerateFeedback``.

The feedback page is opened by the instructor (and, through ``release_feedback``, by the student), so nothing a
student controls may run or style anything in it, and nothing a student prints may pass for the grader's verdict.
:class:`SafeFeedback` runs after ``GetGrades`` and ``StripHiddenTests`` (see :func:`autograder.grading.pipeline
.nbgrader_config`) and does two things:

1. **Sanitise every student-controlled part** of the autograded notebook with ``nh3`` (the Ammonia sanitiser):

   - outputs: ``text/plain``, ``image/png``, ``image/jpeg`` (valid base64 only) and ``text/latex`` (the template
     escapes it) are kept; ``text/html`` is sanitised; ``text/markdown`` is rendered, then sanitised, as HTML;
     ``image/svg+xml`` is shown as an ``<img>`` of a ``data:`` URL (an SVG loaded as an image runs no script and
     loads nothing); every other type (``application/javascript``, widget views, anything with ``javascript`` in
     its name, PDF, …) is dropped and replaced by a one-line note. Output metadata is rebuilt (numeric image width
     and height only): the template writes it unquoted into ``<img>`` tags, and ``isolated`` would make an iframe;
   - markdown cells: nbconvert's markdown rendering passes raw HTML through, so each cell is rendered here with
     nbconvert's own renderer, sanitised, and put back as one HTML block the template's renderer leaves unchanged
     (checked for every cell; a cell that would not survive is shown as escaped text instead);
   - raw cells: sanitised the same way (nbconvert writes ``text/html`` raw cells as they are);
   - text (streams, tracebacks, ``text/plain``): terminal escapes removed, since nbconvert turns colour codes
     into inline styles (and a title or cursor escape means nothing in a page);
   - cell and notebook metadata: only the (instructor-restored) ``nbgrader`` metadata is kept, so tags cannot add
     CSS classes (``hidden``) to a cell and ``widgets`` state cannot load widget JavaScript.

   Cell sources need nothing: the template highlights them with Pygments, which escapes them.
   The sanitised HTML keeps structure (headings, lists, tables, code, links, ``data:`` images) and loses every
   script, event handler, ``style`` tag and attribute, ``class`` (but a few harmless ones), ``id``/``name``
   (which could hijack the page's anchors), ``javascript:``/``data:`` links, remote images (no tracking pixel),
   iframes, forms, objects, embeds, SVG and MathML.

2. **Write the grader's verdicts where student content cannot reach or imitate them**:

   - a report at the top of the page (item, points, passed/failed, the verdict's message) made from the
     gradebook's scores (``GetGrades``) and the verdict outputs that :func:`autograder.judge.verdicts.apply` wrote
     into each graded cell, never from student text;
   - in each graded cell, that verdict output is replaced by a box headed "Grader's verdict".

   Both are coloured, bordered boxes made with inline styles, which no student content can have (every student
   ``style`` is removed, every student text escaped), and both carry a **seal**: a random code drawn when the page
   is made, after the notebook ran, so no notebook can print it. The report says so. A student output that
   mentions hidden checks or the grader's verdict is shown in a grey dashed frame labelled as the notebook's own
   output.

formgrader's view of a submission (the autograded notebook, in the instructor's Jupyter session) is sanitised the
same way by :class:`SafeFormgrade`, in :class:`FormgradeExporter` (``pipeline.tools_config`` makes formgrader build
it); its verdicts are sealed boxes too, its score inputs and comment boxes work as before.

Both pages are made within a bound (:class:`BoundedExporter`): the preprocessors and the template run in a forked
child with a time, memory and size limit; past one, the page is plain text made without the template, and says why.

The page is written by :class:`FeedbackExporter` (``GenerateFeedback.exporter_class``): nbconvert's
``HTMLExporter`` without its BeautifulSoup round trip, which re-parsed the whole page only to give ``<img>`` tags
an ``alt`` and lab-template cells a ``tabindex`` (most of the time feedback took). It makes the same edits on the
template's text, or leaves the page to nbconvert's own pass where markup is not plainly read.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import resource
import secrets
import select
import signal
import time
import unicodedata
from pathlib import Path

import jinja2
import nbformat
import nh3
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbformat import NotebookNode
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor
from pygments.token import STANDARD_TYPES
from traitlets import Float, Int

from autograder.course.checks.framework import PASSED_MESSAGE
from autograder.judge.preprocessors import note
from autograder.judge.verdicts import FAILED_NAME, PASSED_PREFIX
from autograder.term import schedule as term_module
from decoder_course.text import shown, without_escapes

__all__ = ["BoundedExporter", "FeedbackExporter", "FormgradeExporter", "SafeFeedback", "SafeFormgrade", "Unrendered",
           "accessibility_edits", "bounded", "imitates_verdict", "markdown_block", "plain_cells", "plain_page",
           "sanitize_html", "sanitize_output"]

# -- the sanitiser ---------------------------------------------------------------------------------------------
TAGS = {
    "a", "abbr", "b", "bdi", "bdo", "blockquote", "br", "caption", "cite", "code", "col", "colgroup", "dd", "del",
    "details", "dfn", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i",
    "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strike", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "time", "tr", "tt", "u", "ul", "var",
    "wbr",
}
# Removed with everything inside them (the rest of the unknown tags are removed, their text kept).
DROPPED_WITH_CONTENT = {
    "script", "style", "template", "noscript", "iframe", "frame", "frameset", "object", "embed", "applet", "svg",
    "math", "textarea", "select", "title", "head", "xmp", "noembed", "noframes", "canvas", "audio", "video",
}
ATTRIBUTES = {
    "a": {"href", "title"},
    "abbr": {"title"},
    "img": {"src", "alt", "title", "width", "height"},
    "table": {"border"},
    "th": {"colspan", "rowspan", "scope", "align"},
    "td": {"colspan", "rowspan", "align"},
    "col": {"span"},
    "colgroup": {"span"},
    "ol": {"start"},
    "details": {"open"},
    "time": {"datetime"},
}
# Classes that only colour text (Pygments tokens in highlighted code): none can hide or move anything.
CLASSES = {
    "span": {name for name in STANDARD_TYPES.values() if name},
    "div": {"highlight"},
}
_IMAGE_SRC = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
_NUMBER = re.compile(r"\d{1,4}%?")


def _attribute(tag: str, attribute: str, value: str) -> str | None:
    """Attribute values a student may set: images only from data: URLs, links never to data:, small numbers."""
    if attribute == "src":
        return value if tag == "img" and _IMAGE_SRC.fullmatch(value.strip()) else None
    if attribute == "href":
        return None if value.strip().lower().startswith("data:") else value
    if attribute in ("width", "height", "border", "colspan", "rowspan", "span", "start"):
        return value if _NUMBER.fullmatch(value.strip()) else None
    return value


_CLEANER = nh3.Cleaner(
    tags=TAGS, clean_content_tags=DROPPED_WITH_CONTENT, attributes=ATTRIBUTES, attribute_filter=_attribute,
    allowed_classes=CLASSES, url_schemes={"http", "https", "mailto", "data"}, strip_comments=True,
)


# nh3's output quotes every attribute value with "..." (a " inside is &quot;), so this matches whole tags.
_IMG = re.compile(r'<img((?:\s+[a-zA-Z-]+(?:="[^"]*")?)*)\s*/?>')
_ALT = re.compile(r'\salt="([^"]*)"')


def _unshown_image(tag: re.Match) -> str:
    """An image whose source was removed (remote, relative, not an image) becomes a note saying so."""
    if ' src="' in tag.group(1):
        return tag.group(0)
    alt = _ALT.search(tag.group(1))
    return f"<em>[image not shown in the feedback{': ' + alt.group(1) if alt and alt.group(1) else ''}]</em>"


def sanitize_html(text: str) -> str:
    """Student HTML without anything that runs, styles, hides, navigates on its own or loads from elsewhere."""
    return _IMG.sub(_unshown_image, _CLEANER.clean(text))


def _markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown to HTML exactly as the feedback template's ``markdown2html`` filter does it (raw HTML kept)."""
    # No heading anchors: the sanitiser removes the ids they point at (an id could hijack the page's own links).
    renderer = IPythonRenderer(escape=False, attachments=attachments or {}, embed_images=False,
                               exclude_anchor_links=True)
    return MarkdownWithMath(renderer=renderer).render(source)


def markdown_block(safe_html: str) -> str:
    """Markdown whose rendering by the template is exactly ``<div>safe_html</div>``.

    One line (newlines become ``&#10;``, the same character to an HTML parser) opening with ``<div>`` is a
    single raw HTML block, which the markdown renderer passes through untouched. Raises ValueError when the
    renderer would change it.
    """
    block = "<div>" + safe_html.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "&#10;") + "</div>"
    if _markdown(block).strip() != block:
        raise ValueError("the markdown renderer would change this block")
    return block


def _escaped_block(text: str, note: str) -> str:
    return markdown_block(f"<p><em>{html.escape(note)}</em></p><pre>{html.escape(text)}</pre>")


def safe_markdown(source: str, attachments: dict | None = None) -> str:
    """A markdown cell's source, rendered, sanitised and made into a block the template shows as it is."""
    try:
        return markdown_block(sanitize_html(_markdown(source, attachments)))
    except Exception:  # a block the renderer would alter, a renderer error: show the source as text
        return _escaped_block(source, "This cell's markdown could not be shown safely; here is its text:")


# -- outputs ---------------------------------------------------------------------------------------------------
KEPT = ("text/plain", "image/png", "image/jpeg", "text/latex")


def _joined(value) -> str:
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return value if isinstance(value, str) else str(value)


def _plain(value) -> str:
    """Student text without terminal escapes: nbconvert would turn its colour codes into inline styles."""
    return without_escapes(_joined(value))


def _image_metadata(metadata) -> NotebookNode:
    """Numeric width and height of images only: the template writes them unquoted into ``<img>`` tags."""
    kept = NotebookNode()
    if not isinstance(metadata, dict):
        return kept
    for mime in ("image/png", "image/jpeg"):
        given = metadata.get(mime)
        if not isinstance(given, dict):
            continue
        sizes = {key: int(given[key]) for key in ("width", "height")
                 if isinstance(given.get(key), (int, float)) and not isinstance(given.get(key), bool)
                 and 0 < given[key] <= 10000}
        if sizes:
            kept[mime] = NotebookNode(sizes)
    return kept


def _note(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text)


def sanitize_output(output) -> NotebookNode:
    """One output rebuilt from its known fields, with only the MIME types the feedback may show."""
    kind = output.get("output_type")
    if kind == "stream":
        name = output.get("name") if output.get("name") in ("stdout", "stderr") else "stdout"
        return NotebookNode(output_type="stream", name=name, text=_plain(output.get("text", "")))
    if kind == "error":
        traceback = [_plain(line) for line in output.get("traceback") or []]
        return NotebookNode(output_type="error", ename=_plain(output.get("ename", "")),
                            evalue=_plain(output.get("evalue", "")), traceback=traceback)
    if kind not in ("display_data", "execute_result"):
        return _note(f"[an output of type {str(kind)[:40]!r} is not shown in the feedback]\n")
    data = output.get("data") or {}
    kept, dropped = NotebookNode(), []
    for mime, value in data.items():
        value = _joined(value)
        if mime in KEPT:
            if mime.startswith("image/") and not _BASE64.fullmatch(value):
                dropped.append(mime)
                continue
            kept[mime] = _plain(value) if mime == "text/plain" else value
        elif mime == "text/html":
            kept[mime] = sanitize_html(value)
        else:
            dropped.append(mime)
    if "text/html" not in kept and "text/markdown" in data:
        kept["text/html"] = sanitize_html(_markdown(_joined(data["text/markdown"])))
        dropped.remove("text/markdown")
    if "text/html" not in kept and "image/svg+xml" in data:
        svg = base64.b64encode(_joined(data["image/svg+xml"]).encode("utf-8", "replace")).decode("ascii")
        kept["text/html"] = f'<img src="data:image/svg+xml;base64,{svg}" alt="an SVG image">'
        dropped.remove("image/svg+xml")
    if not kept or set(kept) == {"text/plain"} and dropped:
        shown = ", ".join(sorted({str(m)[:60] for m in dropped})) or "empty"
        kept["text/plain"] = (kept.get("text/plain", "") + "\n" if kept.get("text/plain") else "") + \
            f"[not shown in the feedback: {shown} output]"
    rebuilt = NotebookNode(output_type="display_data", data=kept, metadata=_image_metadata(output.get("metadata")))
    if kind == "execute_result":
        rebuilt.output_type = "execute_result"
        count = output.get("execution_count")
        rebuilt.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
    return rebuilt


def _grading_metadata(cell) -> NotebookNode:
    """A cell's metadata as a page may use it: only the (instructor-restored) ``nbgrader`` part, so that tags
    cannot add CSS classes (``hidden``) to a cell."""
    grading = cell.get("metadata", {}).get("nbgrader")
    keep = isinstance(grading, dict) and (grading.get("grade_id") or any(
        grading.get(flag) for flag in ("grade", "solution", "task", "locked")))
    return NotebookNode(nbgrader=grading) if keep else NotebookNode()


# -- plain text: the page of a notebook that could not be rendered within the bound ------------------------------
PLAIN_CHARS = 20_000  # of each cell's source and of each output's text
PLAIN_OUTPUTS = 50  # of each cell


def _cut(text: str) -> str:
    text = without_escapes(text)
    if len(text) <= PLAIN_CHARS:
        return text
    return text[:PLAIN_CHARS] + f"\n[… {len(text) - PLAIN_CHARS} more characters not shown]"


def _plain_output(output) -> NotebookNode:
    """An output as one stream of text: its text, or a note naming what it held."""
    kind = output.get("output_type")
    if kind == "stream":
        return _note(_cut(_joined(output.get("text", ""))))
    if kind == "error":
        return _note(_cut(f"{_joined(output.get('ename', ''))}: {_joined(output.get('evalue', ''))}\n"))
    data = output.get("data") or {}
    if isinstance(data, dict) and "text/plain" in data:
        return _note(_cut(_joined(data["text/plain"])) + "\n")
    kinds = ", ".join(sorted(str(m)[:60] for m in data)[:5]) if isinstance(data, dict) else ""
    return _note(f"[an output ({kinds or kind}) not shown: this page is plain text]\n")


def plain_cells(cells: list) -> list[NotebookNode]:
    """``cells`` as plain text, without parsing any of their markup: sources and output texts escaped and cut at
    :data:`PLAIN_CHARS`, at most :data:`PLAIN_OUTPUTS` outputs a cell, markdown and raw cells shown as their text,
    every rich output replaced by its plain text or a note. Grading metadata stays, so the grader's boxes and
    formgrader's inputs still find their cells."""
    kept = []
    for cell in cells:
        source = _cut(_joined(cell.get("source", "")))
        if cell.get("cell_type") == "code":
            outputs = cell.get("outputs", [])
            shown_outputs = [_plain_output(out) for out in outputs[:PLAIN_OUTPUTS]]
            if len(outputs) > PLAIN_OUTPUTS:
                shown_outputs.append(_note(f"[… {len(outputs) - PLAIN_OUTPUTS} more outputs not shown]\n"))
            kept.append(NotebookNode(cell_type="code", metadata=_grading_metadata(cell), source=source,
                                     execution_count=None, outputs=shown_outputs))
        else:
            kept.append(NotebookNode(cell_type="markdown", metadata=_grading_metadata(cell),
                                     source=markdown_block(f"<pre>{html.escape(source)}</pre>")))
    return kept


def _plain_note(reason: str, page: str) -> NotebookNode:
    """The note at the top of a plain page: why, and what the page still shows."""
    text = (f"This notebook's {page} page is plain text: {reason}. Its outputs and markdown are shown as text, "
            f"cut at {PLAIN_CHARS:,} characters each; scores and verdicts are as graded.")
    if page == "formgrader":
        text += (" formgrader's score and comment boxes are not on this page: open the autograded notebook in "
                 "JupyterLab to read it in full.")
    return NotebookNode(cell_type="markdown", metadata=NotebookNode(), id="course-plain-note",
                        source=markdown_block(
                            f'<div data-course-grader="plain-note" style="border:2px solid {RED};padding:6px 10px;'
                            f'margin:6px 0;{FONT};color:#111">{html.escape(text)}</div>'))


# -- what only the grader writes -------------------------------------------------------------------------------
# verdicts.apply: a passed item's last output is this stream; a failed item's verdict is the only error output of
# its cell (apply turns every error the kernel raised into text), named HiddenCheckFailed.
PASSED = re.compile(re.escape(PASSED_PREFIX) + "(" + re.escape(PASSED_MESSAGE).replace(r"\{n\}", r"\d+") + r")\n?")
_CONFUSABLE = str.maketrans("аеіјоорсухнкмтвԁһ", "aeijoopcyxhkmtbdh")  # Cyrillic letters that look Latin
_VERDICT_WORDS = ("hiddencheck", "graderverdict", "gradersverdict", "graderreport", "gradersreport")


def imitates_verdict(text: str) -> bool:
    """Whether student text reads like a verdict: it mentions hidden checks or the grader's verdict or report
    (case, accents, zero-width characters, Cyrillic look-alikes and punctuation ignored)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cf", "Mn")).casefold()
    letters = re.sub(r"[^a-z]", "", text.translate(_CONFUSABLE))
    return any(word in letters for word in _VERDICT_WORDS)


def _output_text(output: NotebookNode) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback) + f"\n{output.ename}: {output.evalue}"
    data = output.get("data", {})
    html_text = re.sub(r"<[^>]*>", "", data.get("text/html", ""))
    return "\n".join([data.get("text/plain", ""), html.unescape(html_text), data.get("text/latex", "")])


FONT = "font-family:'Helvetica Neue',Helvetica,Arial,sans-serif"
MONO = "font-family:Menlo,Consolas,'DejaVu Sans Mono',monospace"
GREEN, RED, GREY, NAVY = "#1b7a34", "#b3261e", "#6b6b6b", "#1d3557"


def _points(value) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return "?"


class SafeFeedback(NbGraderPreprocessor):
    """Sanitise the student's notebook, then add the grader's report and verdict boxes (see the module doc).

    When :class:`BoundedExporter` could not make the page within its bound it runs the preprocessors in its own
    process with ``resources["course_plain"]`` set to why: every student part is then kept only as truncated
    plain text (:func:`plain_cells`), so nothing of it is parsed as markup, and a note under the report says so."""

    shows_points = True  # the report and the boxes give each item's points (GetGrades ran before)

    def preprocess(self, nb: NotebookNode, resources: dict):
        verdicts, plain = self._student_part(nb, resources)
        rows = [row for cell, verdict in zip(nb.cells, verdicts) if (row := self._row(cell, verdict)) is not None]
        if plain:
            nb.cells.insert(0, _plain_note(plain, "feedback"))
        nb.cells.insert(0, NotebookNode(cell_type="markdown", metadata=NotebookNode(), id="course-grader-report",
                                        source=self._report(rows, resources)))
        return nb, resources

    def _student_part(self, nb: NotebookNode, resources: dict) -> tuple[list, str | None]:
        """Draw the seal, take the verdicts out of the cells, sanitise the rest (or keep it as plain text); the
        verdicts by cell, and why the page is plain (None when it is not)."""
        seal = "-".join(secrets.token_hex(2).upper() for _ in range(2))
        resources.setdefault("course_feedback", {})["seal"] = seal
        self._seal = seal
        meta = nb.get("metadata", {})
        nb.metadata = NotebookNode({key: meta[key] for key in ("kernelspec",) if key in meta})
        nb.metadata.language_info = NotebookNode(name="python", pygments_lexer="ipython3")
        verdicts = [self._take_verdict(cell) for cell in nb.cells]  # first: the rest is sanitised and labelled next
        plain = resources.get("course_plain")
        if plain:
            nb.cells = plain_cells(nb.cells)
            resources["course_plain_done"] = True
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs = [self._mark(out) for out in cell.outputs]
        else:
            for cell in nb.cells:
                self._sanitize_cell(cell)
        return verdicts, plain

    # -- the student's part ----------------------------------------------------------------------------------
    def _sanitize_cell(self, cell: NotebookNode) -> None:
        cell.metadata = _grading_metadata(cell)
        cell.source = _joined(cell.get("source", ""))
        if cell.cell_type == "markdown":
            cell.source = safe_markdown(cell.source, cell.pop("attachments", None))
        elif cell.cell_type == "raw":
            # nbconvert writes text/html and untyped raw cells into the page as they are.
            cell.source = sanitize_html(cell.source)
            cell.pop("attachments", None)
        elif cell.cell_type == "code":
            count = cell.get("execution_count")
            cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
            cell.outputs = [self._mark(sanitize_output(out)) for out in cell.get("outputs", [])]

    def _mark(self, output: NotebookNode) -> NotebookNode:
        """A student output that reads like a verdict, framed and labelled as the notebook's own output."""
        if not imitates_verdict(_output_text(output)):
            return output
        data = output.get("data", {})
        if output.output_type in ("stream", "error"):
            body = f'<pre style="margin:2px 0 0 0">{html.escape(_output_text(output))}</pre>'
        elif "text/html" in data:
            body = f"<div>{data['text/html']}</div>"  # already sanitised
        else:
            body = f'<pre style="margin:2px 0 0 0">{html.escape(_output_text(output))}</pre>'
        label = ("Printed by the notebook's own code. This is not a grader's verdict: the grader's verdicts are "
                 f"the boxes with the seal {self._seal}.")
        framed = (f'<div data-course-grader="student-output" class="tex2jax_ignore" style="border:1px dashed '
                  f'{GREY};background:#f7f7f7;padding:4px 8px;margin:2px 0">'
                  f'<div style="{FONT};font-size:11px;color:{GREY}">{html.escape(label)}</div>{body}</div>')
        return NotebookNode(output_type="display_data", data=NotebookNode({"text/html": framed}),
                            metadata=NotebookNode())

    # -- the grader's part -----------------------------------------------------------------------------------
    def _take_verdict(self, cell: NotebookNode) -> tuple[bool, str] | None:
        """The verdict that verdicts.apply wrote into a graded test cell, taken out of its outputs."""
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not grading.get("grade") or grading.get("solution"):
            return None
        outputs = cell.get("outputs", [])
        failed = [i for i, out in enumerate(outputs)
                  if out.get("output_type") == "error" and out.get("ename") == FAILED_NAME]
        if failed:
            return False, _joined(outputs.pop(failed[-1]).get("evalue", ""))
        if outputs and outputs[-1].get("output_type") == "stream":
            found = PASSED.fullmatch(_joined(outputs[-1].get("text", "")))
            if found:
                outputs.pop()
                return True, found.group(1)
        return None

    def _row(self, cell: NotebookNode, verdict: tuple[bool, str] | None) -> dict | None:
        """A graded cell's line of the report; a test cell also gets the grader's box as its last output."""
        grading = cell.metadata.get("nbgrader", {})
        if not (grading.get("grade") or grading.get("task")) or not grading.get("grade_id"):
            return None
        item, score, points = str(grading["grade_id"]), grading.get("score"), grading.get("points")
        if not self.shows_points:  # formgrader: its own inputs show the points; a box only where a verdict was kept
            if verdict is None or cell.cell_type != "code" or grading.get("solution"):
                return None
            row = {"item": item, "score": None, "points": None, "passed": verdict[0], "message": verdict[1]}
            cell.outputs.append(NotebookNode(output_type="display_data", metadata=NotebookNode(),
                                             data=NotebookNode({"text/html": self._box(row)})))
            return row
        full = score is not None and points is not None and _points(score) == _points(points)
        passed, message = verdict if verdict is not None else (None, "")
        if passed is None:
            passed = full
            if cell.cell_type != "code" or grading.get("solution"):
                message = "graded by hand"
            else:
                message = ("passed" if full else "no points") + \
                    " (the hidden checks' message was not kept: this cell's output was cut)"
        elif passed != full:
            message += " (the score was changed by hand in the gradebook)"
        row = {"item": item, "score": _points(score), "points": _points(points), "passed": passed,
               "message": message}
        if cell.cell_type == "code" and not grading.get("solution"):
            cell.outputs.append(NotebookNode(output_type="display_data", metadata=NotebookNode(),
                                             data=NotebookNode({"text/html": self._box(row)})))
        return row

    def _line(self, row: dict) -> str:
        return (f"{PASSED_PREFIX}{row['message']}" if row["passed"]
                else f"✗ Hidden checks for `{row['item']}`: {row['message']}")

    def _box(self, row: dict) -> str:
        colour, tint = (GREEN, "#e9f6ec") if row["passed"] else (RED, "#fdecea")
        point_word = "point" if row["points"] == "1" else "points"
        points = f" · {row['score']} / {row['points']} {point_word}" if row["points"] is not None else ""
        head = f"Grader's verdict · {row['item']}{points} · seal {self._seal}"
        return (f'<div data-course-grader="verdict" class="tex2jax_ignore" style="border:2px solid {colour};'
                f'border-left:10px solid {colour};border-radius:4px;background:{tint};padding:6px 10px;'
                f'margin:6px 0">'
                f'<div style="{FONT};font-size:11px;font-weight:bold;letter-spacing:0.06em;text-transform:uppercase;'
                f'color:{colour}">{html.escape(head)}</div>'
                f'<div style="{MONO};font-size:13px;white-space:pre-wrap;color:#111;margin-top:3px">'
                f'{html.escape(self._line(row))}</div></div>')

    def _report(self, rows: list[dict], resources: dict) -> str:
        info = resources.get("nbgrader", {})
        lesson, student = str(info.get("assignment", "")), str(info.get("student", ""))
        score, total = _points(info.get("score")), _points(info.get("max_score"))
        cell_style = "padding:4px 8px;border:1px solid #c9d3e0;text-align:left;vertical-align:top"
        lines = []
        for row in rows:
            colour = GREEN if row["passed"] else RED
            status = "✓ passed" if row["passed"] else "✗ failed"
            lines.append(
                f'<tr><td style="{cell_style};{MONO}">{html.escape(row["item"])}</td>'
                f'<td style="{cell_style};white-space:nowrap">{row["score"]} / {row["points"]}</td>'
                f'<td style="{cell_style};color:{colour};font-weight:bold;white-space:nowrap">{status}</td>'
                f'<td style="{cell_style};{MONO};font-size:12px;white-space:pre-wrap">'
                f'{html.escape(self._line(row))}</td></tr>')
        if not lines:
            lines.append(f'<tr><td colspan="4" style="{cell_style}">This notebook has no graded cells.</td></tr>')
        penalty = info.get("late_penalty") or 0
        late = f" (after a late penalty of {_points(penalty)})" if penalty else ""
        explain = (
            "Written by the course's grader after the notebook ran, from the gradebook and the hidden checks' "
            "verdicts. Only this report and the boxes headed “Grader's verdict … seal "
            f"{self._seal}” come from the grader; the seal is drawn when this page is made, so no notebook can "
            "print it. Everything else on this page is the submitted notebook and what its code printed, shown "
            "inert (no scripts, no styles) and unable to change a score.")
        header = "".join(f'<th style="{cell_style};background:#dde6f2">{name}</th>'
                         for name in ("item", "points", "result", "the grader's verdict"))
        return markdown_block(
            f'<div data-course-grader="report" class="tex2jax_ignore" style="border:3px solid {NAVY};'
            f'border-radius:6px;background:#f2f6fb;padding:12px 16px;margin:4px 0 18px 0;{FONT};color:#111">'
            f'<h2 style="font-size:19px;font-weight:bold;color:{NAVY};margin:0">Grader\'s report · '
            f'{html.escape(lesson)} · {html.escape(student)} · {score} / {total} points{late}</h2>'
            f'<div style="font-size:12px;font-weight:bold;color:{NAVY};letter-spacing:0.08em;margin:2px 0 6px 0">'
            f'SEAL {self._seal}</div>{self._submitted_line(resources)}'
            f'<p style="margin:0 0 8px 0;font-size:13px">{html.escape(explain)}</p>'
            f'<table style="border-collapse:collapse;width:100%;font-size:13px;background:white">'
            f'<thead><tr>{header}</tr></thead><tbody>{"".join(lines)}</tbody></table></div>')

    def _submitted_line(self, resources: dict) -> str:
        """The report's line on when the notebook was submitted and what lateness cost, from the gradebook (the
        submission's time, its due date with the extension) and the term's policy; "" without a due date."""
        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                submission = gb.find_submission(info["assignment"], info["student"])
                submitted, due, extension = submission.timestamp, submission.duedate, submission.extension
                seconds_late = submission.total_seconds_late
        except (KeyError, MissingEntry):
            return ""
        if submitted is None or due is None:
            return ""
        term = term_module.from_config(self)
        policy = term.late if term is not None else None
        penalty = float(info.get("late_penalty") or 0)
        zone = term.zone if term is not None else None  # the term's clock, UTC beside it
        when, due_at = term_module.shown_time(submitted, zone), term_module.shown_time(due, zone)
        extension = f"an extension of {term_module.shown_span(extension.total_seconds())} included" \
            if extension else ""
        extended = f" ({extension})" if extension else ""
        if seconds_late <= 0:
            text, colour = f"Submitted {when}, on time (due {due_at}{', ' + extension if extension else ''}).", GREEN
        elif not penalty and policy is not None and seconds_late <= policy.grace.total_seconds():
            text, colour = (f"Submitted {when}, {term_module.shown_span(seconds_late)} after the due date {due_at}"
                            f"{extended}, within the grace of {term_module.shown_span(policy.grace.total_seconds())}:"
                            " on time."), GREEN
        else:
            cost = f"−{_points(penalty)} points" if penalty else "no points lost"
            rule = f" by the late policy: {policy.describe()}" if policy is not None else ""
            text, colour = (f"Submitted {when}, {term_module.shown_span(seconds_late)} after the due date {due_at}"
                            f"{extended}: {cost}{rule}."), RED
        return (f'<p data-course-grader="submitted" style="margin:0 0 8px 0;font-size:14px;font-weight:bold;'
                f'color:{colour}">{html.escape(text)}</p>')


class SafeFormgrade(SafeFeedback):
    """The same sanitising for formgrader's view of a submission (the autograded notebook, rendered by
    :class:`FormgradeExporter` with nbgrader's ``formgrade`` template in the instructor's Jupyter session, whose
    page holds the XSRF token): no student script, style, id or link runs or reaches the grading form. Each test
    cell's verdict becomes a sealed box (formgrader's own inputs show the points); no report."""

    shows_points = False

    def preprocess(self, nb: NotebookNode, resources: dict):
        verdicts, plain = self._student_part(nb, resources)
        for cell, verdict in zip(nb.cells, verdicts):
            self._row(cell, verdict)
        if plain:
            nb.cells.insert(0, _plain_note(plain, "formgrader"))
        return nb, resources


# -- the page --------------------------------------------------------------------------------------------------
# What nbconvert's HTMLExporter.from_notebook_node (nbconvert 7.17) does to the rendered page with BeautifulSoup.
NO_ALT = "No description has been provided for this image"
FOCUSABLE = ("jp-Cell-inputWrapper", "jp-OutputArea-output")  # divs it makes focusable (the lab template's)

# The page's markup as a browser's tokenizer reads it: attributes (quoted values may hold < and >), comments, the
# elements whose content is text (script, style, title, textarea, …), end tags (a browser reads their attributes
# too). Possessive quantifiers: no backtracking on any input. Whatever else opens a tag is "odd".
_ATTRS = (r"(?:[\t\n\f\r /]++|[^\t\n\f\r />][^\t\n\f\r /=>]*+"
          r"""(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+(?:"[^"]*+"|'[^']*+'|[^\t\n\f\r >]*+))?+)*+""")
_RAW = "script|style|title|textarea|xmp|iframe|noembed|noframes|noscript"
_MARKUP = re.compile(
    r"<!--(?:-?>|.*?--!?>)"
    r"|<(?!!--)[!?][^>]*+>"
    rf"|<(?P<raw>{_RAW})(?=[\t\n\f\r />]){_ATTRS}>[^<]*+(?:<(?!/(?P=raw)[\t\n\f\r />])[^<]*+)*+"
    rf"</(?P=raw)(?=[\t\n\f\r />]){_ATTRS}>"
    rf"|</[a-zA-Z][^\t\n\f\r />]*+{_ATTRS}>|</>|</[^a-zA-Z>][^>]*+>"
    rf"|<(?!(?:{_RAW})[\t\n\f\r />])(?P<name>[a-zA-Z][^\t\n\f\r />]*+)(?P<attrs>{_ATTRS})>"
    r"|(?P<odd><[!?]|</?[a-zA-Z])",
    re.S | re.I)
_ATTR = re.compile(r"([^\t\n\f\r />][^\t\n\f\r /=>]*+)"
                   r"""(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+("[^"]*+"|'[^']*+'|[^\t\n\f\r >]*+))?+""")
_IMG_OPEN = re.compile(r"<img(?=[\t\n\f\r />])", re.I)
_UNREAD = re.compile(r"\x00|<plaintext|<!\[CDATA\[", re.I)


def _attributes(text: str) -> dict[str, str]:
    found = {}
    for attribute in _ATTR.finditer(text):
        value = attribute.group(2) or ""
        if value[:1] in ("'", '"'):
            value = value[1:-1]
        found.setdefault(attribute.group(1).lower(), html.unescape(value))
    return found


def accessibility_edits(page: str) -> tuple[str, int] | None:
    """``page`` with nbconvert's edits made on its text (``alt`` on each ``<img>`` without one, written first in
    the tag) and the number of images that needed one; None when nbconvert's own pass must do it.

    None when a ``<img`` is anywhere but at the start of an image tag (in a comment, a script, an attribute, a
    title: the ``<img`` count and the image tags found differ), when markup opens in a way this scanner does not
    read (an unclosed tag, comment or script; NUL; ``<plaintext>``; CDATA), or when a div has a class nbconvert
    makes focusable (the lab template's cells): so an ``alt`` is only ever written right after ``<img``, where
    html.parser and browsers both see a tag's name end.
    """
    if _UNREAD.search(page):
        return None
    pieces, done, images, missing = [], 0, 0, 0
    for tag in _MARKUP.finditer(page):
        name = tag.group("name")
        if name is None:
            if tag.group("odd") is not None:
                return None
            continue
        name = name.lower()
        if name == "img":
            images += 1
            if "alt" not in _attributes(tag.group("attrs")):
                at = tag.start() + 4
                pieces += [page[done:at], f' alt="{NO_ALT}"']
                done, missing = at, missing + 1
        elif name == "div" and "class" in tag.group("attrs").lower():
            given = _attributes(tag.group("attrs")).get("class", "")
            if any(focusable in given for focusable in FOCUSABLE):
                return None
    if images != len(_IMG_OPEN.findall(page)):
        return None
    pieces.append(page[done:])
    return "".join(pieces), missing


def _soup_edits(page: str) -> tuple[str, int]:
    """nbconvert's own pass, as HTMLExporter.from_notebook_node makes it."""
    soup = BeautifulSoup(page, features="html.parser")
    missing = 0
    for elem in soup.select("img:not([alt])"):
        elem.attrs["alt"] = NO_ALT
        missing += 1
    for elem in soup.select(".jp-Notebook div.jp-Cell-inputWrapper"):
        elem.attrs["tabindex"] = "0"
    for elem in soup.select(".jp-Notebook div.jp-OutputArea-output"):
        elem.attrs["tabindex"] = "0"
    return str(soup), missing


class _MemoryBytecodeCache(jinja2.BytecodeCache):
    """Compiled templates kept in memory for this process: nbgrader makes a new exporter, and so a new Jinja
    environment, for every notebook, which would compile the same 27 templates again (about 0.2 s a page). Jinja
    checks each cached template against a checksum of its source."""

    def __init__(self) -> None:
        self.codes: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self.codes.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.codes[bucket.key] = bucket.bytecode_to_string()


_BYTECODE = _MemoryBytecodeCache()
_RENDERED: dict[tuple, str] = {}
_RENDERED_CHARS = [0]
_RENDERED_CAP = 32 << 20  # characters of source kept, then the memo starts again


def _memoised(key: tuple, size: int, render) -> str:
    """``render()``, kept for this process under ``key`` (all the output depends on): every student's page of a
    lesson shows the same given and solution cells and the same prose."""
    found = _RENDERED.get(key)
    if found is None:
        found = render()
        if _RENDERED_CHARS[0] + size > _RENDERED_CAP:
            _RENDERED.clear()
            _RENDERED_CHARS[0] = 0
        _RENDERED[key] = found
        _RENDERED_CHARS[0] += size
    return found


class _CachedHighlight(Highlight2HTML):
    """nbconvert's highlighter, memoised (:func:`_memoised`). The key: the source, the language, a cell's
    ``magics_language`` and the formatter options."""

    def __call__(self, source, language=None, metadata=None):
        key = ("highlight", source, language or self.pygments_lexer, (metadata or {}).get("magics_language"),
               json.dumps(self.extra_formatter_options, sort_keys=True, default=str))
        return _memoised(key, len(source), lambda: super(_CachedHighlight, self).__call__(source, language, metadata))


# -- the bound: one notebook's page, made in a child with a time, memory and size limit ------------------------
RENDER_SECONDS = 20.0  # to sanitise and render one notebook
RENDER_BYTES = 16 << 20  # the notebook's JSON before (as Limits.notebook_bytes), and its page after
RENDER_MEMORY = 2 << 30  # address space the child may add to this process's


class Unrendered(Exception):
    """A notebook's page was not made within the bound; the message says which limit it passed."""


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def bounded(make, seconds: float, max_bytes: int, memory_bytes: int) -> str:
    """``make()`` (text) computed in a forked child that may take ``seconds`` of wall time, ``memory_bytes`` of
    address space more than this process and give at most ``max_bytes`` (UTF-8); raises :class:`Unrendered`
    past any of them, or when ``make`` raised. A markup parser can be made to take time quadratic in its input
    (nh3 on deeply nested tags, a template over many cells) and cannot be interrupted in a thread: a child is
    killed, and this process keeps nothing it built."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, runs no exit handler of the parent's
        try:
            os.close(reader)
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            soft = _address_space() + memory_bytes
            resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
            try:
                data = b"P" + make().encode("utf-8", "surrogatepass")
            except MemoryError:
                data = b"M"
            except Exception as exc:
                data = b"E" + f"{type(exc).__name__}: {exc}"[:300].encode("utf-8", "replace")
            with os.fdopen(writer, "wb") as out:
                out.write(data[:max_bytes + 2])
        finally:
            os._exit(0)
    os.close(writer)
    chunks, size, deadline = [], 0, time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unrendered(f"making its page took longer than the {seconds:g} s limit")
            if not select.select([reader], [], [], left)[0]:
                continue
            chunk = os.read(reader, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes + 1:
                raise Unrendered(f"its page is larger than the {max_bytes / 2**20:g} MB limit")
    finally:
        os.close(reader)
        _reap(pid)
    data = b"".join(chunks)
    if data[:1] == b"P":
        return data[1:].decode("utf-8", "surrogatepass")
    if data[:1] == b"M":
        raise Unrendered(f"making its page needed more than {memory_bytes / 2**30:g} GB of memory")
    if data[:1] == b"E":
        raise Unrendered(f"making its page failed ({shown(data[1:].decode('utf-8', 'replace'))})")
    raise Unrendered("the process making its page stopped without one")


def _reap(pid: int) -> None:
    """Wait for the child, killing it if it still runs (until it is waited for, its pid is no one else's)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:  # a server's own child watcher waited for it
        pass


def plain_page(nb: NotebookNode, title: str) -> str:
    """A page of ``nb`` after :func:`plain_cells` and the grader's preprocessors, made without the template (its
    time grows with the number of cells): markdown cells are the grader's blocks or text it escaped, rich outputs
    the grader's boxes, everything else is escaped here."""
    parts = [f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head><body>']
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            continue
        parts.append(f'<pre>{html.escape(_joined(cell.get("source", "")))}</pre>')
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/html" in data:
                parts.append(data["text/html"])
            else:
                parts.append(f'<pre>{html.escape(_joined(out.get("text", data.get("text/plain", ""))))}</pre>')
    parts.append("</body></html>\n")
    return "".join(parts)


class BoundedExporter(HTMLExporter):
    """nbconvert's HTMLExporter whose page (the preprocessors, among them the course's sanitiser, and the
    template) is made within a bound (:func:`bounded`): past it, or for a notebook over ``render_bytes``, the
    page is :func:`plain_page` of the notebook as the preprocessors leave it in plain mode (``course_plain``: no
    student markup parsed), which says why, and the log says so too. The rest of the class is not held up."""

    render_seconds = Float(RENDER_SECONDS, help="Seconds to sanitise and render one notebook").tag(config=True)
    render_bytes = Int(RENDER_BYTES, help="Largest notebook (JSON) and page, in bytes").tag(config=True)
    render_memory_bytes = Int(RENDER_MEMORY, help="Memory the rendering child may add").tag(config=True)
    page_name = "feedback"

    def from_notebook_node(self, nb: NotebookNode, resources: dict | None = None, **kw):
        resources = self._init_resources(resources)
        size = len(json.dumps(nb, default=str))
        if size > self.render_bytes:
            reason = f"the notebook is {size / 2**20:.1f} MB, over the {self.render_bytes / 2**20:g} MB limit"
        else:
            _ = self.template  # the instructor's template compiled here, once: each child starts with it
            try:
                page = bounded(lambda: self._render(nb, resources, **kw)[0], self.render_seconds,
                               self.render_bytes, self.render_memory_bytes)
                resources["output_extension"] = self.file_extension
                return page, resources
            except Unrendered as exc:
                reason = str(exc)
        return self._plain(nb, resources, reason), resources

    def _render(self, nb: NotebookNode, resources: dict, **kw):
        return super().from_notebook_node(nb, resources, **kw)

    def _plain(self, nb: NotebookNode, resources: dict, reason: str) -> str:
        info = resources.get("nbgrader", {})
        who = "/".join(str(part) for part in (info.get("student") or resources.get("student"),
                                              info.get("assignment") or resources.get("assignment_id"))
                       if part) or "a notebook"
        message = f"{reason}: its {self.page_name} page is plain text (see the note at its top)"
        if info.get("student") and info.get("assignment"):
            note(str(info["assignment"]), str(info["student"]), message)
        else:
            self.log.warning("%s: %s", shown(who), shown(message))
        resources["course_plain"] = reason
        # The preprocessors on ``nb`` itself: nbconvert's _preprocess would copy and validate all of it twice (a
        # minute for 50 000 outputs); what SafeFeedback leaves is plain text.
        for preprocessor in self._preprocessors:
            nb, resources = preprocessor(nb, resources)
        if not resources.pop("course_plain_done", False):  # no SafeFeedback ran: nothing but plain text either
            nb.cells = plain_cells(nb.cells)
        resources["output_extension"] = self.file_extension
        return plain_page(nb, f"{who} ({self.page_name}, plain text)")


class FormgradeExporter(BoundedExporter):
    """formgrader's exporter (``pipeline.tools_config`` makes formgrader build this one): the submission view
    is sanitised by :class:`SafeFormgrade`, within the bound."""

    page_name = "formgrader"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.register_preprocessor(SafeFormgrade(), enabled=True)

    def from_filename(self, filename: str, resources: dict | None = None, **kw):
        """A notebook over the bound is not read (nbformat would parse and validate all of it)."""
        size = os.path.getsize(filename)
        if size > self.render_bytes:
            reason = f"the notebook is {size / 2**20:.1f} MB, over the {self.render_bytes / 2**20:g} MB limit"
            resources = self._init_resources(resources)
            return self._plain(nbformat.v4.new_notebook(), resources, reason), resources
        return super().from_filename(filename, resources, **kw)


# The course's feedback template (autograder/pages/templates/course-feedback): nbgrader's page with a language, a <main>
# landmark and the page's title as its first heading, for a screen reader. It extends nbgrader's "feedback", so
# nbgrader's template folder stays on the path.
PAGE_TEMPLATE, PAGE_FILE = "course-feedback", "page.html.j2"


def page_template_dirs() -> list[str]:
    """The template folders the feedback page needs: nbgrader's (its "feedback" template) and the course's."""
    import nbgrader.server_extensions.formgrader

    nbgrader_templates = Path(nbgrader.server_extensions.formgrader.__file__).with_name("templates")
    return [str(nbgrader_templates), str(Path(__file__).with_name("templates"))]


class FeedbackExporter(BoundedExporter):
    """nbconvert's HTMLExporter, same template and configuration (it reads the ``HTMLExporter`` section), whose
    page is the template's output with :func:`accessibility_edits` instead of a BeautifulSoup parse and print of
    the whole page (tests/test_feedback_exporter.py: the same tree as HTMLExporter's, for real graded notebooks).
    The page's markup comes from the template, the sanitiser (nh3) and escaped text, so the scanner reads it all.
    Made within the bound of :class:`BoundedExporter`."""

    def _render(self, nb: NotebookNode, resources: dict | None = None, **kw):
        # HTMLExporter.from_notebook_node up to its call of TemplateExporter's, which renders the page.
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        highlight_code = self.filters.get("highlight_code", _CachedHighlight(pygments_lexer=lexer, parent=self))
        resources = self._init_resources(resources)
        filter_data_type = WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata, parent=self,
                                                 resources=resources)
        self.register_filter("highlight_code", highlight_code)
        self.register_filter("filter_data_type", filter_data_type)
        page, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        edited = accessibility_edits(page)
        if edited is None:
            self.log.debug("feedback page: markup the scanner does not read, nbconvert's own pass used")
            edited = _soup_edits(page)
        page, missing = edited
        if missing:
            self.log.warning("Alternative text is missing on %s image(s).", missing)
        return page, resources

    @jinja2.pass_context
    def markdown2html(self, context, source):
        """HTMLExporter's markdown filter, memoised (:func:`_memoised`): nbconvert builds a new markdown parser for
        every cell. The key: the source, the cell's attachments, the notebook's path and the renderer's options."""
        cell = context.get("cell", {})
        attachments = json.dumps(cell.get("attachments", {}), sort_keys=True, default=str)
        path = context.get("resources", {}).get("metadata", {}).get("path", "")
        key = ("markdown", source, attachments, path, self.embed_images, self.anchor_link_text,
               self.exclude_anchor_links, json.dumps(self.lexer_options, sort_keys=True, default=str))
        return _memoised(key, len(source) + len(attachments),
                         lambda: HTMLExporter.markdown2html(self, context, source))

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _BYTECODE
        return environment
