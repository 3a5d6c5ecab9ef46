"""Extraction beside a real ``loom serve`` with API keys: a key's turns become memories in
its own namespace, owned by it, which its ``langgraph-sdk`` ``client.store`` finds and no other
key sees."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.server.conftest import Server, start_server, stop_server

from loom import Message
from loom.memory.extraction import ExtractionSettings, extract_memories
from loom.store import SQLiteStore
from loom.testing import FunctionModel

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402

ALICE, BOB, ROOT = "alice-key-0001", "bob-key-0002", "root-key-0004"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("extract_server")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(tmp, "--keys", str(tmp / "keys.yaml"))
    yield srv
    stop_server(srv)


def facts(messages: list[Message], tools: Any) -> str:
    said = messages[-1].content.split("\n")[1]
    return json.dumps({"memories": [{"text": "The user said: " + said, "key": "said"}]})


async def test_a_keys_turns_become_its_own_memories(keyed: Server, tmp_path: Path) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    bob = get_client(url=keyed.url, api_key=BOB)
    root = get_client(url=keyed.url, api_key=ROOT)
    thread = await alice.threads.create()
    said = {"messages": [{"role": "user", "content": "my dog is called Rex"}]}
    run = await alice.runs.create(thread["thread_id"], "calc", input=said)
    await alice.runs.join(thread["thread_id"], run["run_id"])

    store = SQLiteStore(keyed.db)  # beside the running server, as the scheduler's job would be
    try:
        report = await extract_memories(store, ExtractionSettings(model=FunctionModel(facts)))
    finally:
        await store.close()
    assert (report.turns, report.memories, report.errors) == (1, 1, [])

    found = await alice.store.search_items(["memories", "alice"], query="dog")
    [item] = found["items"]
    assert item["value"]["text"] == "The user said: my dog is called Rex"
    assert item["value"]["source"]["turn"] == run["run_id"]
    assert item["value"]["key"] == "said"
    assert (await bob.store.search_items(["memories"]))["items"] == []
    assert len((await root.store.search_items(["memories"]))["items"]) == 1


def test_a_bad_extraction_setting_stops_the_server_naming_the_variable(tmp_path: Path) -> None:
    """A typo in LOOM_MEMORY_EXTRACT_* must not start a server whose schedules are all silently
    off (build_scheduler's ConfigurationError reads as "a store without schedules")."""
    with pytest.raises(RuntimeError, match="LOOM_MEMORY_EXTRACT_EVERY"):
        start_server(
            tmp_path,
            env={
                "LOOM_MEMORY_EXTRACT": "openai:gpt-4o-mini",
                "LOOM_MEMORY_EXTRACT_EVERY": "hourly",
            },
        )
