"""Seed 000's Weave service over gRPC (``grpc.aio``): ``Weave`` and ``StreamWeave``.

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

from loom.errors import InputError, LoomError, QueueFull, QueueTimeout, SessionBusy
from loom.server.app import ServerState
from loom.server.proto import weave_pb2 as pb
from loom.server.proto import weave_pb2_grpc as pb_grpc
from loom.server.weave_api import ProgressTracker, weave_reply

__all__ = ["SERVICE_NAME", "WeaveService", "start_grpc_server"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Weave"].full_name

_CODES: list[tuple[type[BaseException], Any]] = [
    (SessionBusy, grpc.StatusCode.ABORTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueTimeout, grpc.StatusCode.UNAVAILABLE),
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (LoomError, grpc.StatusCode.FAILED_PRECONDITION),
]


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
    """The Weave gRPC service over a server's registry and runtime."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _agent(self, request: Any, context: Any) -> Any:
        agent = self.state.registry.get(request.agent)
        if agent is None:
            served = ", ".join(self.state.registry) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no agent named {request.agent!r} (served: {served})"
            )
        return agent

    async def _fail(self, exc: LoomError, context: Any) -> None:
        code = next(c for kind, c in _CODES if isinstance(exc, kind))
        await context.abort(code, f"{type(exc).__name__}: {exc}")

    async def Weave(self, request: Any, context: Any) -> Any:
        agent = await self._agent(request, context)
        try:
            result = await self.state.runtime.run(
                agent, request.message, session_id=request.session_id or None
            )
        except LoomError as exc:
            await self._fail(exc, context)
        return _reply(weave_reply(result))

    async def StreamWeave(self, request: Any, context: Any) -> AsyncIterator[Any]:
        agent = await self._agent(request, context)
        events = self.state.runtime.stream(
            agent, request.message, session_id=request.session_id or None
        )
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
                    **{kind: _event(kind, data)},
                )
        except LoomError as exc:
            await self._fail(exc, context)
        finally:  # a client that cancels cancels the turn (recorded as cancelled)
            await events.aclose()


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
