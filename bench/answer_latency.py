"""Answer latency and throughput of the app against the inference tier it calls, side by side.

What is measured (one run, three parts, each printed as a table)
    1. TTFT, app against tier. The same question goes, interleaved round by round, to
       the app's native SSE endpoint (``POST /api/v1/conversations/<id>/messages`` with
       ``top_k: 0``, so retrieval is off and the app sends system prompt + question) and
       straight to the tier's ``/v1/chat/completions`` (streaming) with the very messages
       the app sends, built with ``inference.assemble_prompt`` and the real GGUFTokenizer,
       and the body ``inference.ChatRequest`` builds (same model name, ``max_tokens``,
       ``stream_options``; no temperature, as the app passes none). TTFT is the time from
       sending the request to the first content delta the client receives: the first
       ``event: delta`` frame from the app, the first chunk with a non-empty
       ``delta.content`` from the tier. Each app request uses a new conversation (no
       history), created before the clock starts. Before every measured request a short
       "flush" request with another question (``max_tokens`` 1) goes to the tier, so
       llama.cpp's prefix cache holds only the shared system prompt each time, as it would
       for a new question (``--no-flush`` measures fully cached prompts instead).
       Reported: median and p95 of each, the median of per-round ratios app/tier, the
       ratio of medians and the median of per-round differences in ms.
    2. The whole retrieval stage as a share of TTFT for a ~1,000-token prompt, in this
       process: ``apps.knowledge.services.chunk_search`` (embed with the real MiniLM,
       FAISS search, usage row, chunk fetch) over the ingested demo corpus, then
       ``inference.assemble_prompt`` with the real GGUFTokenizer (passages rendered, fitted
       into the 2,048-token window and counted). ``top_k`` is the number of best chunks
       (at most ``--rag-max-top-k``) whose prompt comes closest to ``--rag-prompt-tokens``.
       Against it, the tier's TTFT for that same prompt by a direct streaming call: "cold"
       after a flush request (only the system prompt cached, as for a new question) and
       "warm" (the same prompt sent again at once: fully cached). Reported: medians and
       p95, retrieval / (retrieval + TTFT) and retrieval / TTFT.
    3. Tokens/s arriving at an SSE client, app against tier, at each ``--concurrency``
       (default 1 and 4 streams at once, started together from threads), ``--stream-reps``
       times each. A stream's rate is its tokens / (last chunk time - request sent),
       counting ``delta`` events for the app and chunks with non-empty ``delta.content`` for
       the tier (llama.cpp sends one token per chunk). The app merges the tokens that reach
       it in one read into one ``delta``; the fake tier's tokens (`` t0``, `` t1``, ...) are
       counted inside it, any other text as one token per chunk. A batch's aggregate rate is
       all tokens / (last chunk of any stream - first request sent): spans from the request,
       so a burst of merged tokens is not flattered. Reported: median per-stream and
       aggregate rates and their ratios app/tier, chunks per stream, and the median wait to
       a stream's first token. The real tier serves one request at a time, so concurrent
       streams queue behind each other. The same is then measured against the scripted fake
       upstream (``tests.fake_upstream``, one token every ``--fake-delays`` seconds on a
       fixed schedule, 10 ms and 1 ms by default, streams served concurrently; see
       ``Script.paced``), which isolates the app's own
       overhead (``--no-fake`` skips it). The fake also records what the app sends: before
       part 1 the script checks that the app's request body is exactly the one sent
       directly.

How
    A fresh temp ``RAGTIER_DATA_DIR`` (new SQLite file, index files, logs; ``DATABASE_URL``
    and ``REDIS_URL`` are dropped: the embedded default). Django runs in this process on
    ``config.settings.base`` to migrate, create the team ``bench``, print an API key and
    ingest ``demo/corpus/`` (the same as ``manage.py migrate``, ``createteam``,
    ``createapikey``, ``ingest``) and for part 2. Subprocesses, on free loopback ports:
    the llama.cpp tier (``manage.py runinference --n-ctx 2048``: SmolLM2-135M-Instruct,
    ``interrupt_requests=False``), the app (``uvicorn config.asgi:application``, as
    ``runstack`` starts it) with ``INFERENCE_BASE_URL`` pointing at the tier,
    ``MODEL_SMALL_CONTEXT_WINDOW=2048`` and ``INFERENCE_RUN_LOCAL=false``; and for the
    fake part the fake upstream and a second app pointing at it. ``--warmup`` unmeasured
    requests go first. Wall clock via ``time.perf_counter`` in one httpx client per target
    (kept-alive connections); nothing is asserted. On a machine with few cores the tier,
    the app and this client share them: the load average is printed with each part.
    Everything started is stopped at the end; the temp folder is removed unless ``--keep``.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/answer_latency.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/answer_latency.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    CONTEXT_WINDOW,
    FAKE_UPSTREAM_CODE,
    TEAM,
    Services,
    app_body,
    app_client,
    direct_body,
    free_port,
    load_average,
    measure_throughput,
    median,
    new_conversation,
    p95,
    service_env,
    setup_data,
    setup_django,
    start_app,
    stream_app,
    stream_direct,
    tier_client,
    wait_ready,
)

FLUSH_QUESTION = "Say hello."


# --------------------------------------------------------------------------- part 1


def check_same_prompt(
    app: httpx.Client, fake: httpx.Client, expected: dict[str, Any], question: str, n: int
) -> str:
    """What the app sent the (fake) tier for ``question``, compared with ``expected``."""
    stream = stream_app(app, new_conversation(app), app_body(question, n))
    if stream.error:
        return f"could not check: the app answered {stream.error}"
    sent = fake.get("/bench/requests").json()[-1]
    keys = sorted(set(sent) | set(expected))
    different = [key for key in keys if sent.get(key) != expected.get(key)]
    if not different:
        return "identical request bodies (messages, model, max_tokens, stream options)"
    return "DIFFERENT in " + ", ".join(
        f"{key}: app {sent.get(key)!r} / direct {expected.get(key)!r}" for key in different
    )


def part_ttft(
    *,
    app: httpx.Client,
    tier: httpx.Client,
    body_direct: dict[str, Any],
    body_flush: dict[str, Any] | None,
    question: str,
    max_tokens: int,
    rounds: int,
    warmup: int,
) -> None:
    print()
    print(f"== 1. TTFT: app (top_k 0) against the tier directly, same prompt; {load_average()}")
    samples: dict[str, list[float]] = {"app": [], "tier": []}

    def measure(kind: str) -> float:
        if body_flush is not None:
            stream_direct(tier, body_flush)
        if kind == "app":
            conversation = new_conversation(app)
            stream = stream_app(app, conversation, app_body(question, max_tokens))
        else:
            stream = stream_direct(tier, body_direct)
        if stream.error:
            raise RuntimeError(f"{kind}: {stream.error}")
        return stream.ttft * 1000.0

    for _ in range(warmup):
        measure("app")
        measure("tier")
    for number in range(rounds):
        order = ("app", "tier") if number % 2 == 0 else ("tier", "app")
        for kind in order:
            samples[kind].append(measure(kind))

    app_ms, tier_ms = samples["app"], samples["tier"]
    ratios = [a / t for a, t in zip(app_ms, tier_ms, strict=True)]
    differences = [a - t for a, t in zip(app_ms, tier_ms, strict=True)]
    print(
        f"{rounds} rounds, interleaved (order alternating), after {warmup} warm-up pairs; "
        f"max_tokens {max_tokens}; prompt {body_direct['messages'][-1]['content']!r}; "
        f"{'flush request before each' if body_flush else 'no flush: fully cached prompts'}"
    )
    print(f"{'':<28}  {'median ms':>10}  {'p95 ms':>10}  {'min ms':>10}")
    print(
        f"{'app SSE (first delta)':<28}  {median(app_ms):>10.1f}  {p95(app_ms):>10.1f}"
        f"  {min(app_ms):>10.1f}"
    )
    print(
        f"{'tier direct (first content)':<28}  {median(tier_ms):>10.1f}  {p95(tier_ms):>10.1f}"
        f"  {min(tier_ms):>10.1f}"
    )
    print(f"app / tier, median of per-round ratios  {median(ratios):>8.2f}x")
    print(f"app / tier, ratio of medians            {median(app_ms) / median(tier_ms):>8.2f}x")
    print(
        f"app - tier, median of per-round diffs   {median(differences):>8.1f} ms"
        f"  (p95 {p95(differences):.1f} ms)"
    )


# --------------------------------------------------------------------------- part 2


def part_retrieval_share(
    *,
    tier: httpx.Client,
    tokenizer: Any,
    question: str,
    max_top_k: int,
    prompt_tokens: int,
    max_tokens: int,
    body_flush: dict[str, Any],
    retrieval_rounds: int,
    ttft_rounds: int,
) -> None:
    from apps.accounts.selectors import Caller, team_get_by_name
    from apps.chat.services.registry import model_alias_resolve
    from apps.knowledge.services import chunk_search
    from inference import ChatRequest, Passage, assemble_prompt

    print()
    print(
        f"== 2. Retrieval stage against tier TTFT, ~{prompt_tokens}-token prompt; {load_average()}"
    )
    team = team_get_by_name(name=TEAM)
    if team is None:
        raise RuntimeError("the bench team is missing")
    caller = Caller(team, None, None, frozenset({"read"}))
    served_name = model_alias_resolve(alias=None).model

    def passages_of(results: Sequence[Any]) -> list[Passage]:
        return [
            Passage(r.chunk.document.title, r.chunk.text, tuple(r.chunk.headings)) for r in results
        ]

    def assemble(passages: list[Passage]) -> Any:
        return assemble_prompt(
            tokenizer=tokenizer,
            question=question,
            passages=passages,
            context_window=CONTEXT_WINDOW,
            max_output_tokens=max_tokens,
        )

    # top_k: how many of the best chunks make the prompt closest to ``prompt_tokens``.
    ranked = passages_of(chunk_search(caller=caller, query=question, top_k=max_top_k))
    sizes = {k: assemble(ranked[:k]).prompt_tokens for k in range(1, len(ranked) + 1)}
    top_k = min(sizes, key=lambda k: abs(sizes[k] - prompt_tokens))

    def retrieve() -> tuple[Any, float, float]:
        started = time.perf_counter()
        results = chunk_search(caller=caller, query=question, top_k=top_k)
        searched = time.perf_counter()
        prompt = assemble(passages_of(results))
        assembled = time.perf_counter()
        return prompt, (searched - started) * 1000.0, (assembled - searched) * 1000.0

    prompt, _, _ = retrieve()  # warm-up: loads the model, the index and the tokenizer
    body = ChatRequest(model=served_name, messages=prompt.messages, max_tokens=max_tokens).body()
    stream_direct(tier, body_flush)
    stream_direct(tier, body)  # warm-up of the tier
    samples: dict[str, list[float]] = {"search": [], "assemble": [], "cold": [], "warm": []}
    for number in range(max(retrieval_rounds, ttft_rounds)):
        if number < retrieval_rounds:
            again, search_ms, assemble_ms = retrieve()
            if again.messages != prompt.messages:
                raise RuntimeError("the assembled prompt changed between rounds")
            samples["search"].append(search_ms)
            samples["assemble"].append(assemble_ms)
        if number < ttft_rounds:
            stream_direct(tier, body_flush)
            for kind in ("cold", "warm"):  # the second one finds the whole prompt cached
                stream = stream_direct(tier, body)
                if stream.error:
                    raise RuntimeError(f"tier: {stream.error}")
                samples[kind].append(stream.ttft * 1000.0)

    total = [s + a for s, a in zip(samples["search"], samples["assemble"], strict=True)]
    retrieval = median(total)
    print(
        f"question {question!r}: top_k {top_k} (closest to {prompt_tokens} tokens of 1..."
        f"{len(ranked)}), {len(prompt.passages)} passages in the prompt, "
        f"{prompt.prompt_tokens} tokens; "
        f"retrieval {retrieval_rounds} rounds, TTFT {ttft_rounds} rounds, max_tokens {max_tokens}"
    )
    print(f"{'':<46}  {'median ms':>10}  {'p95 ms':>10}")
    rows = [
        ("chunk_search (embed + search + usage + fetch)", samples["search"]),
        ("assemble_prompt (render + fit + count)", samples["assemble"]),
        ("retrieval stage total", total),
        ("tier TTFT, cold (system prompt cached only)", samples["cold"]),
        ("tier TTFT, warm (whole prompt cached)", samples["warm"]),
    ]
    for label, values in rows:
        print(f"{label:<46}  {median(values):>10.1f}  {p95(values):>10.1f}")
    for kind in ("cold", "warm"):
        ttft = median(samples[kind])
        print(
            f"{kind:>4}: retrieval / (retrieval + TTFT) {retrieval / (retrieval + ttft):>7.1%}"
            f"   retrieval / TTFT {retrieval / ttft:>8.3f}x"
        )


# --------------------------------------------------------------------------- part 3


def part_throughput(
    *,
    title: str,
    app: httpx.Client,
    tier: httpx.Client,
    body_direct: dict[str, Any],
    question: str,
    max_tokens: int,
    concurrency: Sequence[int],
    reps: int,
) -> None:
    print()
    print(f"== 3{title}; {load_average()}")
    stats = measure_throughput(
        app=app,
        tier=tier,
        body_direct=body_direct,
        question=question,
        max_tokens=max_tokens,
        concurrency=concurrency,
        reps=reps,
    )
    print(
        f"max_tokens {max_tokens}, {reps} reps per concurrency, order alternating; "
        "rates in tokens/s (tokens in content chunks); medians"
    )
    print(
        f"{'':>7}  {'per-stream tokens/s':^26}  {'aggregate tokens/s':^26}  "
        f"{'chunks/stream':^13}  {'wait to 1st ms':^15}"
    )
    print(
        f"{'streams':>7}  {'tier':>7} {'app':>7} {'app/tier':>10}  "
        f"{'tier':>7} {'app':>7} {'app/tier':>10}  {'tier':>6} {'app':>6}  {'tier':>7} {'app':>7}"
    )
    for count in concurrency:
        a, t = stats[("app", count)], stats[("tier", count)]
        app_rate, tier_rate = median(a.per_stream), median(t.per_stream)
        app_total, tier_total = median(a.aggregate), median(t.aggregate)
        print(
            f"{count:>7}  {tier_rate:>7.1f} {app_rate:>7.1f} {app_rate / tier_rate:>9.3f}x  "
            f"{tier_total:>7.1f} {app_total:>7.1f} {app_total / tier_total:>9.3f}x  "
            f"{median(t.chunks):>6.0f} {median(a.chunks):>6.0f}  "
            f"{median(t.wait_ms):>7.0f} {median(a.wait_ms):>7.0f}"
        )


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="part 1: rounds (app + tier)")
    parser.add_argument("--warmup", type=int, default=3, help="part 1: unmeasured pairs first")
    parser.add_argument("--max-tokens", type=int, default=16, help="part 1 and 2: max_tokens")
    parser.add_argument("--question", default="How are API keys stored?", help="part 1")
    parser.add_argument(
        "--no-flush", action="store_true", help="part 1: no flush request before each"
    )
    parser.add_argument(
        "--rag-question",
        default="How does ragtier count tokens, reserve quota and settle usage for an answer?",
        help="part 2",
    )
    parser.add_argument(
        "--rag-max-top-k", type=int, default=8, help="part 2: most chunks considered"
    )
    parser.add_argument(
        "--rag-prompt-tokens", type=int, default=1000, help="part 2: prompt size aimed at"
    )
    parser.add_argument("--rag-rounds", type=int, default=20, help="part 2: retrieval rounds")
    parser.add_argument(
        "--rag-ttft-rounds", type=int, default=10, help="part 2: tier TTFT rounds (cold + warm)"
    )
    parser.add_argument(
        "--stream-question",
        default="Write a long, detailed story about a lighthouse keeper and a storm.",
        help="part 3",
    )
    parser.add_argument("--stream-max-tokens", type=int, default=128, help="part 3: max_tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="part 3")
    parser.add_argument("--stream-reps", type=int, default=4, help="part 3: reps per concurrency")
    parser.add_argument(
        "--fake-delays",
        type=float,
        nargs="+",
        default=[0.01, 0.001],
        help="part 3b: seconds per fake token, one table each",
    )
    parser.add_argument("--no-fake", action="store_true", help="skip the fake-upstream part")
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder and logs")
    args = parser.parse_args(argv)

    started = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-answer-"))
    services = Services(data_dir)
    clients: list[httpx.Client] = []
    try:
        setup_django(data_dir)
        from inference import GGUFTokenizer, smollm2_gguf_path

        print(f"data dir: {data_dir}; {load_average()}")
        setup_started = time.monotonic()
        key, ingested = setup_data()
        print(
            f"setup (migrate, team, key, ingest demo corpus: {ingested}): "
            f"{time.monotonic() - setup_started:.1f} s"
        )
        tokenizer = GGUFTokenizer()

        tier_port = free_port()
        tier_service = services.start(
            "tier",
            [
                sys.executable,
                "manage.py",
                "runinference",
                "--port",
                str(tier_port),
                "--n-ctx",
                str(CONTEXT_WINDOW),
            ],
            service_env(data_dir),
        )
        tier_url = f"http://127.0.0.1:{tier_port}"
        wait_ready(tier_service, f"{tier_url}/v1/models", timeout=180)
        app_url = start_app(services, "app", data_dir, f"{tier_url}/v1")
        tier = tier_client(tier_url)
        app = app_client(app_url, key)
        clients += [tier, app]
        print(
            f"tier: llama.cpp server, {smollm2_gguf_path().name}, n_ctx {CONTEXT_WINDOW}, "
            f"{tier_url}; app: uvicorn config.asgi:application, {app_url}"
        )

        body_direct = direct_body(tokenizer, args.question, args.max_tokens)
        body_flush = direct_body(tokenizer, FLUSH_QUESTION, 1)

        fake: httpx.Client | None = None
        fake_app: httpx.Client | None = None
        if not args.no_fake:
            fake_port = free_port()
            fake_service = services.start(
                "fake-upstream",
                [
                    sys.executable,
                    "-c",
                    FAKE_UPSTREAM_CODE,
                    str(fake_port),
                    str(args.fake_delays[0]),
                ],
                service_env(data_dir),
            )
            fake_url = f"http://127.0.0.1:{fake_port}"
            wait_ready(fake_service, f"{fake_url}/v1/models", timeout=60)
            fake_app_url = start_app(services, "app-on-fake", data_dir, f"{fake_url}/v1")
            fake, fake_app = tier_client(fake_url), app_client(fake_app_url, key)
            clients += [fake, fake_app]
            print(
                "what the app sends for part 1's question (checked on the fake upstream): "
                + check_same_prompt(fake_app, fake, body_direct, args.question, args.max_tokens)
            )

        part_ttft(
            app=app,
            tier=tier,
            body_direct=body_direct,
            body_flush=None if args.no_flush else body_flush,
            question=args.question,
            max_tokens=args.max_tokens,
            rounds=args.rounds,
            warmup=args.warmup,
        )
        part_retrieval_share(
            tier=tier,
            tokenizer=tokenizer,
            question=args.rag_question,
            max_top_k=args.rag_max_top_k,
            prompt_tokens=args.rag_prompt_tokens,
            max_tokens=args.max_tokens,
            body_flush=body_flush,
            retrieval_rounds=args.rag_rounds,
            ttft_rounds=args.rag_ttft_rounds,
        )
        stream_body = direct_body(tokenizer, args.stream_question, args.stream_max_tokens)
        part_throughput(
            title=". Tokens/s at an SSE client: app against the llama.cpp tier",
            app=app,
            tier=tier,
            body_direct=stream_body,
            question=args.stream_question,
            max_tokens=args.stream_max_tokens,
            concurrency=args.concurrency,
            reps=args.stream_reps,
        )
        if fake is not None and fake_app is not None:
            for delay in args.fake_delays:
                params = {"seconds": delay, "paced": 1}  # a tier's own rate: see Script.paced
                fake.post("/bench/delay", params=params).raise_for_status()
                part_throughput(
                    title=(
                        f"b. Tokens/s at an SSE client: app against the fake upstream "
                        f"(one token every {delay * 1000:g} ms, concurrent streams)"
                    ),
                    app=fake_app,
                    tier=fake,
                    body_direct=stream_body,
                    question=args.stream_question,
                    max_tokens=args.stream_max_tokens,
                    concurrency=args.concurrency,
                    reps=args.stream_reps,
                )
        print()
        print(f"total {time.monotonic() - started:.0f} s")
    finally:
        for client in clients:
            client.close()
        services.stop_all()
        if args.keep:
            print(f"kept {data_dir} (logs: {', '.join(s.log.name for s in services.started)})")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
