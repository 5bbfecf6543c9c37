"""The tier counts: vLLM's ``/tokenize``, one HTTP call per count."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx

from inference.errors import TokenizerUnavailable
from inference.tokenizers.base import (
    ChatMessage,
    ToolDefinition,
    escape_control_tokens,
    escaped_messages,
)

logger = logging.getLogger(__name__)


class RemoteTokenizer:
    """Asks the tier to count: vLLM's ``POST /tokenize`` (at the server root, not under
    ``/v1``) applies the served model's chat template to ``messages``. One HTTP call per
    count: use it when the tokenizer files are not at hand.

    The vocabulary is not at hand either, so :meth:`escape` breaks the control tokens of
    the common template families (:data:`CONTROL_TOKENS`); vLLM parses special tokens in
    the text it is sent whatever ``add_special_tokens`` says (that flag is about BOS)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        self._http = httpx.Client(base_url=root, timeout=timeout, transport=transport)
        self._model = model
        self.name = model

    def _count(self, body: dict[str, Any]) -> int:
        try:
            response = self._http.post("/tokenize", json={"model": self._model, **body})
            response.raise_for_status()
            return int(response.json()["count"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            # The kind of failure only: httpx's text names the tier's host (the log keeps it).
            logger.warning("the tier's /tokenize failed: %r", exc)
            raise TokenizerUnavailable(
                f"the tier could not count tokens ({type(exc).__name__})"
            ) from exc

    def escape(self, text: str) -> str:
        return escape_control_tokens(text)

    def count(self, text: str) -> int:
        return self._count({"prompt": self.escape(text), "add_special_tokens": False})

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        escaped = escaped_messages(messages, self.escape)
        body: dict[str, Any] = {"messages": escaped, "add_generation_prompt": True}
        if tools:
            body["tools"] = list(tools)  # vLLM's /tokenize renders them as a chat would
        return self._count(body)
