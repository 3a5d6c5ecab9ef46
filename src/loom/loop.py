"""The turn: INTAKE → CONTEXT → EXECUTE → PERSIST, driven by seed 003's state machine.

Each iteration compiles the context, streams one model answer and runs the answer's tool calls
concurrently; then it recurses (seed 002's ``tt``) until the model answers without tools or a
limit stops it. Every step is committed before its event goes out (``loom.steps``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loom import runtime
from loom.context import AssembledContext, ContextRequest
from loom.errors import (
    ConfigurationError,
    HookError,
    ModelAuthError,
    ModelError,
    ModelResponseError,
    RunCancelled,
)
from loom.events import AgentEvent
from loom.events import EventType as E
from loom.messages import (
    Message,
    ModelResponse,
    RunResult,
    StopReason,
    ToolCall,
    ToolResult,
    Usage,
    new_id,
)
from loom.models.base import RetryNotice, TextDelta
from loom.steps import AgentState, TurnSteps
from loom.store.base import RunRecord
from loom.tools.base import RunContext
from loom.tools.executor import error_result, execute_call

if TYPE_CHECKING:
    from loom.agent import Agent

__all__ = ["AgentState", "Turn"]


class _Stop(Exception):
    def __init__(self, reason: StopReason, error: str | None = None):
        self.reason, self.error = reason, error


class Turn(TurnSteps):
    """One user message run to its answer. Create through ``Agent.stream`` / ``Agent.run``."""

    def __init__(self, agent: Agent, message: str, session_id: str, on_busy: str, deps: Any,
                 resume: Any = None) -> None:  # fmt: skip
        super().__init__(agent, session_id, new_id("run"))
        self.message, self.on_busy, self.deps = message, on_busy, deps
        self.usage = Usage()
        self.output = ""
        self.result: RunResult | None = None
        self.verdict: dict[str, Any] | None = None  # the judge panel's latest, if any
        self.cancel_reason: str | None = None
        self.resume = resume  # decisions for the calls a paused turn left (Agent.resume)
        self.decided: dict[str, Any] = {}  # approved at resume, run without asking again
        self.pending_approvals: list[dict[str, Any]] = []  # parked calls; the run stops after
        self._finishing = False
        self._task: asyncio.Task[Any] | None = None

    async def run(self, emit: Callable[[AgentEvent], None]) -> None:
        """Run the turn to its end in the current task, handing each event to ``emit``."""
        self._emit, a = emit, self.agent
        self._task = asyncio.current_task()
        try:
            gate = await runtime.acquire(
                a.store, self.session_id, self.run_id, on_busy=self.on_busy,  # type: ignore[arg-type]
                interrupt=lambda: self.cancel("interrupted by a newer turn"),
                queue_timeout=a.queue_timeout, max_queue_depth=a.max_queue_depth,
                lock_ttl=a.lock_ttl,
            )  # fmt: skip
        except asyncio.CancelledError:
            if self.cancel_reason is None:
                raise
            raise RunCancelled(f"cancelled while queued: {self.cancel_reason}") from None
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
        except (ConfigurationError, ModelAuthError) as exc:  # the programmer must fix these
            stop, error, raise_after = "error", str(exc), exc
        except ModelError as exc:
            stop, error = "model_error", f"{type(exc).__name__}: {exc}"
        except HookError as exc:
            stop, error = "error", str(exc)
        except Exception as exc:
            stop, error, raise_after = "error", f"{type(exc).__name__}: {exc}", exc
        finally:
            self._finishing = True  # too late to interrupt: the turn is closing
            if self.cancel_reason is not None and self._task.cancelling():  # type: ignore[union-attr]
                try:  # an interrupt landed as the turn ended without awaiting: absorb it
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    self._task.uncancel()  # type: ignore[union-attr]
            try:
                await self._finish(stop, error, started)  # type: ignore[arg-type]
            finally:
                await runtime.release(a.store, gate, self.session_id, self.run_id)
        if raise_after is not None:
            raise raise_after

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Stop the turn at its next await; open tool calls get ``interrupted`` results."""
        if self._finishing or self.cancel_reason is not None:
            return
        if self._task is not None and not self._task.done():
            self.cancel_reason = reason
            self._task.cancel()

    async def _intake(self) -> None:
        a, store = self.agent, self.agent.store
        if await store.get_session(self.session_id) is None:
            await store.create_session(self.session_id, agent_name=a.name)
        await a._recover(self)
        self.history = self.hctx.messages = await store.load_messages(self.session_id)
        if await a._approvals.settle(self):  # resumed a turn that waited for approval
            return
        start = self._event(E.AGENT_START, {"message": self.message, "agent": a.name})
        await self._commit([start], messages=[Message.user(self.message)],
                           run=RunRecord(self.run_id, self.session_id, "running"))  # fmt: skip
        await a._prepare_tools(self)

    async def _iterate(self) -> None:
        a = self.agent
        while True:
            self.iteration = self.hctx.iteration = self.iteration + 1
            await self._hook("before_iteration_start")
            self._announce(E.ITERATION_START)
            ctx = await self._context()
            self._set_state(AgentState.CALLING_LLM)
            messages = ctx.messages
            for extra in await self._hook("before_llm_call", messages):
                if extra:
                    messages = [*messages, *extra]
            self._announce(E.LLM_START, tool_count=len(ctx.tools), message_count=len(messages),
                           token_estimate=ctx.token_estimate)  # fmt: skip
            response = await self._call_model(messages, ctx)
            self._set_state(AgentState.PROCESSING_LLM_RESPONSE)
            await self._hook("after_llm_response", response)
            if not response.tool_calls:
                self.output = response.text
                if await a._review(self, response.text):
                    continue  # the judges failed it; a correction is in the history
                return
            self._set_state(AgentState.EXECUTING_TOOLS)
            results = await self._run_tools(response.tool_calls)
            if self.pending_approvals:
                raise _Stop("awaiting_approval")
            self._set_state(AgentState.POST_TOOLS_HOOK)
            await self._hook("post_tools", results)
            if self.tool_calls_made >= a.max_tool_calls:
                raise _Stop("max_tool_calls", f"reached max_tool_calls={a.max_tool_calls}")
            if self.iteration >= a.max_iterations:
                raise _Stop("max_iterations", f"reached max_iterations={a.max_iterations}")
            await self._hook("before_recursion")
            self._announce(E.RECURSION, next_iteration=self.iteration + 1)

    async def _context(self) -> AssembledContext:
        """CONTEXT: the one place the model's input is compiled, from persisted state."""
        a = self.agent
        await self._hook("before_context_assembly")
        self._announce(E.CONTEXT_ASSEMBLY_START)
        request = ContextRequest(a, self.history, self.session_id, self.run_id, self.iteration,
                                 self.message, extra_system=a._extra_system(self))  # fmt: skip
        ctx = await a.context_builder.build(request)
        if ctx.persist:  # summaries and memory bookkeeping: committed with their events
            await self._commit([self._event(t, n) for t, n in ctx.notes], messages=ctx.persist)
        else:
            for note_type, note in ctx.notes:
                self._announce(note_type, **note)
        await self._hook("after_context_assembly", ctx.messages)
        self._announce(E.CONTEXT_ASSEMBLY_COMPLETE, token_estimate=ctx.token_estimate,
                       message_count=len(ctx.messages))  # fmt: skip
        return ctx

    async def _call_model(self, messages: list[Message], ctx: AssembledContext) -> ModelResponse:
        """Stream one answer; commit it whole (a cut stream stores nothing)."""
        final: ModelResponse | None = None
        async for part in self.agent.model.stream(messages, ctx.tools, self.agent.model_settings):
            if type(part) is TextDelta:
                self._announce(E.LLM_DELTA, text=part.text)
            elif type(part) is RetryNotice:
                self._announce(E.LLM_RETRY, attempt=part.attempt, delay=part.delay,
                               error=part.error)  # fmt: skip
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
        seen: set[str] = set()
        for c in final.tool_calls:  # results must pair with calls one to one
            if not c.id or c.id in seen:
                c.id = new_id("call")
            seen.add(c.id)
        events = (
            [
                self._event(
                    E.LLM_TOOL_CALLS, {"tool_calls": [c.model_dump() for c in final.tool_calls]}
                )
            ]
            if final.tool_calls
            else []
        )
        events.append(self._event(E.LLM_COMPLETE, {
            "text": final.text, "tool_call_count": len(final.tool_calls),
            "usage": final.usage.model_dump() if final.usage else None,
            "finish_reason": final.finish_reason}))  # fmt: skip
        await self._commit(events, messages=[final.to_message()])
        self._unanswered.update((c.id, c) for c in final.tool_calls)
        return final

    async def _run_tools(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run the calls concurrently; return their results in call order."""
        results: dict[str, ToolResult] = {}
        to_run: list[ToolCall] = []
        for i, call in enumerate(calls):
            runnable, refusal = await self._screen(i, call)
            if refusal is not None:
                results[call.id] = await self._record_result(call, refusal, started=False)
            elif runnable is not None:
                to_run.append(runnable)
        self.tool_calls_made += len(to_run)
        if to_run:
            await self._start_calls(to_run)
        if len(to_run) == 1:  # the common case needs no extra task
            results[to_run[0].id] = await self._record_result(
                to_run[0], await self._execute(to_run[0]))  # fmt: skip
        elif to_run:
            tasks = [asyncio.ensure_future(self._execute(c)) for c in to_run]
            try:
                pending = set(tasks)
                while pending:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for call, t in zip(to_run, tasks, strict=True):  # same instant: call order
                        if t.done() and call.id not in results:
                            results[call.id] = await self._record_result(call, t.result())
            finally:
                for t in tasks:
                    t.cancel()
        return [results[c.id] for c in calls if c.id in results]

    async def _execute(self, call: ToolCall) -> ToolResult:
        a = self.agent
        ctx = RunContext(self.session_id, self.run_id, call.id, a.name, a.workspace, self.deps,
                         store=a.store)  # fmt: skip
        return await execute_call(call, a.tools, ctx, a.tool_timeout)

    async def _finish(self, stop: StopReason, error: str | None, started: float) -> None:
        """PERSIST: close every open call, record the run's end, announce AGENT_FINISH."""
        failed = stop in ("error", "model_error")
        self._set_state(AgentState.SHUTTING_DOWN if stop == "cancelled" else AgentState.ERROR
                        if failed else AgentState.WAITING_FOR_USER_INPUT)  # fmt: skip
        self._announce(E.PERSIST_START)
        if error is not None and stop not in ("completed", "max_iterations", "max_tool_calls"):
            self._announce(E.ERROR, error=error, stop_reason=stop)
        for call in list(self._unanswered.values()):
            await self._record_result(call, error_result(call, "interrupted", f"the run "
                f"stopped ({stop}) before this call finished; its outcome is unknown"))  # fmt: skip
        self.result = RunResult(
            output=self.output, messages=self.new_messages, usage=self.usage,
            session_id=self.session_id, run_id=self.run_id, stop_reason=stop,
            iterations=self.iteration, error=error, verdict=self.verdict,
            pending_approvals=self.pending_approvals,
        )  # fmt: skip
        try:
            await self._hook("after_iteration_end", self.result)
        except HookError as exc:
            self._announce(E.ERROR, error=str(exc), fatal=True)
        finish = self._event(E.AGENT_FINISH, {
            "stop_reason": stop, "output": self.output, "usage": self.usage.model_dump(),
            "iterations": self.iteration, "error": error,
            "duration_ms": (time.perf_counter() - started) * 1000,
            "pending_approvals": self.pending_approvals})  # fmt: skip
        data = {
            "error": error,
            "verdict": self.verdict,
            "pending_approvals": self.pending_approvals,
        }
        record = RunRecord(self.run_id, self.session_id, stop, self.usage, data=data)
        await self._commit([finish], run=record)
