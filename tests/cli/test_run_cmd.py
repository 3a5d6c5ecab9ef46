"""The ``loom`` command, end to end in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pexpect = pytest.importorskip("pexpect")
SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom


def loom(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=SRC),
    )


def test_run_streams_tool_calls_and_answer(tmp_path: Path) -> None:
    out = loom("run", "what is 2 + 40?", "--model", "demo", "--store", ":memory:", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "The tool add returned: 42" in out.stdout
    assert "→ add" in out.stderr and "✓ add: 42" in out.stderr
    assert "completed" in out.stderr and "tokens" in out.stderr


def test_run_json_prints_every_event(tmp_path: Path) -> None:
    out = loom("run", "hi", "--model", "demo", "--json", "--store", ":memory:", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert events[0]["type"] == "agent_start" and events[-1]["type"] == "agent_finish"


def test_run_with_an_agent_file(tmp_path: Path) -> None:
    (tmp_path / "AGENT.md").write_text("---\nname: t\nmodel: demo\ntools: [add]\n---\nAdd.\n")
    out = loom("run", "1 + 2", "--agent", "AGENT.md", "--store", ":memory:", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "returned: 3" in out.stdout


def test_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    out = loom("run", "hi", "--model", "nosuch:x", "--store", ":memory:", cwd=tmp_path)
    assert out.returncode == 2
    assert "unknown model provider" in out.stderr
    bad = tmp_path / "BAD.md"
    bad.write_text("---\nname: x\nmax_iterations: -1\n---\n")
    out = loom("run", "hi", "--agent", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and "max_iterations" in out.stderr


def test_chat_keeps_one_session(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loom", "chat", "--model", "demo", "--store", ":memory:"],
        input="hello\n3 + 4\n\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "You said: hello" in out.stdout and "returned: 7" in out.stdout
    sessions = {
        line.split()[1].rstrip(";")
        for line in out.stderr.splitlines()
        if line.startswith("session")
    }
    assert len(sessions) == 1


def test_empty_tools_means_no_tools(tmp_path: Path) -> None:
    out = loom(
        "run",
        "what is 2 + 40?",
        "--model",
        "demo",
        "--tools",
        "",
        "--store",
        ":memory:",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "You said: what is 2 + 40?" in out.stdout and "→ add" not in out.stderr


def test_session_must_exist_unless_new(tmp_path: Path) -> None:
    typo = loom("run", "hi", "--model", "demo", "--session", "mine", cwd=tmp_path)
    assert typo.returncode == 2 and "no session 'mine'" in typo.stderr
    assert "--new" in typo.stderr
    first = loom("run", "hi", "--model", "demo", "--session", "mine", "--new", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = loom("run", "2 + 3", "--model", "demo", "--session", "mine", cwd=tmp_path)
    assert again.returncode == 0 and "returned: 5" in again.stdout
    clash = loom("run", "hi", "--model", "demo", "--session", "mine", "--create", cwd=tmp_path)
    assert clash.returncode == 2 and "already exists" in clash.stderr


def test_version_and_help_show_flags_plainly(tmp_path: Path) -> None:
    from loom import __version__

    version = loom("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"loom {__version__}"
    for command in (["run"], ["resume"], ["errors", "cleanup"], ["sessions", "list"]):
        shown = loom(*command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout and "--help" in shown.stdout


def test_errors_are_not_wrapped_when_piped(tmp_path: Path) -> None:
    out = loom("run", "hi", "--model", "nosuch:x", "--store", ":memory:", cwd=tmp_path)
    assert out.returncode == 2
    line = next(x for x in out.stderr.splitlines() if "unknown model provider" in x)
    assert len(line) > 80 and line.rstrip().endswith("'openai:gpt-4o-mini'.")


def test_bracketed_text_is_printed_as_text(tmp_path: Path) -> None:
    # A session id and a user message that look like Rich markup come out as typed.
    out = loom(
        "run", "[bold]hi[/bold]", "--model", "demo", "--session", "[s]1", "--new", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "You said: [bold]hi[/bold]" in out.stdout and "session [s]1 ·" in out.stderr


def test_a_python_agent_by_module_attr(tmp_path: Path, agents: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "run",
            "deploy staging",
            "--agent",
            "agents:deployer",
            "--store",
            ":memory:",
        ],
        input="y\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert out.returncode == 0, out.stderr
    assert "✓ deploy: deployed staging" in out.stderr and "done: deployed staging" in out.stdout
    for bad, said in (
        ("agents:nothing", "has no attribute 'nothing'"),
        ("missing_module:agent", "importing 'missing_module' failed"),
        ("agents.py:deploy", "deploy(**settings) failed"),
    ):
        out = loom("run", "hi", "--agent", bad, "--store", ":memory:", cwd=tmp_path)
        assert out.returncode == 2 and said in " ".join(out.stderr.split()), out.stderr


def test_a_built_agent_by_module_attr_asks_on_this_terminal(tmp_path: Path, agents: Path) -> None:
    """An ``Agent`` object (frozen, not a factory) runs; its approvals are asked here."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "run",
            "deploy prod",
            "--agent",
            "agents:built",
            "--store",
            ":memory:",
        ],
        input="y\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert out.returncode == 0, out.stderr
    assert "frozen" not in out.stderr and "done: deployed prod" in out.stdout


def test_chat_in_a_terminal(tmp_path: Path, agents: Path, terminal: Callable[..., Any]) -> None:
    child = terminal("chat", "--agent", "agents.py:chatty", "--store", ":memory:", cwd=tmp_path)
    child.expect_exact("you> ")
    child.sendline("")  # an empty line does not quit
    child.expect_exact("you> ")
    child.send("abc")
    child.expect_exact("abc")
    child.sendintr()  # at the prompt, Ctrl-C clears the line
    child.expect_exact("you> ")
    child.sendline("hello")
    child.expect(r"echo: (\w+)")
    assert child.match.group(1) == "hello"
    child.expect_exact("you> ")
    child.sendline("hang")
    child.expect_exact("partial answer")
    child.sendintr()  # mid-answer, Ctrl-C stops the answer and returns to the prompt
    child.expect_exact("stopped")
    child.expect_exact("you> ")
    child.sendline("again")  # the session is usable after the stopped answer
    child.expect_exact("echo: again")
    child.expect_exact("you> ")
    child.sendeof()  # Ctrl-D quits
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_serve_refuses_a_port_out_of_range(tmp_path: Path) -> None:
    for flag in ("--port", "--grpc-port"):
        out = loom("serve", flag, "99999", "--store", ":memory:", cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert flag in out.stderr and "65535" in out.stderr
