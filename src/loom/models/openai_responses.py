"""OpenAI's Responses API as a model: ``openai-responses:<model>`` (``OPENAI_API_KEY``).

Why a second OpenAI provider: OpenAI's reasoning models keep their reasoning between calls
only through the Responses API. Each answer's reasoning items (their ``id`` and
``encrypted_content``, asked for with ``include=["reasoning.encrypted_content"]``) become
``loom.content.Reasoning(provider="openai")`` parts of the assistant message, and go back, as
they came, before that message's calls in every later request of the tool loop. Requests are
stateless (``store: false``): the journal is the conversation's record, not OpenAI's.

Media: images (``input_image``) and files (``input_file``) in user messages and in tool
results (a ``function_call_output`` may be a list of parts); the bytes go as data URLs, a URL
part as its URL.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.content import Image, Media, Reasoning
from loom.errors import ModelResponseError, ModelUnavailable, UnsupportedContent
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models._client import (
    DEFAULT_TIMEOUT,
    RemoteModel,
    import_sdk,
    malformed_chunk,
    read_api_key,
    sdk_events,
)
from loom.models._media import data_url
from loom.models.base import ModelSettings, ReasoningDelta, StreamPart, TextDelta
from loom.models.cache import openai_cache_fields
from loom.models.resilience import CircuitBreaker, RetryPolicy

__all__ = ["OpenAIResponsesModel", "from_spec", "to_responses_input"]

OPENAI_URL = "https://api.openai.com/v1"
PROVIDER = "openai"  # the provider name Reasoning parts carry: only OpenAI gets them back


def _url_or_data(part: Media) -> str:
    """The part as the API takes it: its URL, else its bytes as a ``data:`` URL."""
    return part.url if part.url is not None else data_url(part)


def _media_item(part: Media) -> dict[str, Any]:
    if isinstance(part, Image):
        item: dict[str, Any] = {"type": "input_image", "image_url": _url_or_data(part)}
        item["detail"] = part.detail or "auto"
        return item
    if part.kind == "file":
        if part.url is not None:
            return {"type": "input_file", "file_url": part.url}
        return {
            "type": "input_file",
            "filename": part.name or "file",
            "file_data": data_url(part),
        }
    raise UnsupportedContent(
        f"the Responses API takes no {part.kind} input ({part.label}); send it to "
        "'openai:gpt-4o-audio-preview' through chat completions",
        part=part.label,
    )


def _content(text: str, parts: Sequence[Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text else []
    items.extend(_media_item(p) for p in parts if isinstance(p, Media))
    return items


def to_responses_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The transcript as Responses input items, in order (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            for p in m.parts:
                if isinstance(p, Reasoning) and p.provider == PROVIDER and p.id:
                    item: dict[str, Any] = {
                        "type": "reasoning",
                        "id": p.id,
                        "summary": [{"type": "summary_text", "text": p.text}] if p.text else [],
                    }
                    if p.encrypted is not None:
                        item["encrypted_content"] = p.encrypted
                    out.append(item)
            if m.content:
                out.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": m.content}],
                    }
                )
            for c in m.tool_calls:
                arguments = c.raw_arguments if c.raw_arguments is not None else c.arguments
                out.append(
                    {
                        "type": "function_call",
                        "call_id": c.id,
                        "name": c.name,
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments, ensure_ascii=False),
                    }
                )
        elif m.role == "tool":
            media = [p for p in m.parts if isinstance(p, Media)]
            output: Any = _content(m.content, media) if media else m.content
            out.append(
                {"type": "function_call_output", "call_id": m.tool_call_id or "", "output": output}
            )
        elif m.role == "user":
            media = [p for p in m.parts if isinstance(p, Media)]
            content: Any = _content(m.content, media) if media else m.content
            out.append({"type": "message", "role": "user", "content": content})
        else:  # system: Loom's instructions and memory entries, in their place
            out.append({"type": "message", "role": "system", "content": m.content})
    return out


def _tool_choice(choice: str | None) -> Any:
    if choice in (None, "auto"):
        return None
    if choice in ("none", "required"):
        return choice
    return {"type": "function", "name": choice}


class OpenAIResponsesModel(RemoteModel):
    """A model behind OpenAI's Responses API, streamed (see the module docstring).

    Args:
        model: The model name (``gpt-5``, ``o4-mini``, ``gpt-4.1``, ...).
        api_key: The key; ``None`` reads ``OPENAI_API_KEY``.
        base_url: The API root; ``None`` reads ``OPENAI_BASE_URL``, then OpenAI's own.
        reasoning_effort: ``"minimal"``, ``"low"``, ``"medium"`` or ``"high"`` for a reasoning
            model (``None``: the model's default; ``ModelSettings.reasoning_effort`` overrides
            it per call). ``ModelSettings.extra`` may set any other request field.
        timeout, retry, breaker, http_client: as for ``OpenAIModel``.
    """

    client_class = "AsyncOpenAI"
    accepts_media = frozenset({"image", "file"})

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        reasoning_effort: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        http_client: Any = None,
    ) -> None:
        sdk = import_sdk("openai", "openai", "The OpenAI Responses provider")
        key = read_api_key(api_key, "OPENAI_API_KEY", provider="openai", required=True)
        super().__init__(
            model,
            sdk=sdk,
            provider="openai-responses",
            key=key,
            key_var="OPENAI_API_KEY",
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL,
            timeout=timeout,
            retry=retry,
            breaker=breaker,
            http_client=http_client,
        )
        self.reasoning_effort = reasoning_effort

    def __repr__(self) -> str:
        return f"OpenAIResponsesModel({self.model!r}, base_url={self.base_url!r})"

    def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> dict[str, Any]:
        """The request body for one call (public for tests and for logging)."""
        body: dict[str, Any] = {
            "model": self.model,
            "input": to_responses_input(messages),
            "stream": True,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ]
        choice = _tool_choice(s.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
        if s.temperature is not None:
            body["temperature"] = s.temperature
        if s.max_tokens is not None:
            body["max_output_tokens"] = s.max_tokens
        effort = s.reasoning_effort or self.reasoning_effort
        if effort is not None:
            body["reasoning"] = {"effort": effort, "summary": "auto"}
        if s.output is not None:
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": s.output.name,
                    "schema": s.output.schema,
                    "strict": False,
                }
            }
        openai_cache_fields(body, s, self.base_url)
        body.update(s.extra)
        return body

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        stream = await self.client.responses.create(**self.request(messages, tools, s))
        read = ResponsesReading()
        async with stream:
            async for event in sdk_events(stream, self.name):
                with malformed_chunk(self.name, event):
                    part = read.event(event)
                if part is not None:
                    yield part
        if read.status is None:
            raise ModelUnavailable(f"{self.name}: the stream ended before the answer was finished")
        with malformed_chunk(self.name, read):
            yield read.response(self.name, self.model)


@dataclass(slots=True)
class ResponsesReading:
    """What the events of one streamed response have said so far."""

    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    reasoning: list[Reasoning] = field(default_factory=list)
    usage: Usage | None = None
    status: str | None = None
    model: str | None = None

    def event(self, event: Any) -> TextDelta | ReasoningDelta | None:
        """Take in one event; return its new answer text or reasoning, if it has some."""
        kind = event.type
        if kind == "response.output_text.delta":
            delta = event.delta
            if not isinstance(delta, str):
                raise TypeError(f"output_text delta is {type(delta).__name__}, not a string")
            self.text.append(delta)
            return TextDelta(delta) if delta else None
        if kind == "response.reasoning_summary_text.delta":
            delta = event.delta
            if not isinstance(delta, str):
                raise TypeError(f"reasoning delta is {type(delta).__name__}, not a string")
            return ReasoningDelta(delta) if delta else None  # kept whole in the item's end
        if kind == "response.output_item.done":
            self._item(event.item)
        elif kind in ("response.completed", "response.incomplete"):
            self._finished(event.response)
        elif kind in ("response.failed", "error"):
            error = getattr(getattr(event, "response", None), "error", None) or event
            message = getattr(error, "message", None) or str(error)
            raise ModelResponseError(f"the Responses API failed the answer: {message}")
        return None

    def _item(self, item: Any) -> None:
        if item.type == "function_call":
            self.calls.append(ToolCall.from_json(item.name, item.arguments or "", id=item.call_id))
        elif item.type == "reasoning":
            summary = "\n\n".join(s.text for s in (item.summary or ()) if getattr(s, "text", ""))
            self.reasoning.append(
                Reasoning(
                    text=summary,
                    provider=PROVIDER,
                    id=item.id,
                    encrypted=getattr(item, "encrypted_content", None),
                )
            )

    def _finished(self, response: Any) -> None:
        self.status = response.status or "completed"
        self.model = response.model or self.model
        usage = response.usage
        if usage is not None:
            details = getattr(usage, "input_tokens_details", None)
            cached = getattr(details, "cached_tokens", 0) if details is not None else 0
            self.usage = Usage(
                input_tokens=usage.input_tokens or 0,
                output_tokens=usage.output_tokens or 0,
                requests=1,
                cache_read_tokens=cached if isinstance(cached, int) else 0,
            )

    def response(self, name: str, model: str) -> ModelResponse:
        """The whole answer, once the stream has finished."""
        if self.status == "incomplete":
            finish = "length"
        elif self.calls:
            finish = "tool_calls"
        else:
            finish = "stop"
        return ModelResponse(
            text="".join(self.text),
            tool_calls=self.calls,
            usage=self.usage or Usage(requests=1),
            finish_reason=finish,
            model=self.model or model,
            parts=list(self.reasoning),
        )


def from_spec(rest: str) -> OpenAIResponsesModel:
    """``openai-responses:<model>``: OpenAI's Responses API (or ``OPENAI_BASE_URL``)."""
    return OpenAIResponsesModel(rest.strip())
