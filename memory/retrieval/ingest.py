"""Uploaded file -> Markdown-like text: .txt, .md, .html and .pdf, within a size limit."""

import io
import re
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

import pypdf
from pypdf.errors import LimitReachedError
from pypdf.generic import DictionaryObject, StreamObject

MAX_FILE_BYTES = 20 * 2**20
KINDS = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}
KINDS[".pdf"] = "pdf"


class IngestError(ValueError):
    """A file that cannot be indexed; the message names the file and says what to do."""


@dataclass(frozen=True)
class PdfLimits:
    """What reading one PDF may cost.  pypdf's text extraction takes 0.5 to 2 µs of CPU per byte of unpacked
    page content, so that is what is limited: real documents unpacked to 0.6 to 2.6 times their file size
    (fonts and images stay packed) and repetitive text without fonts to 9 times, while a 2 kB decompression
    bomb unpacks to 1.2 MB.  A form drawn again and again counts each time it is drawn."""

    free_content_bytes: int = 256 * 2**10  # any PDF may unpack this much: under 0.5 s
    content_per_file_byte: int = 20  # and this many bytes more for each byte of the file
    max_content_bytes: int = 16 * 2**20  # but never more: some 2,000 pages of text, 8 to 30 s
    max_text_chars: int = 5_000_000  # some 1,200 pages of dense text
    max_seconds: float = 30.0  # wall clock, for what the content limit misses (slow fonts, a busy machine)

    def content_bytes(self, file_bytes: int) -> int:
        return min(self.max_content_bytes, self.free_content_bytes + self.content_per_file_byte * file_bytes)


PDF_LIMITS = PdfLimits()


def file_kind(name: str) -> str:
    suffix = PurePath(name).suffix.lower()
    if suffix not in KINDS:
        supported = " ".join(sorted(KINDS))
        raise IngestError(f"{name}: unsupported file type {suffix or '(none)'}; supported: {supported}")
    return KINDS[suffix]


def extract_text(
    name: str, data: bytes | str, max_bytes: int = MAX_FILE_BYTES, kind: str | None = None
) -> str:
    """The file's text; `kind` (text, markdown, html, pdf) overrides what the name's suffix says."""
    kind = kind or file_kind(name)
    if kind not in KINDS.values():
        raise IngestError(f"{name}: unknown kind {kind!r}; one of {', '.join(sorted(set(KINDS.values())))}")
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise IngestError(f"{name}: {size / 2**20:.1f} MiB is over the {max_bytes / 2**20:.0f} MiB limit")
    text = _extract_pdf(name, data) if kind == "pdf" else _decode(name, data)
    if kind == "html":
        text = html_to_markdown(text)
    if not text.strip():
        raise IngestError(f"{name}: no text found in the file")
    return text


def _decode(name: str, data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    if b"\x00" in data:
        raise IngestError(f"{name}: looks like a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise IngestError(f"{name}: not UTF-8 text (byte {error.start}); save it as UTF-8") from error


def _extract_pdf(name: str, data: bytes | str) -> str:
    if isinstance(data, str):
        raise IngestError(f"{name}: a PDF must be given as bytes")
    # pypdf raises many exception types on damaged files; any of them means this file is unreadable.
    try:
        with pypdf.apply_configuration(zlib_maximum_output_length=PDF_LIMITS.max_content_bytes):
            reader = pypdf.PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                raise IngestError(f"{name}: the PDF is encrypted; upload an unprotected copy")
            budget = _PdfBudget(name, len(data), len(reader.pages), PDF_LIMITS)
            pages = [budget.page_text(page) for page in reader.pages]
    except IngestError:
        raise
    except LimitReachedError as error:
        raise IngestError(f"{name}: the PDF is over a safety limit ({error}); {_UPLOAD_TEXT}") from error
    except Exception as error:
        raise IngestError(f"{name}: not a readable PDF ({error})") from error
    text = "\n\n".join(pages)
    if not text.strip():
        raise IngestError(f"{name}: the PDF has no text layer (a scanned PDF needs OCR first)")
    return text


_UPLOAD_TEXT = "split it into smaller PDFs or upload its text as a .txt file"


class _PdfBudget:
    """Counts one PDF's unpacked content (each page's, and each form's every time it is drawn), its text and
    the time taken against `limits`; past any of them, raises IngestError saying which."""

    def __init__(self, name: str, file_bytes: int, num_pages: int, limits: PdfLimits):
        self.name, self.file_bytes, self.num_pages, self.limits = name, file_bytes, num_pages, limits
        self.allowed_content_bytes = limits.content_bytes(file_bytes)
        self.deadline = time.monotonic() + limits.max_seconds
        self.content_bytes = self.text_chars = self.page_number = 0
        self.forms: dict[str, list[StreamObject]] = {}

    def page_text(self, page: pypdf.PageObject) -> str:
        self.page_number += 1
        contents = page.get_contents()
        self.content_bytes += len(contents.get_data()) if contents is not None else 0
        self._check()
        self.forms = {}
        _collect_forms(page.get("/Resources"), self.forms, set())
        text = page.extract_text(visitor_operand_before=self._before_operation) or ""
        self.text_chars += len(text)
        self._check()  # again: pypdf ignores what the check raised inside a form, and carries on without it
        return text

    def _before_operation(self, operator: bytes, operands: list, *_) -> None:
        # pypdf parses a form anew each time it is drawn, so each time counts.
        if operator == b"Do" and operands and operands[0] in self.forms:
            self.content_bytes += max(len(form.get_data()) for form in self.forms[operands[0]])
        self._check()

    def _check(self) -> None:
        if self.content_bytes > self.allowed_content_bytes:
            allowed = _size(self.allowed_content_bytes)
            raise IngestError(
                f"{self.name}: its pages unpack to over {allowed} by {self._where()}, the limit for a PDF of "
                f"{_size(self.file_bytes)}; a file that unpacks so much is likely a decompression bomb: "
                f"if it is a real document, {_UPLOAD_TEXT}"
            )
        if self.text_chars > self.limits.max_text_chars:
            raise IngestError(
                f"{self.name}: over {self.limits.max_text_chars:,} characters of text by {self._where()}; "
                f"{_UPLOAD_TEXT}"
            )
        if time.monotonic() > self.deadline:
            raise IngestError(
                f"{self.name}: reading its text took over {self.limits.max_seconds:g} s (stopped at "
                f"{self._where()}); {_UPLOAD_TEXT}"
            )

    def _where(self) -> str:
        return f"page {self.page_number} of {self.num_pages}"


def _collect_forms(resources, forms: dict[str, list[StreamObject]], seen: set[int]) -> None:
    """The form XObjects `resources` can draw, by name, with those the forms themselves can draw."""
    resources = resources.get_object() if resources is not None else None
    xobjects = resources.get("/XObject") if isinstance(resources, DictionaryObject) else None
    xobjects = xobjects.get_object() if xobjects is not None else None
    for form_name, reference in xobjects.items() if isinstance(xobjects, DictionaryObject) else ():
        form = reference.get_object()
        if isinstance(form, StreamObject) and form.get("/Subtype") == "/Form" and id(form) not in seen:
            seen.add(id(form))
            forms.setdefault(form_name, []).append(form)
            _collect_forms(form.get("/Resources"), forms, seen)


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.1f} MiB" if num_bytes >= 2**20 else f"{num_bytes / 2**10:.1f} KiB"


_PARAGRAPH_TAGS = {"p", "div", "section", "article", "blockquote", "pre", "table", "ul", "ol"}
_LINE_TAGS = {"li", "br", "tr"}
_SKIPPED_TAGS = {"script", "style", "head", "nav", "noscript", "template", "svg"}
_HEADINGS = {f"h{level}": level for level in range(1, 7)}


class _MarkdownWriter(HTMLParser):
    """Keeps the text, headings as `#` lines and paragraph breaks as blank lines."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIPPED_TAGS:
            self.skipping += 1
        elif tag in _HEADINGS:
            self.parts.append("\n\n" + "#" * _HEADINGS[tag] + " ")
        elif tag in _PARAGRAPH_TAGS:
            self.parts.append("\n\n")
        elif tag in _LINE_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _SKIPPED_TAGS:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _HEADINGS or tag in _PARAGRAPH_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_markdown(html: str) -> str:
    writer = _MarkdownWriter()
    writer.feed(html)
    writer.close()
    lines = [line.strip() for line in "".join(writer.parts).splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
