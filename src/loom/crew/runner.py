"""Runs one crew run's plan: each node type, each member run, on a ``Runtime``.

Every member run is a turn of the member's agent in its own child session
(``<crew session>:<path>``) with the crew run as ``parent_run_id``, started with
``Runtime.start`` (the front door) and driven with ``turn.run(emit)``: the crew never touches
an agent's or a turn's internals. A member run that an earlier, interrupted run of the crew
started and never finished is carried on (``CarryOn()``: the child turn recovers its open calls
and the model goes on) instead of being sent its message again. What a member run gets that its
definition does not have (its budget-checked model, the crew tools meant for it) is that run's
``RunOptions``, so the shared ``Agent`` is never changed nor copied, and parallel members hold
nothing in common.
"""

from __future__ import annotations

import asyncio
import dataclasses
import graphlib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loom.crew.budget import BudgetedModel, BudgetScope
from loom.crew.context import ContextPolicy, parse_policy, render_messages
from loom.crew.log import asked_by
from loom.crew.plan import (
    Graph,
    Handoff,
    Loop,
    Manager,
    Node,
    Parallel,
    Router,
    Sequential,
    Step,
    node_of,
)
from loom.crew.remote import RemoteAgent
from loom.crew.result import MemberResult
from loom.crew.state import SharedState, state_tools
from loom.crew.tools import CrewTool, choice_tool
from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE, CarryOn, Resume, RunOptions
from loom.errors import BudgetExceeded, RemoteMemberError, ToolError
from loom.events import AgentEvent, CrewMemberFinish, CrewMemberStart
from loom.messages import Message, Usage
from loom.tools.base import RunContext

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.crew.log import CrewLog
    from loom.crew.spec import CrewSpec
    from loom.engine.runtime import Runtime

__all__ = ["Handover", "Outcome", "Runner", "tag"]

SUMMARY_INSTRUCTIONS = (
    "Summarize the work below for a colleague who will continue it: the decisions, the facts "
    "found, the open questions. Be brief; do not add anything that is not in it."
)


def tag(event: AgentEvent, path: str) -> AgentEvent:
    """A copy of ``event`` tagged with the member path (``extra["member_path"]``); the journaled
    event itself is never changed."""
    return dataclasses.replace(event, extra={**event.extra, "member_path": path})


@dataclass(slots=True)
class Handover:
    """What flows along an edge: the text the sender wrote and the member runs behind it."""

    text: str
    senders: list[MemberResult] = field(default_factory=list)


@dataclass(slots=True)
class Outcome:
    """A node's result: its output, whether it succeeded, and the member runs that wrote it."""

    output: str
    ok: bool = True
    error: str | None = None
    senders: list[MemberResult] = field(default_factory=list)

    def handover(self) -> Handover:
        return Handover(self.output, self.senders)


@dataclass(slots=True)
class _LoopFrame:
    exit_requested: bool = False


class Runner:
    """One crew run in progress (made by ``Crew``)."""

    def __init__(
        self,
        crew: CrewSpec,
        runtime: Runtime,
        log: CrewLog,
        scope: BudgetScope,
        state: SharedState | None,
        task: str,
        done: dict[str, CrewMemberFinish],
        depth: int,
        root: str,
        emit: Callable[[AgentEvent], None] | None,
        deps: Any,
        approvals: Any = None,
        interrupted: Mapping[str, CrewMemberStart] | None = None,
        owner: str | None = None,
    ) -> None:
        self.crew, self.runtime, self.log, self.scope = crew, runtime, log, scope
        # member runs (by key) the run this one resumes started and never finished
        self.interrupted = dict(interrupted or {})
        self.state, self.task, self.done, self.depth = state, task, done, depth
        self.root, self.emit, self.deps = root, emit, deps
        self.owner = owner  # the crew run's: every member run (and nested crew) acts for it
        self.approvals = approvals  # Crew.resume's decisions: member path -> decision(s)
        self._slots: list[MemberResult | None] = []  # in start order
        self._seen: dict[str, int] = {}
        self._unmetered: set[str] = set()  # remote members already warned about

    @property
    def results(self) -> list[MemberResult]:
        """Every member run so far that has ended, in the order they started."""
        return [r for r in self._slots if r is not None]

    def _put(self, slot: int, r: MemberResult) -> MemberResult:
        self._slots[slot] = r
        return r

    # -- nodes ----------------------------------------------------------------------------------
    async def node(
        self, node: Node | str, hand: Handover, path: str, loops: tuple[_LoopFrame, ...] = ()
    ) -> Outcome:
        n = node_of(node)
        here = f"{path}/{n.name}" if n.name else path
        if isinstance(n, Step):
            return await self._step(n, hand, here, loops)
        if isinstance(n, Sequential):
            return await self._sequential(n, hand, here, loops)
        if isinstance(n, Parallel):
            return await self._parallel(n, hand, here, loops)
        if isinstance(n, Router):
            return await self._router(n, hand, here, loops)
        if isinstance(n, Loop):
            return await self._loop(n, hand, here, loops)
        if isinstance(n, Graph):
            return await self._graph(n, hand, here, loops)
        if isinstance(n, Manager):
            return await self._manager(n, hand, here, loops)
        return await self._handoff(n, hand, here, loops)

    async def _step(
        self, s: Step, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        policy = parse_policy(s.context)
        context = await self.context_for(policy, hand, path)
        message = self._fill(s.task, context)
        extra = self._loop_tools(loops)
        r = await self.run_member(s.member, message, f"{path}/{s.member}", str(policy), extra)
        return self._outcome(r)

    async def _sequential(
        self, s: Sequential, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        out = Outcome(hand.text, senders=hand.senders)
        for child in s.steps:
            out = await self.node(child, out.handover(), path, loops)
            if not out.ok:  # the next step has nothing to work from: stop, say where
                return out
        return out

    async def _parallel(
        self, p: Parallel, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        self.scope.check_spawn_width(len(p.steps))
        outs: list[Outcome | None] = [None] * len(p.steps)

        async def one(i: int, child: Node) -> None:
            try:
                outs[i] = await self.node(child, hand, path, loops)
            except BudgetExceeded:
                raise
            except Exception as exc:  # a member that raised: a recorded failure, not a crash
                outs[i] = Outcome("", ok=False, error=f"{type(exc).__name__}: {exc}")
            if p.fail_fast and not outs[i].ok:  # type: ignore[union-attr]
                raise _FailFast(i)

        try:
            async with asyncio.TaskGroup() as tg:
                for i, child in enumerate(p.steps):
                    tg.create_task(one(i, child))
        except* _FailFast:
            pass
        except* BudgetExceeded as group:
            raise group.exceptions[0] from None
        self._budget_gate()
        parts, senders, failures = [], [], []
        for child, out in zip(p.steps, outs, strict=True):
            label = _label(child)
            if out is None:
                failures.append(f"{label}: cancelled (fail_fast)")
                continue
            senders.extend(out.senders)
            if out.ok:
                parts.append(f"## {label}\n{out.output}")
            else:
                failures.append(f"{label}: {out.error}")
                parts.append(f"## {label}\n(failed: {out.error})")
        ok = not failures if p.fail_fast else len(failures) < len(p.steps)
        error = "; ".join(failures) or None
        return Outcome("\n\n".join(parts), ok=ok, error=error, senders=senders)

    async def _router(
        self, r: Router, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        names = list(r.branches)
        choice: str | None
        if r.route is not None:
            try:
                choice = r.route(hand.text)
            except Exception as exc:
                return Outcome(
                    "", ok=False, error=f"router predicate raised {type(exc).__name__}: {exc}"
                )
        else:
            picked: list[str] = []

            async def choose(ctx: RunContext, args: dict[str, Any]) -> str:
                picked.append(args["branch"])
                return f"branch {args['branch']!r} chosen; end your turn with one short line"

            tool = choice_tool(
                "choose_branch",
                "Choose which branch handles this; the only valid names are the enum's.",
                "branch",
                names,
                choose,
            )
            assert r.by is not None
            # the chooser must choose: its first call is forced to choose_branch (a small
            # model otherwise answers in prose and the router falls back to its default)
            res = await self.run_member(
                r.by, hand.text, f"{path}/{r.by}", "brief", [tool], tool_choice="choose_branch"
            )
            if not res.ok:
                return self._outcome(res)
            choice = picked[-1] if picked else None
        if choice is None or choice not in r.branches:
            if r.default is None:
                why = (
                    f"the router chose {choice!r}, which names no branch (branches: "
                    f"{', '.join(names)}) and there is no default"
                )
                return Outcome("", ok=False, error=why)
            self.log.warn(f"{path}: the router chose {choice!r}, no branch; ran {r.default!r}")
            choice = r.default
        return await self.node(r.branches[choice], hand, path, loops)

    async def _loop(
        self, lp: Loop, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        frame = _LoopFrame()
        inner = (*loops, frame) if lp.exit_tool else (*loops, _NO_EXIT)
        out = Outcome(hand.text, senders=hand.senders)
        for _ in range(lp.max_iterations):
            out = await self.node(lp.body, out.handover(), path, inner)
            if not out.ok or frame.exit_requested:
                return out
            if lp.until is not None and lp.until(out.output):
                return out
        self.log.warn(f"{path}: the loop stopped at max_iterations={lp.max_iterations}")
        return out

    async def _graph(
        self, g: Graph, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        sorter = graphlib.TopologicalSorter({n: list(t.depends_on) for n, t in g.tasks.items()})
        sorter.prepare()
        outs: dict[str, Outcome] = {}
        running: dict[asyncio.Task[Outcome], str] = {}
        try:
            while sorter.is_active():
                start = []
                for name in sorter.get_ready():
                    t = g.tasks[name]
                    bad = [d for d in t.depends_on if not outs[d].ok]
                    if bad:  # a dependency failed: this task cannot run; say so, go on
                        outs[name] = Outcome(
                            "", ok=False, error=f"skipped: {', '.join(bad)} failed"
                        )
                        sorter.done(name)
                    else:
                        start.append(name)
                if start:
                    self.scope.check_spawn_width(len(running) + len(start))
                for name in start:
                    t = g.tasks[name]
                    if t.depends_on:
                        deps = [outs[d] for d in t.depends_on]
                        text = (
                            deps[0].output
                            if len(deps) == 1
                            else "\n\n".join(
                                f"## {d}\n{o.output}"
                                for d, o in zip(t.depends_on, deps, strict=True)
                            )
                        )
                        h = Handover(text, [s for o in deps for s in o.senders])
                    else:
                        h = hand
                    step = Step(t.member, task=t.task, context=t.context)
                    running[asyncio.ensure_future(self._step(step, h, f"{path}/{name}", loops))] = (
                        name
                    )
                if not running:
                    continue
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for fut in finished:
                    name = running.pop(fut)
                    try:
                        outs[name] = fut.result()
                    except BudgetExceeded:
                        raise
                    except Exception as exc:
                        outs[name] = Outcome("", ok=False, error=f"{type(exc).__name__}: {exc}")
                    sorter.done(name)
        finally:
            for fut in running:
                fut.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        self._budget_gate()
        needed = {d for t in g.tasks.values() for d in t.depends_on}
        sinks = [n for n in g.tasks if n not in needed]
        failures = [f"{n}: {o.error}" for n, o in outs.items() if not o.ok]
        text = (
            outs[sinks[0]].output
            if len(sinks) == 1
            else "\n\n".join(f"## {n}\n{outs[n].output}" for n in sinks)
        )
        senders = [s for n in sinks for s in outs[n].senders]
        return Outcome(text, ok=not failures, error="; ".join(failures) or None, senders=senders)

    async def _manager(
        self, m: Manager, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        used = 0
        inflight = 0

        async def delegate(ctx: RunContext, args: dict[str, Any]) -> str:
            nonlocal used, inflight
            worker = args["member"]
            if worker not in m.workers:  # validate() already refused it; never run a stranger
                raise ToolError(f"{worker!r} is not a worker of this crew", code="not_a_member")
            if used >= m.max_delegations:
                raise ToolError(
                    f"delegation limit reached ({m.max_delegations}); answer with what you have",
                    code="delegation_limit",
                )
            used += 1
            inflight += 1
            try:
                self.scope.check_spawn_width(inflight)
                res = await self.run_member(
                    worker, args["task"], f"{path}/{m.manager}/{worker}", "brief", []
                )
            finally:
                inflight -= 1
            if not res.ok:
                return f"{worker} did not finish ({res.stop_reason}): {res.error}"
            return res.output

        manager_agent = self.crew.members[m.manager]
        timeout = float(getattr(manager_agent, "timeout", 600.0))
        tool = choice_tool(
            "delegate",
            "Give a task to one of your workers and get its answer. "
            "member must be one of the enum; task is a complete, self-contained "
            "brief (the worker sees nothing else).",
            "member",
            list(m.workers),
            delegate,
            extra={"task": {"type": "string"}},
        )
        tool.timeout = timeout
        context = await self.context_for(ContextPolicy("brief"), hand, path)
        res = await self.run_member(m.manager, context, f"{path}/{m.manager}", "brief", [tool])
        return self._outcome(res)

    async def _handoff(
        self, h: Handoff, hand: Handover, path: str, loops: tuple[_LoopFrame, ...]
    ) -> Outcome:
        policy = parse_policy(h.context)
        current, message, hops = h.start, hand.text, 0
        while True:
            moved: list[tuple[str, str]] = []
            tool = _transfer_tool(moved, [x for x in h.members if x != current])
            res = await self.run_member(
                current,
                message,
                f"{path}/{current}",
                "brief" if hops == 0 else str(policy),
                [tool, *self._loop_tools(loops)],
            )
            if not res.ok or not moved:
                return self._outcome(res)
            hops += 1
            if hops > h.max_handoffs:
                return Outcome(
                    res.output,
                    ok=False,
                    error=f"more than max_handoffs={h.max_handoffs} transfers",
                    senders=[res],
                )
            target, brief = moved[0]
            sent = Handover(brief, [res])
            message = (
                brief if policy.kind == "brief" else await self.context_for(policy, sent, path)
            )
            current = target

    # -- context --------------------------------------------------------------------------------
    async def context_for(self, policy: ContextPolicy, hand: Handover, path: str) -> str:
        """The text a receiving member gets under ``policy`` (see ``loom.crew.context``)."""
        if policy.kind == "none":
            text = self.task
        elif policy.kind == "brief" or not hand.senders:
            text = hand.text
        elif policy.kind == "summary":
            text = await self._summary(hand.senders, path)
        else:
            blocks = []
            for s in hand.senders:
                msgs = s.messages if policy.kind == "full" else s.messages[-policy.n :]
                blocks.append(f"From {s.path}:\n{render_messages(msgs) or s.output}")
            text = "\n\n".join(blocks)
        return await self._by_reference(text, path)

    async def _summary(self, senders: list[MemberResult], path: str) -> str:
        from loom.agent import Agent

        work = "\n\n".join(
            f"From {s.path}:\n{render_messages(s.messages) or s.output}" for s in senders
        )
        agent = self.crew.summarizer
        if agent is None:
            # the sender's model; a nested crew has none of its own: then the first agent's
            candidates = [self.crew.members.get(senders[-1].member), *self.crew.members.values()]
            source = next((m for m in candidates if isinstance(m, Agent)), None)
            model = self.runtime.model_for(source) if source is not None else None
            agent = Agent(name="summarizer", instructions=SUMMARY_INSTRUCTIONS, model=model)
        res = await self.spawn(agent, "summarizer", work, f"{path}/summary", "full", [])
        return res.output if res.ok else work  # a failed summary hands over the work itself

    async def _by_reference(self, text: str, path: str) -> str:
        limit = self.crew.ref_threshold
        if limit is None or self.state is None or len(text) <= limit:
            return text
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        ref = await self.state.put_ref(f"ref:{digest}", text)
        return (
            f"[{len(text):,} characters handed over by reference: call state_get with key "
            f"{ref!r} to read them]\n{text[: limit // 4]}…"
        )

    def _fill(self, template: str | None, context: str) -> str:
        if template is None:
            return context
        return template.replace("{input}", context).replace("{task}", self.task)

    # -- member runs ----------------------------------------------------------------------------
    def _loop_tools(self, loops: tuple[_LoopFrame, ...]) -> list[CrewTool]:
        if not loops or loops[-1] is _NO_EXIT:
            return []
        frame = loops[-1]  # the nearest loop only: an inner exit never stops an outer loop

        async def exit_loop(ctx: RunContext, args: dict[str, Any]) -> str:
            frame.exit_requested = True
            return "the loop will stop after this pass; finish your answer"

        return [
            CrewTool(
                "exit_loop",
                "Stop the loop you are in once this pass ends (the work is done).",
                {},
                exit_loop,
            )
        ]

    async def run_member(
        self,
        name: str,
        message: str,
        path: str,
        policy: str,
        extra_tools: Sequence[CrewTool],
        *,
        tool_choice: str | None = None,
    ) -> MemberResult:
        """Run member ``name`` (an agent or a nested crew) on ``message`` at ``path``;
        ``tool_choice`` forces an agent member's first call (a router's chooser)."""
        member = self.crew.members[name]
        return await self.spawn(
            member, name, message, path, policy, extra_tools, tool_choice=tool_choice
        )

    async def spawn(
        self,
        member: Agent | CrewSpec | RemoteAgent,
        name: str,
        message: str,
        path: str,
        policy: str,
        extra_tools: Sequence[CrewTool],
        *,
        tool_choice: str | None = None,
    ) -> MemberResult:
        from loom.agent import Agent  # not Crew: the crew module imports this one

        digest = hashlib.sha1(message.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        occurrence = f"{path}#{digest}"
        n = self._seen[occurrence] = self._seen.get(occurrence, 0) + 1
        key = f"{occurrence}#{n}"
        child_sid = f"{self.log.session_id}:{path}"
        slot = len(self._slots)
        self._slots.append(None)
        reused = self.done.get(key)
        if reused is not None:  # finished by the interrupted run this one resumes
            r = MemberResult(
                path=path,
                member=name,
                key=key,
                session_id=reused.child_session_id,
                run_id=reused.child_run_id,
                stop_reason=reused.stop_reason,
                output=reused.output,
                usage=Usage(**reused.usage),
                remote=dict(reused.extra.get("a2a") or {}),
                reused=True,
            )
            self._put(slot, r)
            await self.log.member_finish(**_finish_payload(r))
            return r
        depth = self.depth + 1
        if isinstance(member, RemoteAgent):  # its cost is unknown: no cost budget may trust it
            self.scope.check_unmetered(f"the remote (A2A) member {name!r}")
        self.scope.check_spawn(depth)
        guard = self.runtime.budget_guard
        if guard is not None:  # loom.budgets: no member starts once a shared budget is spent
            from loom.budgets import current_tenant, run_owner_of

            await guard.check(
                run_id=self.log.run_id,
                session_id=self.log.session_id,
                owner=self.owner if self.owner is not None else run_owner_of(),
                tenant=current_tenant.get(),
            )
        if isinstance(member, RemoteAgent):
            return await self._remote(member, name, message, path, policy, key, child_sid, slot)
        if not isinstance(member, Agent):  # a nested crew
            return await self._nested(
                member, name, message, path, policy, key, child_sid, depth, slot
            )
        rt = self.runtime
        child_scope = self.scope.child(depth=depth)
        tools: list[Any] = [*extra_tools]  # added to this member run only: the member stays
        if self.state is not None:
            tools.extend(state_tools(self.state))
        options = RunOptions(
            model=BudgetedModel(rt.model_for(member), child_scope),
            extra_tools=tuple(tools),
            deps=self.deps,
            parent_run_id=self.log.run_id,
            tool_choice=tool_choice,
            owner=self.owner,
        )
        if await rt.store.get_session(child_sid) is None:
            made: dict[str, Any] = {
                "crew_session": self.log.session_id,
                "crew_run_id": self.log.run_id,
                "path": path,
            }
            if self.owner is not None:  # a store without a key-value space keeps it here
                made["owner"] = self.owner
            await rt.store.create_session(child_sid, agent_name=member.name, metadata=made)
            kv = rt.capabilities.kv
            if self.owner is not None and kv is not None:
                # the member run finds its session made here, so it records no owner itself:
                # record it as a run records its new session's (loom.engine.loop)
                await kv.put_value(SESSION_OWNER_NAMESPACE, child_sid, self.owner)
        parked = await rt.pending_approvals(child_sid) if self.approvals is not None else []
        if parked:  # parked on an approval by the run this one resumes: decide, never re-ask
            decision = _decision_for(self.approvals, path)
            if decision is None:  # no decision for this member yet: it stays parked
                r = MemberResult(
                    path=path,
                    member=name,
                    key=key,
                    session_id=child_sid,
                    run_id=parked[0].run_id,
                    stop_reason="awaiting_approval",
                    pending_approvals=[p.to_dict() for p in parked],
                )
                await self.log.member_finish(**_finish_payload(r))
                return self._put(slot, r)
            from loom.policy.approval import match_decisions

            match_decisions(decision, parked, child_sid)  # a clear InputError before running
            turn = await rt.start(member, Resume(decision), session_id=child_sid, options=options)
            asker = turn.run_id
        elif (carried := await self._carried(key)) is not None:
            # the interrupted run's message is in the child session already: go on from it
            turn = await rt.start(member, CarryOn(), session_id=child_sid, options=options)
            asker = carried
        else:
            turn = await rt.start(member, message, session_id=child_sid, options=options)
            asker = turn.run_id

        await self.log.member_start(
            path=path,
            member=name,
            key=key,
            child_session_id=child_sid,
            child_run_id=turn.run_id,
            context_policy=policy,
            context=message,
            extra={"asked_by": asker},
        )
        emit = self.emit
        error: str | None = None
        try:
            await turn.run(_discard if emit is None else lambda ev: emit(tag(ev, path)))
        except asyncio.CancelledError:
            r = _result_of(turn, path, name, key, child_sid, "cancelled", "the crew was stopped")
            self._put(slot, r)
            await asyncio.shield(self.log.member_finish(**_finish_payload(r)))
            raise
        except Exception as exc:  # a member that raised is a recorded result, not a crash
            error = f"{type(exc).__name__}: {exc}"
        r = _result_of(turn, path, name, key, child_sid, "error" if error else None, error)
        self._put(slot, r)
        await self.log.member_finish(**_finish_payload(r))
        if r.stop_reason == "budget":
            self._budget_gate()
        return r

    async def _carried(self, key: str) -> str | None:
        """The child run whose message the member run ``key`` carries on, if the run this one
        resumes started it and never finished it (None: run it afresh)."""
        start = self.interrupted.pop(key, None)
        if start is None:
            return None
        return await asked_by(self.runtime.store, start)

    async def _nested(
        self,
        crew: CrewSpec,
        name: str,
        message: str,
        path: str,
        policy: str,
        key: str,
        child_sid: str,
        depth: int,
        slot: int,
    ) -> MemberResult:
        await self.log.member_start(
            path=path,
            member=name,
            key=key,
            child_session_id=child_sid,
            child_run_id="",
            context_policy=policy,
            context=message,
        )
        scope = self.scope.child(crew.budget, depth=depth)
        res = await crew.execute(
            self.runtime,
            message,
            session_id=child_sid,
            scope=scope,
            depth=depth,
            root=path,
            emit=self.emit,
            deps=self.deps,
            parent_run_id=self.log.run_id,
            owner=self.owner,
        )
        r = MemberResult(
            path=path,
            member=name,
            key=key,
            session_id=child_sid,
            run_id=res.run_id,
            stop_reason=res.stop_reason,
            output=res.output,
            usage=res.usage,
            error=res.error,
        )
        self._put(slot, r)
        await self.log.member_finish(**_finish_payload(r))
        if r.stop_reason == "budget":
            self._budget_gate()
        return r

    async def _remote(
        self,
        member: RemoteAgent,
        name: str,
        message: str,
        path: str,
        policy: str,
        key: str,
        child_sid: str,
        slot: int,
    ) -> MemberResult:
        """One run of a remote (A2A) member: ``message`` sent to it, its task read to the end
        (see ``loom.crew.remote``). The crew tools meant for it are not given: it has none."""
        from loom.tools.a2a import Exchange, exchange

        store = self.runtime.store
        known = await member.a2a.load_context(store, child_sid)
        metered = any(sc.budget.tokens is not None for sc in self.scope.chain())
        if metered and name not in self._unmetered:
            self._unmetered.add(name)
            self.log.warn(
                f"{path}: the remote member's tokens are unknown and not counted "
                "against budget.tokens"
            )
        await self.log.member_start(
            path=path,
            member=name,
            key=key,
            child_session_id=child_sid,
            child_run_id="",
            context_policy=policy,
            context=message,
            extra={"a2a": {"url": member.url, **known}},
        )
        ex = Exchange()

        async def first_context(context_id: str) -> None:  # kept as soon as the remote names it
            await member.a2a.save_context(store, child_sid, {"context_id": context_id})

        def result(stop: str, error: str | None = None, output: str = "") -> MemberResult:
            remote = {
                "url": member.url,
                "task_id": ex.task_id,
                "context_id": ex.context_id,
                "state": ex.state_name if ex.state is not None else "",
            }
            messages = [Message(role="user", content=message)]
            if output:
                messages.append(Message(role="assistant", content=output))
            return MemberResult(
                path=path,
                member=name,
                key=key,
                session_id=child_sid,
                run_id=ex.task_id,
                stop_reason=stop,
                output=output,
                error=error,
                remote=remote,
                messages=messages,
            )

        try:
            async with asyncio.timeout(member.timeout):
                client = await member.connect(name)
                await exchange(
                    client, message, known, on_context=first_context, label=path, into=ex
                )
        except asyncio.CancelledError:  # the crew was stopped: the remote task was cancelled
            r = self._put(
                slot, result("cancelled", "the crew was stopped; the remote task was cancelled")
            )
            await asyncio.shield(self.log.member_finish(**_finish_payload(r)))
            raise
        except TimeoutError:
            r = result(
                "timeout",
                f"no answer within timeout={member.timeout:g} s; the remote task was cancelled",
            )
        except RemoteMemberError as exc:
            r = result("error", f"RemoteMemberError: {exc}")
        except Exception as exc:  # the transport failed mid-task: a recorded result
            err = RemoteMemberError(name, member.url, f"failed while running: {exc}")
            r = result("error", f"RemoteMemberError: {err}")
        else:
            if ex.state_name == "completed":
                r = result("completed", output=ex.answer)
            elif ex.waiting:  # the coordinator reads the question; the next message answers it
                question = ex.status_text or ex.answer
                r = result(
                    "awaiting_input",
                    f"the remote agent waits for input: {question}; "
                    f"the next message to {name} answers it",
                    output=question,
                )
            else:
                r = result(
                    "error",
                    f"the remote task {ex.task_id or '?'} ended "
                    f"{ex.state_name}: {ex.status_text or ex.answer}",
                )
        # drop a stale waiting task id (the answer was sent, or the task ended)
        await member.a2a.save_context(store, child_sid, ex.remembered())
        self._put(slot, r)
        await self.log.member_finish(**_finish_payload(r))
        return r

    def _budget_gate(self) -> None:
        """Stop the crew when any member drew the tree budget dry (it is sticky)."""
        if self.scope.exhausted is not None:
            raise self.scope.exhausted

    @staticmethod
    def _outcome(r: MemberResult) -> Outcome:
        if r.ok:
            return Outcome(r.output, senders=[r])
        return Outcome(
            r.output,
            ok=False,
            senders=[r],
            error=f"{r.path} stopped with {r.stop_reason}: {r.error}",
        )


class _FailFast(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


_NO_EXIT = _LoopFrame()  # marks a loop without an exit tool: its members get none


def _label(node: Node | str) -> str:
    n = node_of(node)
    if n.name:
        return n.name
    if isinstance(n, Step):
        return n.member
    return type(n).__name__.lower()


def _decision_for(approvals: Any, path: str) -> Any:
    """The decision(s) ``Crew.resume`` was given for the member at ``path`` (None: none)."""
    if isinstance(approvals, Mapping) and all(isinstance(k, str) and "/" in k for k in approvals):
        return approvals.get(path)  # keyed by member path
    return approvals  # one decision (or one per call id) for every parked member


def _transfer_tool(moved: list[tuple[str, str]], others: list[str]) -> CrewTool:
    """The ``transfer`` tool of one member run: records the first transfer in ``moved``."""

    async def transfer(ctx: RunContext, args: dict[str, Any]) -> str:
        if moved:
            raise ToolError("you already transferred this conversation", code="transferred")
        moved.append((args["to"], args["brief"]))
        return f"transferred to {args['to']}; end your turn with one short line"

    return choice_tool(
        "transfer",
        "Hand this conversation to another member when it is "
        "theirs to answer; brief says what they need to know.",
        "to",
        others,
        transfer,
        extra={"brief": {"type": "string"}},
    )


def _discard(event: AgentEvent) -> None:
    return None


def _result_of(
    turn: Any, path: str, name: str, key: str, sid: str, stop: str | None, error: str | None
) -> MemberResult:
    res = turn.result
    if res is None:
        return MemberResult(
            path=path,
            member=name,
            key=key,
            session_id=sid,
            run_id=turn.run_id,
            stop_reason=stop or "error",
            error=error,
        )
    return MemberResult(
        path=path,
        member=name,
        key=key,
        session_id=sid,
        run_id=res.run_id,
        stop_reason=stop or res.stop_reason,
        output=res.output,
        usage=res.usage,
        error=error or res.error,
        messages=list(res.messages),
        pending_approvals=list(res.pending_approvals),
    )


def _finish_payload(r: MemberResult) -> dict[str, Any]:
    return {
        "path": r.path,
        "member": r.member,
        "key": r.key,
        "child_session_id": r.session_id,
        "child_run_id": r.run_id,
        "stop_reason": r.stop_reason,
        "output": r.output,
        "usage": r.usage.model_dump(),
        "error": r.error,
        "reused": r.reused,
        **({"extra": {"a2a": r.remote}} if r.remote else {}),
    }
