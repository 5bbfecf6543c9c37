import io

import pytest

from retrieval import (
    DocumentTooLarge,
    UnsupportedDocument,
    detect_media_type,
    parse_document,
    pdf_page_count,
)
from retrieval.parsing import HTML, MARKDOWN, PDF, TEXT


def make_pdf(pages: list[str]) -> bytes:
    """A real PDF with one line of text per page, written by hand (no PDF writer needed)."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    font = 3 + 2 * len(pages)
    for i, text in enumerate(pages):
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out.getvalue()


def test_markdown_keeps_heading_path_and_drops_the_title_heading() -> None:
    text = (
        "# Guide\n\nIntro para.\n\n## Install\n\nRun make.\n\n"
        "### Linux\n\nUse apt.\n\n## Use\n\nAsk."
    )
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="")
    assert doc.title == "Guide"
    assert [(b.headings, b.text) for b in doc.blocks] == [
        ((), "Intro para."),
        (("Install",), "Run make."),
        (("Install", "Linux"), "Use apt."),
        (("Use",), "Ask."),
    ]


def test_markdown_code_fences_are_not_headings() -> None:
    text = "## Shell\n\n```\n# not a heading\necho hi\n```\n"
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="t")
    assert all(b.headings == ("Shell",) for b in doc.blocks)
    assert "# not a heading" in doc.blocks[0].text


def test_html_reads_blocks_under_headings_and_skips_scripts() -> None:
    html = (
        "<html><head><title>Page</title><script>evil()</script></head><body>"
        "<h1>Top</h1><p>First <b>para</b>.</p><h2>Sub</h2><ul><li><p>Item one</p></li></ul>"
        "</body></html>"
    )
    doc = parse_document(html.encode(), media_type=HTML, title="")
    assert doc.title == "Page"
    assert [(b.headings, b.text) for b in doc.blocks] == [
        (("Top",), "First para ."),
        (("Top", "Sub"), "Item one"),
    ]
    assert "evil" not in " ".join(b.text for b in doc.blocks)


def test_plain_text_splits_paragraphs() -> None:
    doc = parse_document(b"one\ntwo\n\n\nthree", media_type=TEXT, title="t")
    assert [b.text for b in doc.blocks] == ["one\ntwo", "three"]


def test_pdf_text_pages_and_page_limit() -> None:
    data = make_pdf(["Hello from page one", "Second page here"])
    assert pdf_page_count(data) == 2
    doc = parse_document(data, media_type=PDF, title="p")
    assert doc.page_count == 2
    assert [(b.page, b.text) for b in doc.blocks] == [
        (1, "Hello from page one"),
        (2, "Second page here"),
    ]
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document(data, media_type=PDF, title="p", max_pages=1)
    assert raised.value.code == "too_many_pages"


def test_broken_pdf_and_bad_encoding_are_unsupported() -> None:
    with pytest.raises(UnsupportedDocument):
        pdf_page_count(b"%PDF-1.4 garbage")
    with pytest.raises(UnsupportedDocument):
        parse_document(b"\xff\xfe\x00bad", media_type=TEXT, title="t")


@pytest.mark.parametrize(
    ("name", "head", "expected"),
    [
        ("a.md", b"# x", MARKDOWN),
        ("a.HTML", b"<p>", HTML),
        ("notes.txt", b"hi", TEXT),
        ("scan.pdf", b"%PDF-1.7", PDF),
        ("misnamed.txt", b"%PDF-1.7", PDF),
    ],
)
def test_detect_media_type(name: str, head: bytes, expected: str) -> None:
    assert detect_media_type(name, head) == expected


@pytest.mark.parametrize(("name", "head"), [("a.exe", b"MZ"), ("fake.pdf", b"hello")])
def test_detect_media_type_refuses(name: str, head: bytes) -> None:
    with pytest.raises(UnsupportedDocument):
        detect_media_type(name, head)
