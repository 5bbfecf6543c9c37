from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from inference import smollm2_gguf_path


class Command(BaseCommand):
    help = "Run the embedded inference tier: llama.cpp's OpenAI-compatible server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.INFERENCE_HOST)
        parser.add_argument("--port", type=int, default=settings.INFERENCE_PORT)
        parser.add_argument("--n-ctx", type=int, default=settings.INFERENCE_N_CTX)

    def handle(self, *args: Any, **options: Any) -> None:
        argv = inference_argv(host=options["host"], port=options["port"], n_ctx=options["n_ctx"])
        self.stderr.write("inference tier: " + " ".join(argv[1:]))
        sys.stderr.flush()
        os.execv(argv[0], argv)  # noqa: S606 - become the server: signals reach it directly


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
