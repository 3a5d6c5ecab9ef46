"""``embedder_from_spec`` and ``LOOM_EMBEDDER``: the strings that name an embedder."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loom.embedding import (
    EMBEDDER_ENV,
    EMBEDDER_SPECS,
    HashEmbedder,
    LlamaCppEmbedder,
    LocalEmbedder,
    OpenAIEmbedder,
    default_embedder,
    embedder_from_spec,
)
from loom.errors import ConfigurationError
from loom.models.local import bundled_model_path

GGUF = str(bundled_model_path())


@pytest.fixture(autouse=True)
def openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # never used: nothing is embedded here


@pytest.mark.parametrize(
    ("spec", "kind", "check"),
    [
        ("local", LocalEmbedder, lambda e: e.dimensions == 256),
        ("  local ", LocalEmbedder, lambda e: e.name == "wordllama:l2_supercat_256"),
        ("hash", HashEmbedder, lambda e: e.dimensions == 64),
        ("hash:16", HashEmbedder, lambda e: e.dimensions == 16),
        ("llama", LlamaCppEmbedder, lambda e: e.name == "llama" and str(e.path) == GGUF),
        (f"llama:{GGUF}", LlamaCppEmbedder, lambda e: e.name == f"llama:{GGUF}"),
        (
            "openai:text-embedding-3-small",
            OpenAIEmbedder,
            lambda e: e.base_url == "https://api.openai.com/v1" and e.dimensions == 1536,
        ),
        (
            "openai:nomic-embed-text:latest@http://127.0.0.1:11434/v1",
            OpenAIEmbedder,
            lambda e: (
                (e.model, e.base_url) == ("nomic-embed-text:latest", "http://127.0.0.1:11434/v1")
            ),
        ),
        (
            "openai:org@team/model",  # an @ not followed by a URL belongs to the model name
            OpenAIEmbedder,
            lambda e: (e.model, e.base_url) == ("org@team/model", "https://api.openai.com/v1"),
        ),
    ],
)
def test_specs(spec: str, kind: type, check: Callable[[object], bool]) -> None:
    embedder = embedder_from_spec(spec)
    assert isinstance(embedder, kind)
    assert check(embedder)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "it is empty"),
        ("wordllama", "unknown embedder"),
        ("local:big", "unknown embedder"),
        ("hash:abc", "must be a number"),
        ("hash:0", "must be a number"),
        ("llama:", "needs the path"),
        ("openai:", "needs a model name"),
        ("openai:@http://127.0.0.1:8000/v1", "needs a model name"),
    ],
)
def test_bad_specs_list_the_valid_forms(spec: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why) as caught:
        embedder_from_spec(spec)
    assert all(form in str(caught.value) for form, _ in EMBEDDER_SPECS)


def test_a_missing_gguf_is_named() -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        embedder_from_spec("llama:/nowhere/model.gguf")


def test_default_embedder_reads_loom_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    assert default_embedder() is None  # keyword search only
    monkeypatch.setenv(EMBEDDER_ENV, " ")
    assert default_embedder() is None
    monkeypatch.setenv(EMBEDDER_ENV, "hash:8")
    embedder = default_embedder()
    assert isinstance(embedder, HashEmbedder) and embedder.dimensions == 8
    monkeypatch.setenv(EMBEDDER_ENV, "nonsense")
    with pytest.raises(ConfigurationError, match="unknown embedder"):
        default_embedder()
