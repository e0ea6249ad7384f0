"""What a student's notebook shows, made inert: the sanitiser of every student-controlled part of a feedback or
formgrader page (outputs, markdown and raw cells, text), and the plain-text form of a notebook past the page's bound.

Used by :mod:`autograder.pages.feedback` (the preprocessors that write the grader's sealed verdicts) and
:mod:`autograder.pages.exporters` (the page, made within a bound); what is kept and why is told in
:mod:`autograder.pages.feedback`'s docstring.
"""

from __future__ import annotations

import base64
import html
import re

import nh3
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbformat import NotebookNode
from pygments.token import STANDARD_TYPES

from decoder_course.text import without_escapes

# The grader's own boxes' styles (inline: no student content can have one).
FONT = "font-family:'Helvetica Neue',Helvetica,Arial,sans-serif"
MONO = "font-family:Menlo,Consolas,'DejaVu Sans Mono',monospace"
GREEN, RED, GREY, NAVY = "#1b7a34", "#b3261e", "#6b6b6b", "#1d3557"


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


def joined_text(value) -> str:
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return value if isinstance(value, str) else str(value)


def _plain(value) -> str:
    """Student text without terminal escapes: nbconvert would turn its colour codes into inline styles."""
    return without_escapes(joined_text(value))


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
        value = joined_text(value)
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
        kept["text/html"] = sanitize_html(_markdown(joined_text(data["text/markdown"])))
        dropped.remove("text/markdown")
    if "text/html" not in kept and "image/svg+xml" in data:
        svg = base64.b64encode(joined_text(data["image/svg+xml"]).encode("utf-8", "replace")).decode("ascii")
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


def grading_metadata(cell) -> NotebookNode:
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
        return _note(_cut(joined_text(output.get("text", ""))))
    if kind == "error":
        return _note(_cut(f"{joined_text(output.get('ename', ''))}: {joined_text(output.get('evalue', ''))}\n"))
    data = output.get("data") or {}
    if isinstance(data, dict) and "text/plain" in data:
        return _note(_cut(joined_text(data["text/plain"])) + "\n")
    kinds = ", ".join(sorted(str(m)[:60] for m in data)[:5]) if isinstance(data, dict) else ""
    return _note(f"[an output ({kinds or kind}) not shown: this page is plain text]\n")


def plain_cells(cells: list) -> list[NotebookNode]:
    """``cells`` as plain text, without parsing any of their markup: sources and output texts escaped and cut at
    :data:`PLAIN_CHARS`, at most :data:`PLAIN_OUTPUTS` outputs a cell, markdown and raw cells shown as their text,
    every rich output replaced by its plain text or a note. Grading metadata stays, so the grader's boxes and
    formgrader's inputs still find their cells."""
    kept = []
    for cell in cells:
        source = _cut(joined_text(cell.get("source", "")))
        if cell.get("cell_type") == "code":
            outputs = cell.get("outputs", [])
            shown_outputs = [_plain_output(out) for out in outputs[:PLAIN_OUTPUTS]]
            if len(outputs) > PLAIN_OUTPUTS:
                shown_outputs.append(_note(f"[… {len(outputs) - PLAIN_OUTPUTS} more outputs not shown]\n"))
            kept.append(NotebookNode(cell_type="code", metadata=grading_metadata(cell), source=source,
                                     execution_count=None, outputs=shown_outputs))
        else:
            kept.append(NotebookNode(cell_type="markdown", metadata=grading_metadata(cell),
                                     source=markdown_block(f"<pre>{html.escape(source)}</pre>")))
    return kept


def plain_note(reason: str, page: str) -> NotebookNode:
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


__all__ = ["grading_metadata", "joined_text", "markdown_block", "plain_cells", "plain_note", "safe_markdown",
           "sanitize_html", "sanitize_output"]
