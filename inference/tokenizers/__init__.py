"""Tokenizers matched to the served model, chat template included.

Tokens exist only inside the model's tokenizer, so the app carries the same one the
inference tier uses and counts the *templated* prompt, exactly as the tier will see it:

- :class:`GGUFTokenizer` — for llama.cpp: the GGUF file loaded vocab-only, its own
  ``tokenizer.chat_template`` rendered by llama-cpp-python's formatter, tokenized with
  special tokens and no extra BOS (what the server does);
- :class:`HFTokenizer` — for vLLM: the model's Hugging Face tokenizer files and template;
- :class:`TiktokenTokenizer` — for OpenAI's models (cl100k_base: GPT-4 and GPT-3.5;
  o200k_base: GPT-4o): tiktoken's own BPE over a local ``.tiktoken`` file, with OpenAI's
  documented per-message overhead for chat;
- :class:`RemoteTokenizer` — asks the tier itself (vLLM's ``/tokenize``; one HTTP call
  per count);
- :class:`FakeTokenizer` — deterministic, for unit tests.

Content is plain text. A tier renders the template and tokenizes the whole prompt with
special tokens parsed, so ``<|im_start|>system`` inside a question or a document would
reach the model as a real role marker. Every tokenizer here therefore has
:meth:`Tokenizer.escape`: each string its vocabulary reads as a special token gets a word
joiner (U+2060) after its first character, which leaves it visible but ordinary text.
:func:`inference.assemble_prompt` sends escaped contents, and ``count_chat`` counts
escaped contents; only the template's own markers are special tokens.
"""

from inference.tokenizers.base import (
    CONTROL_TOKENS,
    WORD_JOINER,
    ChatMessage,
    Tokenizer,
    ToolDefinition,
    escape_control_tokens,
    special_tokens_pattern,
)
from inference.tokenizers.fake import FakeTokenizer
from inference.tokenizers.gguf import FRAGMENT_CACHE_CHARS, GGUFTokenizer, smollm2_gguf_path
from inference.tokenizers.huggingface import HFTokenizer
from inference.tokenizers.loading import load_tokenizer
from inference.tokenizers.remote import RemoteTokenizer
from inference.tokenizers.tiktoken import (
    TIKTOKEN_ENCODINGS,
    TIKTOKEN_PACKAGE,
    TiktokenEncoding,
    TiktokenTokenizer,
    tiktoken_file,
)

__all__ = [
    "CONTROL_TOKENS",
    "FRAGMENT_CACHE_CHARS",
    "TIKTOKEN_ENCODINGS",
    "TIKTOKEN_PACKAGE",
    "WORD_JOINER",
    "ChatMessage",
    "FakeTokenizer",
    "GGUFTokenizer",
    "HFTokenizer",
    "RemoteTokenizer",
    "TiktokenEncoding",
    "TiktokenTokenizer",
    "Tokenizer",
    "ToolDefinition",
    "escape_control_tokens",
    "load_tokenizer",
    "smollm2_gguf_path",
    "special_tokens_pattern",
    "tiktoken_file",
]
