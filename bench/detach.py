"""Detached answers (issue 30): resume latency, the CPU an idle replay costs pushed against
polled, and the tokens an abandoned answer wastes, side by side in one run.

What is measured
    The app (uvicorn, one worker, the embedded default: SQLite, events in the database,
    wake-ups in process) and the scripted fake tier (``tests.fake_upstream`` in its own
    process), native SSE answers with retrieval off.
    1. Resume latency: ``--answers`` (100) answers stream at once (a token every 50 ms);
       each client reads 3 deltas and drops; 1 s later all resume at once with
       ``Last-Event-ID``. Per answer: from sending the resume to the first missed event,
       p50 and p99; then each is read to ``done`` and checked whole, with no gap and no
       duplicate.
    2. CPU per idle replay connection: 20 answers held open by a tier that sends nothing
       (60 s to the first token), each followed by ``--replays`` / 20 replays (``GET
       …/events``), idle since nothing is written. The app's CPU over 10 s with the replays
       open, less the same with none, per replay: pushed (woken by the writer, and a look
       of its own every ``REPLAY_RECHECK_SECONDS``, 2 s) against polled every 0.2 s (what
       6e733fd did), two app processes one after the other on the same tier.
    3. Tokens wasted per abandoned answer at the default grace (``STREAM_DETACH_GRACE``,
       20 s): ``--abandoned`` (5) answers at 20 tokens/s, ``max_tokens`` 512, each dropped
       after its first delta and never resumed; ``detached_unread_tokens`` from their ledger
       rows, and the completion tokens billed.
    Nothing is asserted; the load average is printed.

Run (from the repository root)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/detach.py [--answers 100] [--replays 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/detach.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    FAKE_UPSTREAM_CODE,
    Services,
    cpu_seconds,
    free_port,
    load_average,
    percentile,
    service_env,
    setup_data,
    setup_django,
    start_app,
    wait_ready,
)

APP_ENV = {
    "INFERENCE_MAX_CONCURRENCY": "2000",
    "INFERENCE_QUEUE_TIMEOUT": "60",
    "REPLAY_MAX_PER_TEAM": "5000",
    "RESPONSE_CACHE_TTL": "0",
}


def client(url: str, key: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(600, connect=30),
        limits=limits,
    )


async def frames(response: httpx.Response) -> Any:
    """``(id, event, data)`` of each SSE frame as it arrives."""
    seq, event, data = 0, "", ""
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            seq = int(line[3:])
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and event:
            yield seq, event, json.loads(data)
            event, data = "", ""


async def ask_and_drop(http: httpx.AsyncClient, deltas: int, **body: Any) -> tuple[int, int, str]:
    """Ask in a new conversation, read ``deltas`` deltas, drop: message id, last id, text."""
    conversation = (await http.post("/api/v1/conversations", json={})).json()["id"]
    message_id, last, text = 0, 0, []
    url = f"/api/v1/conversations/{conversation}/messages"
    async with http.stream("POST", url, json={"content": "Talk", "top_k": 0, **body}) as reply:
        async for seq, event, data in frames(reply):
            last = seq
            if event == "message":
                message_id = data["message_id"]
            elif event == "delta":
                text.append(data["text"])
                if len(text) == deltas:
                    break
    return message_id, last, "".join(text)


async def resume(http: httpx.AsyncClient, message_id: int, after: int) -> tuple[float, str, bool]:
    """Seconds to the first missed event, the text after ``after``, and whether the ids
    followed one another to ``done``."""
    sent = time.perf_counter()
    first: float | None = None
    expected, text, whole = after + 1, [], True
    url = f"/api/v1/messages/{message_id}/events"
    async with http.stream("GET", url, headers={"Last-Event-ID": str(after)}) as reply:
        async for seq, event, data in frames(reply):
            first = first or time.perf_counter()
            whole = whole and seq == expected
            expected = seq + 1
            if event == "delta":
                text.append(data["text"])
    return (first or sent) - sent, "".join(text), whole


async def part_resume(url: str, key: str, answers: int) -> None:
    async with client(url, key) as http:
        dropped = await asyncio.gather(
            *(ask_and_drop(http, 3, max_tokens=200, stream=True) for _ in range(answers))
        )
        await asyncio.sleep(1)
        resumed = await asyncio.gather(*(resume(http, m, last) for m, last, _ in dropped))
    latency = [seconds * 1000 for seconds, _, _ in resumed]
    expected = "".join(f" t{i}" for i in range(200))
    whole = sum(
        before + after == expected and ordered
        for (_, _, before), (_, after, ordered) in zip(dropped, resumed, strict=True)
    )
    print(f"\n1. resume latency, {answers} detached answers resuming at once ({load_average()})")
    print(
        f"   reconnect to first missed event: p50 {percentile(latency, 50):.1f} ms, "
        f"p99 {percentile(latency, 99):.1f} ms, max {max(latency):.1f} ms"
    )
    print(f"   answers whole, no gap, no duplicate: {whole} of {answers}")


async def idle_cpu(url: str, key: str, pid: int, replays: int, seconds: float) -> float:
    """App CPU ms per second per idle replay: 20 stalled answers, with and without replays."""
    async with client(url, key) as http:
        body = {"max_tokens": 4, "stream": True, "stream_grace": 120}
        held = [asyncio.create_task(ask_and_drop(http, 1, **body)) for _ in range(20)]
        await asyncio.sleep(3)  # all asked, all waiting for a first token
        ids = await message_ids(http, 20)

        async def window() -> float:
            before = cpu_seconds(pid)
            await asyncio.sleep(seconds)
            return cpu_seconds(pid) - before

        base = await window()
        watchers = [asyncio.create_task(resume(http, ids[i % len(ids)], 0)) for i in range(replays)]
        await asyncio.sleep(2)  # every replay open and idle
        loaded = await window()
        for task in (*watchers, *held):
            task.cancel()
        await asyncio.gather(*watchers, *held, return_exceptions=True)
    return (loaded - base) * 1000 / seconds / replays


async def message_ids(http: httpx.AsyncClient, count: int) -> list[int]:
    found: list[int] = []
    page = (await http.get("/api/v1/conversations?limit=50")).json()["results"]
    for conversation in page[:count]:
        detail = (await http.get(f"/api/v1/conversations/{conversation['id']}")).json()
        found += [m["id"] for m in detail["messages"] if m["role"] == "assistant"]
    return found


async def part_abandoned(url: str, key: str, count: int) -> None:
    from apps.usage.models import UsageRecord

    async with client(url, key) as http:
        dropped = await asyncio.gather(
            *(ask_and_drop(http, 1, max_tokens=512, stream=True) for _ in range(count))
        )
    ids = [str(message_id) for message_id, _, _ in dropped]
    deadline = time.monotonic() + 120
    rows: list[Any] = []
    settled = UsageRecord.objects.filter(object_id__in=ids, kind="chat")
    while time.monotonic() < deadline:
        rows = await asyncio.to_thread(list, settled.all())
        if len(rows) == count:
            break
        await asyncio.sleep(0.5)
    after = time.monotonic() - deadline + 120
    unread = [row.detached_unread_tokens for row in rows]
    billed = [row.completion_tokens for row in rows]
    print(f"\n3. abandoned answers at the default grace, 20 tokens/s ({load_average()})")
    print(
        f"   {len(rows)} of {count} settled; per answer: detached_unread_tokens "
        f"mean {sum(unread) / max(len(unread), 1):.0f} (min {min(unread, default=0)}, "
        f"max {max(unread, default=0)}), completion tokens billed mean "
        f"{sum(billed) / max(len(billed), 1):.0f} (SmolLM2's count of the fake tier's "
        f"text); all settled {after:.1f} s after the drops"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=100, help="part 1")
    parser.add_argument("--replays", type=int, default=200, help="part 2")
    parser.add_argument("--window", type=float, default=10.0, help="part 2: seconds measured")
    parser.add_argument("--abandoned", type=int, default=5, help="part 3")
    parser.add_argument("--only", nargs="+", choices=["1", "2", "3"], default=["1", "2", "3"])
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-detach-"))
    services = Services(data_dir)
    try:
        setup_django(data_dir)
        key, _ = setup_data(ingest=False)
        print(f"data dir {data_dir}; {load_average()}")
        port = free_port()
        argv_fake = [sys.executable, "-c", FAKE_UPSTREAM_CODE, str(port), "0.05"]
        fake = services.start("fake-upstream", argv_fake, service_env(data_dir))
        tier = f"http://127.0.0.1:{port}"
        wait_ready(fake, f"{tier}/v1/models", timeout=60)

        def delay(seconds: float) -> None:
            httpx.post(f"{tier}/bench/delay", params={"seconds": seconds}).raise_for_status()

        app = start_app(services, "app", data_dir, f"{tier}/v1", **APP_ENV)
        if "1" in args.only:
            asyncio.run(part_resume(app, key, args.answers))
        if "2" in args.only:
            delay(60.0)
            pushed = asyncio.run(
                idle_cpu(app, key, services.started[-1].process.pid, args.replays, args.window)
            )
            polled_app = start_app(
                services,
                "app-polled",
                data_dir,
                f"{tier}/v1",
                **APP_ENV,
                REPLAY_RECHECK_SECONDS="0.2",
            )
            polled = asyncio.run(
                idle_cpu(
                    polled_app, key, services.started[-1].process.pid, args.replays, args.window
                )
            )
            print(
                f"\n2. CPU per idle replay connection, {args.replays} replays of 20 stalled "
                f"answers, {args.window:.0f} s ({load_average()})"
            )
            print(f"   pushed (woken by the writer, own look every 2 s): {pushed:.3f} ms/s")
            print(
                f"   polled every 0.2 s: {polled:.3f} ms/s; polled / pushed "
                f"{polled / pushed if pushed > 0 else float('inf'):.1f}x"
            )
            delay(0.05)
        if "3" in args.only:
            asyncio.run(part_abandoned(app, key, args.abandoned))
    finally:
        services.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
