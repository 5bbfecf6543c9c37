"""Ingestion fairness: where one team's first document finishes behind another's backlog.

What is measured (one run, printed as one table)
    Team A queues ``--backlog`` documents (default 50), then team B queues one, all
    through ``document_create_from_text`` as the API does (queued, then dispatched on
    commit). One real Celery worker, started as ``runstack`` starts it (prefork, one
    child), works through them. For each ``--in-flight`` value (default ``4,0``: the
    dispatcher's default cap, then 0 = no cap, first come first served, which is what a
    single FIFO queue gave before) the table gives B's place in the order documents were
    indexed (``indexed_at``), how many of A's documents finished between B being queued
    and B finishing, B's latency (queued to indexed, wall clock) and the time for all.

    Two modes: ``queued-first`` queues everything before the worker starts (B's place
    is then exact and repeatable); ``live`` starts the worker first, so A's backlog is
    being worked on when B arrives.

How
    Django runs here on ``config.settings.base`` with a fresh temp ``RAGTIER_DATA_DIR``:
    the embedded default, a SQLite file and the on-disk broker, unless ``--broker`` names
    a Redis URL. Documents are ``--sections`` headed sections of 40 words (one chunk
    each). ``--embedder fake`` (default) is the deterministic fake; ``real`` loads
    all-MiniLM-L6-v2 in the worker (slower: the figure that matters is B's place).

Run
    .venv/bin/python bench/ingest_fairness.py
    .venv/bin/python bench/ingest_fairness.py --broker redis://127.0.0.1:6379/13
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/ingest_fairness.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import django_env, start_django  # noqa: E402

EMBEDDERS = {
    "fake": "retrieval.embedders.FakeEmbedder",
    "real": "retrieval.embedders.SentenceTransformerEmbedder",
}


@dataclass
class Outcome:
    in_flight: int
    mode: str
    place: int
    total: int
    overtaken_by: int
    latency_s: float
    all_s: float


def text(label: str, sections: int) -> str:
    return "\n\n".join(
        f"## {label} part {i}\n\n" + " ".join(f"{label}w{i}x{j}" for j in range(40))
        for i in range(sections)
    )


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    from apps.site.management.commands.runstack import worker_argv

    argv = [*worker_argv(sys.executable), "--without-gossip", "--without-mingle"]
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run(
    *,
    in_flight: int,
    mode: str,
    backlog: int,
    sections: int,
    env: dict[str, str],
    log: Path,
    timeout: float,
) -> Outcome:
    from django.conf import settings

    from apps.accounts.services import team_create
    from apps.knowledge.models import Document
    from apps.knowledge.services import collection_create, document_create_from_text

    settings.INGEST_MAX_IN_FLIGHT = in_flight  # this process dispatches on each commit
    worker_env = {**env, "INGEST_MAX_IN_FLIGHT": str(in_flight)}
    tag = f"{mode}-{in_flight}"
    a = collection_create(team=team_create(name=f"A-{tag}"), name="backlog")
    b = collection_create(team=team_create(name=f"B-{tag}"), name="first")
    worker = start_worker(worker_env, log) if mode == "live" else None
    started = time.monotonic()
    for i in range(backlog):
        document_create_from_text(
            collection=a, title=f"A{i}", text=text(f"a{tag}n{i}", sections), format="markdown"
        )
    first = document_create_from_text(
        collection=b, title="B", text=text(f"b{tag}", sections), format="markdown"
    ).document
    if worker is None:
        worker = start_worker(worker_env, log)
        started = time.monotonic()
    ours = Document.objects.filter(collection__in=[a, b])
    try:
        deadline = time.monotonic() + timeout
        while ours.filter(status__in=["queued", "processing"]).exists():
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited; see {log}")
            if time.monotonic() > deadline:
                raise SystemExit(f"not done after {timeout} s; see {log}")
            time.sleep(0.2)
        all_s = time.monotonic() - started
    finally:
        stop_worker(worker)
    failed = list(ours.filter(status="failed").values_list("title", "error"))
    if failed:
        raise SystemExit(f"documents failed: {failed[:3]}")
    order = list(ours.order_by("indexed_at", "pk").values_list("pk", "indexed_at"))
    place = [pk for pk, _ in order].index(first.pk) + 1
    b_done: datetime = Document.objects.get(pk=first.pk).indexed_at
    overtaken_by = sum(
        1 for pk, done in order if pk != first.pk and first.created_at <= done <= b_done
    )
    return Outcome(
        in_flight=in_flight,
        mode=mode,
        place=place,
        total=len(order),
        overtaken_by=overtaken_by,
        latency_s=(b_done - first.created_at).total_seconds(),
        all_s=all_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=50)
    parser.add_argument("--sections", type=int, default=6, help="chunks per document")
    parser.add_argument("--in-flight", default="4,0", help="INGEST_MAX_IN_FLIGHT values")
    parser.add_argument("--modes", default="queued-first,live")
    parser.add_argument("--broker", default="", help="a Redis URL; default the on-disk one")
    parser.add_argument("--embedder", choices=sorted(EMBEDDERS), default="fake")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-fairness-"))
    env = django_env(
        data_dir,
        EMBEDDER_BACKEND=EMBEDDERS[args.embedder],
        CELERY_TASK_ALWAYS_EAGER="false",
        HF_HUB_OFFLINE="1",
        LOG_LEVEL="WARNING",
    )
    if args.broker:
        env["CELERY_BROKER_URL"] = args.broker
        import redis

        redis.Redis.from_url(args.broker, socket_connect_timeout=2).flushdb()
    start_django(env, migrate=True)
    log = data_dir / "worker.log"
    outcomes = [
        run(
            in_flight=int(value),
            mode=mode,
            backlog=args.backlog,
            sections=args.sections,
            env=env,
            log=log,
            timeout=args.timeout,
        )
        for mode in args.modes.split(",")
        for value in args.in_flight.split(",")
    ]

    from django.conf import settings

    print(
        f"ingest fairness: {args.backlog} documents of team A, then 1 of team B "
        f"({args.sections} chunks each); one worker (prefork, concurrency 1); broker "
        f"{settings.CELERY_BROKER_URL}; embedder {args.embedder}; {os.cpu_count()} CPUs"
    )
    header = (
        f"{'INGEST_MAX_IN_FLIGHT':<22}{'mode':<14}{'B finished':>12}"
        f"{'A done while B waited':>23}{'B latency s':>13}{'all s':>8}"
    )
    print(header)
    print("-" * len(header))
    for o in outcomes:
        label = f"{o.in_flight} (fair)" if o.in_flight else "0 (FIFO, no cap)"
        print(
            f"{label:<22}{o.mode:<14}{f'{o.place} / {o.total}':>12}"
            f"{o.overtaken_by:>23}{o.latency_s:>13.1f}{o.all_s:>8.1f}"
        )
    if args.keep:
        print(f"data and worker log kept in {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
