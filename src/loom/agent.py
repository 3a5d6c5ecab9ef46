"""``Agent``: what an agent is (instructions, model, tools, limits, hooks) and how to run it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.context import ContextBuilder
from loom.driving import discard, drive, watch
from loom.errors import AgentDefinitionError, ConfigurationError, InputError
from loom.events import AgentEvent
from loom.hooks import compile_hooks
from loom.messages import RunResult, ToolCall, ToolResult, new_id
from loom.models import resolve_model
from loom.models.base import Model, ModelSettings
from loom.runtime import OnBusy
from loom.store.base import Store
from loom.tools.base import Effect, FunctionTool, Tool, ToolSpec, spec_of
from loom.tools.registry import resolve_tool

if TYPE_CHECKING:
    from loom.judge.panel import JudgePanel
    from loom.loop import Turn
    from loom.memory.config import MemoryConfig
    from loom.patterns.library import PatternLibrary
    from loom.policy.approval import PendingApproval

__all__ = ["Agent"]


def default_builder(agent: Agent) -> ContextBuilder:
    """The segmented, budgeted builder; checks the window now when it is already known."""
    from loom.memory.builder import SegmentedContextBuilder
    from loom.memory.config import MemoryConfig

    if agent.memory is not None and not isinstance(agent.memory, MemoryConfig):
        raise AgentDefinitionError(
            f"must be a loom.memory.MemoryConfig, got {type(agent.memory).__name__}",
            field="memory",
        )
    builder = SegmentedContextBuilder(
        agent.memory,
        context_window=agent.context_window,
        reserved_output_tokens=agent.reserved_output_tokens,
    )
    model = agent._model if agent._model is not None else agent._model_spec
    if agent.context_window is not None or isinstance(getattr(model, "context_window", None), int):
        builder.check(agent, model)
    return builder


def _positive(field: str, value: Any, *, integer: bool) -> Any:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        what = "a positive integer" if integer else "a positive number of seconds"
        raise AgentDefinitionError(f"must be {what}, got {value!r}", field=field)
    return value


class Agent:
    """An agent definition you can run.

    Args:
        name: Identifies the agent in sessions, events and logs.
        instructions: The system prompt.
        model: A ``Model`` or a model string (``"local"``, ``"openai:gpt-4o-mini"``, ...);
            default ``$LOOM_MODEL`` or ``"local"``. Resolved on first use.
        tools: ``@tool`` functions, ``Tool`` objects, or names of built-in tools.
        max_iterations: Model calls per turn before the run stops (``"max_iterations"``).
        max_tool_calls: Tool executions per turn before the run stops (``"max_tool_calls"``).
        timeout: Wall-clock seconds per turn (``"timeout"``).
        tool_timeout: Default seconds per tool call; ``@tool(timeout=...)`` overrides it.
        hooks: Lifecycle hook objects, called in order (see ``loom.hooks``).
        store: Where sessions live; default an in-memory store private to this agent.
        workspace: Root directory for file tools, passed to tools in ``RunContext``.
        model_settings: Temperature, max tokens, ... for every model call.
        max_message_chars: Longest user message accepted.
        context_builder: Compiles the context for each call (default: the segmented,
            budgeted builder of ``loom.memory``).
        deps: Any object handed to tools as ``RunContext.deps``.
        patterns: A ``PatternLibrary`` (or a directory of pattern YAML files): the patterns
            matching each user message go into ROM for that turn.
        judges: A ``JudgePanel`` (or a list of judges, aggregated by mean) that scores each final
            answer; a failing answer is retried with a correction (see ``loom.judge``).
        permissions: Rules for tool calls: a ``PermissionManager`` or a mapping such as
            ``{"allow": ["read_file", "bash(git status*)"], "deny": [...], "default": "ask"}``
            (see ``loom.policy.permissions``). Without it, ``bash``, ``write_file``,
            ``edit_file`` and ``web_fetch`` ask and every other tool is allowed. Rules in
            ``<workspace>/.loom/permissions.yaml`` are added either way.
        approval_handler: Called (sync or async) with a ``PendingApproval`` when a call needs
            approval; returns ``Approve()``, ``Reject(reason)`` or ``Edit(arguments)``. Without
            it such a call ends the run with ``stop_reason="awaiting_approval"``; continue
            with ``resume(session_id, decisions)``.
        max_result_chars: With a store that keeps large results (``SQLiteStore``), a tool
            result longer than this is stored and the model gets a preview and a reference
            it can page through with ``get_tool_result``; None sends every result whole.
            With a store that keeps errors, failed calls go through the error channel and
            ``get_error_detail`` is registered (seed 001).
        context_window: The model's context window in tokens (default: the model's
            ``context_window`` attribute, else 128 000). Every call stays inside it.
        reserved_output_tokens: Tokens kept free for the answer (default:
            ``model_settings.max_tokens``, else min(4000, window / 4)).
        memory: A ``loom.memory.MemoryConfig``: segment budgets, compression, MEMORY.md.
    """

    __slots__ = (  # noqa: RUF023 - new fields are appended so parallel branches merge cleanly
        "_approvals",
        "_hooks",
        "_model",
        "_model_spec",
        "_store",
        "_tool_owners",
        "_toolsets",
        "approval_handler",
        "context_builder",
        "deps",
        "hooks",
        "instructions",
        "lock_ttl",
        "max_iterations",
        "max_message_chars",
        "max_queue_depth",
        "max_tool_calls",
        "model_settings",
        "name",
        "permissions",
        "queue_timeout",
        "timeout",
        "tool_specs",
        "tool_timeout",
        "tools",
        "workspace",
        "patterns",
        "judges",
        "max_result_chars",
        "_shaper",
        "context_window",
        "reserved_output_tokens",
        "memory",
    )

    def __init__(
        self,
        name: str = "agent",
        instructions: str = "",
        *,
        model: str | Model | None = None,
        tools: Sequence[Tool | str | Any] = (),
        max_iterations: int = 10,
        max_tool_calls: int = 50,
        timeout: float = 600.0,
        tool_timeout: float = 30.0,
        hooks: Sequence[object] = (),
        store: Store | None = None,
        workspace: str | Path | None = None,
        model_settings: ModelSettings | None = None,
        max_message_chars: int = 100_000,
        queue_timeout: float = 30.0,
        max_queue_depth: int = 10,
        lock_ttl: float = 900.0,
        context_builder: ContextBuilder | None = None,
        deps: Any = None,
        patterns: PatternLibrary | str | Path | None = None,
        judges: JudgePanel | Sequence[Any] | None = None,
        permissions: Any = None,
        approval_handler: Any = None,
        max_result_chars: int | None = 8000,
        context_window: int | None = None,
        reserved_output_tokens: int | None = None,
        memory: MemoryConfig | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise AgentDefinitionError("must be a non-empty string", field="name")
        if not isinstance(instructions, str):
            raise AgentDefinitionError("must be a string", field="instructions")
        self.name = name
        self.instructions = instructions
        self._model_spec = model
        self._model: Model | None = None if model is None or isinstance(model, str) else model
        if self._model is not None and not hasattr(self._model, "stream"):
            raise AgentDefinitionError(
                f"must be a model string or an object with stream(); got {type(model).__name__}",
                field="model",
            )
        self.max_iterations = _positive("max_iterations", max_iterations, integer=True)
        self.max_tool_calls = _positive("max_tool_calls", max_tool_calls, integer=True)
        self.timeout = _positive("timeout", timeout, integer=False)
        self.tool_timeout = _positive("tool_timeout", tool_timeout, integer=False)
        self.max_message_chars = _positive("max_message_chars", max_message_chars, integer=True)
        self.queue_timeout = _positive("queue_timeout", queue_timeout, integer=False)
        self.max_queue_depth = _positive("max_queue_depth", max_queue_depth, integer=True)
        self.lock_ttl = _positive("lock_ttl", lock_ttl, integer=False)
        self.context_window = (
            None
            if context_window is None
            else _positive("context_window", context_window, integer=True)
        )
        self.reserved_output_tokens = reserved_output_tokens
        if reserved_output_tokens is not None and (
            isinstance(reserved_output_tokens, bool)
            or not isinstance(reserved_output_tokens, int)
            or reserved_output_tokens < 0
        ):
            raise AgentDefinitionError(
                f"must be a non-negative integer, got {reserved_output_tokens!r}",
                field="reserved_output_tokens",
            )
        self.memory = memory
        if memory is not None and memory.tools:
            from loom.memory.tools import memory_tools

            tools = [*tools, *memory_tools(memory, [getattr(t, "name", t) for t in tools])]
        self.tools: dict[str, Tool] = {}
        self._toolsets: list[Any] = []  # MCP servers & co: their tools load on the first run
        self._tool_owners: dict[str, str] = {}  # tool name -> toolset that provided it
        for t in tools:
            if hasattr(t, "load_tools") and not hasattr(t, "run"):
                self._toolsets.append(t)
                continue
            resolved = resolve_tool(t)
            if resolved.name in self.tools:
                raise AgentDefinitionError(
                    f"two tools are named {resolved.name!r}; tool names must be unique",
                    field="tools",
                )
            self.tools[resolved.name] = resolved
        self.tool_specs: list[ToolSpec] = [spec_of(t) for t in self.tools.values()]
        self.hooks = list(hooks)
        self._store = store
        self.workspace = Path(workspace) if workspace is not None else None
        from loom.policy.approval import ApprovalGate
        from loom.policy.permissions import build_permissions

        self.permissions = build_permissions(permissions, self.workspace)
        if approval_handler is not None and not callable(approval_handler):
            raise AgentDefinitionError("must be a callable", field="approval_handler")
        self.approval_handler = approval_handler
        self._approvals = ApprovalGate(self)
        # The permission check comes first (seed 002's ToolPipeline), then the user's hooks.
        self._hooks = compile_hooks([self.permissions, *self.hooks])
        self.model_settings = model_settings
        self.context_builder: ContextBuilder = context_builder or default_builder(self)
        self.deps = deps
        if isinstance(patterns, str | Path):
            from loom.patterns.library import PatternLibrary

            patterns = PatternLibrary.from_dir(patterns)
        if patterns is not None and not callable(getattr(patterns, "snapshot", None)):
            raise AgentDefinitionError(
                f"must be a PatternLibrary or a directory, got {type(patterns).__name__}",
                field="patterns",
            )
        self.patterns: PatternLibrary | None = patterns
        self.judges: JudgePanel | None = None
        if judges is not None:
            from loom.judge.panel import JudgePanel

            if not isinstance(judges, JudgePanel):
                items: list[Any] = [judges] if hasattr(judges, "evaluate") else list(judges)
                judges = JudgePanel(items)
            self.judges = judges
        self.max_result_chars = (
            None
            if max_result_chars is None
            else _positive("max_result_chars", max_result_chars, integer=True)
        )
        self._shaper: Any = None
        if store is not None and (hasattr(store, "save_error") or hasattr(store, "save_result")):
            from loom.tools.channel import ResultShaper

            self._shaper = ResultShaper.for_store(store, self.max_result_chars)
            for builtin in self._shaper.builtin_tools() if self._shaper else ():
                if builtin.name not in self.tools:  # a tool of the user's with that name wins
                    self.tools[builtin.name] = builtin
                    self.tool_specs.append(spec_of(builtin))

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, tools={list(self.tools)})"

    # -- lazily resolved parts ----------------------------------------------------------------
    @property
    def model(self) -> Model:
        """The model, resolved from its string on first use."""
        if self._model is None:
            self._model = resolve_model(self._model_spec)
        return self._model

    @property
    def store(self) -> Store:
        if self._store is None:
            from loom.store.memory import MemoryStore

            self._store = MemoryStore()
        return self._store

    def effect_of(self, tool_name: str) -> Effect:
        t = self.tools.get(tool_name)
        return getattr(t, "effect", "at_most_once") if t is not None else "pure"

    # -- extension points used by the loop (overridden by stores, policies, ...) -------------
    async def _recover(self, turn: Turn) -> None:
        """Close tool calls a crashed or cancelled earlier run left open in this session."""
        from loom.recovery import recover_session

        await recover_session(self, turn)

    async def _prepare_tools(self, turn: Turn) -> None:
        """Load the tools of MCP servers (and other toolsets) before the turn's first call."""
        if self._toolsets:
            from loom.tools.toolset import load_toolsets

            await load_toolsets(self, turn)

    async def aclose(self) -> None:
        """Close MCP connections (and other toolsets); the agent reconnects if run again."""
        for ts in self._toolsets:
            await ts.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _process_result(self, turn: Turn, call: ToolCall, result: ToolResult) -> ToolResult:
        """Shape a result before the model sees it (error channel, large results)."""
        if self._shaper is None:
            return result
        shaped: ToolResult = await self._shaper(turn, call, result)
        return shaped

    def _extra_system(self, turn: Turn) -> list[str]:
        """ROM additions for this turn's context: the matched patterns (matched once a turn)."""
        if self.patterns is None:
            return []
        from loom.patterns.turn import patterns_for_turn

        return patterns_for_turn(self.patterns, turn)

    async def _review(self, turn: Turn, answer: str) -> bool:
        """Judge a final answer; True when the loop should ask the model again."""
        if self.judges is None:
            return False
        from loom.judge.turn import review_answer

        return await review_answer(self.judges, turn, answer)

    # -- running ------------------------------------------------------------------------------
    def _turn(self, message: str, session_id: str | None, on_busy: str, deps: Any) -> Turn:
        from loom.loop import Turn

        if not isinstance(message, str):
            raise InputError(f"message must be a string, got {type(message).__name__}")
        if not message.strip():
            raise InputError("message is empty; send some text for the agent to answer")
        if len(message) > self.max_message_chars:
            raise InputError(
                f"message is {len(message):,} characters, over this agent's max_message_chars="
                f"{self.max_message_chars:,}; shorten it or raise the limit"
            )
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InputError("session_id must be a non-empty string or None")
        if on_busy not in ("queue", "drop", "interrupt"):
            raise InputError(f"on_busy must be 'queue', 'drop' or 'interrupt', got {on_busy!r}")
        return Turn(
            self,
            message,
            session_id or new_id("session"),
            on_busy,
            self.deps if deps is None else deps,
        )

    async def stream(
        self,
        message: str,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run one turn and yield its events as they happen (``AGENT_START`` … ``AGENT_FINISH``).

        ``session_id`` continues a session (a new one is made when omitted). ``on_busy`` says
        what to do when the session is running another turn: wait (``"queue"``), fail with
        ``SessionBusy`` (``"drop"``), or cancel the other turn (``"interrupt"``). Setting
        ``cancel`` stops the turn with ``stop_reason="cancelled"``. Leaving the ``async for``
        early cancels the turn too; either way open tool calls get ``interrupted`` results.
        """
        events = drive(self._turn(message, session_id, on_busy, deps), cancel)
        try:
            async for event in events:
                yield event
        finally:  # close the turn now, not whenever the generator is garbage-collected
            await events.aclose()

    async def run(
        self,
        message: str,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
    ) -> RunResult:
        """Run one turn to its end and return the ``RunResult`` (arguments as for ``stream``)."""
        turn = self._turn(message, session_id, on_busy, deps)
        # No event consumer: the turn runs in the caller's task and its events go nowhere.
        watcher = watch(cancel, turn)
        try:
            await turn.run(discard)
        finally:
            if watcher is not None:
                watcher.cancel()
        assert turn.result is not None
        return turn.result

    def run_sync(
        self,
        message: str,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
    ) -> RunResult:
        """``run`` for code without an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run(message, session_id=session_id, on_busy=on_busy, deps=deps))
        raise ConfigurationError(
            "run_sync() was called inside a running event loop; use 'await agent.run(...)'"
        )

    # -- human approval ----------------------------------------------------------------------
    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The calls of ``session_id`` waiting for a human decision (see ``resume``)."""
        from loom.policy.approval import pending_approvals

        return await pending_approvals(self.store, session_id)

    async def _resume_turn(self, session_id: str, decisions: Any, deps: Any) -> Turn:
        from loom.loop import Turn
        from loom.policy.approval import _match

        pending = await self.pending_approvals(session_id)
        if not pending:
            raise InputError(f"session {session_id!r} has no tool calls waiting for approval")
        _match(decisions, pending, session_id)  # raise a clear error before the turn starts
        return Turn(
            self, "", session_id, "queue", self.deps if deps is None else deps, resume=decisions
        )

    async def resume_stream(
        self, session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> AsyncIterator[AgentEvent]:
        """``resume`` that yields the continued turn's events."""
        events = drive(await self._resume_turn(session_id, decisions, deps))
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def resume(
        self, session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> RunResult:
        """Continue a turn that stopped with ``stop_reason="awaiting_approval"``.

        ``decisions`` maps each pending ``tool_call_id`` to ``Approve()``, ``Reject(reason)``
        or ``Edit(arguments)`` (or True/False, "approve"/"reject"); a single decision applies
        to every pending call. Approved calls run, rejected ones become ``denied`` results the
        model reads, and the turn goes on from there. Works in a new process on the same store.
        """
        turn = await self._resume_turn(session_id, decisions, deps)
        async for _ in drive(turn):
            pass
        assert turn.result is not None
        return turn.result

    def resume_sync(self, session_id: str, decisions: Any = True, *, deps: Any = None) -> RunResult:
        """``resume`` for code without an event loop."""
        return asyncio.run(self.resume(session_id, decisions, deps=deps))

    # -- definitions from files ---------------------------------------------------------------
    @classmethod
    def from_file(
        cls, path: str | Path, *, tools: Sequence[Tool | FunctionTool] = (), **overrides: Any
    ) -> Agent:
        """Load an ``AGENT.md`` (YAML front matter + instructions body) or a YAML file.

        ``tools`` supplies your own tools for names the file lists; ``overrides`` win over the
        file (for example ``model=``).
        """
        from loom.definition import load_definition

        return load_definition(cls, Path(path), tools, overrides)
