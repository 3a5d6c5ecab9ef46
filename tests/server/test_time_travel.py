"""Time travel on the run API against a real ``loom serve`` (issue 28): LangGraph checkpoints
(``threads.get_state``, ``get_state(checkpoint_id)``, ``update_state``, ``get_history``,
``threads.copy``, runs from a checkpoint, ``multitask_strategy="rollback"``) driven by the
official ``langgraph-sdk``, and branching with ``previous_response_id`` driven by the
``openai`` SDK. The servers keep their sessions on the default durable store (SQLite)."""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402
from langgraph_sdk.errors import LangGraphError  # noqa: E402


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def refusal(call: Awaitable[Any]) -> tuple[int, str]:
    """The status and body of a request the server refuses (the SDK raises its typed errors,
    or httpx's from ``runs.wait``)."""
    with pytest.raises((LangGraphError, httpx.HTTPStatusError)) as refused:
        await call
    response = getattr(refused.value, "response", None)
    assert response is not None, refused.value
    return int(response.status_code), str(response.text)


def texts(values: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in values["messages"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("travel"), app="server_agents:slow_registry")
    yield srv
    stop_server(srv)


async def _two_runs(client: Any) -> str:
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "calc", input=human("hello"))
    await client.runs.wait(tid, "calc", input=human("add 40 2"))
    return str(tid)


async def test_state_and_history_name_real_checkpoints_with_parents(server: Server) -> None:
    client = get_client(url=server.url)
    tid = await _two_runs(client)
    state = await client.threads.get_state(tid)
    history = await client.threads.get_history(tid)
    assert [texts(h["values"])[-1] for h in history] == ["The sum is 42.", "echo: hello"]
    newest, oldest = history
    # a checkpoint is a stored event: "<run_id>.<sequence>", the run's id in its metadata
    assert state["checkpoint"] == newest["checkpoint"]
    for h in history:
        run_id, _, seq = h["checkpoint"]["checkpoint_id"].rpartition(".")
        assert run_id == h["metadata"]["run_id"] and seq.isdigit()
    assert newest["parent_checkpoint"]["checkpoint_id"] == oldest["checkpoint"]["checkpoint_id"]
    assert state["parent_checkpoint"] == newest["parent_checkpoint"]
    assert oldest["parent_checkpoint"] is None
    # the state at a checkpoint is the journal replayed to it
    then = await client.threads.get_state(tid, checkpoint_id=oldest["checkpoint"]["checkpoint_id"])
    assert texts(then["values"]) == ["hello", "echo: hello"]
    assert then["checkpoint"] == oldest["checkpoint"]
    as_object = await client.threads.get_state(tid, checkpoint=oldest["checkpoint"])
    assert as_object["values"] == then["values"]


async def test_a_checkpoint_derives_from_a_streamed_event_id(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    run_id, ids = "", []
    async for part in client.runs.stream(
        tid, "calc", input=human("add 2 3"), stream_mode="updates"
    ):
        if part.event == "metadata":
            run_id = part.data["run_id"]
        elif part.event == "updates" and "agent" in part.data:
            ids.append((part.id, part.data["agent"]["messages"][0]))
    (call_id, call), (answer_id, answer) = ids
    assert call["tool_calls"] and answer["content"] == "The sum is 5."
    at_answer = f"{run_id}.{answer_id.partition('.')[0]}"
    state = await client.threads.get_state(tid, checkpoint_id=at_answer)
    assert texts(state["values"])[-1] == "The sum is 5."
    # the point after the model asked for a call and before its result lies inside a step
    inside = f"{run_id}.{call_id.partition('.')[0]}"
    stepping = await client.threads.get_state(tid, checkpoint_id=inside)
    assert stepping["next"] == ["tools"]
    status, said = await refusal(
        client.runs.wait(tid, "calc", input=human("again"), checkpoint_id=inside)
    )
    assert status == 422 and "BranchError" in said and "lies inside a step" in said
    assert texts((await client.threads.get_state(tid))["values"])[-1] == "The sum is 5."
    # the latest state's checkpoint rewinds nothing: the run goes on from it
    on = await client.runs.wait(tid, "calc", input=human("go on"), checkpoint_id=at_answer)
    assert texts(on)[-3:] == ["The sum is 5.", "go on", "echo: go on"]
    assert len(await client.threads.get_history(tid)) == 2


async def test_unknown_and_malformed_checkpoints_are_typed_errors(server: Server) -> None:
    client = get_client(url=server.url)
    tid = await _two_runs(client)
    status, said = await refusal(client.threads.get_state(tid, checkpoint_id="not-a-checkpoint"))
    assert status == 422 and "'<run_id>.<sequence>'" in said
    status, said = await refusal(client.threads.get_state(tid, checkpoint_id="run_nope.3"))
    assert status == 404 and "'<run_id>.<sequence>'" in said
    run = client.runs.wait(tid, "calc", input=human("x"), checkpoint_id="run_nope.3")
    assert (await refusal(run))[0] == 404
    assert len(await client.threads.get_history(tid)) == 2  # nothing changed


async def test_a_run_from_a_checkpoint_branches_and_keeps_the_old_branch(server: Server) -> None:
    client = get_client(url=server.url)
    tid = await _two_runs(client)
    first = (await client.threads.get_history(tid))[-1]["checkpoint"]["checkpoint_id"]
    before = await client.threads.get_history(tid)
    result = await client.runs.wait(tid, "calc", input=human("add 1 1"), checkpoint_id=first)
    assert texts(result) == ["hello", "echo: hello", "add 1 1", "", "2", "The sum is 2."]
    state = await client.threads.get_state(tid)
    assert texts(state["values"]) == texts(result)
    history = await client.threads.get_history(tid, limit=100)
    ids = [h["checkpoint"]["checkpoint_id"] for h in history]
    # the abandoned branch's checkpoints stay listed, and still replay to what they were
    assert {b["checkpoint"]["checkpoint_id"] for b in before} <= set(ids)
    old = await client.threads.get_state(
        tid, checkpoint_id=before[0]["checkpoint"]["checkpoint_id"]
    )
    assert texts(old["values"])[-1] == "The sum is 42."
    # the new branch's first checkpoint goes back to the one it started from
    branch = history[1]
    assert branch["parent_checkpoint"]["checkpoint_id"] == first
    assert texts(branch["values"]) == ["hello", "echo: hello"]
    # LangGraph's checkpoint object names the same point
    again = await client.runs.wait(
        tid, "calc", input=human("once more"), checkpoint=history[-1]["checkpoint"]
    )
    assert texts(again) == ["hello", "echo: hello", "once more", "echo: once more"]


async def test_update_state_rewinds_then_adds_a_user_message_a_run_answers(
    server: Server,
) -> None:
    client = get_client(url=server.url)
    tid = await _two_runs(client)
    first = (await client.threads.get_history(tid))[-1]["checkpoint"]["checkpoint_id"]
    updated = await client.threads.update_state(
        tid, {"messages": [{"role": "user", "content": "hello again"}]}, checkpoint_id=first
    )
    state = await client.threads.get_state(tid)
    assert updated["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert texts(state["values"]) == ["hello", "echo: hello", "hello again"]
    assert state["next"] == ["agent"] and state["metadata"]["source"] == "update"
    answered = await client.runs.wait(tid, "calc", input=None)
    assert texts(answered) == ["hello", "echo: hello", "hello again", "echo: hello again"]
    tool = {"role": "tool", "content": "x", "tool_call_id": "c"}
    status, said = await refusal(client.threads.update_state(tid, {"messages": [tool]}))
    assert status == 422 and "tool calls and results come from runs" in said


async def test_copy_makes_a_new_thread_that_shares_the_history(server: Server) -> None:
    client = get_client(url=server.url)
    tid = await _two_runs(client)
    await client.threads.update(tid, metadata={"owner": "me"})
    copy = await client.threads.copy(tid)
    assert copy["thread_id"] != tid and copy["metadata"]["owner"] == "me"
    assert texts(copy["values"]) == texts((await client.threads.get_state(tid))["values"])
    await client.runs.wait(copy["thread_id"], "calc", input=human("only in the copy"))
    assert "only in the copy" not in texts((await client.threads.get_state(tid))["values"])
    assert texts((await client.threads.get_state(copy["thread_id"]))["values"])[-1] == (
        "echo: only in the copy"
    )
    assert (await refusal(client.threads.copy("no-such-thread")))[0] == 404


async def test_rollback_interrupts_and_rewinds_the_running_run(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "slow", input=human("sleep 0"))
    long = await client.runs.create(tid, "slow", input=human("sleep 60"))
    async for part in client.runs.join_stream(tid, long["run_id"], stream_mode="values"):
        if part.event == "values" and "sleep 60" in texts(part.data):
            break  # its message is committed: the run is in flight
    # a run from a checkpoint waits for no run: 409 unless its strategy interrupts
    busy = client.runs.wait(tid, "slow", input=human("x"), checkpoint_id=f"{long['run_id']}.0")
    assert (await refusal(busy))[0] == 409
    assert (await refusal(client.threads.update_state(tid, {"messages": ["x"]})))[0] == 409
    result = await client.runs.wait(
        tid, "slow", input=human("sleep 0"), multitask_strategy="rollback"
    )
    assert texts(result) == ["sleep 0", "slept 0", "sleep 0", "slept 0"]
    assert (await client.runs.get(tid, long["run_id"]))["status"] == "interrupted"
    # its turn left the transcript and stays in the journal: its checkpoint still replays
    history = await client.threads.get_history(tid, limit=100)
    rolled = [h for h in history if h["metadata"]["run_id"] == long["run_id"]]
    assert rolled and "sleep 60" in texts(rolled[0]["values"])


async def test_previous_response_id_of_an_older_response_forks(server: Server) -> None:
    import openai
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed")
    first = await client.responses.create(model="calc", input="hello")
    second = await client.responses.create(
        model="calc", input="add 1 2", previous_response_id=first.id
    )
    assert second.output_text == "The sum is 3."
    # two continuations of the same earlier response: each sees only the shared prefix
    one = await client.responses.create(
        model="calc", input="branch one", previous_response_id=first.id
    )
    two = await client.responses.create(
        model="calc", input="branch two", previous_response_id=first.id
    )
    assert one.output_text == "echo: branch one" and two.output_text == "echo: branch two"
    http = get_client(url=server.url)

    async def transcript(response_id: str) -> list[str]:
        return texts((await http.threads.get_state(session_of(response_id)))["values"])

    prefix = ["hello", "echo: hello"]
    assert await transcript(second.id) == [*prefix, "add 1 2", "", "3", "The sum is 3."]
    assert await transcript(one.id) == [*prefix, "branch one", "echo: branch one"]
    assert await transcript(two.id) == [*prefix, "branch two", "echo: branch two"]
    assert len({session_of(r.id) for r in (first, one, two)}) == 3  # the source is unchanged
    # streamed, the same: a fork when the response named is not the latest
    streamed = await client.responses.create(
        model="calc", input="branch three", previous_response_id=first.id, stream=True
    )
    done = [e.response for e in [e async for e in streamed] if e.type == "response.completed"]
    assert done and done[0].output_text == "echo: branch three"
    assert await transcript(done[0].id) == [*prefix, "branch three", "echo: branch three"]
    unknown = f"resp_{first.id[5:].partition('_')[0]}_run_missing"  # its session, no such run
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="calc", input="x", previous_response_id=unknown)
    # naming the latest response continues its session in place
    three = await client.responses.create(model="calc", input="on", previous_response_id=two.id)
    assert session_of(three.id) == session_of(two.id)
    assert (await transcript(three.id))[-2:] == ["on", "echo: on"]
    await client.close()


def session_of(response_id: str) -> str:
    """The session a Loom response id names (``resp_<hex of the session id>_<run id>``)."""
    return bytes.fromhex(response_id[5:].partition("_")[0]).decode()


ALICE, BOB = "alice-key-" + "a" * 24, "bob-key-" + "b" * 24


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("travel_keys")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n- {{name: bob, key: {BOB}}}\n"
    )
    srv = start_server(tmp, "--keys", str(tmp / "keys.yaml"))
    yield srv
    stop_server(srv)


async def test_time_travel_goes_through_the_ownership_check(keyed: Server) -> None:
    alice = get_client(url=keyed.url, headers={"Authorization": f"Bearer {ALICE}"})
    bob = get_client(url=keyed.url, headers={"Authorization": f"Bearer {BOB}"})
    tid = await _two_runs(alice)
    first = (await alice.threads.get_history(tid))[-1]["checkpoint"]["checkpoint_id"]
    refused = [
        bob.threads.get_state(tid),
        bob.threads.get_state(tid, checkpoint_id=first),
        bob.threads.get_history(tid),
        bob.threads.update_state(tid, {"messages": ["hi"]}, checkpoint_id=first),
        bob.threads.copy(tid),
        bob.runs.wait(tid, "calc", input=human("x"), checkpoint_id=first),
    ]
    for call in refused:  # another key's thread and checkpoints do not exist for bob
        assert (await refusal(call))[0] == 404
    assert len(await alice.threads.get_history(tid)) == 2  # nothing changed
    copy = await alice.threads.copy(tid)
    assert texts((await alice.threads.get_state(copy["thread_id"]))["values"])[-1] == (
        "The sum is 42."
    )
    assert (await refusal(bob.threads.get_state(copy["thread_id"])))[0] == 404
