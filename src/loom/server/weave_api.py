"""Seed 000's Weave over HTTP: ``POST /v1/weave`` (one turn, one answer) and
``POST /v1/weave:stream`` (the same turn as SSE progress events).

The progress vocabulary (``started``, ``stage``, ``delta``, ``tool_start``, ``tool_end``,
``tokens``, ``approval_required``, ``warning``, ``error``, ``final``) is shared with the gRPC
service (``loom.server.grpc_weave``): :func:`progress` turns Loom's typed events into it and
:func:`weave_reply` turns a finished run into the unary answer. The router's lifespan also
starts the gRPC server when ``loom serve --grpc-port`` asked for one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from loom.engine.driving import discard
from loom.engine.run_inputs import Resume
from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    ApprovalRequired,
    ErrorEvent,
    LlmComplete,
    LlmDelta,
    StateChange,
    ToolErrorEvent,
    ToolExecutionStart,
    ToolResultEvent,
    Warning,
)
from loom.messages import RunResult, Usage, new_id
from loom.server.app import ServerState, error_body, state_of
from loom.server.openai_api import EventStream, close_quietly
from loom.server.ownership import ClientId, header_value
from loom.server.served import run_served, stream_served
from loom.server.session_events import Lagged, session_events, sse_id

_T = TypeVar("_T")

__all__ = ["Progress", "WeaveAnswer", "WeaveRequest", "progress", "router", "weave_reply"]


router = APIRouter(prefix="/v1", tags=["weave"])


class WeaveRequest(BaseModel):
    agent: str = Field(description="The agent's name (GET /v1/models lists them).")
    message: str = Field(description="The user's message: the turn's input.")
    session_id: ClientId | None = Field(
        None, description="The session to continue; a new one when left out."
    )


Progress = tuple[str, dict[str, Any]]
"""One progress event: its kind and its payload."""


def _usage(usage: Usage | dict[str, Any] | None) -> dict[str, int]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0, "requests": 0}
    if isinstance(usage, Usage):
        usage = usage.model_dump()
    return {k: int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens", "requests")}


def _tool_calls(result: RunResult) -> list[dict[str, Any]]:
    """The tool calls of a finished run, each with its input and its result or error."""
    calls: dict[str, dict[str, Any]] = {}
    for m in result.messages:
        for c in m.tool_calls:
            calls[c.id] = {
                "id": c.id,
                "name": c.name,
                "input": c.arguments,
                "success": None,
                "result": None,
                "error_code": None,
            }
        if m.role == "tool" and m.tool_call_id in calls:
            call = calls[m.tool_call_id]
            call["success"] = bool(m.metadata.get("success", True))
            call["error_code"] = m.metadata.get("error_code")
            call["result"] = m.content
    return list(calls.values())


def weave_reply(result: RunResult) -> dict[str, Any]:
    """The unary Weave answer for a finished run."""
    return {
        "session_id": result.session_id,
        "run_id": result.run_id,
        "output": result.text,
        "stop_reason": result.stop_reason,
        "usage": _usage(result.usage),
        "iterations": result.iterations,
        "error": result.error,
        "tool_calls": _tool_calls(result),
        "pending_approvals": list(result.pending_approvals),
        "warnings": list(result.warnings),
    }


class ProgressTracker:
    """Turns one run's typed events into Weave progress, keeping what ``final`` reports."""

    def __init__(self) -> None:
        self.total = Usage()
        self.calls: dict[str, dict[str, Any]] = {}

    def progress(self, event: AgentEvent) -> Progress | None:
        if isinstance(event, LlmDelta):
            return ("delta", {"text": event.delta}) if event.delta else None
        if isinstance(event, StateChange):
            return "stage", {"from": event.from_state, "to": event.to_state}
        if isinstance(event, AgentStart):
            return "started", {"agent": event.agent, "resume": event.resume}
        if isinstance(event, ToolExecutionStart):
            call: dict[str, Any] = {
                "id": event.tool_call_id,
                "name": event.tool_name,
                "input": event.arguments,
                "success": None,
                "result": None,
                "error_code": None,
            }
            self.calls[event.tool_call_id] = call
            return "tool_start", {k: call[k] for k in ("id", "name", "input")}
        if isinstance(event, ToolResultEvent | ToolErrorEvent):
            blank: dict[str, Any] = {"id": event.tool_call_id, "name": event.tool_name, "input": {}}
            call = self.calls.setdefault(event.tool_call_id, blank)
            call.update(success=event.success, result=event.content, error_code=event.error_code)
            return "tool_end", {**call, "duration_ms": event.duration_ms}
        if isinstance(event, LlmComplete):
            used = _usage(event.usage)
            self.total = self.total + Usage(**used)
            return "tokens", {"call": used, "total": _usage(self.total)}
        if isinstance(event, ApprovalRequired):
            return "approval_required", {
                "tool_call_id": event.tool_call_id,
                "tool_name": event.tool_name,
                "arguments": event.arguments,
                "reason": event.reason,
            }
        if isinstance(event, Warning):
            return "warning", {"message": event.warning, "source": event.source}
        if isinstance(event, ErrorEvent):
            return "error", {"message": event.error, "fatal": event.fatal}
        if isinstance(event, AgentFinish):
            return "final", {
                "session_id": event.session_id,
                "run_id": event.run_id,
                "output": event.output,
                "stop_reason": event.stop_reason,
                "usage": _usage(event.usage),
                "iterations": event.iterations,
                "error": event.error,
                "tool_calls": list(self.calls.values()),
                "pending_approvals": list(event.pending_approvals),
                "warnings": list(event.warnings),
            }
        return None


def progress(events: list[AgentEvent]) -> list[Progress]:
    """The progress events of a list of typed events (one run)."""
    tracker = ProgressTracker()
    return [p for e in events if (p := tracker.progress(e)) is not None]


def _unknown_agent(state: ServerState, name: str) -> JSONResponse:
    agents = ", ".join(state.registry.names()) or "none"
    body = error_body("NotFound", f"no agent named {name!r} (served: {agents})")
    return JSONResponse(body, status_code=404)


@router.post("/weave", summary="Weave: run one turn of an agent and return its answer")
async def weave(request: Request, body: WeaveRequest) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.agent)
    if agent is None:
        return _unknown_agent(state, body.agent)
    result = await run_served(state.runtime, agent, body.message, body.session_id)
    return JSONResponse(
        weave_reply(result), headers={"X-Loom-Session": header_value(result.session_id)}
    )


@router.post(
    "/weave:stream",
    summary="StreamWeave: run one turn of an agent, streaming its progress as SSE",
    response_description="text/event-stream of started, stage, delta, tool_start, tool_end, "
    "tokens, approval_required, warning, error and final events",
)
async def stream_weave(request: Request, body: WeaveRequest) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.agent)
    if agent is None:
        return _unknown_agent(state, body.agent)
    session_id = body.session_id or new_id("session")
    events = stream_served(state.runtime, agent, body.message, session_id)
    first = await anext(events)  # input errors become a status code, not a broken stream

    async def sse() -> AsyncIterator[bytes]:
        tracker = ProgressTracker()
        try:
            async for event in _achain(first, events):
                p = tracker.progress(event)
                if p is None:
                    continue
                kind, data = p
                payload = json.dumps(
                    {
                        "session_id": event.session_id,
                        "run_id": event.run_id,
                        "sequence": event.sequence,
                        **data,
                    },
                    separators=(",", ":"),
                )
                yield f"event: {kind}\n{sse_id(event)}data: {payload}\n\n".encode()
        finally:
            await close_quietly(events)

    return EventStream(
        sse(),
        media_type="text/event-stream",
        headers={"X-Loom-Session": header_value(session_id), "Cache-Control": "no-cache"},
    )


async def _achain(first: _T, rest: AsyncIterator[_T]) -> AsyncIterator[_T]:
    yield first
    async for event in rest:
        yield event


class WeaveAnswer(BaseModel):
    session_id: ClientId = Field(description="The session whose call waits for approval.")
    call_id: str = Field(description="The parked call's tool_call_id (from approval_required).")
    decision: Literal["approve", "reject"]
    reason: str | None = Field(None, description="Why; shown to the model when rejected.")


@router.post(
    "/weave:answer",
    summary="AnswerClarificationQuestion: approve or reject a parked call; resumes the turn "
    "once every parked call is decided",
)
async def answer_weave(request: Request, body: WeaveAnswer) -> Response:
    from loom.server.langgraph_api import record_decision, session_agent

    state = state_of(request)
    decision = body.model_dump(include={"decision", "reason"}, exclude_none=True)
    info, decided, waiting = await record_decision(state, body.session_id, body.call_id, decision)
    if waiting:
        return JSONResponse({"status": "waiting", "undecided": waiting}, status_code=202)
    name = await session_agent(state, info)
    crew = state.registry.crews.get(name)
    if crew is not None:  # the crew resumes the member(s) that parked the calls
        turn = await state.runtime.start(crew, Resume(decided), session_id=body.session_id)
        await turn.run(discard)
        assert turn.result is not None
        result = turn.result
    else:
        agent = state.registry.get(name)
        if agent is None:
            return _unknown_agent(state, name)
        result = await state.runtime.resume(agent, body.session_id, decided)
    return JSONResponse(
        {"status": "resumed", "reply": weave_reply(result)},
        headers={"X-Loom-Session": header_value(body.session_id)},
    )


@router.get(
    "/sessions/{session_id}/events",
    summary="SubscribeToSession: a session's stored events, then its live ones, as SSE",
    response_description="text/event-stream; each event's id is '<run_id>:<sequence>' "
    "(reconnect with Last-Event-ID or ?after=)",
)
async def session_events_sse(
    request: Request,
    session_id: str,
    after: str | None = Query(None, description="The id of the last event already received."),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
) -> Response:
    state = state_of(request)
    if await state.runtime.store.get_session(session_id) is None:
        body = error_body("NotFound", f"no session {session_id!r}; start one with POST /v1/weave")
        return JSONResponse(body, status_code=404)
    events = session_events(state.hub, state.runtime.store, session_id, last_event_id or after)
    try:
        first = await anext(events)  # a bad cursor becomes a status code, not a broken stream
    except StopAsyncIteration:  # the server is shutting down
        return Response(status_code=204)

    async def sse() -> AsyncIterator[bytes]:
        trackers: dict[str, ProgressTracker] = {}
        try:
            async for ev, replayed in _achain(first, events):
                tracker = trackers.setdefault(ev.run_id, ProgressTracker())
                p = tracker.progress(ev)
                kind, data = p if p is not None else ("event", {})
                payload = json.dumps(
                    {
                        "session_id": ev.session_id,
                        "run_id": ev.run_id,
                        "sequence": ev.sequence,
                        "type": str(ev.type),
                        "replayed": replayed,
                        **data,
                        "event": ev.to_dict(),
                    },
                    separators=(",", ":"),
                    default=str,
                )
                yield f"event: {kind}\n{sse_id(ev)}data: {payload}\n\n".encode()
                if isinstance(ev, AgentFinish):
                    trackers.pop(ev.run_id, None)
        except Lagged as exc:
            err = json.dumps(error_body("Lagged", str(exc)))
            yield f"event: error\ndata: {err}\n\n".encode()
        finally:
            with anyio.CancelScope(shield=True):
                await events.aclose()

    return EventStream(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
