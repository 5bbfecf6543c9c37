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
    archive`` writes it out into a temp folder, the children import
    ``retrieval`` (and anything else) from there, and the table shows both side by side.
    Cases only use the public API the older code also has (or detect what it lacks), so
    they run on both. The pre-fix revision for parsing and chunking is 7df0615.

Adding a case
    Append ``Case("what it is", run)`` to ``CASES``: ``run`` takes no arguments and its
    result is ignored; import what it needs inside it (the child sets up ``sys.path``
    first). Give it ``prepare=`` a ``functools.cache``'d builder when its input is costly
    to build, and call that builder from ``run``.

    ``--tenants`` measures instead what one team's hostile files (``tests/hostile_files.py``)
    do to another team's ingestion through a real worker: see the section of that name
    below; docs/abuse.md has the figures. ``--burst`` measures what one team's flood of
    cheap requests (keyword searches, listings) does to another team's time to first token
    in the same web process: see its section.

Run (from the repository root)
    .venv/bin/python bench/abuse.py
    .venv/bin/python bench/abuse.py --tenants --ref 6e733fd --timeout 120
    .venv/bin/python bench/abuse.py --burst --ref 6e733fd
    .venv/bin/python bench/abuse.py --ref 7df0615 --timeout 60
    .venv/bin/python bench/abuse.py --only chunker --only pdf
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import importlib
import inspect
import io
import itertools
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
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


# -- one team's hostile files, another team's ordinary document --------------------------------
# ``--tenants``: the whole ingestion path, not one function. Django runs in a child process
# (``--tenants-child``) on the code under test (``--root``; ``--ref`` adds an older
# commit), on the embedded default: a SQLite file and the on-disk broker (``--broker``: a
# Redis URL, flushed) in a temp folder, the fake embedder (``--embedder real``:
# all-MiniLM-L6-v2), one real Celery worker started as ``runstack`` starts it (prefork,
# ``--concurrency`` children, 1, and that WORKER_CONCURRENCY for the web process too) with
# the default INGEST_MAX_IN_FLIGHT. The child is the web process: it uploads with
# ``document_create_from_file``, as the upload endpoint does.
#
#   alone     team B uploads its ordinary document (a 30-section handbook, 14 kB of
#             markdown) with nothing else queued: upload to ``indexed``, median of 5,
#             after each pool child has loaded its embedder;
#   busy      team C uploads as many ordinary documents as the corpus has files, then
#             team B another: B's upload to ``indexed`` (what any backlog costs B);
#   attacked  team A uploads every file of ``tests.hostile_files.HOSTILE``, then team B
#             uploads another ordinary document: B's upload to ``indexed``.
#             In these two, B is a team of its own that has not used the workers yet, as
#             a team coming with one document is, not the one the alone runs charged.
#   per file  the web process's CPU for A's upload (``time.thread_time``), what the upload
#             answered, and how the document ended (its error's code) or that it was still
#             held by the workers when B was done.


EMBEDDERS = {
    "fake": "retrieval.embedders.FakeEmbedder",
    "real": "retrieval.embedders.SentenceTransformerEmbedder",
}


def handbook(label: str, sections: int = 30) -> str:
    rng = random.Random(label)
    return "\n\n".join(f"## {label} part {i}\n\n" + prose(rng, 80) for i in range(sections))


def tenants_child(root: Path, corpus_dir: Path, args: argparse.Namespace) -> None:
    timeout = args.timeout
    data_dir = Path(tempfile.mkdtemp(prefix="abuse-tenants-"))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "RAGTIER_DATA_DIR": str(data_dir),
        "EMBEDDER_BACKEND": EMBEDDERS[args.embedder],
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "HF_HUB_OFFLINE": "1",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(root),
        "WORKER_CONCURRENCY": str(args.concurrency),  # the web process dispatches for it
    }
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "INGEST_MAX_IN_FLIGHT"):
        env.pop(name, None)
    if args.broker:
        import redis

        env["CELERY_BROKER_URL"] = args.broker
        redis.Redis.from_url(args.broker, socket_connect_timeout=2).flushdb()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(root)
    import django

    django.setup()
    from django.conf import settings
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.core.management import call_command

    from apps.accounts.services import team_create
    from apps.knowledge.models import Document
    from apps.knowledge.services import collection_create, document_create_from_file
    from apps.site.management.commands.runstack import worker_argv

    call_command("migrate", verbosity=0)
    log = data_dir / "worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [
                *worker_argv(sys.executable, concurrency=args.concurrency),
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    a = collection_create(team=team_create(name="A"), name="hostile")
    b = collection_create(team=team_create(name="B"), name="ordinary")

    def fresh(name: str) -> Any:
        """Team B as it comes to each case: a team that has not used the workers lately
        (the alone runs would otherwise count against it with a fair dispatcher)."""
        return collection_create(team=team_create(name=name), name="ordinary")

    def upload(collection: Any, name: str, data: bytes) -> tuple[Any, float, str]:
        cpu = time.thread_time()
        try:
            document = document_create_from_file(
                collection=collection, upload=SimpleUploadedFile(name, data)
            ).document
            answer = "202"
        except Exception as exc:  # what the endpoint would have answered instead
            document, answer = None, outcome(exc).replace(" ", ":")
        return document, time.thread_time() - cpu, answer

    def indexed_after(document: Any, started: float) -> float | None:
        deadline = started + timeout
        while time.monotonic() < deadline:
            status = Document.objects.values_list("status", flat=True).get(pk=document.pk)
            if status in ("indexed", "failed"):
                return time.monotonic() - started if status == "indexed" else None
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited; see {log}")
            time.sleep(0.05)
        return None

    try:
        # Every pool child loads its embedder once: warm them all up, untimed.
        warm = collection_create(team=team_create(name="warm-up"), name="warm-up")
        warming = [
            upload(warm, f"warm-{i}.md", handbook(f"warm{i}").encode())[0]
            for i in range(4 * args.concurrency)
        ]
        for document in warming:
            indexed_after(document, time.monotonic())
        alone = []
        for i in range(5):
            started = time.monotonic()
            text = handbook(f"alone{i}").encode()
            document, _, _ = upload(b, f"handbook-{i}.md", text)
            alone.append(indexed_after(document, started))
        # The same number of ordinary documents from another team, for comparison.
        busy_team = collection_create(team=team_create(name="C"), name="ordinary")
        backlog = [
            upload(busy_team, f"c-{path.name}.md", handbook(f"c{path.name}").encode())[0]
            for path in sorted(corpus_dir.iterdir())
        ]
        started = time.monotonic()
        ordinary, _, _ = upload(fresh("B-busy"), "handbook-busy.md", handbook("busy").encode())
        busy = indexed_after(ordinary, started)
        for document in backlog:
            indexed_after(document, time.monotonic())
        files = []
        for path in sorted(corpus_dir.iterdir()):
            document, cpu, answer = upload(a, path.name, path.read_bytes())
            files.append((path.name, document, cpu, answer))
        started = time.monotonic()
        text = handbook("attacked").encode()
        ordinary, _, _ = upload(fresh("B-attacked"), "handbook-attacked.md", text)
        attacked = indexed_after(ordinary, started)
        result: dict[str, Any] = {
            "alone": sorted(s for s in alone if s is not None)[2] if None not in alone else None,
            "attacked": attacked,
            "busy": busy,
            "in_flight": settings.INGEST_MAX_IN_FLIGHT,
            "files": [],
        }
        for name, document, cpu, answer in files:
            ended = "-"
            if document is not None:
                document.refresh_from_db()
                ended = document.status
                if document.status == "failed":
                    code = document.error.split(": ", 1)[0]
                    ended = code if code.isidentifier() else f"failed ({document.error[:40]})"
                elif document.status in ("queued", "processing"):
                    held = document.dispatched_at is not None
                    ended = "still holds a place" if held else "still waiting"
            result["files"].append({"name": name, "cpu": cpu, "answer": answer, "ended": ended})
        print(json.dumps(result), flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def tenants(root: Path, corpus_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--tenants-child",
        str(corpus_dir),
        "--root",
        str(root),
        "--timeout",
        str(args.timeout),
        "--embedder",
        args.embedder,
        "--broker",
        args.broker,
        "--concurrency",
        str(args.concurrency),
    ]
    # Past the attacked run's own timeout, the worker's shutdown and the uploads.
    done = subprocess.run(command, capture_output=True, text=True, timeout=4 * args.timeout + 120)
    for line in reversed(done.stdout.splitlines()):
        with contextlib.suppress(ValueError):
            return dict(json.loads(line))
    raise SystemExit(f"the tenants run on {root} printed no result:\n{done.stderr[-3000:]}")


def tenants_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.hostile_files import HOSTILE

    corpus_dir = Path(tempfile.mkdtemp(prefix="abuse-corpus-"))
    for name, build in HOSTILE.items():
        (corpus_dir / name).write_bytes(build())
    runs: list[tuple[str, dict[str, Any]]] = []
    with checkout(args.ref) if args.ref else contextlib.nullcontext() as ref_root:
        if ref_root is not None:
            runs.append((args.ref, tenants(ref_root, corpus_dir, args)))
        runs.append(("this tree", tenants(REPO_ROOT, corpus_dir, args)))
    shutil.rmtree(corpus_dir, ignore_errors=True)

    def secs(value: float | None) -> str:
        return f"> {args.timeout:.0f} s" if value is None else f"{value:.2f} s"

    print(
        f"one worker (prefork, concurrency {args.concurrency}), broker "
        f"{args.broker or 'on disk'}, {args.embedder} embedder, {os.cpu_count()} CPUs"
    )
    for label, result in runs:
        alone = result["alone"]

        def ratio(value: float | None, alone: float | None = alone) -> str:
            return "-" if alone is None or value is None else f"{value / alone:.1f}x"

        print(
            f"\n{label}: INGEST_MAX_IN_FLIGHT {result['in_flight']}; team B's document "
            f"alone {secs(alone)}; while team A uploads the corpus {secs(result['attacked'])} "
            f"({ratio(result['attacked'])}); behind as many ordinary documents of team C "
            f"{secs(result.get('busy'))} ({ratio(result.get('busy'))})"
        )
        print(" | ".join(["A's file", "web CPU per upload", "upload answered", "ended"]))
        for file in result["files"]:
            cells = [file["name"], f"{file['cpu'] * 1000:.1f} ms", file["answer"], file["ended"]]
            print(" | ".join(cells))


# -- one team's request flood, another team's first token -------------------------------------
# ``--burst``: the app as ``runstack`` serves it (``uvicorn config.asgi:application``, one
# process, started in the tree under test: this one, and with ``--ref`` the older commit)
# on the embedded default (a fresh SQLite file in a temp data folder; the per-team request
# limit at its default, REQUEST_RATE_PER_SECOND 20 and REQUEST_BURST 100, where the code
# has one), the fake embedder, and the fake OpenAI-compatible tier of bench/gateway.py (its
# own process, zero delay). A setup child in the same tree migrates, creates teams A and
# B with a key each and ingests demo/corpus/ into a collection of A's.
#
#   B        one streaming ``POST /v1/chat/completions`` at a time (``max_tokens`` 1, RAG
#            and the response cache off), one started every ``--burst-interval`` seconds
#            (10/s: under B's own limit); TTFT = send -> first content chunk, at the client;
#   alone    B for ``--burst-seconds`` after ``--burst-warmup`` answers;
#   flood    team A, from another process (``--burst-flood``), ``--burst-connections``
#            connections each sending, as fast as answers come back, keyword searches
#            (``POST /api/v1/search``, mode keyword, a query of ~4,000 characters of the
#            corpus's words) and listings (collections, conversations) in turn, Retry-After
#            ignored; B measured again for ``--burst-seconds`` from ``--burst-ramp``
#            seconds after A started;
#   web CPU  the uvicorn process's CPU seconds (all threads, bench/gateway.py's
#            ``cpu_seconds``) per second of each phase.

BURST_SETUP = """
import io, json, sys

import django

django.setup()
from django.core.management import call_command

call_command("migrate", verbosity=0)
keys = {}
for team in ("A", "B"):
    call_command("createteam", team, stdout=io.StringIO(), stderr=io.StringIO())
    out = io.StringIO()
    call_command("createapikey", team=team, stdout=out)
    keys[team] = out.getvalue().strip()
call_command(
    "ingest", sys.argv[1], team="A", collection="handbook", no_progress=True,
    stdout=io.StringIO(), stderr=io.StringIO(),
)
print(json.dumps(keys))
"""
BURST_CORPUS = REPO_ROOT / "demo" / "corpus"
APP_ARGV = [sys.executable, "-m", "uvicorn", "config.asgi:application"]  # as runstack, one process


def burst_query(chars: int = 3_990) -> str:
    """A keyword query of the corpus's own words, just under MAX_QUERY_CHARS (4,000)."""
    words = sorted(
        {w for p in BURST_CORPUS.iterdir() for w in p.read_text().split() if w.isalpha()}
    )
    rng, parts, size = random.Random(5), [], 0
    while size < chars:
        parts.append(rng.choice(words))
        size += len(parts[-1]) + 1
    return " ".join(parts)[:chars]


async def flood(url: str, key: str, *, connections: int, seconds: float) -> dict[str, int]:
    """Team A's requests from ``connections`` connections for ``seconds``: counts by answer."""
    import httpx

    search = ("POST", "/api/v1/search", {"query": burst_query(), "mode": "keyword"})
    kinds = [search, ("GET", "/api/v1/collections", None)]
    kinds += [search, ("GET", "/api/v1/conversations", None)]
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"},
        limits=limits,
        timeout=httpx.Timeout(60, connect=10),
    ) as client:

        async def connection(number: int) -> None:
            for method, path, body in itertools.islice(itertools.cycle(kinds), number, None):
                if time.monotonic() >= deadline:
                    return
                try:
                    response = await client.request(method, path, json=body)
                    answer = str(response.status_code)
                    if response.status_code >= 400:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            answer += " " + response.json()["error"]["code"]
                except httpx.HTTPError as exc:
                    answer = type(exc).__name__
                counts[answer] = counts.get(answer, 0) + 1

        await asyncio.gather(*(connection(n) for n in range(connections)))
    return counts


def burst_flood(url: str, args: argparse.Namespace) -> None:
    counts = asyncio.run(
        flood(
            url,
            os.environ["ABUSE_FLOOD_KEY"],
            connections=args.burst_connections,
            seconds=args.burst_flood_seconds,
        )
    )
    print(json.dumps(counts), flush=True)


def burst_run(root: Path, tier_url: str, log_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both phases against the app served from ``root``."""
    from bench.harness import (
        Service,
        app_client,
        cpu_seconds,
        free_port,
        service_env,
        stream_direct,
        wait_ready,
    )

    data_dir = Path(tempfile.mkdtemp(prefix="abuse-burst-", dir=log_dir))
    env = service_env(
        data_dir,
        EMBEDDER_BACKEND=EMBEDDERS["fake"],
        INFERENCE_BASE_URL=f"{tier_url}/v1",
        INFERENCE_RUN_LOCAL="false",
        LOG_LEVEL="WARNING",
        PYTHONPATH=str(root),
    )
    for name in ("REQUEST_RATE_PER_SECOND", "REQUEST_BURST"):  # the app's defaults
        env.pop(name, None)
    setup = subprocess.run(
        [sys.executable, "-c", BURST_SETUP, str(BURST_CORPUS)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if setup.returncode != 0:
        raise SystemExit(f"setting up {root} failed:\n{setup.stderr[-3000:]}")
    keys = json.loads(setup.stdout.splitlines()[-1])
    port = free_port()
    log = data_dir / "app.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*APP_ARGV, "--host", "127.0.0.1", "--port", str(port)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    app = Service("app", process, log)
    url = f"http://127.0.0.1:{port}"
    body = {
        "model": "small",
        "messages": [{"role": "user", "content": "Say yes."}],
        "max_tokens": 1,
        "stream": True,
        "rag": {"enabled": False},
        "cache": False,
    }

    def answers(client: Any, *, count: int = 0, seconds: float = 0.0) -> dict[str, Any]:
        """B's answers, one every ``--burst-interval`` s: ``count`` of them, or for
        ``seconds``; TTFTs in ms, errors, and the app's CPU seconds per second."""
        ttfts: list[float] = []
        errors: list[str] = []
        cpu, started = cpu_seconds(process.pid), time.monotonic()
        due = started

        def more() -> bool:
            if count:
                return len(ttfts) + len(errors) < count
            return time.monotonic() - started < seconds

        while more():
            time.sleep(max(0.0, due - time.monotonic()))
            due = max(due + args.burst_interval, time.monotonic())
            try:
                stream = stream_direct(client, body)
                if stream.error:
                    errors.append(stream.error[:80])
                else:
                    ttfts.append(stream.ttft * 1000)
            except Exception as exc:  # the measurement goes on; the table counts it
                errors.append(f"{type(exc).__name__}: {exc}"[:80])
        elapsed = time.monotonic() - started
        cpu_rate = (cpu_seconds(process.pid) - cpu) / elapsed
        return {"ttft": ttfts, "errors": errors, "cpu": cpu_rate}

    try:
        wait_ready(app, f"{url}/healthz", timeout=120)
        with app_client(url, keys["B"]) as client:
            answers(client, count=args.burst_warmup)
            alone = answers(client, seconds=args.burst_seconds)
            flood_env = {**os.environ, "ABUSE_FLOOD_KEY": keys["A"]}
            flooding = subprocess.Popen(
                [
                    *(sys.executable, str(Path(__file__).resolve()), "--burst-flood", url),
                    *("--burst-connections", str(args.burst_connections)),
                    *("--burst-flood-seconds", str(args.burst_ramp + args.burst_seconds)),
                ],
                env=flood_env,
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(args.burst_ramp)
            attacked = answers(client, seconds=args.burst_seconds)
            output, _ = flooding.communicate(timeout=120)
        counts = json.loads(output.splitlines()[-1])
        if process.poll() is not None:
            raise SystemExit(f"the app exited:\n{app.tail()}")
    finally:
        app.stop()
    return {
        "alone": alone,
        "flood": attacked,
        "a": counts,
        "a_seconds": args.burst_ramp + args.burst_seconds,
    }


def burst_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench.harness import (
        FAKE_UPSTREAM_CODE,
        Services,
        free_port,
        percentile,
        quiet_gc,
        wait_ready,
    )

    log_dir = Path(tempfile.mkdtemp(prefix="abuse-burst-"))
    services = Services(log_dir)
    runs: list[tuple[str, dict[str, Any]]] = []
    load = os.getloadavg()
    try:
        tier_port = free_port()
        argv = [sys.executable, "-c", FAKE_UPSTREAM_CODE, str(tier_port), "0"]
        tier = services.start("fake-upstream", argv, {**os.environ, "PYTHONUNBUFFERED": "1"})
        tier_url = f"http://127.0.0.1:{tier_port}"
        wait_ready(tier, f"{tier_url}/v1/models", timeout=60)
        quiet_gc()
        with checkout(args.ref) if args.ref else contextlib.nullcontext() as ref_root:
            if ref_root is not None:
                runs.append((args.ref, burst_run(ref_root, tier_url, log_dir, args)))
            runs.append(("this tree", burst_run(REPO_ROOT, tier_url, log_dir, args)))
    finally:
        services.stop_all()
        shutil.rmtree(log_dir, ignore_errors=True)

    def p(values: list[float], q: float) -> str:
        return f"{percentile(values, q):.1f}" if values else "-"

    def ratio(result: dict[str, Any], q: float) -> str:
        alone, flood = result["alone"]["ttft"], result["flood"]["ttft"]
        return f"{percentile(flood, q) / percentile(alone, q):.1f}x" if alone and flood else "-"

    def a_requests(result: dict[str, Any]) -> str:
        counts = result["a"]
        total = sum(counts.values())
        limited = sum(n for answer, n in counts.items() if answer == "429 rate_limited")
        return f"{total:,} ({total / result['a_seconds']:.0f}/s), {limited:,} 429 rate_limited"

    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "B TTFT alone p50 / p99 (ms)",
            lambda r: f"{p(r['alone']['ttft'], 50)} / {p(r['alone']['ttft'], 99)}",
        ),
        (
            "B TTFT under A's flood p50 / p99 (ms)",
            lambda r: f"{p(r['flood']['ttft'], 50)} / {p(r['flood']['ttft'], 99)}",
        ),
        ("ratio flood / alone, p50 / p99", lambda r: f"{ratio(r, 50)} / {ratio(r, 99)}"),
        (
            "B answers alone / under flood (errors)",
            lambda r: " / ".join(
                f"{len(r[k]['ttft'])} ({len(r[k]['errors'])})" for k in ("alone", "flood")
            ),
        ),
        ("A's requests", a_requests),
        (
            "A's other answers",
            lambda r: (
                ", ".join(
                    f"{n:,} {answer}"
                    for answer, n in sorted(r["a"].items())
                    if answer != "429 rate_limited"
                )
                or "-"
            ),
        ),
        (
            "web CPU s/s alone / under flood",
            lambda r: f"{r['alone']['cpu']:.2f} / {r['flood']['cpu']:.2f}",
        ),
    ]
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} at the start; "
        f"B one answer every {args.burst_interval:g} s, {args.burst_seconds:g} s per phase; "
        f"A {args.burst_connections} connections"
    )
    print(" | ".join(["", *(label for label, _ in runs)]))
    for name, cell in rows:
        print(" | ".join([name, *(cell(result) for _, result in runs)]))
    for label, result in runs:
        for phase in ("alone", "flood"):
            if result[phase]["errors"]:
                print(
                    f"{label}, B {phase}: first errors {sorted(set(result[phase]['errors']))[:3]}"
                )


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
    """The tree at ``rev`` in a temp folder (``git archive``, which leaves the repository
    as it was), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="abuse-ref-")) / "tree"
    folder.mkdir()
    archive = subprocess.run(
        [GIT, "archive", "--format=tar", rev], cwd=REPO_ROOT, check=True, capture_output=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    try:
        yield folder
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


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
    parser.add_argument(
        "--tenants",
        action="store_true",
        help="team A uploads the hostile corpus through a real worker; team B's delay",
    )
    parser.add_argument(
        "--embedder", choices=sorted(EMBEDDERS), default="fake", help="for --tenants (fake)"
    )
    parser.add_argument("--broker", default="", help="for --tenants: a Redis URL (on disk)")
    parser.add_argument("--concurrency", type=int, default=1, help="for --tenants: pool size")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="team A floods the web process with requests; team B's time to first token",
    )
    parser.add_argument("--burst-seconds", type=float, default=20, help="per phase (20)")
    parser.add_argument("--burst-connections", type=int, default=32, help="A's connections")
    parser.add_argument("--burst-interval", type=float, default=0.1, help="between B's answers")
    parser.add_argument("--burst-warmup", type=int, default=20, help="B's answers first, untimed")
    parser.add_argument("--burst-ramp", type=float, default=2, help="A's head start (seconds)")
    parser.add_argument("--burst-flood", help=argparse.SUPPRESS)
    parser.add_argument("--burst-flood-seconds", type=float, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tenants-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.tenants_child is not None:
        sys.path.insert(0, str(args.root))
        tenants_child(args.root, args.tenants_child, args)
        return
    if args.tenants:
        tenants_main(args)
        return
    if args.burst_flood:
        burst_flood(args.burst_flood, args)
        return
    if args.burst:
        burst_main(args)
        return

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
