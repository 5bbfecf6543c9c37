"""Turn uploaded bytes (txt, md, html, pdf) into titled blocks of text under a heading path.

A block is a paragraph-sized unit that the chunker may join with its neighbours under the
same headings but never split across a heading boundary.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, TypedDict

from retrieval.errors import DocumentTooLarge, RetrievalError, UnsupportedDocument

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

MAX_HEADING_CHARS = 200
"""A heading longer than this is cut: it is repeated in every chunk and citation under it."""


@dataclass(frozen=True, slots=True)
class Block:
    text: str
    headings: tuple[str, ...] = ()
    page: int | None = None


class StoredBlocks(TypedDict):
    """The JSON form of a document's blocks: each heading path once, blocks referring to it."""

    headings: list[list[str]]
    blocks: list[tuple[str, int, int | None]]


@dataclass(slots=True)
class ParsedDocument:
    title: str
    blocks: list[Block] = field(default_factory=list)
    page_count: int | None = None

    @property
    def char_count(self) -> int:
        return sum(len(block.text) for block in self.blocks)

    def to_json(self) -> StoredBlocks:
        """The blocks as JSON whose size is proportional to the text: a heading path is
        written once and referred to by position, never copied into every paragraph."""
        paths: dict[tuple[str, ...], int] = {}
        blocks = [
            (block.text, paths.setdefault(block.headings, len(paths)), block.page)
            for block in self.blocks
        ]
        return {"headings": [list(path) for path in paths], "blocks": blocks}

    @classmethod
    def from_json(cls, stored: StoredBlocks | list[Any], *, title: str) -> ParsedDocument:
        """The inverse of :meth:`to_json`; also reads the older ``[text, headings, page]``
        rows, which repeated the headings in every block."""
        if isinstance(stored, list):
            return cls(title, [Block(text, tuple(path), page) for text, path, page in stored])
        paths = [tuple(path) for path in stored["headings"]]
        return cls(title, [Block(text, paths[ref], page) for text, ref, page in stored["blocks"]])


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
    """Pages in a PDF, read from its page tree without extracting any text.

    Pure-Python work on untrusted bytes: call it where parsing runs (the worker's parse
    stage, bounded in time and memory), never in the web process.
    """
    from pypdf import PdfReader

    try:
        return len(PdfReader(io.BytesIO(data)).pages)
    except MemoryError:
        raise
    except Exception as exc:  # any error a broken file raises means "unreadable"
        raise _unreadable("PDF", exc) from exc


def _unreadable(kind: str, exc: BaseException) -> UnsupportedDocument:
    """The error for a file the parser failed on: pypdf raises far more than its own
    ``PyPdfError`` tree (``RecursionError`` on deep nesting, ``ValueError``, ``TypeError``,
    ``KeyError``, ``AssertionError``…), and every one of them means the same here."""
    if isinstance(exc, RecursionError):
        return UnsupportedDocument(f"not a readable {kind}: its objects are nested too deeply")
    detail = str(exc)[:200] or type(exc).__name__
    return UnsupportedDocument(f"not a readable {kind}: {detail}")


def parse_document(
    data: bytes,
    *,
    media_type: str,
    title: str,
    max_pages: int | None = None,
    max_chars: int | None = None,
    max_html_elements: int | None = None,
) -> ParsedDocument:
    """Blocks of ``data`` in time and memory linear in its size.

    Raises :class:`DocumentTooLarge` (``too_many_pages``) for a PDF of more than
    ``max_pages`` pages before reading any page, (``document_too_large``) past
    ``max_chars`` characters of text (a PDF stops being read at the page that passes it),
    and (``too_many_elements``) for HTML of more than ``max_html_elements`` elements before
    building its tree. Any other failure on the file, whatever the parser raised, is
    :class:`UnsupportedDocument`; only ``MemoryError`` passes through as itself. Untrusted
    files go through :func:`retrieval.bounded.parse_document_bounded`, which also bounds
    the time and memory this takes.
    """
    try:
        return _parse(data, media_type, title, max_pages, max_chars, max_html_elements)
    except (RetrievalError, MemoryError):
        raise
    except Exception as exc:  # see _unreadable
        raise _unreadable("PDF" if media_type == PDF else "document", exc) from exc


def _parse(
    data: bytes,
    media_type: str,
    title: str,
    max_pages: int | None,
    max_chars: int | None,
    max_html_elements: int | None,
) -> ParsedDocument:
    if media_type == PDF:
        return _parse_pdf(data, title=title, max_pages=max_pages, max_chars=max_chars)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsupportedDocument("text files must be UTF-8 encoded") from exc
    if media_type == MARKDOWN:
        document = _parse_markdown(text, title=title)
    elif media_type == HTML:
        if max_html_elements is not None:
            _check_html_elements(text, max_html_elements)
        document = _parse_html(text, title=title)
    elif media_type == TEXT:
        document = ParsedDocument(title=title, blocks=[Block(p) for p in _paragraphs(text)])
    else:
        raise UnsupportedDocument(f"unsupported media type {media_type!r}")
    if max_chars is not None and document.char_count > max_chars:
        raise _too_many_chars(document.char_count, max_chars)
    return document


def _too_many_chars(count: int, limit: int, *, more: bool = False) -> DocumentTooLarge:
    has = f"more than {count}" if more else str(count)
    return DocumentTooLarge(
        f"the document has {has} characters; the limit is {limit}", code="document_too_large"
    )


def _paragraphs(text: str) -> list[str]:
    paragraphs = (re.sub(r"[ \t]+", " ", p).strip() for p in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if p]


_FENCE = re.compile(r"^(```|~~~)")


def _heading(line: str) -> tuple[int, str] | None:
    """An ATX heading's level and text, in one pass over the line.

    It reads what ``^(#{1,6})\\s+(.+?)\\s*#*\\s*$`` matched, without that regex's cubic
    backtracking on a run of spaces (docs/abuse.md), and cut to
    :data:`MAX_HEADING_CHARS`.
    """
    if not line.startswith("#"):
        return None
    level = len(line) - len(line.lstrip("#"))
    rest = line[level:]
    if not 1 <= level <= 6 or not rest[:1].isspace():
        return None
    content = rest.lstrip()
    if not content:  # only spaces after the hashes: the regex kept the last one
        return (level, rest[-1]) if len(rest) > 1 else None
    # The shortest non-empty text that leaves spaces, closing hashes and spaces behind.
    end = max(1, len(content.rstrip().rstrip("#").rstrip()))
    return level, _bounded(content[:end])


def _bounded(heading: str) -> str:
    return heading if len(heading) <= MAX_HEADING_CHARS else heading[:MAX_HEADING_CHARS].rstrip()


def _parse_markdown(text: str, *, title: str) -> ParsedDocument:
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    lines: list[str] = []
    in_fence = False

    def flush() -> None:
        if not lines:
            return
        paragraphs = _paragraphs("\n".join(lines))
        lines.clear()
        if paragraphs:
            path = tuple(h for _, h in headings)  # one tuple, shared by the section's blocks
            blocks.extend(Block(p, path) for p in paragraphs)

    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
        heading = None if in_fence or not line.startswith("#") else _heading(line)
        if heading is None:
            lines.append(line)
            continue
        flush()
        level = heading[0]
        while headings and headings[-1][0] >= level:
            headings.pop()
        headings.append(heading)
    flush()
    # A leading H1 is the document's own title, not a section of it.
    first = headings[0][1] if headings else None
    if text.lstrip().startswith("# ") and first is not None:
        title = title or first
        trimmed: dict[tuple[str, ...], tuple[str, ...]] = {}  # each shorter path made once
        for number, block in enumerate(blocks):
            if block.headings[:1] == (first,):
                path = trimmed.get(block.headings)
                if path is None:
                    path = trimmed[block.headings] = block.headings[1:]
                blocks[number] = Block(block.text, path)
    return ParsedDocument(title=title, blocks=blocks)


_HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_HTML_BLOCKS = ("p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption")


_START_TAG = re.compile(r"<[A-Za-z]")


def _check_html_elements(text: str, limit: int) -> None:
    """Refuse markup of more than ``limit`` start tags before building its tree: the tree
    costs far more memory per element than the bytes that open one (``<b>`` is 3 bytes).
    Tags inside comments and scripts count too, so the count is an upper bound; the scan
    stops at the first tag past the limit."""
    for count, _ in enumerate(_START_TAG.finditer(text), start=1):
        if count > limit:
            raise DocumentTooLarge(
                f"the HTML has more than {limit} elements; the limit is {limit}",
                code="too_many_elements",
            )


def _parse_html(text: str, *, title: str) -> ParsedDocument:
    from bs4 import BeautifulSoup, Tag

    soup = BeautifulSoup(text, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "nav"]):
        tag.decompose()
    if not title and soup.title and soup.title.string:
        title = soup.title.string.strip()
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    path: tuple[str, ...] = ()
    # One walk in document order, reading each element's text once: a block is read whole
    # through the outermost one (a <p> inside an <li>) and not entered; a heading inside a
    # heading is part of the outer one's text. Asking every element for its ancestors, or
    # every nested heading for its text, made this quadratic in the nesting depth.
    pending: list[tuple[Tag, bool]] = [(soup, False)]
    while pending:
        element, in_heading = pending.pop()
        is_heading = element.name in _HTML_HEADINGS and not in_heading
        if element.name in _HTML_BLOCKS or is_heading:
            content = re.sub(r"\s+", " ", element.get_text(" ")).strip()
            if content and is_heading:
                level = int(element.name[1])
                while headings and headings[-1][0] >= level:
                    headings.pop()
                headings.append((level, _bounded(content)))
                path = tuple(h for _, h in headings)
            elif content:
                blocks.append(Block(content, path))
            if not is_heading:
                continue
        children = [child for child in element.contents if isinstance(child, Tag)]
        pending.extend((child, in_heading or is_heading) for child in reversed(children))
    if not blocks:  # markup without block elements: fall back to its visible text
        blocks = [Block(p) for p in _paragraphs(soup.get_text("\n"))]
    return ParsedDocument(title=title, blocks=blocks)


def _declared_page_count(reader: Any) -> int | None:
    """``/Count`` of the page tree's root, if it is a number; None when it is missing."""
    try:
        count = reader.trailer["/Root"]["/Pages"]["/Count"]
    except (KeyError, TypeError, AttributeError):
        return None
    return count if isinstance(count, int) else None


def _parse_pdf(
    data: bytes, *, title: str, max_pages: int | None, max_chars: int | None
) -> ParsedDocument:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        # The count the root declares first: a tree that repeats one subtree a thousand
        # times at each level is walked until pypdf's own entry limit stops it.
        declared = _declared_page_count(reader)
        if max_pages is not None and declared is not None and declared > max_pages:
            raise DocumentTooLarge(
                f"the PDF has {declared} pages; the limit is {max_pages}", code="too_many_pages"
            )
        page_count = len(reader.pages)  # from the page tree; no page is read yet
        if max_pages is not None and page_count > max_pages:
            raise DocumentTooLarge(
                f"the PDF has {page_count} pages; the limit is {max_pages}", code="too_many_pages"
            )
        if not title and reader.metadata and reader.metadata.title:
            title = str(reader.metadata.title)
        blocks: list[Block] = []
        chars = 0
        for number, page in enumerate(reader.pages, start=1):
            for paragraph in _paragraphs(page.extract_text() or ""):
                blocks.append(Block(paragraph, page=number))
                chars += len(paragraph)
            if max_chars is not None and chars > max_chars:
                raise _too_many_chars(chars, max_chars, more=number < page_count)
    except (RetrievalError, MemoryError):
        raise
    except Exception as exc:  # see _unreadable
        raise _unreadable("PDF", exc) from exc
    return ParsedDocument(title=title, blocks=blocks, page_count=page_count)
