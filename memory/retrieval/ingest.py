"""Uploaded file -> Markdown-like text: .txt, .md, .html and .pdf, within a size limit."""

import io
import re
from html.parser import HTMLParser
from pathlib import PurePath

import pypdf

MAX_FILE_BYTES = 20 * 2**20
KINDS = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}
KINDS[".pdf"] = "pdf"


class IngestError(ValueError):
    """A file that cannot be indexed; the message names the file and says what to do."""


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
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise IngestError(f"{name}: the PDF is encrypted; upload an unprotected copy")
        pages = [page.extract_text() or "" for page in reader.pages]
    except IngestError:
        raise
    except Exception as error:
        raise IngestError(f"{name}: not a readable PDF ({error})") from error
    text = "\n\n".join(pages)
    if not text.strip():
        raise IngestError(f"{name}: the PDF has no text layer (a scanned PDF needs OCR first)")
    return text


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
