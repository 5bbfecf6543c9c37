"""Framework-free inference: tokenizers matched to the served model, prompt assembly, and
the OpenAI-compatible client. Filled in by the answering work; empty by design until then."""

__all__: list[str] = []
