"""A run stopped by loop detection (``stop_reason="loop"``, loom.loop_detection) as served
clients see it, over a real ``loom serve``: the official OpenAI client gets a failure naming
the repeated call; the ``langgraph-sdk`` client sees the run's status ``error``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.server.conftest import Server, start_server, stop_server

openai = pytest.importorskip("openai")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

LOOPERS = r'''
"""An agent stuck on one call, for the loop-detection surface tests."""

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def stuck(messages, tools):
    return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 1, "b": 1})])


registry = AgentRegistry([
    Agent(name="looper", model=FunctionModel(stuck), tools=[add], max_iterations=50,
          loop_detection={"max_repeats": 3}),
])
'''


@pytest.fixture(scope="module")
def loop_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("loops"), app="server_loops:registry", source=LOOPERS
    )
    yield srv
    stop_server(srv)


def _client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


async def test_openai_chat_and_responses_fail_naming_the_loop(loop_server: Server) -> None:
    client = _client(loop_server)
    with pytest.raises(openai.APIStatusError) as chat:
        await client.chat.completions.create(
            model="looper", messages=[{"role": "user", "content": "add 1 and 1"}]
        )
    assert chat.value.status_code == 502
    said = str(chat.value)
    assert "ended with loop" in said and "add" in said and "3 times" in said
    with pytest.raises(openai.APIStatusError) as responses:
        await client.responses.create(model="looper", input="add 1 and 1")
    assert responses.value.status_code == 502 and "ended with loop" in str(responses.value)


async def test_openai_chat_stream_ends_with_the_loop_error(loop_server: Server) -> None:
    client = _client(loop_server)
    stream = await client.chat.completions.create(
        model="looper", messages=[{"role": "user", "content": "add 1 and 1"}], stream=True
    )
    with pytest.raises(openai.APIError, match="ended with loop"):
        async for _ in stream:
            pass


async def test_langgraph_run_status_is_error_with_the_loop_named(loop_server: Server) -> None:
    client = langgraph_sdk.get_client(url=loop_server.url)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        tid, "looper", input={"messages": [{"role": "user", "content": "add 1 and 1"}]}
    )
    await client.runs.join(tid, run["run_id"])
    got = await client.runs.get(tid, run["run_id"])
    assert got["status"] == "error", got
    assert got.get("stop_reason") == "loop" and "add" in str(got.get("error")), got
