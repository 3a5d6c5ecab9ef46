"""Embedders: text to vectors, for the item store's semantic search (issue #29).

``Embedder`` is the seam (:mod:`loom.embedding.base`): a name, a fixed number of dimensions,
and ``embed(texts)`` returning one vector per text. The store calls it when an item is written
or searched; an embedder that is down never loses an item (it is stored and indexed for
keywords, and embedded later). Implementations: ``HashEmbedder`` (deterministic, offline, for
tests and logic: words hashed into buckets, no meaning), and the real ones added beside it (a
local model shipped inside a PyPI package, llama.cpp, any OpenAI-compatible ``/embeddings``).
"""

from loom.embedding.base import (
    Embedder,
    EmbedderUnavailable,
    EmbeddingDimensionMismatch,
    EmbeddingError,
    HashEmbedder,
    check_vectors,
    cosine,
)

__all__ = [
    "Embedder",
    "EmbedderUnavailable",
    "EmbeddingDimensionMismatch",
    "EmbeddingError",
    "HashEmbedder",
    "check_vectors",
    "cosine",
]
