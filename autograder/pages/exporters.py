"""The feedback and formgrader pages, rendered: nbconvert's HTMLExporter without its BeautifulSoup round trip, made
within a bound (a forked child with a time, memory and size limit; past one, the page is plain text and says why).

:class:`FeedbackExporter` is ``GenerateFeedback.exporter_class`` and :class:`FormgradeExporter` formgrader's (see
:func:`autograder.grading.pipeline.nbgrader_config`); the preprocessors they run are
:mod:`autograder.pages.feedback`'s, the sanitiser :mod:`autograder.pages.sanitiser`'s.
"""

from __future__ import annotations

import html
import json
import os
import re
import resource
import select
import signal
import time
from pathlib import Path

import jinja2
import nbformat
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbformat import NotebookNode
from traitlets import Float, Int

from autograder.judge.preprocessors import note
from autograder.pages.feedback import SafeFormgrade
from autograder.pages.sanitiser import joined_text, plain_cells
from decoder_course.text import shown

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
        parts.append(f'<pre>{html.escape(joined_text(cell.get("source", "")))}</pre>')
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/html" in data:
                parts.append(data["text/html"])
            else:
                parts.append(f'<pre>{html.escape(joined_text(out.get("text", data.get("text/plain", ""))))}</pre>')
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


__all__ = ["PAGE_FILE", "PAGE_TEMPLATE", "BoundedExporter", "FeedbackExporter", "FormgradeExporter", "Unrendered",
           "accessibility_edits", "bounded", "page_template_dirs", "plain_page"]
