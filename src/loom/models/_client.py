"""What the SDK-backed providers (OpenAI, Anthropic) share, written once.

- importing the SDK, with an install hint when its extra is missing;
- the API key and base URL, from arguments or the environment;
- one SDK client per event loop, with the SDK's own retries off;
- ``stream()``: every call runs through :func:`loom.models.resilience.resilient_stream`;
- mapping SDK and transport errors to typed Loom errors, and a server's malformed output
  (a stream event that is not JSON, a chunk of the wrong shape) to ``ModelResponseError``.

A provider subclasses :class:`RemoteModel` and writes only its request, its stream reading and,
if its API needs it, how an error status is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import os
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from loom.content import MEDIA_MODELS
from loom.errors import (
    ConfigurationError,
    MissingDependencyError,
    ModelAuthError,
    ModelRequestError,
    ModelResponseError,
)
from loom.messages import Message, ToolSpec
from loom.models._media import media_labels
from loom.models.base import ModelSettings, StreamPart
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
    "DEFAULT_TIMEOUT",
    "RemoteModel",
    "error_of",
    "import_sdk",
    "malformed_chunk",
    "read_api_key",
    "sdk_events",
]

DEFAULT_TIMEOUT = 120.0

# What reading a chunk of the wrong shape raises: a field of the wrong type or missing.
_SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError, ValueError)


def import_sdk(module: str, extra: str, what: str) -> Any:
    """The SDK module, or ``MissingDependencyError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(module, extra, what) from None


def read_api_key(
    explicit: str | None, var: str, *, provider: str, required: bool, hint: str = ""
) -> str:
    """The key given, else ``$var``; without one, ``ModelAuthError`` if ``required``, else a
    placeholder (the SDKs insist on a value; local servers ignore it)."""
    key = explicit or os.environ.get(var)
    if key:
        return key
    if required:
        raise ModelAuthError(
            f"the {provider} provider needs an API key: set the {var} environment variable{hint}"
        )
    return "not-needed"


async def sdk_events(stream: Any, name: str) -> AsyncIterator[Any]:
    """The SDK stream's events; a stream line the SDK cannot decode is ``ModelResponseError``.

    The SDKs ``json.loads`` each ``data:`` line and let ``JSONDecodeError`` (a ``ValueError``,
    like pydantic's ``ValidationError``) escape; garbage from a server is a bad answer, typed.
    """
    events = aiter(stream)
    while True:
        try:
            event = await anext(events)
        except StopAsyncIteration:
            return
        except ValueError as exc:
            raise ModelResponseError(
                f"{name} sent a stream event that is not valid JSON ({type(exc).__name__}: "
                f"{exc}); the server is not speaking the API correctly"
            ) from exc
        yield event


@contextlib.contextmanager
def malformed_chunk(name: str, event: Any) -> Iterator[None]:
    """Reading one decoded event: a field of the wrong shape becomes ``ModelResponseError``."""
    try:
        yield
    except _SHAPE_ERRORS as exc:
        shown = repr(event)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ModelResponseError(
            f"{name} sent a stream event Loom cannot read ({type(exc).__name__}: {exc}): {shown}"
        ) from exc


class RemoteModel:
    """Base of the providers behind an official SDK: client wiring, resilience, error mapping.

    Subclasses set ``client_class`` (the SDK's async client) and ``key_hint`` and implement
    ``_attempt`` (one streamed call).
    """

    client_class = ""

    def __init__(
        self,
        model: str,
        *,
        sdk: Any,
        provider: str,
        key: str,
        key_var: str | None,
        base_url: str,
        timeout: float | None,
        retry: RetryPolicy | None,
        breaker: CircuitBreaker | None,
        http_client: Any,
    ) -> None:
        if not model:
            raise ConfigurationError(f"{provider}: the model name is empty")
        self.model = model
        self.provider = provider
        self.name = f"{provider}:{model}"
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or breaker_for(f"{provider}:{self.base_url}")
        self.where = f"{provider} ({self.base_url})"
        self._sdk = sdk
        self._key = key
        self._key_var = key_var  # named in an auth error's hint
        self._http_client = http_client
        # httpx connections belong to the event loop that opened them, and each run_sync()
        # has its own loop: keep one SDK client per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def client(self) -> Any:
        """The SDK's async client for the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = getattr(self._sdk, self.client_class)(
                api_key=self._key,
                base_url=self.base_url,
                max_retries=0,  # resilience.py retries, before the first delta only
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
        media = media_labels(messages)
        return resilient_stream(
            lambda: self._attempt(messages, tools, s),
            functools.partial(self._classify_with_media, media) if media else self._classify,
            policy=self.retry,
            breaker=self.breaker,
            timeout=s.timeout if s.timeout is not None else self.timeout,
            provider=self.where,
        )

    def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings
    ) -> AsyncIterator[StreamPart]:
        raise NotImplementedError

    def _status(self, exc: Any, kind: str) -> int:
        """The HTTP status to classify ``exc`` by (a provider may map error events)."""
        return int(exc.status_code)

    def _classify_with_media(self, media: list[str], exc: BaseException) -> Failure | None:
        """A refused request that held media names them: a server that cannot read an image
        (or a file, or audio) answers with an error of its own wording."""
        failure = self._classify(exc)
        if failure is None or type(failure.error) is not ModelRequestError:
            return failure
        if getattr(exc, "status_code", None) not in (400, 415, 422):  # a 404 is the URL's
            return failure
        held = ", ".join(media[:5]) + (f" and {len(media) - 5} more" if len(media) > 5 else "")
        error = ModelRequestError(
            f"{failure.error}. The request held {held}: if {self.name} cannot read that "
            f"input, send it to a model that does ({MEDIA_MODELS}), or send text"
        )
        return dataclasses.replace(failure, error=error)

    def _classify(self, exc: BaseException) -> Failure | None:
        sdk, where = self._sdk, self.where
        if isinstance(exc, sdk.APIStatusError):
            kind, message = error_of(exc)
            return classify_status(
                self._status(exc, kind),
                message,
                exc.response.headers,
                provider=where,
                key_var=self._key_var,
            )
        if isinstance(exc, sdk.APITimeoutError):
            return connection_failure(where, exc, timed_out=True)
        if isinstance(exc, sdk.APIError):  # connection lost, or an error event in the stream
            return connection_failure(where, exc)
        return _transport_failure(where, exc)


def error_of(exc: Any) -> tuple[str, str]:
    """(error type, message) from an SDK error's JSON body, else its message."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner.get("type", "")), str(inner["message"])
        if isinstance(inner, str):
            return "", inner
    return "", str(getattr(exc, "message", exc))


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
