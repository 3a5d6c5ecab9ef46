"""The turn: INTAKE → CONTEXT → EXECUTE → PERSIST, driven by seed 003's state machine.

INTAKE takes the session's lease, builds this turn's ``RunDeps``, closes what dead runs left
open (``loom.engine.recovery``), applies the decisions of a resumed turn or expires calls a new
message left undecided, and commits the user's message. Then each iteration compiles the context,
streams one model answer and runs its tool calls (``loom.engine.calls``), and recurses (seed 002's
``tt``) until the model answers without tools or a limit stops it; judges may send a final
answer back. PERSIST closes every open call and records the run's end. All of it, INTAKE too,
runs under the turn timeout, and every step is committed by the run's ``Journal`` before its
event goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from loom import events as ev
from loom.budgets import BudgetLimitReached, reserve_call, run_owner_of
from loom.context import AssembledContext, ContextRequest
from loom.engine import gates
from loom.engine.calls import CallRunner
from loom.engine.driving import discard
from loom.engine.journal import PROGRESS_TYPES, Journal
from loom.engine.recovery import find_loose_ends
from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE, Edit, Regenerate, Rewind
from loom.errors import (
    ApprovalHandlerError,
    BudgetExceeded,
    ConfigurationError,
    HookError,
    ModelAuthError,
    ModelError,
    ModelResponseError,
    RunCancelled,
)
from loom.guardrails.engine import Tripped
from loom.hooks import HookContext, HookRunner
from loom.loop_detection import LOOP_WARNING, Loop, LoopDetector, LoopWarning
from loom.messages import Message, ModelResponse, RunResult, StopReason, Usage, new_id
from loom.models.base import (
    ModelSettings,
    ReasoningDelta,
    RetryNotice,
    TextDelta,
    reports_real_usage,
)
from loom.models.cache import cache_settings, session_cache_key
from loom.output import Accept, GiveUp, OutputSpec, check_answer
from loom.policy import approval
from loom.queries import format_answer
from loom.store.base import RunRecord
from loom.store.media import hydrate

if TYPE_CHECKING:
    from loom.content import Part
    from loom.engine.run_deps import RunDeps, SessionView, TurnHost
    from loom.engine.run_inputs import BranchInput, RunOptions
    from loom.engine.turn_spec import TurnSpec
    from loom.memory.config import RecallConfig
    from loom.memory.recall import Recalled

__all__ = ["AgentState", "Turn"]


class AgentState(StrEnum):
    """Seed 003's states; each change is a ``STATE_CHANGE`` event."""

    WAITING_FOR_USER_INPUT = "waiting_for_user_input"
    CALLING_LLM = "calling_llm"
    PROCESSING_LLM_RESPONSE = "processing_llm_response"
    EXECUTING_TOOLS = "executing_tools"
    POST_TOOLS_HOOK = "post_tools_hook"
    ERROR = "error"
    SHUTTING_DOWN = "shutting_down"


S = AgentState


class _Stop(Exception):
    def __init__(self, reason: StopReason, error: str | None = None):
        self.reason, self.error = reason, error


class Turn:
    """One user message (or one resume) run to its answer. Made by ``Runtime``."""

    def __init__(
        self,
        runtime: TurnHost,
        agent: TurnSpec,
        message: str | None,
        session_id: str,
        on_busy: str,
        deps: Any,
        *,
        resume: Any = None,
        answer: Any = None,
        parent_run_id: str | None = None,
        run_id: str | None = None,
        carry_on: bool = False,
        output: OutputSpec | None = None,
        options: RunOptions | None = None,
    ) -> None:
        self.runtime, self.agent, self.session_id = runtime, agent, session_id
        self.options = options  # this run's overrides (model, extra tools, limits), or None
        # this run's limits: its own (RunOptions) where given, else the agent's
        own_timeout = options.timeout if options is not None else None
        own_iterations = options.max_iterations if options is not None else None
        self.timeout: float = own_timeout or agent.timeout
        self.max_iterations: int = own_iterations or agent.max_iterations
        own_wait = options.queue_timeout if options is not None else None
        self.queue_timeout: float = own_wait or agent.queue_timeout
        self.run_id = run_id or new_id("run")
        self.message, self.resume, self.answer = message or "", resume, answer
        self.parts: list[Part] = []  # the new message's media (loom.content), set by the runtime
        self.branch: BranchInput | None = None  # a rewind, regenerate or edit (the runtime's)
        self.view: SessionView | None = None  # the session as INTAKE found it
        self.carry_on = carry_on  # a retry whose message is already committed: recover, go on
        self.pending_query: dict[str, Any] | None = None  # a server query waiting (awaiting_input)
        self.on_busy, self.user_deps, self.parent_run_id = on_busy, deps, parent_run_id
        self.iteration, self.state, self.usage, self.output = (
            0,
            S.WAITING_FOR_USER_INPUT,
            Usage(),
            "",
        )
        self.max_cost: float | None = None  # US dollars (Runtime.run(max_cost=...))
        self.budget_stop: dict[str, Any] | None = None  # the loom.budgets limit that stopped it
        self.verdict: dict[str, Any] | None = None  # the judge panel's latest, if any
        self.result: RunResult | None = None
        self.cancel_reason: str | None = None
        self.rom: list[str] = []  # matched patterns, fixed for the turn
        self.recalled: Recalled | None = None  # memories recalled at the first CONTEXT
        self.recall_asked = False
        self.hctx = HookContext(agent, self.run_id, session_id)
        self._finishing = False
        self._task: asyncio.Task[Any] | None = None
        self._parallel: asyncio.Task[None] | None = None  # parallel input guardrails
        # an output_type (loom.output): the schema goes to the model, answers are validated
        self.typed, self.data, self.output_failures = output, None, 0
        self.settings = agent.model_settings
        own_choice = options.tool_choice if options is not None else None
        if own_choice is not None:  # this run's choice over the agent's settings
            self.settings = replace(self.settings or ModelSettings(), tool_choice=own_choice)
        if output is not None:
            self.settings = replace(self.settings or ModelSettings(), output=output.wire)

    async def run(self, emit: Callable[[ev.AgentEvent], None]) -> None:
        """Run the turn to its end in the current task, handing each event to ``emit``."""
        a, rt = self.agent, self.runtime
        self._task = asyncio.current_task()
        gate = rt.gate(self.session_id)
        try:
            await gates.acquire(
                gate,
                rt.store,
                self.session_id,
                self.run_id,
                on_busy=self.on_busy,  # type: ignore[arg-type]
                interrupt=lambda: self.cancel("interrupted by a newer turn"),
                queue_timeout=self.queue_timeout,
                max_queue_depth=a.max_queue_depth,
                lock_ttl=rt.lease_ttl,
            )
        except asyncio.CancelledError:
            if self.cancel_reason is None:
                raise
            raise RunCancelled(f"cancelled while queued: {self.cancel_reason}") from None
        except BaseException:
            rt.forget_gate(self.session_id, gate)
            raise
        renew = asyncio.ensure_future(gates.keep_alive(rt.store, gate, rt.lease_ttl, self.cancel))
        self.j = Journal(
            rt.store,
            self.session_id,
            self.run_id,
            [],
            lease=gate.lease,
            parent_run_id=self.parent_run_id,
            observers=rt.observers,
        )
        self.j.emit = emit
        started, stop, error = time.perf_counter(), "completed", None
        raise_after: BaseException | None = None
        try:
            async with asyncio.timeout(self.timeout):
                await self._intake()
                await self._iterate()
        except _Stop as s:
            stop, error = s.reason, s.error
        except Tripped as t:
            stop, error = "guardrail", t.reason
        except TimeoutError:
            stop, error = "timeout", f"the turn ran past its {self.timeout:g} s timeout"
        except asyncio.CancelledError:
            stop, error = "cancelled", self.cancel_reason or "the caller stopped the run"
            if self.cancel_reason is None:  # the caller went away: clean up, then propagate
                raise_after = asyncio.CancelledError()
            else:
                self._task.uncancel()  # type: ignore[union-attr]
        except (ConfigurationError, ModelAuthError, ApprovalHandlerError) as exc:  # fix the code
            stop, error, raise_after = "error", str(exc), exc
        except BudgetExceeded as exc:  # a crew's budget or loom.budgets refused the call
            stop, error = "budget", str(exc)
            if isinstance(exc, BudgetLimitReached):  # the ERROR event names the limit
                self.budget_stop = exc.details()
        except ModelError as exc:
            stop, error = "model_error", f"{type(exc).__name__}: {exc}"
        except HookError as exc:
            stop, error = "error", str(exc)
        except Exception as exc:
            stop, error, raise_after = "error", f"{type(exc).__name__}: {exc}", exc
        finally:
            self._finishing = True  # too late to interrupt: the turn is closing
            renew.cancel()
            if self.cancel_reason is not None and self._task.cancelling():  # type: ignore[union-attr]
                try:  # an interrupt landed as the turn ended without awaiting: absorb it
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    self._task.uncancel()  # type: ignore[union-attr]
            try:
                await self._finish(stop, error, started)  # type: ignore[arg-type]
                pool = getattr(getattr(self, "deps", None), "sandboxes", None)
                if pool is not None:  # a sandbox with lifetime "run" ends with its run
                    await pool.run_ended(self.run_id)
            finally:
                await gates.release(rt.store, gate)
                rt.forget_gate(self.session_id, gate)
        if raise_after is not None:
            raise raise_after

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Stop the turn at its next await; open tool calls get ``interrupted`` results."""
        if self._finishing or self.cancel_reason is not None:
            return
        if self._task is not None and not self._task.done():
            self.cancel_reason = reason
            self._task.cancel()

    # -- INTAKE -----------------------------------------------------------------------------------
    async def _intake(self) -> None:
        a, rt, j, sid = self.agent, self.runtime, self.j, self.session_id
        view = self.view = await rt.session_view(sid)
        j.history = view.messages
        self.deps = d = await rt.deps_for(a, sid, view, self.user_deps, self.options)
        if d.sandboxes is not None and getattr(a, "sandbox", None) is not None:
            # workspace snapshots after each committed step (loom.sandbox.sessions)
            j.after_commit = functools.partial(d.sandboxes.committed, sid)
        self.hctx.tools, self.hctx.remembered, self.hctx.messages = d.tools, d.remembered, j.history
        report = lambda e: j.announce(ev.ErrorEvent, error=e, fatal=False)  # noqa: E731
        self.hooks = HookRunner(a.compiled_hooks, self.hctx, report)
        # the lifecycle points some hook listens at: a step skips awaiting the others
        self.hooked = frozenset(point for point, hooks in a.compiled_hooks.items() if hooks)
        self.calls = CallRunner(d, j, self.hooks)
        # Nobody watches this run live and no user hook looks at the transcript between steps:
        # a pure or idempotent call's result is committed with the next model answer.
        quiet = j.emit is discard and not j.observers
        self.calls.fold_results = quiet and not a.hooks
        # progress notices nobody could see are not built (journal.py), unless the caller says
        # otherwise (RunOptions.progress: a queued worker's run is followed through the store;
        # a blocking server run reads only steps)
        wanted = self.options.progress if self.options is not None else None
        j.notices = (not quiet) if wanted is None else wanted
        ran_with = {
            "model": getattr(d.model, "name", type(d.model).__name__),
            "context_window": _window(d),
        }
        guards, screened = a.guardrails, None
        fresh = self.resume is None and self.answer is None and not self.carry_on
        if (
            guards is not None and guards.has("input") and fresh
        ):  # before AGENT_START: a fixed (redacted) message is all the journal ever holds
            screened = await guards.check_input(self.message, self.calls.context(self.message))
            self.message = screened.value
        known = await rt.store.get_session(sid)
        owned = ran_with if d.owner is None else {**ran_with, "owner": d.owner}
        if known is None or not known.agent_name:  # new, or made unnamed (POST /threads)
            await rt.store.create_session(sid, agent_name=a.name, metadata=owned)
        start = owned  # the owner is recorded with the run, and as a new session's owner
        if d.owner is not None and known is None:
            await self._record_owner(d.owner)
        if rt.tracers:  # they open the run's span now; its traceparent goes into AGENT_START
            start = {**owned, **await self._trace(str(ran_with["model"]))}
        await j.commit(
            [
                j.event(
                    ev.AgentStart,
                    message_text=self.message,
                    agent=a.name,
                    resume=self.resume is not None,
                    extra=start,
                )
            ],
            run=RunRecord(self.run_id, sid, "running"),
        )
        for w in d.warnings:
            j.warn(w, "toolset")
        unanswered = approval.unanswered_calls(j.history)
        pending = await approval.pending_approvals(rt.store, sid, j.history) if unanswered else []
        ends = await find_loose_ends(
            rt.store,
            rt.capabilities.runs,
            sid,
            unanswered,
            {p.tool_call_id for p in pending},
            self.run_id,
        )
        if ends:  # what dead runs of the session left open (loom.engine.recovery)
            await self.calls.recover(ends)
        if self.branch is not None:
            await self._branch(pending)
            if not isinstance(self.branch, Edit):  # an edit goes on as a new message
                return
            self.message, self.parts, pending = self.branch.text, list(self.branch.parts), []
        if self.resume is not None:
            return await self._settle(pending)
        if self.answer is not None:  # the client answered a server query: the turn goes on
            query, text = self.answer
            self.message = next((m.content for m in reversed(j.history) if m.role == "user"), "")
            content = format_answer(query.kind, query.question, text)
            await j.commit(
                [j.event(ev.QueryAnswer, query_id=query.query_id, kind=query.kind, content=content)]
            )
            return
        if self.carry_on:  # a worker's retry of a run that died after committing the message
            self.message = next((m.content for m in reversed(j.history) if m.role == "user"), "")
            last = j.history[-1] if j.history else None
            if last is not None and last.role == "assistant" and not last.tool_calls:
                self.output = last.content  # it had answered; only its end was not recorded
                raise _Stop("completed")
            return
        for p in pending:  # a new message instead of a decision: the parked calls are denied
            await self.calls.decide(p, None, "new_message")
            await self.calls.record(p.call, approval.expired_result(p.call), started=False)
        if a.patterns is not None:
            from loom.patterns.turn import match_patterns

            self.rom, payload = match_patterns(a.patterns, self.message)
            j.announce(ev.PatternsMatched, **payload)
        if screened is not None:
            self.calls.note(screened)  # its events go with the message; a trip stops here
        if self.parts:
            await j.commit([j.event(ev.UserMessage, content=self.message, parts=self.parts)])
        else:
            await j.commit([j.event(ev.UserMessage, content=self.message)])
        if guards is not None and guards.parallel:  # they race the first model call
            ctx = self.calls.context(self.message)
            check = guards.check_parallel(self.message, ctx)
            self._parallel = asyncio.ensure_future(_settle(check, self.calls.note))

    async def _record_owner(self, owner: str) -> None:
        """Record ``owner`` as the new session's owner unless it has one (a server's key
        claimed it first): a later run that names no owner (a worker's retry, a resume)
        acts for the same one (``Runtime.start``)."""
        kv = self.runtime.capabilities.kv
        if kv is not None and await kv.get_value(SESSION_OWNER_NAMESPACE, self.session_id) is None:
            await kv.put_value(SESSION_OWNER_NAMESPACE, self.session_id, owner)

    async def _branch(self, pending: list[approval.PendingApproval]) -> None:
        """Move the session to the branch's point (``loom.engine.branching``): calls parked for
        approval are denied first (as a new message denies them), then the branch is planned
        on the leased transcript and committed as one ``SESSION_BRANCH``. A rewind ends here;
        a regenerate answers the last user message again."""
        from loom.engine.branching import needs_journal, plan_branch

        assert self.branch is not None
        rt, j, sid = self.runtime, self.j, self.session_id
        for p in pending:
            await self.calls.decide(p, None, "branch")
            await self.calls.record(p.call, approval.expired_result(p.call), started=False)
        store = rt.capabilities.branches
        assert store is not None  # the runtime checked it before the run
        events = await rt.store.load_events(sid) if needs_journal(self.branch) else None
        plan = plan_branch(
            self.branch, j.history, await store.ledger(sid), self.agent.branch_effects, events
        )
        if plan.changes:
            await j.branch(j.event(ev.SessionBranch, **plan.event_payload()))
            assert self.view is not None  # INTAKE read it
            self.view.branches += 1  # the store counted it: this runtime's view is current
        if isinstance(self.branch, Rewind):
            raise _Stop("rewound")
        if isinstance(self.branch, Regenerate):
            self.message = next((m.content for m in reversed(j.history) if m.role == "user"), "")

    async def _trace(self, model: str) -> dict[str, Any]:
        """Start the run's span in each tracer (``loom.observability``). A carried-on run (a
        worker's retry) hands them the trace of the run that committed the exchange's user
        message, so every attempt of one exchange is one trace."""
        carried = None
        if self.carry_on:
            events = await self.runtime.store.load_events(self.session_id)
            asked = next((e.run_id for e in reversed(events) if type(e) is ev.UserMessage), None)
            for e in events:
                if type(e) is ev.AgentStart and e.run_id == asked:
                    carried = e.extra.get("traceparent")
                    break
        out: dict[str, Any] = {}
        for tracer in self.runtime.tracers:
            out.update(
                tracer.start_run(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    agent=self.agent.name,
                    model=model,
                    carried=str(carried) if carried else None,
                    parent_run_id=self.parent_run_id,
                )
            )
        return out

    async def _settle(self, pending: list[Any]) -> None:
        """A resumed turn: apply the human's decisions, run what was approved."""
        decisions = approval.match_decisions(self.resume, pending, self.session_id)
        self.message = next((m.content for m in reversed(self.j.history) if m.role == "user"), "")
        to_run = []
        for p in pending:
            decision = decisions[p.tool_call_id]
            await self.calls.decide(p, decision, "resume")
            call, refusal = approval.apply_decision(p.call, decision)
            if refusal is not None:
                await self.calls.record(call, refusal, started=False)
            else:
                self.calls.decided.add(call.id)
                to_run.append(call)
        if to_run:
            await self.calls.run(to_run)
        if self.calls.parked:
            raise _Stop("awaiting_approval")

    # -- the iterations (CONTEXT, EXECUTE, recursion) ----------------------------------------------
    async def _iterate(self) -> None:
        a, j, hook, hooked = self.agent, self.j, self.hooks, self.hooked
        loops = LoopDetector(a.loop_detection) if a.loop_detection is not None else None
        while True:
            if loops is not None:  # before each model call, from the committed transcript
                verdict = loops.check(j.history)
                if verdict is not None:  # rare: no coroutine for the usual "go on"
                    await self._loop_verdict(verdict)
            self.iteration = j.iteration = self.hctx.iteration = self.iteration + 1
            if "before_iteration_start" in hooked:
                await hook("before_iteration_start")
            j.notice(ev.IterationStart)
            ctx = await self._context()
            self._set_state(S.CALLING_LLM)
            messages = ctx.messages
            if "before_llm_call" in hooked:
                for extra in await hook("before_llm_call", messages):
                    if extra:
                        messages = [*messages, *extra]
            j.announce(
                ev.LlmStart,
                tool_count=len(ctx.tools),
                message_count=len(messages),
                token_estimate=ctx.token_estimate,
            )
            response = await self._race(messages, ctx)
            self._set_state(S.PROCESSING_LLM_RESPONSE)
            if "after_llm_response" in hooked:
                await hook("after_llm_response", response)
            if not response.tool_calls:
                self.output = response.text
                cut = response.finish_reason == "length"
                if self.typed is not None and await self._check_output(response.text, cut):
                    continue  # it did not fit; the validation errors are in the transcript
                if a.judges is not None and await self._review(response.text):
                    continue  # the judges failed it; their correction is in the transcript
                query = a.query_detector.detect(response.text) if a.query_detector else None
                if query is not None:  # seed 003: the model asked the client; wait for it
                    q = self.pending_query = {**query.to_dict(), "query_id": new_id("query")}
                    await j.commit(
                        [
                            j.event(
                                ev.ServerQueryEvent,
                                query_id=q["query_id"],
                                kind=q["kind"],
                                question=q["question"],
                                details=q["data"],
                            )
                        ]
                    )
                    raise _Stop("awaiting_input")
                return
            self._set_state(S.EXECUTING_TOOLS)
            results = await self.calls.run(response.tool_calls)
            if self.calls.parked:
                raise _Stop("awaiting_approval")
            self._set_state(S.POST_TOOLS_HOOK)
            if "post_tools" in hooked:
                await hook("post_tools", results)
            if self.calls.made >= (most := self.deps.max_tool_calls):
                raise _Stop("max_tool_calls", f"reached max_tool_calls={most}")
            if self.iteration >= self.max_iterations:
                raise _Stop("max_iterations", f"reached max_iterations={self.max_iterations}")
            if "before_recursion" in hooked:
                await hook("before_recursion")
            j.notice(ev.Recursion, next_iteration=self.iteration + 1)

    async def _loop_verdict(self, verdict: Loop | LoopWarning) -> None:
        """Stop a run that repeats itself (``loom.loop_detection``), or warn the model once."""
        j = self.j
        if isinstance(verdict, Loop):
            raise _Stop("loop", verdict.reason)
        # a warning: a note the model reads next; the journal holds it
        meta = {LOOP_WARNING: verdict.key}
        await j.commit([j.event(ev.MemoryRecord, content=verdict.note, metadata=meta)])

    async def _context(self) -> AssembledContext:
        """CONTEXT: the one place the model's input is compiled, from the committed transcript."""
        d, j = self.deps, self.j
        if "before_context_assembly" in self.hooked:
            await self.hooks("before_context_assembly")
        j.notice(ev.ContextAssemblyStart)
        if not self.recall_asked:  # once per turn, whatever the iterations
            self.recall_asked = True
            config = self._recall_config()
            if config is not None:
                self.recalled = await self._recall(config)
        request = ContextRequest(
            self.agent,
            j.history,
            self.session_id,
            self.run_id,
            self.iteration,
            self.message,
            extra_system=[*d.rom, *self.rom] if d.rom else self.rom,
            tool_specs=d.tool_specs,
            model=d.model,
            recalled=self.recalled,
        )
        ctx = await d.builder.build(request)
        notes = [j.event_of(t, n) for t, n in ctx.notes if j.notices or t not in PROGRESS_TYPES]
        if ctx.persist:  # summaries and flush markers: committed with their events
            records = [
                j.event(ev.MemoryRecord, content=m.content, metadata=dict(m.metadata))
                for m in ctx.persist
            ]
            await j.commit([*notes, *records])
        else:
            for note in notes:
                j.send(note)
        if "after_context_assembly" in self.hooked:
            await self.hooks("after_context_assembly", ctx.messages)
        j.notice(
            ev.ContextAssemblyComplete,
            token_estimate=ctx.token_estimate,
            message_count=len(ctx.messages),
        )
        return ctx

    def _recall_config(self) -> RecallConfig | None:
        """The turn's recall settings: its builder's memory config's (a segmented builder
        given to the agent), else the agent's; None when recall is off."""
        from loom.memory.config import MemoryConfig

        config = getattr(self.deps.builder, "config", None)
        if not isinstance(config, MemoryConfig):
            config = self.agent.memory
        return config.recall if config is not None else None

    async def _recall(self, config: RecallConfig) -> Recalled:
        """Search the store's memories for this turn (``loom.memory.recall``); a failure is a
        warning and no memories, never a failed turn."""
        from loom.memory.recall import recall

        items = self.runtime.capabilities.items
        found = await recall(
            config, items, self.message, owner=self.deps.owner, agent=self.agent.name
        )
        if found.warning is not None:
            self.j.warn(found.warning, "memory")
        return found

    async def _race(self, messages: list[Message], ctx: AssembledContext) -> ModelResponse:
        """The model call, cancelled if a parallel input guardrail trips while it runs."""
        guard = self._parallel
        if guard is None:
            return await self._call_model(messages, ctx)
        model = asyncio.ensure_future(self._call_model(messages, ctx))
        try:
            await asyncio.wait({model, guard}, return_when=asyncio.FIRST_COMPLETED)
            if guard.done() and guard.exception() is not None:
                await guard  # the trip: the finally below cancels the model call
            return await model
        finally:
            if not model.done():
                model.cancel()
                await asyncio.wait({model})
            if not model.cancelled():
                model.exception()  # seen: a trip it also saw is raised above, not lost

    async def _call_model(self, messages: list[Message], ctx: AssembledContext) -> ModelResponse:
        """Stream one answer; commit it whole (a cut stream stores nothing)."""
        d, j = self.deps, self.j
        final: ModelResponse | None = None
        partial = self.typed.partial_reader() if self.typed is not None else None
        settings = self.settings.for_messages(messages) if self.settings else None
        if ctx.cache_points:  # the stable prefix's segments, for the provider's prompt cache
            key = session_cache_key(self.agent.name, self.session_id)
            settings = cache_settings(settings, ctx.cache_points, key)
        # Stored media's bytes, read only for a request, and only for a model that reads media
        # (one that reads none shows them as placeholders: nothing to load).
        if (
            any(m.parts for m in messages)
            and getattr(d.model, "accepts_media", None) != frozenset()
        ):
            messages = await hydrate(messages, d.store)
        guard = getattr(self.runtime, "budget_guard", None)  # budgets beyond the run
        held = None
        if guard is not None:  # the call's worst case is held first, or the run stops here
            held = await reserve_call(
                guard,
                d.model,
                run_id=self.run_id,
                session_id=self.session_id,
                owner=run_owner_of(d),
                input_tokens=ctx.token_estimate,
                max_output_tokens=(settings.max_tokens if settings is not None else None)
                or self.agent.reserved_output_tokens,
            )
        try:
            async for part in d.model.stream(messages, ctx.tools, settings):
                if type(part) is TextDelta:
                    j.notice(ev.LlmDelta, delta=part.text)
                    if partial is not None and (value := partial.feed(part.text)) is not None:
                        j.notice(ev.OutputPartial, output=value)
                elif type(part) is ReasoningDelta:  # its own event, never the answer's text
                    j.notice(ev.LlmReasoningDelta, delta=part.text)
                elif type(part) is RetryNotice:
                    j.announce(
                        ev.LlmRetry, attempt=part.attempt, delay=part.delay, error=part.error
                    )
                elif isinstance(part, ModelResponse):
                    final = part
        except BaseException:
            if guard is not None and held is not None:  # no answer: the hold goes back
                await guard.release(held)
            raise
        if final is not None and final.usage is not None:
            final.usage = self.runtime.price(final.usage, d.model, final.model)
        if guard is not None and held is not None:
            for crossed in await guard.settle_response(held, final):
                j.announce(ev.BudgetWarning, **crossed.payload())
        if final is None:
            raise ModelResponseError("the model's stream ended without a final response")
        if not final.text and not final.tool_calls:
            raise _Stop("model_error", "the model returned an empty response")
        if final.usage is not None:
            self.usage = self.usage + final.usage
            observe = getattr(d.builder, "observe_usage", None)
            if observe is not None and reports_real_usage(d.model):
                observe(ctx, final.usage)  # lets an estimating token counter calibrate itself
        seen: set[str] = set()
        for c in final.tool_calls:  # results must pair with calls one to one
            if not c.id or c.id in seen:
                c.id = new_id("call")
            seen.add(c.id)
        if self._parallel is not None:  # nothing is committed before they pass
            await self._parallel
            self._parallel = None
        guards = self.agent.guardrails
        if not final.tool_calls and guards is not None and guards.has("output"):
            checked = await guards.check_output(final.text, self.calls.context(self.message))
            self.calls.note(checked)  # a trip: the answer is never committed nor returned
            final = final.model_copy(update={"text": checked.value})
        if final.tool_calls and guards is not None:  # the text beside calls, their arguments
            redacted = guards.redact_response(final)
            self.calls.note(redacted)
            final = redacted.value
        calls = [c.model_dump() for c in final.tool_calls]
        if calls:
            j.notice(ev.LlmToolCalls, tool_calls=calls)
        # Held into the calls' "started" commit (one fsync, not two) unless a user hook runs in
        # between (the permission check reads no transcript; what it decides is a commit).
        hold = bool(calls) and not any(
            hasattr(h, "after_llm_response") or hasattr(h, "before_tool_execution")
            for h in self.agent.hooks
        )
        await j.commit(
            [
                j.event(
                    ev.LlmComplete,
                    answer=final.text,
                    tool_calls=calls,
                    tool_call_count=len(calls),
                    finish_reason=final.finish_reason,
                    usage=final.usage.model_dump() if final.usage else None,
                    model=final.model,
                    parts=list(final.parts),
                )
            ],
            hold=hold,
        )
        self.calls.unanswered.update((c.id, c) for c in final.tool_calls)
        if self.max_cost is not None and not (  # the answer is kept; its calls do not run
            self.usage.cost is not None and self.usage.cost <= self.max_cost
        ):
            spent = (
                "an unknown amount (a model without a price)"
                if self.usage.cost is None
                else f"${self.usage.cost:g}"
            )
            raise _Stop("cost_limit", f"the run cost {spent}, over its max_cost ${self.max_cost:g}")
        return final

    async def _review(self, answer: str) -> bool:
        """Judge a final answer; True when the loop should ask the model again."""
        from loom.judge.turn import review_answer

        panel, j = self.agent.judges, self.j
        assert panel is not None
        attempt = int((self.verdict or {}).get("attempt", 0)) + 1
        j.announce(
            ev.JudgeStart,
            attempt=attempt,
            answer=answer,
            extra={
                "judges": list(panel.names),
                "strategy": panel.strategy,
                "threshold": panel.threshold,
            },
        )
        review = await review_answer(
            panel,
            self.message,
            answer,
            j.history,
            self.verdict,
            can_iterate=self.iteration < self.max_iterations,
            session_id=self.session_id,
            run_id=self.run_id,
        )
        self.verdict = review.verdict
        await j.commit([j.event_of(ev.EventType.JUDGE_RESULT, review.verdict)])
        if review.retry is None:
            return False
        await j.commit([j.event(ev.JudgeRetry, **review.retry)])
        return True

    async def _check_output(self, answer: str, truncated: bool = False) -> bool:
        """Validate a final answer against the output type; True when the model must answer
        again (the correction is committed), ``_Stop("output_invalid")`` when it gave up."""
        assert self.typed is not None
        decision = check_answer(
            self.typed,
            answer,
            self.output_failures,
            self.agent.output_retries,
            truncated=truncated,
        )
        if isinstance(decision, Accept):
            self.data = decision.value
            return False
        self.output_failures += 1
        if isinstance(decision, GiveUp):
            raise _Stop("output_invalid", decision.error)
        await self.j.commit(
            [
                self.j.event(
                    ev.OutputRetry,
                    attempt=self.output_failures,
                    errors=decision.errors,
                    correction=decision.correction,
                )
            ]
        )
        return True

    def _set_state(self, state: AgentState) -> None:
        if state is not self.state:
            self.j.notice(ev.StateChange, from_state=self.state._value_, to_state=state._value_)
            self.state = self.hctx.state = state

    # -- PERSIST ----------------------------------------------------------------------------------
    async def _finish(self, stop: StopReason, error: str | None, started: float) -> None:
        """PERSIST: close every open call, record the run's end, announce AGENT_FINISH."""
        j = self.j
        if self._parallel is not None and not self._parallel.done():
            self._parallel.cancel()
        failed = stop in ("error", "model_error")
        self._set_state(
            S.SHUTTING_DOWN
            if stop == "cancelled"
            else S.ERROR
            if failed
            else S.WAITING_FOR_USER_INPUT
        )
        j.announce(ev.PersistStart)
        if error is not None and stop not in ("completed", "max_iterations", "max_tool_calls"):
            extra: dict[str, Any] = {"stop_reason": stop}
            if self.budget_stop is not None:
                extra["budget"] = self.budget_stop
            j.announce(ev.ErrorEvent, error=error, extra=extra)
        calls = getattr(self, "calls", None)
        if calls is not None:
            await calls.close_unanswered(stop)
        parked = calls.parked if calls is not None else []
        if self.typed is not None and stop == "completed" and self.data is None:
            with contextlib.suppress(Exception):  # a carried-on run that had already answered
                self.data = self.typed.parse(self.output)
        self.result = RunResult(
            output=self.output if self.typed is None else self.data,
            text=self.output,
            # a quiet run's held result goes into the end's commit below: it is this run's too
            messages=j.added if j.held is None else [*j.added, *j.held[1]],
            usage=self.usage,
            session_id=self.session_id,
            run_id=self.run_id,
            stop_reason=stop,
            iterations=self.iteration,
            error=error,
            verdict=self.verdict,
            pending_approvals=parked,
            warnings=j.warnings,
            pending_query=self.pending_query,
        )
        if calls is not None:
            try:
                await self.hooks("after_iteration_end", self.result)
            except HookError as exc:
                j.announce(ev.ErrorEvent, error=str(exc), fatal=True)
        finish = j.event(
            ev.AgentFinish,
            stop_reason=stop,
            output=self.output,
            usage=self.usage.model_dump(),
            iterations=self.iteration,
            error=error,
            duration_ms=(time.perf_counter() - started) * 1000,
            pending_approvals=parked,
            warnings=list(j.warnings),
            pending_query=self.pending_query,
        )
        data = {
            "error": error,
            "verdict": self.verdict,
            "pending_approvals": parked,
            "cost": self.usage.cost,
        }
        await j.commit(
            [finish], run=RunRecord(self.run_id, self.session_id, stop, self.usage, data=data)
        )


async def _settle(check: Any, note: Callable[[Any], None]) -> None:
    note(await check)  # raises Tripped on a trip


def _window(d: RunDeps) -> int | None:
    window_of = getattr(d.builder, "window_of", None)
    return window_of(d.agent, d.model)[0] if window_of is not None else None
