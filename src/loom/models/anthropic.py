"""Anthropic's Messages API on the official ``anthropic`` SDK, streamed.

```python
Agent(model="anthropic:claude-opus-4-6")   # needs ANTHROPIC_API_KEY
```
System messages go to the ``system`` parameter; tool calls are ``tool_use`` blocks and their
results ``tool_result`` blocks, consecutive results merged into one user message as the API
requires. Retries, the circuit breaker and the call timeout come from
:mod:`loom.models.resilience`; the SDK's own retries are off.

An agent's ``output_type`` becomes a forced output tool (:data:`OUTPUT_TOOL`) whose input
schema is the output schema: ``tool_choice`` makes the model call it (or, when the agent has
tools, call some tool). Its input JSON streams as text deltas and becomes the answer's text;
the tool call itself is never shown to the loop.

Media are ``image`` and ``document`` blocks (:func:`anthropic_media`), also inside a
``tool_result``. Extended thinking (``ModelSettings.thinking_budget``) streams as
``ReasoningDelta`` parts; ``thinking`` and ``redacted_thinking`` blocks are kept as
``Reasoning(provider="anthropic")`` parts (text and signature, or the encrypted data) and
sent back first in their assistant message, byte for byte, on the next request.

Prompt caching (``loom.models.cache``): with ``ModelSettings.cache_points`` set (the loop sets
them from the context) and ``prompt_cache`` on, the system prompt goes as text blocks and each
point's last block carries ``cache_control: {"type": "ephemeral"}`` (at most four).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from loom.models._media import base64_of, bytes_of, media_of, reasoning_of
from loom.models.base import ModelSettings, ReasoningDelta, StreamPart, TextDelta
from loom.models.cache import MAX_BREAKPOINTS
from loom.models.resilience import CircuitBreaker, RetryPolicy

__all__ = [
    "ANTHROPIC_IMAGE_TYPES",
    "OUTPUT_TOOL",
    "AnthropicModel",
    "anthropic_media",
    "anthropic_reasoning",
    "from_spec",
    "to_anthropic_messages",
]

OUTPUT_TOOL = "final_result"
"""The name of the forced output tool an ``output_type`` becomes."""

DEFAULT_MAX_TOKENS = 4096
ANTHROPIC_URL = "https://api.anthropic.com"
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


ANTHROPIC_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image media types the Messages API reads."""


def anthropic_media(part: Media) -> dict[str, Any]:
    """One media part as a Messages API content block: an ``image`` block (base64 or URL
    source), a ``document`` block for a PDF (base64 or URL) or a plain-text file (a text
    document). Audio, which the API does not read, is a short text placeholder (an earlier
    model's input in the history; a new message's audio is refused before the run, see
    ``AnthropicModel.accepts_media``). ``UnsupportedContent`` for a type the API cannot read."""
    if isinstance(part, Image):
        if part.url is not None:
            return {"type": "image", "source": {"type": "url", "url": part.url}}
        if part.media_type not in ANTHROPIC_IMAGE_TYPES:
            raise UnsupportedContent(
                f"{part.label} is {part.media_type or 'of unknown type'}: Anthropic reads PNG, "
                "JPEG, GIF and WebP images; convert it",
                part=part.label,
            )
        source = {"type": "base64", "media_type": part.media_type, "data": base64_of(part)}
        return {"type": "image", "source": source}
    if isinstance(part, Audio):
        return {"type": "text", "text": describe(part)}
    block: dict[str, Any]
    if part.url is not None:
        block = {"type": "document", "source": {"type": "url", "url": part.url}}
    elif part.media_type == "application/pdf":
        source = {"type": "base64", "media_type": "application/pdf", "data": base64_of(part)}
        block = {"type": "document", "source": source}
    elif part.media_type.startswith("text/"):
        text = bytes_of(part).decode("utf-8", errors="replace")
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
        }
    else:
        raise UnsupportedContent(
            f"{part.label} is {part.media_type or 'of unknown type'}: Anthropic reads PDF and "
            "plain-text documents; convert it to PDF or text",
            part=part.label,
        )
    if part.name:
        block["title"] = part.name
    return block


def anthropic_reasoning(part: Reasoning) -> dict[str, Any]:
    """An Anthropic reasoning part as the block it came from, byte for byte: ``thinking``
    (its text and signature) or ``redacted_thinking`` (its encrypted data)."""
    if part.encrypted is not None:
        return {"type": "redacted_thinking", "data": part.encrypted}
    return {"type": "thinking", "thinking": part.text, "signature": part.signature or ""}


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, messages) in the Messages API's shape.

    A user message's media follow its text as ``image`` and ``document`` blocks
    (:func:`anthropic_media`); a tool result with media is a ``tool_result`` whose content is
    an array of its text and those blocks. An assistant message's Anthropic reasoning goes
    back first in its content, unchanged (the API checks the signatures while a tool loop
    goes on); reasoning from another provider is left out."""
    converted = _Converted.of(messages)
    return "\n\n".join(converted.system), converted.messages


@dataclass(slots=True)
class _Converted:
    """Messages in the API's shape, and where each Loom message's last block went: a system
    text (``system_at``) or a block of an API message (``block_at``: message, block)."""

    system: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    system_at: dict[int, int] = field(default_factory=dict)
    block_at: dict[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, messages: Sequence[Message]) -> _Converted:
        c = cls()
        system, out = c.system, c.messages

        def add(i: int, role: str, blocks: list[dict[str, Any]]) -> None:
            if not blocks:
                return
            if out and out[-1]["role"] == role:  # the API wants user and assistant to alternate
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})
            c.block_at[i] = (len(out) - 1, len(out[-1]["content"]) - 1)

        for i, m in enumerate(messages):
            media = media_of(m) if m.parts else []
            if m.role == "system":
                if m.content:
                    system.append(m.content)
                    c.system_at[i] = len(system) - 1
            elif m.role == "user":
                blocks: list[dict[str, Any]] = (
                    [{"type": "text", "text": m.content}] if m.content else []
                )
                add(i, "user", blocks + [anthropic_media(p) for p in media])
            elif m.role == "assistant":
                blocks = [anthropic_reasoning(r) for r in reasoning_of(m, "anthropic")]
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                blocks.extend({"type": "text", "text": describe(p)} for p in media)
                for tc in m.tool_calls:
                    # Arguments that were not JSON cannot be replayed as ``input``; the tool
                    # result that follows tells the model what was wrong with them.
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": tc.id,
                            "name": tc.name,
                            "input": tc.arguments,
                        }
                    )
                add(i, "assistant", blocks)
            elif m.role == "tool":
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id or "",
                    "content": m.content,
                }
                if media:
                    text = [{"type": "text", "text": m.content}] if m.content else []
                    block["content"] = text + [anthropic_media(p) for p in media]
                if m.metadata.get("success") is False:
                    block["is_error"] = True
                add(i, "user", [block])
        return c

    def cached(self, points: Sequence[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(system blocks, messages) with a ``cache_control`` breakpoint at the end of each
        message in ``points`` (at most four; thinking blocks cannot carry one, so a point
        on an assistant message whose last block is one is skipped)."""
        system: list[dict[str, Any]] = [{"type": "text", "text": t} for t in self.system]
        messages = self.messages
        copied: set[int] = set()
        placed = 0
        for p in sorted(set(points)):
            if placed >= MAX_BREAKPOINTS:
                break
            if p in self.system_at:
                system[self.system_at[p]]["cache_control"] = _EPHEMERAL
                placed += 1
            elif p in self.block_at:
                at, index = self.block_at[p]
                if at not in copied:  # the breakpoint is the request's, not the history's
                    if messages is self.messages:
                        messages = list(messages)
                    messages[at] = {**messages[at], "content": list(messages[at]["content"])}
                    copied.add(at)
                block = messages[at]["content"][index]
                if block.get("type") in ("thinking", "redacted_thinking"):
                    continue
                messages[at]["content"][index] = {**block, "cache_control": _EPHEMERAL}
                placed += 1
        return system, messages


_EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}


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
    signature: list[str] = field(default_factory=list)  # a thinking block's
    data: str | None = None  # a redacted_thinking block's encrypted payload


class AnthropicModel(RemoteModel):
    """A Claude model behind the Messages API, streamed.

    Args:
        model: The model name (``claude-opus-4-6``, ...).
        api_key: The key; ``None`` reads ``ANTHROPIC_API_KEY``.
        base_url: The API root; ``None`` reads ``ANTHROPIC_BASE_URL``, then Anthropic's own.
        max_tokens: Default answer length (the API requires one).
        timeout / retry / breaker / http_client: as for :class:`loom.models.openai.OpenAIModel`.

    ``ModelSettings.thinking_budget`` turns on extended thinking (``thinking={"type":
    "enabled", "budget_tokens": N}``): ``max_tokens`` is raised above the budget when it is
    not, and ``temperature`` is left out (the API allows no other with thinking). The thinking
    streams as ``ReasoningDelta`` parts and is kept in the answer's ``parts``; within a tool
    loop it goes back unchanged, as the API requires.
    """

    client_class = "AsyncAnthropic"
    accepts_media: frozenset[str] = frozenset({"image", "file"})
    """What a request may carry (``loom.content.check_parts``): images and documents; the
    Messages API reads no audio."""

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
        sdk = import_sdk("anthropic", "anthropic", "The Anthropic provider")
        if not model:
            raise ConfigurationError(
                "anthropic: the model name is empty, e.g. 'anthropic:claude-opus-4-6'"
            )
        super().__init__(
            model,
            sdk=sdk,
            provider="anthropic",
            key=read_api_key(api_key, "ANTHROPIC_API_KEY", provider="anthropic", required=True),
            key_var="ANTHROPIC_API_KEY",
            base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_URL,
            timeout=timeout,
            retry=retry,
            breaker=breaker,
            http_client=http_client,
        )
        self.max_tokens = max_tokens

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r})"

    def _request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> dict[str, Any]:
        c = _Converted.of(messages)
        system: str | list[dict[str, Any]] = "\n\n".join(c.system)
        converted = c.messages
        if s.prompt_cache and s.cache_points:  # breakpoints need the system as blocks
            system, converted = c.cached(s.cache_points)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": converted,
            "max_tokens": s.max_tokens or self.max_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system
        if s.output is not None:
            return self._with_output(body, tools, s)
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
        self._sampling(body, s)
        return body

    def _sampling(self, body: dict[str, Any], s: ModelSettings) -> None:
        """``body``'s temperature, thinking and extra settings."""
        if s.thinking_budget is not None:
            budget = s.thinking_budget
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            if body["max_tokens"] <= budget:  # the answer needs room after the thinking
                body["max_tokens"] = budget + (s.max_tokens or self.max_tokens)
        elif s.temperature is not None:
            body["temperature"] = s.temperature
        body.update(s.extra)

    def _with_output(
        self, body: dict[str, Any], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> dict[str, Any]:
        """``body`` with the output tool: the answer must be a call to it (or to a tool)."""
        out = s.output
        assert out is not None
        body["tools"] = [
            *(
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters or {"type": "object", "properties": {}},
                }
                for t in tools
                if t.name != OUTPUT_TOOL
            ),
            {
                "name": OUTPUT_TOOL,
                "description": (out.description or f"The final answer, a {out.name}.")
                + " Call this tool to give your final answer.",
                "input_schema": out.schema,
            },
        ]
        real = len(body["tools"]) > 1
        if s.thinking_budget is not None:
            # The API forces no tool while thinking: the model is asked, not forced, and an
            # answer that is not a call is corrected by the loop like any invalid answer.
            body["tool_choice"] = {"type": "auto"}
        else:
            body["tool_choice"] = {"type": "any"} if real else {"type": "tool", "name": OUTPUT_TOOL}
        self._sampling(body, s)
        return body

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        stream = await self.client.messages.create(**self._request(messages, tools, s))
        read = _Reading(model=self.model, output_tool=OUTPUT_TOOL if s.output else None)
        async with stream:
            async for event in sdk_events(stream, self.name):
                with malformed_chunk(self.name, event):
                    part = read.event(event)
                if part is not None:
                    yield part
        if not read.finished:
            raise ModelUnavailable(f"{self.name}: the stream ended before message_stop")
        with malformed_chunk(self.name, read):  # names, ids, reasons of the wrong type
            response = read.response(self.name)
        yield response

    def _status(self, exc: Any, kind: str) -> int:
        if exc.status_code < 400:  # an ``error`` event inside a 200 stream
            return {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}.get(
                kind, 400
            )
        return int(exc.status_code)


@dataclass(slots=True)
class _Reading:
    """What the events of one streamed answer have said so far."""

    model: str
    blocks: dict[int, _Block] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0  # parts of input_tokens, priced apart (loom.pricing)
    cache_write: int = 0
    stop: str | None = None
    finished: bool = False
    output_tool: str | None = None  # the forced output tool's name, when there is one

    def event(self, event: Any) -> TextDelta | ReasoningDelta | None:
        """Take in one event; return its new text or thinking (tool input JSON and thinking
        signatures are assembled, not shown)."""
        kind = event.type
        if kind == "message_start":
            self.model = event.message.model or self.model
            self.input_tokens = _tokens_in(event.message.usage)
            u = event.message.usage
            self.cache_read = int(getattr(u, "cache_read_input_tokens", None) or 0)
            self.cache_write = int(getattr(u, "cache_creation_input_tokens", None) or 0)
            self.output_tokens = event.message.usage.output_tokens or 0
        elif kind == "content_block_start":
            cb = event.content_block
            name = getattr(cb, "name", "") or ""
            kind = "output" if cb.type == "tool_use" and name == self.output_tool else cb.type
            started = self.blocks[event.index] = _Block(kind, getattr(cb, "id", None), name)
            if kind == "thinking":  # its text and signature usually arrive as deltas
                started.parts.append(_string(cb.thinking or "", "thinking"))
                started.signature.append(_string(cb.signature or "", "signature"))
            elif kind == "redacted_thinking":
                started.data = _string(cb.data, "redacted_thinking data")
        elif kind == "content_block_delta":
            block = self.blocks.get(event.index)
            d = event.delta
            if block is None:
                return None
            if d.type == "text_delta":
                block.parts.append(_string(d.text, "text_delta text"))
                return TextDelta(d.text)
            if d.type == "thinking_delta":
                block.parts.append(_string(d.thinking, "thinking_delta thinking"))
                return ReasoningDelta(d.thinking) if d.thinking else None
            if d.type == "signature_delta":
                block.signature.append(_string(d.signature, "signature_delta signature"))
            if d.type == "input_json_delta":
                block.parts.append(_string(d.partial_json, "input_json_delta partial_json"))
                if block.kind == "output":  # the typed answer, streamed as its JSON text
                    return TextDelta(d.partial_json)
        elif kind == "message_delta":
            self.stop = event.delta.stop_reason or self.stop
            if event.usage is not None:
                self.output_tokens = event.usage.output_tokens or self.output_tokens
        elif kind == "message_stop":
            self.finished = True
        return None

    def response(self, name: str) -> ModelResponse:
        """The whole answer, once ``message_stop`` has arrived."""
        ordered = [b for _, b in sorted(self.blocks.items())]
        text = "".join("".join(b.parts) for b in ordered if b.kind == "text")
        calls = [
            ToolCall.from_json(b.name, "".join(b.parts), id=b.id)
            for b in ordered
            if b.kind == "tool_use"
        ]
        finish = _STOP.get(self.stop or "", self.stop)
        outputs = [b for b in ordered if b.kind == "output"]
        if outputs and not calls:  # the answer: the output tool's input, as JSON text
            text, finish = "".join(outputs[0].parts) or "{}", "stop"
        # (called together with real tools it is dropped: the model answers after their results)
        if not text and not calls and self.stop is None:
            raise ModelResponseError(f"{name} returned no content")
        reasoning = [
            Reasoning(provider="anthropic", text="".join(b.parts), signature="".join(b.signature))
            if b.kind == "thinking"
            else Reasoning(provider="anthropic", encrypted=b.data)
            for b in ordered
            if b.kind in ("thinking", "redacted_thinking")
        ]
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                requests=1,
                cache_read_tokens=self.cache_read,
                cache_write_tokens=self.cache_write,
            ),
            finish_reason=finish,
            model=self.model,
            parts=list(reasoning),
        )


def _string(value: Any, what: str) -> str:
    """``value``, checked: a server's field of the wrong type is a malformed event."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not a string")
    return value


def _tokens_in(usage: Any) -> int:
    # Cached prompt tokens are reported apart from the rest; all of them were read.
    return int(
        (usage.input_tokens or 0)
        + (getattr(usage, "cache_creation_input_tokens", None) or 0)
        + (getattr(usage, "cache_read_input_tokens", None) or 0)
    )


def from_spec(rest: str) -> AnthropicModel:
    """``anthropic:<model>`` with ``ANTHROPIC_API_KEY``."""
    return AnthropicModel(rest.strip())
