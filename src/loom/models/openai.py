"""OpenAI and every OpenAI-compatible server (Ollama, vLLM, llama.cpp's server, LM Studio, ...).

Built on the official ``openai`` SDK, imported only when one of these models is created:

```python
Agent(model="openai:gpt-4o-mini")                              # needs OPENAI_API_KEY
Agent(model="ollama:qwen3:4b")                                 # http://localhost:11434/v1
Agent(model="openai-compatible:http://127.0.0.1:8000/v1#my-model")
```
The SDK's own retries are switched off: :mod:`loom.models.resilience` retries (before the first
delta only), keeps a circuit breaker per endpoint and bounds each call with a timeout.
"""

from __future__ import annotations

import asyncio
import json
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

__all__ = [
    "OpenAIModel",
    "from_compatible_spec",
    "from_ollama_spec",
    "from_spec",
    "to_openai_messages",
]

OPENAI_URL = "https://api.openai.com/v1"
OLLAMA_URL = "http://localhost:11434/v1"
DEFAULT_TIMEOUT = 120.0


def _sdk() -> Any:
    try:
        import openai
    except ImportError:
        raise MissingDependencyError("openai", "openai", "The OpenAI provider") from None
    return openai


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


class OpenAIModel:
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
    """

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
    ) -> None:
        openai = _sdk()
        if not model:
            raise ConfigurationError(f"{provider}: the model name is empty")
        key = api_key or os.environ.get(api_key_var)
        if not key:
            if require_key:
                raise ModelAuthError(
                    f"the {provider} provider needs an API key: set the {api_key_var} "
                    f"environment variable (or use 'ollama:<model>' / "
                    "'openai-compatible:<url>#<model>' for a local server)"
                )
            key = "not-needed"  # the SDK insists on a value; local servers ignore it
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL).rstrip("/")
        self.model = model
        self.provider = provider
        self.name = f"{provider}:{model}"
        self.api_key_var = api_key_var
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or breaker_for(f"{provider}:{self.base_url}")
        self._openai = openai
        self._key = key
        self._http_client = http_client
        # httpx connections belong to the event loop that opened them, and each run_sync()
        # has its own loop: keep one SDK client per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def client(self) -> Any:
        """The ``openai.AsyncOpenAI`` client for the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._openai.AsyncOpenAI(
                api_key=self._key,
                base_url=self.base_url,
                max_retries=0,
                timeout=self.timeout,
                http_client=self._http_client,
            )
        return client

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r})"

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        """Stream one answer; retried before the first delta on transient failures."""
        s = settings or ModelSettings()
        timeout = s.timeout if s.timeout is not None else self.timeout
        return resilient_stream(
            lambda: self._attempt(messages, tools, s),
            self._classify,
            policy=self.retry,
            breaker=self.breaker,
            timeout=timeout,
            provider=f"{self.provider} ({self.base_url})",
        )

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
        body.update(s.extra)
        return body

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        stream = await self.client.chat.completions.create(**self._request(messages, tools, s))
        text: list[str] = []
        calls: dict[int, _PendingCall] = {}
        usage: Usage | None = None
        finish: str | None = None
        model_name: str | None = None
        async with stream:
            async for chunk in stream:
                model_name = chunk.model or model_name
                if chunk.usage is not None:
                    usage = Usage(
                        input_tokens=chunk.usage.prompt_tokens or 0,
                        output_tokens=chunk.usage.completion_tokens or 0,
                        requests=1,
                    )
                for choice in chunk.choices or ():
                    if choice.finish_reason:
                        finish = choice.finish_reason
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        text.append(delta.content)
                        yield TextDelta(delta.content)
                    for tc in delta.tool_calls or ():
                        # Parallel calls interleave; each is keyed by its index.
                        pending = calls.setdefault(tc.index, _PendingCall())
                        fn = tc.function
                        name = fn.name if fn is not None and fn.name else None
                        args = fn.arguments if fn is not None and fn.arguments else ""
                        if tc.id:
                            pending.id = tc.id
                        if name and name != pending.name:
                            # OpenAI sends the name once; some servers repeat it in every
                            # chunk, and a few split it: append only what is new.
                            pending.name += name
                        elif name:
                            name = None
                        if args:
                            pending.arguments.append(args)
                        yield ToolCallDelta(tc.index, tc.id, name, args)
        if finish is None:
            # OpenAI-style servers always close a choice with a finish reason; a stream that
            # ends without one was cut off, however complete its text looks.
            raise ModelUnavailable(f"{self.name}: the stream ended before the answer was finished")
        tool_calls = []
        for index in sorted(calls):
            p = calls[index]
            if not p.name:
                raise ModelResponseError(f"{self.name} streamed a tool call without a name")
            tool_calls.append(ToolCall.from_json(p.name, "".join(p.arguments), id=p.id))
        yield ModelResponse(
            text="".join(text),
            tool_calls=tool_calls,
            usage=usage or Usage(requests=1),
            finish_reason=finish,
            model=model_name or self.model,
        )

    def _classify(self, exc: BaseException) -> Failure | None:
        sdk = self._openai
        where = f"{self.provider} ({self.base_url})"
        if isinstance(exc, sdk.APIStatusError):
            return classify_status(
                exc.status_code,
                _message(exc),
                exc.response.headers,
                provider=where,
                key_var=self.api_key_var if self.provider == "openai" else None,
            )
        if isinstance(exc, sdk.APITimeoutError):
            return connection_failure(where, exc, timed_out=True)
        if isinstance(exc, sdk.APIConnectionError):
            return connection_failure(where, exc)
        if isinstance(exc, sdk.APIError):  # an error event inside the stream
            return connection_failure(where, exc)
        return _transport_failure(where, exc)


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(getattr(exc, "message", exc))


def _transport_failure(where: str, exc: BaseException) -> Failure | None:
    """Low-level HTTP errors that escape the SDK while a stream is read."""
    try:
        import httpx2
    except ImportError:  # pragma: no cover - both SDKs depend on it
        return None
    if isinstance(exc, httpx2.TimeoutException):
        return connection_failure(where, exc, timed_out=True)
    if isinstance(exc, httpx2.TransportError):
        return connection_failure(where, exc)
    return None


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
