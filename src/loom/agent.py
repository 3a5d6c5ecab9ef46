"""``Agent``: the frozen definition of an agent (instructions, model, tools, limits, policies).

An ``Agent`` holds no store, cache, connection or per-session state, so one agent can be shared
by any number of concurrent sessions, runtimes and processes. Running it is the runtime's job
(``loom.engine.runtime``): ``agent.run(...)`` uses the agent's default runtime,
``Runtime(store).run(agent, ...)`` an explicit one. Change a definition with
``agent.replace(**changes)``; build one from an ``AGENT.md`` / YAML file with ``Agent.from_file``
and write it back with ``agent.to_definition()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from loom.engine.run_inputs import Input, Point, RunInput, RunOptions, with_overrides
from loom.errors import AgentDefinitionError, ConfigurationError, InputError
from loom.hooks import compile_hooks
from loom.loop_detection import LoopDetection, loop_detection_of
from loom.messages import Effect, RunResult, ToolSpec
from loom.models import check_model_spec
from loom.models.base import Model, ModelSettings
from loom.tools.base import FunctionTool, Tool, spec_of
from loom.tools.registry import resolve_tool

if TYPE_CHECKING:  # events, stores: loaded by the first run, not by `from loom import Agent`
    import asyncio

    from loom.content import Part
    from loom.context import ContextBuilder
    from loom.definition import AgentDefinition
    from loom.engine.branching import BranchPolicy
    from loom.engine.gates import OnBusy
    from loom.engine.loop import Turn
    from loom.engine.runtime import Runtime
    from loom.events import AgentEvent
    from loom.guardrails.engine import Guardrails
    from loom.judge.panel import JudgePanel
    from loom.memory.config import MemoryConfig
    from loom.output import OutputSpec
    from loom.patterns.library import PatternLibrary
    from loom.policy.approval import PendingApproval
    from loom.sandbox.base import SandboxSettings
    from loom.sandbox.sessions import AgentSandbox
    from loom.schedule import Schedule, Scheduler
    from loom.store.base import Store

__all__ = ["Agent"]


def _positive(field: str, value: Any, *, integer: bool) -> Any:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        what = "a positive integer" if integer else "a positive number of seconds"
        raise AgentDefinitionError(f"must be {what}, got {value!r}", field=field)
    return value


# Classes already found to implement ``Store``: isinstance against a runtime-checkable
# Protocol walks its attributes every time (~10 µs on 3.11), and agents are built often.
_STORE_CLASSES: set[type] = set()


def _check_store(store: Any) -> Store | None:
    if store is None or type(store) in _STORE_CLASSES:
        return store  # type: ignore[no-any-return]
    from loom.store.base import Store

    if isinstance(store, Store):
        _STORE_CLASSES.add(type(store))
        return store
    if isinstance(store, str | Path):  # a path means a SQLite file (documented)
        from loom.store.sqlite import SQLiteStore

        return SQLiteStore(store)
    raise ConfigurationError(
        f"store must be a loom.store.Store (SQLiteStore('loom.db'), MemoryStore()) or a path to "
        f"a SQLite file, got {type(store).__name__}"
    )


def _check_workspace(workspace: Any) -> Path | None:
    if workspace is None:
        return None
    path = Path(workspace)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ConfigurationError(
            f"workspace {str(path)!r} {what}; create it or point workspace= at an existing "
            "directory (file tools work inside it)"
        )
    return path


def _check_guardrails(guardrails: Any) -> Guardrails | None:
    if not guardrails:
        return None
    from loom.guardrails.engine import Guardrails

    if isinstance(guardrails, Guardrails):
        return guardrails
    if isinstance(guardrails, str | bytes) or not isinstance(guardrails, Sequence):
        raise AgentDefinitionError(
            f"must be a list of guardrails, got {type(guardrails).__name__}", field="guardrails"
        )
    try:
        return Guardrails(guardrails)
    except ConfigurationError as exc:
        raise AgentDefinitionError(str(exc), field="guardrails") from None


def _check_backends(backends: Any) -> tuple[Any, ...]:
    if not backends:
        return ()
    if isinstance(backends, str | bytes) or not isinstance(backends, Sequence):
        raise AgentDefinitionError(
            f"must be a list of backends, got {type(backends).__name__}", field="backends"
        )
    for b in backends:
        if not all(callable(getattr(b, m, None)) for m in ("tools", "schema_text", "close")):
            raise AgentDefinitionError(
                f"{b!r} is not a backend (it needs tools(), schema_text(budget) and close(); "
                "see loom.backends)",
                field="backends",
            )
    return tuple(backends)


def _compile_output(output_type: Any) -> OutputSpec | None:
    if output_type is None or output_type is str:
        return None  # no pydantic import for a text agent
    from loom.output import compile_output

    return compile_output(output_type)


class Agent:
    """An agent definition you can run. Immutable once built: derive with ``replace``.

    Args:
        name: Identifies the agent in sessions, events and logs.
        instructions: The system prompt.
        description: What the agent is for, in a sentence (AGENT.md ``description:``): what
            MCP clients, A2A cards and assistant lists show; default the instructions' first
            line.
        model: A ``Model`` or a model string (``"local"``, ``"openai:gpt-4o-mini"``, ...);
            default ``$LOOM_MODEL`` or ``"local"``. Its provider is checked now; the model is
            loaded by the runtime on first use (once per process for a model string).
        tools: ``@tool`` functions, ``Tool`` objects, names of built-in tools, or toolsets
            (``mcp_server(...)``: each runtime holds its own connection).
        max_iterations: Model calls per turn before the run stops (``"max_iterations"``).
        max_tool_calls: Tool executions per turn before the run stops (``"max_tool_calls"``).
        loop_detection: Stop a run that repeats itself (``stop_reason="loop"``,
            ``loom.loop_detection``): ``True`` (the default: 6 identical calls among the last
            20, or 6 identical answers in a row), ``False`` (off), a ``LoopDetection`` or a
            mapping of its settings (``{"max_repeats": 3, "window": 10, "same_answer": 3}``).
        timeout: Wall-clock seconds per turn, INTAKE (recovery, resume) included (``"timeout"``).
        tool_timeout: Default seconds per tool call; ``@tool(timeout=...)`` overrides it.
        hooks: Lifecycle hook objects, called in order (see ``loom.hooks``).
        store: Where the agent's default runtime keeps sessions: a ``Store``, or a path, which
            means a SQLite file (``SQLiteStore(path)``). Default: an in-memory store private
            to this agent. ``Runtime(store).run(agent, ...)`` runs it on any other store.
        workspace: Root directory for file tools (must exist), passed in ``RunContext``.
        model_settings: Temperature, max tokens, ... for every model call.
        max_message_chars: Longest user message accepted.
        queue_timeout: Seconds a turn waits for its busy session (``on_busy="queue"``).
        max_queue_depth: Turns that may wait for one session.
        lock_ttl: Kept for compatibility; leases are renewed while a turn runs (see
            ``Runtime(lease_ttl=...)``).
        context_builder: Compiles the context for each call (default: the segmented, budgeted
            builder of ``loom.memory``, one per runtime).
        deps: Any object handed to tools as ``RunContext.deps`` (``run(deps=...)`` overrides).
        patterns: A ``PatternLibrary`` (or a directory of pattern YAML files): the patterns
            matching each user message go into ROM for that turn.
        judges: A ``JudgePanel`` (or a list of judges, aggregated by mean) that scores each final
            answer; a failing answer is retried with a correction (see ``loom.judge``).
        permissions: Rules for tool calls: a ``PermissionManager`` or a mapping such as
            ``{"allow": ["read_file", "bash(git status*)"], "deny": [...], "default": "ask"}``
            (see ``loom.policy.permissions``). Without it, ``bash``, ``python``,
            ``write_file``, ``edit_file`` and ``web_fetch`` ask and every other tool is
            allowed. Rules in ``<workspace>/.loom/permissions.yaml`` are added either way.
        approval_handler: Called (sync or async) with a ``PendingApproval`` when a call needs
            approval; returns ``Approve()``, ``Reject(reason)`` or ``Edit(arguments)``. Without
            it such a call ends the run with ``stop_reason="awaiting_approval"``; continue
            with ``resume(session_id, decisions)``.
        max_result_chars: With a store that keeps large results (``SQLiteStore``), a tool
            result longer than this is stored and the model gets a preview and a reference
            it can page through with ``get_tool_result``; None sends every result whole.
            With a store that keeps errors, failed calls go through the error channel and
            ``get_error_detail`` is offered (both only to agents that have tools).
        context_window: The model's context window in tokens (default: the model's
            ``context_window`` attribute, else 128 000). Every call stays inside it.
        reserved_output_tokens: Tokens kept free for the answer (default:
            ``model_settings.max_tokens``, else min(4000, window / 4)).
        memory: A ``loom.memory.MemoryConfig``: segment budgets, compression, MEMORY.md.
        query_detector: Server queries (seed 003, ``loom.queries``): a ``QueryDetector`` or a
            mapping of query kind to regular expression. A final answer it matches stops the
            run with ``stop_reason="awaiting_input"`` until the client answers
            (``runtime.answer_query``); the same turn then goes on.
        guardrails: Checks on the user's message, the final answer, each tool call and each
            tool result (``loom.guardrails``: ``Redactor()``, ``PromptInjectionGuardrail()``,
            ``MaxLength``, ``AllowedLanguages``, ``MustCite``, or your own). Each passes, fixes
            (recorded) or trips (``stop_reason="guardrail"``); every decision is a
            ``GUARDRAIL`` event. For one run only: ``agent.replace(guardrails=[...])``.
        output_type: The type of the final answer (``loom.output``): a pydantic model, a
            dataclass, a ``TypedDict``, a union or a list of them, or a JSON schema dict.
            The answer is validated, ``RunResult.output`` is the typed value and each
            provider constrains its answer natively where it can. ``None`` or ``str``: text.
            A type pydantic cannot build a JSON schema for is a ``ConfigurationError`` here.
        backends: Domain backends (``loom.backends``: ``SQLBackend``, ``OpenAPIBackend``,
            ``DocumentBackend``): their operations become tools and their schema text goes
            into the ROM of every turn.
        output_retries: How many times a final answer that does not fit ``output_type`` is
            sent back with its validation errors before the run stops with
            ``stop_reason="output_invalid"``.
        branch_effects: What a rewind, regenerate or edit does about dropped turns whose
            tool calls had effects (``loom.engine.branching``): ``"note"`` (the default: the
            new branch's transcript gets a note naming them), ``"refuse"`` (the operation
            fails with ``BranchRefused``) or ``"allow"`` (no note). A new call that repeats a
            dropped ``at_most_once`` call waits for approval unless ``"allow"``.
        sandbox: Where ``bash`` and ``python`` run (``loom.sandbox``, docs/tools.md): ``True``
            (in a sandbox with the default ``SandboxSettings``), a ``SandboxSettings`` or a
            mapping of its fields (in one with those), ``False`` (on the host). Unset:
            ``bash`` runs on the host and ``python`` in a sandbox. A sandboxed call is
            ``idempotent`` (its workspace is snapshotted after each committed step).
        python_unsandboxed: With ``sandbox=False``, let the ``python`` tool run on the host;
            without both, it refuses to.
    """

    __slots__ = (
        "__weakref__",
        "_given",
        "approval_handler",
        "backends",
        "branch_effects",
        "compiled_hooks",
        "context_builder",
        "context_window",
        "default_store",
        "deps",
        "description",
        "guardrails",
        "hooks",
        "instructions",
        "judges",
        "lock_ttl",
        "loop_detection",
        "max_iterations",
        "max_message_chars",
        "max_queue_depth",
        "max_result_chars",
        "max_tool_calls",
        "memory",
        "model_settings",
        "model_spec",
        "name",
        "output_retries",
        "output_spec",
        "output_type",
        "patterns",
        "permissions",
        "query_detector",
        "queue_timeout",
        "reserved_output_tokens",
        "sandbox",
        "timeout",
        "tool_specs",
        "tool_timeout",
        "tools",
        "toolsets",
        "workspace",
    )
    _given: Mapping[str, Any]
    approval_handler: Any
    backends: tuple[Any, ...]
    branch_effects: BranchPolicy
    compiled_hooks: dict[str, list[Any]]
    context_builder: ContextBuilder | None
    context_window: int | None
    default_store: Store | None
    deps: Any
    description: str
    guardrails: Guardrails | None
    hooks: tuple[object, ...]
    instructions: str
    judges: JudgePanel | None
    lock_ttl: float
    loop_detection: LoopDetection | None
    max_iterations: int
    max_message_chars: int
    max_queue_depth: int
    max_result_chars: int | None
    max_tool_calls: int
    memory: MemoryConfig | None
    model_settings: ModelSettings | None
    model_spec: str | Model | None
    name: str
    output_retries: int
    output_spec: OutputSpec | None
    output_type: Any
    patterns: PatternLibrary | None
    permissions: Any
    query_detector: Any
    queue_timeout: float
    reserved_output_tokens: int | None
    sandbox: AgentSandbox | None
    timeout: float
    tool_specs: list[ToolSpec]
    tool_timeout: float
    tools: Mapping[str, Tool]
    toolsets: tuple[Any, ...]
    workspace: Path | None

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
        store: Store | str | Path | None = None,
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
        query_detector: Any = None,
        guardrails: Sequence[Any] | None = None,
        output_type: Any = None,
        output_retries: int = 2,
        backends: Sequence[Any] = (),
        description: str = "",
        branch_effects: BranchPolicy = "note",
        loop_detection: LoopDetection | Mapping[str, Any] | bool = True,
        sandbox: bool | SandboxSettings | Mapping[str, Any] | None = None,
        python_unsandboxed: bool = False,
    ) -> None:
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        put = object.__setattr__
        put(self, "_given", MappingProxyType(given))
        if not isinstance(name, str) or not name.strip():
            raise AgentDefinitionError("must be a non-empty string", field="name")
        if not isinstance(instructions, str):
            raise AgentDefinitionError("must be a string", field="instructions")
        put(self, "name", name)
        put(self, "instructions", instructions)
        if not isinstance(description, str):
            raise AgentDefinitionError("must be a string", field="description")
        put(self, "description", description.strip())
        put(self, "model_spec", check_model_spec(model))
        if branch_effects not in ("refuse", "note", "allow"):
            raise AgentDefinitionError(
                f"must be 'refuse', 'note' or 'allow', got {branch_effects!r}",
                field="branch_effects",
            )
        put(self, "branch_effects", branch_effects)
        put(self, "loop_detection", loop_detection_of(loop_detection))
        for field_name, value, integer in (
            ("max_iterations", max_iterations, True),
            ("max_tool_calls", max_tool_calls, True),
            ("timeout", timeout, False),
            ("tool_timeout", tool_timeout, False),
            ("max_message_chars", max_message_chars, True),
            ("queue_timeout", queue_timeout, False),
            ("max_queue_depth", max_queue_depth, True),
            ("lock_ttl", lock_ttl, False),
        ):
            put(self, field_name, _positive(field_name, value, integer=integer))
        put(
            self,
            "context_window",
            None
            if context_window is None
            else _positive("context_window", context_window, integer=True),
        )
        if reserved_output_tokens is not None and (
            isinstance(reserved_output_tokens, bool)
            or not isinstance(reserved_output_tokens, int)
            or reserved_output_tokens < 0
        ):
            raise AgentDefinitionError(
                f"must be a non-negative integer, got {reserved_output_tokens!r}",
                field="reserved_output_tokens",
            )
        put(self, "reserved_output_tokens", reserved_output_tokens)
        if memory is not None:
            from loom.memory.config import MemoryConfig

            if not isinstance(memory, MemoryConfig):
                raise AgentDefinitionError(
                    f"must be a loom.memory.MemoryConfig, got {type(memory).__name__}",
                    field="memory",
                )
            if memory.tools or memory.store_tools or memory.history_tool:
                from loom.memory.tools import memory_tools

                tools = [*tools, *memory_tools(memory, [getattr(t, "name", t) for t in tools])]
        put(self, "memory", memory)
        own: dict[str, Tool] = {}
        toolsets: list[Any] = []  # MCP servers & co: each runtime loads their tools per turn
        for t in tools:
            if hasattr(t, "load_tools") and not hasattr(t, "run"):
                toolsets.append(t)
                continue
            resolved = resolve_tool(t)
            if resolved.name in own:
                raise AgentDefinitionError(
                    f"two tools are named {resolved.name!r}; tool names must be unique",
                    field="tools",
                )
            own[resolved.name] = resolved
        setting = None
        if (
            sandbox is not None
            or python_unsandboxed
            or any(hasattr(t, "sandbox_default") for t in own.values())
        ):
            from loom.sandbox.sessions import agent_sandbox
            from loom.sandbox.tools import with_sandbox_effects

            setting = agent_sandbox(sandbox, python_unsandboxed)
            own, setting = with_sandbox_effects(own, setting)
        put(self, "sandbox", setting)
        put(self, "tools", MappingProxyType(own))
        put(self, "backends", _check_backends(backends))
        put(self, "toolsets", tuple(toolsets))
        put(self, "tool_specs", [spec_of(t) for t in own.values()])
        put(self, "hooks", tuple(hooks))
        put(self, "default_store", _check_store(store))
        put(self, "workspace", _check_workspace(workspace))
        from loom.policy.permissions import build_permissions

        perms = build_permissions(permissions, self.workspace)
        put(self, "permissions", perms)
        if approval_handler is not None and not callable(approval_handler):
            raise AgentDefinitionError("must be a callable", field="approval_handler")
        put(self, "approval_handler", approval_handler)
        # The permission check comes first (seed 002's ToolPipeline), then the user's hooks.
        put(self, "compiled_hooks", compile_hooks([perms, *self.hooks]))
        put(self, "model_settings", model_settings)
        put(self, "context_builder", context_builder)
        put(self, "deps", deps)
        if isinstance(patterns, str | Path):
            from loom.patterns.library import PatternLibrary

            patterns = PatternLibrary.from_dir(patterns)
        if patterns is not None and not callable(getattr(patterns, "snapshot", None)):
            raise AgentDefinitionError(
                f"must be a PatternLibrary or a directory, got {type(patterns).__name__}",
                field="patterns",
            )
        put(self, "patterns", patterns)
        if judges is not None:
            from loom.judge.panel import JudgePanel

            if not isinstance(judges, JudgePanel):
                items: list[Any] = [judges] if hasattr(judges, "evaluate") else list(judges)
                judges = JudgePanel(items)
        put(self, "judges", judges)
        if query_detector is not None:
            from loom.queries import query_detector as as_detector

            query_detector = as_detector(query_detector)
        put(self, "query_detector", query_detector)
        put(self, "guardrails", _check_guardrails(guardrails))
        if (
            isinstance(output_retries, bool)
            or not isinstance(output_retries, int)
            or (output_retries < 0)
        ):
            raise AgentDefinitionError(
                f"must be a non-negative integer, got {output_retries!r}", field="output_retries"
            )
        put(self, "output_retries", output_retries)
        put(self, "output_type", output_type)
        put(self, "output_spec", _compile_output(output_type))
        put(
            self,
            "max_result_chars",
            None
            if max_result_chars is None
            else _positive("max_result_chars", max_result_chars, integer=True),
        )
        if context_builder is None and (
            context_window is not None
            or isinstance(getattr(self.model_spec, "context_window", None), int)
        ):  # the window is known now: check that the instructions and tools fit it
            from loom.memory.builder import SegmentedContextBuilder

            SegmentedContextBuilder(
                memory, context_window=context_window, reserved_output_tokens=reserved_output_tokens
            ).check(self, self.model_spec)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"Agent is frozen (one definition is shared by every session); use "
            f"agent.replace({name}=...) for a changed copy"
        )

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, tools={list(self.tools)})"

    def replace(self, **changes: Any) -> Agent:
        """A new agent with ``changes`` applied to the arguments this one was built with."""
        unknown = [k for k in changes if k not in self._given]
        if unknown:
            raise AgentDefinitionError(f"Agent has no argument {unknown[0]!r}", field=unknown[0])
        return type(self)(**{**self._given, **changes})

    # -- resolved parts (owned by the runtime, not the agent) -----------------------------------
    @property
    def runtime(self) -> Runtime:
        """The default runtime ``run`` / ``stream`` / ``resume`` use."""
        from loom.engine.runtime import runtime_for

        return runtime_for(self)

    @property
    def model(self) -> Model:
        """The model, resolved by the runtime (a model string loads once per process)."""
        return self.runtime.model_for(self)

    @property
    def store(self) -> Store:
        """The default runtime's store (``store=`` if given, else its in-memory store)."""
        return self.runtime.store

    def effect_of(self, tool_name: str) -> Effect:
        t = self.tools.get(tool_name)
        return getattr(t, "effect", "at_most_once") if t is not None else "pure"

    def check_message(self, message: Any) -> str:
        """The user message if it is acceptable, else ``InputError`` saying why."""
        if not isinstance(message, str):
            raise InputError(f"message must be a string, got {type(message).__name__}")
        if not message.strip():
            raise InputError("message is empty; send some text for the agent to answer")
        if len(message) > self.max_message_chars:
            raise InputError(
                f"message is {len(message):,} characters, over this agent's max_message_chars="
                f"{self.max_message_chars:,}; shorten it or raise the limit"
            )
        return message

    # -- running (on the default runtime) -------------------------------------------------------
    async def open_run(
        self,
        runtime: Runtime,
        input: RunInput,
        session_id: str | None,
        options: RunOptions,
    ) -> Turn:
        """The turn ``input`` asks for on ``runtime`` (``loom.engine.runtime.Runnable``): what
        ``Runtime.start`` calls; start runs with ``runtime.start(agent, input, ...)``."""
        return await runtime.open_turn(self, input, session_id, options)

    async def stream(
        self,
        message: Input,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        output_type: Any = None,
        model: str | Model | None = None,
        extra_tools: Sequence[Tool | str | Any] = (),
        max_cost: float | None = None,
        options: RunOptions | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run one turn and yield its events as they happen (``AGENT_START`` … ``AGENT_FINISH``).

        ``message`` is the user's text (or a ``loom.engine.run_inputs`` input: ``Resume(...)``,
        ``Answer(...)``, ``CarryOn()``). ``session_id`` continues a session (a new one is made
        when omitted). ``on_busy`` says what to do when the session is running another turn:
        wait (``"queue"``), fail with ``SessionBusy`` (``"drop"``), or cancel the other turn
        (``"interrupt"``). Setting ``cancel`` stops the turn with ``stop_reason="cancelled"``.
        Leaving the ``async for`` early cancels the turn too; either way open tool calls get
        ``interrupted`` results.

        Per-run overrides change this run only (the agent stays as it is): ``output_type``
        (``str`` for a text answer; partial typed values arrive as ``OUTPUT_PARTIAL``
        events), ``model``, ``extra_tools``, ``max_cost`` (US dollars), and anything else of
        ``loom.engine.run_inputs.RunOptions`` through ``options`` (the keywords win over it).
        """
        opts = with_overrides(
            options,
            on_busy=on_busy,
            deps=deps,
            output_type=output_type,
            model=model,
            extra_tools=extra_tools,
            max_cost=max_cost,
        )
        events = self.runtime.stream(
            self, message, session_id=session_id, cancel=cancel, options=opts
        )
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def run(
        self,
        message: Input,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        cancel: asyncio.Event | None = None,
        output_type: Any = None,
        model: str | Model | None = None,
        extra_tools: Sequence[Tool | str | Any] = (),
        max_cost: float | None = None,
        options: RunOptions | None = None,
    ) -> RunResult:
        """Run one turn to its end and return the ``RunResult`` (arguments as for ``stream``):
        ``agent.run("hi", model="openai:gpt-4o")`` runs this turn on another model."""
        opts = with_overrides(
            options,
            on_busy=on_busy,
            deps=deps,
            output_type=output_type,
            model=model,
            extra_tools=extra_tools,
            max_cost=max_cost,
        )
        return await self.runtime.run(
            self, message, session_id=session_id, cancel=cancel, options=opts
        )

    async def rewind(self, session_id: str, to: Point) -> RunResult:
        """Move ``session_id`` back to ``to`` (``AtTurn(n)`` or an int: after its first ``n``
        turns; ``AtEvent(run_id, sequence)``: just after a stored event): the later turns leave
        the transcript and stay in the journal (``loom.engine.branching``, ``branch_effects``).
        The result's ``stop_reason`` is ``"rewound"``."""
        from loom.engine.run_inputs import Rewind

        return await self.runtime.run(self, Rewind(to), session_id=session_id)

    async def fork(
        self, session_id: str, to: Point | None = None, *, new_session_id: str | None = None
    ) -> str:
        """A new session that continues ``session_id`` from ``to`` (``None``: its end), sharing
        its history instead of copying it (``Runtime.fork``); returns the new session's id."""
        return await self.runtime.fork(self, session_id, to, new_session_id=new_session_id)

    async def regenerate(self, session_id: str, *, options: RunOptions | None = None) -> RunResult:
        """Answer ``session_id``'s last user message again (its last answer leaves the
        transcript and stays in the journal)."""
        from loom.engine.run_inputs import Regenerate

        return await self.runtime.run(self, Regenerate(), session_id=session_id, options=options)

    async def edit(
        self,
        session_id: str,
        turn: int,
        text: str,
        *,
        parts: Sequence[Part] = (),
        options: RunOptions | None = None,
    ) -> RunResult:
        """Replace the user message of ``turn`` (0-based) with ``text`` and answer it: the
        session goes back to just before that message (what followed stays in the journal)."""
        from loom.engine.run_inputs import Edit

        return await self.runtime.run(
            self, Edit(turn, text, tuple(parts)), session_id=session_id, options=options
        )

    def run_sync(
        self,
        message: Input,
        *,
        session_id: str | None = None,
        on_busy: OnBusy = "queue",
        deps: Any = None,
        output_type: Any = None,
        model: str | Model | None = None,
        extra_tools: Sequence[Tool | str | Any] = (),
        max_cost: float | None = None,
        options: RunOptions | None = None,
    ) -> RunResult:
        """``run`` for code without an event loop."""
        import asyncio  # loaded by the first run, not by `from loom import Agent`

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(
                self.run(
                    message,
                    session_id=session_id,
                    on_busy=on_busy,
                    deps=deps,
                    output_type=output_type,
                    model=model,
                    extra_tools=extra_tools,
                    max_cost=max_cost,
                    options=options,
                )
            )
        raise ConfigurationError(
            "run_sync() was called inside a running event loop; use 'await agent.run(...)'"
        )

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
        """Run this agent with ``message`` on a clock: ``on.schedule(self, ...)``, see
        ``loom.schedule.Scheduler.schedule`` and docs/scheduling.md."""
        return await on.schedule(self, message, cron=cron, every=every, tz=tz, **options)

    # -- human approval ----------------------------------------------------------------------
    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The calls of ``session_id`` waiting for a human decision (see ``resume``)."""
        return await self.runtime.pending_approvals(session_id)

    async def resume_stream(
        self, session_id: str, decisions: Any = True, *, deps: Any = None
    ) -> AsyncIterator[AgentEvent]:
        """``resume`` that yields the continued turn's events."""
        events = self.runtime.resume_stream(self, session_id, decisions, deps=deps)
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
        return await self.runtime.resume(self, session_id, decisions, deps=deps)

    def resume_sync(self, session_id: str, decisions: Any = True, *, deps: Any = None) -> RunResult:
        """``resume`` for code without an event loop."""
        import asyncio

        return asyncio.run(self.resume(session_id, decisions, deps=deps))

    async def aclose(self) -> None:
        """Close the default runtime's MCP connections; they reconnect if the agent runs again."""
        await self.runtime.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- definitions in files -----------------------------------------------------------------
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

    @classmethod
    def from_definition(
        cls,
        definition: AgentDefinition,
        *,
        path: str | Path = "AGENT.md",
        tools: Sequence[Tool | FunctionTool] = (),
        **overrides: Any,
    ) -> Agent:
        """The agent a parsed ``AgentDefinition`` describes (``loom.definition``).

        ``path`` is the file it came from: relative paths in it (``workspace``, MCP servers'
        ``cwd``) are resolved from its folder. ``tools`` and ``overrides`` as in ``from_file``.
        """
        from loom.definition import build_agent

        return build_agent(cls, definition, Path(path), tools, overrides)

    def to_definition(self) -> AgentDefinition:
        """This agent as an ``AgentDefinition`` (write it with ``definition.to_markdown()``).

        Tools are listed by name (pass your own tools again to ``from_file``); MCP servers keep
        their settings. A ``Model`` object (not a string) cannot be written and is left out.
        """
        from loom.definition import definition_of

        return definition_of(self)

    @property
    def given(self) -> Mapping[str, Any]:
        """The arguments this agent was built with (read-only)."""
        return self._given
