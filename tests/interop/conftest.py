"""A real ``loom serve`` for the interop tests (MCP, AG-UI), one whose agents take and give
media, and the npm clients' folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.conftest import Server, start_server, stop_server

JS = Path(__file__).parent / "js"

AGENTS = r'''
"""Agents for the interop tests (their models are scripted; the protocol path is real)."""

import asyncio

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


def calc(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"The sum is {last.content}."
    numbers = [int(w) for w in last.content.split() if w.lstrip("-").isdigit()]
    if len(numbers) >= 2:
        return ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": numbers[0],
                                                                          "b": numbers[1]})])
    return f"echo: {last.content}"


def ops(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


async def slow(messages, tools):
    words = messages[-1].content.split()
    seconds = float(words[-1]) if words and words[-1].replace(".", "", 1).isdigit() else 0.0
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}"


def painter(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"You picked {last.content}."
    if any(t.name == "pick_color" for t in tools):
        return ModelResponse(tool_calls=[ToolCall(name="pick_color",
                                                  arguments={"prompt": "your favourite?"})])
    return "I have no way to ask for a color."


registry = AgentRegistry([
    Agent(name="calc", instructions="You add numbers.\nMore text.", model=FunctionModel(calc),
          tools=[add]),
    Agent(name="ops", instructions="You deploy.", model=FunctionModel(ops), tools=[deploy],
          permissions={"ask": ["deploy"]}),
    Agent(name="slow", instructions="You wait.", model=FunctionModel(slow)),
    Agent(name="painter", instructions="You ask the user for colors.",
          model=FunctionModel(painter)),
])
'''


@pytest.fixture(scope="session")
def interop_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``loom serve`` with the interop agents for the whole test session."""
    srv = start_server(
        tmp_path_factory.mktemp("interop"),
        app="interop_agents:registry",
        source=AGENTS,
        env={"LOOM_MCP_IDLE_TIMEOUT": "600"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def query_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``loom serve`` whose ``reader`` agent asks the client for a file (a server query)."""
    srv = start_server(tmp_path_factory.mktemp("interop-query"), app="server_agents:query_registry")
    yield srv
    stop_server(srv)


MEDIA_KEY = "media-key-000001"


@pytest.fixture(scope="session")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``loom serve`` of ``a2a_agents.py`` (``looker``: media in, media out) on the default
    durable store (SQLite keeps media once: ``BlobStore``)."""
    srv = start_server(
        tmp_path_factory.mktemp("media"),
        app="a2a_agents:registry",
        source=(Path(__file__).parent / "a2a_agents.py").read_text(),
        env={"LOOM_API_KEYS": MEDIA_KEY},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def js() -> Path:
    """tests/interop/js with its npm packages installed (``./scripts/test`` runs npm ci)."""
    if shutil.which("node") is None or not (JS / "node_modules").is_dir():
        pytest.skip(
            "node or tests/interop/js/node_modules is missing: npm ci --prefix tests/interop/js"
        )
    return JS
