"""Loom agents as MCP tools, driven by clients someone else wrote: the ``mcp`` Python SDK's
client (streamable HTTP and stdio) and ``@modelcontextprotocol/inspector-cli``, against a real
``loom serve`` (or ``loom mcp``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import SRC, Server

mcp = pytest.importorskip("mcp")

pytestmark = pytest.mark.timeout(120)


def _client(url: str, **kw: Any) -> Any:
    from mcp.client.streamable_http import streamable_http_client

    return mcp.Client(streamable_http_client(url + "/mcp"), **kw)


async def test_tools_are_the_agents_and_a_call_runs_one(interop_server: Server) -> None:
    notes: list[dict[str, Any]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append(json.loads(message or "{}"))

    async with _client(interop_server.url) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"calc", "ops", "slow", "painter"}
        assert tools["calc"].description == "You add numbers."  # the instructions' first line
        assert tools["calc"].input_schema["required"] == ["message"]
        assert set(tools["calc"].input_schema["properties"]) == {"message", "session_id"}

        result = await client.call_tool("calc", {"message": "add 2 3"}, progress_callback=progress)
        assert not result.is_error
        assert result.content[0].text == "The sum is 5."
        sc = result.structured_content
        assert sc["stop_reason"] == "completed" and sc["usage"]["requests"] == 2
        # the run's events as progress notifications, in the run's order
        kinds = [n["type"] for n in notes]
        assert kinds == ["tokens", "tool_start", "tool_end", "tokens"]
        assert notes[1] == {
            "type": "tool_start",
            "tool": "add",
            "id": notes[1]["id"],
            "input": {"a": 2, "b": 3},
        }
        assert notes[2]["success"] is True and notes[3]["total"]["requests"] == 2

        again = await client.call_tool("calc", {"message": "hi", "session_id": sc["session_id"]})
        assert again.structured_content["session_id"] == sc["session_id"]
    # the same session, continued over the run API: one journal for every protocol
    thread = _runs(interop_server, sc["session_id"])
    assert len(thread) == 2


async def test_bad_calls_get_json_rpc_errors_that_say_what_was_wrong(
    interop_server: Server,
) -> None:
    from mcp.shared.exceptions import MCPError

    async with _client(interop_server.url) as client:
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("nope", {"message": "x"})
        assert unknown.value.code == -32602
        assert "no tool 'nope'" in str(unknown.value.error.message)
        assert "calc" in unknown.value.error.message
        with pytest.raises(MCPError) as bad:
            await client.call_tool("calc", {"msg": "x"})
        assert "unknown argument(s) msg" in bad.value.error.message
        with pytest.raises(MCPError) as empty:
            await client.call_tool("calc", {"message": "  "})
        assert "'message' is required" in empty.value.error.message
        # the server keeps serving
        ok = await client.call_tool("calc", {"message": "still there"})
        assert ok.content[0].text == "echo: still there"


def _runs(server: Server, session_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/threads/{session_id}/runs")
    return list(r.json()) if r.status_code == 200 else []


async def _until(check: Any, what: str) -> Any:
    for _ in range(400):  # polls a condition (never orders events by sleeping)
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_client_cancellation_cancels_the_run(interop_server: Server) -> None:
    sid = f"mcp-cancel-{os.getpid()}"
    async with _client(interop_server.url) as client:
        call = asyncio.create_task(
            client.call_tool("slow", {"message": "sleep 60", "session_id": sid})
        )
        await _until(
            lambda: any(r["status"] == "running" for r in _runs(interop_server, sid)),
            "the run to start",
        )
        call.cancel()  # the SDK sends notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        runs = await _until(
            lambda: [r for r in _runs(interop_server, sid) if r["status"] != "running"],
            "the run to end",
        )
        assert runs[0]["status"] in ("interrupted", "cancelled")
        # the session is free again: a next call runs at once
        done = await client.call_tool("slow", {"message": "sleep 0", "session_id": sid})
        assert done.content[0].text == "slept 0"


async def test_approval_without_elicitation_describes_the_pending_call(
    interop_server: Server,
) -> None:
    async with _client(interop_server.url) as client:
        result = await client.call_tool("ops", {"message": "deploy please"})
    assert result.is_error is False
    sc = result.structured_content
    assert sc["stop_reason"] == "awaiting_approval"
    [pending] = sc["pending_approvals"]
    assert pending["tool_name"] == "deploy" and pending["arguments"] == {"target": "prod"}
    assert "waiting for approval" in result.content[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("approve", [True, False])
async def test_approval_by_elicitation_resumes_the_run(
    interop_server: Server, mode: str, approve: bool
) -> None:
    import mcp_types as t

    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> Any:
        asked.append(params.message)
        content = {"approve": approve} if approve else {"approve": False, "reason": "not today"}
        return t.ElicitResult(action="accept", content=content)

    async with _client(interop_server.url, mode=mode, elicitation_callback=elicit) as client:
        result = await client.call_tool("ops", {"message": "deploy please"})
    assert len(asked) == 1 and "deploy" in asked[0]
    assert result.structured_content["stop_reason"] == "completed"
    if approve:
        assert result.content[0].text == "done: deployed prod"
    else:
        assert "not today" in result.content[0].text


async def test_a_client_that_never_sends_initialized_does_not_wedge_the_server(
    interop_server: Server,
) -> None:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "stuck", "version": "0"},
        },
    }
    async with httpx.AsyncClient(base_url=interop_server.url, timeout=30) as http:
        r = await http.post("/mcp", json=init, headers=headers)
        assert r.status_code == 200
        session = r.headers["mcp-session-id"]
        # no notifications/initialized: a call on that session is answered, not left hanging
        # (the SDK's runner serves it; it waits on no handshake step)
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "calc", "arguments": {"message": "x"}},
        }
        r = await http.post("/mcp", json=call, headers={**headers, "mcp-session-id": session})
        assert r.status_code == 200 and '"id":2' in r.text
        # other clients are served meanwhile
        async with _client(interop_server.url) as client:
            ok = await client.call_tool("calc", {"message": "add 1 1"})
            assert ok.content[0].text == "The sum is 2."
        # the client going (DELETE) frees its session: the id is unknown afterwards
        r = await http.delete("/mcp", headers={**headers, "mcp-session-id": session})
        assert r.status_code in (200, 204)
        r = await http.post("/mcp", json=call, headers={**headers, "mcp-session-id": session})
        assert r.status_code == 404


async def test_malformed_json_rpc_gets_a_json_rpc_error(interop_server: Server) -> None:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=interop_server.url, timeout=30) as http:
        r = await http.post("/mcp", content=b"{not json", headers=headers)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32700  # parse error


async def test_stdio_loom_mcp(tmp_path: Path) -> None:
    from mcp.client.stdio import stdio_client
    from tests.interop.conftest import AGENTS

    (tmp_path / "interop_agents.py").write_text(AGENTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp_path)]))
    params = mcp.StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "loom",
            "mcp",
            "--app",
            "interop_agents:registry",
            "--store",
            str(tmp_path / "stdio.db"),
        ],
        env=env,
        cwd=str(tmp_path),
    )
    notes: list[str] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append(json.loads(message or "{}")["type"])

    async with mcp.Client(stdio_client(params)) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["calc", "ops", "slow", "painter"]
        result = await client.call_tool("calc", {"message": "add 4 5"}, progress_callback=progress)
        assert result.content[0].text == "The sum is 9."
        assert notes == ["tokens", "tool_start", "tool_end", "tokens"]
        call = asyncio.create_task(client.call_tool("slow", {"message": "sleep 60"}))
        await asyncio.sleep(0)  # let the request go out before cancelling it
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the server still answers after the cancellation
        again = await client.call_tool("calc", {"message": "add 1 2"})
        assert again.content[0].text == "The sum is 3."


def _inspector(js: Path, *args: str) -> Any:
    out = subprocess.run(
        ["npx", "--no-install", "mcp-inspector-cli", "--cli", *args],
        # the CLI (1.0.3) checks for "../package.json" from the working directory but imports
        # it relative to its own file: run it one level below a package.json, as upstream does
        cwd=js / "node_modules",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout)


def test_inspector_cli_lists_and_calls(interop_server: Server, js: Path) -> None:
    url = f"{interop_server.url}/mcp"
    listed = _inspector(js, url, "--transport", "http", "--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == ["calc", "ops", "slow", "painter"]
    called = _inspector(
        js,
        url,
        "--transport",
        "http",
        "--method",
        "tools/call",
        "--tool-name",
        "calc",
        "--tool-arg",
        "message=add 20 22",
    )
    assert called["content"][0]["text"] == "The sum is 42."
    assert called["structuredContent"]["stop_reason"] == "completed"
