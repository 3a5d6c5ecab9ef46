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
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loom.errors import ConfigurationError, ModelResponseError, ModelUnavailable
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models._client import (
    DEFAULT_TIMEOUT,
    RemoteModel,
    import_sdk,
    malformed_chunk,
    read_api_key,
    sdk_events,
)
from loom.models.base import ModelSettings, OutputSchema, StreamPart, TextDelta
from loom.models.resilience import CircuitBreaker, RetryPolicy

__all__ = [
    "OpenAIModel",
    "from_compatible_spec",
    "from_ollama_spec",
    "from_spec",
    "response_format",
    "strict_schema",
    "to_openai_messages",
]

OPENAI_URL = "https://api.openai.com/v1"
OLLAMA_URL = "http://localhost:11434/v1"


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Loom messages as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            # "" rather than null: OpenAI accepts both, stricter servers (llama.cpp's) only "".
            item: dict[str, Any] = {"role": "assistant", "content": m.content}
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
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        else:
            out.append({"role": m.role, "content": m.content})
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
    """

    client_class = "AsyncOpenAI"

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
    ) -> None:
        sdk = import_sdk("openai", "openai", "The OpenAI provider")
        if structured_output not in ("json_schema", "json_object"):
            raise ConfigurationError(
                f"structured_output must be 'json_schema' or 'json_object', got "
                f"{structured_output!r}"
            )
        self.structured_output = structured_output
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
            "messages": to_openai_messages(messages),
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
        if s.output is not None:
            body["response_format"] = response_format(s.output, self.structured_output)
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
                    text = read.chunk(chunk)
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
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    usage: Usage | None = None
    finish: str | None = None
    model: str | None = None

    def chunk(self, chunk: Any) -> str:
        """Take in one chunk; return its new text (tool-call deltas are assembled, not shown)."""
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
                requests=1,
                cache_read_tokens=_cached(chunk.usage),
            )
        new: list[str] = []
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
        return "".join(new)

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
        )


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
