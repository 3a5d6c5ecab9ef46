"""``loom.tools.a2a_agent``: a Loom agent on one real ``loom serve`` uses an agent of a second
real ``loom serve`` as a tool over A2A (the card read once, the remote context kept per Loom
session, a call past its timeout cancels the remote task)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

pytest.importorskip("a2a.client")

from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import ListTasksRequest, TaskState

from loom.errors import ConfigurationError
from loom.tools import a2a_agent

AGENTS = (Path(__file__).parent / "a2a_agents.py").read_text()
KEY = "remote-key-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}

session_loop = pytest.mark.asyncio(loop_scope="session")  # the fixtures' loop


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path]]:
    remote_dir = tmp_path_factory.mktemp("a2a_remote")
    remote = start_server(
        remote_dir, app="a2a_agents:registry", source=AGENTS, env={"LOOM_API_KEYS": KEY}
    )
    try:
        env = {
            "REMOTE_KEY": KEY,
            "REMOTE_CALC": f"{remote.url}/agents/calc",
            "REMOTE_WAITER": f"{remote.url}/agents/waiter",
        }
        local = start_server(
            tmp_path_factory.mktemp("a2a_local"),
            app="a2a_agents:boss_registry",
            source=AGENTS,
            env=env,
        )
    except BaseException:
        stop_server(remote)
        raise
    yield local, remote, remote_dir
    stop_server(local)
    stop_server(remote)


@pytest.fixture
async def remote_client(servers: tuple[Server, Server, Path]) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        yield lambda agent: create_client(
            f"{servers[1].url}/agents/{agent}",
            ClientConfig(httpx_client=http),
            resolver_http_kwargs={"headers": AUTH},
        )


def _weave(server: Server, message: str, session_id: str | None = None) -> dict[str, Any]:
    body = {"agent": "boss", "message": message, "session_id": session_id}
    r = httpx.post(f"{server.url}/v1/weave", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@session_loop
async def test_a_remote_agent_answers_as_a_tool_and_keeps_its_context(
    servers: tuple[Server, Server, Path], remote_client: Any
) -> None:
    local = servers[0]
    first = _weave(local, "add 2 3")
    assert first["output"] == "remote says: The sum is 5."
    call = first["tool_calls"][0]
    assert call["name"] == "calc" and call["input"] == {"message": "add 2 3"}
    second = _weave(local, "hello there", session_id=first["session_id"])
    assert second["output"] == "remote says: echo: hello there"
    calc = await remote_client("calc")
    tasks = (await calc.list_tasks(ListTasksRequest())).tasks
    assert len(tasks) == 2
    assert len({t.context_id for t in tasks}) == 1  # one remote conversation per Loom session
    # another Loom session starts another remote conversation
    _weave(local, "add 1 1")
    tasks = (await calc.list_tasks(ListTasksRequest())).tasks
    assert len({t.context_id for t in tasks}) == 2


@session_loop
async def test_a_call_past_its_timeout_cancels_the_remote_task(
    servers: tuple[Server, Server, Path], remote_client: Any
) -> None:
    local, _, remote_dir = servers
    reply = _weave(local, "wait for never-remote.txt")
    call = reply["tool_calls"][0]
    assert call["name"] == "waiter" and call["success"] is False
    assert call["error_code"] == "timeout"
    waiter = await remote_client("waiter")
    # Loom answers the timeout at once and the cancelled tool cancels the remote task in the
    # background (the executor detaches a timed-out tool), so wait for that outcome
    deadline = time.monotonic() + 20
    while True:
        tasks = (await waiter.list_tasks(ListTasksRequest())).tasks
        if tasks[0].status.state != TaskState.TASK_STATE_WORKING or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert [t.status.state for t in tasks] == [TaskState.TASK_STATE_CANCELED]
    assert tasks[0].metadata["loomStopReason"] == "cancelled"
    (remote_dir / "never-remote.txt").write_text("late")


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="url must be http"):
        a2a_agent("ftp://example.com/agent")
    with pytest.raises(ConfigurationError, match="timeout must be > 0"):
        a2a_agent("http://127.0.0.1:1/agents/x", timeout=0)
    with pytest.raises(ConfigurationError, match="may use only letters"):
        a2a_agent("http://127.0.0.1:1/agents/x", name="bad name")
