"""The OpenAI-compatible front: ``/v1/models``, ``/v1/chat/completions``, ``/v1/responses``.

Every OpenAI client can talk to a Loom agent: ``model`` is the agent's name, the reply is the
agent's answer, and the agent's own tools run here, on the server. The client's ``messages``
are not replayed: the Loom session holds the conversation, and the turn's input is the last
user message. The session comes from the ``X-Loom-Session`` header, else the ``user`` field,
else ``metadata.session_id``; without any, every request starts a new session. The session id
is returned in the ``X-Loom-Session`` response header (and in a ``loom`` block of the body).

A response id of ``/v1/responses`` encodes its session (``resp_<hex of the session id>_<run
id>``), so ``previous_response_id`` continues that session with nothing kept in memory: it
works after a restart, and on every process that shares the store.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from loom.agent import Agent
from loom.crew import Crew
from loom.errors import InputError
from loom.events import AgentEvent, AgentFinish, LlmDelta
from loom.messages import RunResult, Usage, new_id
from loom.server.app import error_body, state_of
from loom.server.ownership import client_session_id, header_value
from loom.server.served import run_served, stream_served

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["openai"])

SESSION_HEADER = "X-Loom-Session"

_FINISH = {
    "completed": "stop",
    "max_iterations": "length",
    "max_tool_calls": "length",
    "timeout": "length",
    "cancelled": "stop",
    "awaiting_approval": "stop",
    "guardrail": "content_filter",  # OpenAI's own word for an answer a check withheld
}
_FAILED = ("model_error", "error", "output_invalid")


class _Open(BaseModel):
    """OpenAI requests carry many fields Loom does not use; they are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class ChatCompletionRequest(_Open):
    model: str = Field(description="The agent's name (GET /v1/models lists them).")
    messages: list[dict[str, Any]] = Field(
        description="The conversation; the last user message is the turn's input (the Loom "
        "session holds the history)."
    )
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(None, description="The Loom session id to continue.")
    metadata: dict[str, Any] | None = None


class ResponsesRequest(_Open):
    model: str = Field(description="The agent's name (GET /v1/models lists them).")
    input: str | list[dict[str, Any]] = Field(
        description="Text, or input items; the last user item is the turn's input."
    )
    previous_response_id: str | None = Field(
        None, description="Continue the session of that response."
    )
    stream: bool = False
    user: str | None = None
    metadata: dict[str, Any] | None = None


# -- helpers ------------------------------------------------------------------------------------
def _not_found(kind: str, message: str, code: str, param: str) -> JSONResponse:
    body = error_body(kind, message)
    body["error"].update(code=code, param=param)
    return JSONResponse(body, status_code=404)


def _unknown_model(request: Request, name: str) -> JSONResponse:
    agents = ", ".join(state_of(request).registry.names()) or "none"
    return _not_found(
        "NotFound",
        f"no agent named {name!r}; the model is the agent's name (served: {agents}; "
        "GET /v1/models lists them)",
        "model_not_found",
        "model",
    )


def _text_of(content: Any) -> str:
    """The text of an OpenAI message content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    return ""


def _last_user_text(items: list[dict[str, Any]], field: str) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            return _text_of(item.get("content"))
    raise InputError(f"{field} holds no user message; the last user message is the turn's input")


def _session(header: str | None, user: str | None, metadata: dict[str, Any] | None) -> str:
    """The Loom session a request continues, else a new session id; a given id is checked
    before anything runs (an empty, over-long or unprintable id is 422) and names the key's
    own session (``loom.server.ownership.client_session_id``)."""
    meta = (metadata or {}).get("session_id")
    for where, value in (
        ("X-Loom-Session header", header),
        ("user field", user),
        ("metadata.session_id", meta),
    ):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InputError(f"the {where} is a session id (text), got {type(value).__name__}")
        return client_session_id(value, f"session id (the {where})")
    return new_id("session")


def _usage(usage: Usage | dict[str, Any]) -> tuple[int, int]:
    if isinstance(usage, dict):
        return int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return usage.input_tokens, usage.output_tokens


def _chat_usage(usage: Usage | dict[str, Any]) -> dict[str, int]:
    i, o = _usage(usage)
    return {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}


def _loom_block(session_id: str, run_id: str, stop_reason: str, pending: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "run_id": run_id,
        "stop_reason": stop_reason,
        "pending_approvals": list(pending or ()),
    }


def _run_failed(result: RunResult) -> JSONResponse:
    body = error_body(
        "RunFailed",
        f"the agent's run {result.run_id} ended with {result.stop_reason}: {result.error}; "
        f"the session {result.session_id} keeps the turn (see its events)",
    )
    return JSONResponse(
        body, status_code=502, headers={SESSION_HEADER: header_value(result.session_id)}
    )


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}\n\n".encode()


async def _started(events: AsyncGenerator[AgentEvent, None]) -> AsyncIterator[AgentEvent]:
    """Start a turn's event stream before the response does: input errors (bad message, busy
    session) become an HTTP status, not a broken stream."""
    first = await anext(events)

    async def rest() -> AsyncIterator[AgentEvent]:
        try:
            yield first
            async for event in events:
                yield event
        finally:
            await close_quietly(events)

    return rest()


class EventStream(StreamingResponse):
    """An SSE response that stops as soon as the client hangs up: the turn it streams is
    cancelled (recorded as ``cancelled``) instead of running on into a closed socket."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream_then_stop() -> None:
                await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream_then_stop)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


async def close_quietly(events: AsyncGenerator[AgentEvent, None]) -> None:
    """Close a turn's event stream even while the response is being cancelled."""
    with anyio.CancelScope(shield=True):
        await events.aclose()


def _stream_response(body: AsyncIterator[bytes], session_id: str) -> StreamingResponse:
    return EventStream(
        body,
        media_type="text/event-stream",
        headers={SESSION_HEADER: header_value(session_id), "Cache-Control": "no-cache"},
    )


# -- models -------------------------------------------------------------------------------------
def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "loom"}


@router.get("/models", summary="The agents, as OpenAI models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model(name) for name in state_of(request).registry.names()]}


@router.get("/models/{model}", summary="One agent, as an OpenAI model", response_model=None)
async def get_model(request: Request, model: str) -> dict[str, Any] | JSONResponse:
    if state_of(request).registry.served(model) is None:
        return _unknown_model(request, model)
    return _model(model)


# -- chat completions ---------------------------------------------------------------------------
@router.post(
    "/chat/completions",
    summary="Run one turn of an agent (OpenAI chat completions; SSE when stream is true)",
    response_model=None,
)
async def chat_completions(
    request: Request,
    body: ChatCompletionRequest,
    x_loom_session: str | None = Header(None, description="The Loom session to continue."),
) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.model)
    if agent is None:
        return _unknown_model(request, body.model)
    message = _last_user_text(body.messages, "messages")
    session_id = _session(x_loom_session, body.user, body.metadata)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        events = await _started(stream_served(state.runtime, agent, message, session_id))
        return _stream_response(_chat_chunks(events, agent, include_usage), session_id)
    result = await run_served(state.runtime, agent, message, session_id)
    if result.stop_reason in _FAILED:
        return _run_failed(result)
    reply = {
        "id": f"chatcmpl-{result.run_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": agent.name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text, "refusal": None},
                "finish_reason": _FINISH.get(result.stop_reason, "stop"),
                "logprobs": None,
            }
        ],
        "usage": _chat_usage(result.usage),
        "loom": _loom_block(
            result.session_id, result.run_id, result.stop_reason, result.pending_approvals
        ),
    }
    return JSONResponse(reply, headers={SESSION_HEADER: header_value(result.session_id)})


async def _chat_chunks(
    events: AsyncIterator[AgentEvent], agent: Agent | Crew, include_usage: bool
) -> AsyncIterator[bytes]:
    created = int(time.time())
    chunk_id: str | None = None

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse(
            {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": agent.name,
                "choices": [choice],
                **more,
            }
        )

    async for event in events:
        if chunk_id is None:
            chunk_id = f"chatcmpl-{event.run_id}"
            yield chunk({"role": "assistant", "content": ""})
        if isinstance(event, LlmDelta) and event.delta:
            yield chunk({"content": event.delta})
        elif isinstance(event, AgentFinish):
            if event.stop_reason in _FAILED:
                message = f"the agent's run ended with {event.stop_reason}: {event.error}"
                yield _sse(error_body("RunFailed", message))
                return
            loom = _loom_block(
                event.session_id, event.run_id, event.stop_reason, event.pending_approvals
            )
            yield chunk({}, _FINISH.get(event.stop_reason, "stop"), loom=loom)
            if include_usage:
                yield _sse(
                    {
                        "id": chunk_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": agent.name,
                        "choices": [],
                        "usage": _chat_usage(event.usage),
                    }
                )
    yield _sse("[DONE]")


# -- responses ----------------------------------------------------------------------------------
def response_id(session_id: str, run_id: str) -> str:
    """A response id that names its session: ``resp_<hex of the session id>_<run id>``."""
    return f"resp_{session_id.encode().hex()}_{run_id}"


def session_of_response(rid: str) -> str | None:
    """The session a response id names, or None when it is not one of Loom's."""
    if not rid.startswith("resp_"):
        return None
    hexed, sep, run_id = rid[5:].partition("_")
    if not sep or not run_id:
        return None
    try:
        return bytes.fromhex(hexed).decode()
    except ValueError:
        return None


def _response_object(
    agent: Agent | Crew,
    rid: str,
    status: Literal["completed", "incomplete", "in_progress"],
    text: str | None,
    usage: Usage | dict[str, Any] | None,
    previous: str | None,
    loom: dict[str, Any] | None,
    created: int,
) -> dict[str, Any]:
    output = []
    if text is not None:
        output.append(_output_message(rid, text, "completed"))
    i, o = _usage(usage) if usage is not None else (0, 0)
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": agent.name,
        "output": output,
        "output_text": text or "",
        "previous_response_id": previous,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None if status != "incomplete" else {"reason": "max_output_tokens"},
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "usage": None
        if usage is None
        else {
            "input_tokens": i,
            "output_tokens": o,
            "total_tokens": i + o,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "loom": loom,
    }


def _output_message(rid: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{rid[5:]}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _responses_input(body: ResponsesRequest) -> str:
    if isinstance(body.input, str):
        return body.input
    return _last_user_text(body.input, "input")


@router.post(
    "/responses",
    summary="Run one turn of an agent (OpenAI responses; previous_response_id continues it)",
    response_model=None,
)
async def responses(
    request: Request,
    body: ResponsesRequest,
    x_loom_session: str | None = Header(None, description="The Loom session to continue."),
) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.model)
    if agent is None:
        return _unknown_model(request, body.model)
    message = _responses_input(body)
    if body.previous_response_id:
        session_id = session_of_response(body.previous_response_id)
        if session_id is None or not await state.runtime.store.message_count(session_id):
            return _not_found(
                "NotFound",
                f"no response {body.previous_response_id!r}; give the id of a response this "
                "server returned, or leave previous_response_id out to start a new session",
                "previous_response_not_found",
                "previous_response_id",
            )
    else:
        session_id = _session(x_loom_session, body.user, body.metadata)
    created = int(time.time())
    if body.stream:
        events = await _started(stream_served(state.runtime, agent, message, session_id))
        gen = _response_events(events, agent, body.previous_response_id, created)
        return _stream_response(gen, session_id)
    result = await run_served(state.runtime, agent, message, session_id)
    if result.stop_reason in _FAILED:
        return _run_failed(result)
    rid = response_id(result.session_id, result.run_id)
    status: Literal["completed", "incomplete"] = (
        "completed" if _FINISH.get(result.stop_reason) == "stop" else "incomplete"
    )
    loom = _loom_block(
        result.session_id, result.run_id, result.stop_reason, result.pending_approvals
    )
    reply = _response_object(
        agent, rid, status, result.text, result.usage, body.previous_response_id, loom, created
    )
    return JSONResponse(reply, headers={SESSION_HEADER: header_value(result.session_id)})


async def _response_events(
    events: AsyncIterator[AgentEvent], agent: Agent | Crew, previous: str | None, created: int
) -> AsyncIterator[bytes]:
    """The Responses API's semantic streaming events for one turn."""
    seq = 0
    rid = ""
    opened = False

    def emit(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _sse({"type": kind, "sequence_number": seq - 1, **data}, event=kind)

    def shell(status: Literal["completed", "incomplete", "in_progress"]) -> dict[str, Any]:
        return _response_object(agent, rid, status, None, None, previous, None, created)

    async for event in events:
        if not rid:
            rid = response_id(event.session_id, event.run_id)
            yield emit("response.created", response=shell("in_progress"))
            yield emit("response.in_progress", response=shell("in_progress"))
        if isinstance(event, LlmDelta) and event.delta:
            if not opened:
                opened = True
                item = _output_message(rid, "", "in_progress")
                item["content"] = []
                yield emit("response.output_item.added", output_index=0, item=item)
                yield emit(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            yield emit(
                "response.output_text.delta",
                item_id=f"msg_{rid[5:]}",
                output_index=0,
                content_index=0,
                delta=event.delta,
                logprobs=[],
            )
        elif isinstance(event, AgentFinish):
            if event.stop_reason in _FAILED:
                failed = shell("in_progress")
                failed["status"] = "failed"
                failed["error"] = {"code": "server_error", "message": str(event.error)}
                yield emit("response.failed", response=failed)
                return
            output = event.output
            item_id = f"msg_{rid[5:]}"
            if opened:
                yield emit(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    text=output,
                    logprobs=[],
                )
                yield emit(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": output, "annotations": []},
                )
                yield emit(
                    "response.output_item.done",
                    output_index=0,
                    item=_output_message(rid, output, "completed"),
                )
            status: Literal["completed", "incomplete"] = (
                "completed" if _FINISH.get(event.stop_reason) == "stop" else "incomplete"
            )
            loom = _loom_block(
                event.session_id, event.run_id, event.stop_reason, event.pending_approvals
            )
            final = _response_object(
                agent, rid, status, output, event.usage, previous, loom, created
            )
            yield emit(f"response.{status}", response=final)
