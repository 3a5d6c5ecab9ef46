"""The runtime: what a process holds while agents run, and the per-turn dependencies.

An ``Agent`` is a frozen definition. A ``Runtime`` owns everything with state: the store, the
session gates and leases, live MCP connections (one per runtime for each server an agent lists),
context builders with their caches, resolved models, and each session's transcript as last
committed. For every turn it builds a fresh ``RunDeps`` (pydantic-ai's ``GraphAgentDeps``): the
model, this turn's tool table, the hooks with the session's remembered permission decisions,
the result shaper and the context builder. Nothing a turn does is written back onto the agent,
so one ``Agent`` serves any number of runtimes, sessions and processes at once.

``Agent.run`` / ``stream`` / ``resume`` use a default runtime per agent (its ``store=``, else a
private in-memory store); a server or worker makes its own::

    runtime = Runtime(store=SQLiteStore("loom.db"))
    result = await runtime.run(agent, "hello", session_id="s1")
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from loom.driving import discard, drive, watch
from loom.errors import ConfigurationError, InputError
from loom.events import AgentEvent, ApprovalDecisionEvent, EventType
from loom.gates import OnBusy, SessionGate
from loom.messages import RunResult, ToolSpec, Usage, new_id
from loom.run_deps import RunDeps, SessionView
from loom.store.base import Store, capabilities_of
from loom.tools.base import Tool, spec_of

if TYPE_CHECKING:
    # the engine reads an agent's definition (a Protocol), never loom.agent: layered imports
    from loom.context import ContextBuilder
    from loom.loop import Turn
    from loom.models.base import Model
    from loom.policy.approval import PendingApproval
    from loom.policy.permissions import PermissionRule
    from loom.queries import ServerQuery
    from loom.turn_spec import TurnSpec as Agent

__all__ = ["OnBusy", "RunDeps", "Runtime", "runtime_for"]


class Runtime:
    """Owns a store, session leases, connections and caches; runs agents on them.

    Args:
        store: Where sessions live; default a new in-memory store.
        lease_ttl: Seconds a session lease lasts without renewal (renewed every third of it
            while a turn runs); another process takes a session over only after that.
        observers: Called with every event of every run (after it is committed): the hook
            point for tracers and metrics (``loom.observability.otel.OtelObserver``).
        max_cached_sessions: Sessions whose transcript stays in memory between turns.
        prices: Model prices over the shipped table (``loom.pricing``): a ``PriceTable`` or
            ``{"openai:gpt-4o": {"input": 2.5, "output": 10}}`` in dollars per 1M tokens.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        lease_ttl: float = 30.0,
        observers: Sequence[Callable[[AgentEvent], None]] = (),
        max_cached_sessions: int = 512,
        prices: Any = None,
    ) -> None:
        if store is None:
            from loom.store.memory import MemoryStore

            store = MemoryStore()
        if not isinstance(store, Store):
            raise ConfigurationError(
                f"store must implement loom.store.Store (e.g. SQLiteStore('loom.db')), got "
                f"{type(store).__name__}"
            )
        self.store = store
        self.capabilities = capabilities_of(store)
        self.lease_ttl = lease_ttl
        self.observers = tuple(observers)
        from loom.pricing import default_prices

        self.prices = default_prices().with_overrides(prices)
        self._gates: dict[str, SessionGate] = {}
        self._sessions: OrderedDict[str, SessionView] = OrderedDict()
        self._max_sessions = max_cached_sessions
        self._builders: weakref.WeakKeyDictionary[Agent, ContextBuilder] = (
            weakref.WeakKeyDictionary()
        )
        self._toolsets: dict[int, tuple[Any, Any]] = {}  # id(spec) -> (spec, live toolset)
        # ids of a tool table's tools -> (those tools, kept alive so ids stay theirs; specs)
        self._spec_cache: dict[tuple[int, ...], tuple[tuple[Tool, ...], list[ToolSpec]]] = {}

    def __repr__(self) -> str:
        return f"Runtime(store={self.store!r})"

    @property
    def tracers(self) -> list[Any]:
        """The observers that trace (have ``start_run``: ``loom.observability.OtelObserver``):
        the turn lets them open a run's span before its ``AGENT_START`` is committed."""
        return [o for o in self.observers if callable(getattr(o, "start_run", None))]

    # -- what the runtime holds -----------------------------------------------------------------
    def gate(self, session_id: str) -> SessionGate:
        gate = self._gates.get(session_id)
        if gate is None:
            gate = self._gates[session_id] = SessionGate()
        return gate

    def forget_gate(self, session_id: str, gate: SessionGate) -> None:
        if not gate.lock.locked() and not gate.waiting and self._gates.get(session_id) is gate:
            del self._gates[session_id]

    def model_for(self, agent: Agent) -> Model:
        """The agent's model, resolved once per runtime (a model string loads its provider)."""
        spec = agent.model_spec
        if not isinstance(spec, str | None):
            return spec
        return _shared_model(spec)

    def price(self, usage: Usage, model: Model, response_model: str | None = None) -> Usage:
        """``usage`` of one call to ``model`` with its ``cost`` from this runtime's prices."""
        name = getattr(model, "name", None)
        if not isinstance(name, str):
            return usage if usage.cost is None else usage.model_copy(update={"cost": None})
        return self.prices.priced(usage, name, response_model)

    def builder_for(self, agent: Agent) -> ContextBuilder:
        """The agent's context builder in this runtime (its own, or a segmented one)."""
        if agent.context_builder is not None:
            return agent.context_builder
        builder = self._builders.get(agent)
        if builder is None:
            from loom.memory.builder import SegmentedContextBuilder

            builder = self._builders[agent] = SegmentedContextBuilder(
                agent.memory,
                context_window=agent.context_window,
                reserved_output_tokens=agent.reserved_output_tokens,
            )
        return builder

    def toolset(self, spec: Any) -> Any:
        """This runtime's live instance of a toolset the agent lists (MCP connections are
        per runtime, so one runtime's failing server never touches another's)."""
        hit = self._toolsets.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        fresh = getattr(spec, "fresh", None)
        live = fresh() if callable(fresh) else spec
        self._toolsets[id(spec)] = (spec, live)
        return live

    async def session_view(self, session_id: str) -> SessionView:
        """The session's transcript, reading from the store only what was added since this
        runtime last saw it (call under the session's lease)."""
        count = await self.store.message_count(session_id)
        view = self._sessions.get(session_id)
        if view is not None and len(view.messages) <= count:
            if len(view.messages) < count:  # another process added to it
                view.messages.extend(
                    await self.store.load_messages(session_id, start=len(view.messages))
                )
                view.remembered = None
            self._sessions.move_to_end(session_id)
            return view
        view = self._sessions[session_id] = SessionView(await self.store.load_messages(session_id))
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return view

    async def remembered_rules(self, session_id: str, view: SessionView) -> list[PermissionRule]:
        """The session's remembered permission decisions, read from its journal (only its
        approval decisions, through an index, when the store can)."""
        if view.remembered is None:
            from loom.policy.permissions import PermissionRule

            indexed = self.capabilities.typed_events
            events = (
                await indexed.load_events_of_type(session_id, [EventType.APPROVAL_DECISION])
                if indexed is not None
                else await self.store.load_events(session_id)
            )
            rules = []
            for ev in events:
                if isinstance(ev, ApprovalDecisionEvent):
                    for r in ev.extra.get("remember_rules") or ():
                        rules.append(
                            PermissionRule(r["tool"], r.get("pattern"), r["action"], "session")
                        )
            view.remembered = rules
        return view.remembered

    async def deps_for(
        self, agent: Agent, session_id: str, view: SessionView, user_deps: Any
    ) -> RunDeps:
        """Build this turn's ``RunDeps``: model, tool table, builder, shaper, remembered rules."""
        tools = dict(agent.tools)
        warnings: list[str] = []
        if agent.toolsets:
            from loom.tools.toolset import load_toolsets

            live = [self.toolset(ts) for ts in agent.toolsets]
            tools, warnings = await load_toolsets(live, tools)
        rom: list[str] = []
        if agent.backends:
            from loom.backends.wiring import backend_tools

            tools, rom, found = backend_tools(
                agent, tools, self.builder_for(agent), self.model_for(agent)
            )
            warnings.extend(found)
        shaper = None
        caps = self.capabilities
        if caps.errors is not None or caps.results is not None:
            from loom.tools.channel import ResultShaper, builtin_tools

            shaper = ResultShaper.for_store(caps, agent.max_result_chars)
            if shaper is not None and (agent.tools or agent.backends):  # only with tools
                for builtin in builtin_tools(shaper):
                    tools.setdefault(builtin.name, builtin)
        specs = agent.tool_specs if tools.keys() == agent.tools.keys() else self._specs(tools)
        return RunDeps(
            agent=agent,
            store=self.store,
            model=self.model_for(agent),
            tools=tools,
            tool_specs=specs,
            builder=self.builder_for(agent),
            shaper=shaper,
            remembered=await self.remembered_rules(session_id, view),
            user_deps=agent.deps if user_deps is None else user_deps,
            warnings=warnings,
            rom=rom,
        )

    def _specs(self, tools: dict[str, Tool]) -> list[ToolSpec]:
        """The specs of a turn's tool table, the same list object while the table holds the
        same tools: the context builder caches the tools' token count by the specs' identity,
        and recounting the schemas every iteration cost ~10 % of a SQLite step."""
        key = tuple(map(id, tools.values()))
        hit = self._spec_cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], tools.values(), strict=True)):
            return hit[1]
        specs = [spec_of(t) for t in tools.values()]
        if len(self._spec_cache) >= 64:  # toolsets that change every turn: keep it bounded
            self._spec_cache.clear()
        self._spec_cache[key] = (tuple(tools.values()), specs)
        return specs

    # -- running --------------------------------------------------------------------------------
    def prepare(
        self,
        agent: Agent,
        message: str | None,
        session_id: str | None,
        on_busy: str,
        deps: Any,
        resume: Any = None,
        parent_run_id: str | None = None,
        answer: Any = None,
        *,
        run_id: str | None = None,
        carry_on: bool = False,
        output_type: Any = None,
        max_cost: float | None = None,
    ) -> Turn:
        """A turn of ``agent``, checked and ready but not started: ``turn.run_id`` is known
        now, ``await turn.run(emit)`` runs it (or ``loom.driving.drive(turn)`` streams it),
        ``turn.cancel()`` stops it and ``turn.result`` holds its ``RunResult`` afterwards.
        ``output_type`` overrides the agent's for this turn (``loom.output``).
        For servers and workers that must name a run before it starts (``run``/``stream`` are
        the usual way). ``run_id`` names the run (default a new id); ``carry_on=True`` (with
        ``message=None``) starts no new exchange: the turn recovers what a dead run of the
        session left open and lets the model go on from the committed transcript (a worker's
        retry of a run whose user message was already committed). ``max_cost`` (US dollars)
        stops the run with ``stop_reason="cost_limit"`` once its model calls cost more."""
        from loom.loop import Turn

        if message is not None:
            message = agent.check_message(message)
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InputError("session_id must be a non-empty string or None")
        if on_busy not in ("queue", "drop", "interrupt"):
            raise InputError(f"on_busy must be 'queue', 'drop' or 'interrupt', got {on_busy!r}")
        output = agent.output_spec
        if output_type is not None:  # this run's own output type (str: a text answer)
            from loom.output import compile_output

            output = compile_output(output_type)
        if max_cost is not None:
            self._check_budget(agent, max_cost)
        turn = Turn(
            self,
            agent,
            message,
            session_id or new_id("session"),
            on_busy,
            deps,
            resume=resume,
            answer=answer,
            parent_run_id=parent_run_id,
            run_id=run_id,
            carry_on=carry_on,
            output=output,
        )
        turn.max_cost = max_cost
        return turn

    def _check_budget(self, agent: Agent, max_cost: float) -> None:
        if isinstance(max_cost, bool) or not isinstance(max_cost, int | float) or max_cost < 0:
            raise InputError(f"max_cost must be a number of US dollars >= 0, got {max_cost!r}")
        name = getattr(self.model_for(agent), "name", None)
        if not isinstance(name, str) or self.prices.lookup(name) is None:
            raise ConfigurationError(
                f"max_cost needs the price of the agent's model {name!r}, which the price "
                "table does not know; add it with Runtime(prices={...}) or LOOM_PRICES "
                "(docs/observability.md)"
            )

    async def stream(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        parent_run_id: str | None = None,
        output_type: Any = None,
        max_cost: float | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Run one turn of ``agent`` and yield its events as they happen (see ``Agent.stream``)."""
        turn = self.prepare(
            agent,
            message,
            session_id,
            on_busy,
            deps,
            parent_run_id=parent_run_id,
            output_type=output_type,
            max_cost=max_cost,
        )
        events = drive(turn, cancel)
        try:
            async for event in events:
                yield event
        finally:  # close the turn now, not whenever the generator is garbage-collected
            await events.aclose()

    async def run(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        parent_run_id: str | None = None,
        output_type: Any = None,
        max_cost: float | None = None,
    ) -> RunResult:
        """Run one turn of ``agent`` to its end (see ``Agent.run``); ``max_cost`` in US dollars
        stops it with ``stop_reason="cost_limit"`` once its model calls cost more."""
        turn = self.prepare(
            agent,
            message,
            session_id,
            on_busy,
            deps,
            parent_run_id=parent_run_id,
            output_type=output_type,
            max_cost=max_cost,
        )
        watcher = watch(cancel, turn)  # no event consumer: the turn runs in the caller's task
        try:
            await turn.run(discard)
        finally:
            if watcher is not None:
                watcher.cancel()
        assert turn.result is not None
        return turn.result

    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The calls of ``session_id`` waiting for a human decision."""
        from loom.policy.approval import pending_approvals

        return await pending_approvals(self.store, session_id)

    async def prepare_resume(
        self, agent: Agent, session_id: str, decisions: Any, deps: Any = None
    ) -> Turn:
        """``prepare`` for a resumed turn: checks the decisions against the pending calls."""
        from loom.policy.approval import match_decisions

        pending = await self.pending_approvals(session_id)
        if not pending:
            raise InputError(f"session {session_id!r} has no tool calls waiting for approval")
        match_decisions(decisions, pending, session_id)  # a clear error before the turn starts
        return self.prepare(agent, None, session_id, "queue", deps, resume=decisions)

    async def resume_stream(
        self, agent: Agent, session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> AsyncGenerator[AgentEvent, None]:
        """``resume`` that yields the continued turn's events."""
        events = drive(await self.prepare_resume(agent, session_id, decisions, deps))
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def resume(
        self, agent: Agent, session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> RunResult:
        """Continue a turn that stopped with ``stop_reason="awaiting_approval"`` (see
        ``Agent.resume``)."""
        turn = await self.prepare_resume(agent, session_id, decisions, deps)
        await turn.run(discard)
        assert turn.result is not None
        return turn.result

    async def pending_query(self, session_id: str) -> ServerQuery | None:
        """The server query (``loom.queries``) the session waits on, if any."""
        from loom.queries import pending_query

        return await pending_query(self.store, session_id)

    async def prepare_answer(
        self,
        agent: Agent,
        session_id: str,
        answer: str,
        *,
        query_id: str | None = None,
        deps: Any = None,
    ) -> Turn:
        """``prepare`` for the client's answer to a server query (see ``answer_query``)."""
        if not isinstance(answer, str):
            raise InputError(f"an answer must be text, got {type(answer).__name__}")
        query = await self.pending_query(session_id)
        if query is None:
            raise InputError(f"session {session_id!r} has no server query waiting for an answer")
        if query_id is not None and query_id != query.query_id:
            raise InputError(
                f"session {session_id!r} waits on query {query.query_id!r}, not {query_id!r}"
            )
        return self.prepare(agent, None, session_id, "queue", deps, answer=(query, answer))

    async def answer_query(
        self,
        agent: Agent,
        session_id: str,
        answer: str,
        *,
        query_id: str | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Answer the server query a run stopped on (``stop_reason="awaiting_input"``): the
        answer enters the transcript and the turn goes on; returns its ``RunResult``."""
        turn = await self.prepare_answer(agent, session_id, answer, query_id=query_id, deps=deps)
        await turn.run(discard)
        assert turn.result is not None
        return turn.result

    async def aclose(self) -> None:
        """Close this runtime's MCP connections (and other live toolsets). The store is the
        caller's: close it yourself (``await store.close()``)."""
        toolsets, self._toolsets = list(self._toolsets.values()), {}
        for _, live in toolsets:
            await live.aclose()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_MODELS: dict[str, Model] = {}


def _shared_model(spec: str | None) -> Model:
    """Models resolved from strings are shared by the whole process: loading the embedded
    model twice would double its memory for nothing."""
    import os

    from loom.models import resolve_model

    key = spec or os.environ.get("LOOM_MODEL") or "local"
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = resolve_model(key)
    return model


_DEFAULTS: weakref.WeakKeyDictionary[Agent, Runtime] = weakref.WeakKeyDictionary()
_BY_STORE: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def runtime_for(agent: Agent) -> Runtime:
    """The default runtime of ``agent``: the process's runtime for its ``store=`` (shared by
    every agent on that store), else one private to the agent with an in-memory store."""
    store = agent.default_store
    if store is not None:
        rt = _BY_STORE.get(store)
        if rt is None:
            rt = _BY_STORE[store] = Runtime(store)
        return rt
    rt = _DEFAULTS.get(agent)
    if rt is None:
        rt = _DEFAULTS[agent] = Runtime()
    return rt
