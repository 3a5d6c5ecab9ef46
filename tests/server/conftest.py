"""A real ``loom serve`` process on a loopback port, shared by the server tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom

# The agents the test server serves, built on loom.testing models (no LLM needed).
AGENTS = r'''
"""Agents for the server tests."""

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
    words = last.content.split()
    numbers = [int(w) for w in words if w.lstrip("-").isdigit()]
    if len(numbers) >= 2:
        call = ToolCall(name="add", arguments={"a": numbers[0], "b": numbers[1]})
        return ModelResponse(tool_calls=[call])
    return f"echo: {last.content}"


def ops(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


async def slow(messages, tools):
    import asyncio

    words = messages[-1].content.split()
    seconds = float(words[-1]) if words and words[-1].replace(".", "", 1).isdigit() else 0.0
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}"


CALC = Agent(name="calc", instructions="You add numbers.", model=FunctionModel(calc), tools=[add])
OPS = Agent(name="ops", instructions="You deploy.", model=FunctionModel(ops), tools=[deploy],
            permissions={"ask": ["deploy"]})
registry = AgentRegistry([CALC, OPS])

# with an agent that blocks: "sleep 2" answers after two seconds (security and shutdown tests)
slow_registry = AgentRegistry([CALC, OPS, Agent(name="slow", instructions="You wait.",
                                                model=FunctionModel(slow))])


def reader(messages, tools):
    last = messages[-1]
    if last.metadata.get("server_query"):
        return "The file begins with: " + last.content.splitlines()[1]
    return "I need to read src/main.rs first."


# with an agent that asks the client for a file (seed 003's server queries)
FILE_QUERY = {"file_read": r"I need to read (?P<path>\S+)"}
query_registry = AgentRegistry([CALC, Agent(name="reader", model=FunctionModel(reader),
                                            query_detector=FILE_QUERY)])
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    port: int
    db: Path
    process: subprocess.Popen[bytes]


def start_server(
    tmp: Path,
    *extra: str,
    app: str = "server_agents:registry",
    env: dict[str, str] | None = None,
    source: str = AGENTS,
    db: Path | None = None,
    store: str | None = None,
) -> Server:
    """Start ``loom serve --app APP`` with ``source`` written as APP's module in ``tmp``, on a
    free port and the SQLite file ``db`` (default ``tmp/server.db``; reuse it to restart), or
    the store ``store`` names (a postgres:// URL)."""
    (tmp / f"{app.partition(':')[0]}.py").write_text(source)
    port = free_port()
    db = db or tmp / "server.db"
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([SRC, str(tmp)]))
    log = (tmp / "server.log").open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loom",
            "serve",
            "--app",
            app,
            "--port",
            str(port),
            "--store",
            store or str(db),
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    import httpx

    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((tmp / "server.log").read_text())
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return Server(url, port, db, process)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("the server did not become ready in 30 s")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``loom serve`` process for the whole test session."""
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    stop_server(srv)
