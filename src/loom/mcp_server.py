"""Loom agents as MCP tools (the official ``mcp`` SDK, v2 API; the ``mcp`` extra pins ``<3``).

Every agent of a registry is one tool: its name, its description, the input schema
``{message, session_id?}``; the result is the answer's text (then its images as
``ImageContent``, audio as ``AudioContent``, other files as an ``EmbeddedResource`` blob:
:func:`media_content`; its reasoning is not sent) plus structured content
``{session_id, run_id, stop_reason, usage}``. One ``tools/call`` is one Loom run on the
given ``Runtime`` (the server's, so a session started over MCP continues over any protocol).

While the run goes, each tool start and end, each model answer's token counts and each
approval request becomes a ``notifications/progress`` whose message is a small JSON object
(only when the client sent a progress token: the SDK drops them otherwise). A client's
``notifications/cancelled`` cancels the run (``Turn.cancel``: committed work stays, open calls
get ``interrupted`` results). A call parked for approval is asked of the user by MCP
elicitation when the client declared it (inline on a handshake connection, as an
``InputRequiredResult`` round trip on a 2026-07-28 one), and the run resumes with the
decisions; otherwise the call ends (``isError`` false) with the pending calls described and
how to decide them (over HTTP: the server's approval endpoints; over stdio, where there is no
server: ``loom resume``). A run whose model asked the client something (a server query) ends
the call with the question, how to answer it and ``pending_query`` in the structured content.

The same ``Server`` serves stdio (``loom mcp``, :func:`serve_stdio`) and streamable HTTP
(``loom serve`` mounts it at ``/mcp``: ``loom.server.mcp_http``). It keeps no state between
calls: what a call needs lives in the Loom session it names.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loom.engine.run_inputs import Resume
from loom.errors import InputError, LoomError
from loom.events import (
    AgentEvent,
    ApprovalRequired,
    LlmComplete,
    ToolErrorEvent,
    ToolExecutionStart,
    ToolResultEvent,
)
from loom.messages import RunResult, Usage

if TYPE_CHECKING:
    from mcp.server import Server, ServerRequestContext

    from loom.agent import Agent
    from loom.content import Media
    from loom.engine.loop import Turn
    from loom.engine.runtime import Runtime

__all__ = [
    "INPUT_SCHEMA",
    "MEDIA_URI",
    "Resolver",
    "build_server",
    "media_content",
    "progress_note",
    "serve_stdio",
]

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1, "description": "The user's message."},
        "session_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "The Loom session to continue (from a previous result's "
            "structuredContent.session_id); a new session when left out.",
        },
    },
    "required": ["message"],
    "additionalProperties": False,
}
"""Every agent tool's input schema."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve", "description": "Run this call?"},
        "reason": {"type": "string", "title": "Reason", "description": "Why (when rejecting)."},
    },
    "required": ["approve"],
}

Resolver = Callable[["ServerRequestContext[Any, Any]"], tuple[Mapping[str, "Agent"], "Runtime"]]
"""What one request may use: the agents it sees and the runtime that runs them."""


def _as_usage(usage: Usage | Mapping[str, Any] | None) -> Usage:
    if usage is None or isinstance(usage, Usage):
        return usage or Usage()
    return Usage(
        **{k: int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens", "requests")}
    )


def _usage(usage: Usage | Mapping[str, Any] | None) -> dict[str, int]:
    u = _as_usage(usage)
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "requests": u.requests,
    }


def progress_note(event: AgentEvent, total: Usage) -> dict[str, Any] | None:
    """The progress message (as a dict) an event becomes, or None for events not reported.
    ``total`` is the run's token count before this event."""
    if isinstance(event, ToolExecutionStart):
        return {
            "type": "tool_start",
            "tool": event.tool_name,
            "id": event.tool_call_id,
            "input": event.arguments,
        }
    if isinstance(event, ToolResultEvent | ToolErrorEvent):
        return {
            "type": "tool_end",
            "tool": event.tool_name,
            "id": event.tool_call_id,
            "success": event.success,
            "error_code": event.error_code,
        }
    if isinstance(event, LlmComplete):
        call = _as_usage(event.usage)
        return {"type": "tokens", "call": _usage(call), "total": _usage(total + call)}
    if isinstance(event, ApprovalRequired):
        return {
            "type": "approval_required",
            "tool": event.tool_name,
            "id": event.tool_call_id,
            "input": event.arguments,
            "reason": event.reason,
        }
    return None


def _description(agent: Agent) -> str:
    text = str(getattr(agent, "description", None) or "").strip()  # AGENT.md description
    if not text:  # the instructions' first line says what the agent is for
        first = next(
            (ln.strip() for ln in (agent.instructions or "").splitlines() if ln.strip()), ""
        )
        text = first or f"The Loom agent {agent.name!r}."
    return text


def _error(message: str) -> Exception:
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS

    return MCPError(INVALID_PARAMS, message)


def _arguments(args: Mapping[str, Any] | None) -> tuple[str, str | None]:
    args = args or {}
    unknown = sorted(set(args) - {"message", "session_id"})
    if unknown:
        raise _error(
            f"unknown argument(s) {', '.join(unknown)}; an agent tool takes "
            "'message' (text) and optionally 'session_id'"
        )
    message = args.get("message")
    if not isinstance(message, str) or not message.strip():
        raise _error(
            "'message' is required and must be non-empty text: the user's message to the agent"
        )
    session_id = args.get("session_id")
    if session_id is not None:
        from loom.server.ownership import client_session_id

        try:  # checked before anything runs and namespaced to the key, as on every surface
            session_id = client_session_id(session_id, "session_id")
        except InputError as exc:
            raise _error(
                f"'session_id': {exc} (give a previous result's session_id, "
                "or leave it out to start a new session)"
            ) from None
    return message, session_id


async def _run(ctx: ServerRequestContext[Any, Any], turn: Turn) -> RunResult:
    """Run ``turn`` in its own task, reporting progress; the client's cancellation (or its
    going away) cancels the turn, which still commits how it ended."""
    queue: asyncio.Queue[AgentEvent | None] = asyncio.Queue()
    task = asyncio.ensure_future(turn.run(queue.put_nowait))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    total, step, reporting = Usage(), 0, True
    try:
        while (event := await queue.get()) is not None:
            note = progress_note(event, total) if reporting else None
            if isinstance(event, LlmComplete):
                total = total + _as_usage(event.usage)
            if note is None:
                continue
            step += 1
            try:  # a no-op without a progress token; a gone client must not stop the run
                await ctx.session.report_progress(step, None, json.dumps(note, default=str))
            except Exception:
                reporting = False
        await task
    except BaseException:
        turn.cancel("cancelled by the MCP client")
        import anyio

        with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
            await task
        raise
    assert turn.result is not None
    return turn.result


MEDIA_URI = "loom://media/{ref}"
"""The URI of an answer's file embedded in a tool result (its bytes travel in the result)."""


def media_content(media: Sequence[Media]) -> list[Any]:
    """An answer's media (bytes loaded) as MCP content: an image as ``ImageContent``, audio as
    ``AudioContent``, any other file as an ``EmbeddedResource`` with a blob (its name in
    ``_meta["loom/filename"]``); a medium held as a URL as a ``ResourceLink``."""
    import mcp_types as t

    from loom.content import Audio, Image

    out: list[Any] = []
    for m in media:
        if m.data is None:
            if m.url is not None:
                name = m.name or m.url.rsplit("/", 1)[-1] or m.url
                out.append(t.ResourceLink(name=name, uri=m.url, mime_type=m.media_type or None))
            continue
        data = base64.b64encode(m.data).decode("ascii")
        if isinstance(m, Image):
            out.append(t.ImageContent(type="image", data=data, mime_type=m.media_type))
        elif isinstance(m, Audio):
            out.append(t.AudioContent(type="audio", data=data, mime_type=m.media_type))
        else:
            blob = t.BlobResourceContents(
                uri=MEDIA_URI.format(ref=m.ref),
                mime_type=m.media_type or None,
                blob=data,
                meta={"loom/filename": m.name} if m.name else None,
            )
            out.append(t.EmbeddedResource(type="resource", resource=blob))
    return out


def _answer(result: RunResult, over_http: bool, media: Sequence[Media] = ()) -> Any:
    import mcp_types as t

    from loom.server.parked import describe_query

    structured: dict[str, Any] = {
        "session_id": result.session_id,
        "run_id": result.run_id,
        "stop_reason": result.stop_reason,
        "usage": _usage(result.usage),
    }
    failed = result.error is not None
    if failed:
        structured["error"] = result.error
    text = result.text or (f"the run failed: {result.error}" if failed else "")
    if result.stop_reason == "awaiting_input" and result.pending_query:
        structured["pending_query"] = result.pending_query
        asked = describe_query(result.session_id, result.pending_query, over_http=over_http)
        text = f"{text}\n\n{asked}" if text else asked
    return t.CallToolResult(
        content=[t.TextContent(type="text", text=text), *media_content(media)],
        structured_content=structured,
        is_error=failed,
    )


def _pending(result: RunResult, why: str, over_http: bool) -> Any:
    """The call's result when a parked call cannot be asked of the user here."""
    import mcp_types as t

    from loom.server.parked import describe_pending_calls

    pending = list(result.pending_approvals)
    described = describe_pending_calls(result.session_id, pending, over_http=over_http)
    text = f"{described}\n(Not asked here: {why}.)"
    structured = {
        "session_id": result.session_id,
        "run_id": result.run_id,
        "stop_reason": result.stop_reason,
        "usage": _usage(result.usage),
        "pending_approvals": pending,
    }
    return t.CallToolResult(
        content=[t.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=False,
    )


def _ask(p: Mapping[str, Any]) -> str:
    return (
        f"The agent wants to call {p['tool_name']} with {json.dumps(p.get('arguments', {}))}"
        f" ({p.get('reason') or 'it needs approval'}). Approve?"
    )


def _decision(answer: Any) -> dict[str, Any] | None:
    """An elicitation answer as a Loom decision (None: dismissed, no decision)."""
    action = getattr(answer, "action", None)
    content = getattr(answer, "content", None) or {}
    if action == "accept" and content.get("approve") is True:
        return {"decision": "approve"}
    if action in ("accept", "decline"):
        reason = content.get("reason") if isinstance(content.get("reason"), str) else None
        return {"decision": "reject", "reason": reason or "declined by the MCP client's user"}
    return None


def _elicits(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    return caps is not None and caps.elicitation is not None


async def _elicit_inline(
    ctx: ServerRequestContext[Any, Any], pending: list[dict[str, Any]]
) -> dict[str, dict[str, Any]] | None:
    """Ask each parked call of the user over the connection (handshake-era clients)."""
    decisions: dict[str, dict[str, Any]] = {}
    for p in pending:
        answer = await ctx.session.elicit_form(_ask(p), APPROVAL_SCHEMA, ctx.request_id)
        decision = _decision(answer)
        if decision is None:
            return None
        decisions[p["tool_call_id"]] = decision
    return decisions


def _input_required(result: RunResult) -> Any:
    """A 2026-07-28 round trip: the client elicits, then retries with the answers."""
    import mcp_types as t

    requests: dict[str, Any] = {
        p["tool_call_id"]: t.ElicitRequest(
            params=t.ElicitRequestFormParams(message=_ask(p), requested_schema=APPROVAL_SCHEMA)
        )
        for p in result.pending_approvals
    }
    state = json.dumps({"session_id": result.session_id})
    return t.InputRequiredResult(input_requests=requests, request_state=state)


async def _decisions_from_retry(
    runtime: Runtime, params: Any
) -> tuple[str, dict[str, dict[str, Any]] | None]:
    """The session and decisions a retried ``tools/call`` carries (None: dismissed)."""
    try:
        session_id = json.loads(params.request_state)["session_id"]
        assert isinstance(session_id, str)
    except Exception:
        raise _error(
            "requestState is not one this server sent; call the tool again without it"
        ) from None
    pending = await runtime.pending_approvals(session_id)
    answers = params.input_responses or {}
    decisions: dict[str, dict[str, Any]] = {}
    for p in pending:
        if p.tool_call_id not in answers:
            raise _error(
                f"no answer for the pending call {p.tool_call_id!r} of session {session_id!r}"
            )
        decision = _decision(answers[p.tool_call_id])
        if decision is None:
            return session_id, None
        decisions[p.tool_call_id] = decision
    if not pending:
        raise _error(f"session {session_id!r} has no tool calls waiting for approval")
    return session_id, decisions


def build_server(resolve: Resolver, name: str = "loom", *, over_http: bool = True) -> Server[Any]:
    """The MCP server for the agents ``resolve`` hands each request. ``over_http``: served by
    ``loom serve`` (a parked call is decided on its endpoints), else by ``loom mcp`` over
    stdio (decided with ``loom resume``)."""
    import mcp_types as t
    from mcp.server import Server

    from loom import __version__
    from loom.server.surface_media import answer_media

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> t.ListToolsResult:
        agents, _ = resolve(ctx)
        return t.ListToolsResult(
            tools=[
                t.Tool(name=a.name, description=_description(a), input_schema=INPUT_SCHEMA)
                for a in agents.values()
            ]
        )

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: Any) -> Any:
        agents, runtime = resolve(ctx)
        agent = agents.get(params.name)
        if agent is None:
            raise _error(
                f"no tool {params.name!r}; this server's tools (its agents): "
                f"{', '.join(agents) or 'none'}"
            )
        try:
            if params.request_state is not None:  # the answers to an InputRequiredResult
                retried, decisions = await _decisions_from_retry(runtime, params)
                if decisions is None:
                    result = await _last(runtime, retried)
                    return _pending(result, "the user dismissed the question", over_http)
                turn = await runtime.start(agent, Resume(decisions), session_id=retried)
            else:
                message, session_id = _arguments(params.arguments)
                turn = await runtime.start(agent, message, session_id=session_id)
            while True:
                result = await _run(ctx, turn)
                if result.stop_reason != "awaiting_approval":
                    # the answer's images and files beside its text (its reasoning stays)
                    media = await answer_media(result.messages, runtime.store)
                    return _answer(result, over_http, media)
                if not _elicits(ctx):
                    return _pending(
                        result, "this client does not take elicitation requests", over_http
                    )
                if not ctx.session.can_send_request:
                    return _input_required(result)
                decisions = await _elicit_inline(ctx, list(result.pending_approvals))
                if decisions is None:
                    return _pending(result, "the user dismissed the question", over_http)
                turn = await runtime.start(agent, Resume(decisions), session_id=result.session_id)
        except InputError as exc:
            raise _error(str(exc)) from exc
        except LoomError as exc:  # a session of another key, a busy session, ...
            raise _error(f"{type(exc).__name__}: {exc}") from exc

    return Server(
        name,
        version=__version__,
        title="Loom agents",
        description="Each tool is a Loom agent: send it a message, get its answer.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _last(runtime: Runtime, session_id: str) -> RunResult:
    """A stand-in result for a session whose parked calls stay undecided."""
    pending = [p.to_dict() for p in await runtime.pending_approvals(session_id)]
    run_id = pending[0]["run_id"] if pending else ""
    return RunResult(
        output=None,
        messages=[],
        usage=Usage(),
        session_id=session_id,
        run_id=run_id,
        stop_reason="awaiting_approval",
        pending_approvals=pending,
    )


async def serve_stdio(agents: Mapping[str, Agent], runtime: Runtime) -> None:
    """Serve ``agents`` as MCP tools over stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build_server(lambda ctx: (agents, runtime), over_http=False)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
