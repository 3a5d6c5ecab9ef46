"""``LocalEmbedder``: the WordLlama model inside the ``wordllama`` wheel, loaded offline."""

from __future__ import annotations

import asyncio
import math
import socket
from pathlib import Path

import pytest

import loom.embedding.local as local_module
from loom.embedding import Embedder, HashEmbedder, LocalEmbedder, cosine
from loom.errors import ConfigurationError

PET = "what is my pet's name?"
DOG = "my dog is called Rex"
STOCKS = "the stock market fell"
# Shares words with the wrong answer only: word overlap points the wrong way, meaning does not.
ANIMAL = "what animal do I own?"
SHARES = "I own shares in the stock market"


class NetworkBlocked(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every name lookup and socket connection fails, HOME is empty (no ~/.cache/wordllama to
    fall back on), and the process-wide model is forgotten, so the next embedding loads here."""

    def refuse(self: socket.socket, address: object) -> None:
        raise NetworkBlocked(f"a connection to {address!r} was attempted")

    def refuse_lookup(host: object, *args: object, **kwargs: object) -> None:
        raise NetworkBlocked(f"a lookup of {host!r} was attempted")

    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(local_module, "_MODEL", None)
    return tmp_path


async def test_loads_from_the_package_with_the_network_blocked(no_network: Path) -> None:
    embedder = LocalEmbedder()
    vectors = await embedder.embed([PET, DOG, STOCKS])
    assert isinstance(embedder, Embedder)
    assert embedder.dimensions == 256 and embedder.name == "wordllama:l2_supercat_256"
    assert [len(v) for v in vectors] == [256, 256, 256]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    assert not (no_network / ".cache").exists()  # nothing was downloaded or cached


async def test_concurrent_first_loads_share_one_model(no_network: Path) -> None:
    embedder = LocalEmbedder()
    texts = [f"note {i}: the meeting moved to room {i}" for i in range(50)]
    answers = await asyncio.gather(*(embedder.embed(texts) for _ in range(6)))
    assert all(answer == answers[0] for answer in answers)
    one_by_one = [(await embedder.embed([t]))[0] for t in texts[:5]]
    assert all(
        math.isclose(cosine(a, b), 1.0, rel_tol=1e-6)
        for a, b in zip(one_by_one, answers[0][:5], strict=True)
    )


async def test_ranks_by_meaning() -> None:
    pet, dog, stocks = await LocalEmbedder().embed([PET, DOG, STOCKS])
    assert cosine(pet, dog) > cosine(pet, stocks) + 0.2
    animal, dog, shares = await LocalEmbedder().embed([ANIMAL, DOG, SHARES])
    assert cosine(animal, dog) > cosine(animal, shares)


async def test_the_hash_embedder_ranks_by_shared_words_not_meaning() -> None:
    """Why the store needs a real model: the hash embedder picks the sentence sharing the
    words "I own" (it ranks PET nearer DOG only because both hold "my" and "is")."""
    animal, dog, shares = await HashEmbedder().embed([ANIMAL, DOG, SHARES])
    assert cosine(animal, dog) < cosine(animal, shares)


async def test_matches_wordllamas_own_normalised_embeddings() -> None:
    np = pytest.importorskip("numpy")
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    weights, tokenizer = local_module.wordllama_files()
    with safe_open(str(weights), framework="np") as f:
        matrix = f.get_tensor("embedding.weight")
    reference = WordLlamaInference(matrix, Tokenizer.from_file(str(tokenizer)))
    texts = [PET, DOG, STOCKS, "a much longer memory: " + "the user prefers tea over coffee. " * 20]
    ours = np.array(await LocalEmbedder().embed(texts))
    theirs = reference.embed(texts, norm=True)
    assert np.allclose(ours, theirs, atol=1e-6)


async def test_empty_text_is_the_zero_vector_and_long_text_is_cut() -> None:
    embedder = LocalEmbedder(max_tokens=16)
    empty, long_text, start = await embedder.embed(
        ["", "tea " * 16 + "stock market crash " * 500, "tea " * 16]
    )
    assert empty == [0.0] * 256
    assert math.isclose(cosine(long_text, start), 1.0, rel_tol=1e-6)
    assert await embedder.embed([]) == []


async def test_truncated_dimensions() -> None:
    small = LocalEmbedder(dimensions=64)
    (vector,) = await small.embed([DOG])
    (full,) = await LocalEmbedder().embed([DOG])
    assert len(vector) == 64 and small.name == "wordllama:l2_supercat_256/64"
    norm = math.sqrt(sum(x * x for x in full[:64]))
    assert all(math.isclose(a, b / norm, abs_tol=1e-6) for a, b in zip(vector, full, strict=False))
    with pytest.raises(ConfigurationError, match="64, 128, 256"):
        LocalEmbedder(dimensions=100)


def test_missing_package_names_the_memory_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.errors import MissingDependencyError

    real = local_module.importlib.util.find_spec
    monkeypatch.setattr(
        local_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wordllama" else real(name, *a),
    )
    with pytest.raises(MissingDependencyError, match=r"loom-agents\[memory\]"):
        LocalEmbedder()


def test_wordllamas_own_loader_reaches_for_the_network(no_network: Path) -> None:
    """Why the files are read directly: ``WordLlama.load()`` looks for the tokenizer in a
    folder the wheel does not have and downloads it (and the fixture above stops that)."""
    from wordllama import WordLlama

    with pytest.raises(NetworkBlocked, match=r"huggingface\.co"):
        WordLlama.load()
