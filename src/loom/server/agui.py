"""AG-UI (``ag-ui-protocol``): ``POST /agui`` (the first served agent) and ``POST /agui/{agent}``
take a ``RunAgentInput`` and stream AG-UI events over SSE, mapped from the run's Loom events.

Terms: ``threadId`` is the Loom session; the AG-UI ``runId`` names the stream (the Loom run id
is in ``RUN_FINISHED.result``); Loom keeps the transcript, so of ``messages`` only what is new
is read: the last user message starts a turn, tool messages answer frontend tool calls. A user
message's content may be an array of parts: text parts are its text; image, audio, document
(and video) parts are Loom media of the run's message (``loom.content``), their source inline
bytes (``data``) or a URL the model's provider fetches (``url``; Loom never fetches it); a
provider's file handle (``file``) is refused (422), as Loom cannot read it.

Order (what ``@ag-ui/client`` verifies): ``RUN_STARTED``; per model answer its reasoning as
``REASONING_START``, ``REASONING_MESSAGE_START/CONTENT/END``, ``REASONING_END`` (a message of
its own, role ``reasoning``: deltas as they stream, else the step's whole reasoning from its
``LLM_COMPLETE``, never both and never in the answer's text), the text as
``TEXT_MESSAGE_START/CONTENT/END`` (deltas as they stream) then each tool call as
``TOOL_CALL_START/ARGS/END``; each server-side result as ``TOOL_CALL_RESULT``; a
``STATE_SNAPSHOT`` (the input state plus ``loom``: session, run, stop reason, usage); then
``RUN_FINISHED`` or ``RUN_ERROR`` last.

Media out: a tool result's images, audio and files are content parts of its
``TOOL_CALL_RESULT`` (after its text; ``image``, ``audio``, ``document``, or ``video`` for a
``video/*`` file) whose ``url`` source is the thread's media route
``GET /threads/{threadId}/media/{ref}`` (absolute, on the host the request came to; checked
like every thread route), or the part's own URL; never the bytes, which the client would
send back in every later ``RunAgentInput``. AG-UI's assistant message is text only, so the
media of an answer are lines of its text: ``[image chart.png: image/png, ...](<url>)``.

Frontend tools (``RunAgentInput.tools``) are offered to the model beside the agent's own. A
call to one parks through Loom's approval seam (a hook asks for approval, nobody answers in
the run): the stream ends with the call's ``TOOL_CALL`` events and ``RUN_FINISHED`` whose
success outcome names it in ``pendingToolCallIds``. The client runs the tool and sends the
next ``RunAgentInput`` with a tool message for that call: the parked call is approved, and
"running" it returns the client's content (its text, and its media parts read as a user
message's), so the result enters the journal as that call's result and the turn goes on. A
server-side call that needs a human ends the run with an
``interrupt`` outcome (one interrupt per call, ``id`` = the tool call id); a ``resume`` entry
(``payload: {"approved": bool, "reason"?}``, or ``status: "cancelled"`` to reject) answers it.
A run whose model asked the client something (a server query, ``awaiting_input``) also ends
with an ``interrupt`` outcome: one interrupt, ``id`` = the query id, ``reason`` =
``"server_query"``, the question as its ``message``; a ``resume`` entry with ``payload:
{"answer": "..."}`` answers it and the turn goes on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from loom.content import Audio, File, Image, Reasoning, describe
from loom.engine.run_inputs import Answer, NewMessage, Resume
from loom.errors import ContentError, InputError, UnsupportedContent
from loom.events import (
    AgentEvent,
    AgentFinish,
    LlmComplete,
    LlmDelta,
    LlmReasoningDelta,
    ToolErrorEvent,
    ToolResultEvent,
    parts_of,
)
from loom.hooks import RequireApproval
from loom.messages import ToolCall, new_id
from loom.server.app import ServerState, error_body, state_of
from loom.server.content_blocks import media_path
from loom.server.openai_api import EventStream, close_quietly
from loom.server.ownership import check_client_id, header_value
from loom.server.surface_media import MediaKind, decode_base64, media_part

if TYPE_CHECKING:
    from ag_ui.core import BaseEvent, ContentPart, RunAgentInput

    from loom.agent import Agent
    from loom.content import Part
    from loom.engine.loop import Turn
    from loom.tools.base import RunContext

__all__ = ["FRONTEND_REASON", "FrontendTool", "router"]

router = APIRouter(tags=["ag-ui"])

FRONTEND_REASON = "frontend tool: the AG-UI client runs it"
"""The approval reason of a parked frontend tool call (how a later input recognises it)."""


class FrontendTool:
    """A tool the AG-UI client runs. Offered to the model; its calls park (``_FrontendHook``)
    and, once the client answered, "running" one returns the client's content."""

    timeout: float | None = None
    effect: Any = "pure"  # running it again only reads the client's answer

    def __init__(self, name: str, description: str, parameters: Any) -> None:
        self.name, self.description = name, description
        self.parameters: dict[str, Any] = (
            dict(parameters)
            if isinstance(parameters, Mapping)
            else {"type": "object", "properties": {}}
        )
        # tool_call_id -> the client's result (this request): its text, or its text and media
        self.answers: dict[str, str | list[str | Part]] = {}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments  # the client validates what it runs

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        if ctx.tool_call_id not in self.answers:  # approved without an answer: cannot happen
            raise InputError(f"no client result for frontend call {ctx.tool_call_id!r}")
        return self.answers[ctx.tool_call_id]


class _FrontendHook:
    """Parks every call of a frontend tool (the approval seam: the stream ends there)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    async def before_tool_execution(self, ctx: Any, call: ToolCall) -> RequireApproval | None:
        return RequireApproval(FRONTEND_REASON) if call.name in self.names else None


def _with_frontend(agent: Agent, tools: Sequence[Any]) -> tuple[Agent, dict[str, FrontendTool]]:
    """``agent`` with the client's tools added (and every approval parked, not handled)."""
    if not tools:
        return agent, {}
    clash = sorted(t.name for t in tools if t.name in agent.tools)
    if clash:
        raise InputError(
            f"frontend tool(s) {', '.join(clash)} have the name of a tool of agent "
            f"{agent.name!r}; rename them in the client"
        )
    frontend = {t.name: FrontendTool(t.name, t.description, t.parameters) for t in tools}
    hooks = (*agent.hooks, _FrontendHook(frozenset(frontend)))
    changed = agent.replace(
        tools=[*agent.tools.values(), *frontend.values()], hooks=hooks, approval_handler=None
    )
    return changed, frontend


def _content(content: Any, where: str = "") -> tuple[str, list[Part]]:
    """A user or tool message's content as (text, media): its text parts joined, each image, audio,
    document or video part a Loom medium (``loom.server.surface_media.media_part``; a video
    is a ``File``: Loom has no video kind, and the model's provider says whether it reads
    one). A source that is a provider's file handle is refused: Loom cannot resolve it."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    parts: list[Part] = []
    kinds: dict[str, MediaKind] = {
        "image": Image,
        "audio": Audio,
        "document": File,
        "video": File,
    }
    for i, part in enumerate(content or []):
        kind = getattr(part, "type", None)
        if kind == "text":
            texts.append(part.text)
            continue
        if kind not in kinds:
            raise InputError(f"{where}content part {i} is {kind!r}: a message takes text and media")
        source, meta = part.source, part.metadata if isinstance(part.metadata, Mapping) else {}
        name = meta.get("filename") or meta.get("name")
        name = name if isinstance(name, str) and name else None
        label = f"{where}content part {i} ({kind}{', ' + name if name else ''})"
        try:
            if source.type == "data":
                data = decode_base64(source.value, label)
                parts.append(media_part(source.mime_type, data=data, name=name, kind=kinds[kind]))
            elif source.type == "url":
                parts.append(
                    media_part(source.mime_type, url=source.value, name=name, kind=kinds[kind])
                )
            else:
                raise UnsupportedContent(
                    f"its source is a file handle of {source.provider or 'a provider'}, which "
                    "Loom cannot read; send the bytes (a data source) or an http(s) URL"
                )
        except ContentError as exc:  # named once, by its place in the message
            said = str(exc).removeprefix(f"{label}: ")
            kind_of = UnsupportedContent if isinstance(exc, UnsupportedContent) else ContentError
            raise kind_of(f"{label}: {said}", part=str(i)) from None
    return "".join(texts), parts


class _Plan:
    """What one input asks for: a new turn (``message``), a resume (``decisions``) or the
    answer to a server query (``answer``, to ``query_id``)."""

    def __init__(self) -> None:
        self.message: str | None = None
        self.parts: list[Part] = []  # the new message's media
        self.decisions: dict[str, Any] = {}
        self.answer: str | None = None
        self.query_id: str | None = None


async def _plan(
    state: ServerState, body: RunAgentInput, frontend: dict[str, FrontendTool]
) -> _Plan:
    plan = _Plan()
    pending = await state.runtime.pending_approvals(body.thread_id)
    from ag_ui.core import ToolMessage

    answers = {m.tool_call_id: m for m in body.messages if isinstance(m, ToolMessage)}
    resumes = {r.interrupt_id: r for r in body.resume or []}
    query = await state.runtime.pending_query(body.thread_id)
    if query is not None and query.query_id in resumes:
        entry = resumes[query.query_id]
        payload = entry.payload if isinstance(entry.payload, Mapping) else {}
        if entry.status == "resolved" and isinstance(payload.get("answer"), str):
            plan.answer, plan.query_id = payload["answer"], query.query_id
            return plan
        if entry.status == "resolved":
            raise InputError(
                f"the resume entry of server query {query.query_id!r} needs a payload "
                '{"answer": "<text>"}'
            )
    for p in pending:
        tool_message = answers.get(p.tool_call_id)
        if p.reason == FRONTEND_REASON and tool_message is not None:
            tool = frontend.get(p.tool_name)
            if tool is None:
                raise InputError(
                    f"the answered call {p.tool_call_id!r} is of frontend tool "
                    f"{p.tool_name!r}; send that tool in tools again"
                )
            where = f"the tool message answering {p.tool_call_id!r}: "
            text, media = _content(tool_message.content, where)  # a result may carry media
            tool.answers[p.tool_call_id] = [text, *media] if media else text
            plan.decisions[p.tool_call_id] = {"decision": "approve"}
        elif p.tool_call_id in resumes:
            entry = resumes[p.tool_call_id]
            payload = entry.payload if isinstance(entry.payload, Mapping) else {}
            if entry.status == "resolved" and payload.get("approved") is True:
                plan.decisions[p.tool_call_id] = {"decision": "approve"}
            else:
                reason = payload.get("reason") or "rejected in the AG-UI client"
                plan.decisions[p.tool_call_id] = {"decision": "reject", "reason": str(reason)}
    last = body.messages[-1] if body.messages else None
    if pending and len(plan.decisions) == len(pending):
        return plan
    if last is not None and getattr(last, "role", None) == "user":
        plan.decisions = {}  # a new message: Loom rejects what is still parked
        plan.message, plan.parts = _content(last.content)
        return plan
    if query is not None:
        raise InputError(
            f"thread {body.thread_id!r} waits on server query {query.query_id!r} "
            f"({query.question!r}): send a resume entry {{interruptId: {query.query_id!r}, "
            'status: "resolved", payload: {answer: "..."}} (or a new user message)'
        )
    if pending:
        waiting = [p.tool_call_id for p in pending if p.tool_call_id not in plan.decisions]
        raise InputError(
            f"thread {body.thread_id!r} waits on tool call(s) {', '.join(waiting)}: "
            "send a tool message for each frontend call or a resume entry for "
            "each interrupt (or a new user message)"
        )
    raise InputError(
        "the last message must be a user message (the thread has nothing waiting "
        "for a tool result or a resume)"
    )


class _Mapper:
    """Loom events → AG-UI events for one run, keeping what the protocol's order needs.

    ``media_root`` is the server's absolute base URL: a stored medium's URL is the thread's
    media route under it."""

    def __init__(
        self, body: RunAgentInput, frontend: Mapping[str, FrontendTool], media_root: str
    ) -> None:
        self.body, self.frontend = body, frontend
        self.media_root = media_root.rstrip("/")
        self.text_id: str | None = None  # the open text message
        self.reasoning_id: str | None = None  # the open reasoning span and message
        self.reasoned = False  # this step's reasoning went out live (LLM_REASONING_DELTA)

    def map(self, ev: AgentEvent) -> list[BaseEvent]:
        from ag_ui import core as c

        out: list[BaseEvent] = []
        if isinstance(ev, LlmReasoningDelta) and ev.delta:
            self.reasoned = True
            out += self._reasoning(ev.delta)
        elif isinstance(ev, LlmDelta) and ev.delta:
            out += self._close_reasoning()  # the model thought, now it answers
            if self.text_id is None:
                self.text_id = new_id("msg")
                out.append(c.TextMessageStartEvent(message_id=self.text_id, role="assistant"))
            out.append(c.TextMessageContentEvent(message_id=self.text_id, delta=ev.delta))
        elif isinstance(ev, LlmComplete):
            out += self._close_reasoning()
            parts = parts_of(ev.parts) if ev.parts else []
            if not self.reasoned:  # a model that streams no reasoning: the step's, whole
                thought = "\n\n".join(p.text for p in parts if isinstance(p, Reasoning) and p.text)
                if thought:
                    out += self._reasoning(thought) + self._close_reasoning()
            self.reasoned = False
            message_id = self.text_id
            if message_id is None and ev.answer:  # a model that does not stream deltas
                message_id = new_id("msg")
                out.append(c.TextMessageStartEvent(message_id=message_id, role="assistant"))
                out.append(c.TextMessageContentEvent(message_id=message_id, delta=ev.answer))
            media = _media_of(parts)
            if media:  # AG-UI's assistant message is text: each medium a line with its URL
                lines = "\n".join(f"{describe(p)}({self.media_url(p)})" for p in media)
                if message_id is None:
                    message_id = new_id("msg")
                    out.append(c.TextMessageStartEvent(message_id=message_id, role="assistant"))
                    delta = lines
                else:
                    delta = "\n\n" + lines if ev.answer else lines
                out.append(c.TextMessageContentEvent(message_id=message_id, delta=delta))
            if message_id is not None:
                out.append(c.TextMessageEndEvent(message_id=message_id))
            self.text_id = None
            for call in ev.tool_calls:
                cid = str(call.get("id"))
                out.append(
                    c.ToolCallStartEvent(
                        tool_call_id=cid,
                        tool_call_name=str(call["name"]),
                        parent_message_id=message_id,
                    )
                )
                args = json.dumps(call.get("arguments") or {})
                out += [
                    c.ToolCallArgsEvent(tool_call_id=cid, delta=args),
                    c.ToolCallEndEvent(tool_call_id=cid),
                ]
        elif isinstance(ev, ToolResultEvent | ToolErrorEvent):
            if ev.tool_name not in self.frontend:  # the client has its own tool's result
                media = _media_of(parts_of(ev.parts) if ev.parts else [])
                content: str | list[c.ContentPart] = ev.content or ""
                if media:  # text first, then each medium (as the tool returned them)
                    content = [c.TextPart(text=ev.content)] if ev.content else []
                    content += [self.content_part(p) for p in media]
                result = c.ToolCallResultEvent(
                    message_id=new_id("msg"),
                    tool_call_id=ev.tool_call_id,
                    content=content,
                    role="tool",
                )
                out.append(result)
        elif isinstance(ev, AgentFinish):
            out += self.finish(ev)
        return out

    def _reasoning(self, text: str) -> list[BaseEvent]:
        """``text`` added to the open reasoning message (opened first when none is: a span of
        one message, both named by the same id)."""
        from ag_ui import core as c

        out: list[BaseEvent] = []
        rid = self.reasoning_id
        if rid is None:
            self.reasoning_id = rid = new_id("reasoning")
            out += [
                c.ReasoningStartEvent(message_id=rid),
                c.ReasoningMessageStartEvent(message_id=rid, role="reasoning"),
            ]
        out.append(c.ReasoningMessageContentEvent(message_id=rid, delta=text))
        return out

    def _close_reasoning(self) -> list[BaseEvent]:
        from ag_ui import core as c

        rid, self.reasoning_id = self.reasoning_id, None
        if rid is None:
            return []
        return [c.ReasoningMessageEndEvent(message_id=rid), c.ReasoningEndEvent(message_id=rid)]

    def media_url(self, part: Image | File | Audio) -> str:
        """Where the client reads a medium: the thread's media route for stored bytes (an
        absolute URL), else the part's own URL."""
        if part.ref is not None:
            return self.media_root + media_path(self.body.thread_id, part.ref)
        return part.url or ""

    def content_part(self, part: Image | File | Audio) -> ContentPart:
        """A medium as AG-UI's content part of its kind, its source a URL (never the bytes:
        a client sends its whole history back with every run)."""
        from ag_ui import core as c

        source = c.UrlSource(value=self.media_url(part), mime_type=part.media_type or None)
        meta = {"filename": part.name} if part.name else None
        if part.kind == "image":
            return c.ImagePart(source=source, metadata=meta)
        if part.kind == "audio":
            return c.AudioPart(source=source, metadata=meta)
        if (part.media_type or "").startswith("video/"):
            return c.VideoPart(source=source, metadata=meta)
        return c.DocumentPart(source=source, metadata=meta)

    def finish(self, ev: AgentFinish) -> list[BaseEvent]:
        from ag_ui import core as c

        out: list[BaseEvent] = self._close_reasoning()
        if self.text_id is not None:
            out.append(c.TextMessageEndEvent(message_id=self.text_id))
            self.text_id = None
        loom = {
            "session_id": ev.session_id,
            "run_id": ev.run_id,
            "stop_reason": ev.stop_reason,
            "usage": ev.usage,
        }
        base = self.body.state if isinstance(self.body.state, Mapping) else {}
        out.append(c.StateSnapshotEvent(snapshot={**base, "loom": loom}))
        tid, rid = self.body.thread_id, self.body.run_id
        if ev.stop_reason in ("completed", "awaiting_approval", "awaiting_input"):
            frontend = [
                p["tool_call_id"]
                for p in ev.pending_approvals
                if p.get("reason") == FRONTEND_REASON
            ]
            asks = [p for p in ev.pending_approvals if p.get("reason") != FRONTEND_REASON]
            query = ev.pending_query if ev.stop_reason == "awaiting_input" else None
            outcome: Any
            if asks or query:
                interrupts = [
                    c.Interrupt(
                        id=p["tool_call_id"],
                        reason="tool_approval",
                        message=p.get("reason") or None,
                        tool_call_id=p["tool_call_id"],
                        response_schema=_RESUME_SCHEMA,
                    )
                    for p in asks
                ]
                if query:  # the model asked the client something: the answer resumes it
                    interrupts.append(
                        c.Interrupt(
                            id=str(query.get("query_id", "")),
                            reason="server_query",
                            message=str(query.get("question", "")) or None,
                            response_schema=_ANSWER_SCHEMA,
                            metadata={"kind": query.get("kind"), "data": query.get("data")},
                        )
                    )
                outcome = c.RunFinishedInterruptOutcome(interrupts=interrupts)
            else:
                outcome = c.RunFinishedSuccessOutcome(pending_tool_call_ids=frontend or None)
            result = {"output": ev.output, **loom}
            if ev.pending_query:
                result["pending_query"] = ev.pending_query
            out.append(
                c.RunFinishedEvent(thread_id=tid, run_id=rid, result=result, outcome=outcome)
            )
        elif ev.stop_reason == "cancelled":
            out.append(
                c.RunFinishedEvent(
                    thread_id=tid, run_id=rid, result=loom, outcome=c.RunFinishedCancelledOutcome()
                )
            )
        else:
            message = ev.error or f"the run stopped: {ev.stop_reason}"
            out.append(c.RunErrorEvent(message=message, code=ev.stop_reason))
        return out


def _media_of(parts: Sequence[Any]) -> list[Image | File | Audio]:
    """The media (images, files, audio) among an event's parts, in order."""
    return [p for p in parts if isinstance(p, Image | File | Audio)]


_RESUME_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
_ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}


def _agent_for(state: ServerState, name: str | None) -> Agent | JSONResponse:
    if name is None:
        first = next(iter(state.registry), None)
        if first is None:
            return JSONResponse(error_body("NotFound", "this server serves no agents"), 404)
        name = first
    agent = state.registry.get(name)
    if agent is None:
        agents = ", ".join(state.registry) or "none"
        body = error_body("NotFound", f"no agent named {name!r} (served: {agents})")
        return JSONResponse(body, status_code=404)
    return agent


async def _start(
    state: ServerState, agent: Agent, body: RunAgentInput, media_root: str
) -> tuple[Turn, _Mapper]:
    """The turn this input asks for (InputError → 422 before the stream starts); its media
    URLs are under ``media_root`` (the request's base URL)."""
    served, frontend = _with_frontend(agent, body.tools or [])
    plan = await _plan(state, body, frontend)
    if plan.message is not None:
        new = NewMessage(plan.message, tuple(plan.parts))
        turn = await state.runtime.start(served, new, session_id=body.thread_id)
    elif plan.answer is not None:
        answer = Answer(plan.answer, query_id=plan.query_id)
        turn = await state.runtime.start(served, answer, session_id=body.thread_id)
    else:
        resume = Resume(plan.decisions)
        turn = await state.runtime.start(served, resume, session_id=body.thread_id)
    return turn, _Mapper(body, frontend, media_root)


async def _run(request: Request, name: str | None) -> Response:
    from ag_ui.core import RunAgentInput, RunErrorEvent, RunStartedEvent
    from ag_ui.encoder import EventEncoder
    from pydantic import ValidationError

    from loom.engine.driving import drive

    try:
        raw = await request.json()
    except ValueError:
        return JSONResponse(
            error_body("InvalidRequest", "the body is not JSON: send a RunAgentInput"),
            status_code=422,
        )
    try:
        body = RunAgentInput.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(
            error_body("InvalidRequest", f"not a RunAgentInput: {problems}"), status_code=422
        )
    try:  # checked where it enters, before anything runs (loom.server.ownership)
        check_client_id(body.thread_id, "threadId")
    except InputError as exc:
        return JSONResponse(error_body("InputError", str(exc)), status_code=422)
    state = state_of(request)
    agent = _agent_for(state, name)
    if isinstance(agent, JSONResponse):
        return agent
    turn, mapper = await _start(state, agent, body, str(request.base_url))
    events = drive(turn)
    encoder = EventEncoder(accept=request.headers.get("accept", "text/event-stream"))

    async def sse() -> AsyncIterator[str]:
        yield encoder.encode(RunStartedEvent(thread_id=body.thread_id, run_id=body.run_id))
        ended = False
        try:
            async for ev in events:
                for out in mapper.map(ev):
                    ended = ended or out.type in ("RUN_FINISHED", "RUN_ERROR")
                    yield encoder.encode(out)
        except Exception as exc:  # the turn itself failed: the protocol's error, last
            if not ended:
                yield encoder.encode(
                    RunErrorEvent(message=f"{type(exc).__name__}: {exc}", code="internal_error")
                )
        finally:
            await close_quietly(events)

    return EventStream(
        sse(),
        media_type=encoder.get_content_type(),
        headers={"Cache-Control": "no-cache", "X-Loom-Session": header_value(body.thread_id)},
    )


_DOC = "AG-UI: run the agent for a RunAgentInput and stream AG-UI events (SSE)"


@router.post("/agui", summary=_DOC + " (the server's first agent)")
async def agui_default(request: Request) -> Response:
    return await _run(request, None)


@router.post("/agui/{agent}", summary=_DOC)
async def agui_agent(request: Request, agent: str) -> Response:
    return await _run(request, agent)
