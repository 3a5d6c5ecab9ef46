"""``Crew``: several agents run as one, runnable like an agent (``run``, ``run_sync``, ``stream``).

```python
crew = Crew("blog", members={"researcher": researcher, "writer": writer},
            plan=Sequential("researcher", Step("writer", context="last_n:4")),
            budget=Budget(tokens=50_000, max_spawns=10))
result = await crew.run("Write about tide pools", session_id="blog-1")
result.members          # each member run: path, child session and run, stop reason, usage
```

A crew run is a run of the crew's session, held under that session's lease; every member run
is a turn in its own child session whose events carry the crew run as ``parent_run_id``. The
crew's journal records what each member was handed and returned (``CREW_MEMBER_START`` /
``CREW_MEMBER_FINISH``), and running the same task again on a session whose crew run died
reuses every member run that had finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.content import Media
from loom.crew.budget import Budget, BudgetScope
from loom.crew.log import CrewLog, unfinished_run
from loom.crew.plan import Node, validate
from loom.crew.remote import RemoteAgent, check_roles
from loom.crew.result import CrewResult
from loom.crew.runner import Handover, Runner, tag
from loom.crew.state import SharedState
from loom.crew.turn import as_crew_session
from loom.engine import gates
from loom.engine.driving import drive
from loom.engine.run_inputs import Answer, CarryOn, NewMessage, Resume, RunInput, RunOptions
from loom.errors import (
    BudgetExceeded,
    CrewDefinitionError,
    InputError,
    LeaseLost,
    RunCancelled,
    UnsupportedContent,
)
from loom.events import AgentEvent
from loom.messages import StopReason, Usage, new_id

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.crew.file import CrewDefinition
    from loom.crew.turn import CrewTurn
    from loom.engine.runtime import Runtime
    from loom.schedule import Schedule, Scheduler

__all__ = ["Crew"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_RUNTIMES: weakref.WeakKeyDictionary[Crew, Runtime] = weakref.WeakKeyDictionary()


class Crew:
    """Agents working as one under a plan (see ``loom.crew.plan`` for the modes).

    Args:
        name: The crew's name: the root of every member path (``blog/writer``).
        members: Member name -> ``Agent``, a remote A2A agent (``RemoteAgent(url)``, see
            ``loom.crew.remote``), or a nested ``Crew`` (which needs ``Budget(max_depth=2)``
            or more).
        plan: The plan node (a member name is a one-step plan).
        budget: Tree-wide limits (``Budget``); defaults allow no nesting, 16 members at once
            and 100 member runs.
        shared_state: Give every member ``state_get`` / ``state_set`` / ``state_keys`` on a
            versioned key-value scope of the crew run (compare-and-set).
        ref_threshold: With ``shared_state``, context longer than this many characters is
            handed over by reference (a key in the shared state) with a short preview.
        summarizer: The agent that writes ``summary`` context (default: one on the sender's
            model).
        store: Where the crew's default runtime keeps sessions (as ``Agent(store=...)``).
        queue_timeout: Seconds a run waits for the crew session when another run holds it.
    """

    __slots__ = (
        "__weakref__",
        "budget",
        "members",
        "name",
        "plan",
        "queue_timeout",
        "ref_threshold",
        "shared_state",
        "store",
        "summarizer",
    )

    def __init__(
        self,
        name: str,
        *,
        members: Mapping[str, Agent | Crew | RemoteAgent],
        plan: Node | str,
        budget: Budget | None = None,
        shared_state: bool = False,
        ref_threshold: int | None = None,
        summarizer: Agent | None = None,
        store: Any = None,
        queue_timeout: float = 300.0,
    ) -> None:
        from loom.agent import Agent

        if not isinstance(name, str) or not _NAME.match(name):
            raise CrewDefinitionError(
                f"{name!r} is not a usable name: use letters, digits, "
                "'_', '.', '-' (no '/' or ':')",
                field="name",
            )
        if not members:
            raise CrewDefinitionError("a crew needs at least one member", field="members")
        for key, m in members.items():
            if not isinstance(key, str) or not _NAME.match(key):
                raise CrewDefinitionError(
                    f"{key!r} is not a usable member name (letters, digits, '_', '.', '-')",
                    field="members",
                )
            if not isinstance(m, Agent | Crew | RemoteAgent):
                raise CrewDefinitionError(
                    f"is a {type(m).__name__}; a member is an Agent, a RemoteAgent or a Crew",
                    field=f"members.{key}",
                )
        if budget is not None and not isinstance(budget, Budget):
            raise CrewDefinitionError("must be a loom.crew.Budget", field="budget")
        if ref_threshold is not None and (not shared_state or ref_threshold < 1):
            raise CrewDefinitionError(
                "passing by reference needs shared_state=True and a threshold >= 1",
                field="ref_threshold",
            )
        validate(plan, members)
        check_roles(plan, members)
        put = object.__setattr__
        put(self, "name", name)
        put(self, "members", dict(members))
        put(self, "plan", plan)
        put(self, "budget", budget or Budget())
        put(self, "shared_state", shared_state)
        put(self, "ref_threshold", ref_threshold)
        put(self, "summarizer", summarizer)
        put(self, "store", store)
        put(self, "queue_timeout", queue_timeout)

    name: str
    members: dict[str, Agent | Crew | RemoteAgent]
    plan: Node | str
    budget: Budget
    shared_state: bool
    ref_threshold: int | None
    summarizer: Agent | None
    store: Any
    queue_timeout: float

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Crew is frozen; build a new one")

    def __repr__(self) -> str:
        return f"Crew(name={self.name!r}, members={list(self.members)})"

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> Crew:
        """Load a crew file (YAML; see ``loom.crew.file``); ``overrides`` win over the file."""
        from loom.crew.file import load_crew_definition

        return cls.from_definition(load_crew_definition(Path(path)), **overrides)

    @classmethod
    def from_definition(cls, definition: CrewDefinition, **overrides: Any) -> Crew:
        """The crew a parsed crew file describes (``loom.crew.file.CrewDefinition``)."""
        from loom.crew.build import build_crew

        return build_crew(cls, definition, overrides)

    @property
    def runtime(self) -> Runtime:
        """The default runtime: the process's runtime for ``store=``, else a private one."""
        from loom.engine.runtime import Runtime

        rt = _RUNTIMES.get(self)
        if rt is None:
            store = self.store
            if isinstance(store, str | Path):
                from loom.store.sqlite import SQLiteStore

                store = SQLiteStore(str(store))
            rt = _RUNTIMES[self] = Runtime(store)
        return rt

    # -- running --------------------------------------------------------------------------------
    async def open_run(
        self,
        runtime: Runtime,
        input: RunInput,
        session_id: str | None,
        options: RunOptions,
    ) -> CrewTurn:
        """The crew run ``input`` asks for on ``runtime`` (``loom.engine.runtime.Runnable``): what
        ``Runtime.start`` calls. A ``NewMessage`` is the crew's task; ``Resume`` continues the
        members' parked calls (decisions keyed by tool call id are routed to the member that
        parked each); ``CarryOn`` runs the session's unfinished crew run again (finished members
        reused). Per-run model, tools, output type, budget and limits belong to the members:
        giving one for a crew is an ``InputError``."""
        from loom.crew.turn import CrewTurn, by_member, crew_pending

        own = [
            name
            for name, given in (
                ("model", options.model is not None),
                ("extra_tools", bool(options.extra_tools)),
                ("output_type", options.output_type is not None),
                ("max_cost", options.max_cost is not None),
                ("max_iterations", options.max_iterations is not None),
                ("max_tool_calls", options.max_tool_calls is not None),
                ("timeout", options.timeout is not None),
                ("queue_timeout", options.queue_timeout is not None),
                ("tool_choice", options.tool_choice is not None),
                ("on_busy", options.on_busy != "queue"),
            )
            if given
        ]
        if own:
            raise InputError(
                f"crew {self.name!r} takes no per-run {', '.join(own)}: set them on its members, "
                "or the crew's Budget (a crew run always queues for its session)"
            )
        common: dict[str, Any] = {
            "deps": options.deps,
            "run_id": options.run_id,
            "parent_run_id": options.parent_run_id,
            "owner": options.owner,  # decided by Runtime.start: every member run acts for it
        }
        if isinstance(input, NewMessage):
            if input.parts:  # refused, not dropped: a crew's task is text
                raise UnsupportedContent(
                    f"{self.name!r} is a crew, and a crew's task is text: it cannot take images, "
                    "files or audio yet; send them to one of its agents, or send text",
                    part=input.parts[0].label if isinstance(input.parts[0], Media) else None,
                )
            return CrewTurn(self, runtime, input.text, session_id, **common)
        if isinstance(input, Answer):
            raise InputError(f"{self.name!r} is a crew; a crew asks no server queries to answer")
        if not isinstance(input, Resume | CarryOn):
            raise InputError(
                f"{self.name!r} is a crew: a crew's session cannot be rewound, regenerated or "
                f"edited ({type(input).__name__}); start the crew again with a new task"
            )
        assert session_id is not None  # Runtime.start checked it
        prior = await unfinished_run(runtime.store, session_id)
        if isinstance(input, CarryOn):
            if prior is None:
                raise InputError(f"crew session {session_id!r} has no crew run to carry on")
            return CrewTurn(self, runtime, prior.task, session_id, **common)
        pending = await crew_pending(runtime.store, session_id)
        if prior is None or not pending:
            raise InputError(f"crew session {session_id!r} has no member call waiting for approval")
        routed = by_member(input.decisions, pending, session_id, self.name)
        return CrewTurn(self, runtime, prior.task, session_id, approvals=routed, **common)

    async def run(
        self,
        task: str,
        *,
        session_id: str | None = None,
        runtime: Runtime | None = None,
        deps: Any = None,
    ) -> CrewResult:
        """Run the crew on ``task`` to its end. ``session_id`` names the crew session (running
        the same task again on a session whose run died resumes it)."""
        rt = runtime or self.runtime
        run = await rt.start(self, task, session_id=session_id, options=RunOptions(deps=deps))
        return await _to_end(run)

    def run_sync(
        self,
        task: str,
        *,
        session_id: str | None = None,
        runtime: Runtime | None = None,
        deps: Any = None,
    ) -> CrewResult:
        """``run`` for code without an event loop."""
        return asyncio.run(self.run(task, session_id=session_id, runtime=runtime, deps=deps))

    async def schedule(
        self,
        message: str,
        *,
        on: Scheduler,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        **options: Any,
    ) -> Schedule:
        """Run this crew with ``message`` on a clock: ``on.schedule(self, ...)``, see
        ``loom.schedule.Scheduler.schedule`` and docs/scheduling.md."""
        return await on.schedule(self, message, cron=cron, every=every, tz=tz, **options)

    async def stream(
        self,
        task: str,
        *,
        session_id: str | None = None,
        runtime: Runtime | None = None,
        deps: Any = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run the crew and yield every event of the crew and of every member as it happens,
        each tagged with ``extra["member_path"]``; the last one is the crew's
        ``AGENT_FINISH``. Leaving early stops the crew."""
        rt = runtime or self.runtime
        run = await rt.start(self, task, session_id=session_id, options=RunOptions(deps=deps))
        events = drive(run)
        try:
            async for item in events:
                yield item
        finally:
            await events.aclose()

    async def resume(
        self,
        session_id: str,
        decisions: Any = True,
        *,
        runtime: Runtime | None = None,
        deps: Any = None,
    ) -> CrewResult:
        """Continue a crew run that stopped with ``stop_reason="awaiting_approval"``.

        ``decisions`` is one decision for every parked call of every member (``True``,
        ``False``, ``Approve()``, ``Reject(reason)``, ``Edit(arguments)``, or a mapping of tool
        call id to decision), or a mapping of member path (``"blog/writer"``) to such a
        decision; a member given none stays parked. Finished members are reused, the parked
        ones continue their own turn (never re-asked), and the plan goes on. A crew run that
        died with no call parked is carried on (``CarryOn``)."""
        from loom.crew.turn import crew_pending

        rt = runtime or self.runtime
        prior = await unfinished_run(rt.store, session_id)
        if prior is None:
            raise InputError(f"crew session {session_id!r} has no crew run to resume")
        parked = await crew_pending(rt.store, session_id)
        what: RunInput = Resume(decisions) if parked else CarryOn()
        run = await rt.start(self, what, session_id=session_id, options=RunOptions(deps=deps))
        return await _to_end(run)

    async def execute(
        self,
        runtime: Runtime,
        task: str,
        *,
        session_id: str | None = None,
        scope: BudgetScope | None = None,
        depth: int = 0,
        root: str | None = None,
        emit: Callable[[AgentEvent], None] | None = None,
        deps: Any = None,
        parent_run_id: str | None = None,
        approvals: Any = None,
        run_id: str | None = None,
        owner: str | None = None,
    ) -> CrewResult:
        """One crew run on ``runtime`` (``run`` and ``stream`` call this; a parent crew calls
        it for a nested crew with its own budget scope, depth and path). Every member run acts
        for ``owner``, the crew run's (``RunOptions.owner``): its memory tools and recall use
        that owner's items."""
        if not isinstance(task, str) or not task.strip():
            raise InputError("a crew's task must be non-empty text")
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InputError("session_id must be a non-empty string or None")
        sid = session_id or new_id("session")
        with contextlib.ExitStack() as spans:
            # a tracer's ``workflow`` span (loom.observability: ``invoke_workflow {crew}``) is
            # current while the crew runs, so every member run's span becomes its child
            for observer in runtime.observers:
                workflow = getattr(observer, "workflow", None)
                if callable(workflow):
                    spans.enter_context(workflow(self.name, session_id=sid))
            return await self._execute(
                runtime,
                task,
                sid,
                scope=scope,
                depth=depth,
                root=root,
                emit=emit,
                deps=deps,
                parent_run_id=parent_run_id,
                approvals=approvals,
                run_id=run_id,
                owner=owner,
            )

    async def _execute(
        self,
        runtime: Runtime,
        task: str,
        sid: str,
        *,
        scope: BudgetScope | None,
        depth: int,
        root: str | None,
        emit: Callable[[AgentEvent], None] | None,
        deps: Any,
        parent_run_id: str | None,
        approvals: Any,
        run_id: str | None,
        owner: str | None,
    ) -> CrewResult:
        run_id = run_id or new_id("run")
        root = root or self.name
        scope = scope or BudgetScope(self.budget)
        store = runtime.store
        me = asyncio.current_task()
        lost: list[str] = []

        def stop_on_lost(reason: str) -> None:  # as a turn does: it can no longer write
            lost.append(reason)
            if me is not None:
                me.cancel()

        # the session envelope every run keeps (loom.engine.gates): lease, keep-alive, release
        async with gates.held(
            runtime,
            sid,
            run_id,
            on_busy="queue",
            interrupt=lambda: None,
            lost=stop_on_lost,
            queue_timeout=self.queue_timeout,
            max_queue_depth=16,
        ) as gate:
            started = time.perf_counter()
            if await store.get_session(sid) is None:
                await store.create_session(sid, agent_name=self.name, metadata={"crew": True})
            crew_emit = None if emit is None else (lambda ev: emit(tag(ev, root)))
            log = CrewLog(
                store,
                sid,
                run_id,
                gate.lease,
                parent_run_id,
                runtime.observers,
                crew_emit or _discard,
                runtime.capabilities.runs,
            )
            prior = await unfinished_run(store, sid)
            resume = prior is not None and prior.task == task
            done = prior.done if prior is not None and resume else {}
            state_scope = prior.state_scope if prior is not None and resume else run_id
            extra: dict[str, Any] = {"state_scope": state_scope, "path": root}
            if resume and prior is not None:
                extra["resumed_from"] = list(prior.chain)
            await log.start(self.name, task, extra, prior)
            state = None
            if self.shared_state:
                state = SharedState(f"crew:{sid}:{state_scope}", runtime.capabilities.kv)
            runner = Runner(
                self,
                runtime,
                log,
                scope,
                state,
                task,
                done,
                depth,
                root,
                emit,
                deps,
                approvals,
                interrupted=prior.interrupted if prior is not None and resume else None,
                owner=owner,
            )
            stop: StopReason = "completed"
            output, error, budget_name = "", None, None
            try:
                limit = self.budget.wall_seconds
                async with asyncio.timeout(limit):
                    out = await runner.node(self.plan, Handover(task), root)
                output = out.output
                if not out.ok:
                    stop, error = "error", out.error
            except BudgetExceeded as exc:
                stop, error, budget_name = "budget", str(exc), exc.budget
            except TimeoutError:
                stop, budget_name = "budget", "wall_seconds"
                error = f"wall-time budget exhausted: {self.budget.wall_seconds:g} s"
            except (asyncio.CancelledError, RunCancelled, LeaseLost) as exc:
                if lost and me is not None and me.cancelling():
                    # another process holds the session now: nothing more may be written here
                    me.uncancel()
                    raise LeaseLost(lost[0]) from None
                if isinstance(exc, LeaseLost):  # an append refused: the same, found by a write
                    raise
                stop, error = "cancelled", "the crew was stopped"
                usage = sum((r.usage for r in runner.results), Usage())
                took = (time.perf_counter() - started) * 1000
                await asyncio.shield(log.finish(stop, output, usage, error, took))
                raise
            members = runner.results
            parked = [{**p, "member_path": m.path} for m in members for p in m.pending_approvals]
            if parked and stop != "budget":  # a member waits for a human: the crew waits too
                stop, error = "awaiting_approval", None
            usage = sum((m.usage for m in members), Usage())
            await log.finish(
                stop,
                output,
                usage,
                error,
                (time.perf_counter() - started) * 1000,
                as_crew_session(parked, sid),
            )
            return CrewResult(
                output=output,
                stop_reason=stop,
                session_id=sid,
                run_id=run_id,
                usage=usage,
                members=members,
                error=error,
                budget=budget_name,
                pending_approvals=parked,
                resumed_from=prior.run_id if resume and prior else None,
                warnings=list(log.journal.warnings),
            )


def _discard(event: AgentEvent) -> None:
    return None


async def _to_end(run: CrewTurn) -> CrewResult:
    """Run ``run`` in the caller's task and answer its ``CrewResult``."""
    await run.run(_discard)
    if run.crew_result is None:  # cancelled through run.cancel(): nobody else holds it
        raise RunCancelled(run.cancel_reason or "the crew run was cancelled")
    return run.crew_result
