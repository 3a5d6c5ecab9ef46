"""A run a guardrail stopped, over the server: a clear status on every protocol it surfaces on."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("fastapi")
from tests.server.conftest import Server, start_server, stop_server

AGENTS = r"""
from loom import Agent
from loom.guardrails import Decision, input_guardrail
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@input_guardrail
def no_refunds(text, ctx):
    return Decision.trip("refunds go to a human") if "refund" in text else None


GUARDED = Agent(name="guarded", model=FunctionModel(lambda m, t: "answer"),
                guardrails=[no_refunds])
registry = AgentRegistry([GUARDED])
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("guard"), source=AGENTS)
    yield srv
    stop_server(srv)


async def test_a_tripped_run_over_the_langgraph_api(guarded: Server) -> None:
    async with httpx.AsyncClient(base_url=guarded.url, timeout=30) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        body = {
            "assistant_id": "guarded",
            "input": {"messages": [{"role": "user", "content": "I want a refund"}]},
        }
        run = (await http.post(f"/threads/{tid}/runs", json=body)).json()
        await http.get(f"/threads/{tid}/runs/{run['run_id']}/join")
        got = (await http.get(f"/threads/{tid}/runs/{run['run_id']}")).json()
        assert got["status"] == "error" and got["stop_reason"] == "guardrail"
        assert "no_refunds" in got["error"] and "refunds go to a human" in got["error"]
        ok = (
            await http.post(
                f"/threads/{tid}/runs",
                json={**body, "input": {"messages": [{"role": "user", "content": "hello"}]}},
            )
        ).json()
        await http.get(f"/threads/{tid}/runs/{ok['run_id']}/join")
        got = (await http.get(f"/threads/{tid}/runs/{ok['run_id']}")).json()
        assert got["status"] == "success" and got["stop_reason"] == "completed"


async def test_a_tripped_run_over_the_openai_api(guarded: Server) -> None:
    async with httpx.AsyncClient(base_url=guarded.url, timeout=30) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": "guarded", "messages": [{"role": "user", "content": "a refund please"}]},
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "content_filter"
        assert r.json()["loom"]["stop_reason"] == "guardrail"
