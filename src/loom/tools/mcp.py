"""MCP servers as Loom tools, with the official ``mcp`` SDK (stdio and streamable HTTP).

```python
from loom import Agent
from loom.tools import mcp_server

time_server = mcp_server("time", command="python", args=["-m", "mcp_server_time"],
                         prefix="time_")
agent = Agent(model="local", tools=["read_file", time_server])
```

The server is started (or the URL connected) on the agent's first turn, and its tools are
listed then, not before. Each MCP tool becomes a Loom tool: its JSON schema is passed through
to the model and used to validate arguments; its annotations give the effect class
(``readOnlyHint`` → ``pure``, ``idempotentHint`` → ``idempotent``, else ``at_most_once``).

A tool result's image and audio content, and embedded resources with a blob, become
``Image``, ``Audio`` and ``File`` parts of the tool message (``loom.tools.media``), not text.

Failures never stop a run: a server that cannot start, hangs past ``connect_timeout`` or lists
invalid tools is reported with a non-fatal ``ERROR`` event and the turn goes on without it; a
call past ``call_timeout`` is a ``timeout`` result; a server that died is restarted at the next
turn or call (a call in flight when it died gets an ``mcp_unavailable`` result, since whether it
took effect is unknown). ``await agent.aclose()`` (or ``async with agent``) stops the servers;
the connection belongs to the event loop that made it, so each ``run_sync`` call starts and
stops its own.

Stdio servers inherit only ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM`` and ``USER``
(the SDK's default) plus the ``env`` you give: API keys are not passed on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from loom.content import Audio, File, Image, describe
from loom.errors import (
    ConfigurationError,
    MCPServerError,
    MissingDependencyError,
    ToolArgumentsError,
    ToolError,
)
from loom.tools.base import Effect, RunContext

__all__ = ["MCPServer", "MCPServerError", "MCPTool", "mcp_server"]

_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]")
_CONNECTION_CLOSED = -32000


def _sdk() -> Any:
    try:
        import mcp
    except ImportError:  # pragma: no cover - part of the mcp extra
        raise MissingDependencyError("mcp", "mcp", "MCP tools") from None
    return mcp


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = [e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)] or [exc]
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3])


class _Connection:
    """One live session, owned by a task so anyio's scopes open and close in the same task."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        self.client: Any = None
        self.error: BaseException | None = None
        self.dead = False
        # Closed in close(); it must outlive this method, so no "with".
        self.errlog: TextIO = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", errors="replace"
        )
        self.task = self.loop.create_task(self._own(), name=f"mcp:{server.name}")

    async def _own(self) -> None:
        try:
            async with self.server._client(self.errlog) as client:
                self.client = client
                self.ready.set()
                await self.closing.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc
        finally:
            self.client = None
            self.dead = True
            self.ready.set()

    @property
    def usable(self) -> bool:
        if self.dead or self.client is None or self.task.done():
            return False
        if self.loop is not asyncio.get_running_loop():
            return False
        dispatcher = getattr(getattr(self.client, "_session", None), "_dispatcher", None)
        return not getattr(dispatcher, "_closed", False)  # the server went away

    def stderr_tail(self, limit: int = 600) -> str:
        try:
            self.errlog.seek(0)
            text = self.errlog.read()
        except (OSError, ValueError):
            return ""
        text = text.strip()
        return (
            f" Server stderr: …{text[-limit:]}"
            if len(text) > limit
            else (f" Server stderr: {text}" if text else "")
        )

    async def close(self) -> None:
        self.dead = True
        if self.loop is asyncio.get_running_loop():
            self.closing.set()
            if not self.task.done():
                try:
                    async with asyncio.timeout(10):
                        await asyncio.shield(self.task)
                except (TimeoutError, Exception):
                    self.task.cancel()
                    with contextlib.suppress(BaseException):
                        await self.task
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.closing.set)
        with contextlib.suppress(Exception):
            self.errlog.close()


class MCPServer:
    """An MCP server whose tools an agent can use; build one with ``mcp_server``."""

    def __init__(
        self,
        name: str,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        tools: Sequence[str] | None = None,
        connect_timeout: float = 30.0,
        call_timeout: float = 60.0,
        effect: Effect | None = None,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ConfigurationError("an MCP server needs a name")
        if (command is None) == (url is None):
            raise ConfigurationError(
                f"MCP server {name!r}: give either command= (stdio) or url= (streamable HTTP)"
            )
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"MCP server {name!r}: url must be http(s), got {url!r}")
        for label, value in (("connect_timeout", connect_timeout), ("call_timeout", call_timeout)):
            if value <= 0:
                raise ConfigurationError(f"MCP server {name!r}: {label} must be > 0")
        if prefix and _NAME_OK.search(prefix):
            raise ConfigurationError(
                f"MCP server {name!r}: prefix {prefix!r} may use only letters, digits, _ and -"
            )
        self.name = name
        self.command, self.args, self.env, self.cwd = command, list(args), dict(env or {}), cwd
        self.url, self.headers = url, dict(headers or {})
        self.prefix = prefix
        self.only = set(tools) if tools is not None else None
        self.connect_timeout, self.call_timeout = connect_timeout, call_timeout
        self.effect = effect
        self.problems: list[str] = []  # per-tool problems of the last listing, for the agent
        self._conn: _Connection | None = None
        self._tools: list[MCPTool] | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        where = self.url or " ".join([self.command or "", *self.args])
        return f"MCPServer({self.name!r}, {where!r})"

    def fresh(self) -> MCPServer:
        """A new, unconnected server with the same settings: each runtime holds its own
        connection, so one runtime's failing server never touches another's tools."""
        return MCPServer(
            self.name,
            command=self.command,
            args=self.args,
            env=self.env,
            cwd=self.cwd,
            url=self.url,
            headers=self.headers,
            prefix=self.prefix,
            tools=sorted(self.only) if self.only is not None else None,
            connect_timeout=self.connect_timeout,
            call_timeout=self.call_timeout,
            effect=self.effect,
        )

    def _client(self, errlog: TextIO) -> Any:
        mcp = _sdk()
        if self.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            http_client = None
            if self.headers:
                import httpx2

                http_client = httpx2.AsyncClient(headers=self.headers)
            transport = streamable_http_client(self.url, http_client=http_client)
            return mcp.Client(transport, read_timeout_seconds=self.call_timeout)
        from mcp.client.stdio import stdio_client

        params = mcp.StdioServerParameters(
            command=self.command, args=self.args, env=self.env or None, cwd=self.cwd
        )
        return mcp.Client(
            stdio_client(params, errlog=errlog), read_timeout_seconds=self.call_timeout
        )

    # -- connection ---------------------------------------------------------------------------
    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def _connected(self) -> Any:
        async with self._loop_lock():
            conn = self._conn
            if conn is not None and conn.usable:
                return conn.client
            if conn is not None:
                await conn.close()
                self._tools = None  # a new process may offer other tools
            conn = self._conn = _Connection(self)
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await conn.ready.wait()
            except TimeoutError:
                await conn.close()
                self._conn = None
                raise MCPServerError(
                    f"MCP server {self.name!r} did not finish connecting within "
                    f"{self.connect_timeout:g} s.{conn.stderr_tail()}"
                ) from None
            if conn.client is None:
                detail = _describe(conn.error) if conn.error else "it exited"
                tail = conn.stderr_tail()
                await conn.close()
                self._conn = None
                raise MCPServerError(
                    f"MCP server {self.name!r} could not be started: {detail}.{tail}"
                )
            return conn.client

    async def load_tools(self) -> list[MCPTool]:
        """Connect if needed and list the server's tools (once per connection)."""
        client = await self._connected()
        if self._tools is not None:
            return self._tools
        try:
            async with asyncio.timeout(self.call_timeout):
                listed: list[Any] = []
                cursor = None
                for _ in range(100):
                    page = await client.list_tools(cursor=cursor)
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except TimeoutError:
            raise MCPServerError(
                f"MCP server {self.name!r} did not list its tools within {self.call_timeout:g} s"
            ) from None
        except Exception as exc:
            raise MCPServerError(
                f"MCP server {self.name!r} returned an invalid tool list: {_describe(exc)}"
            ) from None
        self.problems = []
        tools: list[MCPTool] = []
        for spec in listed:
            if self.only is not None and spec.name not in self.only:
                continue
            try:
                tools.append(MCPTool(self, spec))
            except ConfigurationError as exc:
                self.problems.append(str(exc))
        self._tools = tools
        return tools

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> Any:
        """Call one tool; the result as text (or structured data), or a ``ToolError``."""
        client = await self._connected()
        from mcp.shared.exceptions import MCPError

        try:
            async with asyncio.timeout(self.call_timeout):
                result = await client.call_tool(remote_name, arguments)
        except TimeoutError:
            raise ToolError(
                f"{self.name}.{remote_name} did not answer within {self.call_timeout:g} s",
                code="timeout",
            ) from None
        except MCPError as exc:
            if getattr(exc, "code", None) == _CONNECTION_CLOSED:
                await self._drop()
                raise MCPServerError(
                    f"MCP server {self.name!r} stopped during the call; whether "
                    f"{remote_name} took effect is unknown. The server restarts on the next call."
                ) from None
            raise ToolError(f"{self.name}.{remote_name}: {exc}", code="mcp_error") from None
        except Exception as exc:
            await self._drop()
            raise MCPServerError(
                f"MCP server {self.name!r} failed during the call: {_describe(exc)}"
            ) from None
        return _result_value(result, f"{self.name}.{remote_name}")

    async def _drop(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
            self._tools = None

    async def aclose(self) -> None:
        """Stop the server process (stdio) or end the HTTP session."""
        await self._drop()

    async def __aenter__(self) -> MCPServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _result_value(result: Any, label: str) -> Any:
    """An MCP tool result as a Loom tool's value: its text, or a list of text and the media
    it carried (image and audio content, embedded resources with a blob) as ``Image``,
    ``Audio`` and ``File`` parts; structured content when it has nothing else."""
    items: list[str | Image | File | Audio] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            items.append(block.text)
        elif kind in ("image", "audio"):
            items.append(_media(kind, block.data, block.mime_type, None, label))
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            blob = getattr(res, "blob", None)
            if text is not None:
                items.append(text)
            elif blob is not None:
                mime = res.mime_type or ""
                kind = mime.split("/", 1)[0] if mime.startswith(("image/", "audio/")) else "file"
                name = str(res.uri).rstrip("/").rsplit("/", 1)[-1] or None
                items.append(_media(kind, blob, mime, name, label))
            else:
                items.append(f"[resource {res.uri}]")
        elif kind == "resource_link":
            items.append(f"[resource link {block.uri}]")
    if result.is_error:
        texts = [i if isinstance(i, str) else describe(i) for i in items]
        raise ToolError(
            f"{label}: {' '.join(texts) or 'the tool reported an error'}", code="mcp_tool_error"
        )
    if any(not isinstance(i, str) for i in items):
        return items
    if items:
        return "\n".join(str(i) for i in items)
    return result.structured_content if result.structured_content is not None else ""


_KINDS: dict[str, type[Image] | type[File] | type[Audio]] = {
    "image": Image,
    "audio": Audio,
    "file": File,
}


def _media(kind: str, b64: str, mime: str, name: str | None, label: str) -> Image | File | Audio:
    """One base64 block of an MCP result as a part; ``ToolError`` when it is not what it
    says (bad base64, bytes of another type, over the size limit)."""
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError(
            f"{label} returned {kind} content that is not valid base64", code="mcp_error"
        ) from None
    try:
        return _KINDS[kind].from_bytes(data, mime, name=name)
    except ValueError as exc:  # ContentError, or pydantic's ValidationError wrapping it
        errors = getattr(exc, "errors", None)
        reason = str(errors()[0]["msg"]).removeprefix("Value error, ") if errors else str(exc)
        raise ToolError(
            f"{label} returned {kind} content Loom cannot take: {reason}", code="mcp_content"
        ) from None


class MCPTool:
    """One tool of an MCP server, as a Loom ``Tool``."""

    permission_subject = None  # rules match the arguments as JSON

    def __init__(self, server: MCPServer, spec: Any) -> None:
        self.server = server
        self.remote_name: str = spec.name
        name = _NAME_OK.sub("_", f"{server.prefix}{spec.name}")[:64]
        if not name:
            raise ConfigurationError(f"MCP server {server.name!r}: a tool has an empty name")
        schema = spec.input_schema
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise ConfigurationError(
                f"MCP server {server.name!r}: tool {spec.name!r} has an input schema that is not "
                "a JSON object schema; the tool is skipped"
            )
        import jsonschema  # type: ignore[import-untyped]

        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigurationError(
                f"MCP server {server.name!r}: tool {spec.name!r} has an invalid input schema "
                f"({exc.message}); the tool is skipped"
            ) from None
        self.name = name
        self.description: str = spec.description or spec.title or ""
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}, **schema}
        self.timeout: float | None = server.call_timeout + 5
        hints = spec.annotations
        self.effect: Effect = server.effect or (
            "pure"
            if hints is not None and hints.read_only_hint
            else "idempotent"
            if hints is not None and hints.idempotent_hint
            else "at_most_once"
        )
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.server.name!r})"

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
                for e in errors[:5]
            )
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: {problems}. "
                f"Expected a JSON object matching: {self.parameters}"
            )
        return arguments

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        return await self.server.call(self.remote_name, arguments)


def mcp_server(
    name: str,
    *,
    command: str | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    prefix: str = "",
    tools: Sequence[str] | None = None,
    connect_timeout: float = 30.0,
    call_timeout: float = 60.0,
    effect: Effect | None = None,
) -> MCPServer:
    """An MCP server to put in ``Agent(tools=[...])``.

    Args:
        name: Identifies the server in errors and events.
        command: Executable of a stdio server (with ``args``, ``env``, ``cwd``).
        args: Its command-line arguments.
        env: Extra environment variables for it (the rest of yours is not passed on).
        cwd: Its working directory.
        url: URL of a streamable-HTTP server instead (with optional ``headers``).
        headers: HTTP headers, e.g. ``{"Authorization": "Bearer ..."}``.
        prefix: Put before every tool name (``"time_"`` → ``time_get_current_time``), to avoid
            clashes with other tools.
        tools: Use only these tools of the server (by their MCP names).
        connect_timeout: Seconds to start and initialise the server.
        call_timeout: Seconds per tool call (and for listing tools).
        effect: Override the effect class of all its tools.
    """
    return MCPServer(
        name,
        command=command,
        args=args,
        env=env,
        cwd=cwd,
        url=url,
        headers=headers,
        prefix=prefix,
        tools=tools,
        connect_timeout=connect_timeout,
        call_timeout=call_timeout,
        effect=effect,
    )
