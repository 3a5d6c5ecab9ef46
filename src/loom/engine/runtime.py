"""The runtime: what a process holds while agents run, and the per-turn dependencies.

An ``Agent`` is a frozen definition. A ``Runtime`` owns everything with state: the store, the
session gates and leases, live MCP connections (one per runtime for each server an agent lists),
context builders with their caches, resolved models, and each session's transcript as last
committed. For every turn it builds a fresh ``RunDeps`` (pydantic-ai's ``GraphAgentDeps``): the
model, this turn's tool table, the hooks with the session's remembered permission decisions,
the result shaper and the context builder. Nothing a turn does is written back onto the agent,
so one ``Agent`` serves any number of runtimes, sessions and processes at once.

Every run starts through ``Runtime.start(target, input, session_id=..., options=...)``, the front
door (``loom.engine.run_inputs``: a new message, ``Resume``, ``Answer`` or ``CarryOn``, for an
``Agent`` or a ``Crew``, with per-run ``RunOptions``); ``run``, ``stream``, ``resume`` and
``answer_query`` are shortcuts over it. ``Agent.run`` / ``stream`` / ``resume`` use a default
runtime per agent (its ``store=``, else a private in-memory store); a server or worker makes
its own::

    runtime = Runtime(store=SQLiteStore("loom.db"))
    result = await runtime.run(agent, "hello", session_id="s1")
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from loom.content import check_parts
from loom.engine.branching import needs_journal
from loom.engine.driving import discard, drive, watch
from loom.engine.gates import OnBusy, SessionGate
from loom.engine.run_deps import RunDeps, SessionView
from loom.engine.run_inputs import (
    SESSION_OWNER_NAMESPACE,
    Answer,
    BranchInput,
    CarryOn,
    Drivable,
    Edit,
    Input,
    NewMessage,
    Point,
    Regenerate,
    Resume,
    Rewind,
    RunInput,
    RunOptions,
    as_run_input,
    with_overrides,
)
from loom.errors import AgentDefinitionError, ConfigurationError, InputError, SessionNotFound
from loom.events import AgentEvent, ApprovalDecisionEvent, EventType
from loom.messages import Message, RunResult, ToolSpec, Usage, new_id
from loom.messages import new_id as new_id_of
from loom.store.base import Store, capabilities_of
from loom.store.transcript import TranscriptWindow
from loom.tools.base import Tool, spec_of
from loom.tools.registry import resolve_tool

if TYPE_CHECKING:
    from loom.content import Part

    # the engine reads an agent's definition (a Protocol), never loom.agent: layered imports
    from loom.context import ContextBuilder
    from loom.engine.loop import Turn
    from loom.engine.turn_spec import TurnSpec as Agent
    from loom.models.base import Model
    from loom.policy.approval import PendingApproval
    from loom.policy.permissions import PermissionRule
    from loom.queries import ServerQuery
    from loom.sandbox.sessions import SandboxPool

__all__ = [
    "NamedRunnable",
    "OnBusy",
    "RunDeps",
    "RunT",
    "Runnable",
    "Runtime",
    "run_to_end",
    "runtime_for",
]


RunT_co = TypeVar("RunT_co", bound=Drivable, covariant=True)
RunT = TypeVar("RunT", bound=Drivable)
"""The kind of run a ``Runnable`` starts (``Runtime.start`` answers that kind)."""


class Runnable(Protocol[RunT_co]):
    """What ``Runtime.start`` can start: an ``Agent`` (its runs are ``loom.engine.loop.Turn``) or a
    ``Crew`` (``loom.crew.CrewTurn``)."""

    async def open_run(
        self,
        runtime: Runtime,
        input: RunInput,
        session_id: str | None,
        options: RunOptions,
    ) -> RunT_co:
        """The run ``input`` asks for on ``runtime``, checked and not started (``InputError``
        for what cannot run, before anything is committed). Called by ``Runtime.start``."""
        ...


class NamedRunnable(Runnable[RunT_co], Protocol[RunT_co]):
    """A ``Runnable`` with a name: what a schedule or a worker looks targets up by."""

    @property
    def name(self) -> str:
        """The agent's or crew's name."""
        ...


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
        budgets: Limits beyond one run (``loom.budgets``): ``BudgetLimit``s or mappings
            ``{scope, window, max_cost, max_tokens, warn_at, allow_unpriced}``; default the
            ``LOOM_BUDGETS`` environment variable (a JSON list or a file), else none.
        budget_clock: Epoch seconds for the budgets' windows (default ``time.time``).
        sandbox_dir: Where sandboxes keep their workspace snapshots and the workspaces of
            agents without one (``loom.sandbox.sessions``); default beside a SQLite store's
            file (``loom.db.sandboxes``), else a temporary directory removed by ``aclose``.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        lease_ttl: float = 30.0,
        observers: Sequence[Callable[[AgentEvent], None]] = (),
        max_cached_sessions: int = 512,
        prices: Any = None,
        budgets: Any = None,
        budget_clock: Callable[[], float] | None = None,
        sandbox_dir: str | Path | None = None,
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
        # budgets beyond one run (loom.budgets): these limits, else $LOOM_BUDGETS; their spend
        # lives in the store, so every process on it shares them
        from loom.budgets import BudgetGuard, ledger_for, load_budgets, parse_budgets

        limits = load_budgets() if budgets is None else parse_budgets(budgets)
        self.budget_guard: BudgetGuard | None = None
        if limits:
            self.budget_guard = BudgetGuard(limits, ledger_for(store), prices=self.prices)
            if budget_clock is not None:
                self.budget_guard.clock = budget_clock
        self._gates: dict[str, SessionGate] = {}
        self._sessions: OrderedDict[str, SessionView] = OrderedDict()
        self._max_sessions = max_cached_sessions
        self._builders: weakref.WeakKeyDictionary[Agent, ContextBuilder] = (
            weakref.WeakKeyDictionary()
        )
        self._toolsets: dict[int, tuple[Any, Any]] = {}  # id(spec) -> (spec, live toolset)
        # ids of a tool table's tools -> (those tools, kept alive so ids stay theirs; specs)
        self._spec_cache: dict[tuple[int, ...], tuple[tuple[Tool, ...], list[ToolSpec]]] = {}
        self._sandbox_dir = Path(sandbox_dir) if sandbox_dir is not None else None
        self._sandboxes: SandboxPool | None = None
        self._scratch: Path | None = None  # a private sandbox directory, removed by aclose

    @property
    def sandboxes(self) -> SandboxPool:
        """The live sandboxes of this runtime's sessions and their workspace snapshots
        (``loom.sandbox.sessions``), kept under ``sandbox_dir``: by default beside a store
        file (``loom.db.sandboxes/``), else in a private temporary directory."""
        if self._sandboxes is None:
            from loom.sandbox.sessions import SandboxPool, scratch_directory

            directory = self.sandbox_dir
            if directory is None:
                directory = self._scratch = scratch_directory()
            self._sandboxes = SandboxPool(directory)
        return self._sandboxes

    @property
    def sandbox_dir(self) -> Path | None:
        """Where this runtime's sandboxes keep snapshots and private workspaces: the
        ``sandbox_dir`` given, else beside a store file (``loom.db.sandboxes``), else the
        private temporary directory once made (None before: nothing is kept yet)."""
        from loom.sandbox.snapshots import default_sandbox_dir

        if self._sandbox_dir is not None:
            return self._sandbox_dir
        return default_sandbox_dir(self.store) or self._scratch

    async def forget_session_sandbox(self, session_id: str) -> None:
        """A session was deleted: close its live sandboxes and remove its snapshots and
        private workspace (``loom.sandbox.snapshots.drop_session_snapshots``)."""
        from loom.sandbox.snapshots import drop_session_snapshots

        if self._sandboxes is not None:
            await self._sandboxes.close_session(session_id, forget=True)
        drop_session_snapshots(self.sandbox_dir, session_id)

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

    def model_for(self, agent: Agent, override: str | Model | None = None) -> Model:
        """The agent's model (or ``override``, a run's own: ``RunOptions.model``), resolved once
        per process for a model string."""
        spec = agent.model_spec if override is None else override
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
        """The session's transcript as far as a turn's context needs it, reading from the store
        only what was added since this runtime last saw it (call under the session's lease).

        A runtime that has not seen the session reads, when the store can
        (``TranscriptWindowStore``), its memory entries and the recent tail the context builder
        sends (``loom.memory.window``: a ``TranscriptWindow``), not its whole history;
        ``deps_for`` reads the rest only for a turn whose context builder needs all of it."""
        info = await self.store.get_session(session_id)
        count = info.message_count if info is not None else 0
        branches = info.branches if info is not None else 0
        view = self._sessions.get(session_id)
        if view is not None:
            held = view.messages
            end = held.end if isinstance(held, TranscriptWindow) else len(held)
            # a branch (here or in another process) rewrote messages it holds: read anew
            if end <= count and view.branches == branches:
                if end < count:  # another process added to it
                    held.extend(await self.store.load_messages(session_id, start=end))
                    view.remembered = None
                self._sessions.move_to_end(session_id)
                return view
        windows = self.capabilities.windows
        if windows is not None:
            from loom.memory.window import load_window

            messages: list[Message] = await load_window(windows, session_id, count)
        else:
            messages = await self.store.load_messages(session_id)
        view = self._sessions[session_id] = SessionView(messages)
        view.branches = branches
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return view

    async def _whole_transcript(
        self, session_id: str, view: SessionView, agent: Agent, tools: dict[str, Tool]
    ) -> None:
        """Read the part of the transcript before ``view``'s window, in place, when this turn's
        context is not built from a window: a builder of the agent's own sees the whole
        history, and so does one whose Kernel the ``remember`` tool's results may set (they
        sit anywhere in the transcript, with no index of their own)."""
        held = view.messages
        if not isinstance(held, TranscriptWindow) or not held.offset:
            return
        from loom.memory.builder import SegmentedContextBuilder
        from loom.memory.segments import KERNEL_TOOL

        if isinstance(self.builder_for(agent), SegmentedContextBuilder) and (
            KERNEL_TOOL not in tools
        ):
            return
        windows = self.capabilities.windows
        assert windows is not None  # a window is only ever read through it
        held[:0] = await windows.load_message_range(session_id, 0, held.offset)
        held.offset, held.prelude = 0, []

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
        self,
        agent: Agent,
        session_id: str,
        view: SessionView,
        user_deps: Any,
        options: RunOptions | None = None,
    ) -> RunDeps:
        """Build this turn's ``RunDeps``: model, tool table, builder, shaper, remembered rules,
        with the run's own overrides (``RunOptions``: model, extra tools, limits) applied."""
        opts = RunOptions() if options is None else options
        model = self.model_for(agent, opts.model)
        tools = dict(agent.tools)
        for extra in opts.extra_tools:  # checked by start(): no name clashes
            t = resolve_tool(extra)
            tools[t.name] = t
        warnings: list[str] = []
        if agent.toolsets:
            from loom.tools.toolset import load_toolsets

            live = [self.toolset(ts) for ts in agent.toolsets]
            tools, warnings = await load_toolsets(live, tools)
        await self._whole_transcript(session_id, view, agent, tools)
        rom: list[str] = []
        if agent.backends:
            from loom.backends.wiring import backend_tools

            tools, rom, found = backend_tools(agent, tools, self.builder_for(agent), model)
            warnings.extend(found)
        shaper = None
        caps = self.capabilities
        if caps.errors is not None or caps.results is not None:
            from loom.tools.channel import ResultShaper, builtin_tools

            shaper = ResultShaper.for_store(caps, agent.max_result_chars)
            if shaper is not None and (tools or agent.backends):  # only with tools
                for builtin in builtin_tools(shaper):
                    tools.setdefault(builtin.name, builtin)
        specs = agent.tool_specs if tools.keys() == agent.tools.keys() else self._specs(tools)
        return RunDeps(
            agent=agent,
            store=self.store,
            model=model,
            tools=tools,
            tool_specs=specs,
            builder=self.builder_for(agent),
            shaper=shaper,
            remembered=await self.remembered_rules(session_id, view),
            user_deps=agent.deps if user_deps is None else user_deps,
            warnings=warnings,
            rom=rom,
            max_tool_calls=opts.max_tool_calls or agent.max_tool_calls,
            owner=opts.owner,
            sandboxes=(
                self.sandboxes
                if getattr(getattr(agent, "sandbox", None), "in_use", False)
                else None
            ),
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

    # -- running: the front door ---------------------------------------------------------------
    async def start(
        self,
        target: Runnable[RunT],
        input: Input,
        *,
        session_id: str | None = None,
        options: RunOptions | None = None,
    ) -> RunT:
        """Start a run of ``target`` (an ``Agent`` or a ``Crew``): the one call every run goes
        through (``run``, ``stream``, ``resume``, ``answer_query``, the crew runner, schedules,
        workers, every server surface).

        ``input`` is what the run is for (``loom.engine.run_inputs``): a ``str`` or ``NewMessage``,
        ``Resume(decisions)``, ``Answer(text, query_id)`` or ``CarryOn()``; ``options`` (a
        ``RunOptions``) varies this run only (model, extra tools, output type, budget, limits,
        deps, on_busy, parent run, run id). ``Resume`` and ``Answer`` are checked against what
        the session waits on now. Every mistake is an ``InputError`` raised here, before
        anything is committed.

        Answers the run, checked and named but not started: ``run.run_id`` is known now,
        ``await run.run(emit)`` runs it (``loom.engine.driving.drive(run)`` streams it),
        ``run.cancel(reason)`` stops it and ``run.result`` holds its ``RunResult`` afterwards.
        """
        what = as_run_input(input)
        opts = RunOptions() if options is None else options
        if not isinstance(opts, RunOptions):
            raise InputError(
                f"options must be a loom.engine.run_inputs.RunOptions, got {type(opts).__name__}"
            )
        if opts.on_busy not in ("queue", "drop", "interrupt"):
            raise InputError(
                f"on_busy must be 'queue', 'drop' or 'interrupt', got {opts.on_busy!r}"
            )
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InputError("session_id must be a non-empty string or None")
        if session_id is None and not isinstance(what, NewMessage):
            raise InputError(
                f"{type(what).__name__} continues a session: pass the session_id of the run "
                "to continue"
            )
        if not callable(getattr(target, "open_run", None)):
            raise InputError(
                f"a run's target must be an Agent or a Crew (a loom.engine.runtime.Runnable), got "
                f"{type(target).__name__}"
            )
        if opts.owner is not None and (not isinstance(opts.owner, str) or not opts.owner.strip()):
            raise InputError(f"owner must be a non-empty string or None, got {opts.owner!r}")
        if opts.owner is None and session_id is not None:
            # the run's owner is decided here, once: a run that names none (a worker's, a
            # resumed one, a schedule's on a served session) acts for the session's owner
            recorded = await self.session_owner(session_id)
            if recorded is not None:
                from dataclasses import replace

                opts = replace(opts, owner=recorded)
        return await target.open_run(self, what, session_id, opts)

    async def session_owner(self, session_id: str) -> str | None:
        """The owner recorded for ``session_id``, or None: the key-value record
        (``SESSION_OWNER_NAMESPACE``) a server or an earlier run wrote, else (a store without
        key-value space, ``MemoryStore``) the ``owner`` in the session's metadata, which the
        run that made the session wrote. One indexed read either way."""
        kv = self.capabilities.kv
        if kv is not None:
            value = await kv.get_value(SESSION_OWNER_NAMESPACE, session_id)
            return value if isinstance(value, str) else None
        info = await self.store.get_session(session_id)
        owner = info.metadata.get("owner") if info is not None else None
        return owner if isinstance(owner, str) else None

    async def open_turn(
        self, agent: Agent, input: RunInput, session_id: str | None, options: RunOptions
    ) -> Turn:
        """``Agent.open_run``: the turn ``input`` asks for, checked (call ``start``)."""
        from loom.engine.loop import Turn

        # the options first (no store read), then what the input asks of the session
        output = agent.output_spec
        if options.output_type is not None:  # this run's own output type (str: a text answer)
            from loom.output import compile_output

            output = compile_output(options.output_type)
        if options.model is not None:
            _check_model_override(options.model)
        if options.max_cost is not None:
            self._check_budget(self.model_for(agent, options.model), options.max_cost)
        self._check_extra_tools(agent, options.extra_tools)
        self._check_limits(options)
        message: str | None = None
        resume: Any = None
        answer: tuple[ServerQuery, str] | None = None
        parts: tuple[Part, ...] = ()
        if isinstance(input, NewMessage):
            parts = input.parts
            if parts:  # media alone are a message: only the text's length is checked
                check_parts(self.model_for(agent, options.model), parts)
                if input.text.strip():
                    agent.check_message(input.text)
                message = input.text
            else:
                message = agent.check_message(input.text)
        elif isinstance(input, Edit | Regenerate | Rewind):
            assert session_id is not None  # start() checked it
            await self._check_branch(agent, session_id, input)
            if isinstance(input, Edit):
                parts = input.parts
                if parts:
                    check_parts(self.model_for(agent, options.model), parts)
                message = agent.check_message(input.text) if input.text.strip() or not parts else ""
        elif isinstance(input, Resume):
            assert session_id is not None  # start() checked it
            resume = await self._check_resume(session_id, input.decisions)
        elif isinstance(input, Answer):
            assert session_id is not None
            answer = await self._check_answer(session_id, input)
        turn = Turn(
            self,
            agent,
            message,
            session_id or new_id("session"),
            options.on_busy,
            options.deps,
            resume=resume,
            answer=answer,
            parent_run_id=options.parent_run_id,
            run_id=options.run_id,
            carry_on=isinstance(input, CarryOn),
            output=output,
            options=options,
        )
        turn.parts = list(parts)
        if isinstance(input, Edit | Regenerate | Rewind):
            turn.branch = input
        turn.max_cost = options.max_cost
        return turn

    async def _check_branch(self, agent: Agent, session_id: str, input: BranchInput) -> None:
        """A branch's point and policy, checked before the run starts (``BranchError``,
        ``BranchRefused``); the turn plans it again under the session's lease."""
        from loom.engine.branching import plan_branch

        store = self.capabilities.branches
        if store is None:
            raise InputError(
                f"{type(self.store).__name__} cannot move a session to another point (no "
                "BranchStore capability); use MemoryStore, SQLiteStore or PostgresStore"
            )
        if await self.store.get_session(session_id) is None:
            raise SessionNotFound(f"no session {session_id!r} to {type(input).__name__.lower()}")
        history = await self.store.load_messages(session_id)
        events = await self.store.load_events(session_id) if needs_journal(input) else None
        plan_branch(input, history, await store.ledger(session_id), agent.branch_effects, events)

    async def _check_resume(self, session_id: str, decisions: Any) -> Any:
        """The decisions, once they fit the calls the session waits on."""
        from loom.policy.approval import match_decisions

        pending = await self.pending_approvals(session_id)
        if not pending:
            raise InputError(f"session {session_id!r} has no tool calls waiting for approval")
        match_decisions(decisions, pending, session_id)  # a clear error before the turn starts
        return decisions

    async def _check_answer(self, session_id: str, input: Answer) -> tuple[ServerQuery, str]:
        """The query the session waits on and the answer to it."""
        if not isinstance(input.text, str):
            raise InputError(f"an answer must be text, got {type(input.text).__name__}")
        query = await self.pending_query(session_id)
        if query is None:
            raise InputError(f"session {session_id!r} has no server query waiting for an answer")
        if input.query_id is not None and input.query_id != query.query_id:
            raise InputError(
                f"session {session_id!r} waits on query {query.query_id!r}, not {input.query_id!r}"
            )
        return query, input.text

    def _check_budget(self, model: Model, max_cost: float) -> None:
        if isinstance(max_cost, bool) or not isinstance(max_cost, int | float) or max_cost < 0:
            raise InputError(f"max_cost must be a number of US dollars >= 0, got {max_cost!r}")
        name = getattr(model, "name", None)
        if not isinstance(name, str) or self.prices.lookup(name) is None:
            raise ConfigurationError(
                f"max_cost needs the price of the agent's model {name!r}, which the price "
                "table does not know; add it with Runtime(prices={...}) or LOOM_PRICES "
                "(docs/observability.md)"
            )

    @staticmethod
    def _check_extra_tools(agent: Agent, extra: Sequence[Any]) -> None:
        seen: set[str] = set()
        for t in extra:
            try:
                name = resolve_tool(t).name
            except AgentDefinitionError as exc:
                raise InputError(f"extra_tools: {exc}") from None
            if name in agent.tools or name in seen:
                raise InputError(
                    f"extra tool {name!r} has the name of another tool of this run (agent "
                    f"{agent.name!r} has: {', '.join(agent.tools) or 'none'}); rename it"
                )
            seen.add(name)

    @staticmethod
    def _check_limits(options: RunOptions) -> None:
        for name, integer in (
            ("max_iterations", True),
            ("max_tool_calls", True),
            ("timeout", False),
            ("queue_timeout", False),
        ):
            value = getattr(options, name)
            kind = int if integer else (int, float)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, kind) or value <= 0
            ):
                what = "a positive integer" if integer else "a positive number of seconds"
                raise InputError(f"{name} must be {what} or None, got {value!r}")

    async def stream(
        self,
        agent: Runnable[Drivable],
        message: Input,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        parent_run_id: str | None = None,
        output_type: Any = None,
        max_cost: float | None = None,
        options: RunOptions | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Run one turn of ``agent`` and yield its events as they happen (see ``Agent.stream``);
        ``options`` carries any other per-run override (``loom.engine.run_inputs.RunOptions``)."""
        opts = with_overrides(
            options,
            on_busy=on_busy,
            deps=deps,
            parent_run_id=parent_run_id,
            output_type=output_type,
            max_cost=max_cost,
        )
        turn = await self.start(agent, message, session_id=session_id, options=opts)
        events = drive(turn, cancel)
        try:
            async for event in events:
                yield event
        finally:  # close the turn now, not whenever the generator is garbage-collected
            await events.aclose()

    async def run(
        self,
        agent: Runnable[Drivable],
        message: Input,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        parent_run_id: str | None = None,
        output_type: Any = None,
        max_cost: float | None = None,
        options: RunOptions | None = None,
    ) -> RunResult:
        """Run one turn of ``agent`` to its end (see ``Agent.run``); ``max_cost`` in US dollars
        stops it with ``stop_reason="cost_limit"`` once its model calls cost more; ``options``
        carries any other per-run override (``loom.engine.run_inputs.RunOptions``)."""
        opts = with_overrides(
            options,
            on_busy=on_busy,
            deps=deps,
            parent_run_id=parent_run_id,
            output_type=output_type,
            max_cost=max_cost,
        )
        turn = await self.start(agent, message, session_id=session_id, options=opts)
        return await run_to_end(turn, cancel)

    async def fork(
        self,
        agent: Agent,
        session_id: str,
        to: Point | None = None,
        *,
        new_session_id: str | None = None,
    ) -> str:
        """A new session that continues ``session_id`` from ``to`` (``None``: its end, a copy),
        sharing the source's history up to there instead of copying it; the source is not
        changed. The new session's journal starts with a ``SESSION_BRANCH`` (reason
        ``"fork"``) and, under the agent's ``branch_effects``, a note of the source's later
        calls with effects (``loom.engine.branching``). Returns the new session's id."""
        from loom.engine.branching import fork_plan

        store = self.capabilities.branches
        if store is None:
            raise InputError(
                f"{type(self.store).__name__} cannot fork a session (no BranchStore "
                "capability); use MemoryStore, SQLiteStore or PostgresStore"
            )
        if await self.store.get_session(session_id) is None:
            raise SessionNotFound(f"no session {session_id!r} to fork")
        new_id = new_session_id or new_id_of("session")
        if await self.store.get_session(new_id) is not None:
            raise InputError(f"session {new_id!r} exists; give another new_session_id")
        history = await self.store.load_messages(session_id)
        events = await self.store.load_events(session_id)
        plan, upto = fork_plan(
            session_id, to, history, events, await store.ledger(session_id), agent.branch_effects
        )
        from loom.events import SessionBranch, make_event

        event = make_event(
            EventType.SESSION_BRANCH, new_id_of("fork"), new_id, 0, 0, plan.event_payload()
        )
        assert isinstance(event, SessionBranch)
        gained = event.restored_messages()
        note = event.message()
        if note is not None:
            gained.append(note)
        await store.fork(
            session_id,
            new_id,
            plan.at,
            upto,
            messages=gained,
            events=[event],
            agent_name=agent.name,
        )
        return new_id

    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The calls of ``session_id`` waiting for a human decision."""
        from loom.policy.approval import pending_approvals

        return await pending_approvals(self.store, session_id)

    async def resume_stream(
        self, agent: Runnable[Drivable], session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> AsyncGenerator[AgentEvent, None]:
        """``resume`` that yields the continued turn's events."""
        run = await self.start(
            agent, Resume(decisions), session_id=session_id, options=RunOptions(deps=deps)
        )
        events = drive(run)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def resume(
        self, agent: Runnable[Drivable], session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> RunResult:
        """Continue a turn that stopped with ``stop_reason="awaiting_approval"`` (see
        ``Agent.resume``): ``start(agent, Resume(decisions), session_id=...)`` run to its end."""
        run = await self.start(
            agent, Resume(decisions), session_id=session_id, options=RunOptions(deps=deps)
        )
        return await run_to_end(run)

    async def pending_query(self, session_id: str) -> ServerQuery | None:
        """The server query (``loom.queries``) the session waits on, if any."""
        from loom.queries import pending_query

        return await pending_query(self.store, session_id)

    async def answer_query(
        self,
        agent: Runnable[Drivable],
        session_id: str,
        answer: str,
        *,
        query_id: str | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Answer the server query a run stopped on (``stop_reason="awaiting_input"``): the
        answer enters the transcript and the turn goes on; returns its ``RunResult``."""
        run = await self.start(
            agent, Answer(answer, query_id), session_id=session_id, options=RunOptions(deps=deps)
        )
        return await run_to_end(run)

    async def aclose(self) -> None:
        """Close this runtime's MCP connections (and other live toolsets). The store is the
        caller's: close it yourself (``await store.close()``)."""
        toolsets, self._toolsets = list(self._toolsets.values()), {}
        for _, live in toolsets:
            await live.aclose()
        if self._sandboxes is not None:
            await self._sandboxes.aclose()
        if self._scratch is not None:
            from loom.sandbox.sessions import remove_directory

            remove_directory(self._scratch)
            self._sandboxes = self._scratch = None

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _check_model_override(model: object) -> None:
    """A run's own model (``RunOptions.model``) is a model string of a known provider or an
    object with ``stream()``; else ``InputError`` before the run starts."""
    from loom.models import check_model_spec

    try:
        check_model_spec(model)
    except AgentDefinitionError as exc:
        raise InputError(f"this run's model (RunOptions.model): {exc}") from None


async def run_to_end(run: Drivable, cancel: asyncio.Event | None = None) -> RunResult:
    """Run ``run`` (from ``Runtime.start``) in the caller's task, nobody streaming its events,
    and answer its ``RunResult``; setting ``cancel`` stops it."""
    watcher = watch(cancel, run)
    try:
        await run.run(discard)
    finally:
        if watcher is not None:
            watcher.cancel()
    assert run.result is not None
    return run.result


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
