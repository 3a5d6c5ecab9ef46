"""Persist before you announce: the bookkeeping under every turn.

``TurnSteps`` is the shared base of ``loop.Turn``. It numbers a run's events, journals them,
commits each step (messages, ledger rows, run records) together with the events that describe
it before those events reach the caller, records seed 003's state changes, and calls hooks.
Events that are not steps (``ITERATION_START``, ``LLM_DELTA``, …) go out at once; all but the
deltas are journaled with the next commit. Keeping this here leaves ``loop.py`` with the state
machine alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from loom.errors import HookError
from loom.events import AgentEvent, EventType
from loom.hooks import Deny, HookContext, ReplaceArguments, RequireApproval
from loom.messages import Message, ToolCall, ToolResult
from loom.store.base import LedgerEntry, LedgerStatus, RunRecord
from loom.tools.executor import error_result

if TYPE_CHECKING:
    from loom.agent import Agent

__all__ = ["AgentState", "TurnSteps"]

E = EventType


class AgentState(StrEnum):
    """Seed 003's states; each change is a ``STATE_CHANGE`` event."""

    WAITING_FOR_USER_INPUT = "waiting_for_user_input"
    CALLING_LLM = "calling_llm"
    PROCESSING_LLM_RESPONSE = "processing_llm_response"
    EXECUTING_TOOLS = "executing_tools"
    POST_TOOLS_HOOK = "post_tools_hook"
    ERROR = "error"
    SHUTTING_DOWN = "shutting_down"


class _Ready:
    """An awaitable that is already done: skipping hook points nobody uses costs ~nothing."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[None, None, Any]:
        return self.value
        yield  # pragma: no cover - makes this a generator


_NO_HOOK_RESULTS: Any = _Ready(())


class TurnSteps:
    """Events, journal, commits, state and hooks of one run (see the module docstring)."""

    def __init__(self, agent: Agent, session_id: str, run_id: str) -> None:
        self.agent, self.session_id, self.run_id = agent, session_id, run_id
        self.iteration = 0
        self.state = AgentState.WAITING_FOR_USER_INPUT
        self.history: list[Message] = []  # the session's transcript as persisted
        self.new_messages: list[Message] = []  # what this run added to it
        self.hctx = HookContext(agent, run_id, session_id)
        self._emit: Callable[[AgentEvent], None] = lambda e: None
        self._seq = 0
        self._journal: list[AgentEvent] = []
        self.tool_calls_made = 0
        self._open: dict[str, LedgerEntry] = {}  # tool calls started, not ended
        self._unanswered: dict[str, ToolCall] = {}  # in a stored assistant message, no result

    def _event(self, type: EventType, data: dict[str, Any]) -> AgentEvent:
        ev = AgentEvent(type, self.run_id, self.session_id, self.iteration, self._seq, data)
        self._seq += 1
        return ev

    def _announce(self, type: EventType, **data: Any) -> None:
        """Send an event that is not a step (journaled with the next commit; deltas never)."""
        ev = self._event(type, data)
        if type is not E.LLM_DELTA:
            self._journal.append(ev)
        self._emit(ev)

    async def _commit(
        self,
        events: Sequence[AgentEvent],
        *,
        messages: Sequence[Message] = (),
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
    ) -> None:
        """Commit a step with its events, then send the events."""
        journal, self._journal = [*self._journal, *events], []
        await self.agent.store.append(
            self.session_id, messages=messages, events=journal, ledger=ledger, run=run
        )
        self.history.extend(messages)
        self.new_messages.extend(messages)
        for ev in events:
            self._emit(ev)

    def _set_state(self, state: AgentState) -> None:
        if state is not self.state:
            # ``_value_`` is the plain str ``.value`` returns, without enum's descriptor lookup
            self._announce(E.STATE_CHANGE, **{"from": self.state._value_, "to": state._value_})
            self.state = self.hctx.state = state

    def _hook(self, point: str, *args: Any) -> Awaitable[list[Any]]:
        hooks = self.agent._hooks.get(point)
        return self._run_hooks(point, hooks, args) if hooks else _NO_HOOK_RESULTS

    async def _run_hooks(self, point: str, hooks: Any, args: tuple[Any, ...]) -> list[Any]:
        return [await self._call_hook(point, h, *args) for h in hooks]

    async def _call_hook(self, point: str, hook: tuple[Any, bool], *args: Any) -> Any:
        fn, fatal = hook
        try:
            return await fn(self.hctx, *args)
        except Exception as exc:
            if fatal:
                raise HookError(f"hook {point} raised {type(exc).__name__}: {exc}") from exc
            self._announce(E.ERROR, error=f"non-fatal hook {point}: {exc}", fatal=False)
            return None

    async def _screen(
        self, index: int, call: ToolCall
    ) -> tuple[ToolCall | None, ToolResult | None]:
        """Limits, hooks and approval for one call: (call to run, or None) and a refusal."""
        a = self.agent
        if self.tool_calls_made + index >= a.max_tool_calls:
            return None, error_result(call, "limit", "not run: the turn reached "
                                      f"max_tool_calls={a.max_tool_calls}")  # fmt: skip
        ask: RequireApproval | None = None
        for hook in a._hooks.get("before_tool_execution", ()):
            decision = await self._call_hook("before_tool_execution", hook, call)
            if isinstance(decision, Deny):
                return None, error_result(call, "denied", decision.reason)
            if isinstance(decision, ReplaceArguments):
                call = call.model_copy(update={"arguments": decision.arguments,
                                               "raw_arguments": None})  # fmt: skip
            ask = ask or (decision if isinstance(decision, RequireApproval) else None)
        if ask is None:
            return call, None
        # (None, None) means parked until a human decides (loom.policy.approval)
        return await a._approvals.request(self, call, ask.reason)  # type: ignore[arg-type]

    async def _start_calls(self, calls: Sequence[ToolCall]) -> None:
        """Ledger rows ``started`` for the calls, committed before any of them runs."""
        rows = [
            LedgerEntry(
                self.run_id, self.session_id, c.id, c.name, "started", c.arguments,
                self.agent.effect_of(c.name),
            )
            for c in calls
        ]  # fmt: skip
        self._open.update((r.tool_call_id, r) for r in rows)
        events = [
            self._event(
                E.TOOL_EXECUTION_START,
                {"tool_name": c.name, "tool_call_id": c.id, "arguments": c.arguments},
            )
            for c in calls
        ]
        await self._commit(events, ledger=rows)

    async def _record_result(
        self, call: ToolCall, result: ToolResult, started: bool = True
    ) -> ToolResult:
        """Commit a call's result (message + ledger end) and announce it."""
        # Shape first, so the ledger keeps what the model saw (full errors and large results
        # live in their own tables).
        result = await self.agent._process_result(self, call, result)  # type: ignore[arg-type]
        ledger = []
        entry = self._open.pop(call.id, None) if started else None
        if entry is not None:
            status: LedgerStatus = "completed" if result.success else "failed"
            if result.error_code == "interrupted":
                status = "interrupted"
            ledger.append(entry.ended(status, result))
        content = result.to_content()
        ev = self._event(
            E.TOOL_RESULT if result.success else E.TOOL_ERROR,
            {
                "tool_name": call.name, "tool_call_id": call.id, "success": result.success,
                "content": content, "error_code": result.error_code,
                "duration_ms": result.duration_ms,
            },
        )  # fmt: skip
        await self._commit([ev], messages=[Message.tool(result, content)], ledger=ledger)
        self._unanswered.pop(call.id, None)
        await self._hook("after_tool_execution", call, result)
        return result
