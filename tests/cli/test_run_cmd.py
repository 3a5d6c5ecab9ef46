"""The ``loom`` command, end to end in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def loom(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
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
