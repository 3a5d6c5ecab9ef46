"""OpenTelemetry traces and metrics for Loom runs, with the GenAI semantic conventions.

``OtelObserver`` is a ``Runtime`` observer: it turns the events every run emits into spans,
so the loop carries no tracing code. One run gives::

    invoke_agent {agent}        INTERNAL  AGENT_START … AGENT_FINISH
    ├── chat {model}            CLIENT    LLM_START … LLM_COMPLETE (one per model call)
    ├── execute_tool {tool}     INTERNAL  TOOL_EXECUTION_START … TOOL_RESULT / TOOL_ERROR
    └── chat {model}            CLIENT    summariser and judge calls (``models.base.complete``)

Attributes: ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` /
``output_tokens`` / ``cache_read.input_tokens`` / ``cache_creation.input_tokens``,
``gen_ai.conversation.id`` (the session id), ``gen_ai.agent.name``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``error.type``; Loom's own under ``loom.*`` (run id, stop reason,
cost in US dollars). Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.tool.call.arguments`` / ``result``) only when opted in (``capture_content=True`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``), always passed through a redactor
(``loom.guardrails.redact`` by default). Metrics: ``gen_ai.client.operation.duration`` (s) and
``gen_ai.client.token.usage`` per model call.

Where a run's span hangs: a run that carries on a dead attempt (a worker's retry) continues its
trace (the W3C ``traceparent`` is kept in the attempt's ``AGENT_START`` event and the new span
is its child); a sub-run whose parent run this observer traces is that span's child; otherwise
the current OpenTelemetry context is the parent, which is the hook for crews: run the members
inside :meth:`OtelObserver.workflow` (an ``invoke_workflow {crew}`` span made current), or in
another process attach the crew's context (``context_from_traceparent``) around the member run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from loom import events as ev
from loom.messages import ModelResponse
from loom.models.base import CALL_WATCHER, CallWatcher, Model

__all__ = ["OtelObserver", "context_from_traceparent", "emit_eval_span", "traceparent_of"]

log = logging.getLogger("loom.observability")

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_PROPAGATOR = TraceContextTextMapPropagator()
_FAILED = frozenset(
    {
        "error",
        "model_error",
        "timeout",
        "cancelled",
        "guardrail",
        "output_invalid",
        "cost_limit",
        "loop",
    }
)
# the semantic conventions' advised buckets for gen_ai.client.operation.duration (seconds)
_DURATION_BUCKETS = [
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
]
_TOKEN_BUCKETS = [
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
]


def _ns(ts: float) -> int:
    return int(ts * 1e9)


def split_model(name: str) -> tuple[str, str]:
    """``openai:gpt-4o`` → ("openai", "gpt-4o"); a name without a provider → ("loom", name)."""
    provider, sep, model = name.partition(":")
    if not sep:
        return ("loom", name) if name != "local" else ("local", name)
    return provider, model


def traceparent_of(span: trace.Span) -> str | None:
    """The W3C ``traceparent`` of ``span``, or None for a no-op span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def context_from_traceparent(traceparent: str) -> otel_context.Context:
    """An OpenTelemetry context whose parent is the span a W3C ``traceparent`` names."""
    return _PROPAGATOR.extract({"traceparent": traceparent})


def _error_type(error: str | None, fallback: str) -> str:
    """``"ModelUnavailable: ..."`` → ``ModelUnavailable``; else the fallback (a stop reason)."""
    head = (error or "").partition(":")[0]
    return head if head.isidentifier() else fallback


@dataclass(slots=True)
class _Run:
    span: trace.Span
    agent: str
    provider: str
    model: str
    session_id: str
    ctx: otel_context.Context  # the run span's context: the parent of its children
    chat_attrs: dict[str, Any]  # a chat span's starting attributes (the same every call)
    recording: bool = True  # False: no SDK, or sampled out; children would be dropped too
    chat_started: float | None = None  # the model call under way (LLM_START's time)
    retries: list[tuple[dict[str, Any], float]] | None = None  # its provider retries
    tools: dict[str, tuple[float, str, Any]] = field(default_factory=dict)  # id: start, name, args
    watcher: Token[CallWatcher | None] | None = None


class OtelObserver:
    """A ``Runtime`` observer that records runs as OpenTelemetry spans and metrics.

    Args:
        tracer_provider: Where spans go; default the global one (``trace.set_tracer_provider``,
            or what ``loom.observability.configure`` set up). Without the SDK: no-op.
        meter_provider: Where the metrics go; default the global one.
        capture_content: Record message, argument and result text on spans; default from
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true`` / ``1``).
        redact: Applied to every captured text; default ``loom.guardrails.redact`` (emails,
            card numbers, keys, ...).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        capture_content: bool | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.tracer = trace.get_tracer("loom", tracer_provider=tracer_provider)
        meter = metrics.get_meter("loom", meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Measures number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.cache_breaks = meter.create_counter(
            "loom.prompt_cache.breaks",
            unit="{break}",
            description="Requests whose cached prompt prefix differs from the session's previous "
            "request (loom.expected=false: a cache bust, no reason Loom knows)",
        )
        if capture_content is None:
            capture_content = os.environ.get(CAPTURE_ENV, "").strip().lower() in ("true", "1")
        self.capture = capture_content
        if redact is None:
            from loom.guardrails import redact as default_redact

            redact = default_redact
        self.redact = redact
        self.runs: dict[str, _Run] = {}
        E = ev.EventType
        self._on: dict[Any, Callable[[Any], None]] = {
            E.AGENT_START: self._agent_start,
            E.LLM_START: self._llm_start,
            E.LLM_RETRY: self._llm_retry,
            E.CACHE_BUST: self._cache_bust,
            E.LLM_COMPLETE: self._llm_complete,
            E.TOOL_EXECUTION_START: self._tool_start,
            E.TOOL_RESULT: self._tool_end,
            E.TOOL_ERROR: self._tool_end,
            E.AGENT_FINISH: self._agent_finish,
        }

    # -- the runtime's hooks ------------------------------------------------------------------
    def __call__(self, event: ev.AgentEvent) -> None:
        """The observer: one dict lookup for the events it does not trace."""
        handler = self._on.get(event.type)
        if handler is not None:
            try:
                handler(event)
            except Exception:  # tracing must never break a run
                log.exception("loom tracing failed on a %s event", event.type)

    def start_run(
        self,
        *,
        run_id: str,
        session_id: str,
        agent: str,
        model: str,
        parent_run_id: str | None = None,
        carried: str | None = None,
    ) -> dict[str, str]:
        """Start the run's ``invoke_agent`` span (called by the turn at INTAKE, before its
        ``AGENT_START`` commit); returns ``{"traceparent": ...}`` for that event, so a later
        attempt of the run (``carried``) joins the trace. Never raises: tracing must never
        break a run."""
        if run_id in self.runs:
            return {}
        try:
            return self._start(run_id, session_id, agent, model, parent_run_id, carried)
        except Exception:
            log.exception("loom tracing failed to start run %s", run_id)
            return {}

    def _start(
        self,
        run_id: str,
        session_id: str,
        agent: str,
        model: str,
        parent_run_id: str | None,
        carried: str | None,
    ) -> dict[str, str]:
        if carried:
            parent: otel_context.Context | None = context_from_traceparent(carried)
        elif parent_run_id is not None and parent_run_id in self.runs:
            parent = self.runs[parent_run_id].ctx
        else:
            parent = None  # the current context: a crew's invoke_workflow span, a request's
        provider, model_name = split_model(model)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model_name,
            "gen_ai.conversation.id": session_id,
            "loom.run_id": run_id,
        }
        if parent_run_id is not None:
            attrs["loom.parent_run_id"] = parent_run_id
        if carried:
            attrs["loom.carried_on"] = True
        span = self.tracer.start_span(
            f"invoke_agent {agent}", context=parent, kind=SpanKind.INTERNAL, attributes=attrs
        )
        ctx = trace.set_span_in_context(span)
        chat_attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model_name,
            "gen_ai.conversation.id": session_id,
        }
        run = self.runs[run_id] = _Run(
            span, agent, provider, model_name, session_id, ctx, chat_attrs, span.is_recording()
        )
        run.watcher = CALL_WATCHER.set(_Watcher(self, run))
        tp = traceparent_of(span)
        return {"traceparent": tp} if tp else {}

    @contextmanager
    def workflow(
        self, crew: str, *, session_id: str | None = None, attributes: dict[str, Any] | None = None
    ) -> Iterator[trace.Span]:
        """An ``invoke_workflow {crew}`` span, current while the block runs: the member runs
        started inside it become its children (the hook for crews)."""
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": crew,
            **(attributes or {}),
        }
        if session_id is not None:
            attrs["gen_ai.conversation.id"] = session_id
        with self.tracer.start_as_current_span(
            f"invoke_workflow {crew}", kind=SpanKind.INTERNAL, attributes=attrs
        ) as span:
            yield span

    # -- events --------------------------------------------------------------------------------
    def _text(self, value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return self.redact(text)

    def _agent_start(self, e: ev.AgentStart) -> None:
        run = self.runs.get(e.run_id)
        if run is None:  # a turn that did not call start_run (another Runtime's loop)
            self.start_run(
                run_id=e.run_id,
                session_id=e.session_id,
                agent=e.agent or "agent",
                model=str(e.extra.get("model") or ""),
                parent_run_id=e.parent_run_id,
            )
            run = self.runs[e.run_id]
        if self.capture and e.message_text:
            run.span.set_attribute(
                "gen_ai.input.messages",
                self._text(
                    [{"role": "user", "parts": [{"type": "text", "content": e.message_text}]}]
                ),
            )

    def _chat_attrs(self, run: _Run, model: str) -> dict[str, Any]:
        provider, name = split_model(model)
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": name,
            "gen_ai.conversation.id": run.session_id,
        }

    # A chat or tool span is made whole when its operation ends (start time from the start
    # event): one attribute set at creation instead of many set_attribute calls, which is most
    # of what a span costs in the SDK. A leaf span has no children, so nothing waits for it.
    def _llm_start(self, e: ev.LlmStart) -> None:
        run = self.runs.get(e.run_id)
        if run is not None:
            run.chat_started = e.timestamp
            run.retries = None

    def _llm_retry(self, e: ev.LlmRetry) -> None:
        run = self.runs.get(e.run_id)
        if run is not None:
            retry = {"attempt": e.attempt, "delay": e.delay, "error": e.error}
            run.retries = [*(run.retries or ()), (retry, e.timestamp)]

    def _cache_bust(self, e: ev.CacheBust) -> None:
        run = self.runs.get(e.run_id)
        attrs: dict[str, Any] = {
            "loom.expected": bool(e.expected),
            "loom.cache.segment": e.segment,
            "loom.cache.reason": e.reason or "unknown",
        }
        if run is not None:
            attrs["gen_ai.agent.name"] = run.agent
        self.cache_breaks.add(1, attrs)

    def _chat_span(
        self, run: _Run, attrs: dict[str, Any], end: float, error: str | None = None
    ) -> None:
        if not run.recording:
            run.chat_started, run.retries = None, None
            return
        started = _ns(run.chat_started if run.chat_started is not None else end)
        span = self.tracer.start_span(
            f"chat {run.model}",
            context=run.ctx,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=started,
        )
        for retry, ts in run.retries or ():
            span.add_event("gen_ai.retry", retry, timestamp=_ns(ts))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))
        run.chat_started, run.retries = None, None

    def _llm_complete(self, e: ev.LlmComplete) -> None:
        run = self.runs.get(e.run_id)
        if run is None or run.chat_started is None:
            return
        attrs = dict(run.chat_attrs)
        if e.model:
            attrs["gen_ai.response.model"] = e.model
        if e.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [e.finish_reason]
        u = e.usage or {}
        attrs.update(_usage_attrs(u))
        if self.capture:
            parts: list[dict[str, Any]] = (
                [{"type": "text", "content": e.answer}] if e.answer else []
            )
            parts += [
                {
                    "type": "tool_call",
                    "id": c.get("id"),
                    "name": c.get("name"),
                    "arguments": c.get("arguments"),
                }
                for c in e.tool_calls
            ]
            attrs["gen_ai.output.messages"] = self._text(
                [{"role": "assistant", "parts": parts, "finish_reason": e.finish_reason}]
            )
        seconds = e.timestamp - run.chat_started
        self._chat_span(run, attrs, e.timestamp)
        self._measure(run, seconds, e.model, u, None)

    def _measure(
        self,
        run: _Run,
        seconds: float,
        response_model: str | None,
        usage: dict[str, Any],
        error: str | None,
        request: tuple[str, str] | None = None,
    ) -> None:
        provider, model = request or (run.provider, run.model)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
        }
        if response_model:
            attrs["gen_ai.response.model"] = response_model
        if error is not None:
            attrs["error.type"] = error
        self.duration.record(max(seconds, 0.0), attrs)
        if error is None:
            for kind in ("input", "output"):
                n = usage.get(f"{kind}_tokens")
                if isinstance(n, int):
                    self.tokens.record(n, {**attrs, "gen_ai.token.type": kind})

    def _tool_start(self, e: ev.ToolExecutionStart) -> None:
        run = self.runs.get(e.run_id)
        if run is not None:
            run.tools[e.tool_call_id] = (e.timestamp, e.tool_name, e.arguments)

    def _tool_span(
        self,
        run: _Run,
        name: str,
        call_id: str,
        started: float,
        end: float,
        extra: dict[str, Any],
        error: str | None = None,
    ) -> None:
        if not run.recording:
            return
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            **extra,
        }
        if error is not None:
            attrs["error.type"] = error
        span = self.tracer.start_span(
            f"execute_tool {name}",
            context=run.ctx,
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=_ns(started),
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))

    def _tool_end(self, e: ev.ToolResultEvent | ev.ToolErrorEvent) -> None:
        run = self.runs.get(e.run_id)
        if run is None:
            return
        began = run.tools.pop(e.tool_call_id, None)
        extra: dict[str, Any] = {}
        if began is None:  # a result without a run: denied, expired, interrupted, recovered
            started, arguments = e.timestamp, None
            extra["loom.tool.ran"] = False
        else:
            started, _, arguments = began
        if self.capture:
            if arguments is not None:
                extra["gen_ai.tool.call.arguments"] = self._text(arguments)
            extra["gen_ai.tool.call.result"] = self._text(e.content)
        error = None if e.success else (e.error_code or "tool_error")
        self._tool_span(run, e.tool_name, e.tool_call_id, started, e.timestamp, extra, error)

    def _agent_finish(self, e: ev.AgentFinish) -> None:
        run = self.runs.pop(e.run_id, None)
        if run is None:
            return
        failed = e.stop_reason in _FAILED
        error_type = _error_type(e.error, e.stop_reason) if failed else None
        end = _ns(e.timestamp)
        if run.chat_started is not None:  # the model call the run ended in (error, cancel)
            kind = error_type or e.stop_reason
            seconds = e.timestamp - run.chat_started
            self._chat_span(
                run, {**run.chat_attrs, "error.type": kind}, e.timestamp, e.error or e.stop_reason
            )
            self._measure(run, seconds, None, {}, kind)
        for call_id, (started, name, _) in run.tools.items():  # running when the run stopped
            self._tool_span(run, name, call_id, started, e.timestamp, {}, e.stop_reason)
        attrs: dict[str, Any] = {
            "loom.stop_reason": e.stop_reason,
            "loom.iterations": e.iterations,
            **_usage_attrs(e.usage),
        }
        if e.pending_approvals:
            attrs["loom.pending_approvals"] = len(e.pending_approvals)
        if self.capture and e.output:
            attrs["gen_ai.output.messages"] = self._text(
                [{"role": "assistant", "parts": [{"type": "text", "content": e.output}]}]
            )
        run.span.set_attributes(attrs)
        if error_type is not None:
            run.span.set_attribute("error.type", error_type)
            run.span.set_status(Status(StatusCode.ERROR, e.error or e.stop_reason))
        run.span.end(end_time=end)
        if run.watcher is not None:
            try:
                CALL_WATCHER.reset(run.watcher)
            except ValueError:  # set in another context (cannot happen in a turn): clear
                CALL_WATCHER.set(None)


def _usage_attrs(u: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, attr in (
        ("input_tokens", "gen_ai.usage.input_tokens"),
        ("output_tokens", "gen_ai.usage.output_tokens"),
        ("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens"),
        ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
    ):
        n = u.get(key)
        if isinstance(n, int) and (n or key in ("input_tokens", "output_tokens")):
            out[attr] = n
    cost = u.get("cost")
    if isinstance(cost, int | float):
        out["loom.cost.usd"] = float(cost)
    return out


class _Watcher:
    """Spans for the model calls a run makes through ``complete`` (summariser, judges)."""

    __slots__ = ("observer", "run")

    def __init__(self, observer: OtelObserver, run: _Run) -> None:
        self.observer, self.run = observer, run

    def started(self, model: Model) -> tuple[trace.Span, float, tuple[str, str]]:
        name = str(getattr(model, "name", type(model).__name__))
        provider, model_name = split_model(name)
        o, run = self.observer, self.run
        attrs = o._chat_attrs(run, name)
        span = o.tracer.start_span(
            f"chat {model_name}",
            context=run.ctx,
            kind=SpanKind.CLIENT,
            attributes=attrs,
        )
        return span, time.time(), (provider, model_name)

    def ended(
        self, token: Any, response: ModelResponse | None, error: BaseException | None
    ) -> None:
        span, started, request = token
        o = self.observer
        try:
            if response is not None:
                usage = response.usage.model_dump() if response.usage is not None else {}
                attrs = _usage_attrs(usage)
                if response.model:
                    attrs["gen_ai.response.model"] = response.model
                if response.finish_reason:
                    attrs["gen_ai.response.finish_reasons"] = [response.finish_reason]
                span.set_attributes(attrs)
                o._measure(self.run, time.time() - started, response.model, usage, None, request)
            else:
                kind = type(error).__name__
                span.set_attribute("error.type", kind)
                span.set_status(Status(StatusCode.ERROR, str(error)))
                o._measure(self.run, time.time() - started, None, {}, kind, request)
        finally:
            span.end()


def emit_eval_span(
    record: dict[str, Any],
    traceparent: str | None,
    *,
    tracer_provider: trace.TracerProvider | None = None,
) -> None:
    """Export one online evaluation (``loom.evals.online``) as a ``loom.eval`` span.

    The run's ``invoke_agent`` span ended with the run, before the background job scored it,
    and an ended span takes no attributes: the eval is a span of its own, in the run's trace
    (its parent is the run's span, named by the ``traceparent`` kept in the run's
    ``AGENT_START`` event) and linked to it. Attributes: ``loom.run_id``,
    ``gen_ai.conversation.id``, ``gen_ai.agent.name``, ``loom.eval.status`` (scored, errored,
    gave_up), ``loom.eval.score``, ``loom.eval.passed``, ``loom.eval.attempts``,
    ``loom.eval.<check>.score`` / ``.passed`` per evaluator, ``error.type`` when errored.
    Never raises: tracing must never break the job."""
    try:
        tracer = trace.get_tracer("loom", tracer_provider=tracer_provider)
        parent = context_from_traceparent(traceparent) if traceparent else None
        links = []
        if parent is not None:
            run_span = trace.get_current_span(parent).get_span_context()
            if run_span.is_valid:
                links.append(trace.Link(run_span, {"loom.link": "evaluated_run"}))
        attrs: dict[str, Any] = {
            "loom.run_id": str(record.get("run_id", "")),
            "gen_ai.conversation.id": str(record.get("session_id", "")),
            "gen_ai.agent.name": str(record.get("agent", "")),
            "loom.eval.status": str(record.get("status", "")),
            "loom.eval.attempts": int(record.get("attempts", 0)),
        }
        if record.get("score") is not None:
            attrs["loom.eval.score"] = float(record["score"])
        if record.get("passed") is not None:
            attrs["loom.eval.passed"] = bool(record["passed"])
        for check in record.get("checks") or []:
            name = str(check.get("name", "check"))
            attrs[f"loom.eval.{name}.passed"] = bool(check.get("passed"))
            if check.get("score") is not None:
                attrs[f"loom.eval.{name}.score"] = float(check["score"])
        span = tracer.start_span(
            "loom.eval", context=parent, kind=SpanKind.INTERNAL, attributes=attrs, links=links
        )
        if record.get("status") != "scored":
            span.set_attribute("error.type", "judge_unavailable")
            span.set_status(Status(StatusCode.ERROR, str(record.get("error") or "")))
        span.end()
    except Exception:
        log.exception("loom tracing failed on the eval of run %s", record.get("run_id"))
