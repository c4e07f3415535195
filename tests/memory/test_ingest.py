import random
import re
import time
import zlib
from collections.abc import Sequence

import pytest

from memory.retrieval import ingest
from memory.retrieval.ingest import IngestError, extract_text


def pdf_file(page_contents: Sequence[bytes], forms: Sequence[bytes] = ()) -> bytes:
    """Pages drawing `page_contents`, with Helvetica as /F1 and `forms` as /X0, /X1...  (a form may draw the
    ones after it); every stream Flate-packed, offsets computed so the xref table is valid."""

    def stream(content: bytes, entries: bytes = b"") -> bytes:
        packed = zlib.compress(content, 9)
        return (
            b"<< %s/Length %d /Filter /FlateDecode >>\nstream\n" % (entries, len(packed))
            + packed
            + b"\nendstream"
        )

    font = 3 + 2 * len(page_contents)

    def resources(first_form: int) -> bytes:
        names = b" ".join(b"/X%d %d 0 R" % (n, font + 1 + n) for n in range(first_form, len(forms)))
        return b"/Resources << /Font << /F1 %d 0 R >> /XObject << %s >> >>" % (font, names)

    pages = b" ".join(b"%d 0 R" % (3 + 2 * n) for n in range(len(page_contents)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (pages, len(page_contents)),
    ]
    for n, content in enumerate(page_contents):
        page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R %s >>"
        objects += [page % (4 + 2 * n, resources(0)), stream(content)]
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for n, form in enumerate(forms):
        objects.append(
            stream(form, b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] %s " % resources(n + 1))
        )
    pdf, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    pdf += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return pdf


def text_lines(lines: list[str]) -> bytes:
    return (
        b"BT /F1 11 Tf 72 760 Td 14 TL " + b"".join(b"(%s) Tj T* " % line.encode() for line in lines) + b"ET"
    )


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF with one line of Helvetica text."""
    return pdf_file([text_lines([text])])


def test_pdf_text_is_extracted():
    assert "Radon must be measured" in extract_text("report.pdf", minimal_pdf("Radon must be measured"))


def test_html_keeps_headings_and_paragraphs_and_drops_scripts():
    html = "<h1>Fees</h1><p>Fees <b>vary</b>.</p><script>track()</script><ul><li>one</li><li>two</li></ul>"
    assert extract_text("page.html", html) == "# Fees\n\nFees vary.\n\none\ntwo"


def test_text_and_markdown_are_decoded_as_utf8():
    assert extract_text("notes.md", b"# Title\n\nbody") == "# Title\n\nbody"
    assert extract_text("bom.txt", b"\xef\xbb\xbfcaf\xc3\xa9") == "café"


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("slides.pptx", b"PK\x03\x04", "unsupported file type .pptx"),
        ("noext", b"text", r"unsupported file type \(none\)"),
        ("broken.pdf", b"%PDF-1.4 this is not a pdf", "not a readable PDF"),
        ("latin1.txt", b"caf\xe9", "not UTF-8 text"),
        ("image.txt", b"\x89PNG\x00\x00", "binary file"),
        ("empty.md", b"  \n\n ", "no text found"),
        ("blank.pdf", minimal_pdf(""), "no text layer"),
    ],
)
def test_unreadable_files_get_a_clear_error(name, data, message):
    with pytest.raises(IngestError, match=message) as error:
        extract_text(name, data)
    assert str(error.value).startswith(name)


def test_oversized_file_is_refused_before_parsing():
    with pytest.raises(IngestError, match=r"big.txt: 2.0 MiB is over the 1 MiB limit"):
        extract_text("big.txt", b"a" * 2 * 2**20, max_bytes=2**20)


BOMB = pdf_file([text_lines(["a"] * 120_000)])  # 3 kB, unpacks to 1.2 MB


def test_a_decompression_bomb_is_refused_quickly_saying_why():
    assert len(BOMB) < 4_000
    started = time.process_time()
    with pytest.raises(IngestError) as error:
        extract_text("bomb.pdf", BOMB)
    assert time.process_time() - started < 3
    assert re.match(
        r"bomb.pdf: its pages unpack to over \d+\.\d KiB by page 1 of 1, the limit for a PDF of \d\.\d KiB; "
        r".* decompression bomb: if it is a real document, split it .* or upload its text as a .txt file",
        str(error.value),
    )


FORM = text_lines(["a"] * 1_500)  # 15 kB


@pytest.mark.parametrize(
    ("page", "forms"),
    [(b"/X0 Do " * 500, [FORM]), (b"/X0 Do", [b"/X1 Do " * 500, FORM])],
    ids=["by the page", "by a form"],
)
def test_a_form_drawn_again_and_again_counts_each_time(page, forms):
    pdf = pdf_file([page], forms)
    assert len(pdf) < 2_000
    started = time.process_time()
    with pytest.raises(IngestError, match=r"^forms.pdf: its pages unpack to over .* decompression bomb"):
        extract_text("forms.pdf", pdf)
    assert time.process_time() - started < 3


def test_a_normal_100_page_pdf_is_read_whole():
    words = random.Random(0).choices(
        ["radon", "basement", "measure", "level", "the", "of", "winter"], k=60_000
    )
    lines = [" ".join(words[n : n + 12]) for n in range(0, len(words), 12)]
    pages = [lines[n : n + 50] for n in range(0, len(lines), 50)]
    text = extract_text("report.pdf", pdf_file([text_lines(page) for page in pages]))
    assert len(pages) == 100 and lines[0] in text and lines[-1] in text


def test_text_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(ingest, "PDF_LIMITS", ingest.PdfLimits(max_text_chars=1_000))
    pdf = pdf_file([text_lines(["word " * 20] * 6)] * 3)  # 600 characters a page
    with pytest.raises(IngestError, match=r"^long.pdf: over 1,000 characters of text by page 2 of 3; split"):
        extract_text("long.pdf", pdf)


def test_reading_stops_at_the_time_limit(monkeypatch):
    monkeypatch.setattr(ingest, "PDF_LIMITS", ingest.PdfLimits(max_seconds=0))
    with pytest.raises(
        IngestError, match=r"^slow.pdf: reading its text took over 0 s \(stopped at page 1 of 1\)"
    ):
        extract_text("slow.pdf", minimal_pdf("hello"))


def test_a_stream_over_the_unpacking_limit_is_refused_while_unpacking(monkeypatch):
    monkeypatch.setattr(ingest, "PDF_LIMITS", ingest.PdfLimits(max_content_bytes=100_000))
    with pytest.raises(IngestError, match=r"^big.pdf: the PDF is over a safety limit \(Limit reached"):
        extract_text("big.pdf", pdf_file([text_lines(["word " * 20] * 2_000)]))
