"""Weave over gRPC: a client generated from the same proto, and server reflection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.server.conftest import Server, free_port, start_server, stop_server

grpc = pytest.importorskip("grpc")
reflection_db = pytest.importorskip("grpc_reflection.v1alpha.proto_reflection_descriptor_database")

from loom.server.proto import weave_pb2 as pb  # noqa: E402
from loom.server.proto import weave_pb2_grpc as pb_grpc  # noqa: E402


@dataclass
class GrpcServer:
    http: Server
    target: str


@pytest.fixture(scope="module")
def grpc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    port = free_port()
    srv = start_server(tmp_path_factory.mktemp("grpc"), "--grpc-port", str(port))
    yield GrpcServer(srv, f"127.0.0.1:{port}")
    stop_server(srv)


@asynccontextmanager
async def weave_stub(server: GrpcServer) -> AsyncIterator[pb_grpc.WeaveStub]:
    """A client on the test's own event loop (grpc.aio channels are bound to one loop)."""
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield pb_grpc.WeaveStub(channel)


async def test_weave_unary(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        reply = await stub.Weave(pb.WeaveRequest(agent="calc", message="add 3 and 4"), timeout=20)
        assert reply.output == "The sum is 7." and reply.stop_reason == "completed"
        assert reply.usage.requests == 2 and reply.session_id.startswith("session_")
        [call] = reply.tool_calls
        assert call.name == "add" and json.loads(call.input_json) == {"a": 3, "b": 4}
        assert call.finished and call.success and call.result == "7"
        # the session is the runtime's: HTTP continues it
        async with httpx.AsyncClient() as h:
            r = await h.post(
                f"{grpc_server.http.url}/v1/weave",
                json={"agent": "calc", "message": "next", "session_id": reply.session_id},
            )
        assert r.json()["session_id"] == reply.session_id


async def test_stream_weave(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        request = pb.WeaveRequest(agent="calc", message="add 5 and 6", session_id="grpc-s1")
        events = [e async for e in stub.StreamWeave(request, timeout=20)]
        kinds = [e.WhichOneof("kind") for e in events]
        assert kinds[0] == "started" and kinds[-1] == "final"
        assert {"stage", "tool_start", "tool_end", "tokens", "delta"} <= set(kinds)
        end = next(e.tool_end for e in events if e.WhichOneof("kind") == "tool_end")
        assert end.name == "add" and end.result == "11" and end.success
        text = "".join(e.delta.text for e in events if e.WhichOneof("kind") == "delta")
        final = events[-1].final
        assert text == final.output == "The sum is 11."
        assert all(e.session_id == "grpc-s1" for e in events)


async def test_stream_weave_approval(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        events = [e async for e in stub.StreamWeave(pb.WeaveRequest(agent="ops", message="go"))]
        ask = next(
            e.approval_required for e in events if e.WhichOneof("kind") == "approval_required"
        )
        assert ask.tool_name == "deploy" and json.loads(ask.arguments_json) == {"target": "prod"}
        assert events[-1].final.stop_reason == "awaiting_approval"
        assert events[-1].final.pending_approvals[0].tool_call_id == ask.tool_call_id


async def test_grpc_errors_have_status_codes(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.Weave(pb.WeaveRequest(agent="nope", message="hi"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert "calc" in (unknown.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await stub.Weave(pb.WeaveRequest(agent="calc", message="  "))
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as empty_stream:
            _ = [e async for e in stub.StreamWeave(pb.WeaveRequest(agent="calc", message=""))]
        assert empty_stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # the server keeps serving
        ok = await stub.Weave(pb.WeaveRequest(agent="calc", message="still there?"))
        assert ok.output == "echo: still there?"


def test_reflection_lists_the_service(grpc_server: GrpcServer) -> None:
    with grpc.insecure_channel(grpc_server.target) as channel:
        db = reflection_db.ProtoReflectionDescriptorDatabase(channel)
        services = db.get_services()
        assert "loom.weave.v1.Weave" in services
        desc = db.FindFileContainingSymbol("loom.weave.v1.Weave")
        assert desc.package == "loom.weave.v1"


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    """The stubs in git are what the proto's header command generates today."""
    from grpc_tools import protoc

    src = Path(pb.__file__).resolve().parents[3]
    proto = "loom/server/proto/weave.proto"
    args = ["protoc", f"-I{src}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(src / proto)]  # fmt: skip
    assert protoc.main(args) == 0
    for name in ("weave_pb2.py", "weave_pb2.pyi", "weave_pb2_grpc.py"):
        fresh = (tmp_path / "loom/server/proto" / name).read_text()
        assert fresh == (src / "loom/server/proto" / name).read_text(), f"regenerate {name}"
