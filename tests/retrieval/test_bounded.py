"""Parsing in a bounded child process: the same result as in process, and every way a
hostile file can end the child (an error, its time or memory bound, a crash) as an error
with a code."""

from __future__ import annotations

import signal
import subprocess

import pytest

from retrieval import DocumentTooLarge, UnsupportedDocument, parse_document, parse_document_bounded
from retrieval.bounded import _outcome
from retrieval.parsing import HTML, MARKDOWN, PDF
from tests import hostile_files
from tests.retrieval.test_parsing import make_pdf

BOUNDS = {"memory_limit_mb": 1024, "time_limit_seconds": 60}


def test_the_child_reads_what_the_parser_reads_in_process() -> None:
    text = b"# Guide\n\nIntro.\n\n## Install\n\nRun make.\n\n### Linux\n\nUse apt."
    inline = parse_document(text, media_type=MARKDOWN, title="")
    bounded = parse_document_bounded(text, media_type=MARKDOWN, title="", **BOUNDS)
    assert (bounded.title, bounded.blocks, bounded.page_count) == (
        inline.title,
        inline.blocks,
        None,
    )
    pdf = parse_document_bounded(make_pdf(["One", "Two"]), media_type=PDF, title="", **BOUNDS)
    assert ([(b.page, b.text) for b in pdf.blocks], pdf.page_count) == ([(1, "One"), (2, "Two")], 2)


def test_limits_keep_their_codes_across_the_process_boundary() -> None:
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document_bounded(
            make_pdf(["a", "b", "c"]), media_type=PDF, title="", max_pages=2, **BOUNDS
        )
    assert (raised.value.code, str(raised.value)) == (
        "too_many_pages",
        "the PDF has 3 pages; the limit is 2",
    )
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document_bounded(
            hostile_files.one_tag_html(),
            media_type=HTML,
            title="",
            max_html_elements=200_000,
            **BOUNDS,
        )
    assert raised.value.code == "too_many_elements"


def test_a_pdf_that_recurses_past_the_stack_is_unsupported() -> None:
    with pytest.raises(UnsupportedDocument) as raised:
        parse_document_bounded(
            hostile_files.deeply_nested_pdf(), media_type=PDF, title="", **BOUNDS
        )
    assert (raised.value.code, str(raised.value)) == (
        "unsupported_document",
        "not a readable PDF: its objects are nested too deeply",
    )


def test_a_parse_past_its_cpu_bound_is_stopped() -> None:
    """5 MB of ``<b>`` with no element cap: a tree of 1.7 million elements to build."""
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document_bounded(
            hostile_files.one_tag_html(),
            media_type=HTML,
            title="",
            memory_limit_mb=4096,
            time_limit_seconds=1,
        )
    assert (raised.value.code, str(raised.value)) == (
        "parse_time_limit_exceeded",
        "parsing the file took more than its limit of 1 s of CPU",
    )


@pytest.mark.parametrize("killed_by", [signal.SIGXCPU, signal.SIGKILL])
def test_a_child_killed_past_its_cpu_bound_is_past_the_time_limit(killed_by: int) -> None:
    child = subprocess.CompletedProcess(args=[], returncode=-killed_by, stdout=b"")
    with pytest.raises(DocumentTooLarge) as raised:
        _outcome(child, time_limit_seconds=2, cpu_seconds=2.01)
    assert raised.value.code == "parse_time_limit_exceeded"


def test_a_parse_past_its_memory_bound_is_stopped() -> None:
    """The same file's tree needs over a GiB; the child may have 256 MiB."""
    with pytest.raises(DocumentTooLarge) as raised:
        parse_document_bounded(
            hostile_files.one_tag_html(),
            media_type=HTML,
            title="",
            memory_limit_mb=256,
            time_limit_seconds=120,
        )
    assert (raised.value.code, str(raised.value)) == (
        "parse_memory_limit_exceeded",
        "parsing the file needed more than its limit of 256 MiB",
    )


@pytest.mark.parametrize(
    ("returncode", "stdout", "expected"),
    [
        (-signal.SIGSEGV, b"", "the parser's process died on this file (signal SIGSEGV)"),
        # Killed before its CPU bound: the kernel's OOM killer, not the bound.
        (-signal.SIGKILL, b"", "the parser's process died on this file (signal SIGKILL)"),
        (-signal.SIGABRT, b"", "the parser's process died on this file (signal SIGABRT)"),
        (1, b"", "the parser's process died on this file (status 1)"),
        (0, b"not json", "the parser's process died on this file (status 0)"),
    ],
)
def test_a_child_that_dies_is_a_crashed_parser(
    returncode: int, stdout: bytes, expected: str
) -> None:
    child = subprocess.CompletedProcess(args=[], returncode=returncode, stdout=stdout)
    with pytest.raises(UnsupportedDocument) as raised:
        _outcome(child, time_limit_seconds=60, cpu_seconds=0.5)
    assert (raised.value.code, str(raised.value)) == ("parser_crashed", expected)
