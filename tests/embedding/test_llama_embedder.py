"""``LlamaCppEmbedder``: the bundled SmolLM2 GGUF through llama.cpp, in process."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from loom.embedding import Embedder, LlamaCppEmbedder, cosine
from loom.errors import ConfigurationError
from loom.models.local import bundled_model_path

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow  # a real model, real server subprocesses


@pytest.fixture(scope="module")
def embedder() -> LlamaCppEmbedder:
    return LlamaCppEmbedder()


async def test_pooled_unit_vectors_with_the_models_dimensions(embedder: LlamaCppEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.name == "llama" and embedder.path == bundled_model_path()
    assert embedder.dimensions == 576  # SmolLM2-135M's embedding length, read from the model
    pet, dog, stocks = await embedder.embed(
        ["what is my pet's name?", "my dog is called Rex", "the stock market fell"]
    )
    assert all(len(v) == 576 for v in (pet, dog, stocks))
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in (pet, dog, stocks))
    assert cosine(pet, dog) > cosine(pet, stocks)


async def test_empty_text_long_text_and_batches() -> None:
    embedder = LlamaCppEmbedder(n_ctx=16)  # a short window keeps the long text cheap
    texts = ["", "tea " * 3000, "one", "two words"]
    vectors = await embedder.embed(texts)  # llama.cpp itself crashes on an empty sequence
    assert vectors[0] == [0.0] * 576
    assert len(vectors[1]) == 576  # cut at n_ctx tokens, not an error
    alone = [(await embedder.embed([t]))[0] for t in texts[2:]]
    assert all(
        math.isclose(cosine(a, b), 1.0, abs_tol=1e-4)
        for a, b in zip(alone, vectors[2:], strict=True)
    )
    assert await embedder.embed([]) == []


async def test_concurrent_calls_are_serialised_not_mixed(embedder: LlamaCppEmbedder) -> None:
    texts = ["red", "blue sky", "green"]
    expected = await embedder.embed(texts)
    answers = await asyncio.gather(*(embedder.embed(texts) for _ in range(3)))
    for answer in answers:
        assert all(
            math.isclose(cosine(a, b), 1.0, abs_tol=1e-5)
            for a, b in zip(answer, expected, strict=True)
        )


def test_path_and_pooling_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        LlamaCppEmbedder(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a model")
    with pytest.raises(ConfigurationError, match="not a GGUF"):
        LlamaCppEmbedder(not_gguf)
    with pytest.raises(ConfigurationError, match="pooling"):
        LlamaCppEmbedder(pooling="max")  # type: ignore[arg-type]
    named = LlamaCppEmbedder(bundled_model_path(), pooling="last")
    assert named.name == f"llama:{bundled_model_path()}#last"


async def test_the_models_own_pooling_when_it_declares_none_is_refused() -> None:
    embedder = LlamaCppEmbedder(pooling="model")  # SmolLM2 declares none: per-token vectors
    with pytest.raises(ConfigurationError, match="declares no pooling"):
        await embedder.embed(["hello"])
