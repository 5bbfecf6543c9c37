import io
import json
import re
from collections.abc import Callable

import pypdf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval import (
    Block,
    DocumentTooLarge,
    ParsedDocument,
    UnsupportedDocument,
    detect_media_type,
    parse_document,
    pdf_page_count,
)
from retrieval.parsing import HTML, MARKDOWN, MAX_HEADING_CHARS, PDF, TEXT, _heading
from tests import hostile_files


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


# The heading regex this parser used before: right, but cubic on a run of spaces.
CUBIC_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


@given(st.text(alphabet="#  \t\u00a0\u3000ab", max_size=24))
def test_headings_read_as_the_old_regex_did(line: str) -> None:
    match = CUBIC_HEADING.match(line)
    assert _heading(line) == (None if match is None else (len(match[1]), match[2]))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("## Install ##", (2, "Install")),
        ("#\tTabbed  ", (1, "Tabbed")),
        ("# a # b #", (1, "a # b")),
        ("###### six", (6, "six")),
        ("####### seven", None),
        ("#no-space", None),
        ("    # indented", None),
    ],
)
def test_heading_forms(line: str, expected: tuple[int, str] | None) -> None:
    assert _heading(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "## x" + " " * 12_000 + "y",
        "##" + " " * 12_000,
        "## x" + " " * 12_000 + "#" * 12_000 + " " * 12_000 + "z",
    ],
)
def test_a_heading_line_of_12000_spaces_is_read_at_once(line: str) -> None:
    # Each of these held a worker for hours under the old regex (1,600 spaces took 7.7 s).
    doc = parse_document(f"{line}\n\nBody.".encode(), media_type=MARKDOWN, title="t")
    [block] = doc.blocks
    assert block.text == "Body."
    assert len(block.headings) == 1 and len(block.headings[0]) <= MAX_HEADING_CHARS


def test_long_headings_are_cut_in_markdown_and_html() -> None:
    heading = "word " * 200_000  # 1 MB
    doc = parse_document(f"## {heading}\n\nBody.".encode(), media_type=MARKDOWN, title="t")
    assert doc.blocks[0].headings == (heading[:MAX_HEADING_CHARS].rstrip(),)
    html = f"<h2>{heading}</h2><p>Body.</p>".encode()
    assert parse_document(html, media_type=HTML, title="t").blocks[0].headings == (
        heading[:MAX_HEADING_CHARS].rstrip(),
    )


def test_heading_memory_does_not_grow_with_the_paragraphs_under_it() -> None:
    # Half a MiB of heading over 20,000 one-letter paragraphs: copied into every block's
    # stored form this was 10 GB of JSON.
    text = "## " + "h" * 500_000 + "\n\n" + "a\n\n" * 20_000
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="t")
    assert len(doc.blocks) == 20_000
    assert len({id(block.headings) for block in doc.blocks}) == 1  # one shared path
    stored = doc.to_json()
    assert stored["headings"] == [["h" * MAX_HEADING_CHARS]]
    assert len(json.dumps(stored)) < 8 * len(text)
    assert ParsedDocument.from_json(json.loads(json.dumps(stored)), title="t") == doc


def test_100k_headings_make_one_path_per_section_with_text() -> None:
    text = "## Part\n" + "".join(
        f"### {i}\n" + ("text\n" if i % 100 == 0 else "") for i in range(100_000)
    )
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="t")
    assert len(doc.blocks) == 1_000
    assert doc.blocks[-1] == Block("text", ("Part", "99900"))
    assert len({id(block.headings) for block in doc.blocks}) == 1_000
    assert doc.to_json()["headings"][-1] == ["Part", "99900"]


def test_the_title_heading_is_dropped_from_shared_paths_once() -> None:
    text = "# Guide\n\n## A\n\none\n\ntwo\n\n## B\n\nthree"
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="")
    assert doc.title == "Guide"
    assert [(b.headings, b.text) for b in doc.blocks] == [
        (("A",), "one"),
        (("A",), "two"),
        (("B",), "three"),
    ]
    assert doc.blocks[0].headings is doc.blocks[1].headings


def test_stored_blocks_written_before_paths_were_shared_still_load() -> None:
    rows = [["one", ["A", "B"], None], ["two", [], 3]]
    assert ParsedDocument.from_json(rows, title="t") == ParsedDocument(
        "t", [Block("one", ("A", "B")), Block("two", (), 3)]
    )


def test_deeply_nested_html_is_read_once() -> None:
    # Each element asked for its ancestors (and each nested heading for its whole text):
    # 2,000 levels took 6 to 12 s, a 25 MiB upload days.
    depth = 2_000
    nested_blocks = "<div>" * depth + "<p>x</p>" * depth
    doc = parse_document(nested_blocks.encode(), media_type=HTML, title="t")
    assert [b.text for b in doc.blocks] == ["x"] * depth
    nested_headings = "<h2>" * depth + "Deep" + "</h2>" * depth + "<p>Body.</p>"
    doc = parse_document(nested_headings.encode(), media_type=HTML, title="t")
    assert [(b.headings, b.text) for b in doc.blocks] == [(("Deep",), "Body.")]
    nested_items = "<ul>" + "<li>item " * depth
    doc = parse_document(nested_items.encode(), media_type=HTML, title="t")
    assert [b.text for b in doc.blocks] == [" ".join(["item"] * depth)]


def test_html_blocks_inside_a_heading_are_still_read() -> None:
    html = "<h2>Intro <p>lead</p></h2><p>Body.</p>"
    doc = parse_document(html.encode(), media_type=HTML, title="t")
    assert [(b.headings, b.text) for b in doc.blocks] == [
        (("Intro lead",), "lead"),
        (("Intro lead",), "Body."),
    ]


def test_pdf_pages_are_counted_before_any_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    extract = pypdf.PageObject.extract_text

    def counting(page: pypdf.PageObject, *args: object, **kwargs: object) -> str:
        read.append(1)
        return extract(page, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pypdf.PageObject, "extract_text", counting)
    data = make_pdf([f"Page {i} text" for i in range(5)])
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document(data, media_type=PDF, title="p", max_pages=4)
    assert (raised.value.code, read) == ("too_many_pages", [])


def test_pdf_reading_stops_at_the_page_past_the_text_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[int] = []
    extract = pypdf.PageObject.extract_text

    def counting(page: pypdf.PageObject, *args: object, **kwargs: object) -> str:
        read.append(1)
        return extract(page, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pypdf.PageObject, "extract_text", counting)
    data = make_pdf(["0123456789"] * 50)
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document(data, media_type=PDF, title="p", max_pages=100, max_chars=25)
    assert raised.value.code == "document_too_large"
    assert len(read) == 3  # 30 characters: the third page passes the limit
    assert "more than 30 characters; the limit is 25" in str(raised.value)
    doc = parse_document(data, media_type=PDF, title="p", max_chars=500)
    assert doc.char_count == 500


def test_text_limit_applies_to_every_format() -> None:
    for media_type in (TEXT, MARKDOWN, HTML):
        with pytest.raises(DocumentTooLarge) as raised:
            parse_document(b"<p>twelve chars</p>", media_type=media_type, title="t", max_chars=5)
        assert raised.value.code == "document_too_large"
    doc = parse_document(b"<p>twelve chars</p>", media_type=HTML, title="t", max_chars=12)
    assert doc.char_count == 12


# -- hostile files (tests/hostile_files.py): each fails alone, as UnsupportedDocument or a
# limit, never with whatever the parser happened to raise ------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (hostile_files.deeply_nested_pdf, "nested too deeply"),
        (lambda: hostile_files.stream_bomb_pdf(96), "Limit reached while decompressing"),
    ],
    ids=["deeply-nested", "stream-bomb"],
)
def test_a_hostile_pdf_is_unsupported_whatever_pypdf_raises(
    build: Callable[[], bytes], message: str
) -> None:
    with pytest.raises(UnsupportedDocument) as raised:
        parse_document(build(), media_type=PDF, title="", max_pages=2000, max_chars=5_000_000)
    assert raised.value.code == "unsupported_document"
    assert str(raised.value).startswith("not a readable PDF: ")
    assert message in str(raised.value)


def test_a_page_tree_bomb_is_refused_by_its_declared_count_before_the_tree_is_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A billion pages in 18 kB: one node repeated a thousand times at each level."""
    data = hostile_files.page_tree_bomb_pdf()
    walked: list[int] = []
    flatten = pypdf.PdfReader._flatten
    monkeypatch.setattr(
        pypdf.PdfReader, "_flatten", lambda *a, **k: walked.append(1) or flatten(*a, **k)
    )
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document(data, media_type=PDF, title="", max_pages=2000)
    assert (raised.value.code, str(raised.value)) == (
        "too_many_pages",
        "the PDF has 1000000000 pages; the limit is 2000",
    )
    assert walked == []
    monkeypatch.undo()
    # Without a page limit, walking it ends at pypdf's own limit, as unreadable.
    with pytest.raises(UnsupportedDocument) as unreadable:
        parse_document(data, media_type=PDF, title="")
    assert "page tree entry limit" in str(unreadable.value)
    with pytest.raises(UnsupportedDocument):
        pdf_page_count(data)


def test_a_pdf_with_a_broken_cross_reference_table_is_read_or_refused() -> None:
    try:
        doc = parse_document(hostile_files.broken_xref_pdf(), media_type=PDF, title="")
    except UnsupportedDocument:
        return
    assert [b.text for b in doc.blocks] == ["Dates grow on palms"]  # rebuilt from the objects


def test_html_past_the_element_cap_is_refused_before_its_tree_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bs4

    built: list[int] = []
    monkeypatch.setattr(bs4, "BeautifulSoup", lambda *a, **k: built.append(1))
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document(
            hostile_files.one_tag_html(), media_type=HTML, title="", max_html_elements=200_000
        )
    assert raised.value.code == "too_many_elements"
    assert str(raised.value) == "the HTML has more than 200000 elements; the limit is 200000"
    assert built == []


def test_html_within_the_element_cap_is_read() -> None:
    html = "<h2>Tea</h2>" + "<p>Green.</p>" * 3
    doc = parse_document(html.encode(), media_type=HTML, title="", max_html_elements=4)
    assert [b.text for b in doc.blocks] == ["Green."] * 3
    with pytest.raises(DocumentTooLarge):
        parse_document(html.encode(), media_type=HTML, title="", max_html_elements=3)


def test_deeply_nested_html_within_the_cap_is_read() -> None:
    data = hostile_files.deeply_nested_html(20_000)
    doc = parse_document(data, media_type=HTML, title="", max_html_elements=200_000)
    assert [b.text for b in doc.blocks] == ["deep"]


def test_any_error_from_the_html_parser_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    import bs4

    def broken(*args: object, **kwargs: object) -> None:
        raise AssertionError("expected name token")  # what html.parser has raised on junk

    monkeypatch.setattr(bs4, "BeautifulSoup", broken)
    with pytest.raises(UnsupportedDocument) as raised:
        parse_document(b"<p>x</p>", media_type=HTML, title="")
    assert str(raised.value) == "not a readable document: expected name token"
