"""``OpenAIEmbedder``: any OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

OpenAI itself, and every server that speaks its API (vLLM, Ollama, LM Studio, llama.cpp's
server, LiteLLM, TEI's OpenAI route), through the official ``openai`` SDK (the ``openai`` extra).
Texts go in batches of at most ``batch_size``; each request is bounded by ``timeout``. The
vector length is the ``dimensions`` given (then also sent, for models that can shorten their
vectors), else the known length of an OpenAI model, else learned from the first answer and
fixed from then on; every answer is checked (:func:`loom.embedding.base.check_vectors`).

Failures are typed for the store: a server that cannot be reached, times out, rate-limits or
answers 5xx is ``EmbedderUnavailable`` (the item is kept and embedded later); 401 / 403 is
``EmbedderAuthError``; any other refusal is ``EmbeddingError`` carrying the server's message.
Empty texts are not sent (OpenAI refuses them): they embed to the zero vector.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Sequence
from typing import Any

from loom.embedding.base import (
    EmbedderAuthError,
    EmbedderUnavailable,
    EmbeddingError,
    check_vectors,
)
from loom.errors import ConfigurationError

__all__ = ["KNOWN_DIMENSIONS", "OPENAI_BASE_URL", "OpenAIEmbedder"]

OPENAI_BASE_URL = "https://api.openai.com/v1"
# What OpenAI's embedding models answer when no ``dimensions`` is asked for.
KNOWN_DIMENSIONS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
_PROBE = "dimensions probe"


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint.

    Args:
        model: The model name the server knows (``text-embedding-3-small``,
            ``nomic-embed-text``, ...).
        base_url: The API root, ending in ``/v1`` for most servers; OpenAI's by default.
        api_key: The key; else the environment variable ``api_key_env`` names (default
            ``OPENAI_API_KEY``). OpenAI's own API needs one; a local server usually does not.
        api_key_env: The environment variable that holds the key.
        dimensions: The vector length. Given, it is also sent as the request's
            ``dimensions`` (OpenAI's v3 models shorten their vectors to it). Else it is known
            for OpenAI's models, or learned from the first answer (:meth:`learn_dimensions`).
        batch_size: Most texts per request.
        timeout: Seconds per request.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        dimensions: int | None = None,
        batch_size: int = 128,
        timeout: float = 30.0,
    ) -> None:
        if not model:
            raise ConfigurationError("OpenAIEmbedder: the model name is empty")
        if dimensions is not None and dimensions < 1:
            raise ConfigurationError(f"OpenAIEmbedder(dimensions={dimensions}): must be >= 1")
        if batch_size < 1:
            raise ConfigurationError(f"OpenAIEmbedder(batch_size={batch_size}): must be >= 1")
        if timeout <= 0:
            raise ConfigurationError(f"OpenAIEmbedder(timeout={timeout}): must be > 0 seconds")
        # Imported here: importing loom.embedding stays light for the stores that use its base.
        from loom.models._client import import_sdk

        self._sdk = import_sdk("openai", "openai", "The OpenAI-compatible embedder")
        self.model = model
        self.base_url = (base_url or OPENAI_BASE_URL).rstrip("/")
        self.batch_size = batch_size
        self.timeout = timeout
        self._key_env = api_key_env
        key = api_key or os.environ.get(api_key_env)
        if not key and self.base_url == OPENAI_BASE_URL:
            raise EmbedderAuthError(
                f"the OpenAI embedder ({model}) needs an API key: set {api_key_env} or pass "
                "api_key=..."
            )
        self._key = key or "not-needed"  # the SDK insists on one; local servers ignore it
        self._send_dimensions = dimensions is not None
        self._dimensions = dimensions or (
            KNOWN_DIMENSIONS.get(model) if self.base_url == OPENAI_BASE_URL else None
        )
        self._name = f"openai:{model}" + (
            "" if self.base_url == OPENAI_BASE_URL else f"@{self.base_url}"
        )
        # httpx connections belong to the event loop that opened them: one client per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.model!r}, base_url={self.base_url!r})"

    @property
    def name(self) -> str:
        """``openai:<model>``, with ``@<base_url>`` for a server other than OpenAI's."""
        return self._name

    @property
    def dimensions(self) -> int:
        """The vector length; ``EmbeddingError`` while it is not known yet (pass
        ``dimensions=`` or ``await learn_dimensions()`` first)."""
        if self._dimensions is None:
            raise EmbeddingError(
                f"embedder {self._name!r} does not know its vector length until the server "
                "answers once: pass dimensions=... or await learn_dimensions() first"
            )
        return self._dimensions

    async def learn_dimensions(self) -> int:
        """The vector length, asking the server once (one short text) if it is not known."""
        if self._dimensions is None:
            await self.embed([_PROBE])
        return self.dimensions

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._sdk.AsyncOpenAI(
                api_key=self._key, base_url=self.base_url, max_retries=0, timeout=self.timeout
            )
        return client

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order (the zero vector for an empty text)."""
        filled = [i for i, text in enumerate(texts) if text]
        answered: list[list[float]] = []
        for start in range(0, len(filled), self.batch_size):
            batch = [texts[i] for i in filled[start : start + self.batch_size]]
            answered.extend(await self._embed_batch(batch))
        if len(filled) < len(texts) and self._dimensions is None:
            await self.learn_dimensions()
        vectors = [[0.0] * self._dimensions for _ in texts] if self._dimensions else []
        for i, vector in zip(filled, answered, strict=True):
            vectors[i] = vector
        return vectors

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        sdk = self._sdk
        extra: dict[str, Any] = {"dimensions": self._dimensions} if self._send_dimensions else {}
        try:
            answer = await self._client().embeddings.create(
                model=self.model, input=batch, encoding_format="float", **extra
            )
        except sdk.APITimeoutError as exc:
            raise EmbedderUnavailable(
                f"embedder {self._name!r} timed out after {self.timeout:g} s at "
                f"{self.base_url}/embeddings: check the server is up and not overloaded, or "
                "raise timeout=; the items are kept and embedded later"
            ) from exc
        except sdk.APIConnectionError as exc:
            raise EmbedderUnavailable(
                f"embedder {self._name!r} could not reach {self.base_url}/embeddings "
                f"({exc.__cause__ or exc}): start the server or fix the URL (LOOM_EMBEDDER); "
                "the items are kept and embedded later"
            ) from exc
        except sdk.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except ValueError as exc:  # a body that is not JSON, or not the response's shape
            raise EmbeddingError(
                f"embedder {self._name!r} answered something that is not an embeddings "
                f"response ({type(exc).__name__}: {exc})"
            ) from exc
        try:
            rows = sorted(answer.data, key=lambda row: row.index)
            vectors: list[Any] = [row.embedding for row in rows]
        except (AttributeError, TypeError) as exc:
            raise EmbeddingError(
                f"embedder {self._name!r} answered something Loom cannot read as embeddings "
                f"({type(exc).__name__}: {exc}): {str(answer)[:200]}"
            ) from exc
        if self._dimensions is None and vectors:
            first = vectors[0]
            if isinstance(first, list) and first and isinstance(first[0], list):
                raise EmbeddingError(
                    f"embedder {self._name!r} answered one vector per token, not one per text: "
                    "the server does not pool (llama.cpp: run it with --pooling mean; "
                    "llama_cpp.server: --kv_overrides llama.pooling_type=int:1)"
                )
            if isinstance(first, list) and first:
                self._dimensions = len(first)  # learned once, then every answer must match
        return check_vectors(self, batch, vectors)

    def _status_error(self, exc: Any) -> EmbeddingError:
        from loom.models._client import error_of

        status = int(exc.status_code)
        _, message = error_of(exc)
        where = f"embedder {self._name!r} ({self.base_url}/embeddings) answered {status}: {message}"
        if status in (401, 403):
            return EmbedderAuthError(
                f"{where}; check the API key ({self._key_env}, or api_key=...)"
            )
        if status in (408, 409, 429) or status >= 500:
            return EmbedderUnavailable(f"{where}; the items are kept and embedded later")
        if status == 404:
            return EmbeddingError(
                f"{where}; check the model name and that the URL is the API root (often "
                "ending in /v1)"
            )
        return EmbeddingError(where)
