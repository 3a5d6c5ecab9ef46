"""Weave over gRPC: a client generated from the same proto, and server reflection."""

from __future__ import annotations

import asyncio
import contextlib
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
    args = [
        "protoc",
        f"-I{src}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(src / proto),
    ]
    assert protoc.main(args) == 0
    for name in ("weave_pb2.py", "weave_pb2.pyi", "weave_pb2_grpc.py"):
        fresh = (tmp_path / "loom/server/proto" / name).read_text()
        assert fresh == (src / "loom/server/proto" / name).read_text(), f"regenerate {name}"


# -- SubscribeToSession -------------------------------------------------------------------------
async def _collect(call: object, stop: str, into: list[pb.WeaveEvent]) -> None:
    """Read a subscription into ``into`` until the AGENT_FINISH of run ``stop`` arrives."""
    while True:
        e = await call.read()  # type: ignore[attr-defined]
        if e is grpc.aio.EOF:
            return
        into.append(e)
        if e.type == "agent_finish" and e.run_id == stop:
            return


async def _run_ids(stub: pb_grpc.WeaveStub, session: str) -> list[str]:
    """The ids of every stored event of ``session``: a fresh subscription's replay (read
    until nothing more arrives for half a second)."""
    ids: list[str] = []
    call = stub.SubscribeToSession(pb.SubscribeRequest(session_id=session), timeout=30)
    try:
        while True:
            try:
                e = await asyncio.wait_for(call.read(), 0.5)
            except TimeoutError:
                return ids
            assert e is not grpc.aio.EOF and e.replayed
            ids.append(e.event_id)
    finally:
        call.cancel()


async def test_subscribe_sees_stored_then_live_events_without_duplicates(
    grpc_server: GrpcServer,
) -> None:
    url = grpc_server.http.url
    async with httpx.AsyncClient(timeout=20) as h, weave_stub(grpc_server) as stub:
        body = {"agent": "calc", "message": "add 2 and 3", "session_id": "sub-1"}
        first = (await h.post(f"{url}/v1/weave", json=body)).json()
        got: list[pb.WeaveEvent] = []
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="sub-1"), timeout=30)
        await _collect(call, first["run_id"], got)  # the stored run, replayed
        assert got and all(e.replayed for e in got) and got[0].started.agent == "calc"
        # a second run, started over HTTP while subscribed, arrives live
        body["message"] = "add 10 and 20"
        reader = asyncio.ensure_future(_collect(call, "", got))  # reads on; stopped below
        second = (await h.post(f"{url}/v1/weave:stream", json=body)).text
        assert "The sum is 30." in second
        await asyncio.sleep(0.3)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reader
    live = [e for e in got if not e.replayed]
    run2 = live[0].run_id
    assert run2 != first["run_id"] and all(e.run_id == run2 for e in live)
    kinds = [e.WhichOneof("kind") for e in live]
    assert kinds[0] == "started" and kinds[-1] == "final" and "delta" in kinds
    assert live[-1].final.output == "The sum is 30."
    ids = [e.event_id for e in got]
    assert len(ids) == len(set(ids)), "an event was sent twice"
    # no gap: every journaled event of the session was sent (deltas are live only)
    async with weave_stub(grpc_server) as stub:
        stored = await _run_ids(stub, "sub-1")
    assert [i for e, i in zip(got, ids, strict=True) if e.type != "llm_delta"] == stored
    seqs = [e.sequence for e in live]
    assert seqs == sorted(seqs) and seqs[0] == 0
    assert json.loads(live[0].event_json)["type"] == "agent_start"


async def test_subscribe_after_an_event_id_resumes_after_it(grpc_server: GrpcServer) -> None:
    url = grpc_server.http.url
    async with httpx.AsyncClient(timeout=20) as h, weave_stub(grpc_server) as stub:
        one = (
            await h.post(
                f"{url}/v1/weave",
                json={"agent": "calc", "message": "add 1 and 2", "session_id": "sub-2"},
            )
        ).json()
        two = (
            await h.post(
                f"{url}/v1/weave", json={"agent": "calc", "message": "hello", "session_id": "sub-2"}
            )
        ).json()
        whole: list[pb.WeaveEvent] = []
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="sub-2"), timeout=20)
        await _collect(call, two["run_id"], whole)
        call.cancel()
        cut = next(i for i, e in enumerate(whole) if e.run_id == one["run_id"] and e.sequence == 3)
        rest: list[pb.WeaveEvent] = []
        request = pb.SubscribeRequest(session_id="sub-2", after_event_id=whole[cut].event_id)
        call = stub.SubscribeToSession(request, timeout=20)
        await _collect(call, two["run_id"], rest)
        call.cancel()
        assert [e.event_id for e in rest] == [e.event_id for e in whole[cut + 1 :]]
        # bad cursors and unknown sessions are refused with a status, the server serves on
        for bad, code in [
            ("nope", grpc.StatusCode.INVALID_ARGUMENT),
            ("run_000000000000:3", grpc.StatusCode.INVALID_ARGUMENT),
            (f"{one['run_id']}:999", grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            call = stub.SubscribeToSession(
                pb.SubscribeRequest(session_id="sub-2", after_event_id=bad), timeout=5
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == code, bad
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="no-such"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await call.read()
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


# -- AnswerClarificationQuestion ----------------------------------------------------------------
async def test_answer_clarification_resumes_a_parked_run(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        parked = await stub.Weave(pb.WeaveRequest(agent="ops", message="go", session_id="ans-1"))
        assert parked.stop_reason == "awaiting_approval"
        call_id = parked.pending_approvals[0].tool_call_id
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await stub.AnswerClarificationQuestion(
                pb.ClarificationAnswer(session_id="ans-1", call_id="call_nope", approve=True)
            )
        assert wrong.value.code() == grpc.StatusCode.NOT_FOUND and call_id in wrong.value.details()
        answer = await stub.AnswerClarificationQuestion(
            pb.ClarificationAnswer(session_id="ans-1", call_id=call_id, approve=True), timeout=20
        )
        assert answer.status == "resumed"
        assert answer.reply.stop_reason == "completed"
        assert answer.reply.output == "done: deployed prod"
        assert answer.reply.session_id == "ans-1"
        with pytest.raises(grpc.aio.AioRpcError) as again:  # nothing is parked any more
            await stub.AnswerClarificationQuestion(
                pb.ClarificationAnswer(session_id="ans-1", call_id=call_id, approve=True)
            )
        assert again.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_rejection_reaches_the_model(grpc_server: GrpcServer) -> None:
    async with weave_stub(grpc_server) as stub:
        parked = await stub.Weave(pb.WeaveRequest(agent="ops", message="go", session_id="ans-2"))
        answer = await stub.AnswerClarificationQuestion(
            pb.ClarificationAnswer(
                session_id="ans-2",
                call_id=parked.pending_approvals[0].tool_call_id,
                approve=False,
                reason="not on a Friday",
            ),
            timeout=20,
        )
        assert answer.status == "resumed" and answer.reply.output.startswith("done: ")
        assert "not on a Friday" in answer.reply.output


# -- API keys -----------------------------------------------------------------------------------
ALICE, BOB = "alice-grpc-0001", "bob-grpc-0002"


@pytest.fixture(scope="module")
def keyed_grpc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    tmp = tmp_path_factory.mktemp("grpc-keys")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}, agents: [calc]}}\n- {{name: bob, key: {BOB}}}\n"
    )
    port = free_port()
    srv = start_server(tmp, "--grpc-port", str(port), "--keys", str(tmp / "keys.yaml"))
    yield GrpcServer(srv, f"127.0.0.1:{port}")
    stop_server(srv)


def key(value: str, header: str = "authorization") -> tuple[tuple[str, str], ...]:
    return ((header, f"Bearer {value}" if header == "authorization" else value),)


async def test_grpc_needs_a_key_when_keys_are_configured(keyed_grpc: GrpcServer) -> None:
    request = pb.WeaveRequest(agent="calc", message="add 1 and 1")
    async with weave_stub(keyed_grpc) as stub:
        for metadata in [(), key("wrong-key-0000"), (("authorization", "Basic abc"),)]:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.Weave(request, metadata=metadata)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "API key" in (denied.value.details() or "")
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="x"))
        with pytest.raises(grpc.aio.AioRpcError) as sub_denied:
            await call.read()
        assert sub_denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = await stub.Weave(request, metadata=key(ALICE), timeout=20)
        assert ok.output == "The sum is 2."
        ok = await stub.Weave(request, metadata=key(BOB, "x-api-key"), timeout=20)
        assert ok.output == "The sum is 2."


async def test_grpc_keys_are_scoped_to_agents_and_sessions(keyed_grpc: GrpcServer) -> None:
    async with weave_stub(keyed_grpc) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            await stub.Weave(pb.WeaveRequest(agent="ops", message="go"), metadata=key(ALICE))
        assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
        assert "ops" not in (hidden.value.details() or "").split("served: ")[-1]
        parked = await stub.Weave(
            pb.WeaveRequest(agent="ops", message="go", session_id="bob-1"), metadata=key(BOB)
        )
        assert parked.stop_reason == "awaiting_approval"
        call_id = parked.pending_approvals[0].tool_call_id
        # alice sees none of bob's session: not by subscribing, answering or continuing it
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="bob-1"), metadata=key(ALICE))
        with pytest.raises(grpc.aio.AioRpcError) as sub:
            await call.read()
        assert sub.value.code() == grpc.StatusCode.NOT_FOUND
        answer = pb.ClarificationAnswer(session_id="bob-1", call_id=call_id, approve=True)
        with pytest.raises(grpc.aio.AioRpcError) as ans:
            await stub.AnswerClarificationQuestion(answer, metadata=key(ALICE))
        assert ans.value.code() == grpc.StatusCode.NOT_FOUND
        # session ids are per key (issue #24): alice's "bob-1" is her own session, not bob's
        own = await stub.Weave(
            pb.WeaveRequest(agent="calc", message="hi", session_id="bob-1"), metadata=key(ALICE)
        )
        assert own.session_id == "alice~bob-1" and own.output == "echo: hi"
        # bob answers his own, and sees his session's events
        done = await stub.AnswerClarificationQuestion(answer, metadata=key(BOB), timeout=20)
        assert done.reply.output == "done: deployed prod"
        got: list[pb.WeaveEvent] = []
        call = stub.SubscribeToSession(pb.SubscribeRequest(session_id="bob-1"), metadata=key(BOB))
        await _collect(call, done.reply.run_id, got)
        call.cancel()
        assert got[-1].final.output == "done: deployed prod"


async def test_subscribing_mid_run_misses_nothing(grpc_server: GrpcServer) -> None:
    """Subscribe while a run is under way: the boundary between journal and live tail."""
    async with weave_stub(grpc_server) as stub:
        for i in range(5):
            session = f"sub-mid-{i}"
            request = pb.WeaveRequest(agent="calc", message="add 4 and 5", session_id=session)
            run = stub.StreamWeave(request, timeout=20)
            started = await run.read()
            got: list[pb.WeaveEvent] = []
            call = stub.SubscribeToSession(pb.SubscribeRequest(session_id=session), timeout=20)
            await _collect(call, started.run_id, got)
            call.cancel()
            while await run.read() is not grpc.aio.EOF:
                pass
            ids = [e.event_id for e in got]
            assert len(ids) == len(set(ids)), "an event was sent twice"
            stored = await _run_ids(stub, session)
            assert [e.event_id for e in got if e.type != "llm_delta"] == stored


@pytest.mark.parametrize("bad", ["cust\x00omer", "\x1b[31m", "a\nb", "x" * 10_240, "   "])
async def test_grpc_a_bad_session_id_is_invalid_argument_before_the_run(
    keyed_grpc: GrpcServer, bad: str
) -> None:
    """Session ids are checked where they enter (issue #24), as over HTTP: nothing runs."""
    async with weave_stub(keyed_grpc) as stub:
        for call in (
            stub.Weave(
                pb.WeaveRequest(agent="calc", message="add 2 3", session_id=bad), metadata=key(BOB)
            ),
            stub.AnswerClarificationQuestion(
                pb.ClarificationAnswer(session_id=bad, call_id="c", approve=True), metadata=key(BOB)
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "session id" in (refused.value.details() or "")
        stream = stub.StreamWeave(
            pb.WeaveRequest(agent="calc", message="add 2 3", session_id=bad), metadata=key(BOB)
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream.read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
