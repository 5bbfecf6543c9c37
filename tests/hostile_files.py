"""Hostile files, built in code: what one team could upload to hurt every other team's
ingestion. Used by the parsing and worker tests and by ``bench/abuse.py``.

Each builder returns the bytes of one file; ``HOSTILE`` names them with a file name whose
extension and magic bytes pass the upload's checks, so that only parsing meets them.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

MIB = 1024 * 1024


def pdf(objects: list[bytes], *, trailer: bytes = b"", xref: bool = True) -> bytes:
    """A PDF of these object bodies (object 1 is the catalog) with a correct cross-reference
    table, or none at all; ``trailer`` is added to the trailer dictionary."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    start = out.tell()
    if xref:
        out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
        for offset in offsets:
            out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R ".encode()
        + trailer
        + f" >>\nstartxref\n{start}\n%%EOF\n".encode()
    )
    return out.getvalue()


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def page(contents: int, *, parent: int = 2, font: int) -> bytes:
    return (
        f"<< /Type /Page /Parent {parent} 0 R /MediaBox [0 0 612 792] /Contents {contents} 0 R "
        f"/Resources << /Font << /F1 {font} 0 R >> >> >>"
    ).encode()


def stream(data: bytes, *, flate: bool = False) -> bytes:
    kind = b" /Filter /FlateDecode" if flate else b""
    return b"<< /Length %d%s >>\nstream\n" % (len(data), kind) + data + b"\nendstream"


def ordinary_pdf(text: str = "Dates grow on palms") -> bytes:
    """One page of text: what a tenant uploads on an ordinary day."""
    content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    return pdf(
        [
            CATALOG,
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            page(4, font=5),
            stream(content),
            FONT,
        ]
    )


def deeply_nested_pdf(depth: int = 50_000) -> bytes:
    """A page whose content stream holds an array nested ``depth`` deep: the page tree
    reads fine, then pypdf's recursive content-stream reader runs out of stack
    (``RecursionError``) when the page's text is extracted."""
    content = b"BT /F1 12 Tf " + b"[" * depth + b"]" * depth + b" TJ ET"
    return pdf(
        [
            CATALOG,
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            page(4, font=5),
            stream(content),
            FONT,
        ]
    )


def broken_xref_pdf() -> bytes:
    """A cross-reference table whose entries point into the middle of other objects and
    a ``startxref`` past the end, over objects whose dictionaries never close."""
    good = ordinary_pdf()
    body, _, _ = good.partition(b"xref\n")
    table = b"xref\n0 6\n0000000000 65535 f \n" + b"".join(
        b"%010d 00000 n \n" % (7 * i + 3) for i in range(5)
    )
    broken = body.replace(b">> >> >>", b">> >>").replace(b"/Count 1 >>", b"/Count 1")
    return broken + table + b"trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n99999999\n%%EOF\n"


def page_tree_bomb_pdf(fanout: int = 1_000, levels: int = 3) -> bytes:
    """A page tree of ``fanout ** levels`` pages (a billion by default) in a few kB: each
    level's ``/Kids`` names the same node of the level below ``fanout`` times."""
    objects = [CATALOG]
    for level in range(levels):  # objects 2 .. levels + 1 are the Pages nodes
        child = 3 + level
        kids = b" ".join([b"%d 0 R" % child] * fanout)
        count = fanout ** (levels - level)
        objects.append(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count))
    leaf_parent = levels + 1
    objects.append(page(levels + 3, parent=leaf_parent, font=levels + 4))
    objects.append(stream(b"BT /F1 12 Tf 72 720 Td (leaf) Tj ET"))
    objects.append(FONT)
    return pdf(objects)


def stream_bomb_pdf(decompressed_mib: int = 256) -> bytes:
    """One page whose content stream inflates from about a thousandth of its size to
    ``decompressed_mib`` MiB (a zip bomb in a PDF's FlateDecode filter)."""
    packer = zlib.compressobj(9)
    block = b" " * MIB
    packed = b"".join(packer.compress(block) for _ in range(decompressed_mib)) + packer.flush()
    return pdf(
        [
            CATALOG,
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            page(4, font=5),
            stream(packed, flate=True),
            FONT,
        ]
    )


def deeply_nested_html(depth: int = 100_000) -> bytes:
    """``depth`` unclosed ``<div>`` elements, one inside the other, around a paragraph."""
    return ("<html><body>" + "<div>" * depth + "<p>deep</p></body></html>").encode()


def one_tag_html(megabytes: int = 5) -> bytes:
    """``megabytes`` MB of one three-byte tag, ``<b>``: about 1.7 million nested elements
    in 5 MB, just within the upload's limit of 5,000,000 characters."""
    return b"<b>" * (megabytes * 1_000_000 // 3)


HOSTILE: dict[str, Callable[[], bytes]] = {
    "deeply-nested.pdf": deeply_nested_pdf,
    "broken-xref.pdf": broken_xref_pdf,
    "page-tree-bomb.pdf": page_tree_bomb_pdf,
    "stream-bomb.pdf": stream_bomb_pdf,
    "deeply-nested.html": deeply_nested_html,
    "one-tag-5mb.html": one_tag_html,
}
"""Every hostile file, by the name it is uploaded under."""
