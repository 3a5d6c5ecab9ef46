"""The typed event stream every run produces.

Every event is an instance of one class per ``EventType`` (``AgentStart``, ``ToolResultEvent``,
…), all subclasses of ``AgentEvent``. They share an envelope (``run_id``, ``session_id``,
``parent_run_id`` for crews, ``iteration``, ``sequence``, ``timestamp``) and carry typed payload
fields; payload keys the class does not declare are kept in ``extra`` so nothing is lost.
``event.data`` gives the payload as a plain dict (the form the README's event table documents),
``to_dict()`` / ``from_dict()`` are the stable JSON form (``schema_version`` 1) the store, the
CLI's ``--json`` and the server use, and ``EVENT_ADAPTER`` validates that form with pydantic
and produces its JSON schema.

Why dataclasses and not pydantic models: a step emits a dozen events, and a validated pydantic
model costs ~5 µs to build against ~0.7 µs for a slotted dataclass (measured with pydantic
2.13); pydantic validates them at the edges (``from_dict(validate=True)``, ``EVENT_ADAPTER``),
where input comes from outside.

Names follow seed 002. Seed 004 names the events its loop must emit; they map one to one:

| seed 004       | Loom EventType                                 |
| -------------- | ---------------------------------------------- |
| ``loop:start``   | ``AGENT_START``                              |
| ``loop:context`` | ``CONTEXT_ASSEMBLY_COMPLETE`` (token_estimate) |
| ``loop:execute`` | ``LLM_START`` (tool_count)                   |
| ``tool:start``   | ``TOOL_EXECUTION_START``                     |
| ``tool:end``     | ``TOOL_RESULT`` or ``TOOL_ERROR``            |
| ``stream:delta`` | ``LLM_DELTA``                                |
| ``loop:persist`` | ``PERSIST_START``                            |
| ``loop:end``     | ``AGENT_FINISH``                             |
| ``loop:error``   | ``ERROR``                                    |

Seed 003's state machine shows up as ``STATE_CHANGE`` events whose ``data`` holds
``{"from": ..., "to": ...}`` with :class:`loom.AgentState` values.

Eight event types put a message into the session's transcript (``AgentEvent.message()``):
``USER_MESSAGE``, ``LLM_COMPLETE``, ``TOOL_RESULT``, ``TOOL_ERROR``, ``JUDGE_RETRY`` (the judges'
correction), ``OUTPUT_RETRY`` (the validation errors of an answer that did not fit the
agent's ``output_type``), ``QUERY_ANSWER`` (a client's answer to a server query) and
``MEMORY_RECORD`` (a summary or a MEMORY.md flush marker). The transcript is
exactly ``loom.engine.journal.transcript(events)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from loom.messages import Message

__all__ = ["EVENT_CLASSES", "SCHEMA_VERSION", "AgentEvent", "EventType", "make_event"]

SCHEMA_VERSION = 1
"""Version of the JSON form (``AgentEvent.to_dict``); bumped on any incompatible change."""


class EventType(StrEnum):
    AGENT_START = "agent_start"
    USER_MESSAGE = "user_message"
    ITERATION_START = "iteration_start"
    STATE_CHANGE = "state_change"
    CONTEXT_ASSEMBLY_START = "context_assembly_start"
    CONTEXT_COMPONENT_INCLUDED = "context_component_included"
    CONTEXT_COMPONENT_TRUNCATED = "context_component_truncated"
    CONTEXT_COMPONENT_EXCLUDED = "context_component_excluded"
    CONTEXT_ASSEMBLY_COMPLETE = "context_assembly_complete"
    COMPRESSION_START = "compression_start"
    COMPRESSION_PROGRESS = "compression_progress"
    COMPRESSION_FALLBACK = "compression_fallback"
    COMPRESSION_COMPLETE = "compression_complete"
    MEMORY_FLUSH = "memory_flush"
    CACHE_BUST = "cache_bust"
    MEMORY_RECORD = "memory_record"
    PATTERNS_MATCHED = "patterns_matched"
    BUDGET_WARNING = "budget_warning"
    LLM_START = "llm_start"
    LLM_DELTA = "llm_delta"
    LLM_REASONING_DELTA = "llm_reasoning_delta"
    LLM_TOOL_CALLS = "llm_tool_calls"
    LLM_COMPLETE = "llm_complete"
    LLM_RETRY = "llm_retry"
    TOOL_EXECUTION_START = "tool_execution_start"
    TOOL_RESULT = "tool_result"
    TOOL_ERROR = "tool_error"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DECISION = "approval_decision"
    RECURSION = "recursion"
    JUDGE_START = "judge_start"
    JUDGE_RESULT = "judge_result"
    JUDGE_RETRY = "judge_retry"
    OUTPUT_PARTIAL = "output_partial"
    OUTPUT_RETRY = "output_retry"
    SERVER_QUERY = "server_query"
    QUERY_ANSWER = "query_answer"
    RUN_RECOVERED = "run_recovered"
    SESSION_BRANCH = "session_branch"
    GUARDRAIL = "guardrail"
    WARNING = "warning"
    PERSIST_START = "persist_start"
    AGENT_FINISH = "agent_finish"
    ERROR = "error"
    CREW_MEMBER_START = "crew_member_start"
    CREW_MEMBER_FINISH = "crew_member_finish"


E = EventType


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass(slots=True, kw_only=True)
class AgentEvent:
    """One thing that happened in a run: the envelope every event type shares.

    ``sequence`` is monotonic within a run (starting at 0); ``timestamp`` is wall-clock seconds
    since the epoch; ``parent_run_id`` names the run that started this one (crews).
    """

    type: Any  # each subclass narrows it to its own Literal (the discriminator)
    run_id: str
    session_id: str
    iteration: int = 0
    sequence: int = 0
    timestamp: float = field(default_factory=time.time)
    parent_run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # payload field name -> key in ``data`` when they differ ("from" is a keyword)
    KEYS: ClassVar[dict[str, str]] = {}
    PAYLOAD: ClassVar[tuple[str, ...]] = ()
    # the payload fields' values and ``extra``, as one tuple in ``PAYLOAD`` order (one C call)
    ROW: ClassVar[Callable[[Any], tuple[Any, ...]]] = staticmethod(lambda ev: (ev.extra,))

    @property
    def data(self) -> dict[str, Any]:
        """The payload as a plain dict: declared fields plus ``extra``."""
        keys = self.KEYS
        out = {keys.get(n, n): getattr(self, n) for n in self.PAYLOAD}
        if self.extra:
            out.update(self.extra)
        return out

    @property
    def text(self) -> str:
        """The text delta of an ``LLM_DELTA`` event, empty for every other type."""
        return ""

    def message(self) -> Message | None:
        """The transcript message this event adds, or None (most events add none)."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (``schema_version`` 1); content parts in their JSON form (a
        media part's reference, never its bytes)."""
        data = self.data
        parts = data.get("parts")
        if parts and not all(type(p) is dict for p in parts):
            data["parts"] = [
                p if type(p) is dict else p.model_dump(mode="json", exclude_none=True)
                for p in parts
            ]
        return {
            "schema_version": SCHEMA_VERSION,
            "type": str(self.type),
            "run_id": self.run_id,
            "session_id": self.session_id,
            "parent_run_id": self.parent_run_id,
            "iteration": self.iteration,
            "sequence": self.sequence,
            "timestamp": self.timestamp,
            "data": data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, validate: bool = False) -> AgentEvent:
        """The event ``to_dict`` wrote; ``validate=True`` checks the payload's types with
        pydantic (for input from outside). An unknown type name (a newer Loom) is kept as an
        ``UnknownEvent`` rather than dropped."""
        event = make_event(
            d["type"],
            d["run_id"],
            d["session_id"],
            d.get("iteration", 0),
            d["sequence"],
            d.get("data") or {},
            timestamp=d.get("timestamp"),
            parent_run_id=d.get("parent_run_id"),
        )
        if validate and not isinstance(event, UnknownEvent):
            adapter: TypeAdapter[Any] = _adapter_for(type(event))
            adapter.validate_python(
                {f.name: getattr(event, f.name) for f in fields(event)}, strict=False
            )
        return event


def _payload(cls: type[AgentEvent]) -> type[AgentEvent]:
    base = {f.name for f in fields(AgentEvent)}
    cls.PAYLOAD = tuple(f.name for f in fields(cls) if f.name not in base)
    if cls.PAYLOAD:  # two names or more: attrgetter returns a tuple
        cls.ROW = staticmethod(attrgetter(*cls.PAYLOAD, "extra"))
    return cls


def _tool_message(ev: Any) -> Message:
    from loom.messages import Message

    meta = dict(ev.metadata)
    if not ev.success:
        meta.update(success=False, error_code=ev.error_code)
    if type(ev.content) is not str or type(ev.tool_call_id) is not str:  # not an event of ours
        return Message(
            role="tool",
            content=ev.content,
            tool_call_id=ev.tool_call_id,
            name=ev.tool_name,
            timestamp=_at(ev.timestamp),
            metadata=meta,
            parts=ev.parts,
        )
    return Message.trusted(  # typed fields of an event (the engine's, or read back)
        role="tool",
        content=ev.content,
        tool_calls=[],
        tool_call_id=ev.tool_call_id,
        name=ev.tool_name if type(ev.tool_name) is str else str(ev.tool_name),
        timestamp=_at(ev.timestamp),
        metadata=meta,
        parts=parts_of(ev.parts),
    )


def parts_of(parts: list[Any]) -> list[Any]:
    """An event's ``parts`` as ``loom.content`` parts: the engine's own objects as they are
    (media keep their bytes until stored), a stored event's dicts validated."""
    if not parts:
        return []
    if all(not isinstance(p, dict) for p in parts):
        return list(parts)
    adapter = _parts_adapter()
    return [adapter.validate_python(p) if isinstance(p, dict) else p for p in parts]


_PARTS_ADAPTER: list[TypeAdapter[Any]] = []


def _parts_adapter() -> TypeAdapter[Any]:
    if not _PARTS_ADAPTER:  # built on first use: pydantic's TypeAdapter is imported lazily
        from pydantic import TypeAdapter

        from loom.content import Part

        _PARTS_ADAPTER.append(TypeAdapter(Part))
    return _PARTS_ADAPTER[0]


@_payload
@dataclass(slots=True, kw_only=True)
class AgentStart(AgentEvent):
    type: Literal[E.AGENT_START] = E.AGENT_START
    message_text: str = ""
    agent: str = ""
    resume: bool = False
    KEYS: ClassVar[dict[str, str]] = {"message_text": "message"}


@_payload
@dataclass(slots=True, kw_only=True)
class UserMessage(AgentEvent):
    """The user's message entered the transcript (after INTAKE closed what was left open)."""

    type: Literal[E.USER_MESSAGE] = E.USER_MESSAGE
    content: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    parts: list[Any] = field(default_factory=list)
    """The message's images, files and audio (``loom.content``; stored as references)."""

    def message(self) -> Message:
        from loom.messages import Message

        return Message(
            role="user",
            content=self.content,
            timestamp=_at(self.timestamp),
            metadata=dict(self.metadata),
            parts=parts_of(self.parts),
        )


@_payload
@dataclass(slots=True, kw_only=True)
class IterationStart(AgentEvent):
    type: Literal[E.ITERATION_START] = E.ITERATION_START


@_payload
@dataclass(slots=True, kw_only=True)
class StateChange(AgentEvent):
    type: Literal[E.STATE_CHANGE] = E.STATE_CHANGE
    from_state: str = ""
    to_state: str = ""
    KEYS: ClassVar[dict[str, str]] = {"from_state": "from", "to_state": "to"}


@_payload
@dataclass(slots=True, kw_only=True)
class ContextAssemblyStart(AgentEvent):
    type: Literal[E.CONTEXT_ASSEMBLY_START] = E.CONTEXT_ASSEMBLY_START


@dataclass(slots=True, kw_only=True)
class _Component(AgentEvent):
    component: str = ""
    priority: int = 0
    tokens: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class ContextComponentIncluded(_Component):
    type: Literal[E.CONTEXT_COMPONENT_INCLUDED] = E.CONTEXT_COMPONENT_INCLUDED


@_payload
@dataclass(slots=True, kw_only=True)
class ContextComponentTruncated(_Component):
    type: Literal[E.CONTEXT_COMPONENT_TRUNCATED] = E.CONTEXT_COMPONENT_TRUNCATED


@_payload
@dataclass(slots=True, kw_only=True)
class ContextComponentExcluded(_Component):
    type: Literal[E.CONTEXT_COMPONENT_EXCLUDED] = E.CONTEXT_COMPONENT_EXCLUDED


@_payload
@dataclass(slots=True, kw_only=True)
class ContextAssemblyComplete(AgentEvent):
    type: Literal[E.CONTEXT_ASSEMBLY_COMPLETE] = E.CONTEXT_ASSEMBLY_COMPLETE
    token_estimate: int = 0
    message_count: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class CompressionStart(AgentEvent):
    type: Literal[E.COMPRESSION_START] = E.COMPRESSION_START
    kind: str = ""
    covers_from: int = 0
    covers_through: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class CompressionProgress(AgentEvent):
    type: Literal[E.COMPRESSION_PROGRESS] = E.COMPRESSION_PROGRESS
    status: str = ""
    attempt: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class CompressionFallback(AgentEvent):
    type: Literal[E.COMPRESSION_FALLBACK] = E.COMPRESSION_FALLBACK
    fallback_method: str = ""
    reason: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class CompressionComplete(AgentEvent):
    type: Literal[E.COMPRESSION_COMPLETE] = E.COMPRESSION_COMPLETE
    kind: str = ""
    method: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class MemoryFlush(AgentEvent):
    type: Literal[E.MEMORY_FLUSH] = E.MEMORY_FLUSH
    status: str = ""
    notes: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class CacheBust(AgentEvent):
    """The context's cached prefix differs from the previous request's for the session
    (``loom.models.cache``): ``segment`` is the tier where it first differs (``system``,
    ``kernel``, ``summaries``, ``history``), ``reason`` why, when Loom knows (``compaction``,
    ``masking``, ``truncation``, ``memory_flush``, ``recall``, ``model_changed``,
    ``tools_changed``).
    ``expected=False`` (no known reason) is a warning: something outside Loom's budgeting
    rewrote what the provider had cached. ``extra`` has ``position`` (the first message that
    differs) and ``shared_messages`` / ``previous_messages``."""

    type: Literal[E.CACHE_BUST] = E.CACHE_BUST
    segment: str = ""
    reason: str | None = None
    expected: bool = False


@_payload
@dataclass(slots=True, kw_only=True)
class MemoryRecord(AgentEvent):
    """A message the memory stage adds to the transcript: a summary or a flush marker."""

    type: Literal[E.MEMORY_RECORD] = E.MEMORY_RECORD
    content: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def message(self) -> Message:
        from loom.messages import Message

        return Message(
            role="system",
            content=self.content,
            timestamp=_at(self.timestamp),
            metadata=dict(self.metadata),
        )


@_payload
@dataclass(slots=True, kw_only=True)
class PatternsMatched(AgentEvent):
    type: Literal[E.PATTERNS_MATCHED] = E.PATTERNS_MATCHED
    patterns: list[dict[str, Any]] = field(default_factory=list)
    library_version: int = 0
    library_size: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class BudgetWarning(AgentEvent):
    """A budget beyond the run (``loom.budgets``) crossed its ``warn_at``: once per bucket
    and window, in the run whose call crossed it."""

    type: Literal[E.BUDGET_WARNING] = E.BUDGET_WARNING
    scope: str = ""
    window: str = ""
    subject: str = ""
    window_start: str = ""
    kind: str = ""  # "cost" (US dollars) or "tokens"
    limit: float = 0.0
    spent: float = 0.0
    warn_at: float | None = None


@_payload
@dataclass(slots=True, kw_only=True)
class LlmStart(AgentEvent):
    type: Literal[E.LLM_START] = E.LLM_START
    tool_count: int = 0
    message_count: int = 0
    token_estimate: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class LlmDelta(AgentEvent):
    type: Literal[E.LLM_DELTA] = E.LLM_DELTA
    delta: str = ""
    KEYS: ClassVar[dict[str, str]] = {"delta": "text"}

    @property
    def text(self) -> str:
        return self.delta


@_payload
@dataclass(slots=True, kw_only=True)
class LlmReasoningDelta(AgentEvent):
    """A chunk of the model's reasoning as it streams (``data["text"]``), never part of the
    answer (``text`` stays empty): live only, never stored, like ``LLM_DELTA``. The whole
    reasoning is in the ``LLM_COMPLETE`` that follows (``parts``)."""

    type: Literal[E.LLM_REASONING_DELTA] = E.LLM_REASONING_DELTA
    delta: str = ""
    KEYS: ClassVar[dict[str, str]] = {"delta": "text"}


@_payload
@dataclass(slots=True, kw_only=True)
class LlmToolCalls(AgentEvent):
    type: Literal[E.LLM_TOOL_CALLS] = E.LLM_TOOL_CALLS
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@_payload
@dataclass(slots=True, kw_only=True)
class LlmComplete(AgentEvent):
    """The model's whole answer: its assistant message (text and tool calls)."""

    type: Literal[E.LLM_COMPLETE] = E.LLM_COMPLETE
    answer: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_count: int = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    model: str | None = None
    parts: list[Any] = field(default_factory=list)
    """The answer's reasoning (``loom.content.Reasoning``), kept to send back unchanged."""
    KEYS: ClassVar[dict[str, str]] = {"answer": "text"}

    def message(self) -> Message:
        from loom.messages import Message, ToolCall

        calls = [
            ToolCall.trusted(
                id=c["id"],
                name=c["name"],
                arguments=dict(c["arguments"]),
                raw_arguments=c["raw_arguments"],
            )
            if _is_call_dict(c)
            else ToolCall.model_validate(c)
            for c in self.tool_calls
        ]
        if type(self.answer) is not str:  # not an event of ours: validated
            return Message(
                role="assistant",
                content=self.answer,
                tool_calls=calls,
                timestamp=_at(self.timestamp),
                parts=self.parts,
            )
        return Message.trusted(
            role="assistant",
            content=self.answer,
            tool_calls=calls,
            tool_call_id=None,
            name=None,
            timestamp=_at(self.timestamp),
            metadata={},
            parts=parts_of(self.parts),
        )


def _is_call_dict(c: Any) -> bool:
    """``c`` is what ``ToolCall.model_dump`` writes (the engine's and the store's form), so it
    needs no validation; anything else is validated (and refused if it is no tool call)."""
    return (
        type(c) is dict
        and len(c) == 4
        and type(c.get("id")) is str
        and type(c.get("name")) is str
        and type(c.get("arguments")) is dict
        and (c.get("raw_arguments") is None or type(c["raw_arguments"]) is str)
    )


@_payload
@dataclass(slots=True, kw_only=True)
class LlmRetry(AgentEvent):
    type: Literal[E.LLM_RETRY] = E.LLM_RETRY
    attempt: int = 0
    delay: float = 0.0
    error: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class ToolExecutionStart(AgentEvent):
    type: Literal[E.TOOL_EXECUTION_START] = E.TOOL_EXECUTION_START
    tool_name: str = ""
    tool_call_id: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class _ToolEnd(AgentEvent):
    tool_name: str = ""
    tool_call_id: str = ""
    success: bool = True
    content: str = ""
    error_code: str | None = None
    duration_ms: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    parts: list[Any] = field(default_factory=list)
    """Media the tool returned (``loom.content``; stored as references)."""

    def message(self) -> Message:
        return _tool_message(self)


@_payload
@dataclass(slots=True, kw_only=True)
class ToolResultEvent(_ToolEnd):
    type: Literal[E.TOOL_RESULT] = E.TOOL_RESULT


@_payload
@dataclass(slots=True, kw_only=True)
class ToolErrorEvent(_ToolEnd):
    type: Literal[E.TOOL_ERROR] = E.TOOL_ERROR
    success: bool = False


@_payload
@dataclass(slots=True, kw_only=True)
class ApprovalRequired(AgentEvent):
    type: Literal[E.APPROVAL_REQUIRED] = E.APPROVAL_REQUIRED
    tool_call_id: str = ""
    tool_name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class ApprovalDecisionEvent(AgentEvent):
    type: Literal[E.APPROVAL_DECISION] = E.APPROVAL_DECISION
    tool_call_id: str = ""
    tool_name: str = ""
    decision: str = ""  # approve | reject | edit | expired
    decided_by: str = ""  # handler | resume | new_message


@_payload
@dataclass(slots=True, kw_only=True)
class Recursion(AgentEvent):
    type: Literal[E.RECURSION] = E.RECURSION
    next_iteration: int = 0


@_payload
@dataclass(slots=True, kw_only=True)
class JudgeStart(AgentEvent):
    type: Literal[E.JUDGE_START] = E.JUDGE_START
    attempt: int = 0
    answer: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class JudgeResult(AgentEvent):
    type: Literal[E.JUDGE_RESULT] = E.JUDGE_RESULT
    score: float = 0.0
    passed: bool = False
    final: bool = False


@_payload
@dataclass(slots=True, kw_only=True)
class JudgeRetry(AgentEvent):
    """A failing verdict: the correction the model reads next (a user-role message)."""

    type: Literal[E.JUDGE_RETRY] = E.JUDGE_RETRY
    attempt: int = 0
    next_attempt: int = 0
    score: float = 0.0
    threshold: float = 0.0
    correction: str = ""

    def message(self) -> Message:
        from loom.messages import Message

        meta = {
            "judge_correction": True,
            "attempt": self.attempt,
            "score": self.score,
            "threshold": self.threshold,
        }
        return Message(
            role="user", content=self.correction, timestamp=_at(self.timestamp), metadata=meta
        )


@_payload
@dataclass(slots=True, kw_only=True)
class ServerQueryEvent(AgentEvent):
    """The model's answer asked the client for something; the run waits for the answer."""

    type: Literal[E.SERVER_QUERY] = E.SERVER_QUERY
    query_id: str = ""
    kind: str = ""
    question: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # the pattern's named parts
    KEYS: ClassVar[dict[str, str]] = {"details": "data"}


@_payload
@dataclass(slots=True, kw_only=True)
class QueryAnswer(AgentEvent):
    """The client's answer to a server query: a message the model reads next."""

    type: Literal[E.QUERY_ANSWER] = E.QUERY_ANSWER
    query_id: str = ""
    kind: str = ""
    content: str = ""

    def message(self) -> Message:
        from loom.messages import Message

        return Message(
            role="user",
            content=self.content,
            timestamp=_at(self.timestamp),
            metadata={"server_query": self.query_id, "kind": self.kind},
        )


@_payload
@dataclass(slots=True, kw_only=True)
class RunRecovered(AgentEvent):
    """A run that died (its process was killed) was closed by this one."""

    type: Literal[E.RUN_RECOVERED] = E.RUN_RECOVERED
    recovered_run_id: str = ""
    stop_reason: str = "crashed"


@_payload
@dataclass(slots=True, kw_only=True)
class GuardrailEvent(AgentEvent):
    """A guardrail's decision (``loom.guardrails``): ``action`` is pass, fix (``replacement``
    holds the new value), trip (the run stops with ``stop_reason="guardrail"``) or warn (a
    non-fatal guardrail raised; ``error`` holds the exception)."""

    type: Literal[E.GUARDRAIL] = E.GUARDRAIL
    guardrail: str = ""
    kind: str = ""  # input | output | tool_call | tool_result
    action: str = ""
    reason: str = ""
    error: str | None = None
    tool_call_id: str | None = None
    replacement: Any = None


@_payload
@dataclass(slots=True, kw_only=True)
class Warning(AgentEvent):
    """Something the user should know that did not stop the run (a tool server failed, text
    was made representable, ...). Also in ``RunResult.warnings``."""

    type: Literal[E.WARNING] = E.WARNING
    warning: str = ""
    source: str = ""
    KEYS: ClassVar[dict[str, str]] = {"warning": "message"}


@_payload
@dataclass(slots=True, kw_only=True)
class PersistStart(AgentEvent):
    type: Literal[E.PERSIST_START] = E.PERSIST_START


@_payload
@dataclass(slots=True, kw_only=True)
class OutputPartial(AgentEvent):
    """A streamed typed answer that validates so far (``output`` as JSON data); never stored,
    like ``LLM_DELTA``. The complete value is ``RunResult.output``."""

    type: Literal[E.OUTPUT_PARTIAL] = E.OUTPUT_PARTIAL
    output: Any = None


@_payload
@dataclass(slots=True, kw_only=True)
class OutputRetry(AgentEvent):
    """A final answer did not fit the ``output_type``: the correction the model reads next (a
    user-role message listing the validation errors)."""

    type: Literal[E.OUTPUT_RETRY] = E.OUTPUT_RETRY
    attempt: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    correction: str = ""

    def message(self) -> Message:
        from loom.messages import Message

        return Message(
            role="user",
            content=self.correction,
            timestamp=_at(self.timestamp),
            metadata={"output_correction": True, "attempt": self.attempt},
        )


@_payload
@dataclass(slots=True, kw_only=True)
class AgentFinish(AgentEvent):
    type: Literal[E.AGENT_FINISH] = E.AGENT_FINISH
    stop_reason: str = ""
    output: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    iterations: int = 0
    error: str | None = None
    duration_ms: float = 0.0
    pending_approvals: list[dict[str, Any]] = field(default_factory=list)
    pending_query: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


@_payload
@dataclass(slots=True, kw_only=True)
class ErrorEvent(AgentEvent):
    type: Literal[E.ERROR] = E.ERROR
    error: str = ""
    fatal: bool = True


@_payload
@dataclass(slots=True, kw_only=True)
class CrewMemberStart(AgentEvent):
    """A crew started one member run (in the crew's session): where it runs and exactly what
    context it was handed (``context_policy`` and the ``context`` text sent)."""

    type: Literal[E.CREW_MEMBER_START] = E.CREW_MEMBER_START
    path: str = ""  # crew/research/writer
    member: str = ""
    key: str = ""  # the member run's identity within the crew run (resume skips finished keys)
    child_session_id: str = ""
    child_run_id: str = ""
    context_policy: str = ""
    context: str = ""


@_payload
@dataclass(slots=True, kw_only=True)
class CrewMemberFinish(AgentEvent):
    """A member run ended (or was reused from an earlier, interrupted run of the crew)."""

    type: Literal[E.CREW_MEMBER_FINISH] = E.CREW_MEMBER_FINISH
    path: str = ""
    member: str = ""
    key: str = ""
    child_session_id: str = ""
    child_run_id: str = ""
    stop_reason: str = ""
    output: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reused: bool = False


@_payload
@dataclass(slots=True, kw_only=True)
class SessionBranch(AgentEvent):
    """The session continues from another point (``loom.engine.branching``): the transcript
    keeps its first ``at`` messages, then ``restored`` (messages of an abandoned branch the
    point brings back, as stored), then the ``note`` of what the dropped turns did in the world
    (a system message; none when empty). The ``abandoned`` messages after ``at`` stay in the
    journal, outside the transcript. ``reason`` is ``"rewind"``, ``"regenerate"`` or
    ``"edit"``; ``point`` what was asked; ``effects`` the dropped calls with effects (tool,
    arguments, result, effect, tool_call_id)."""

    type: Literal[E.SESSION_BRANCH] = E.SESSION_BRANCH
    at: int = 0
    restored: list[dict[str, Any]] = field(default_factory=list)
    abandoned: int = 0
    reason: str = ""
    point: dict[str, Any] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def message(self) -> Message | None:
        """The note (what the transcript adds after its kept and restored messages)."""
        if not self.note:
            return None
        from loom.messages import Message

        return Message(
            role="system",
            content=self.note,
            timestamp=_at(self.timestamp),
            metadata={"branch_note": True},
        )

    def restored_messages(self) -> list[Message]:
        """``restored`` as messages."""
        from loom.messages import Message

        return [Message.model_validate(m) for m in self.restored]


@_payload
@dataclass(slots=True, kw_only=True)
class UnknownEvent(AgentEvent):
    """An event of a type this Loom does not know (written by a newer one); payload in extra."""

    type: str = ""


EVENT_CLASSES: dict[EventType, type[AgentEvent]] = {
    cls.__dataclass_fields__["type"].default: cls  # type: ignore[misc]
    for cls in (
        AgentStart,
        UserMessage,
        IterationStart,
        StateChange,
        ContextAssemblyStart,
        ContextComponentIncluded,
        ContextComponentTruncated,
        ContextComponentExcluded,
        ContextAssemblyComplete,
        CompressionStart,
        CompressionProgress,
        CompressionFallback,
        CompressionComplete,
        MemoryFlush,
        CacheBust,
        MemoryRecord,
        PatternsMatched,
        BudgetWarning,
        LlmStart,
        LlmDelta,
        LlmReasoningDelta,
        LlmToolCalls,
        LlmComplete,
        LlmRetry,
        ToolExecutionStart,
        ToolResultEvent,
        ToolErrorEvent,
        ApprovalRequired,
        ApprovalDecisionEvent,
        Recursion,
        JudgeStart,
        JudgeResult,
        JudgeRetry,
        OutputPartial,
        OutputRetry,
        ServerQueryEvent,
        QueryAnswer,
        RunRecovered,
        SessionBranch,
        GuardrailEvent,
        Warning,
        PersistStart,
        AgentFinish,
        ErrorEvent,
        CrewMemberStart,
        CrewMemberFinish,
    )
}
assert set(EVENT_CLASSES) == set(EventType), "every EventType needs its class"

# data key -> field name, per class (the inverse of KEYS), precomputed for make_event
_FIELDS: dict[type[AgentEvent], dict[str, str]] = {
    cls: {cls.KEYS.get(n, n): n for n in cls.PAYLOAD} for cls in EVENT_CLASSES.values()
}


def make_event(
    type: EventType | str,
    run_id: str,
    session_id: str,
    iteration: int,
    sequence: int,
    data: dict[str, Any] | None = None,
    *,
    timestamp: float | None = None,
    parent_run_id: str | None = None,
) -> AgentEvent:
    """Build the typed event for ``type`` from a payload dict (unknown keys go to ``extra``)."""
    try:
        kind = EventType(type)
    except ValueError:
        return UnknownEvent(
            type=str(type),
            run_id=run_id,
            session_id=session_id,
            iteration=iteration,
            sequence=sequence,
            extra=dict(data or {}),
            timestamp=time.time() if timestamp is None else timestamp,
            parent_run_id=parent_run_id,
        )
    cls = EVENT_CLASSES[kind]
    known = _FIELDS[cls]
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if data:
        for key, value in data.items():
            name = known.get(key)
            if name is None:
                extra[key] = value
            else:
                kwargs[name] = value
    if timestamp is not None:
        kwargs["timestamp"] = timestamp
    return cls(
        run_id=run_id,
        session_id=session_id,
        iteration=iteration,
        sequence=sequence,
        parent_run_id=parent_run_id,
        extra=extra,
        **kwargs,
    )


_ADAPTERS: dict[type[AgentEvent], Any] = {}


def _adapter_for(cls: type[AgentEvent]) -> Any:
    from pydantic import TypeAdapter

    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def event_adapter() -> TypeAdapter[Any]:
    """A pydantic ``TypeAdapter`` over the discriminated union of every event class (by
    ``type``): ``event_adapter().json_schema()`` documents the events' fields."""
    from typing import Union

    from pydantic import Field, TypeAdapter

    union: Any = Union[tuple(EVENT_CLASSES.values())]  # noqa: UP007
    annotated: Any = Annotated[union, Field(discriminator="type")]
    return TypeAdapter(annotated)
