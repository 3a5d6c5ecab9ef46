"""The Agent Protocol (0.1.6) as its own OpenAPI document specifies it, against a real
``loom serve``: each response validates (``jsonschema``, formats checked: ids the protocol types
as UUIDs are UUIDs) against the schema the document gives for that operation and status.

``specs/agent_protocol_openapi.json`` is the protocol's ``openapi.json`` (langchain-ai/
agent-protocol at d9fd23d, MIT licensed), kept here so that the test runs offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server

jsonschema = pytest.importorskip("jsonschema")

SPEC = json.loads((Path(__file__).parent / "specs" / "agent_protocol_openapi.json").read_text())


def _check(response: httpx.Response, path: str, method: str) -> Any:
    """``response``'s JSON, validated against what the protocol documents for its status."""
    documented = SPEC["paths"][path][method]["responses"]
    assert str(response.status_code) in documented, (response.status_code, response.text)
    schema = documented[str(response.status_code)]["content"]["application/json"]["schema"]
    body = response.json()
    validator = jsonschema.Draft202012Validator(
        {**schema, "components": SPEC["components"]},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )
    problems = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
    assert not problems, (path, problems, body)
    return body


async def test_runs_threads_and_history_are_what_the_protocol_documents(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = _check(await http.post("/threads", json={}), "/threads", "post")
        tid = thread["thread_id"]
        body = {
            "agent_id": "calc",
            "thread_id": tid,
            "messages": [{"role": "user", "content": "add 2 3"}],
        }
        waited = _check(await http.post("/runs/wait", json=body), "/runs/wait", "post")
        assert waited["run"]["status"] == "success"
        assert waited["messages"][-1] == {**waited["messages"][-1], "content": "The sum is 5."}
        run_id = waited["run"]["run_id"]
        _check(await http.get(f"/runs/{run_id}"), "/runs/{run_id}", "get")
        again = {**body, "messages": [{"role": "user", "content": "add 1 1"}]}
        _check(await http.post("/runs/wait", json=again), "/runs/wait", "post")

        history = await http.get(f"/threads/{tid}/history")
        states = _check(history, "/threads/{thread_id}/history", "get")
        assert len(states) == 2  # one state per run, newest first
        assert states[0]["messages"][-1]["content"] == "The sum is 2."
        assert states[1]["messages"][-1]["content"] == "The sum is 5."
        assert states[1]["checkpoint"]["run_id"] == run_id
        older = await http.get(
            f"/threads/{tid}/history",
            params={"before": states[0]["checkpoint"]["checkpoint_id"], "limit": 5},
        )
        assert _check(older, "/threads/{thread_id}/history", "get") == states[1:]
        one = await http.get(f"/threads/{tid}/history", params={"limit": 1})
        assert _check(one, "/threads/{thread_id}/history", "get") == states[:1]
        missing = await http.get("/threads/7a1d3c9e-0000-4000-8000-000000000000/history")
        _check(missing, "/threads/{thread_id}/history", "get")
        assert missing.status_code == 404


async def test_a_stateless_run_gets_uuid_ids(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"agent_id": "calc", "messages": [{"role": "user", "content": "hi"}]}
        waited = _check(await http.post("/runs/wait", json=body), "/runs/wait", "post")
        assert waited["messages"][-1]["content"] == "echo: hi"
        background = await http.post("/runs", json={**body, "on_completion": "keep"})
        run = _check(background, "/runs", "post")
        _check(await http.get(f"/runs/{run['run_id']}/wait"), "/runs/{run_id}/wait", "get")


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe{", b'{"agent_id": "\xff"}', b"{not json"],
    ids=["not-utf8", "bad-byte-in-a-string", "not-json"],
)
async def test_an_undecodable_body_is_422(server: Server, body: bytes) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        headers = {"content-type": "application/json"}
        for path in ("/runs/wait", "/threads", "/threads/search", "/agents/search"):
            got = await http.post(path, content=body, headers=headers)
            assert got.status_code == 422, (path, got.status_code, got.text)
            _check(got, path, "post")
            assert "JSON" in got.json()["error"]["message"]
