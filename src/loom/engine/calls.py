"""EXECUTE's tool half: screen each call, start it, run the batch concurrently, record results.

For one model answer's tool calls: limits and ``before_tool_execution`` hooks screen each call
(deny, rewrite arguments, or ask a human); the calls that may run get ``started`` ledger rows,
committed before any of them runs; they run together, each under its own timeout; each result
is shaped (error channel, large results) and committed with its ``TOOL_RESULT`` /
``TOOL_ERROR`` event and ledger end, **in call order** (seed 000): a result that finishes early
waits, in memory, for the calls before it. Everything is written through the run's ``Journal``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loom.engine.branching import repeat_reason, repeats_of
from loom.engine.recovery import CRASHED, LooseEnds, call_of, never_started, outcome_unknown
from loom.events import (
    ApprovalDecisionEvent,
    ApprovalRequired,
    GuardrailEvent,
    RunRecovered,
    ToolErrorEvent,
    ToolExecutionStart,
    ToolResultEvent,
)
from loom.guardrails.base import GuardrailContext
from loom.guardrails.engine import Outcome, Tripped
from loom.hooks import Deny, HookRunner, ReplaceArguments, RequireApproval
from loom.messages import ToolCall, ToolResult
from loom.policy.approval import (
    Edit,
    PendingApproval,
    apply_decision,
    ask_handler,
    decision_payload,
    remember_rules,
)
from loom.store.base import LedgerEntry, LedgerStatus, RunRecord
from loom.tools.base import RunContext
from loom.tools.executor import error_result, execute_call

if TYPE_CHECKING:
    from loom.engine.journal import Journal
    from loom.engine.run_deps import RunDeps
    from loom.events import AgentEvent

__all__ = ["CallRunner"]


class CallRunner:
    """Runs one turn's tool calls and records their results (see the module docstring)."""

    def __init__(self, deps: RunDeps, journal: Journal, hooks: HookRunner) -> None:
        self.deps, self.journal, self.hooks = deps, journal, hooks
        self.agent = deps.agent
        self.made = 0  # executions this turn (max_tool_calls)
        self.open: dict[str, LedgerEntry] = {}  # started, not ended
        self.unanswered: dict[str, ToolCall] = {}  # in a committed assistant message, no result
        self.parked: list[dict[str, Any]] = []  # waiting for a human; the run stops after
        self.decided: set[str] = set()  # approved at resume: run without asking again
        # calls a human edited: their results say with which arguments they ran, because the
        # committed assistant message (what the model and the transcript show) has the old ones
        self.edited: dict[str, dict[str, Any]] = {}
        self.guards = self.agent.guardrails  # loom.guardrails.Guardrails, or None
        self.closing = False  # PERSIST: a result guardrail's trip no longer stops anything
        # Hold a pure or idempotent call's result into the next commit (the next model
        # answer's): set by the turn when nobody watches it live (``Journal``'s docstring).
        self.fold_results = False
        # the session's SESSION_BRANCH events, read once per turn at its first at_most_once
        # call (the repeat gate, ``_repeats``); None until then
        self._branches: list[AgentEvent] | None = None

    async def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Screen, start and run ``calls``; their results in call order (parked ones omitted)."""
        slots: list[Any] = []  # per call: a refusal result, a task, or None (parked)
        to_run: list[ToolCall] = []
        for i, call in enumerate(calls):
            runnable, refusal = await self._screen(i, call)
            if refusal is not None:
                slots.append((call, refusal))
            elif runnable is not None:
                slots.append((runnable, None))
                to_run.append(runnable)
            else:
                slots.append(None)
        self.made += len(to_run)
        if to_run:
            await self.start(to_run)
        tasks = {c.id: asyncio.ensure_future(self.execute(c)) for c in to_run[1:]}
        results: list[ToolResult] = []
        try:
            for slot in slots:  # in call order; later calls keep running meanwhile
                if slot is None:
                    continue
                call, refusal = slot
                if refusal is not None:
                    results.append(await self.record(call, refusal, started=False))
                    continue
                task = tasks.get(call.id)
                result = await (task if task is not None else self.execute(call))
                results.append(await self.record(call, result, hold=self.fold_results))
        finally:
            for t in tasks.values():
                t.cancel()
        return results

    async def _screen(
        self, index: int, call: ToolCall
    ) -> tuple[ToolCall | None, ToolResult | None]:
        """Limits, hooks and approval for one call: (call to run, or None) and a refusal."""
        limit = self.deps.max_tool_calls  # this run's (RunOptions), else the agent's
        if self.made + index >= limit:
            return None, error_result(
                call, "limit", f"not run: the turn reached max_tool_calls={limit}"
            )
        ask: RequireApproval | None = None
        for hook in self.hooks.at("before_tool_execution"):
            decision = await self.hooks.call("before_tool_execution", hook, call)
            if isinstance(decision, Deny):
                return None, error_result(call, "denied", decision.reason)
            if isinstance(decision, ReplaceArguments):
                call = call.model_copy(
                    update={"arguments": decision.arguments, "raw_arguments": None}
                )
            ask = ask or (decision if isinstance(decision, RequireApproval) else None)
        if self.guards is not None and self.guards.has("tool_call"):
            checked = await self.guards.check_call(call, self.context())
            if checked.trip is not None:  # the call gets its refusal, then the run stops
                await self.record(
                    call, error_result(call, "guardrail", checked.trip.reason), started=False
                )
            self.note(checked)
            call = checked.value
        if call.id in self.decided:  # a human approved it at resume: it runs, once
            self.decided.discard(call.id)
            return call, None
        repeat = await self._repeats(call)
        if repeat is not None:
            return await self._approval(call, repeat)
        if ask is None:
            return call, None
        return await self._approval(call, ask.reason)

    async def _repeats(self, call: ToolCall) -> str | None:
        """The repeat gate (``loom.engine.branching``): why ``call`` waits for approval when it
        repeats, with the same arguments, an ``at_most_once`` call of a turn a branch undid,
        or None. The agent's ``branch_effects="allow"`` turns it off. The session's branch
        events are read once per turn, at its first ``at_most_once`` call."""
        if self.agent.branch_effects == "allow" or self.deps.effect_of(call.name) != "at_most_once":
            return None
        if self._branches is None:
            from loom.events import EventType
            from loom.store.base import capabilities_of

            store, sid = self.deps.store, self.journal.session_id
            typed = capabilities_of(store).typed_events
            wanted = [EventType.SESSION_BRANCH]
            self._branches = (
                await typed.load_events_of_type(sid, wanted)
                if typed is not None
                else [e for e in await store.load_events(sid) if e.type in wanted]
            )
        repeated = repeats_of(self._branches, call.name, dict(call.arguments))
        return None if repeated is None else repeat_reason(self._branches, repeated)

    async def _approval(
        self, call: ToolCall, reason: str
    ) -> tuple[ToolCall | None, ToolResult | None]:
        j = self.journal
        p = PendingApproval(
            j.session_id, j.run_id, call.id, call.name, dict(call.arguments), reason
        )
        await j.commit(
            [
                j.event(
                    ApprovalRequired,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    arguments=dict(call.arguments),
                    reason=reason,
                )
            ]
        )
        handler = self.agent.approval_handler
        if handler is None:  # parked until a human decides (resume)
            self.parked.append(p.to_dict())
            self.unanswered.pop(call.id, None)
            return None, None
        decision = await ask_handler(handler, p)
        await self.decide(p, decision, "handler")
        return apply_decision(call, decision)

    async def decide(self, p: PendingApproval, decision: Any, how: str) -> None:
        """Commit a decision on a pending call; "always"/"never" apply to the rest of the
        session (they are read back from this event by later turns, in any process)."""
        rules = remember_rules(p, decision, self.deps.tools.get(p.tool_name))
        self.deps.remembered.extend(rules)
        if isinstance(decision, Edit):
            self.edited[p.tool_call_id] = dict(decision.arguments)
        j = self.journal
        data = decision_payload(p, decision, how, rules)
        extra = {
            k: v
            for k, v in data.items()
            if k not in ("tool_call_id", "tool_name", "decision", "decided_by")
        }
        await j.commit(
            [
                j.event(
                    ApprovalDecisionEvent,
                    tool_call_id=p.tool_call_id,
                    tool_name=p.tool_name,
                    decision=data["decision"],
                    decided_by=how,
                    extra=extra,
                )
            ]
        )

    async def start(self, calls: Sequence[ToolCall]) -> None:
        """Ledger rows ``started`` for the calls, committed before any of them runs."""
        j, sid = self.journal, self.journal.session_id
        rows = [
            LedgerEntry(
                j.run_id, sid, c.id, c.name, "started", c.arguments, self.deps.effect_of(c.name)
            )
            for c in calls
        ]
        self.open.update((r.tool_call_id, r) for r in rows)
        events = [
            j.event(ToolExecutionStart, tool_name=c.name, tool_call_id=c.id, arguments=c.arguments)
            for c in calls
        ]
        await j.commit(events, ledger=rows)

    async def execute(self, call: ToolCall, run_id: str | None = None) -> ToolResult:
        """Run one call (``run_id``: the run whose idempotency key a recovered call keeps)."""
        d, j = self.deps, self.journal
        run = run_id or j.run_id
        ctx = RunContext(
            j.session_id,
            run,
            call.id,
            self.agent.name,
            self.agent.workspace,
            d.user_deps,
            store=d.store,
            owner=d.owner,
        )
        setting = getattr(self.agent, "sandbox", None)
        if setting is not None:
            from loom.sandbox.sessions import SandboxAccess

            ctx.sandbox = SandboxAccess(
                d.sandboxes, setting, j.session_id, run, self.agent.workspace
            )
        return await execute_call(call, d.tools, ctx, self.agent.tool_timeout)

    async def record(
        self,
        call: ToolCall,
        result: ToolResult,
        *,
        started: bool = True,
        entry: LedgerEntry | None = None,
        metadata: dict[str, Any] | None = None,
        hold: bool = False,
    ) -> ToolResult:
        """Shape a call's result, commit it (event, transcript message, ledger end), then run
        the ``after_tool_execution`` hooks. ``hold``: commit a ``pure`` or ``idempotent``
        call's result with the next step (recovery can run such a call again if the process
        dies first); an ``at_most_once`` call's result is always committed at once."""
        j = self.journal
        tripped = None
        if self.guards is not None and self.guards.has("tool_result"):
            # before the shaper: the error and large-result stores get the checked result too
            checked = await self.guards.check_result(call, result, self.context())
            result, tripped = checked.value, checked.trip
            self.note(checked, stop=False)
            if tripped is not None:
                result = error_result(call, "guardrail", f"result withheld: {tripped.reason}")
        shaper = self.deps.shaper
        if shaper is not None:  # the ledger keeps what the model saw; full text lives aside
            result = await shaper(j.session_id, j.run_id, call, result)
        ledger = []
        entry = entry or (self.open.pop(call.id, None) if started else None)
        if entry is not None:
            status: LedgerStatus = "completed" if result.success else "failed"
            if result.error_code == "interrupted":
                status = "interrupted"
            ledger.append(entry.ended(status, result))
        if result.metadata.get("escaped_strings"):
            j.warn(
                f"{call.name} returned text that was not valid Unicode (bytes that were "
                "not UTF-8); it is stored with those bytes shown as \\xNN escapes",
                "tool",
            )
        cls = ToolResultEvent if result.success else ToolErrorEvent
        content, meta = result.to_content(), metadata or {}
        edited = self.edited.pop(call.id, None)
        if edited is not None:
            shown = json.dumps(edited, ensure_ascii=False, default=str)
            content = f"(run with the arguments the user edited them to: {shown})\n{content}"
            meta = {**meta, "edited_arguments": edited}
        ev = j.event(
            cls,
            tool_name=call.name,
            tool_call_id=call.id,
            success=result.success,
            content=content,
            error_code=result.error_code,
            duration_ms=result.duration_ms,
            metadata=meta,
            parts=list(result.parts),  # media the tool returned: stored once, by the journal
        )
        hold = hold and tripped is None and entry is not None and entry.effect != "at_most_once"
        await j.commit([ev], ledger=ledger, hold=hold)
        self.unanswered.pop(call.id, None)
        await self.hooks("after_tool_execution", call, result)
        if tripped is not None and not self.closing:
            raise Tripped(tripped)
        return result

    def context(self, message: str | None = None) -> GuardrailContext:
        """What a guardrail sees of this turn (``message``: the user's, else the last one)."""
        j = self.journal
        if message is None:
            message = next((m.content for m in reversed(j.history) if m.role == "user"), "")
        return GuardrailContext(
            self.agent.name, j.session_id, j.run_id, message, j.history, self.deps.user_deps
        )

    def note(self, outcome: Outcome, *, stop: bool = True) -> None:
        """Announce each guardrail decision (journaled with the next commit: the checked
        message's, result's or answer's, or the run's end); raise ``Tripped`` on a trip."""
        j = self.journal
        for r in outcome.records:
            j.announce(GuardrailEvent, **r.data())
            if r.action == "warn":
                j.warn(f"guardrail {r.guardrail!r} ({r.kind}) raised: {r.error}", "guardrail")
        if stop and outcome.trip is not None:
            raise Tripped(outcome.trip)

    async def recover(self, ends: LooseEnds) -> None:
        """INTAKE: close what dead runs left open (found by ``loom.engine.recovery``)."""
        j = self.journal
        if ends.ledger_only:
            await j.commit([], ledger=[e.ended("interrupted", None) for e in ends.ledger_only])
        for e in ends.rerun:  # the same idempotency key as the first attempt
            call = call_of(e)
            result = await self.execute(call, run_id=e.run_id)
            await self.record(
                call, result, entry=e, metadata={"recovered": "rerun", "from_run": e.run_id}
            )
        for e in ends.unknown:
            call = call_of(e)
            meta = {"recovered": "interrupted", "from_run": e.run_id}
            await self.record(call, outcome_unknown(call), entry=e, metadata=meta)
        for call in ends.never_ran:
            await self.record(
                call, never_started(call), started=False, metadata={"recovered": "never_started"}
            )
        for run in ends.dead_runs:
            await j.commit(
                [j.event(RunRecovered, recovered_run_id=run.run_id)],
                run=RunRecord(run.run_id, j.session_id, CRASHED, data={"recovered_by": j.run_id}),
            )

    async def close_unanswered(self, stop: str) -> None:
        """PERSIST: every call still without a result gets an ``interrupted`` one (a call
        whose answer was lost with a failed commit is in no transcript: it needs none)."""
        self.closing = True
        if not self.unanswered:
            return
        asked = {c.id for m in self.journal.history if m.role == "assistant" for c in m.tool_calls}
        for call in list(self.unanswered.values()):
            if call.id not in asked:
                continue
            await self.record(
                call,
                error_result(
                    call,
                    "interrupted",
                    f"the run stopped ({stop}) before this call finished; its outcome is unknown",
                ),
            )
