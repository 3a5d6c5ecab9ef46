"""A remote A2A agent as a tool of a Loom agent, with the ``a2a-sdk`` client.

```python
from loom import Agent
from loom.tools import a2a_agent

researcher = a2a_agent("https://agents.example.com/agents/researcher",
                       headers={"Authorization": "Bearer <key>"})
agent = Agent(model="...", tools=[researcher])
```

``url`` is where the agent card lives (``<url>/.well-known/agent-card.json``; a Loom server's
agent is ``http://host:port/agents/<name>``). The card is fetched once, on the first turn that
offers the tool; the tool's name is ``name`` (default: the card's name, made a valid tool name)
and its description the card's. The model calls it with ``{"message": "..."}``.

Each Loom session keeps the remote ``contextId`` (in the store's key-value space when it has
one, namespace ``loom.a2a.remote``), so the next call from the same session continues the same
remote conversation; when the remote task stopped at ``input-required`` the next call answers
that task. Status updates arrive over ``SendStreamingMessage`` and are logged on the
``loom.tools.a2a`` logger (a tool has no channel into the run's events). A call past
``timeout`` is a ``timeout`` result and the remote task is cancelled, as it is when the Loom
call is cancelled (the run cancelled or interrupted). A remote task that failed, was rejected
or cancelled is an error result with code ``a2a_task_failed``; an unreachable agent
``a2a_unavailable``.

Files in the remote answer (``raw`` bytes or ``url`` parts) are ``Image``, ``File`` and
``Audio`` parts of the tool's result (``loom.tools.media``): stored once with it and shown to
the model as its provider allows, each named in the text where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.content import describe
from loom.errors import (
    ConfigurationError,
    ContentError,
    MissingDependencyError,
    ToolArgumentsError,
    ToolError,
)
from loom.media_input import media_part
from loom.tools.base import Effect, RunContext
from loom.tools.media import MediaPart

__all__ = ["A2AAgent", "A2ATool", "Exchange", "Item", "a2a_agent", "exchange"]

log = logging.getLogger("loom.tools.a2a")
REMOTE_NS = "loom.a2a.remote"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_-]")
_CANCEL_WAIT = 10.0


def _sdk() -> Any:
    try:
        import a2a.client
    except ImportError:  # pragma: no cover - part of the a2a extra
        raise MissingDependencyError("a2a-sdk", "a2a", "A2A agents as tools") from None
    return a2a.client


def _tool_name(raw: str) -> str:
    name = _NAME_BAD.sub("_", raw.strip())[:64].strip("_")
    return name or "remote_agent"


class A2AAgent:
    """A toolset of one tool: the remote A2A agent at ``url``. Build it with ``a2a_agent``."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float = 300.0,
        connect_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        effect: Effect = "at_most_once",
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"a2a_agent: url must be http(s), got {url!r}")
        for label, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if value <= 0:
                raise ConfigurationError(f"a2a_agent({url!r}): {label} must be > 0")
        if name is not None and _NAME_BAD.search(name):
            raise ConfigurationError(
                f"a2a_agent({url!r}): name {name!r} may use only letters, digits, _ and -"
            )
        self.url = url.rstrip("/")
        self.name = name or self.url
        self.tool_name = name
        self.description = description
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.headers = dict(headers or {})
        self.effect: Effect = effect
        self.card: Any = None
        self._client: Any = None
        self._http: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tool: A2ATool | None = None
        self._contexts: dict[str, dict[str, str]] = {}  # without a KV store

    def __repr__(self) -> str:
        return f"A2AAgent({self.url!r})"

    def fresh(self) -> A2AAgent:
        """A new, unconnected copy (each runtime holds its own HTTP client)."""
        return A2AAgent(
            self.url,
            name=self.tool_name,
            description=self.description,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            headers=self.headers,
            effect=self.effect,
        )

    async def client(self) -> Any:
        """The SDK client, made (with the card) on first use in this event loop."""
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        sdk = _sdk()
        import httpx

        timeout = httpx.Timeout(self.timeout, connect=self.connect_timeout)
        http = httpx.AsyncClient(headers=self.headers, timeout=timeout)
        try:
            if self.card is None:
                resolver = sdk.A2ACardResolver(http, self.url)
                self.card = await resolver.get_agent_card()
            config = sdk.ClientConfig(
                httpx_client=http, streaming=True, supported_protocol_bindings=["JSONRPC"]
            )
            client = sdk.ClientFactory(config).create(self.card)
        except BaseException:
            await http.aclose()
            raise
        self._client, self._http, self._loop = client, http, loop
        return client

    async def load_tools(self) -> list[A2ATool]:
        """The remote agent as one tool (its card is fetched the first time)."""
        try:
            await self.client()
        except Exception as exc:
            raise ToolError(
                f"cannot reach the A2A agent at {self.url}: {exc}", code="a2a_unavailable"
            ) from exc
        if self._tool is None:
            card = self.card
            name = self.tool_name or _tool_name(card.name)
            text = self.description or card.description or f"The remote agent {card.name}."
            skills = "; ".join(s.name for s in card.skills if s.name and s.name != card.name)
            if skills and self.description is None:
                text = f"{text} (skills: {skills})"
            self._tool = A2ATool(self, name, f"{text} Send it a message in plain language.")
        return [self._tool]

    async def aclose(self) -> None:
        """Close the HTTP client."""
        client, http = self._client, self._http
        self._client = self._http = self._loop = None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if http is not None:
            with contextlib.suppress(Exception):
                await http.aclose()

    # -- the remote conversation of each Loom session --------------------------------------------
    def _key(self, session_id: str) -> str:
        return f"{session_id}:{self.url}"

    async def remembered(self, ctx: RunContext) -> dict[str, str]:
        """The remote context (and task waiting for input) of this Loom session."""
        return await self.load_context(ctx.store, ctx.session_id)

    async def remember(self, ctx: RunContext, value: dict[str, str]) -> None:
        await self.save_context(ctx.store, ctx.session_id, value)

    async def load_context(self, store: Any, session_id: str) -> dict[str, str]:
        """``remembered`` for the Loom session ``session_id`` of ``store``."""
        kv = _kv(store)
        if kv is None:
            return dict(self._contexts.get(self._key(session_id), {}))
        value = await kv.get_value(REMOTE_NS, self._key(session_id))
        return dict(value) if isinstance(value, dict) else {}

    async def save_context(self, store: Any, session_id: str, value: dict[str, str]) -> None:
        """``remember`` for the Loom session ``session_id`` of ``store``."""
        kv = _kv(store)
        if kv is None:
            self._contexts[self._key(session_id)] = value
        else:
            await kv.put_value(REMOTE_NS, self._key(session_id), value)


def _kv(store: Any) -> Any:
    if store is None:
        return None
    from loom.store.base import capabilities_of

    return capabilities_of(store).kv


class A2ATool:
    """One call sends one message to the remote agent and returns its answer."""

    def __init__(self, owner: A2AAgent, name: str, description: str) -> None:
        self.owner, self.name, self.description = owner, name, description
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What to ask or tell it."}},
            "required": ["message"],
            "additionalProperties": False,
        }
        self.timeout: float | None = owner.timeout
        self.effect: Effect = owner.effect

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        message = arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ToolArgumentsError(f"{self.name} takes {{'message': '<non-empty text>'}}")
        extra = sorted(set(arguments) - {"message"})
        if extra:
            raise ToolArgumentsError(f"{self.name} takes only 'message'; got also {extra}")
        return {"message": message}

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> str | list[str | MediaPart]:
        """The remote agent's answer: its text, or its text and the images, files and audio
        it sent (``Exchange.result``), which become the tool message's parts."""
        from a2a.types.a2a_pb2 import TaskState

        client = await self.owner.client()
        known = await self.owner.remembered(ctx)

        async def first_context(context_id: str) -> None:  # remember it as soon as known
            if not known.get("context_id"):
                await self.owner.remember(ctx, {"context_id": context_id})

        try:
            ex = await exchange(
                client, arguments["message"], known, on_context=first_context, label=self.name
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ToolError(
                f"the A2A agent at {self.owner.url} failed: {exc}", code="a2a_unavailable"
            ) from exc
        await self.owner.remember(ctx, ex.remembered())
        if ex.state == TaskState.TASK_STATE_COMPLETED:
            return ex.result()
        if ex.waiting:
            return f"[the remote agent waits for your reply] {ex.status_text or ex.answer}"
        raise ToolError(
            f"the remote agent's task {ex.task_id or '?'} ended {ex.state_name}: "
            f"{ex.status_text or ex.answer}",
            code="a2a_task_failed",
        )


Item = str | MediaPart
"""One piece of a remote answer, in order: a text part's text, or a file part as a Loom part."""


@dataclass(slots=True)
class Exchange:
    """One message sent to a remote agent and what came back, filled in as events arrive (so a
    cancelled exchange still says which remote task it was).

    ``artifacts`` holds each artifact's text and files in their order, ``status`` the latest
    status message's: a file part (bytes, or a URL) as an ``Image``, ``File`` or ``Audio`` by
    its media type (``loom.media_input.media_part``); one Loom cannot use (bytes that are not
    what they claim, over the size limit, a URL scheme no provider fetches) as a line naming
    it and why."""

    task_id: str = ""
    context_id: str = ""
    state: int | None = None  # a2a TaskState
    artifacts: list[list[Item]] = field(default_factory=list)
    status: list[Item] = field(default_factory=list)

    @property
    def texts(self) -> list[str]:
        """Each artifact's text, its files named by placeholder lines where they were."""
        return [_joined(items) for items in self.artifacts]

    @property
    def status_text(self) -> str:
        """The latest status message's text, its files named the same way."""
        return _joined(self.status)

    @property
    def answer(self) -> str:
        """The answer as text: the artifacts' (else the status message's), each file named
        by its placeholder line (``[image chart.png: image/png, 24x16, 1,234 bytes]``)."""
        return "\n".join(t for t in self.texts if t) or self.status_text

    @property
    def content(self) -> list[Item]:
        """The answer's text and files in order: the artifacts' (else the status message's,
        where a remote agent that sends no artifact puts its answer)."""
        items = [i for items in self.artifacts for i in items if i != ""]
        return items or [i for i in self.status if i != ""]

    @property
    def media(self) -> list[MediaPart]:
        """The files of the answer (``content``'s parts)."""
        return [i for i in self.content if not isinstance(i, str)]

    def result(self) -> str | list[Item]:
        """What the tool returns: the answer's text when it has no file, else its text and
        files in order (the executor makes the files the tool message's parts, stored once,
        and names each in the text the model reads: ``loom.tools.media``)."""
        content = self.content
        if all(isinstance(i, str) for i in content):
            return self.answer
        return content

    def set_status(self, parts: Any) -> None:
        """Keep a status message's content (an empty one keeps what came before)."""
        items = _items(parts)
        if items:
            self.status = items

    @property
    def waiting(self) -> bool:
        """The remote task stopped for input (or auth): the next message answers it."""
        from a2a.types.a2a_pb2 import TaskState

        return self.state in (
            TaskState.TASK_STATE_INPUT_REQUIRED,
            TaskState.TASK_STATE_AUTH_REQUIRED,
        )

    @property
    def state_name(self) -> str:
        from a2a.types.a2a_pb2 import TaskState

        return str(TaskState.Name(self.state or 0)).removeprefix("TASK_STATE_").lower()

    def remembered(self) -> dict[str, str]:
        """What to keep for the next message: the context, and the task when it waits."""
        out = {"context_id": self.context_id} if self.context_id else {}
        if self.waiting and self.task_id:
            out["task_id"] = self.task_id
        return out


async def exchange(
    client: Any,
    text: str,
    known: Mapping[str, str],
    *,
    on_context: Callable[[str], Awaitable[None]] | None = None,
    label: str = "a2a",
    into: Exchange | None = None,
) -> Exchange:
    """Send ``text`` to the remote agent (continuing ``known``'s ``context_id``, answering its
    ``task_id``) over ``SendStreamingMessage`` and read it to the end. ``on_context`` is awaited
    once, as soon as the remote context is known; ``into`` is filled in as events arrive. When
    the caller is cancelled (or times out) the remote task is cancelled before this re-raises.
    Transport failures propagate as they are."""
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState

    ex = into if into is not None else Exchange()
    ex.context_id = known.get("context_id", "")
    message = Message(
        role=Role.ROLE_USER,
        message_id=str(uuid.uuid4()),
        parts=[Part(text=text)],
        context_id=known.get("context_id", ""),
        task_id=known.get("task_id", ""),
    )
    # the remote task's id, as soon as the first event names it: a call cancelled before
    # then still cancels the remote task once the id arrives
    named: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def consume() -> None:
        told = False
        async for response in client.send_message(SendMessageRequest(message=message)):
            if response.HasField("message"):  # a message-only answer
                ex.context_id = response.message.context_id or ex.context_id
                ex.status = _items(response.message.parts)
                ex.state = TaskState.TASK_STATE_COMPLETED
                continue
            if response.HasField("task"):
                task = response.task
                ex.task_id, ex.context_id, ex.state = task.id, task.context_id, task.status.state
                ex.artifacts = [_items(a.parts) for a in task.artifacts]
                ex.set_status(task.status.message.parts)
            elif response.HasField("status_update"):
                update = response.status_update
                ex.task_id, ex.context_id = update.task_id, update.context_id
                ex.state = update.status.state
                ex.set_status(update.status.message.parts)
                log.info(
                    "%s: task %s %s %s", label, ex.task_id, TaskState.Name(ex.state), ex.status_text
                )
            elif response.HasField("artifact_update"):
                items = _items(response.artifact_update.artifact.parts)
                if response.artifact_update.append and ex.artifacts:
                    _append(ex.artifacts[-1], items)
                else:
                    ex.artifacts.append(items)
            if ex.task_id and not named.done():
                named.set_result(ex.task_id)
            if ex.task_id and not told and on_context is not None:
                told = True
                await on_context(ex.context_id)

    reader = asyncio.ensure_future(consume())
    try:
        await asyncio.shield(reader)
    except asyncio.CancelledError:  # the call timed out or the run was cancelled
        await _cancel_remote(client, named, reader)
        raise
    return ex


def _items(parts: Any) -> list[Item]:
    """A2A parts as the answer's items: text parts' text (consecutive ones joined by newlines,
    as one text), file parts (``raw`` bytes or a ``url``) as Loom parts. A file Loom cannot
    use is a line naming it and why, so the model learns a file came back and was left out."""
    items: list[Item] = []
    for p in parts:
        if p.HasField("text"):
            item: Item = p.text
        elif p.HasField("raw") or p.HasField("url"):
            item = _medium(p)
        else:
            continue
        if isinstance(item, str) and items and isinstance(items[-1], str):
            items[-1] = f"{items[-1]}\n{item}"
        else:
            items.append(item)
    return items


def _medium(p: Any) -> Item:
    name = p.filename or None
    try:
        if p.HasField("raw"):
            return media_part(p.media_type, data=p.raw, name=name)
        return media_part(p.media_type, url=p.url, name=name)
    except ContentError as exc:  # the remote's file is unusable: say so, lose nothing else
        kind = p.media_type.partition("/")[0] if p.media_type else "file"
        kind = kind if kind in ("image", "audio") else "file"
        label = f" {p.filename}" if p.filename else ""
        where = f", {len(p.raw):,} bytes" if p.HasField("raw") else f", at {p.url}"
        return f"[{kind}{label}: {p.media_type or 'unknown type'}{where}; left out: {exc}]"


def _append(items: list[Item], more: list[Item]) -> None:
    """An artifact update that appends to the last artifact: text runs on (a streamed text
    is cut anywhere, so no separator), files follow."""
    if more and items and isinstance(items[-1], str) and isinstance(more[0], str):
        items[-1] += more[0]
        more = more[1:]
    items.extend(more)


def _joined(items: list[Item]) -> str:
    return "\n".join(i if isinstance(i, str) else describe(i) for i in items if i != "")


async def _cancel_remote(
    client: Any, named: asyncio.Future[str], reader: asyncio.Future[None]
) -> None:
    """Cancel the remote task (waiting for its id if the first event has not come yet), then
    stop reading; shielded so the caller's cancellation cannot cut it short."""
    from a2a.types.a2a_pb2 import CancelTaskRequest

    async def cancel() -> None:
        try:
            with contextlib.suppress(Exception):
                task_id = await asyncio.wait_for(asyncio.shield(named), _CANCEL_WAIT)
                await asyncio.wait_for(
                    client.cancel_task(CancelTaskRequest(id=task_id)), _CANCEL_WAIT
                )
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(asyncio.ensure_future(cancel()))


def a2a_agent(
    url: str,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = 300.0,
    connect_timeout: float = 30.0,
    headers: Mapping[str, str] | None = None,
    effect: Effect = "at_most_once",
) -> A2AAgent:
    """A remote A2A agent as a tool: put the result in ``Agent(tools=[...])``.

    ``url``: where the agent card is (``<url>/.well-known/agent-card.json``). ``name`` and
    ``description`` override the card's. ``timeout``: seconds one call may take (the remote
    task is cancelled past it). ``headers``: sent with every request (``Authorization``).
    ``effect``: what re-running a call after a crash would do (default ``at_most_once``)."""
    return A2AAgent(
        url,
        name=name,
        description=description,
        timeout=timeout,
        connect_timeout=connect_timeout,
        headers=headers,
        effect=effect,
    )
