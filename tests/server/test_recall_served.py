"""Recall end to end on a real ``loom serve`` with two API keys (issue #29): what alice's agent
saved in one thread is in the model's context in her next thread, never in bob's, and the items
are alice's in the store (``client.store`` sees them under her namespace)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.server.conftest import Server, start_server, stop_server

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402

ALICE, BOB = "alice-key-0001", "bob-key-0002"

pytestmark = pytest.mark.timeout(120)

AGENTS = r'''
"""An agent that saves ``SAVE: ...`` messages as memories and otherwise answers with the
recalled memories its context holds."""

from loom import Agent, ModelResponse, ToolCall
from loom.memory import MemoryConfig, RecallConfig
from loom.memory.assembly import RECALL_HEADER
from loom.server import AgentRegistry
from loom.testing import FunctionModel


def keeper(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return "saved"
    if last.content.startswith("SAVE: "):
        text = last.content.removeprefix("SAVE: ")
        return ModelResponse(tool_calls=[ToolCall(name="save_memory", arguments={"text": text})])
    kernel = [m.content for m in messages if m.role == "system" and RECALL_HEADER in m.content]
    return "recalled: " + (kernel[0].split(RECALL_HEADER, 1)[1].strip() if kernel else "nothing")


registry = AgentRegistry([
    Agent(name="keeper", instructions="You keep notes.", model=FunctionModel(keeper),
          memory=MemoryConfig(memory_file=None, store_tools=True, recall=RecallConfig())),
])
'''


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("recall_served")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n- {{name: bob, key: {BOB}}}\n"
    )
    srv = start_server(
        tmp, "--keys", str(tmp / "keys.yaml"), app="recall_agents:registry", source=AGENTS
    )
    yield srv
    stop_server(srv)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def answer(values: Any) -> str:
    assert isinstance(values, dict)
    return str(values["messages"][-1]["content"])


async def test_alices_memory_reaches_her_next_thread_and_never_bobs(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    bob = get_client(url=keyed.url, api_key=BOB)
    first = (await alice.threads.create())["thread_id"]
    saved = await alice.runs.wait(first, "keeper", input=human("SAVE: my dog is called Pixel"))
    assert answer(saved) == "saved"

    second = (await alice.threads.create())["thread_id"]
    asked = await alice.runs.wait(second, "keeper", input=human("what is my dog called?"))
    assert answer(asked) == "recalled: - my dog is called Pixel"

    theirs = (await bob.threads.create())["thread_id"]
    asked = await bob.runs.wait(theirs, "keeper", input=human("what is my dog called?"))
    assert answer(asked) == "recalled: nothing"

    mine = await alice.store.search_items(["memories", "alice"], query="dog")
    assert [i["value"]["text"] for i in mine["items"]] == ["my dog is called Pixel"]
    assert (await bob.store.search_items(["memories"], query="dog"))["items"] == []
