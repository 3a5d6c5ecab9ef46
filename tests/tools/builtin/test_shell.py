"""bash: workspace cwd, exit codes, output cap, timeout kills the process group, env scrub."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from loom.errors import ToolError
from loom.store.owner import proc_stat
from loom.tools.base import RunContext
from loom.tools.builtin.shell import bash, make_bash


def ctx(root: Path | None) -> RunContext:
    return RunContext("s", "r", "c", workspace=root)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return proc_stat(pid)[0] != "Z"  # after the name, which may hold spaces
    except FileNotFoundError:
        return False


@pytest.fixture
def marked(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "marker.txt").write_text("m")
    return tmp_path, os.path.realpath(tmp_path)


async def test_runs_in_the_workspace_and_reports_exit_codes(marked: tuple[Path, str]) -> None:
    tmp_path, real = marked
    out = await bash.fn(ctx(tmp_path), command="pwd; ls")
    assert real in out and "marker.txt" in out
    out = await bash.fn(ctx(tmp_path), command="echo oops >&2; exit 3")
    assert "oops" in out and out.endswith("[exit code 3]")


async def test_output_is_capped_keeping_start_and_end(tmp_path: Path) -> None:
    small = make_bash(max_output=1000)
    out = await small.fn(ctx(tmp_path), command="echo START; seq 1 100000; echo END")
    assert out.startswith("START") and out.rstrip().endswith("END")
    assert "bytes of output omitted" in out and len(out) < 1400


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        await bash.fn(
            ctx(tmp_path),
            timeout=1,
            command="sleep 60 & echo $! > bg.pid; sleep 60 & echo $! >> bg.pid; wait",
        )
    assert info.value.code == "timeout" and time.monotonic() - started < 10
    pids = [int(p) for p in (tmp_path / "bg.pid").read_text().split()]
    await asyncio.sleep(0.2)
    assert pids and not any(alive(p) for p in pids)


async def test_cancel_kills_the_process_group(tmp_path: Path) -> None:
    task = asyncio.ensure_future(
        bash.fn(ctx(tmp_path), command="sleep 60 & echo $! > bg.pid; wait")
    )
    for _ in range(100):
        await asyncio.sleep(0.05)
        if (tmp_path / "bg.pid").exists() and (tmp_path / "bg.pid").read_text().strip():
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int((tmp_path / "bg.pid").read_text())
    await asyncio.sleep(0.2)
    assert not alive(pid)


async def test_background_jobs_do_not_outlive_a_finished_command(tmp_path: Path) -> None:
    started = time.monotonic()
    out = await bash.fn(ctx(tmp_path), command="sleep 60 & echo $! > bg.pid; echo done")
    assert "done" in out and time.monotonic() - started < 5
    await asyncio.sleep(0.2)
    assert not alive(int((tmp_path / "bg.pid").read_text()))


async def test_environment_is_scrubbed_unless_allowed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    monkeypatch.setenv("GH_TOKEN", "ghp-secret-456")
    out = await bash.fn(ctx(tmp_path), command="env")
    assert "sk-secret-123" not in out and "ghp-secret-456" not in out and "PATH=" in out
    allowed = make_bash(env_allow=["GH_TOKEN"])
    out = await allowed.fn(ctx(tmp_path), command="echo $GH_TOKEN; echo x$OPENAI_API_KEY")
    assert "ghp-secret-456" in out and "sk-secret" not in out


async def test_bash_needs_a_workspace() -> None:
    with pytest.raises(ToolError) as info:
        await bash.fn(ctx(None), command="ls")
    assert info.value.code == "no_workspace"
