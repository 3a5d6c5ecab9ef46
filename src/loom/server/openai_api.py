"""The OpenAI-compatible front: ``/v1/models``, ``/v1/chat/completions``, ``/v1/responses``.

Every OpenAI client can talk to a Loom agent: ``model`` is the agent's name, the reply is the
agent's answer, and the agent's own tools run here, on the server. The client's ``messages``
are not replayed: the Loom session holds the conversation, and the turn's input is the last
user message. The session comes from the ``X-Loom-Session`` header, else the ``user`` field,
else ``metadata.session_id``; without any, every request starts a new session. The session id
is returned in the ``X-Loom-Session`` response header (and in a ``loom`` block of the body).

A response id of ``/v1/responses`` encodes its session (``resp_<hex of the session id>_<run
id>``), so ``previous_response_id`` continues that session with nothing kept in memory: it
works after a restart, and on every process that shares the store. Naming a response that is
not the session's latest branches, as OpenAI's API does: the new response runs in a fork of
the session from just after that response (``Runtime.fork``: a new session sharing the
history up to there; its id is in ``X-Loom-Session`` and in the new response's id), and the
original session is unchanged. ``GET /v1/responses/{id}``
rebuilds the response from the run's journaled events the same way.

A run parked on the client (tool calls waiting for approval, or a server query) says so: the
chat reply's text names the pending calls (or the question) and how to decide (or answer) them,
and a response is ``incomplete`` with ``incomplete_details.reason`` set to the stop reason
(``awaiting_approval`` / ``awaiting_input``).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from loom.agent import Agent
from loom.content import Reasoning
from loom.crew import Crew
from loom.engine.run_inputs import AtEvent, NewMessage
from loom.errors import ContentError, InputError, SessionNotFound
from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    LlmComplete,
    LlmDelta,
    LlmReasoningDelta,
    parts_of,
)
from loom.messages import RunResult, Usage, new_id
from loom.server.app import error_body, state_of
from loom.server.checkpoints import same_state, state_at
from loom.server.content_blocks import openai_parts, reasoning_text, run_input
from loom.server.ownership import client_session_id, header_value, unscoped_session_id
from loom.server.parked import describe_parked
from loom.server.served import run_served, stream_served

if TYPE_CHECKING:
    from loom.engine.runtime import Runtime

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
    "awaiting_input": "stop",
    "guardrail": "content_filter",  # OpenAI's own word for an answer a check withheld
}
# a loop (loom.loop_detection) fails too: the model was stuck, there is no answer, and the
# client should read why (the tool and the count) rather than an empty "stop"
_FAILED = ("model_error", "error", "output_invalid", "loop")
IncompleteReason = Literal[
    "max_output_tokens", "content_filter", "awaiting_approval", "awaiting_input"
]
"""Why a response is ``incomplete``: OpenAI's two reasons, and Loom's parked runs (the stop
reason: tool calls wait for approval, or the model asked the client something)."""


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
        None,
        description="Continue from that response: its session when it is the latest one, "
        "else a fork of the session from just after it.",
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


def _last_user_input(items: list[dict[str, Any]], field: str) -> str | NewMessage:
    """The turn's input: the last user message's text, with its images, files and audio as
    ``NewMessage(text, parts)`` (``ContentError`` names a part that cannot be used)."""
    for i in range(len(items) - 1, -1, -1):
        if items[i].get("role") == "user":
            text, parts = openai_parts(items[i].get("content"), f"{field}[{i}].content")
            return run_input(text, parts)
    raise InputError(f"{field} holds no user message; the last user message is the turn's input")


def _content_error(exc: ContentError) -> JSONResponse:
    """A part the request cannot use: 400 in OpenAI's error shape, ``param`` naming it."""
    body = error_body(type(exc).__name__, str(exc))
    body["error"].update(code="invalid_content", param=exc.part)
    return JSONResponse(body, status_code=400)


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


def _as_usage(usage: Usage | dict[str, Any]) -> Usage:
    """A run's usage (an event carries it as a dict)."""
    if isinstance(usage, Usage):
        return usage
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return Usage(**{k: int(usage.get(k) or 0) for k in counts})


def _chat_usage(usage: Usage | dict[str, Any]) -> dict[str, Any]:
    u = _as_usage(usage)
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
    }


def _responses_usage(usage: Usage | dict[str, Any]) -> dict[str, Any]:
    u = _as_usage(usage)
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "input_tokens_details": {
            "cached_tokens": u.cache_read_tokens,
            "cache_write_tokens": u.cache_write_tokens,
        },
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _loom_block(
    session_id: str, run_id: str, stop_reason: str, pending: Any, query: Any = None
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "run_id": run_id,
        "stop_reason": stop_reason,
        "pending_approvals": list(pending or ()),
        "pending_query": query,
    }


def _parked_note(
    after_text: bool, stop_reason: str, session_id: str, pending: Any, query: Any
) -> str:
    """What a reply adds to the run's own text when the run is parked on the client: which
    calls wait (or what was asked) and how to decide (or answer) them; "" otherwise."""
    said = describe_parked(stop_reason, unscoped_session_id(session_id), list(pending or ()), query)
    if said is None:
        return ""
    return f"\n\n{said}" if after_text else said


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
    try:
        return await _chat(request, body, x_loom_session)
    except ContentError as exc:
        return _content_error(exc)


async def _chat(
    request: Request, body: ChatCompletionRequest, x_loom_session: str | None
) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.model)
    if agent is None:
        return _unknown_model(request, body.model)
    message = _last_user_input(body.messages, "messages")
    session_id = _session(x_loom_session, body.user, body.metadata)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        events = await _started(stream_served(state.runtime, agent, message, session_id))
        return _stream_response(_chat_chunks(events, agent, include_usage), session_id)
    result = await run_served(state.runtime, agent, message, session_id)
    if result.stop_reason in _FAILED:
        return _run_failed(result)
    content = result.text + _parked_note(
        bool(result.text),
        result.stop_reason,
        result.session_id,
        result.pending_approvals,
        result.pending_query,
    )
    said: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    reasoning = reasoning_text(result.messages)
    if reasoning:  # as OpenAI-compatible reasoning servers (DeepSeek, vLLM) return it
        said["reasoning_content"] = reasoning
    reply = {
        "id": f"chatcmpl-{result.run_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": agent.name,
        "choices": [
            {
                "index": 0,
                "message": said,
                "finish_reason": _FINISH.get(result.stop_reason, "stop"),
                "logprobs": None,
            }
        ],
        "usage": _chat_usage(result.usage),
        "loom": _loom_block(
            result.session_id,
            result.run_id,
            result.stop_reason,
            result.pending_approvals,
            result.pending_query,
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

    streamed = False
    reasoned = False  # this step's reasoning went out live (LLM_REASONING_DELTA)
    async for event in events:
        if chunk_id is None:
            chunk_id = f"chatcmpl-{event.run_id}"
            yield chunk({"role": "assistant", "content": ""})
        if isinstance(event, LlmDelta) and event.delta:
            streamed = True
            yield chunk({"content": event.delta})
        elif isinstance(event, LlmReasoningDelta) and event.delta:
            reasoned = True
            yield chunk({"reasoning_content": event.delta})
        elif isinstance(event, LlmComplete):
            # a provider that streams no reasoning deltas: the step's reasoning comes whole
            thought = _reasoning_of(event) if event.parts and not reasoned else ""
            reasoned = False
            if thought:
                yield chunk({"reasoning_content": thought})
        elif isinstance(event, AgentFinish):
            if event.stop_reason in _FAILED:
                message = f"the agent's run ended with {event.stop_reason}: {event.error}"
                yield _sse(error_body("RunFailed", message))
                return
            added = _parked_note(
                streamed,
                event.stop_reason,
                event.session_id,
                event.pending_approvals,
                event.pending_query,
            )
            if added:  # a parked run: which calls wait and how to decide them, as text
                yield chunk({"content": added})
            loom = _loom_block(
                event.session_id,
                event.run_id,
                event.stop_reason,
                event.pending_approvals,
                event.pending_query,
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


def _reasoning_of(event: LlmComplete) -> str:
    """The readable reasoning an ``LLM_COMPLETE`` carries (empty when none)."""
    return "\n\n".join(p.text for p in parts_of(event.parts) if isinstance(p, Reasoning) and p.text)


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


def parse_response_id(rid: str) -> tuple[str, str] | None:
    """The session and run a response id names, or None when it is not one of Loom's."""
    session_id = session_of_response(rid)
    if session_id is None:
        return None
    return session_id, rid[5:].partition("_")[2]


ResponseStatus = Literal["completed", "incomplete", "in_progress", "failed"]
"""The statuses of OpenAI's Responses API that a Loom run can have."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run ended, as a response shows it (from a ``RunResult`` or an ``AGENT_FINISH``)."""

    session_id: str
    run_id: str
    stop_reason: str
    text: str
    usage: Usage | dict[str, Any]
    pending_approvals: list[dict[str, Any]]
    pending_query: dict[str, Any] | None
    error: str | None
    reasoning: str = ""
    """The answer's readable reasoning (a ``reasoning`` output item before the message)."""

    @classmethod
    def of_result(cls, r: RunResult) -> RunEnd:
        """How the run that returned ``r`` ended."""
        return cls(
            r.session_id,
            r.run_id,
            r.stop_reason,
            r.text,
            r.usage,
            list(r.pending_approvals),
            r.pending_query,
            r.error,
            reasoning_text(r.messages),
        )

    @classmethod
    def of_event(cls, ev: AgentFinish) -> RunEnd:
        """How the run whose last event is ``ev`` ended."""
        return cls(
            ev.session_id,
            ev.run_id,
            ev.stop_reason,
            ev.output or "",
            ev.usage,
            list(ev.pending_approvals),
            ev.pending_query,
            ev.error,
        )

    def outcome(self) -> tuple[ResponseStatus, IncompleteReason | None]:
        """The response's status and, when ``incomplete``, why."""
        if self.stop_reason in _FAILED:
            return "failed", None
        if self.stop_reason == "awaiting_approval":
            return "incomplete", "awaiting_approval"
        if self.stop_reason == "awaiting_input":
            return "incomplete", "awaiting_input"
        finish = _FINISH.get(self.stop_reason, "stop")
        if finish == "length":
            return "incomplete", "max_output_tokens"
        if finish == "content_filter":
            return "incomplete", "content_filter"
        return "completed", None

    def reply_text(self) -> str:
        """The run's text, plus what a parked run waits for and how to decide it."""
        return self.text + _parked_note(
            bool(self.text),
            self.stop_reason,
            self.session_id,
            self.pending_approvals,
            self.pending_query,
        )

    def loom(self) -> dict[str, Any]:
        """The response's ``loom`` block: session, run, stop reason, what it waits for."""
        return _loom_block(
            self.session_id,
            self.run_id,
            self.stop_reason,
            self.pending_approvals,
            self.pending_query,
        )


def response_object(
    model: str,
    rid: str,
    created: float,
    previous: str | None,
    end: RunEnd | None,
    *,
    reasoning_after: bool = False,
) -> dict[str, Any]:
    """A Responses API ``response`` object: ``in_progress`` without an end, else as it ended
    (its reasoning, if any, as a ``reasoning`` item before the message; after it when
    ``reasoning_after``: a stream that opened the message before the reasoning came)."""
    status: ResponseStatus = "in_progress"
    reason: IncompleteReason | None = None
    output: list[dict[str, Any]] = []
    error: dict[str, str] | None = None
    text = ""
    if end is not None:
        status, reason = end.outcome()
        if status == "failed":
            message = f"the agent's run ended with {end.stop_reason}: {end.error}"
            error = {"code": "server_error", "message": message}
        else:
            text = end.reply_text()
            output.append(_output_message(rid, text, "completed"))
            if end.reasoning:
                at = len(output) if reasoning_after else 0
                output.insert(at, _reasoning_item(rid, end.reasoning))
    out: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": status,
        "model": model,
        "output": output,
        "output_text": text,
        "previous_response_id": previous,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": error,
        "incomplete_details": None if reason is None else {"reason": reason},
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "loom": None if end is None else end.loom(),
    }
    if end is not None:  # optional, and not nullable: a response in progress has none yet
        out["usage"] = _responses_usage(end.usage)
    return out


def _output_text(text: str) -> dict[str, Any]:
    # Loom's models report no log probabilities: the list the schema requires is empty
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item(rid: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item: the answer's reasoning, readable (``reasoning_text``)."""
    return {
        "type": "reasoning",
        "id": f"rs_{rid[5:]}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def _output_message(rid: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{rid[5:]}",
        "status": status,
        "role": "assistant",
        "content": [_output_text(text)],
    }


def _responses_input(body: ResponsesRequest) -> str | NewMessage:
    if isinstance(body.input, str):
        return body.input
    return _last_user_input(body.input, "input")


def _no_response(rid: str, param: str, code: str, hint: str) -> JSONResponse:
    return _not_found("NotFound", f"no response {rid!r}; {hint}", code, param)


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
    try:
        return await _respond(request, body, x_loom_session)
    except ContentError as exc:
        return _content_error(exc)


async def _respond(
    request: Request, body: ResponsesRequest, x_loom_session: str | None
) -> Response:
    state = state_of(request)
    agent = state.registry.served(body.model)
    if agent is None:
        return _unknown_model(request, body.model)
    message = _responses_input(body)
    if body.previous_response_id:
        session_id = session_of_response(body.previous_response_id)
        if session_id is None or not await state.runtime.store.message_count(session_id):
            return _no_response(
                body.previous_response_id,
                "previous_response_id",
                "previous_response_not_found",
                "give the id of a response this server returned, or leave "
                "previous_response_id out to start a new session",
            )
        forked = await _continue_from(state.runtime, agent, body.previous_response_id)
        if forked is None:
            return _no_response(
                body.previous_response_id,
                "previous_response_id",
                "previous_response_not_found",
                "give the id of a response this server returned, or leave "
                "previous_response_id out to start a new session",
            )
        session_id = forked
    else:
        session_id = _session(x_loom_session, body.user, body.metadata)
    created = time.time()
    if body.stream:
        events = await _started(stream_served(state.runtime, agent, message, session_id))
        gen = _response_events(events, agent.name, body.previous_response_id, created)
        return _stream_response(gen, session_id)
    result = await run_served(state.runtime, agent, message, session_id)
    if result.stop_reason in _FAILED:
        return _run_failed(result)
    rid = response_id(result.session_id, result.run_id)
    reply = response_object(
        agent.name, rid, created, body.previous_response_id, RunEnd.of_result(result)
    )
    return JSONResponse(reply, headers={SESSION_HEADER: header_value(result.session_id)})


async def _continue_from(runtime: Runtime, agent: Agent | Crew, previous: str) -> str | None:
    """The session a response that follows ``previous`` runs in: ``previous``'s own when it
    is the session's latest response, else a fork of it from just after ``previous`` (a new
    session sharing the history up to there, as OpenAI's API branches); None when the
    session holds no such response."""
    named = parse_response_id(previous)
    if named is None:
        return None
    session_id, run_id = named
    events = await runtime.store.load_events(session_id)
    last = next((e for e in reversed(events) if e.run_id == run_id), None)
    if last is None:
        return None
    point = AtEvent(run_id, last.sequence)
    then = state_at(events, point)
    if then is not None and same_state(then, await runtime.store.load_messages(session_id)):
        return session_id
    if not isinstance(agent, Agent):
        raise InputError(
            f"{agent.name!r} is a crew: a crew's session cannot be continued from an earlier "
            "response; give its latest response's id"
        )
    return await runtime.fork(agent, session_id, point)


@router.get(
    "/responses/{response_id}",
    summary="A response this server returned (rebuilt from its run's journaled events)",
    response_model=None,
)
async def get_response(request: Request, response_id: str) -> Response:
    """The response ``response_id`` names, as its run stands now: ``in_progress`` while it
    runs, else as it ended. Another API key's response is not there (404)."""
    hint = "give the id of a response this server returned (for this API key)"
    named = parse_response_id(response_id)
    if named is None:
        return _no_response(response_id, "response_id", "response_not_found", hint)
    session_id, run_id = named
    try:
        events = await state_of(request).runtime.store.load_events(session_id, run_id)
    except SessionNotFound:  # another key's session: it does not exist for this one
        events = []
    start = next((e for e in events if isinstance(e, AgentStart)), None)
    if start is None:
        return _no_response(response_id, "response_id", "response_not_found", hint)
    finish = next((e for e in reversed(events) if isinstance(e, AgentFinish)), None)
    end = None
    if finish is not None:
        thought = "\n\n".join(
            _reasoning_of(e) for e in events if isinstance(e, LlmComplete) and e.parts
        )
        end = replace(RunEnd.of_event(finish), reasoning=thought.strip())
    # the previous response is not journaled with the run: null, as for a first response
    reply = response_object(start.agent, response_id, start.timestamp, None, end)
    return JSONResponse(reply, headers={SESSION_HEADER: header_value(session_id)})


async def _response_events(
    events: AsyncIterator[AgentEvent], model: str, previous: str | None, created: float
) -> AsyncIterator[bytes]:
    """The Responses API's semantic streaming events for one turn."""
    seq = 0
    rid = ""
    opened = False
    streamed = False
    thoughts: list[str] = []

    def emit(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _sse({"type": kind, "sequence_number": seq - 1, **data}, event=kind)

    def open_item() -> list[bytes]:
        item = _output_message(rid, "", "in_progress")
        item["content"] = []
        return [
            emit("response.output_item.added", output_index=0, item=item),
            emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part=_output_text(""),
            ),
        ]

    def delta(text: str) -> bytes:
        return emit(
            "response.output_text.delta",
            item_id=f"msg_{rid[5:]}",
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    async for event in events:
        if not rid:
            rid = response_id(event.session_id, event.run_id)
            shell = response_object(model, rid, created, previous, None)
            yield emit("response.created", response=shell)
            yield emit("response.in_progress", response=shell)
        if isinstance(event, LlmDelta) and event.delta:
            if not opened:
                opened = True
                for frame in open_item():
                    yield frame
            streamed = True
            yield delta(event.delta)
        elif isinstance(event, LlmComplete) and event.parts:
            # the reasoning item is sent whole, with the response's end (its deltas are not
            # streamed: the message item holds output index 0 as soon as text streams)
            thought = _reasoning_of(event)
            if thought:
                thoughts.append(thought)
        elif isinstance(event, AgentFinish):
            end = replace(RunEnd.of_event(event), reasoning="\n\n".join(thoughts))
            added = _parked_note(
                streamed,
                end.stop_reason,
                end.session_id,
                end.pending_approvals,
                end.pending_query,
            )
            # the message item streamed first: the reasoning item follows it (index 1)
            message_first = opened or bool(added)
            final = response_object(
                model, rid, created, previous, end, reasoning_after=message_first
            )
            if final["status"] == "failed":
                yield emit("response.failed", response=final)
                return
            if added:  # a parked run: what it waits for, as text like the rest of the answer
                if not opened:
                    opened = True
                    for frame in open_item():
                        yield frame
                yield delta(added)
            output = final["output_text"]
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
                    part=_output_text(output),
                )
                yield emit(
                    "response.output_item.done",
                    output_index=0,
                    item=_output_message(rid, output, "completed"),
                )
            if end.reasoning:
                item = _reasoning_item(rid, end.reasoning)
                at = 1 if message_first else 0
                yield emit("response.output_item.added", output_index=at, item=item)
                yield emit("response.output_item.done", output_index=at, item=item)
            yield emit(f"response.{final['status']}", response=final)
