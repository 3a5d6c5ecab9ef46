"""Tools: the ``Tool`` protocol, ``RunContext``, and ``@tool`` for typed functions."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, get_type_hints, overload, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from loom.errors import ToolArgumentsError, ToolDefinitionError
from loom.messages import Effect, ToolSpec

__all__ = [
    "Effect",
    "FunctionTool",
    "RunContext",
    "Tool",
    "ToolArgumentsError",
    "ToolSpec",
    "tool",
]

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(slots=True)
class RunContext:
    """What a tool may know about the run that called it (declare it as the first parameter)."""

    session_id: str
    run_id: str
    tool_call_id: str
    agent_name: str = ""
    workspace: Path | None = None
    deps: Any = None
    store: Any = None
    owner: str | None = None
    """Whom the run acts for (``RunOptions.owner``, decided once when the run started: the
    API key's principal, a schedule's owner; ``None``: nobody, shared)."""
    sandbox: Any = None
    """The call's sandbox (``loom.sandbox.sessions.SandboxAccess``: the agent's ``sandbox:``
    setting and the session's sandbox), or ``None`` outside a runtime."""
    _cancel: threading.Event | None = None  # made on first use: most calls never need it

    @property
    def idempotency_key(self) -> str:
        """Stable across a crash and re-run of the same call: ``run_id:tool_call_id``."""
        return f"{self.run_id}:{self.tool_call_id}"

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the call timed out or the run was cancelled; sync tools may wait on it."""
        if self._cancel is None:
            self._cancel = threading.Event()
        return self._cancel

    @property
    def cancelled(self) -> bool:
        """True once the call timed out or the run was cancelled; long sync tools should poll it."""
        return self._cancel is not None and self._cancel.is_set()


@runtime_checkable
class Tool(Protocol):
    """Anything the loop can call as a tool. ``@tool`` builds one from a function.

    ``timeout`` (seconds, or None for the agent's default) and ``effect`` are read by the
    executor and crash recovery. ``run`` receives already-validated arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    timeout: float | None
    effect: Effect

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Return the arguments to call with, or raise ``ToolArgumentsError``."""
        ...

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        """Execute the tool."""
        ...


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    if not doc:
        return "", {}
    import docstring_parser  # small, but only tool definition needs it

    parsed = docstring_parser.parse(doc)
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    params = {p.arg_name: p.description or "" for p in parsed.params}
    return "\n\n".join(parts).strip(), params


def _takes_context(sig: inspect.Signature, hints: dict[str, Any]) -> bool:
    params = list(sig.parameters.values())
    if not params:
        return False
    first = params[0]
    return hints.get(first.name) is RunContext or first.annotation == "RunContext"


class FunctionTool:
    """A tool made from a typed Python function (sync or async)."""

    __slots__ = (
        "_args_model",
        "_fast_fields",
        "_takes_ctx",
        "blocking",
        "description",
        "effect",
        "fn",
        "is_async",
        "name",
        "parameters",
        "timeout",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        effect: Effect = "at_most_once",
        blocking: bool = True,
    ) -> None:
        if not callable(fn):
            raise ToolDefinitionError(f"@tool needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or fn.__name__
        if not _NAME_RE.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-'"
            )
        if timeout is not None and timeout <= 0:
            raise ToolDefinitionError(f"tool {self.name!r}: timeout must be > 0, got {timeout}")
        if effect not in ("pure", "idempotent", "at_most_once"):
            raise ToolDefinitionError(
                f"tool {self.name!r}: effect must be 'pure', 'idempotent' or 'at_most_once'"
            )
        self.timeout = timeout
        self.effect: Effect = effect
        self.blocking = blocking
        self.is_async = inspect.iscoroutinefunction(fn)
        sig = inspect.signature(fn)
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ToolDefinitionError(f"tool {self.name!r}: cannot read type hints: {exc}") from exc
        self._takes_ctx = _takes_context(sig, hints)
        summary, param_docs = _parse_docstring(fn.__doc__)
        self.description = description if description is not None else summary
        fields: dict[str, Any] = {}
        for i, param in enumerate(sig.parameters.values()):
            if i == 0 and self._takes_ctx:
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {self.name!r}: *args/**kwargs cannot be described to a model; "
                    "declare each parameter"
                )
            annotation = hints.get(param.name, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            info = (
                FieldInfo.merge_field_infos(
                    FieldInfo(default=default), description=param_docs.get(param.name) or None
                )
                if not isinstance(default, FieldInfo)
                else default
            )
            fields[param.name] = (annotation, info)
        try:
            self._args_model: type[BaseModel] = create_model(
                f"{self.name}_args",
                __config__=ConfigDict(extra="forbid"),
                **fields,
            )
            schema = self._args_model.model_json_schema()
        except Exception as exc:
            raise ToolDefinitionError(
                f"tool {self.name!r}: a parameter type cannot be turned into a JSON schema: {exc}"
            ) from exc
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.setdefault("properties", {})
        self.parameters: dict[str, Any] = schema
        self._fast_fields = tuple(fields)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            model = self._args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: {problems}. "
                f"Expected a JSON object matching: {self.parameters}"
            ) from None
        return {name: getattr(model, name) for name in self._fast_fields}

    @property
    def runs_inline(self) -> bool:
        """A sync tool run on the event loop's thread: nothing can interrupt it mid-call."""
        return not self.is_async and not self.blocking

    @property
    def runs_in_thread(self) -> bool:
        """A sync tool run on Loom's tool threads: a timeout abandons it, it cannot be stopped."""
        return not self.is_async and self.blocking

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        args = (ctx,) if self._takes_ctx else ()
        if self.is_async:
            return await self.fn(*args, **arguments)
        if not self.blocking:
            return self.fn(*args, **arguments)
        # Imported here: the thread pool (and asyncio) load with the first sync tool call,
        # not with `from loom import tool`.
        from loom.tools.threads import run_in_tool_thread

        return await run_in_tool_thread(self.fn, *args, **arguments)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in tests)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r}, effect={self.effect!r})"


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    effect: Effect = "at_most_once",
    blocking: bool = True,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    effect: Effect = "at_most_once",
    blocking: bool = True,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function into a tool.

    The JSON schema comes from the signature, descriptions from the Google-style docstring.
    An optional first parameter annotated ``RunContext`` receives the run's context.

    Args:
        name: Tool name shown to the model (default: the function name).
        description: Overrides the docstring summary.
        timeout: Seconds before the call is cancelled (default: the agent's ``tool_timeout``).
        effect: ``"pure"``, ``"idempotent"`` or ``"at_most_once"`` (default), used by crash
            recovery to decide whether an interrupted call may run again.
        blocking: Sync functions run on Loom's tool threads (``loom.tools.threads``) unless
            ``blocking=False`` says they return at once (pure computation); async functions
            always run on the loop.
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f, name=name, description=description, timeout=timeout, effect=effect, blocking=blocking
        )

    return wrap(fn) if fn is not None else wrap


def spec_of(t: Tool) -> ToolSpec:
    return ToolSpec(t.name, t.description, t.parameters)
