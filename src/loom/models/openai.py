"""OpenAI and every OpenAI-compatible server (Ollama, vLLM, llama.cpp's server, LM Studio, ...).

Built on the official ``openai`` SDK, imported only when one of these models is created:

```python
Agent(model="openai:gpt-4o-mini")                              # needs OPENAI_API_KEY
Agent(model="ollama:qwen3:4b")                                 # http://localhost:11434/v1
Agent(model="openai-compatible:http://127.0.0.1:8000/v1#my-model")
```
The SDK's own retries are switched off: :mod:`loom.models.resilience` retries (before the first
delta only), keeps a circuit breaker per endpoint and bounds each call with a timeout.

An agent's ``output_type`` goes out as ``response_format``: ``{"type": "json_schema", ...}``
(strict when the schema fits OpenAI's strict mode: every property required, no open-ended
objects), or, with ``structured_output="json_object"``, as ``{"type": "json_object",
"schema": ...}``, the form llama-cpp-python's server takes (it rejects ``json_schema``).

Media go out as content arrays (:func:`to_openai_messages`); a tool result's media follow its
tool message in a user message, since a tool message takes text only. What a server streams
as ``reasoning_content`` (or ``reasoning``) is a ``ReasoningDelta`` and, in the answer, one
``Reasoning(provider="openai-compatible")`` part: never part of the answer's text, and sent
back only by a model built with ``send_reasoning=True``.
"""

from __future__ import annotations

import copy
import json
import mimetypes
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loom.content import Audio, Image, Media, Reasoning, describe
from loom.errors import (
    ConfigurationError,
    ModelResponseError,
    ModelUnavailable,
    UnsupportedContent,
)
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models._client import (
    DEFAULT_TIMEOUT,
    RemoteModel,
    import_sdk,
    malformed_chunk,
    read_api_key,
    sdk_events,
)
from loom.models._media import base64_of, data_url, media_of, reasoning_of
from loom.models.base import (
    ModelSettings,
    OutputSchema,
    ReasoningDelta,
    StreamPart,
    TextDelta,
)
from loom.models.cache import openai_cache_fields
from loom.models.resilience import CircuitBreaker, RetryPolicy

__all__ = [
    "OPENAI_AUDIO_FORMATS",
    "OpenAIModel",
    "from_compatible_spec",
    "from_ollama_spec",
    "from_spec",
    "openai_media",
    "response_format",
    "strict_schema",
    "to_openai_messages",
]

OPENAI_URL = "https://api.openai.com/v1"
OLLAMA_URL = "http://localhost:11434/v1"


OPENAI_AUDIO_FORMATS = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}
"""The audio media types Chat Completions' ``input_audio`` takes, and its ``format`` name."""


def openai_media(part: Media) -> dict[str, Any]:
    """One media part as a Chat Completions content part: ``image_url`` (a data URL of its
    bytes, or its URL as is), ``input_audio`` (base64, wav or mp3) or ``file`` (a data URL and
    its file name). ``UnsupportedContent`` for what the API cannot take (audio of another
    format, audio or a file given as a URL)."""
    if isinstance(part, Image):
        image: dict[str, Any] = {"url": part.url if part.url is not None else data_url(part)}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    if isinstance(part, Audio):
        fmt = OPENAI_AUDIO_FORMATS.get(part.media_type)
        if fmt is None or part.url is not None:
            what = "a URL" if part.url is not None else part.media_type or "an unknown type"
            raise UnsupportedContent(
                f"{part.label} is {what}: the Chat Completions API takes audio as WAV or MP3 "
                "bytes; convert it (Audio.from_path on a .wav or .mp3 file)",
                part=part.label,
            )
        return {"type": "input_audio", "input_audio": {"data": base64_of(part), "format": fmt}}
    if part.url is not None:
        raise UnsupportedContent(
            f"{part.label} is a URL: the Chat Completions API takes a file's bytes, not a "
            "link; send the bytes (File.from_path or File.from_bytes)",
            part=part.label,
        )
    filename = part.name or "file" + (mimetypes.guess_extension(part.media_type) or "")
    return {"type": "file", "file": {"file_data": data_url(part), "filename": filename}}


def _user_content(text: str, media: Sequence[Media]) -> str | list[dict[str, Any]]:
    if not media:
        return text
    content = [{"type": "text", "text": text}] if text else []
    return content + [openai_media(p) for p in media]


def _attachments(results: list[tuple[Message, Sequence[Media]]]) -> dict[str, Any]:
    """The user message that carries tool results' media (a tool message takes text only)."""
    content: list[dict[str, Any]] = []
    for m, media in results:
        content.append(
            {
                "type": "text",
                "text": f"Attached to the result of {m.name or 'the tool'} "
                f"({m.tool_call_id or 'no id'}):",
            }
        )
        content.extend(openai_media(p) for p in media)
    return {"role": "user", "content": content}


def to_openai_messages(
    messages: Sequence[Message], *, send_reasoning: bool = False
) -> list[dict[str, Any]]:
    """Loom messages as Chat Completions messages.

    A user message with media is a content array: its text, then ``image_url``,
    ``input_audio`` and ``file`` parts (:func:`openai_media`). A tool message takes text only:
    a tool result's media are named in its text, and a user message right after the run of
    tool messages carries them. Reasoning parts are not sent (OpenAI takes none back), unless
    ``send_reasoning``: then an assistant message's ``openai-compatible`` reasoning goes back
    as its ``reasoning_content`` (what DeepSeek's thinking mode asks for within a tool
    loop)."""
    out: list[dict[str, Any]] = []
    attached: list[tuple[Message, Sequence[Media]]] = []  # tool results' media, not yet sent
    for m in messages:
        if attached and m.role != "tool":
            out.append(_attachments(attached))
            attached = []
        media = media_of(m) if m.parts else []
        if m.role == "assistant":
            # "" rather than null: OpenAI accepts both, stricter servers (llama.cpp's) only "".
            text = "\n".join([m.content, *(describe(p) for p in media)]) if media else m.content
            item: dict[str, Any] = {"role": "assistant", "content": text}
            if send_reasoning:
                thought = "".join(r.text for r in reasoning_of(m, "openai-compatible"))
                if thought:
                    item["reasoning_content"] = thought
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.raw_arguments
                            if c.raw_arguments is not None
                            else json.dumps(c.arguments, ensure_ascii=False),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        elif m.role == "tool":
            text = m.content
            if media:
                named = ", ".join(describe(p) for p in media)
                text = f"{text}\n(attached in the next user message: {named})"
                attached.append((m, media))
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": text})
        elif m.role == "user":
            out.append({"role": "user", "content": _user_content(m.content, media)})
        else:
            out.append({"role": m.role, "content": m.content})
    if attached:
        out.append(_attachments(attached))
    return out


def _tool_param(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters or {"type": "object", "properties": {}},
        },
    }


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` in OpenAI's strict form (``additionalProperties: false`` on every object),
    or None when strict mode cannot take it (an optional property, an open-ended object)."""
    out = copy.deepcopy(schema)
    fits = True

    def walk(node: Any) -> None:
        nonlocal fits
        if not isinstance(node, dict):
            return
        if node.get("type") == "object" or "properties" in node:
            props = node.get("properties") or {}
            extra = node.get("additionalProperties")
            if set(node.get("required") or ()) != set(props) or extra not in (None, False):
                fits = False
            node["additionalProperties"] = False
        for key in _SCHEMA_MAPS:
            for sub in (node.get(key) or {}).values():
                walk(sub)
        for key in _SCHEMA_LISTS:
            for sub in node.get(key) or ():
                walk(sub)
        for key in ("items", "not", "additionalProperties"):
            walk(node.get(key))

    walk(out)
    return out if fits else None


def response_format(output: OutputSchema, style: str) -> dict[str, Any]:
    """The ``response_format`` that asks for ``output`` in ``style``."""
    if style == "json_object":
        return {"type": "json_object", "schema": output.schema}
    strict = strict_schema(output.schema)
    spec: dict[str, Any] = {
        "name": output.name,
        "schema": strict or output.schema,
        "strict": strict is not None,
    }
    if output.description:
        spec["description"] = output.description
    return {"type": "json_schema", "json_schema": spec}


def _tool_choice(choice: str | None, tools: Sequence[ToolSpec]) -> Any:
    if choice is None or not tools:
        return None
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


@dataclass(slots=True)
class _PendingCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIModel(RemoteModel):
    """A chat model behind the Chat Completions API, streamed.

    Args:
        model: The model name the server knows (``gpt-4o-mini``, ``qwen3:4b``, ...).
        api_key: The key; ``None`` reads ``api_key_var`` from the environment.
        base_url: The API root; ``None`` reads ``OPENAI_BASE_URL``, then OpenAI's own.
        require_key: Fail at once with ``ModelAuthError`` when there is no key (real OpenAI);
            local servers need none.
        timeout: Seconds per call attempt, unless ``ModelSettings.timeout`` says otherwise.
        retry: Retry policy (default: 3 retries with backoff and jitter).
        breaker: Circuit breaker; default one shared per base URL in the process.
        http_client: An ``httpx2.AsyncClient`` for the SDK (proxies, tests).
        structured_output: How an ``output_type`` is asked for: ``"json_schema"`` (OpenAI,
            vLLM, Ollama, llama.cpp's C++ server) or ``"json_object"`` (llama-cpp-python's
            server).
        send_reasoning: Send an answer's ``reasoning_content`` back with it on later calls
            (off: OpenAI and most servers take none, some refuse it; DeepSeek's thinking mode
            wants it back within a tool loop).
    """

    client_class = "AsyncOpenAI"
    accepts_media: frozenset[str] = frozenset({"image", "file", "audio"})
    """What a request may carry (``loom.content.check_parts``). A compatible server that
    cannot read a kind answers with an error of its own: ``ModelRequestError`` naming the
    parts the request held."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        provider: str = "openai",
        api_key_var: str = "OPENAI_API_KEY",
        require_key: bool = True,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        http_client: Any = None,
        structured_output: Literal["json_schema", "json_object"] = "json_schema",
        send_reasoning: bool = False,
    ) -> None:
        sdk = import_sdk("openai", "openai", "The OpenAI provider")
        if structured_output not in ("json_schema", "json_object"):
            raise ConfigurationError(
                f"structured_output must be 'json_schema' or 'json_object', got "
                f"{structured_output!r}"
            )
        self.structured_output = structured_output
        self.send_reasoning = send_reasoning
        key = read_api_key(
            api_key,
            api_key_var,
            provider=provider,
            required=require_key,
            hint=" (or use 'ollama:<model>' / 'openai-compatible:<url>#<model>' for a local "
            "server)",
        )
        super().__init__(
            model,
            sdk=sdk,
            provider=provider,
            key=key,
            key_var=api_key_var if provider == "openai" else None,
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL,
            timeout=timeout,
            retry=retry,
            breaker=breaker,
            http_client=http_client,
        )
        self.api_key_var = api_key_var

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r})"

    def _request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages, send_reasoning=self.send_reasoning),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = [_tool_param(t) for t in tools]
        choice = _tool_choice(s.tool_choice, tools)
        if choice is not None:
            body["tool_choice"] = choice
        if s.temperature is not None:
            body["temperature"] = s.temperature
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if s.reasoning_effort is not None:
            body["reasoning_effort"] = s.reasoning_effort
        if s.output is not None:
            body["response_format"] = response_format(s.output, self.structured_output)
        openai_cache_fields(body, s, self.base_url)
        body.update(s.extra)
        return body

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        stream = await self.client.chat.completions.create(**self._request(messages, tools, s))
        read = _Reading()
        async with stream:
            async for chunk in sdk_events(stream, self.name):
                with malformed_chunk(self.name, chunk):
                    text, reasoning = read.chunk(chunk)
                if reasoning:
                    yield ReasoningDelta(reasoning)
                if text:
                    yield TextDelta(text)
        if read.finish is None:
            # OpenAI-style servers always close a choice with a finish reason; a stream that
            # ends without one was cut off, however complete its text looks.
            raise ModelUnavailable(f"{self.name}: the stream ended before the answer was finished")
        with malformed_chunk(self.name, read):  # ids, names, reasons of the wrong type
            response = read.response(self.name, self.model)
        yield response


@dataclass(slots=True)
class _Reading:
    """What the chunks of one streamed answer have said so far."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    usage: Usage | None = None
    finish: str | None = None
    model: str | None = None

    def chunk(self, chunk: Any) -> tuple[str, str]:
        """Take in one chunk; return its new (text, reasoning). Tool-call deltas are assembled,
        not shown; reasoning is what OpenAI-compatible servers (DeepSeek, Qwen, vLLM) stream as
        ``reasoning_content`` (or ``reasoning``) beside the answer."""
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
                requests=1,
                cache_read_tokens=_cached(chunk.usage),
            )
        new: list[str] = []
        thought: list[str] = []
        for choice in chunk.choices or ():
            if choice.finish_reason:
                self.finish = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                if not isinstance(delta.content, str):
                    raise TypeError(f"content is {type(delta.content).__name__}, not a string")
                new.append(delta.content)
            reasoning = _reasoning_of(delta)
            if reasoning:
                thought.append(reasoning)
            for tc in delta.tool_calls or ():
                # Parallel calls interleave; each is keyed by its index. The SDK does not
                # validate chunks, so a field of the wrong type is caught here, not later.
                if not isinstance(tc.index, int):
                    raise TypeError(f"tool call index is {tc.index!r}, not an integer")
                pending = self.calls.setdefault(tc.index, _PendingCall())
                fn = tc.function
                name = fn.name if fn is not None and fn.name else None
                if tc.id:
                    pending.id = tc.id
                if name and name != pending.name:
                    # OpenAI sends the name once; some servers repeat it in every chunk, and a
                    # few split it: append only what is new.
                    pending.name += name
                if fn is not None and fn.arguments:
                    if not isinstance(fn.arguments, str):
                        raise TypeError("tool call arguments are not a string")
                    pending.arguments.append(fn.arguments)
        self.text.extend(new)
        self.reasoning.extend(thought)
        return "".join(new), "".join(thought)

    def response(self, name: str, model: str) -> ModelResponse:
        """The whole answer, once the stream has finished."""
        tool_calls = []
        for index in sorted(self.calls):
            p = self.calls[index]
            if not p.name:
                raise ModelResponseError(f"{name} streamed a tool call without a name")
            tool_calls.append(ToolCall.from_json(p.name, "".join(p.arguments), id=p.id))
        return ModelResponse(
            text="".join(self.text),
            tool_calls=tool_calls,
            usage=self.usage or Usage(requests=1),
            finish_reason=self.finish,
            model=self.model or model,
            parts=[Reasoning(text="".join(self.reasoning), provider="openai-compatible")]
            if self.reasoning
            else [],
        )


def _reasoning_of(delta: Any) -> str:
    """A delta's reasoning text: ``reasoning_content`` (DeepSeek, Qwen, vLLM, llama.cpp's
    server) or ``reasoning`` (Ollama, OpenRouter, newer vLLM); the SDK keeps such fields that
    it does not declare as extra attributes."""
    for key in ("reasoning_content", "reasoning"):
        value = getattr(delta, key, None)
        if value:
            if not isinstance(value, str):
                raise TypeError(f"{key} is {type(value).__name__}, not a string")
            return value
    return ""


def _cached(usage: Any) -> int:
    """Prompt tokens read from OpenAI's cache (a part of prompt_tokens, priced lower)."""
    details = getattr(usage, "prompt_tokens_details", None)
    value = getattr(details, "cached_tokens", None) if details is not None else None
    return value if isinstance(value, int) else 0


def from_spec(rest: str) -> OpenAIModel:
    """``openai:<model>``: OpenAI itself (or ``OPENAI_BASE_URL``), with ``OPENAI_API_KEY``."""
    return OpenAIModel(rest.strip())


def from_compatible_spec(rest: str) -> OpenAIModel:
    """``openai-compatible:<base_url>#<model>``: any server speaking the Chat Completions API."""
    url, sep, model = rest.strip().rpartition("#")
    if not sep or not url or not model:
        raise ConfigurationError(
            f"'openai-compatible:{rest}' needs a base URL and a model name separated by '#', "
            "for example 'openai-compatible:http://127.0.0.1:8000/v1#my-model'"
        )
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"'openai-compatible:{rest}': the base URL must start with http:// or https://"
        )
    return OpenAIModel(model, base_url=url, provider="openai-compatible", require_key=False)


def from_ollama_spec(rest: str) -> OpenAIModel:
    """``ollama:<model>``: a local Ollama server (``OLLAMA_BASE_URL`` overrides the address)."""
    base = os.environ.get("OLLAMA_BASE_URL") or OLLAMA_URL
    return OpenAIModel(
        rest.strip(),
        base_url=base,
        provider="ollama",
        api_key_var="OLLAMA_API_KEY",
        require_key=False,
    )
