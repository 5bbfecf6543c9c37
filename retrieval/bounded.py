"""Parsing untrusted files in a child process with its own time and memory bounds.

A crafted file can make a parser recurse past the C stack, allocate without end or spin
for hours; none of that may reach the process that asked (a worker holding other teams'
documents, or their place among the documents in flight). :func:`parse_document_bounded`
runs :func:`retrieval.parsing.parse_document` in a fresh interpreter that sets its own
``RLIMIT_AS`` and ``RLIMIT_CPU`` first, and turns every way the child can end (an error
it reports, a signal from its limits, a crash) into a :class:`RetrievalError` with a code.

The child imports the parser alone: the package's ``__init__`` loads FAISS and numpy,
which parsing does not use and whose address space would count against its bound.
"""

from __future__ import annotations

import functools
import json
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from retrieval.errors import DocumentTooLarge, RetrievalError, UnsupportedDocument
from retrieval.parsing import ParsedDocument, parse_document

MIB = 1024 * 1024

_CHILD = """\
import sys, types
sys.path.extend({site})
package = types.ModuleType("retrieval")
package.__path__ = [{package}]
sys.modules["retrieval"] = package
from retrieval.bounded import _child_main
_child_main()
"""


def parse_document_bounded(
    data: bytes,
    *,
    media_type: str,
    title: str,
    max_pages: int | None = None,
    max_chars: int | None = None,
    max_html_elements: int | None = None,
    memory_limit_mb: int = 0,
    time_limit_seconds: int = 0,
) -> ParsedDocument:
    """:func:`~retrieval.parsing.parse_document` in a child process of at most
    ``memory_limit_mb`` MiB of address space and ``time_limit_seconds`` of CPU (0: no
    bound); it is killed after twice that in wall time plus 10 s.

    Raises :class:`DocumentTooLarge` for a limit (``too_many_pages``,
    ``document_too_large``, ``too_many_elements``, ``parse_time_limit_exceeded``,
    ``parse_memory_limit_exceeded``) and :class:`UnsupportedDocument` for a file the parser
    cannot read (``unsupported_document``) or whose parser process died (``parser_crashed``).
    """
    request = {
        "media_type": media_type,
        "title": title,
        "max_pages": max_pages,
        "max_chars": max_chars,
        "max_html_elements": max_html_elements,
        "memory_limit_mb": memory_limit_mb,
        "time_limit_seconds": time_limit_seconds,
    }
    wall = 2 * time_limit_seconds + 10 if time_limit_seconds > 0 else None
    cpu_before = _children_cpu()
    try:
        # -I: no PYTHON* variables, user site or working directory decide what it imports;
        # -S: no site hooks either (they cost more than the parse of a small file), only
        # the folders that hold this interpreter's packages (pypdf, bs4).
        child = subprocess.run(  # noqa: S603 - our own interpreter and code, no shell
            [sys.executable, "-I", "-S", "-c", _child_code(), json.dumps(request)],
            input=data,
            capture_output=True,
            timeout=wall,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed it
        raise _time_limit(time_limit_seconds) from exc
    return _outcome(
        child, time_limit_seconds=time_limit_seconds, cpu_seconds=_children_cpu() - cpu_before
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@functools.cache
def _child_code() -> str:
    site = [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]
    return _CHILD.format(site=repr(site), package=repr(str(Path(__file__).resolve().parent)))


def _outcome(
    child: subprocess.CompletedProcess[bytes], *, time_limit_seconds: int, cpu_seconds: float
) -> ParsedDocument:
    """The parsed document, or the error for how the child ended; ``cpu_seconds``: what it
    used, which tells its CPU bound's SIGKILL from the kernel's OOM killer's."""
    reply: dict[str, Any] | None = None
    if child.returncode == 0:
        try:
            reply = json.loads(child.stdout)
        except ValueError:
            reply = None
    if reply is None:
        killed_by = -child.returncode if child.returncode < 0 else None
        past_cpu = time_limit_seconds > 0 and cpu_seconds >= time_limit_seconds
        if killed_by == signal.SIGXCPU or (killed_by == signal.SIGKILL and past_cpu):
            raise _time_limit(time_limit_seconds)
        how = (
            f"signal {signal.Signals(killed_by).name}"
            if killed_by in signal.valid_signals() and killed_by is not None
            else f"status {child.returncode}"
        )
        raise UnsupportedDocument(
            f"the parser's process died on this file ({how})", code="parser_crashed"
        )
    if "error" in reply:
        code, message = str(reply["error"]), str(reply["message"])
        if reply.get("too_large"):
            raise DocumentTooLarge(message, code=code)
        raise UnsupportedDocument(message, code=code)
    document = ParsedDocument.from_json(reply["blocks"], title=str(reply["title"]))
    document.page_count = reply["page_count"]
    return document


def _time_limit(seconds: int) -> DocumentTooLarge:
    return DocumentTooLarge(
        f"parsing the file took more than its limit of {seconds} s of CPU",
        code="parse_time_limit_exceeded",
    )


def _child_main() -> None:
    """The child: bound itself, parse stdin, write one JSON reply on stdout."""
    request = json.loads(sys.argv[1])
    memory_mb, cpu_seconds = request["memory_limit_mb"], request["time_limit_seconds"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash on a hostile file dumps no core
    if memory_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MIB, memory_mb * MIB))
    if cpu_seconds > 0:
        # SIGXCPU at the soft limit ends the process; SIGKILL a second later if it lingers.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    reply = _child_parse(sys.stdin.buffer.read(), request)
    try:
        out = json.dumps(reply)
    except MemoryError:
        del reply
        out = json.dumps(_out_of_memory(memory_mb))
    sys.stdout.write(out)
    sys.stdout.flush()


def _out_of_memory(memory_mb: int) -> dict[str, Any]:
    return {
        "error": "parse_memory_limit_exceeded",
        "message": f"parsing the file needed more than its limit of {memory_mb} MiB",
        "too_large": True,
    }


def _child_parse(data: bytes, request: dict[str, Any]) -> dict[str, Any]:
    try:
        document = parse_document(
            data,
            media_type=request["media_type"],
            title=request["title"],
            max_pages=request["max_pages"],
            max_chars=request["max_chars"],
            max_html_elements=request["max_html_elements"],
        )
    except MemoryError:
        # What it had allocated is freed with the frames the error unwound.
        return _out_of_memory(request["memory_limit_mb"])
    except DocumentTooLarge as exc:
        return {"error": exc.code, "message": str(exc), "too_large": True}
    except UnsupportedDocument as exc:
        return {"error": exc.code, "message": str(exc)}
    except RetrievalError as exc:
        return {"error": "unsupported_document", "message": str(exc)}
    return {
        "title": document.title,
        "page_count": document.page_count,
        "blocks": document.to_json(),
    }
