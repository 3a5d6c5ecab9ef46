"""Anthropic's Messages API on the official ``anthropic`` SDK, streamed.

```python
Agent(model="anthropic:claude-opus-4-6")   # needs ANTHROPIC_API_KEY
```
System messages go to the ``system`` parameter; tool calls are ``tool_use`` blocks and their
results ``tool_result`` blocks, consecutive results merged into one user message as the API
requires. Retries, the circuit breaker and the call timeout come from
:mod:`loom.models.resilience`; the SDK's own retries are off.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import (
    ConfigurationError,
    MissingDependencyError,
    ModelAuthError,
    ModelResponseError,
    ModelUnavailable,
)
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models.base import ModelSettings, StreamPart, TextDelta, ToolCallDelta
from loom.models.resilience import (
    CircuitBreaker,
    Failure,
    RetryPolicy,
    breaker_for,
    classify_status,
    connection_failure,
    resilient_stream,
)

__all__ = ["AnthropicModel", "from_spec", "to_anthropic_messages"]

DEFAULT_MAX_TOKENS = 4096
DEFAULT_TIMEOUT = 120.0
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


def _sdk() -> Any:
    try:
        import anthropic
    except ImportError:
        raise MissingDependencyError("anthropic", "anthropic", "The Anthropic provider") from None
    return anthropic


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, messages) in the Messages API's shape."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:  # the API wants user and assistant to alternate
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            if m.content:
                system.append(m.content)
        elif m.role == "user":
            add("user", [{"type": "text", "text": m.content}] if m.content else [])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content else []
            )
            for c in m.tool_calls:
                # Arguments that were not JSON cannot be replayed as ``input``; the tool result
                # that follows tells the model what was wrong with them.
                blocks.append(
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                )
            add("assistant", blocks)
        elif m.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": m.content,
            }
            if m.metadata.get("success") is False:
                block["is_error"] = True
            add("user", [block])
    return "\n\n".join(system), out


def _tool_choice(choice: str | None) -> dict[str, Any] | None:
    if choice is None or choice == "auto":
        return {"type": "auto"} if choice else None
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    return {"type": "tool", "name": choice}


@dataclass(slots=True)
class _Block:
    kind: str
    id: str | None = None
    name: str = ""
    parts: list[str] = field(default_factory=list)


class AnthropicModel:
    """A Claude model behind the Messages API, streamed.

    Args:
        model: The model name (``claude-opus-4-6``, ...).
        api_key: The key; ``None`` reads ``ANTHROPIC_API_KEY``.
        base_url: The API root; ``None`` reads ``ANTHROPIC_BASE_URL``, then Anthropic's own.
        max_tokens: Default answer length (the API requires one).
        timeout / retry / breaker / http_client: as for :class:`loom.models.openai.OpenAIModel`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        http_client: Any = None,
    ) -> None:
        self._anthropic = _sdk()
        if not model:
            raise ConfigurationError(
                "anthropic: the model name is empty, e.g. 'anthropic:claude-opus-4-6'"
            )
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ModelAuthError(
                "the anthropic provider needs an API key: set the ANTHROPIC_API_KEY environment "
                "variable"
            )
        self.model = model
        self.name = f"anthropic:{model}"
        self.base_url = (
            base_url or os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
        ).rstrip("/")
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or breaker_for(f"anthropic:{self.base_url}")
        self._key = key
        self._http_client = http_client
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r})"

    @property
    def client(self) -> Any:
        """The ``anthropic.AsyncAnthropic`` client for the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._anthropic.AsyncAnthropic(
                api_key=self._key,
                base_url=self.base_url,
                max_retries=0,
                timeout=self.timeout,
                http_client=self._http_client,
            )
        return client

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        """Stream one answer; retried before the first delta on transient failures."""
        s = settings or ModelSettings()
        return resilient_stream(
            lambda: self._attempt(messages, tools, s),
            self._classify,
            policy=self.retry,
            breaker=self.breaker,
            timeout=s.timeout if s.timeout is not None else self.timeout,
            provider=f"anthropic ({self.base_url})",
        )

    def _request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> dict[str, Any]:
        system, converted = to_anthropic_messages(messages)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": converted,
            "max_tokens": s.max_tokens or self.max_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters or {"type": "object", "properties": {}},
                }
                for t in tools
            ]
            choice = _tool_choice(s.tool_choice)
            if choice is not None:
                body["tool_choice"] = choice
        if s.temperature is not None:
            body["temperature"] = s.temperature
        body.update(s.extra)
        return body

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        stream = await self.client.messages.create(**self._request(messages, tools, s))
        blocks: dict[int, _Block] = {}
        input_tokens = output_tokens = 0
        stop: str | None = None
        finished = False
        model_name = self.model
        async with stream:
            async for event in stream:
                kind = event.type
                if kind == "message_start":
                    model_name = event.message.model or model_name
                    input_tokens = _tokens_in(event.message.usage)
                    output_tokens = event.message.usage.output_tokens or 0
                elif kind == "content_block_start":
                    cb = event.content_block
                    blocks[event.index] = _Block(
                        cb.type, getattr(cb, "id", None), getattr(cb, "name", "") or ""
                    )
                    if cb.type == "tool_use":
                        yield ToolCallDelta(event.index, cb.id, cb.name)
                elif kind == "content_block_delta":
                    block = blocks.get(event.index)
                    d = event.delta
                    if block is None:
                        continue
                    if d.type == "text_delta":
                        block.parts.append(d.text)
                        yield TextDelta(d.text)
                    elif d.type == "input_json_delta":
                        block.parts.append(d.partial_json)
                        yield ToolCallDelta(event.index, arguments_delta=d.partial_json)
                elif kind == "message_delta":
                    stop = event.delta.stop_reason or stop
                    if event.usage is not None:
                        output_tokens = event.usage.output_tokens or output_tokens
                elif kind == "message_stop":
                    finished = True
        if not finished:
            raise ModelUnavailable(f"{self.name}: the stream ended before message_stop")
        text = "".join("".join(b.parts) for _, b in sorted(blocks.items()) if b.kind == "text")
        calls = [
            ToolCall.from_json(b.name, "".join(b.parts), id=b.id)
            for _, b in sorted(blocks.items())
            if b.kind == "tool_use"
        ]
        if not text and not calls and stop is None:
            raise ModelResponseError(f"{self.name} returned no content")
        yield ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens, requests=1),
            finish_reason=_STOP.get(stop or "", stop),
            model=model_name,
        )

    def _classify(self, exc: BaseException) -> Failure | None:
        sdk = self._anthropic
        where = f"anthropic ({self.base_url})"
        if isinstance(exc, sdk.APIStatusError):
            status = exc.status_code
            kind, message = _error_of(exc)
            if status < 400:  # an ``error`` event inside a 200 stream
                status = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}.get(
                    kind, 400
                )
            return classify_status(
                status, message, exc.response.headers, provider=where, key_var="ANTHROPIC_API_KEY"
            )
        if isinstance(exc, sdk.APITimeoutError):
            return connection_failure(where, exc, timed_out=True)
        if isinstance(exc, sdk.APIConnectionError):
            return connection_failure(where, exc)
        from loom.models.openai import _transport_failure

        return _transport_failure(where, exc)


def _tokens_in(usage: Any) -> int:
    # Cached prompt tokens are reported apart from the rest; all of them were read.
    return int(
        (usage.input_tokens or 0)
        + (getattr(usage, "cache_creation_input_tokens", None) or 0)
        + (getattr(usage, "cache_read_input_tokens", None) or 0)
    )


def _error_of(exc: Any) -> tuple[str, str]:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("type", "")), str(inner.get("message", exc))
    return "", str(getattr(exc, "message", exc))


def from_spec(rest: str) -> AnthropicModel:
    """``anthropic:<model>`` with ``ANTHROPIC_API_KEY``."""
    return AnthropicModel(rest.strip())
