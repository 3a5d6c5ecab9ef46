"""The turn: INTAKE → CONTEXT → EXECUTE → PERSIST, driven by seed 003's state machine.

One ``Turn`` runs in its own task and hands its events to the caller through ``emit``. Each
iteration assembles the context, streams one model answer, and runs the answer's tool calls
concurrently; then it recurses (seed 002's ``tt``) until the model answers without tools or a
limit stops it. Every step is committed to the store before its event goes out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from loom.context import ContextRequest
from loom.errors import ConfigurationError, HookError, ModelAuthError, ModelError
from loom.errors import ModelResponseError
from loom.events import AgentEvent, EventType
from loom.hooks import Deny, HookContext, ReplaceArguments
from loom.messages import Message, ModelResponse, RunResult, StopReason, ToolCall, ToolResult
from loom.messages import Usage, new_id
from loom.models.base import TextDelta
from loom.store.base import LedgerEntry, RunRecord
from loom.tools.base import RunContext
from loom.tools.executor import error_result, execute_call
from loom import runtime

if TYPE_CHECKING:
    from loom.agent import Agent

__all__ = ["AgentState", "Turn"]

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


class _Stop(Exception):
    def __init__(self, reason: StopReason, error: str | None = None):
        self.reason, self.error = reason, error


class Turn:
    """One user message run to its answer. Create through ``Agent.stream`` / ``Agent.run``."""

    def __init__(self, agent: Agent, message: str, session_id: str, on_busy: str, deps: Any):
        self.agent, self.message, self.session_id, self.on_busy = agent, message, session_id, on_busy
        self.deps = deps
        self.run_id = new_id("run")
        self.state = AgentState.WAITING_FOR_USER_INPUT
        self.iteration = 0
        self.tool_calls_made = 0
        self.usage = Usage()
        self.history: list[Message] = []
        self.new_messages: list[Message] = []
        self.output = ""
        self.result: RunResult | None = None
        self.hctx = HookContext(agent, self.run_id, session_id)
        self.cancel_reason: str | None = None
        self._seq = 0
        self._journal: list[AgentEvent] = []
        self._open: dict[str, LedgerEntry] = {}  # started, not ended
        self._unanswered: dict[str, ToolCall] = {}  # in a stored assistant message, no result yet
        self._task: asyncio.Task[None] | None = None
        self._emit: Callable[[AgentEvent], None] = lambda e: None

    # -- events -------------------------------------------------------------------------------
    def _event(self, type: EventType, data: dict[str, Any]) -> AgentEvent:
        ev = AgentEvent(type, self.run_id, self.session_id, self.iteration, self._seq, data)
        self._seq += 1
        return ev

    def _announce(self, type: EventType, **data: Any) -> None:
        ev = self._event(type, data)
        if type is not E.LLM_DELTA:
            self._journal.append(ev)
        self._emit(ev)

    async def _commit(self, events: list[AgentEvent], *, messages: list[Message] = (),  # type: ignore[assignment]
                      ledger: list[LedgerEntry] = (), run: RunRecord | None = None) -> None:  # type: ignore[assignment]
        """Persist before you announce: the step and its events, then the events go out."""
        journal, self._journal = self._journal + events, []
        await self.agent.store.append(
            self.session_id, messages=messages, events=journal, ledger=ledger, run=run
        )
        self.history.extend(messages)
        self.new_messages.extend(messages)
        for ev in events:
            self._emit(ev)

    def _set_state(self, state: AgentState) -> None:
        if state is not self.state:
            self._announce(E.STATE_CHANGE, **{"from": self.state.value, "to": state.value})
            self.state = self.hctx.state = state  # type: ignore[assignment]

    async def _hook(self, point: str, *args: Any) -> list[Any]:
        out = []
        for fn, fatal in self.agent._hooks.get(point, ()):
            try:
                out.append(await fn(self.hctx, *args))
            except Exception as exc:
                if fatal:
                    raise HookError(f"hook {point} raised {type(exc).__name__}: {exc}") from exc
                self._announce(E.ERROR, error=f"non-fatal hook {point}: {exc}", fatal=False)
        return out

    # -- the turn -----------------------------------------------------------------------------
    async def run(self, emit: Callable[[AgentEvent], None]) -> None:
        self._emit, a = emit, self.agent
        self._task = asyncio.current_task()
        gate = await runtime.acquire(
            a.store, self.session_id, self.run_id, on_busy=self.on_busy,  # type: ignore[arg-type]
            interrupt=lambda: self.cancel("interrupted by a newer turn"),
            queue_timeout=a.queue_timeout, max_queue_depth=a.max_queue_depth, lock_ttl=a.lock_ttl,
        )
        started, stop, error = time.perf_counter(), "completed", None
        raise_after: BaseException | None = None
        try:
            await self._intake()
            async with asyncio.timeout(a.timeout):
                await self._iterate()
        except _Stop as s:
            stop, error = s.reason, s.error
        except TimeoutError:
            stop, error = "timeout", f"the turn ran past its {a.timeout:g} s timeout"
        except asyncio.CancelledError:
            stop, error = "cancelled", self.cancel_reason or "the caller stopped the run"
            if self.cancel_reason is None:  # the caller went away: clean up, then propagate
                raise_after = asyncio.CancelledError()
            else:
                self._task.uncancel()  # type: ignore[union-attr]
        except (ConfigurationError, ModelAuthError) as exc:
            stop, error, raise_after = "error", str(exc), exc
        except ModelError as exc:
            stop, error = "model_error", f"{type(exc).__name__}: {exc}"
        except HookError as exc:
            stop, error = "error", str(exc)
        except Exception as exc:
            stop, error, raise_after = "error", f"{type(exc).__name__}: {exc}", exc
        finally:
            try:
                await self._finish(stop, error, started)  # type: ignore[arg-type]
            finally:
                await runtime.release(a.store, gate, self.session_id, self.run_id)
        if raise_after is not None:
            raise raise_after

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Stop the turn at its next await; open tool calls get ``interrupted`` results."""
        if self._task is not None and not self._task.done() and self.cancel_reason is None:
            self.cancel_reason = reason
            self._task.cancel()

    async def _intake(self) -> None:
        a, store = self.agent, self.agent.store
        if await store.get_session(self.session_id) is None:
            await store.create_session(self.session_id, agent_name=a.name)
        await a._recover(self)
        self.history = await store.load_messages(self.session_id)
        self.hctx.messages = self.history
        start = self._event(E.AGENT_START, {"message": self.message, "agent": a.name})
        await self._commit([start], messages=[Message.user(self.message)],
                           run=RunRecord(self.run_id, self.session_id, "running"))

    async def _iterate(self) -> None:
        a = self.agent
        while True:
            self.iteration = self.hctx.iteration = self.iteration + 1
            await self._hook("before_iteration_start")
            self._announce(E.ITERATION_START)
            await self._hook("before_context_assembly")
            self._announce(E.CONTEXT_ASSEMBLY_START)
            ctx = await a.context_builder.build(ContextRequest(
                a, self.history, self.session_id, self.run_id, self.iteration, self.message))
            if ctx.persist:  # summaries / memory bookkeeping: committed with their events
                await self._commit([self._event(t, n) for t, n in ctx.notes],
                                   messages=ctx.persist)
            else:
                for note_type, note in ctx.notes:
                    self._announce(note_type, **note)
            await self._hook("after_context_assembly", ctx.messages)
            self._announce(E.CONTEXT_ASSEMBLY_COMPLETE, token_estimate=ctx.token_estimate,
                           message_count=len(ctx.messages))
            self._set_state(AgentState.CALLING_LLM)
            messages = ctx.messages
            for extra in await self._hook("before_llm_call", messages):
                if extra:
                    messages = [*messages, *extra]
            self._announce(E.LLM_START, tool_count=len(ctx.tools), message_count=len(messages),
                           token_estimate=ctx.token_estimate)
            response = await self._call_model(messages, ctx)
            self._set_state(AgentState.PROCESSING_LLM_RESPONSE)
            await self._hook("after_llm_response", response)
            if not response.tool_calls:
                self.output = response.text
                return
            self._set_state(AgentState.EXECUTING_TOOLS)
            results = await self._run_tools(response.tool_calls)
            self._set_state(AgentState.POST_TOOLS_HOOK)
            await self._hook("post_tools", results)
            if self.tool_calls_made >= a.max_tool_calls:
                raise _Stop("max_tool_calls", f"reached max_tool_calls={a.max_tool_calls}")
            if self.iteration >= a.max_iterations:
                raise _Stop("max_iterations", f"reached max_iterations={a.max_iterations}")
            await self._hook("before_recursion")
            self._announce(E.RECURSION, next_iteration=self.iteration + 1)

    async def _call_model(self, messages: list[Message], ctx: Any) -> ModelResponse:
        final: ModelResponse | None = None
        async for part in self.agent.model.stream(messages, ctx.tools, self.agent.model_settings):
            if type(part) is TextDelta:
                self._announce(E.LLM_DELTA, text=part.text)
            elif isinstance(part, ModelResponse):
                final = part
        if final is None:
            raise ModelResponseError("the model's stream ended without a final response")
        if not final.text and not final.tool_calls:
            raise _Stop("model_error", "the model returned an empty response")
        if final.usage is not None:
            self.usage = self.usage + final.usage
            observe = getattr(self.agent.context_builder, "observe_usage", None)
            if observe is not None:  # lets an estimating token counter calibrate itself
                observe(ctx, final.usage)
        msg = final.to_message()
        events = [self._event(E.LLM_TOOL_CALLS, {
            "tool_calls": [c.model_dump() for c in final.tool_calls]})] if final.tool_calls else []
        events.append(self._event(E.LLM_COMPLETE, {
            "text": final.text, "tool_call_count": len(final.tool_calls),
            "usage": final.usage.model_dump() if final.usage else None,
            "finish_reason": final.finish_reason}))
        await self._commit(events, messages=[msg])
        self._unanswered.update((c.id, c) for c in final.tool_calls)
        return final

    async def _run_tools(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run the calls concurrently; return their results in call order."""
        a = self.agent
        results: dict[str, ToolResult] = {}
        budget = max(a.max_tool_calls - self.tool_calls_made, 0)
        to_run: list[ToolCall] = []
        for i, call in enumerate(calls):
            refusal: ToolResult | None = None
            if i >= budget:
                refusal = error_result(call, "limit", f"not run: the turn reached "
                                       f"max_tool_calls={a.max_tool_calls}")
            else:
                for decision in await self._hook("before_tool_execution", call):
                    if isinstance(decision, Deny):
                        refusal = error_result(call, "denied", decision.reason)
                        break
                    if isinstance(decision, ReplaceArguments):
                        call = call.model_copy(update={"arguments": decision.arguments,
                                                       "raw_arguments": None})
            if refusal is not None:
                results[call.id] = await self._record_result(call, refusal, started=False)
            else:
                to_run.append(call)
        self.tool_calls_made += len(to_run)
        if not to_run:
            return [results[c.id] for c in calls]
        entries = [LedgerEntry(self.run_id, self.session_id, c.id, c.name, "started", c.arguments,
                               a.effect_of(c.name)) for c in to_run]
        self._open.update((e.tool_call_id, e) for e in entries)
        await self._commit([self._event(E.TOOL_EXECUTION_START, {
            "tool_name": c.name, "tool_call_id": c.id, "arguments": c.arguments}) for c in to_run],
            ledger=entries)
        if len(to_run) == 1:
            only = to_run[0]
            results[only.id] = await self._record_result(only, await self._execute(only))
            return [results[c.id] for c in calls]
        tasks = [asyncio.ensure_future(self._execute(c)) for c in to_run]
        by_task = dict(zip(tasks, to_run, strict=True))
        try:
            pending: set[asyncio.Future[ToolResult]] = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(done, key=tasks.index):  # same-instant results in call order
                    call = by_task[t]
                    results[call.id] = await self._record_result(call, t.result())
        finally:
            for t in tasks:
                t.cancel()
        return [results[c.id] for c in calls]

    async def _execute(self, call: ToolCall) -> ToolResult:
        a = self.agent
        ctx = RunContext(self.session_id, self.run_id, call.id, a.name, a.workspace, self.deps,
                         store=a.store)
        return await execute_call(call, a.tools, ctx, a.tool_timeout)

    async def _record_result(
        self, call: ToolCall, result: ToolResult, started: bool = True
    ) -> ToolResult:
        ledger = []
        if started and call.id in self._open:
            entry = self._open.pop(call.id)
            status = "completed" if result.success else (
                "interrupted" if result.error_code == "interrupted" else "failed")
            ledger.append(LedgerEntry(entry.run_id, entry.session_id, entry.tool_call_id,
                                      entry.name, status, entry.arguments, entry.effect, result))  # type: ignore[arg-type]
        result = await self.agent._process_result(self, call, result)
        kind = E.TOOL_RESULT if result.success else E.TOOL_ERROR
        ev = self._event(kind, {"tool_name": call.name, "tool_call_id": call.id,
                                "success": result.success, "content": result.to_content(),
                                "error_code": result.error_code, "duration_ms": result.duration_ms})
        await self._commit([ev], messages=[Message.tool(result)], ledger=ledger)
        self._unanswered.pop(call.id, None)
        await self._hook("after_tool_execution", call, result)
        return result

    async def _finish(self, stop: StopReason, error: str | None, started: float) -> None:
        """PERSIST: close every open call, record the run's end, announce AGENT_FINISH."""
        self._set_state(AgentState.SHUTTING_DOWN if stop == "cancelled" else
                        AgentState.ERROR if stop in ("error", "model_error") else
                        AgentState.WAITING_FOR_USER_INPUT)
        self._announce(E.PERSIST_START)
        if error is not None and stop not in ("completed", "max_iterations", "max_tool_calls"):
            self._announce(E.ERROR, error=error, stop_reason=stop)
        for call in list(self._unanswered.values()):
            await self._record_result(call, error_result(
                call, "interrupted", f"the run stopped ({stop}) before this call finished; "
                "its outcome is unknown"))
        self.result = RunResult(
            output=self.output, messages=self.new_messages, usage=self.usage,
            session_id=self.session_id, run_id=self.run_id, stop_reason=stop,
            iterations=self.iteration, error=error)
        try:
            await self._hook("after_iteration_end", self.result)
        except HookError as exc:
            self._announce(E.ERROR, error=str(exc), fatal=True)
        finish = self._event(E.AGENT_FINISH, {
            "stop_reason": stop, "output": self.output, "usage": self.usage.model_dump(),
            "iterations": self.iteration, "error": error,
            "duration_ms": (time.perf_counter() - started) * 1000})
        await self._commit([finish], run=RunRecord(
            self.run_id, self.session_id, stop, self.usage, data={"error": error}))
