"""``LocalEmbedder``: WordLlama's sentence embeddings, loaded from the ``wordllama`` wheel, offline.

The ``wordllama`` package ships one model inside it: ``l2_supercat`` at 256 dimensions (token
embeddings distilled from large language models; a text's vector is the mean of its tokens'
rows, normalised). Its own ``WordLlama.load()`` looks for the tokenizer in a ``tokenizer/``
folder while the wheel holds ``tokenizers/``, and then downloads it from Hugging Face; so the
two files are read here directly (``tokenizers.Tokenizer.from_file`` and ``safetensors`` into
NumPy) and nothing is ever downloaded. ``wordllama`` itself is not even imported: importing
it calls ``logging.basicConfig(level=INFO)``, which would make every INFO log of the host
application print.

The pooling is WordLlama's (``WordLlamaInference.embed(norm=True)``, checked equal in the
tests) without its padding: a batch is not padded to its longest text, and a text is cut at
``max_tokens`` tokens, so one very long memory cannot make a batch allocate gigabytes. An
empty text embeds to the zero vector (WordLlama would divide by zero).

Embedding is CPU work (a tokenizer in Rust, a gather and a sum in NumPy): ``embed`` runs it in
a worker thread, off the event loop. The model (about 32 MB) is loaded once per process, on
first use, and shared by every ``LocalEmbedder``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["WORDLLAMA_DIMENSIONS", "WORDLLAMA_MODEL", "LocalEmbedder", "wordllama_files"]

WORDLLAMA_MODEL = "l2_supercat"
WORDLLAMA_DIMENSIONS = 256
# Matryoshka-trained: the first 64 or 128 columns are a smaller model of their own.
_TRUNCATIONS = (64, 128, 256)
_WEIGHTS = f"weights/{WORDLLAMA_MODEL}_{WORDLLAMA_DIMENSIONS}.safetensors"
_TOKENIZER = f"tokenizers/{WORDLLAMA_MODEL}_tokenizer_config.json"
# Tokens gathered at once (x 256 float32 = 64 MB): bounds the memory of one batch.
_GATHER_TOKENS = 65_536


def wordllama_files() -> tuple[Path, Path]:
    """(weights, tokenizer) of the model inside the installed ``wordllama`` package, found
    without importing it; ``MissingDependencyError`` naming the ``memory`` extra when it is
    absent."""
    try:
        spec = importlib.util.find_spec("wordllama")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("wordllama", "memory", "The local embedder")
    places = list(spec.submodule_search_locations)
    for place in places:
        weights, tokenizer = Path(place) / _WEIGHTS, Path(place) / _TOKENIZER
        if weights.is_file() and tokenizer.is_file():
            return weights, tokenizer
    raise ConfigurationError(
        f"wordllama is installed but {_WEIGHTS} and {_TOKENIZER} are not both in {places}; "
        "reinstall it with: pip install --force-reinstall wordllama"
    )


@dataclass(frozen=True, slots=True)
class _Model:
    matrix: npt.NDArray[np.float32]  # one row per token id
    tokenizer: Any  # tokenizers.Tokenizer, without padding


_MODEL: _Model | None = None
_MODEL_LOCK = threading.Lock()


def _load() -> _Model:
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is not None:
            return _MODEL
        weights, tokenizer_file = wordllama_files()
        try:
            import numpy as np
            from safetensors import safe_open
            from tokenizers import Tokenizer
        except ImportError as exc:  # wordllama's own dependencies
            raise MissingDependencyError(
                exc.name or "safetensors", "memory", "The local embedder"
            ) from None
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.no_padding()
        with safe_open(str(weights), framework="np", device="cpu") as f:
            matrix = np.ascontiguousarray(f.get_tensor("embedding.weight"), dtype=np.float32)
        _MODEL = _Model(matrix, tokenizer)
        return _MODEL


class LocalEmbedder:
    """Offline sentence embeddings from the WordLlama model inside the ``wordllama`` wheel.

    Args:
        dimensions: 256 (the model), or 128 / 64 (its first columns: smaller vectors, a little
            less accurate).
        max_tokens: A text's tokens past this are not read (a vector is a mean; the start of a
            memory says what it is about).

    Needs the ``memory`` extra (``pip install 'loom-agents[memory]'``). Nothing is downloaded.
    """

    def __init__(self, dimensions: int = WORDLLAMA_DIMENSIONS, *, max_tokens: int = 2048) -> None:
        if dimensions not in _TRUNCATIONS:
            raise ConfigurationError(
                f"LocalEmbedder(dimensions={dimensions}): WordLlama's vectors are 256 long, or "
                f"truncated to one of {list(_TRUNCATIONS)}"
            )
        if max_tokens < 1:
            raise ConfigurationError(f"LocalEmbedder(max_tokens={max_tokens}): must be >= 1")
        wordllama_files()  # a missing extra fails here, not at the first embedding
        self._dimensions = dimensions
        self._max_tokens = max_tokens
        suffix = "" if dimensions == WORDLLAMA_DIMENSIONS else f"/{dimensions}"
        self._name = f"wordllama:{WORDLLAMA_MODEL}_{WORDLLAMA_DIMENSIONS}{suffix}"

    def __repr__(self) -> str:
        return f"LocalEmbedder(dimensions={self._dimensions})"

    @property
    def name(self) -> str:
        """``wordllama:l2_supercat_256`` (``/128`` or ``/64`` appended when truncated)."""
        return self._name

    @property
    def dimensions(self) -> int:
        """The length of every vector: 256 unless truncated."""
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors (the zero vector for an empty text), computed in a worker thread."""
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """``embed`` in the calling thread (for benchmarks and scripts without a loop)."""
        import numpy as np

        model = _load()
        # Cut each text before tokenizing (no token is near 32 characters long), then its ids.
        cut = [text[: self._max_tokens * 32] for text in texts]
        encoded = model.tokenizer.encode_batch(cut, add_special_tokens=False)
        token_ids = [encoding.ids[: self._max_tokens] for encoding in encoded]
        out = np.zeros((len(texts), self._dimensions), dtype=np.float32)
        vocabulary = model.matrix.shape[0]
        start = 0
        while start < len(token_ids):
            # A group of texts whose tokens fit one gather (at least one text).
            end, tokens = start, 0
            while end < len(token_ids) and (end == start or tokens < _GATHER_TOKENS):
                tokens += len(token_ids[end])
                end += 1
            lengths = np.array([len(ids) for ids in token_ids[start:end]], dtype=np.int64)
            filled = np.flatnonzero(lengths)
            if filled.size:
                ids = np.concatenate([token_ids[start + i] for i in filled]).astype(np.int64)
                np.clip(ids, 0, vocabulary - 1, out=ids)  # as WordLlama does
                rows = model.matrix[ids, : self._dimensions]
                offsets = np.concatenate(([0], np.cumsum(lengths[filled])[:-1]))
                sums = np.add.reduceat(rows, offsets, axis=0)
                means = sums / lengths[filled, None].astype(np.float32)
                norms = np.linalg.norm(means, axis=1, keepdims=True)
                out[start + filled] = means / np.where(norms > 0, norms, 1.0)
            start = end
        vectors: list[list[float]] = out.tolist()
        return vectors
