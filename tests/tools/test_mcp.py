"""MCP tools against real servers: mcp-server-time, mcp-server-git, an SDK HTTP server, and
deliberately broken servers (hang, crash, invalid schemas)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, EventType, ModelResponse, ToolCall, tool
from loom.store.memory import MemoryStore
from loom.store.owner import proc_stat
from loom.testing import ScriptedModel
from loom.tools import mcp_server
from loom.tools.mcp import MCPServer

pytestmark = pytest.mark.slow
BROKEN = str(Path(__file__).parent / "mcp_servers" / "broken.py")
PY = sys.executable


def children(marker: str) -> list[int]:
    """Live (non-zombie) child processes of this test process whose command line has marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            state, ppid = proc_stat(int(pid))[:2]  # the name may hold spaces
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(ppid) == os.getpid() and state != "Z" and marker in cmd:
            found.append(int(pid))
    return found


def test_children_are_found_beside_a_process_whose_name_has_a_space(tmp_path: Path) -> None:
    """``/proc/<pid>/stat``'s second field is the name in parentheses, spaces and all."""
    import shutil

    spaced = tmp_path / "a b c"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", spaced)
    with subprocess.Popen([str(spaced), "30"]) as proc:
        try:
            assert proc_stat(proc.pid)[1] == str(os.getpid())  # ppid, after "(a b c)"
            assert children("a b c") == [proc.pid]
            assert children("no-such-marker") == []
        finally:
            proc.kill()


def time_server(**kw: Any) -> MCPServer:
    return mcp_server("time", command=PY, args=["-m", "mcp_server_time"], **kw)


def broken(mode: str, **kw: Any) -> MCPServer:
    kw.setdefault("connect_timeout", 5)
    kw.setdefault("call_timeout", 5)
    return mcp_server(mode, command=PY, args=[BROKEN, mode], **kw)


def tool_results(messages: list[Any]) -> dict[str, Any]:
    return {m.tool_call_id: m for m in messages if m.role == "tool"}


async def test_time_server_tools_are_listed_lazily_and_called() -> None:
    server = time_server(prefix="time_")
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(
                        id="c1",
                        name="time_get_current_time",
                        arguments={"timezone": "Europe/Paris"},
                    )
                ]
            ),
            ModelResponse(text="done"),
        ]
    )
    agent = Agent(model=model, tools=["add", server])
    assert children("mcp_server_time") == []  # nothing starts before the first run
    assert list(agent.tools) == ["add"]
    result = await agent.run("what time is it in Paris?")
    assert result.stop_reason == "completed"
    content = tool_results(result.messages)["c1"].content
    assert '"timezone": "Europe/Paris"' in content
    specs = {s.name: s for s in model.calls[0].tools}
    assert set(specs) == {"add", "time_get_current_time", "time_convert_time"}
    assert specs["time_get_current_time"].parameters["required"] == ["timezone"]
    live = {t.name: t for t in await agent.runtime.toolset(server).load_tools()}
    assert live["time_get_current_time"].effect == "pure"  # readOnlyHint
    assert list(agent.tools) == ["add"]  # the turn's tool table is never written back
    assert len(children("mcp_server_time")) == 1
    await agent.aclose()
    assert children("mcp_server_time") == []


async def test_tool_errors_and_bad_arguments_reach_the_model() -> None:
    async with time_server() as server:
        model = ScriptedModel(
            [
                ModelResponse(
                    tool_calls=[
                        ToolCall(
                            id="bad_tz",
                            name="get_current_time",
                            arguments={"timezone": "Mars/Base"},
                        ),
                        ToolCall(id="no_args", name="get_current_time", arguments={}),
                    ]
                ),
                ModelResponse(text="sorry"),
            ]
        )
        agent = Agent(model=model, tools=[server])
        result = await agent.run("time on mars")
        msgs = tool_results(result.messages)
        assert msgs["bad_tz"].metadata["error_code"] == "mcp_tool_error"
        assert "Mars/Base" in msgs["bad_tz"].content
        assert msgs["no_args"].metadata["error_code"] == "invalid_arguments"
        assert "timezone" in msgs["no_args"].content


def test_run_sync_starts_and_stops_the_server_each_time() -> None:
    server = time_server()
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[ToolCall(name="get_current_time", arguments={"timezone": "UTC"})]
            ),
            ModelResponse(text="one"),
            ModelResponse(
                tool_calls=[ToolCall(name="get_current_time", arguments={"timezone": "UTC"})]
            ),
            ModelResponse(text="two"),
        ]
    )
    agent = Agent(model=model, tools=[server], store=MemoryStore())
    assert agent.run_sync("first").output == "one"
    assert children("mcp_server_time") == []  # the loop ended: the server was stopped
    result = agent.run_sync("second")
    assert result.output == "two"
    assert all(m.metadata.get("error_code") is None for m in result.messages if m.role == "tool")
    assert children("mcp_server_time") == []


async def test_reconnects_after_the_server_dies() -> None:
    async with time_server() as server:
        tools = {t.name: t for t in await server.load_tools()}
        (pid,) = children("mcp_server_time")
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.3)
        out = await tools["get_current_time"].run(None, {"timezone": "UTC"})  # type: ignore[arg-type]
        assert '"timezone": "UTC"' in out
        (new_pid,) = children("mcp_server_time")
        assert new_pid != pid
    assert children("mcp_server_time") == []


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit and one unstaged change."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("hello\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first commit")
    (repo / "a.txt").write_text("hello world\n")
    return repo


async def test_git_server_on_a_temporary_repository(repo: Path) -> None:
    server = mcp_server(
        "git", command=PY, args=["-m", "mcp_server_git", "-r", str(repo)], prefix="git_"
    )
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(id="st", name="git_git_status", arguments={"repo_path": str(repo)}),
                    ToolCall(id="log", name="git_git_log", arguments={"repo_path": str(repo)}),
                    ToolCall(
                        id="diff", name="git_git_diff_unstaged", arguments={"repo_path": str(repo)}
                    ),
                    ToolCall(
                        id="commit",
                        name="git_git_commit",
                        arguments={"repo_path": str(repo), "message": "sneaky"},
                    ),
                ]
            ),
            ModelResponse(text="reviewed"),
        ]
    )
    agent = Agent(
        model=model, tools=[server], permissions={"allow": ["git_*"], "deny": ["git_git_commit"]}
    )
    try:
        result = await agent.run("review the repo")
    finally:
        await agent.aclose()
    msgs = tool_results(result.messages)
    assert "a.txt" in msgs["st"].content and "modified" in msgs["st"].content
    assert "first commit" in msgs["log"].content
    assert "+hello world" in msgs["diff"].content
    assert msgs["commit"].metadata["error_code"] == "denied"  # permission rules cover MCP tools
    assert "sneaky" not in git(repo, "log", "--oneline")
    assert children("mcp_server_git") == []


async def test_streamable_http_server(http_mcp_url: str) -> None:
    server = mcp_server("calc", url=http_mcp_url)
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(id="c", name="add", arguments={"a": 2, "b": 40}),
                    ToolCall(id="s", name="shout", arguments={"text": "hi"}),
                ]
            ),
            ModelResponse(text="42"),
        ]
    )
    async with Agent(model=model, tools=[server]) as agent:
        result = await agent.run("add")
    msgs = tool_results(result.messages)
    assert msgs["c"].content == "42" and msgs["s"].content == "HI"


async def run_with(server: MCPServer, calls: list[ToolCall] | None = None) -> tuple[Any, list[Any]]:
    responses = [ModelResponse(tool_calls=calls)] if calls else []
    model = ScriptedModel([*responses, ModelResponse(text="carried on")])
    agent = Agent(model=model, tools=["add", server])
    try:
        events = [e async for e in agent.stream("go")]
    finally:
        await agent.aclose()
    # a toolset's problems are warnings: in the stream, in RunResult.warnings, in the log
    warnings = [e for e in events if e.type is EventType.WARNING]
    assert events[-1].data["warnings"] == [w.data["message"] for w in warnings]
    return events[-1], warnings


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("hang", "did not finish connecting within 2 s"),
        ("crash", "cannot start (missing configuration)"),
        ("invalid_list", "invalid tool list"),
    ],
)
async def test_broken_servers_are_reported_and_the_run_goes_on(mode: str, expected: str) -> None:
    finish, errors = await run_with(broken(mode, connect_timeout=2))
    assert finish.data["stop_reason"] == "completed" and finish.data["output"] == "carried on"
    assert len(errors) == 1 and expected in errors[0].data["message"]
    assert errors[0].data["source"] == "toolset"
    assert children("broken.py") == []


async def test_one_invalid_schema_skips_only_that_tool() -> None:
    server = broken("invalid_one")
    finish, errors = await run_with(
        server, [ToolCall(id="e", name="echo", arguments={"text": "still works"})]
    )
    assert finish.data["stop_reason"] == "completed"
    assert len(errors) == 1 and "'bad'" in errors[0].data["message"]
    assert "invalid input schema" in errors[0].data["message"]


async def test_crash_during_a_call_and_a_slow_call() -> None:
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(id="c1", name="echo", arguments={"text": "x"})]),
            ModelResponse(tool_calls=[ToolCall(id="c2", name="echo", arguments={"text": "y"})]),
            ModelResponse(text="done"),
        ]
    )
    async with Agent(model=model, tools=[broken("crash_on_call")]) as agent:
        result = await agent.run("go")
    msgs = tool_results(result.messages)
    assert msgs["c1"].metadata["error_code"] == "mcp_unavailable"
    assert "unknown" in msgs["c1"].content
    assert msgs["c2"].metadata["error_code"] == "mcp_unavailable"  # restarted, died again
    assert result.stop_reason == "completed"

    slow = broken("slow_call", call_timeout=1)
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(id="c", name="echo", arguments={"text": "x"})]),
            ModelResponse(text="done"),
        ]
    )
    async with Agent(model=model, tools=[slow]) as agent:
        result = await agent.run("go")
    assert tool_results(result.messages)["c"].metadata["error_code"] == "timeout"
    assert children("broken.py") == []


async def test_name_collisions_are_reported() -> None:
    @tool
    def echo(text: str) -> str:
        """My own echo."""
        return f"mine: {text}"

    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(id="c", name="echo", arguments={"text": "x"}),
                    ToolCall(id="p", name="b_echo", arguments={"text": "y"}),
                ]
            ),
            ModelResponse(text="done"),
        ]
    )
    agent = Agent(
        model=model,
        tools=[
            echo,
            broken("invalid_one"),
            broken("slow_call"),
            broken("crash_on_call", prefix="b_"),
        ],
    )
    try:
        events = [e async for e in agent.stream("go")]
    finally:
        await agent.aclose()
    clashes = [
        e.data["message"]
        for e in events
        if e.type is EventType.WARNING and "already uses" in e.data["message"]
    ]
    assert len(clashes) == 2
    assert "a tool the agent already has" in clashes[0] and "prefix" in clashes[0]
    results = {
        e.data["tool_call_id"]: e.data
        for e in events
        if e.type in (EventType.TOOL_RESULT, EventType.TOOL_ERROR)
    }
    assert results["c"]["content"] == "mine: x"  # the agent's own tool wins
    assert results["p"]["error_code"] == "mcp_unavailable"  # the prefixed one is the server's


def test_agent_md_configures_mcp_servers(tmp_path: Path) -> None:
    (tmp_path / "AGENT.md").write_text(f"""---
name: timekeeper
tools: [add]
permissions:
  allow: ["time_*"]
mcp_servers:
  time:
    command: {PY}
    args: [-m, mcp_server_time]
    prefix: time_
    call_timeout: 20
---
You tell the time.
""")
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(
                        id="c", name="time_get_current_time", arguments={"timezone": "Asia/Tokyo"}
                    )
                ]
            ),
            ModelResponse(text="it is late"),
        ]
    )
    agent = Agent.from_file(tmp_path / "AGENT.md", model=model)
    result = agent.run_sync("time in Tokyo?")
    assert "Asia/Tokyo" in tool_results(result.messages)["c"].content
    assert children("mcp_server_time") == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("    command: x\n    url: http://h/mcp\n", "either command= (stdio) or url="),
        ("    command: x\n    colour: red\n", "colour"),
        ("    url: ftp://h\n", "url must be http(s)"),
    ],
)
def test_bad_mcp_server_entries_are_definition_errors(
    tmp_path: Path, entry: str, message: str
) -> None:
    from loom.errors import AgentDefinitionError

    (tmp_path / "AGENT.md").write_text(f"---\nname: a\nmcp_servers:\n  s:\n{entry}---\nhi\n")
    with pytest.raises(AgentDefinitionError, match=re.escape(message)):
        Agent.from_file(tmp_path / "AGENT.md")


async def test_an_mcp_call_waiting_for_approval_runs_after_resume_in_a_fresh_agent() -> None:
    store = MemoryStore()
    call = ToolCall(id="t", name="get_current_time", arguments={"timezone": "UTC"})
    first = Agent(
        model=ScriptedModel([ModelResponse(tool_calls=[call])]),
        store=store,
        tools=[time_server()],
        permissions={"ask": ["get_current_time"]},
    )
    async with first:
        paused = await first.run("time?", session_id="s")
    assert paused.stop_reason == "awaiting_approval"
    second = Agent(
        model=ScriptedModel([ModelResponse(text="noon")]),
        store=store,
        tools=[time_server()],
        permissions={"ask": ["get_current_time"]},
    )
    async with second:  # its server has not been started or listed yet
        result = await second.resume("s", "approve")
    assert result.stop_reason == "completed"
    assert '"timezone": "UTC"' in tool_results(result.messages)["t"].content
