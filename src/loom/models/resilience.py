"""Retries, a circuit breaker and per-call timeouts for remote model providers.

Providers wrap one streaming attempt in :func:`resilient_stream`. It retries (with ``tenacity``)
an attempt that failed *before its first delta* (429, 5xx, timeouts, lost connections) with
exponential backoff and full jitter, honouring ``Retry-After``; it never retries after output
has streamed, so a user never sees text twice and the loop never stores a half answer (it
stores only the final ``ModelResponse``). Each retry is announced as a
:class:`~loom.models.base.RetryNotice`, which the loop turns into an ``LLM_RETRY`` event.

A :class:`CircuitBreaker` per provider endpoint (tenacity has none; this one is small and
thread-safe) opens after ``failure_threshold`` consecutive failures: calls then fail at once
with ``ModelUnavailable`` until ``reset_timeout`` has passed, when one probe call is let
through (half-open); its success closes the breaker again.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from loom.errors import (
    ContextTooLong,
    ModelAuthError,
    ModelError,
    ModelRateLimited,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailable,
)
from loom.models.base import RetryNotice, StreamPart

if TYPE_CHECKING:
    from tenacity import RetryCallState
    from tenacity.wait import wait_base

__all__ = [
    "CircuitBreaker",
    "Failure",
    "RetryPolicy",
    "breaker_for",
    "classify_status",
    "parse_retry_after",
    "resilient_stream",
]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to wait before retrying a failed model call.

    The n-th retry waits a random time in ``[0, min(max_delay, initial_delay * multiplier**n)]``
    ("full jitter"), or the server's ``Retry-After`` when it sent one (capped at
    ``max_retry_after``).
    """

    max_retries: int = 3
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 20.0
    max_retry_after: float = 60.0
    jitter: bool = True

    def backoff(self) -> wait_base:
        """This policy's backoff as a tenacity wait strategy (without ``Retry-After``)."""
        import tenacity

        kind = tenacity.wait_random_exponential if self.jitter else tenacity.wait_exponential
        return kind(multiplier=self.initial_delay, max=self.max_delay, exp_base=self.multiplier)

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after))
        import tenacity

        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = retry + 1  # tenacity counts attempts from 1
        return float(self.backoff()(state))


NO_RETRY = RetryPolicy(max_retries=0)


@dataclass(slots=True)
class Failure:
    """A provider failure, classified: the typed error, whether to retry, the server's hint."""

    error: ModelError
    retryable: bool = False
    retry_after: float | None = None
    counts_for_breaker: bool = False


BreakerState = Literal["closed", "open", "half_open"]


@dataclass(slots=True)
class CircuitBreaker:
    """Stops calling an endpoint that keeps failing, then probes it after a cool-down.

    Thread-safe: one breaker may be shared by agents running on several event loops.
    """

    name: str = "model"
    failure_threshold: int = 5
    reset_timeout: float = 30.0
    failures: int = 0
    state: BreakerState = "closed"
    opened_at: float = 0.0
    _probing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def before_call(self) -> None:
        """Raise ``ModelUnavailable`` if the circuit is open (or a probe is already out)."""
        with self._lock:
            if self.state == "closed":
                return
            waited = time.monotonic() - self.opened_at
            if self.state == "open" and waited >= self.reset_timeout:
                self.state = "half_open"
            if self.state == "half_open" and not self._probing:
                self._probing = True
                return
            left = max(0.0, self.reset_timeout - waited)
            raise ModelUnavailable(
                f"circuit breaker for {self.name} is open after {self.failures} consecutive "
                f"failures; not calling it for another {left:.1f} s. Check that the server is "
                "up, or use another model."
            )

    def record_success(self) -> None:
        with self._lock:
            self.failures, self.state, self._probing = 0, "closed", False

    def record_failure(self) -> None:
        with self._lock:
            self.failures += 1
            if self.state == "half_open" or self.failures >= self.failure_threshold:
                self.state, self.opened_at = "open", time.monotonic()
            self._probing = False

    def release_probe(self) -> None:
        """Give the probe slot back when a probe ended without telling us anything."""
        with self._lock:
            self._probing = False


_BREAKERS: dict[str, CircuitBreaker] = {}
_BREAKERS_LOCK = threading.Lock()


def breaker_for(
    endpoint: str, failure_threshold: int = 5, reset_timeout: float = 30.0
) -> CircuitBreaker:
    """The process-wide breaker for one provider endpoint (created on first use)."""
    with _BREAKERS_LOCK:
        found = _BREAKERS.get(endpoint)
        if found is None:
            found = _BREAKERS[endpoint] = CircuitBreaker(endpoint, failure_threshold, reset_timeout)
        return found


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from a ``Retry-After`` (or ``retry-after-ms``) header, if any."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


_CONTEXT_WORDS = (
    "context length",
    "context_length",
    "maximum context",
    "too long",
    "too many tokens",
)


def classify_status(
    status: int,
    message: str,
    headers: Mapping[str, str] | None,
    *,
    provider: str,
    key_var: str | None,
) -> Failure:
    """Map an HTTP status from a provider to a typed, classified failure."""
    where = f"{provider} answered {status}: {message}"
    if status in (401, 403):
        hint = f"; check {key_var}" if key_var else ""
        return Failure(ModelAuthError(f"{where}{hint}"))
    if status == 429:
        return Failure(
            ModelRateLimited(f"{where}; rate limited, slow down or raise your quota"),
            retryable=True,
            retry_after=parse_retry_after(headers),
        )
    if status in (408, 409) or status >= 500:
        return Failure(
            ModelUnavailable(where), True, parse_retry_after(headers), counts_for_breaker=True
        )
    lowered = message.lower()
    if status in (400, 413) and any(w in lowered for w in _CONTEXT_WORDS):
        return Failure(ContextTooLong(f"{where}; shorten the conversation or use a larger model"))
    if status == 404:
        return Failure(ModelRequestError(f"{where}; check the model name and the base URL"))
    return Failure(ModelRequestError(f"{where}; the request was rejected, retrying cannot help"))


def connection_failure(provider: str, exc: BaseException, *, timed_out: bool = False) -> Failure:
    what = "timed out" if timed_out else "could not be reached"
    return Failure(
        ModelUnavailable(f"{provider} {what}: {type(exc).__name__}: {exc}"),
        retryable=True,
        counts_for_breaker=True,
    )


async def resilient_stream(
    attempt: Callable[[], AsyncIterator[StreamPart]],
    classify: Callable[[BaseException], Failure | None],
    *,
    policy: RetryPolicy,
    breaker: CircuitBreaker | None,
    timeout: float | None,  # noqa: ASYNC109 - per attempt, applied around each await
    provider: str,
) -> AsyncIterator[StreamPart]:
    """Run ``attempt()`` with retries before the first part, the breaker, and a per-call timeout.

    ``classify`` turns an exception raised by an attempt into a :class:`Failure`; ``None`` means
    "not a provider failure" and the exception propagates untouched (a bug, a cancellation).
    ``timeout`` bounds each attempt from its start to its last part.

    tenacity decides whether to retry, how long to wait and when to stop. Its sleep is a no-op
    because the wait must be announced (a :class:`RetryNotice`) before it is slept, and a
    notice can only be yielded from here, not from inside tenacity.
    """
    import tenacity

    backoff = _Backoff(policy)
    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(_Transient),
        stop=tenacity.stop_after_attempt(policy.max_retries + 1),
        wait=backoff,
        sleep=_announce_first,
        reraise=True,
    )
    transient: _Transient | None = None
    gave_up: _Transient | None = None
    try:
        async for round_ in retrying:
            if transient is not None:  # the previous attempt failed and tenacity said retry
                number = round_.retry_state.attempt_number - 1
                error = transient.failure.error
                yield RetryNotice(number, backoff.last, f"{type(error).__name__}: {error}")
                await asyncio.sleep(backoff.last)
            transient = None
            try:
                # Parts are yielded outside tenacity's attempt block: it would swallow a
                # GeneratorExit or CancelledError thrown in at a yield. aclosing: a caller that
                # stops early closes the provider's stream now, not at garbage collection.
                one = _attempt_once(attempt, classify, breaker, timeout, provider)
                async with contextlib.aclosing(one) as parts:
                    async for part in parts:
                        yield part
            except _Transient as exc:
                transient = exc
            with round_:
                if transient is not None:
                    raise transient
    except _Transient as exc:  # tenacity stopped: retries are used up
        gave_up = exc
    if gave_up is not None:  # raised outside the handler, so no _Transient in its context
        error, cause = _exhausted(gave_up.failure.error, policy.max_retries), gave_up.__cause__
        if error is cause:
            raise error
        raise error from cause


class _Transient(Exception):
    """An attempt failed before its first part with a failure worth retrying."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure.error))
        self.failure = failure


class _Backoff:
    """tenacity's wait strategy for a policy, remembering the last wait for the notice."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.wait = policy.backoff()
        self.last = 0.0

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        hint = exc.failure.retry_after if isinstance(exc, _Transient) else None
        if hint is not None:  # the server said when: Retry-After wins over the backoff
            self.last = self.policy.delay(0, hint)
        else:
            self.last = float(self.wait(state))
        return self.last


async def _announce_first(_seconds: float) -> None:
    """tenacity's sleep: none; the stream yields its notice, then sleeps itself."""


async def _attempt_once(
    attempt: Callable[[], AsyncIterator[StreamPart]],
    classify: Callable[[BaseException], Failure | None],
    breaker: CircuitBreaker | None,
    timeout: float | None,  # noqa: ASYNC109 - per attempt, applied around each await
    provider: str,
) -> AsyncGenerator[StreamPart, None]:
    """One attempt: its parts, or a typed error, or ``_Transient`` if nothing had streamed."""
    if breaker is not None:
        breaker.before_call()
    started = False
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    stream = attempt()
    try:
        while True:
            try:
                # The timeout wraps only the wait for the next part, never a yield, so it
                # cannot fire while the caller is busy with a part we handed it.
                async with asyncio.timeout_at(deadline):
                    part = await anext(stream)
            except StopAsyncIteration:
                break
            started = True
            yield part
    except (Exception, asyncio.CancelledError) as exc:
        failure = _failure_of(exc, classify, provider, timeout)
        if failure is None:
            if breaker is not None:
                breaker.release_probe()
            raise
        if breaker is not None and failure.counts_for_breaker:
            breaker.record_failure()
        elif breaker is not None:
            breaker.release_probe()
        if started:  # never retried: the caller has already seen output
            raise _cut_off(failure.error, provider) from exc
        if failure.retryable:
            raise _Transient(failure) from exc
        if failure.error is exc:
            raise
        raise failure.error from exc
    finally:
        await _close(stream)
    if breaker is not None:
        breaker.record_success()


def _failure_of(
    exc: BaseException,
    classify: Callable[[BaseException], Failure | None],
    provider: str,
    timeout: float | None,
) -> Failure | None:
    if isinstance(exc, asyncio.CancelledError):
        return None
    if isinstance(exc, TimeoutError):
        return Failure(
            ModelUnavailable(f"{provider} did not finish within the {timeout:g} s call timeout"),
            retryable=True,
            counts_for_breaker=True,
        )
    if isinstance(exc, ModelUnavailable):  # raised by an attempt: transient by definition
        return Failure(exc, retryable=True, counts_for_breaker=True)
    if isinstance(exc, ModelError):
        return Failure(exc)
    return classify(exc)


def _cut_off(error: ModelError, provider: str) -> ModelError:
    kind = ModelUnavailable if isinstance(error, ModelUnavailable) else ModelResponseError
    return kind(
        f"the {provider} stream broke after output had started ({error}); the partial answer "
        "was discarded and not retried, so nothing is shown or stored twice"
    )


def _exhausted(error: ModelError, retries: int) -> ModelError:
    if retries == 0:
        return error
    return type(error)(f"{error} (gave up after {retries} retries)")


async def _close(stream: AsyncIterator[StreamPart]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):  # closing a broken stream must not hide the error
            await aclose()
