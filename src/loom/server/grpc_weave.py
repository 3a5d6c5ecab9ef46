"""Seed 000's Weave service over gRPC (``grpc.aio``): ``Weave``, ``StreamWeave``,
``SubscribeToSession`` and ``AnswerClarificationQuestion``.

It runs in the ``loom serve`` process, on the same event loop and ``Runtime`` as HTTP (so a
session started over gRPC continues over HTTP), on ``--grpc-port``; the Weave router's
lifespan starts and stops it. Server reflection is on, so ``grpcurl`` and reflection clients
list and call it without the proto. The messages are those of ``proto/weave.proto``; the
stubs beside it are generated and committed (the command is in the proto's header).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection
from starlette.exceptions import HTTPException as StarletteHTTPException

from loom.errors import (
    InputError,
    LoomError,
    QueueFull,
    QueueTimeout,
    SessionBusy,
    SessionNotFound,
)
from loom.events import AgentFinish
from loom.server.app import ServerState, view_for
from loom.server.ownership import client_session_id, current_owners, current_principal
from loom.server.proto import weave_pb2 as pb
from loom.server.proto import weave_pb2_grpc as pb_grpc
from loom.server.security import presented_key
from loom.server.session_events import Lagged, event_id, session_events
from loom.server.weave_api import ProgressTracker, weave_reply

__all__ = ["SERVICE_NAME", "WeaveService", "start_grpc_server"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Weave"].full_name

_CODES: list[tuple[type[BaseException], Any]] = [
    (SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (SessionBusy, grpc.StatusCode.ABORTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueTimeout, grpc.StatusCode.UNAVAILABLE),
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (LoomError, grpc.StatusCode.FAILED_PRECONDITION),
]

_HTTP_CODES = {
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _usage(u: dict[str, int]) -> Any:
    return pb.Usage(**u)


def _call(c: dict[str, Any]) -> Any:
    return pb.ToolCall(
        id=c["id"],
        name=c["name"],
        input_json=_json(c.get("input") or {}),
        finished=c.get("success") is not None,
        success=bool(c.get("success")),
        result=c.get("result") or "",
        error_code=c.get("error_code") or "",
        duration_ms=float(c.get("duration_ms") or 0.0),
    )


def _approval(p: dict[str, Any]) -> Any:
    return pb.PendingApproval(
        tool_call_id=p.get("tool_call_id", ""),
        tool_name=p.get("tool_name", ""),
        arguments_json=_json(p.get("arguments") or {}),
        reason=p.get("reason") or "",
    )


def _reply(d: dict[str, Any]) -> Any:
    return pb.WeaveReply(
        session_id=d["session_id"],
        run_id=d["run_id"],
        output=d["output"],
        stop_reason=d["stop_reason"],
        usage=_usage(d["usage"]),
        iterations=d["iterations"],
        error=d["error"] or "",
        tool_calls=[_call(c) for c in d["tool_calls"]],
        pending_approvals=[_approval(p) for p in d["pending_approvals"]],
        warnings=d["warnings"],
    )


def _event(kind: str, d: dict[str, Any]) -> Any:
    """The oneof field and message of one progress event."""
    if kind == "started":
        return pb.Started(agent=d["agent"], resume=d["resume"])
    if kind == "stage":
        return pb.Stage(from_stage=d["from"], to_stage=d["to"])
    if kind == "delta":
        return pb.TextDelta(text=d["text"])
    if kind in ("tool_start", "tool_end"):
        return _call(d)
    if kind == "tokens":
        return pb.Tokens(call=_usage(d["call"]), total=_usage(d["total"]))
    if kind == "approval_required":
        return _approval(d)
    if kind in ("warning", "error"):
        return pb.Notice(
            message=d["message"], source=d.get("source", ""), fatal=d.get("fatal", False)
        )
    return _reply(d)  # final


class WeaveService(pb_grpc.WeaveServicer):
    """The Weave gRPC service over a server's registry and runtime.

    With API keys configured every RPC needs ``authorization: Bearer <key>`` (or
    ``x-api-key: <key>``) metadata (``UNAUTHENTICATED`` otherwise); the key's agent limits and
    thread ownership apply as over HTTP (another key's session or agent is ``NOT_FOUND``)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _enter(self, context: Any, *, starts_run: bool = False) -> ServerState:
        """Authenticate the call and answer the server as its key sees it; the key is the
        current principal for the rest of the call (limits, ownership)."""
        security = self.state.extra.get("security")
        principal = None
        if security is not None and security.keys:
            metadata = {
                k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)
            }
            presented = presented_key(metadata)
            if presented is None:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "this server needs an API key: send the metadata authorization: Bearer <key> "
                    "(or x-api-key: <key>)",
                )
            principal = security.keys.match(presented)
            if principal is None:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "the API key is not valid for this server; check the key you send",
                )
        if starts_run and self.state.draining:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "the server is shutting down and takes no new runs; retry against another "
                "instance or after it restarts",
            )
        current_principal.set(principal)
        owners = self.state.extra.get("owners")
        current_owners.set(owners)
        if owners is not None:
            await owners.load()
        return view_for(self.state, principal)

    async def _session(self, given: str, context: Any) -> str | None:
        """The session a request names ("": none), checked and the key's own (as over HTTP)."""
        if not given:
            return None
        try:
            return client_session_id(given)
        except InputError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this keeps the type checker informed

    async def _agent(self, state: ServerState, name: str, context: Any) -> Any:
        agent = state.registry.get(name)
        if agent is None:
            served = ", ".join(state.registry) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no agent named {name!r} (served: {served})"
            )
        return agent

    async def _fail(self, exc: Exception, context: Any) -> None:
        if isinstance(exc, StarletteHTTPException):
            code = _HTTP_CODES.get(exc.status_code, grpc.StatusCode.FAILED_PRECONDITION)
            await context.abort(code, str(exc.detail))
        code = next(c for kind, c in _CODES if isinstance(exc, kind))
        await context.abort(code, f"{type(exc).__name__}: {exc}")

    async def Weave(self, request: Any, context: Any) -> Any:
        state = await self._enter(context, starts_run=True)
        agent = await self._agent(state, request.agent, context)
        session_id = await self._session(request.session_id, context)
        try:
            result = await state.runtime.run(agent, request.message, session_id=session_id)
        except LoomError as exc:
            await self._fail(exc, context)
        return _reply(weave_reply(result))

    async def StreamWeave(self, request: Any, context: Any) -> AsyncIterator[Any]:
        state = await self._enter(context, starts_run=True)
        agent = await self._agent(state, request.agent, context)
        session_id = await self._session(request.session_id, context)
        events = state.runtime.stream(agent, request.message, session_id=session_id)
        tracker = ProgressTracker()
        try:
            async for event in events:
                p = tracker.progress(event)
                if p is None:
                    continue
                kind, data = p
                yield pb.WeaveEvent(
                    session_id=event.session_id,
                    run_id=event.run_id,
                    sequence=event.sequence,
                    event_id=event_id(event),
                    **{kind: _event(kind, data)},
                )
        except LoomError as exc:
            await self._fail(exc, context)
        finally:  # a client that cancels cancels the turn (recorded as cancelled)
            await events.aclose()

    async def SubscribeToSession(self, request: Any, context: Any) -> AsyncIterator[Any]:
        state = await self._enter(context)
        session_id = await self._session(request.session_id, context) or ""
        if not session_id or await state.runtime.store.get_session(session_id) is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no session {session_id!r}; start one with Weave or POST /threads",
            )
        trackers: dict[str, ProgressTracker] = {}
        events = session_events(
            state.hub, state.runtime.store, session_id, request.after_event_id or None
        )
        try:
            async for ev, replayed in events:
                tracker = trackers.get(ev.run_id)
                if tracker is None:
                    tracker = trackers[ev.run_id] = ProgressTracker()
                p = tracker.progress(ev)
                kind = {} if p is None else {p[0]: _event(*p)}
                yield pb.WeaveEvent(
                    session_id=ev.session_id,
                    run_id=ev.run_id,
                    sequence=ev.sequence,
                    event_id=event_id(ev),
                    type=str(ev.type),
                    event_json=_json(ev.to_dict()),
                    replayed=replayed,
                    **kind,
                )
                if isinstance(ev, AgentFinish):
                    trackers.pop(ev.run_id, None)
        except Lagged as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except (LoomError, StarletteHTTPException) as exc:
            await self._fail(exc, context)
        finally:
            await events.aclose()

    async def AnswerClarificationQuestion(self, request: Any, context: Any) -> Any:
        from loom.server.langgraph_api import record_decision, session_agent

        state = await self._enter(context, starts_run=True)
        decision: dict[str, Any] = {"decision": "approve" if request.approve else "reject"}
        if request.reason:
            decision["reason"] = request.reason
        session_id = await self._session(request.session_id, context) or ""
        try:
            info, decided, waiting = await record_decision(
                state, session_id, request.call_id, decision
            )
            if waiting:
                return pb.AnswerReply(status="waiting", undecided=waiting)
            agent = await self._agent(state, await session_agent(state, info), context)
            result = await state.runtime.resume(agent, session_id, decided)
        except (LoomError, StarletteHTTPException) as exc:
            await self._fail(exc, context)
        return pb.AnswerReply(status="resumed", reply=_reply(weave_reply(result)))


async def start_grpc_server(state: ServerState, host: str, port: int) -> Any:
    """Start the Weave gRPC service (with reflection) on ``host:port``; returns the server."""
    server = grpc.aio.server()
    pb_grpc.add_WeaveServicer_to_server(WeaveService(state), server)  # type: ignore[no-untyped-call]
    reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind the gRPC port {address}")
    await server.start()
    return server
