"""Abuse inputs: the time and peak memory of each, next to a normal input's.

What is measured
    Each entry of ``CASES`` is a named piece of work (``Case(name, run)``): parsing a
    markdown heading of N spaces, chunking a 1 MiB single word, reading a PDF of many
    pages… Cases marked "normal" are the ordinary input of the same size or kind, for
    comparison. For each case the table gives:

    time       wall time of one ``run()``, ``time.perf_counter``;
    peak       the most memory Python held during a second ``run()`` under ``tracemalloc``
               (skipped when the first took longer than ``--trace-below`` seconds);
               tokenizers written in Rust are not traced: see max RSS;
    max RSS    the child process's peak resident size (imports and inputs included);
    outcome    ``ok``, or the exception ``run()`` raised (a limit's code, ``timeout``,
               ``MemoryError`` past ``--memory-limit``).

How
    Every case runs in a fresh child process (``python bench/abuse.py --child N``), so one
    case's memory is not counted in the next and a case that hangs is killed after
    ``--timeout`` seconds. The child's address space is capped at ``--memory-limit`` so
    that an input needing tens of GB fails with ``MemoryError`` instead of taking the
    machine down. Inputs are built by a case's ``prepare`` (cached), outside the timing.

    ``--ref REV`` also runs every case against the code of an older commit: ``git
    worktree add --detach`` checks it out into a temp folder, the children import
    ``retrieval`` (and anything else) from there, and the table shows both side by side.
    Cases only use the public API the older code also has (or detect what it lacks), so
    they run on both. The pre-fix revision for parsing and chunking is 7df0615.

Adding a case
    Append ``Case("what it is", run)`` to ``CASES``: ``run`` takes no arguments and its
    result is ignored; import what it needs inside it (the child sets up ``sys.path``
    first). Give it ``prepare=`` a ``functools.cache``'d builder when its input is costly
    to build, and call that builder from ``run``.

Run (from the repository root)
    .venv/bin/python bench/abuse.py
    .venv/bin/python bench/abuse.py --ref 7df0615 --timeout 60
    .venv/bin/python bench/abuse.py --only chunker --only pdf
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import importlib
import inspect
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git") or "git"
MIB = 2**20
WARM_IMPORTS = ["retrieval", "bs4", "pypdf"]
"""Imported by every child before its case, so that no case's time includes them."""


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], object]
    prepare: Callable[[], object] | None = None


# -- inputs (built once per child process) -------------------------------------------------

WORDS = ["the", "team", "keeps", "receipts", "for", "every", "claim", "and", "asks", "manager"]
WORDS += ["two", "weeks", "ahead", "leave", "days", "roll", "over", "once", "public", "sick"]


def prose(rng: random.Random, words: int) -> str:
    sentences = []
    while words > 0:
        n = min(words, rng.randint(6, 18))
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
        words -= n
    return " ".join(sentences)


@functools.cache
def normal_markdown() -> str:
    """About 1 MiB of handbook: sections of a few paragraphs each."""
    rng = random.Random(1)
    parts: list[str] = ["# Handbook\n"]
    size, section = 0, 0
    while size < MIB:
        section += 1
        part = f"\n## Section {section}\n\n" + "\n\n".join(
            prose(rng, rng.randint(40, 120)) for _ in range(rng.randint(2, 6))
        )
        parts.append(part)
        size += len(part)
    return "".join(parts)


@functools.cache
def many_headings_markdown() -> str:
    """1 MiB of headings, each with one short line of text."""
    parts, size, i = [], 0, 0
    while size < MIB:
        part = f"## Heading {i}\ntext {i}\n"
        parts.append(part)
        size += len(part)
        i += 1
    return "".join(parts)


@functools.cache
def huge_heading_markdown() -> str:
    """A 0.5 MiB heading over 0.5 MiB of one-letter paragraphs (~175,000 of them)."""
    return "## " + "h" * (MIB // 2) + "\n\n" + "a\n\n" * (MIB // 6)


@functools.cache
def normal_html() -> str:
    rng = random.Random(2)
    parts, size, section = ["<html><head><title>Handbook</title></head><body>"], 0, 0
    while size < MIB:
        section += 1
        part = f"<h2>Section {section}</h2>" + "".join(
            f"<p>{prose(rng, rng.randint(40, 120))}</p>" for _ in range(rng.randint(2, 6))
        )
        parts.append(part)
        size += len(part)
    return "".join(parts) + "</body></html>"


@functools.cache
def normal_parsed() -> Any:
    from retrieval.parsing import MARKDOWN, parse_document

    return parse_document(normal_markdown().encode(), media_type=MARKDOWN, title="")


@functools.cache
def base64_word() -> str:
    return base64.b64encode(random.Random(3).randbytes(MIB * 3 // 4)).decode()


@functools.cache
def minilm_count() -> Callable[[str], int]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from retrieval import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    return count


def pdf(pages: int, chars_per_page: int = 0) -> bytes:
    """A PDF written by pypdf: blank pages, or pages of one line of text repeated."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    line = "Leave days roll over once and public holidays are extra. "
    for number in range(pages):
        page = writer.add_blank_page(612, 792)
        if not chars_per_page:
            continue
        text = (f"Page {number}. " + line * (chars_per_page // len(line) + 1))[:chars_per_page]
        stream = DecodedStreamObject()
        stream.set_data(f"BT /F1 4 Tf 20 770 Td ({text}) Tj ET".encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


normal_pdf = functools.cache(lambda: pdf(20, 2_500))
blank_pdf = functools.cache(lambda: pdf(10_000))
wordy_pdf = functools.cache(lambda: pdf(2_000, 2_500))


# -- what the worker's parse and chunk stages do, on either version of the code ------------

MAX_PAGES = 2_000  # RAGTIER_MAX_PDF_PAGES's default
CHUNK_TOKENS = 254  # MiniLM's 256 less [CLS] and [SEP], as the chunk stage asks


def parse(data: str | bytes, media_type: str, *, max_chars: int = 5_000_000) -> Any:
    """``parse_document`` with the worker's limits; an older version without ``max_chars``
    is checked after parsing, as its worker did."""
    from retrieval import DocumentTooLarge, parse_document

    raw = data.encode() if isinstance(data, str) else data
    limits: dict[str, int] = {"max_pages": MAX_PAGES}
    if "max_chars" in inspect.signature(parse_document).parameters:
        limits["max_chars"] = max_chars
    document = parse_document(raw, media_type=media_type, title="", **limits)
    if document.char_count > max_chars:
        raise DocumentTooLarge("too many characters", code="document_too_large")
    return document


def stored(document: Any) -> str:
    """The blocks as the parse stage stores them (the ``parsed`` JSON column)."""
    if hasattr(document, "to_json"):
        return json.dumps(document.to_json())
    return json.dumps([[b.text, list(b.headings), b.page] for b in document.blocks])


def chunk(document: Any, count_tokens: Callable[[str], int] | None = None) -> Any:
    from retrieval import FakeEmbedder, chunk_document

    return chunk_document(
        document,
        count_tokens=count_tokens or FakeEmbedder().count_tokens,
        max_tokens=CHUNK_TOKENS,
        overlap_tokens=32,
        max_chunks=20_000,
    )


def one_word(word: str) -> Any:
    from retrieval import Block, ParsedDocument

    return ParsedDocument("Upload", [Block(word)])


def heading_case(spaces: int) -> Case:
    line = "## x" + " " * spaces + "y"
    return Case(f"markdown heading, {spaces:,} spaces", lambda: parse(f"{line}\n\nBody.", MD))


MD, HTML, PDF = "text/markdown", "text/html", "application/pdf"
DEPTH = 2_000

CASES: list[Case] = [
    Case("markdown heading, normal (normal)", lambda: parse("## Leave\n\nBody.", MD)),
    *(heading_case(spaces) for spaces in (400, 800, 1_600, 12_000)),
    Case(
        "markdown 1 MiB handbook, parse + stored blocks (normal)",
        lambda: stored(parse(normal_markdown(), MD)),
        prepare=normal_markdown,
    ),
    Case(
        "markdown 1 MiB of ~60k headings, parse + stored blocks",
        lambda: stored(parse(many_headings_markdown(), MD)),
        prepare=many_headings_markdown,
    ),
    Case(
        "markdown 0.5 MiB heading over 175k paragraphs, parse + stored",
        lambda: stored(parse(huge_heading_markdown(), MD)),
        prepare=huge_heading_markdown,
    ),
    Case(
        "html 1 MiB handbook (normal)",
        lambda: parse(normal_html(), HTML),
        prepare=normal_html,
    ),
    Case(
        f"html {DEPTH:,} nested <div> around {DEPTH:,} <p>",
        lambda: parse("<div>" * DEPTH + "<p>x</p>" * DEPTH, HTML),
    ),
    Case(
        f"html {DEPTH * 10:,} nested <div> around {DEPTH * 10:,} <p>",
        lambda: parse("<div>" * DEPTH * 10 + "<p>x</p>" * DEPTH * 10, HTML),
    ),
    Case(f"html {DEPTH:,} nested <h2>", lambda: parse("<h2>" * DEPTH + "x<p>Body.</p>", HTML)),
    Case(
        "chunker, 1 MiB handbook (normal)",
        lambda: chunk(normal_parsed()),
        prepare=normal_parsed,
    ),
    Case("chunker, 1 MiB word of letters (1 token)", lambda: chunk(one_word("a" * MIB))),
    Case("chunker, 1 MiB base64 word", lambda: chunk(one_word(base64_word())), base64_word),
    Case("chunker, 1 MiB word of '.' (1M tokens)", lambda: chunk(one_word("." * MIB))),
    Case(
        "chunker, 1 MiB handbook, MiniLM tokenizer (normal)",
        lambda: chunk(normal_parsed(), minilm_count()),
        prepare=lambda: (normal_parsed(), minilm_count()),
    ),
    Case(
        "chunker, 1 MiB base64 word, MiniLM tokenizer",
        lambda: chunk(one_word(base64_word()), minilm_count()),
        prepare=lambda: (base64_word(), minilm_count()),
    ),
    Case("pdf 20 pages of text (normal)", lambda: parse(normal_pdf(), PDF), normal_pdf),
    Case(
        "pdf 10,000 blank pages (limit 2,000)",
        lambda: parse(blank_pdf(), PDF),
        prepare=blank_pdf,
    ),
    Case(
        "pdf 2,000 pages x 2,500 chars, text limit 500k",
        lambda: parse(wordy_pdf(), PDF, max_chars=500_000),
        prepare=wordy_pdf,
    ),
    Case(
        "pdf 2,000 pages x 2,500 chars, within limits",
        lambda: parse(wordy_pdf(), PDF),
        prepare=wordy_pdf,
    ),
]


# -- the chat surfaces ------------------------------------------------------------------------
# ``POST /v1/chat/completions`` in process, through Django's test client: the real GGUF
# tokenizer (the default ``TOKENIZER_BACKEND``), the fake inference tier
# (``tests.fake_upstream``) on a loopback socket, SQLite in a temp folder, migrated in
# ``prepare`` with one warm-up request (untimed). RAG is off: what is measured is what a
# request costs on its way to the model (its messages validated, counted, fitted, admitted)
# plus the fake tier's three-token answer. The pre-fix revision for these is 7df0615.


class Refused(Exception):
    """The endpoint answered an error: its code is the case's outcome."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"{status} {code}")
        self.code = code


_ALIVE: list[Any] = []
"""What must outlive ``chat_client()``: the fake tier's server thread."""


@functools.cache
def chat_client() -> Any:
    # Celery's Django fix-up puts the working directory first on sys.path: make it the
    # tree this child imports from (``--root``), or ``apps`` would come from another one.
    import retrieval

    os.chdir(Path(retrieval.__file__).resolve().parents[1])
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings.base",
        RAGTIER_DATA_DIR=tempfile.mkdtemp(prefix="abuse-chat-"),
        DJANGO_ALLOWED_HOSTS="testserver",
        EMBEDDER_BACKEND="retrieval.embedders.FakeEmbedder",
        LOG_LEVEL="ERROR",
    )
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from apps.accounts.services import api_key_create
    from tests import factories
    from tests.fake_upstream import fake_upstream

    call_command("migrate", verbosity=0)
    stack = contextlib.ExitStack()
    _ALIVE.append(stack)
    settings.INFERENCE_BASE_URL = stack.enter_context(fake_upstream()).base_url
    key = api_key_create(team=factories.team(name="abuse"), name="abuse").secret
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    chat([{"role": "user", "content": "Warm up."}], client=client)  # loads the tokenizer
    return client


def chat(messages: list[dict[str, str]], *, window: int | None = None, client: Any = None) -> None:
    """One non-streaming completion; ``window``: the model's context window instead."""
    from django.conf import settings
    from django.test import override_settings

    small = settings.MODEL_ALIASES["small"]
    aliases = {"small": {**small, "context_window": window or small["context_window"]}}
    body = {"model": "small", "messages": messages, "rag": {"enabled": False}}
    with override_settings(MODEL_ALIASES=aliases):
        response = (client or chat_client()).post(
            "/v1/chat/completions", data=body, content_type="application/json"
        )
    if response.status_code != 200:
        raise Refused(response.status_code, response.json()["error"]["code"])


def empty_messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": ""} for _ in range(count)]


@functools.cache
def prose_history() -> list[dict[str, str]]:
    """400 turns of about 120 words each (~60k tokens), then the question."""
    rng = random.Random(4)
    turns = [{"role": ("user", "assistant")[i % 2], "content": prose(rng, 120)} for i in range(400)]
    return [*turns, {"role": "user", "content": "And the receipts?"}]


CASES += [
    Case(
        "/v1 chat, one question (normal)",
        lambda: chat([{"role": "user", "content": "What is RAG?"}]),
        prepare=chat_client,
    ),
    Case("/v1 chat, 1,000 empty messages", lambda: chat(empty_messages(1_000)), chat_client),
    Case("/v1 chat, 2,000 empty messages", lambda: chat(empty_messages(2_000)), chat_client),
    Case(
        "/v1 chat, 1,000 empty messages fitted to a 4,096-token window",
        lambda: chat(empty_messages(1_000), window=4_096),
        prepare=chat_client,
    ),
    Case(
        "/v1 chat, 400 turns of prose (~60k tokens) fitted to 8,192",
        lambda: chat(prose_history()),
        prepare=lambda: (chat_client(), prose_history()),
    ),
]


# -- running --------------------------------------------------------------------------------


def outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    code = getattr(exc, "code", None)
    return f"{type(exc).__name__} {code}" if isinstance(code, str) else type(exc).__name__


def child(index: int, *, trace_below: float) -> None:
    """Run one case and print what it measured, one JSON object per line."""
    case = CASES[index]
    for module in WARM_IMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    if case.prepare is not None:
        case.prepare()
    failure: BaseException | None = None
    start = time.perf_counter()
    try:
        case.run()
    except Exception as exc:  # a limit refusing the input is an outcome, not a crash
        failure = exc
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "outcome": outcome(failure), "rss": max_rss()}))
    sys.stdout.flush()
    if seconds <= trace_below:
        tracemalloc.start()
        with contextlib.suppress(Exception):
            case.run()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(json.dumps({"peak": peak, "rss": max_rss()}))


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(index: int, *, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run case ``index`` in a child process importing the code under ``root``."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(index),
        "--root",
        str(root),
        "--trace-below",
        str(args.trace_below),
        "--memory-limit",
        str(args.memory_limit),
    ]
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=args.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            timed_out = True
        out.seek(0)
        lines = out.read().splitlines()
    result: dict[str, Any] = {}
    for line in lines:
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict):
                result.update(parsed)
    if "seconds" not in result:
        result["outcome"] = "timeout" if timed_out else "crashed: " + " ".join(lines[-1:])
        result["seconds"] = args.timeout if timed_out else None
        result["over"] = timed_out
    return result


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The tree at ``rev`` in a temp folder (a detached ``git worktree``), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="abuse-ref-")) / "tree"
    subprocess.run(
        [GIT, "worktree", "add", "--detach", "--quiet", str(folder), rev],
        cwd=REPO_ROOT,
        check=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(
            [GIT, "worktree", "remove", "--force", str(folder)], cwd=REPO_ROOT, check=False
        )
        with contextlib.suppress(OSError):
            folder.parent.rmdir()


def seconds_text(result: dict[str, Any]) -> str:
    seconds = result.get("seconds")
    if seconds is None:
        return "-"
    return f"> {seconds:.0f} s" if result.get("over") else f"{seconds:.3f} s"


def size_text(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f} MiB"


def row(result: dict[str, Any]) -> list[str]:
    return [
        seconds_text(result),
        size_text(result.get("peak")),
        size_text(result.get("rss")),
        str(result.get("outcome", "")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="also run every case on this git revision")
    parser.add_argument("--only", action="append", default=[], help="cases whose name has this")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per case (60)")
    parser.add_argument("--trace-below", type=float, default=20, help="tracemalloc when faster")
    parser.add_argument("--memory-limit", type=int, default=4096, help="MiB per child (4096)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        limit = args.memory_limit * MIB
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        sys.path.insert(0, str(args.root))
        child(args.child, trace_below=args.trace_below)
        return

    chosen = [
        index
        for index, case in enumerate(CASES)
        if not args.only or any(word in case.name for word in args.only)
    ]
    columns = ["time", "peak", "max RSS", "outcome"]
    with checkout(args.ref) if args.ref else contextlib.nullcontext() as ref_root:
        header = ["case", *columns]
        if ref_root is not None:
            header = ["case", *(f"{args.ref} {c}" for c in columns), *columns]
        print(" | ".join(header))
        for index in chosen:
            cells = [CASES[index].name]
            if ref_root is not None:
                cells += row(measure(index, root=ref_root, args=args))
            cells += row(measure(index, root=REPO_ROOT, args=args))
            print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
