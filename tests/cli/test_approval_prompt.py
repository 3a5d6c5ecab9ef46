"""`loom run` asks on the terminal when a tool call needs approval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom
AGENT = "---\nname: t\nmodel: demo\ntools: [add]\npermissions:\n  ask: [add]\n---\nAdd.\n"


def loom(*args: str, cwd: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=SRC),
    )


def test_yes_runs_the_tool(tmp_path: Path) -> None:
    (tmp_path / "AGENT.md").write_text(AGENT)
    out = loom(
        "run", "2 + 40", "--agent", "AGENT.md", "--store", ":memory:", cwd=tmp_path, stdin="y\n"
    )
    assert out.returncode == 0, out.stderr
    assert "Allow add" in out.stderr and "✓ add: 42" in out.stderr
    # why it asks is said with the question, not on a line printed after the prompt
    [ask] = [line for line in out.stderr.splitlines() if "Allow add" in line]
    assert "needs approval (rule add" in ask.split("?", 1)[1], ask
    assert "approval needed" not in out.stderr


def test_no_with_a_reason_reaches_the_model(tmp_path: Path) -> None:
    (tmp_path / "AGENT.md").write_text(AGENT)
    out = loom(
        "run",
        "2 + 40",
        "--agent",
        "AGENT.md",
        "--store",
        ":memory:",
        cwd=tmp_path,
        stdin="n\nnot now\n",
    )
    assert out.returncode == 0, out.stderr
    assert "✗ add: Error (denied): rejected by the user: not now" in out.stderr


def test_closed_input_rejects(tmp_path: Path) -> None:
    (tmp_path / "AGENT.md").write_text(AGENT)
    out = loom(
        "run", "2 + 40", "--agent", "AGENT.md", "--store", ":memory:", cwd=tmp_path, stdin=""
    )
    assert out.returncode == 0, out.stderr
    assert "input is closed" in " ".join(out.stderr.split())
