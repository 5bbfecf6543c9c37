"""Turn uploaded bytes (txt, md, html, pdf) into titled blocks of text under a heading path.

A block is a paragraph-sized unit that the chunker may join with its neighbours under the
same headings but never split across a heading boundary.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import PurePath

from retrieval.errors import DocumentTooLarge, UnsupportedDocument

TEXT = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
PDF = "application/pdf"

MEDIA_TYPES: dict[str, str] = {
    ".txt": TEXT,
    ".text": TEXT,
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".html": HTML,
    ".htm": HTML,
    ".pdf": PDF,
}


@dataclass(frozen=True, slots=True)
class Block:
    text: str
    headings: tuple[str, ...] = ()
    page: int | None = None


@dataclass(slots=True)
class ParsedDocument:
    title: str
    blocks: list[Block] = field(default_factory=list)
    page_count: int | None = None

    @property
    def char_count(self) -> int:
        return sum(len(block.text) for block in self.blocks)


def detect_media_type(filename: str, head: bytes) -> str:
    """The media type from the file's extension, checked against its first bytes."""
    media_type = MEDIA_TYPES.get(PurePath(filename).suffix.lower())
    if head.startswith(b"%PDF-"):
        return PDF
    if media_type is None or media_type == PDF:
        raise UnsupportedDocument(
            f"{filename!r} is not a supported file type; upload txt, md, html or pdf"
        )
    return media_type


def pdf_page_count(data: bytes) -> int:
    """Pages in a PDF, read from its page tree without extracting any text."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        return len(PdfReader(io.BytesIO(data)).pages)
    except (PdfReadError, ValueError, KeyError) as exc:
        raise UnsupportedDocument(f"not a readable PDF: {exc}") from exc


def parse_document(
    data: bytes, *, media_type: str, title: str, max_pages: int | None = None
) -> ParsedDocument:
    if media_type == PDF:
        return _parse_pdf(data, title=title, max_pages=max_pages)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsupportedDocument("text files must be UTF-8 encoded") from exc
    if media_type == MARKDOWN:
        return _parse_markdown(text, title=title)
    if media_type == HTML:
        return _parse_html(text, title=title)
    if media_type == TEXT:
        return ParsedDocument(title=title, blocks=[Block(p) for p in _paragraphs(text)])
    raise UnsupportedDocument(f"unsupported media type {media_type!r}")


def _paragraphs(text: str) -> list[str]:
    paragraphs = (re.sub(r"[ \t]+", " ", p).strip() for p in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if p]


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^(```|~~~)")


def _parse_markdown(text: str, *, title: str) -> ParsedDocument:
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    lines: list[str] = []
    in_fence = False

    def flush() -> None:
        path = tuple(h for _, h in headings)
        blocks.extend(Block(p, path) for p in _paragraphs("\n".join(lines)))
        lines.clear()

    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        flush()
        level, heading = len(match.group(1)), match.group(2)
        while headings and headings[-1][0] >= level:
            headings.pop()
        headings.append((level, heading))
    flush()
    # A leading H1 is the document's own title, not a section of it.
    first = headings[0][1] if headings else None
    if text.lstrip().startswith("# ") and first is not None:
        title = title or first
        blocks = [
            Block(b.text, b.headings[1:] if b.headings[:1] == (first,) else b.headings)
            for b in blocks
        ]
    return ParsedDocument(title=title, blocks=blocks)


_HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_HTML_BLOCKS = ("p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption")


def _parse_html(text: str, *, title: str) -> ParsedDocument:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(text, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "nav"]):
        tag.decompose()
    if not title and soup.title and soup.title.string:
        title = soup.title.string.strip()
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    for element in soup.find_all((*_HTML_HEADINGS, *_HTML_BLOCKS)):
        # Nested blocks (a <p> inside an <li>) are read once, through the outermost.
        if element.find_parent(_HTML_BLOCKS):
            continue
        content = re.sub(r"\s+", " ", element.get_text(" ")).strip()
        if not content:
            continue
        if element.name in _HTML_HEADINGS:
            level = int(element.name[1])
            while headings and headings[-1][0] >= level:
                headings.pop()
            headings.append((level, content))
        else:
            blocks.append(Block(content, tuple(h for _, h in headings)))
    if not blocks:  # markup without block elements: fall back to its visible text
        blocks = [Block(p) for p in _paragraphs(soup.get_text("\n"))]
    return ParsedDocument(title=title, blocks=blocks)


def _parse_pdf(data: bytes, *, title: str, max_pages: int | None) -> ParsedDocument:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        page_count = len(reader.pages)
        if max_pages is not None and page_count > max_pages:
            raise DocumentTooLarge(
                f"the PDF has {page_count} pages; the limit is {max_pages}", code="too_many_pages"
            )
        if not title and reader.metadata and reader.metadata.title:
            title = str(reader.metadata.title)
        blocks = [
            Block(paragraph, page=number)
            for number, page in enumerate(reader.pages, start=1)
            for paragraph in _paragraphs(page.extract_text() or "")
        ]
    except (PdfReadError, ValueError, KeyError) as exc:
        raise UnsupportedDocument(f"not a readable PDF: {exc}") from exc
    return ParsedDocument(title=title, blocks=blocks, page_count=page_count)
