"""Approval pause in one process, resume in another, through a SQLite store on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r'''
import asyncio, json, sys
from pathlib import Path
from loom import Agent, ModelResponse, ToolCall, tool
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

db, log, phase = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

@tool
def record(note: str) -> str:
    """Append a note to the log file."""
    with log.open("a") as f:
        f.write(note + "\n")
    return f"recorded {note}"

@tool(effect="pure")
def peek() -> str:
    """Read-only look."""
    with log.open("a") as f:
        f.write("peek\n")
    return "peeked"

async def main():
    store = SQLiteStore(db)
    if phase == "pause":
        model = ScriptedModel([ModelResponse(tool_calls=[
            ToolCall(id="call_peek", name="peek"),
            ToolCall(id="call_rec", name="record", arguments={"note": "a"})])])
    else:
        model = ScriptedModel([ModelResponse(text="finished")])
    agent = Agent(model=model, tools=[record, peek], store=store,
                  permissions={"allow": ["peek"], "ask": ["record"]})
    if phase == "pause":
        result = await agent.run("go", session_id="s1")
    else:
        result = await agent.resume("s1", {"call_rec": "approve"})
    print(json.dumps({"stop": result.stop_reason, "output": result.output,
                      "pending": [p["tool_call_id"] for p in result.pending_approvals]}))
    await store.close()

asyncio.run(main())
'''


def run_phase(tmp_path: Path, phase: str) -> dict[str, object]:
    script = tmp_path / "agent_proc.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "loom.db"), str(tmp_path / "log.txt"), phase],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_pause_then_resume_in_a_new_process(tmp_path: Path) -> None:
    paused = run_phase(tmp_path, "pause")
    assert paused == {"stop": "awaiting_approval", "output": "", "pending": ["call_rec"]}
    assert (tmp_path / "log.txt").read_text() == "peek\n"
    resumed = run_phase(tmp_path, "resume")
    assert resumed == {"stop": "completed", "output": "finished", "pending": []}
    assert (tmp_path / "log.txt").read_text() == "peek\na\n"  # nothing ran twice
