"""The embedder seam: ``Embedder`` (a Protocol), its errors, and the checks every caller shares.

An embedder turns texts into vectors of a fixed length (``dimensions``). What it answers is
checked once, here (:func:`check_vectors`): one vector per text, each of ``dimensions`` finite
floats, else ``EmbeddingDimensionMismatch`` / ``EmbeddingError``, so a store never writes a
vector of the wrong shape. An embedder that cannot be reached raises ``EmbedderUnavailable``
(the store keeps the item and embeds it later).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from loom.errors import ModelAuthError, ModelError

__all__ = [
    "Embedder",
    "EmbedderAuthError",
    "EmbedderUnavailable",
    "EmbeddingDimensionMismatch",
    "EmbeddingError",
    "HashEmbedder",
    "check_vectors",
    "cosine",
]


class EmbeddingError(ModelError):
    """An embedder failed or answered something unusable."""


class EmbedderUnavailable(EmbeddingError):
    """The embedder cannot be reached, timed out or answered 5xx: nothing was embedded (items
    are kept and embedded later)."""


class EmbedderAuthError(EmbeddingError, ModelAuthError):
    """The embedder refused the credentials (401 / 403): a missing or wrong API key. Also a
    ``ModelAuthError``, so code that handles a model's key problems handles this one too."""


class EmbeddingDimensionMismatch(EmbeddingError):
    """The embedder answered vectors of another length than it declared (or than the store
    holds): a changed model needs a re-index (``loom memory reindex``)."""

    def __init__(self, message: str, *, expected: int, got: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.got = got


@runtime_checkable
class Embedder(Protocol):
    """Texts to vectors. ``name`` identifies the model (stored beside each vector, so a changed
    model is noticed); ``dimensions`` is every vector's length."""

    @property
    def name(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order. Raises ``EmbedderUnavailable`` when it cannot be
        reached and ``EmbeddingError`` for an unusable answer."""
        ...


def check_vectors(embedder: Embedder, texts: Sequence[str], vectors: object) -> list[list[float]]:
    """``vectors`` if it is one list of ``embedder.dimensions`` finite floats per text, else a
    typed error naming what is wrong (the embedder, the count or the length)."""
    if not isinstance(vectors, list) or len(vectors) != len(texts):
        count = len(vectors) if isinstance(vectors, list) else type(vectors).__name__
        raise EmbeddingError(
            f"embedder {embedder.name!r} answered {count} vectors for {len(texts)} texts"
        )
    out: list[list[float]] = []
    for vector in vectors:
        if isinstance(vector, str | bytes) or not hasattr(vector, "__len__"):
            raise EmbeddingError(
                f"embedder {embedder.name!r} answered a {type(vector).__name__} where a vector "
                "(a list of numbers) belongs"
            )
        if len(vector) != embedder.dimensions:
            raise EmbeddingDimensionMismatch(
                f"embedder {embedder.name!r} declared {embedder.dimensions} dimensions but "
                f"answered a vector of {len(vector)}: check its model, or set dimensions to "
                "what it returns and re-index",
                expected=embedder.dimensions,
                got=len(vector),
            )
        try:
            floats = [float(x) for x in vector]
        except (TypeError, ValueError):  # e.g. one vector per token: a server that does not pool
            raise EmbeddingError(
                f"embedder {embedder.name!r} answered a vector holding something other than "
                "numbers (a list per token means the server does not pool its embeddings: run "
                "it with mean pooling)"
            ) from None
        if not all(math.isfinite(x) for x in floats):
            raise EmbeddingError(f"embedder {embedder.name!r} answered a vector with NaN or inf")
        out.append(floats)
    return out


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (0.0 when either is all zeros)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


class HashEmbedder:
    """A deterministic offline embedder for tests: each word is hashed into one of
    ``dimensions`` buckets (so texts sharing words are close; it knows no synonyms). Set
    ``down = True`` to make it raise ``EmbedderUnavailable``; ``calls`` counts the texts it
    embedded."""

    def __init__(self, dimensions: int = 64, *, name: str = "hash") -> None:
        self._dimensions = dimensions
        self._name = name
        self.down = False
        self.calls = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.down:
            raise EmbedderUnavailable(f"embedder {self._name!r} is down (HashEmbedder.down)")
        self.calls += len(texts)
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        # Imported here: the item store imports this module (loom.store -> items_vectors), so
        # this one imports nothing of loom.store when it loads.
        from loom.store.items import terms_of

        vector = [0.0] * self._dimensions
        for word in terms_of(text):
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            vector[int.from_bytes(digest, "big") % self._dimensions] += 1.0
        return vector
