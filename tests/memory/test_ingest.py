import pytest

from memory.retrieval.ingest import IngestError, extract_text


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF with one line of Helvetica text, offsets computed so the xref table is valid."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    pdf, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    pdf += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return pdf


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
