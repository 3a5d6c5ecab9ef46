"""A2A 1.0 on a real ``loom serve``, driven by the ``a2a-sdk`` Python client (someone else's
client): the card, a message, a streamed task, GetTask / CancelTask / ListTasks, a continued
context, an approval answered on the task, and the protocol's errors for bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

pytest.importorskip("a2a.client")

from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)

AGENTS = (Path(__file__).parent / "a2a_agents.py").read_text()
KEY, OTHER = "alpha-key-0001", "beta-key-00002"
AUTH = {"Authorization": f"Bearer {KEY}"}
OTHER_AUTH = {"x-api-key": OTHER}
V1 = {"A2A-Version": "1.0"}

session_loop = pytest.mark.asyncio(loop_scope="session")  # the fixtures' loop


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("a2a")
    srv = start_server(
        tmp, app="a2a_agents:registry", source=AGENTS, env={"LOOM_API_KEYS": f"{KEY},{OTHER}"}
    )
    yield srv, tmp
    stop_server(srv)


@pytest.fixture
async def client(served: tuple[Server, Path]) -> AsyncIterator[Any]:
    yield await _client(served[0], "calc")


_HTTP: list[httpx.AsyncClient] = []


async def _client(
    server: Server, agent: str, headers: dict[str, str] = AUTH, *, streaming: bool = True
) -> Any:
    http = httpx.AsyncClient(headers=headers, timeout=30)
    _HTTP.append(http)
    return await create_client(
        f"{server.url}/agents/{agent}",
        ClientConfig(httpx_client=http, streaming=streaming),
        resolver_http_kwargs={"headers": headers},
    )


def _message(text: str, *, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    msg = Message(
        role=Role.ROLE_USER,
        message_id=f"m-{time.monotonic_ns()}",
        parts=[Part(text=text)],
        context_id=context_id,
        task_id=task_id,
    )
    return SendMessageRequest(message=msg)


async def _final(client: Any, request: SendMessageRequest) -> tuple[Any, list[StreamResponse]]:
    """Send, read the whole stream, and return the task as GetTask has it then."""
    seen = [r async for r in client.send_message(request)]
    task_id = next(r.task.id if r.HasField("task") else r.status_update.task_id for r in seen)
    return await client.get_task(GetTaskRequest(id=task_id)), seen


def _text(parts: Any) -> str:
    return "".join(p.text for p in parts if p.HasField("text"))


def _rpc(server: Server, agent: str, body: Any, headers: dict[str, str] = AUTH) -> dict[str, Any]:
    url = f"{server.url}/agents/{agent}/a2a"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**headers, **V1, "content-type": "application/json"}
    r = httpx.post(url, headers=headers, content=content, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# -- the card ---------------------------------------------------------------------------------
def test_agent_card_names_the_agent_its_skills_bindings_and_auth(
    served: tuple[Server, Path],
) -> None:
    srv = served[0]
    card = httpx.get(f"{srv.url}/agents/calc/.well-known/agent-card.json", headers=AUTH).json()
    assert card["name"] == "calc" and card["description"] == "You add numbers."
    assert [s["id"] for s in card["skills"]] == ["calc", "calc.add"]
    assert card["skills"][1]["description"] == "Add two integers."
    bindings = {i["protocolBinding"]: i["url"] for i in card["supportedInterfaces"]}
    assert bindings == {
        "JSONRPC": f"{srv.url}/agents/calc/a2a",
        "HTTP+JSON": f"{srv.url}/agents/calc/a2a/rest",
    }
    assert card["capabilities"]["streaming"] is True
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["securitySchemes"]["apiKey"]["apiKeySecurityScheme"]["name"] == "x-api-key"
    default = httpx.get(f"{srv.url}/.well-known/agent-card.json", headers=AUTH).json()
    assert default["name"] == "calc"  # the first served agent
    no_key = httpx.get(f"{srv.url}/agents/calc/.well-known/agent-card.json")
    assert no_key.status_code == 401
    missing = httpx.get(f"{srv.url}/agents/nope/.well-known/agent-card.json", headers=AUTH)
    assert missing.status_code == 404 and "calc, ops, waiter" in missing.json()["error"]["message"]


# -- messages, streams, contexts --------------------------------------------------------------
@session_loop
async def test_send_message_runs_the_agent_and_a_context_continues_its_session(
    client: Any, served: tuple[Server, Path]
) -> None:
    task, _ = await _final(client, _message("add 2 3"))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert _text(task.artifacts[0].parts) == "The sum is 5."
    session = task.context_id
    assert task.metadata["loomSessionId"] == session
    # Loom's metadata keys are camelCase, like every field of A2A's JSON (section 5.5)
    assert sorted(task.metadata) == ["loomAgent", "loomRunId", "loomSessionId", "loomStopReason"]
    assert list(task.artifacts[0].metadata) == ["loomRunId"]
    second, _ = await _final(client, _message("and hello", context_id=session))
    assert second.context_id == session and second.id != task.id
    assert _text(second.artifacts[0].parts) == "echo: and hello"
    # the A2A context is the Loom session: one transcript holds both exchanges
    async with httpx.AsyncClient(headers=AUTH) as http:
        state = (await http.get(f"{served[0].url}/threads/{session}/state")).json()
    contents = [m["content"] for m in state["values"]["messages"]]
    assert contents == ["add 2 3", "", "5", "The sum is 5.", "and hello", "echo: and hello"]
    listed = await client.list_tasks(ListTasksRequest(context_id=session))
    assert sorted(t.id for t in listed.tasks) == sorted([task.id, second.id])


@session_loop
async def test_streaming_shows_the_task_move_from_working_to_completed(client: Any) -> None:
    seen = [r async for r in client.send_message(_message("add 40 2"))]
    kinds = [r.WhichOneof("payload") for r in seen]
    assert kinds[0] == "task"
    updates = [r.status_update for r in seen if r.HasField("status_update")]
    states = [u.status.state for u in updates]
    assert states[0] == TaskState.TASK_STATE_WORKING
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    texts = [_text(u.status.message.parts) for u in updates]
    assert texts.index("calling add") < texts.index("add finished") < len(texts) - 1
    artifacts = [r.artifact_update for r in seen if r.HasField("artifact_update")]
    assert [_text(a.artifact.parts) for a in artifacts] == ["The sum is 42."]
    assert kinds.index("artifact_update") < len(kinds) - 1  # the answer before the final state


async def _wait_state(client: Any, task_id: str, state: int, within: float = 20) -> Any:
    deadline = time.monotonic() + within
    while True:
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state == state or time.monotonic() > deadline:
            return task
        await asyncio.sleep(0.05)


@session_loop
async def test_get_and_cancel_a_running_task(served: tuple[Server, Path]) -> None:
    srv, tmp = served
    waiter = await _client(srv, "waiter")
    request = _message("wait for never-1.txt")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    sent = [r async for r in (await _client(srv, "waiter", streaming=False)).send_message(request)]
    task_id = sent[0].task.id
    task = await _wait_state(waiter, task_id, TaskState.TASK_STATE_WORKING)
    assert task.status.state == TaskState.TASK_STATE_WORKING, _text(task.status.message.parts)
    cancelled = await waiter.cancel_task(CancelTaskRequest(id=task_id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    again = await waiter.get_task(GetTaskRequest(id=task_id))
    assert again.status.state == TaskState.TASK_STATE_CANCELED
    assert again.metadata["loomStopReason"] == "cancelled"  # the Loom run recorded its end
    (tmp / "never-1.txt").write_text("late")  # nothing is left waiting on it


@session_loop
async def test_a_task_waiting_on_the_test_ends_when_released(served: tuple[Server, Path]) -> None:
    srv, tmp = served
    waiter = await _client(srv, "waiter")
    stream = waiter.send_message(_message("wait for go-1.txt"))
    async for r in stream:
        if r.HasField("status_update") and _text(r.status_update.status.message.parts) == (
            "calling wait_for"
        ):
            break
    (tmp / "go-1.txt").write_text("go")
    rest = [r async for r in stream]
    assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert _text(rest[-1].status_update.status.message.parts) == "released: go"


@session_loop
async def test_an_approval_is_input_required_and_a_reply_resumes_the_task(
    served: tuple[Server, Path],
) -> None:
    ops = await _client(served[0], "ops")
    task, _ = await _final(ops, _message("ship it"))
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    asked = _text(task.status.message.parts)
    assert "deploy" in asked and "any other reply rejects" in asked
    done, _ = await _final(ops, _message("approve", task_id=task.id, context_id=task.context_id))
    assert done.id == task.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    assert _text(done.artifacts[-1].parts) == "done: deployed prod"


@session_loop
async def test_free_text_on_an_input_required_task_rejects_with_that_reason(
    served: tuple[Server, Path],
) -> None:
    """A generic A2A client can always go on: what a person types is an answer (A2A keeps
    ``input-required`` meaning "reply to continue"), here a rejection whose reason the model
    reads."""
    ops = await _client(served[0], "ops")
    task, _ = await _final(ops, _message("ship it"))
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    reply = _message("not during the freeze, wait for Monday", task_id=task.id)
    done, _ = await _final(ops, reply)
    assert done.id == task.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    answer = _text(done.artifacts[-1].parts)
    assert (
        answer
        == "done: Error (denied): rejected by the user: not during the freeze, wait for Monday"
    )
    # the same over the raw JSON-RPC binding: a result, not a -32602 error
    again, _ = await _final(ops, _message("ship it"))
    raw = _rpc(
        served[0],
        "ops",
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "x1",
                    "role": "ROLE_USER",
                    "taskId": again.id,
                    "parts": [{"text": "maybe later"}],
                }
            },
        },
    )
    assert raw["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", raw
    assert raw["result"]["task"]["artifacts"][-1]["parts"][0]["text"] == (
        "done: Error (denied): rejected by the user: maybe later"
    )


# -- bad input --------------------------------------------------------------------------------
def test_malformed_json_and_unknown_methods_get_json_rpc_errors(
    served: tuple[Server, Path],
) -> None:
    srv = served[0]
    parse = _rpc(srv, "calc", b"{not json")
    assert parse["error"]["code"] == -32700 and "not valid JSON" in parse["error"]["message"]
    unknown = _rpc(srv, "calc", {"jsonrpc": "2.0", "id": 1, "method": "tasks/explode"})
    assert unknown["id"] == 1 and unknown["error"]["code"] == -32601
    assert (
        "'tasks/explode'" in unknown["error"]["message"]
        and "SendMessage" in unknown["error"]["message"]
    )
    no_params = _rpc(
        srv, "calc", {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": 5}}
    )
    assert no_params["error"]["code"] in (-32602, -32001)
    # the server keeps serving
    ok = _rpc(
        srv,
        "calc",
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "SendMessage",
            "params": {
                "message": {"messageId": "ok1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
            },
        },
    )
    assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_parts_loom_cannot_use_are_refused_saying_why(served: tuple[Server, Path]) -> None:
    """File and data parts are taken (tests/interop/test_a2a_media.py); what is refused is what
    Loom cannot use: a URL no provider fetches, text that claims to be an image, bytes that are
    not the type they claim."""
    for part, code, says in (
        ({"url": "file:///etc/passwd", "mediaType": "text/plain"}, -32005, "a file URL is not"),
        ({"text": "<b>hi</b>", "mediaType": "image/png"}, -32602, "text that says it is image/png"),
        ({"raw": "bm90IGEgcG5n", "mediaType": "image/png"}, -32602, "claims image/png"),
    ):
        body = {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": f"f-{code}-{says}",
                    "role": "ROLE_USER",
                    "parts": [{"text": "look"}, part],
                }
            },
        }
        out = _rpc(served[0], "calc", body)
        assert out["error"]["code"] == code, out
        assert "message part 1" in out["error"]["message"] and says in out["error"]["message"]


@session_loop
async def test_another_keys_task_and_context_do_not_exist(
    client: Any, served: tuple[Server, Path]
) -> None:
    srv = served[0]
    task, _ = await _final(client, _message("add 1 1"))
    get = {"jsonrpc": "2.0", "id": 5, "method": "GetTask", "params": {"id": task.id}}
    out = _rpc(srv, "calc", get, headers=OTHER_AUTH)
    assert out["error"]["code"] == -32001
    assert f"no task {task.id!r}" in out["error"]["message"]
    cancel = {"jsonrpc": "2.0", "id": 6, "method": "CancelTask", "params": {"id": task.id}}
    assert _rpc(srv, "calc", cancel, headers=OTHER_AUTH)["error"]["code"] == -32001
    steal = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "s1",
                "role": "ROLE_USER",
                "contextId": task.context_id,
                "parts": [{"text": "what did they say?"}],
            }
        },
    }
    out = _rpc(srv, "calc", steal, headers=OTHER_AUTH)
    # contextIds are per key (issue #24): the other key's message starts a context of its own
    assert "error" not in out, out
    assert f'"env-2~{task.context_id}"' in json.dumps(out["result"])
    other = await _client(srv, "calc", OTHER_AUTH)
    listed = await other.list_tasks(ListTasksRequest())
    assert task.id not in [t.id for t in listed.tasks]
    # the owner still has it, unchanged
    mine = await client.get_task(GetTaskRequest(id=task.id))
    assert mine.status.state == TaskState.TASK_STATE_COMPLETED


@session_loop
async def test_a_client_that_drops_the_stream_loses_nothing(served: tuple[Server, Path]) -> None:
    srv, tmp = served
    body = {
        "jsonrpc": "2.0",
        "id": 8,
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "messageId": "d1",
                "role": "ROLE_USER",
                "parts": [{"text": "wait for go-2.txt"}],
            }
        },
    }
    headers = {**AUTH, **V1, "accept": "text/event-stream"}
    task_id = ""
    url = f"{srv.url}/agents/waiter/a2a"
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", url, json=body, headers=headers) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"task"' in line:
                import json

                task_id = json.loads(line[5:])["result"]["task"]["id"]
                break  # hang up mid-stream
    assert task_id
    (tmp / "go-2.txt").write_text("after the hang-up")
    waiter = await _client(srv, "waiter")
    task = await _wait_state(waiter, task_id, TaskState.TASK_STATE_COMPLETED)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert _text(task.artifacts[0].parts) == "released: after the hang-up"


def test_the_rest_binding_sends_and_gets(served: tuple[Server, Path]) -> None:
    srv = served[0]
    base = f"{srv.url}/agents/calc/a2a/rest"
    sent = httpx.post(
        f"{base}/message:send",
        headers={**AUTH, **V1},
        json={"message": {"messageId": "r1", "role": "ROLE_USER", "parts": [{"text": "add 7 8"}]}},
        timeout=30,
    )
    assert sent.status_code == 200, sent.text
    task = sent.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    got = httpx.get(f"{base}/tasks/{task['id']}", headers={**AUTH, **V1}, timeout=30).json()
    assert got["artifacts"][0]["parts"][0]["text"] == "The sum is 15."


# -- A2A 1.0's MUSTs for what Loom declares ----------------------------------------------------
def test_the_json_rpc_url_answers_with_a_trailing_slash(served: tuple[Server, Path]) -> None:
    srv = served[0]
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "SendMessage",
        "params": {"message": {"messageId": "sl1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    r = httpx.post(f"{srv.url}/agents/calc/a2a/", json=body, headers={**AUTH, **V1}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.headers, r.text)
    assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@session_loop
async def test_the_card_can_be_cached_and_revalidated(served: tuple[Server, Path]) -> None:
    srv = served[0]
    url = f"{srv.url}/agents/calc/.well-known/agent-card.json"
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        first = await http.get(url)
        etag = first.headers.get("etag")
        assert etag and etag.startswith('"'), first.headers
        cache = first.headers.get("cache-control", "")
        assert "max-age=" in cache and "private" in cache  # the card needs a key here
        assert (await http.get(url)).headers["etag"] == etag  # the same card, the same tag
        unchanged = await http.get(url, headers={"If-None-Match": etag})
        assert unchanged.status_code == 304 and unchanged.content == b""
        assert unchanged.headers["etag"] == etag
        other = await http.get(url, headers={"If-None-Match": '"something-else"'})
        assert other.status_code == 200 and other.json()["name"] == "calc"
        ops = await http.get(f"{srv.url}/agents/ops/.well-known/agent-card.json")
        assert ops.headers["etag"] != etag
    # the SDK's card resolver still reads it
    from a2a.client import A2ACardResolver

    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        resolver = A2ACardResolver(http, f"{srv.url}/agents/calc")
        assert (await resolver.get_agent_card()).name == "calc"


def test_a_request_without_a2a_version_is_told_which_to_send(served: tuple[Server, Path]) -> None:
    srv = served[0]
    body = {
        "jsonrpc": "2.0",
        "id": 10,
        "method": "SendMessage",
        "params": {"message": {"messageId": "v1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    url = f"{srv.url}/agents/calc/a2a"
    bare = httpx.post(url, json=body, headers=AUTH, timeout=30).json()
    assert bare["error"]["code"] == -32009, bare
    assert "send the header 'A2A-Version: 1.0'" in bare["error"]["message"]
    rest = httpx.post(
        f"{url}/rest/message:send", json={"message": body["params"]["message"]}, headers=AUTH
    )
    assert rest.status_code == 400
    assert rest.json()["error"]["status"] == "FAILED_PRECONDITION"
    assert "send the header 'A2A-Version: 1.0'" in rest.json()["error"]["message"]
    # the specification lets a client name the version as a query parameter instead
    by_query = httpx.post(f"{url}?A2A-Version=1.0", json=body, headers=AUTH, timeout=30).json()
    assert by_query["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", by_query
    # a 0.3 client (no header: 0.3 by definition) keeps working with 0.3's method names
    old = {
        "jsonrpc": "2.0",
        "id": 11,
        "method": "message/send",
        "params": {
            "message": {
                "messageId": "v03",
                "role": "user",
                "kind": "message",
                "parts": [{"kind": "text", "text": "add 1 2"}],
            }
        },
    }
    legacy = httpx.post(url, json=old, headers=AUTH, timeout=30).json()
    assert legacy["result"]["status"]["state"] == "completed", legacy


@session_loop
async def test_a_task_reply_takes_the_tasks_context_and_refuses_another(
    client: Any, served: tuple[Server, Path]
) -> None:
    task, _ = await _final(client, _message("add 1 2"))
    other, _ = await _final(client, _message("add 3 4"))
    wrong = _rpc(
        served[0],
        "calc",
        {
            "jsonrpc": "2.0",
            "id": 12,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "ctx1",
                    "role": "ROLE_USER",
                    "taskId": task.id,
                    "contextId": other.context_id,
                    "parts": [{"text": "hi"}],
                }
            },
        },
    )
    assert wrong["error"]["code"] == -32602, wrong
    assert "is not the context of task" in wrong["error"]["message"]
