"""``OpenAIEmbedder`` against real OpenAI-compatible servers on loopback: llama-cpp-python's
own server (someone else's implementation of the API) and a small starlette app that answers
the failures (``fake_embeddings_app``)."""

from __future__ import annotations

import math

import pytest

from loom.embedding import (
    EmbedderAuthError,
    EmbedderUnavailable,
    EmbeddingDimensionMismatch,
    EmbeddingError,
    LlamaCppEmbedder,
    OpenAIEmbedder,
    cosine,
)
from loom.errors import ModelAuthError

pytest.importorskip("openai")
pytestmark = pytest.mark.slow  # a real model, real server subprocesses

TEXTS = ["my dog is called Rex", "the stock market fell", "tea, not coffee", "", "Lisbon"]


async def test_llama_cpp_server_embeds_and_dimensions_are_learned(
    llama_embedding_server: str,
) -> None:
    embedder = OpenAIEmbedder("smollm2", base_url=llama_embedding_server, batch_size=2)
    assert embedder.name == f"openai:smollm2@{llama_embedding_server}"
    with pytest.raises(EmbeddingError, match="learn_dimensions"):
        _ = embedder.dimensions
    vectors = await embedder.embed(TEXTS)
    assert embedder.dimensions == 576  # SmolLM2's embedding length, learned from the answer
    assert [len(v) for v in vectors] == [576] * len(TEXTS)
    assert vectors[3] == [0.0] * 576  # an empty text is not sent
    # The same model in-process, pooled the same way: the same directions.
    local = await LlamaCppEmbedder().embed(TEXTS)
    for i in (0, 1, 2, 4):
        assert math.isclose(cosine(vectors[i], local[i]), 1.0, abs_tol=1e-3)
    # Batching does not change an answer.
    (alone,) = await OpenAIEmbedder("smollm2", base_url=llama_embedding_server).embed(TEXTS[1:2])
    assert math.isclose(cosine(alone, vectors[1]), 1.0, abs_tol=1e-4)


async def test_learn_dimensions_asks_once(llama_embedding_server: str) -> None:
    embedder = OpenAIEmbedder("smollm2", base_url=llama_embedding_server)
    assert await embedder.learn_dimensions() == 576
    assert await embedder.embed(["", ""]) == [[0.0] * 576, [0.0] * 576]


async def test_closed_port_is_unavailable_and_names_the_url(closed_port_url: str) -> None:
    base = closed_port_url
    embedder = OpenAIEmbedder("m", base_url=base, dimensions=3)
    with pytest.raises(EmbedderUnavailable, match=f"could not reach {base}/embeddings"):
        await embedder.embed(["hello"])


async def test_batches_order_and_requested_dimensions(fake_embeddings_server: str) -> None:
    embedder = OpenAIEmbedder("echo", base_url=fake_embeddings_server, batch_size=2)
    vectors = await embedder.embed(["a", "b", "", "c", "d", "e"])
    # [texts in the request, index in it, 1.0]: requests of 2, 2 and 1; the empty text unsent.
    assert vectors == [
        [2.0, 0.0, 1.0],
        [2.0, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [2.0, 0.0, 1.0],
        [2.0, 1.0, 1.0],
        [1.0, 0.0, 1.0],
    ]
    # Only empty texts and no length known yet: it is asked for once, with a probe text.
    assert await OpenAIEmbedder("echo", base_url=fake_embeddings_server).embed(["", ""]) == [
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    shuffled = OpenAIEmbedder("echo-shuffled", base_url=fake_embeddings_server)
    assert [v[1] for v in await shuffled.embed(["a", "b", "c"])] == [0.0, 1.0, 2.0]
    sized = OpenAIEmbedder("echo", base_url=fake_embeddings_server, dimensions=5)
    assert sized.dimensions == 5
    assert [len(v) for v in await sized.embed(["a"])] == [5]  # `dimensions` was sent


async def test_wrong_length_is_a_dimension_mismatch(fake_embeddings_server: str) -> None:
    embedder = OpenAIEmbedder("short", base_url=fake_embeddings_server)
    assert len((await embedder.embed(["first"]))[0]) == 3
    with pytest.raises(EmbeddingDimensionMismatch) as caught:
        await embedder.embed(["second"])
    assert (caught.value.expected, caught.value.got) == (3, 2)
    # A server that ignores the `dimensions` asked for, and answers 3.
    declared = OpenAIEmbedder("echo-fixed", base_url=fake_embeddings_server, dimensions=4)
    with pytest.raises(EmbeddingDimensionMismatch, match="declared 4 dimensions"):
        await declared.embed(["x"])


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        ("fail500", EmbedderUnavailable, "500: the GPU caught fire"),
        ("bad400", EmbeddingError, "400: input must not contain the word banana"),
        ("unknown404", EmbeddingError, "404: model 'unknown404' not found.*/v1"),
        ("per-token", EmbeddingError, "one vector per token"),
        ("not-json", EmbeddingError, "not an embeddings response|cannot read"),
    ],
)
async def test_server_errors_are_typed(
    fake_embeddings_server: str, model: str, error: type[Exception], message: str
) -> None:
    embedder = OpenAIEmbedder(model, base_url=fake_embeddings_server)
    with pytest.raises(error, match=message) as caught:
        await embedder.embed(["hello"])
    if error is EmbeddingError:  # a refusal is not "down": retrying later will not help
        assert not isinstance(caught.value, EmbedderUnavailable)


async def test_timeout_is_unavailable(fake_embeddings_server: str) -> None:
    embedder = OpenAIEmbedder("stall", base_url=fake_embeddings_server, timeout=0.3)
    with pytest.raises(EmbedderUnavailable, match=r"timed out after 0\.3 s"):
        await embedder.embed(["hello"])


async def test_api_key_from_argument_or_named_variable(
    fake_embeddings_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_EMBEDDINGS_KEY", raising=False)
    keyless = OpenAIEmbedder(
        "needs-key", base_url=fake_embeddings_server, api_key_env="MY_EMBEDDINGS_KEY"
    )
    with pytest.raises(EmbedderAuthError, match=r"401.*MY_EMBEDDINGS_KEY") as caught:
        await keyless.embed(["hello"])
    assert isinstance(caught.value, ModelAuthError)
    given = OpenAIEmbedder("needs-key", base_url=fake_embeddings_server, api_key="sekret")
    assert await given.embed(["hello"]) == [[1.0, 0.0]]
    monkeypatch.setenv("MY_EMBEDDINGS_KEY", "sekret")
    named = OpenAIEmbedder(
        "needs-key", base_url=fake_embeddings_server, api_key_env="MY_EMBEDDINGS_KEY"
    )
    assert await named.embed(["hello"]) == [[1.0, 0.0]]


def test_openai_itself_needs_a_key_and_knows_its_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(EmbedderAuthError, match="OPENAI_API_KEY"):
        OpenAIEmbedder("text-embedding-3-small")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    embedder = OpenAIEmbedder("text-embedding-3-small")
    assert embedder.dimensions == 1536 and embedder.name == "openai:text-embedding-3-small"
    assert OpenAIEmbedder("text-embedding-3-large", dimensions=256).dimensions == 256
