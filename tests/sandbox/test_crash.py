"""SIGKILL a process between steps of a sandboxed agent, resume in a new process: the
workspace is the snapshot of the last committed step (issue #32 item 3).

The agent's first ``python`` call writes ``step1.txt`` (committed); the second writes
``seen.json`` and ``step2.txt``, and the process is killed before that step is committed
(the child says READY on a pipe at that point: no sleeps). The next process's turn recovers
the lost call, which runs again in a sandbox restored from the snapshot: it sees only
``step1.txt``. Runs with the ``UnsandboxedDirBackend`` test double (no isolation: what is
tested is the snapshot and restore) and with the bubblewrap backend where it can run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from loom.sandbox.snapshots import WorkspaceSnapshots, session_folder_name

CHILD = Path(__file__).with_name("crash_child.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def child(mode: str, tmp: Path, ws: Path, backend: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [str(tmp / "loom.db"), str(tmp / "boxes"), str(ws), backend]
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("backend", ["double", "local"])
def test_a_resumed_run_finds_the_workspace_of_the_last_committed_step(
    tmp_path: Path, open_workspace: Path, backend: str
) -> None:
    if backend == "local":
        if importlib.util.find_spec("loom.sandbox.local") is None:
            pytest.skip("loom.sandbox.local (the bubblewrap backend) is not in this build yet")
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    ws = open_workspace  # the local sandbox's uid must reach it (see conftest)
    proc = child("crash", tmp_path, ws, backend)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline().strip() if ready else ""  # type: ignore[union-attr]
        if line != "READY":
            proc.kill()
            raise AssertionError(f"the child did not get to step 2: {proc.communicate()[1]}")
        written = sorted(p.name for p in ws.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert written == ["seen.json", "step1.txt", "step2.txt"]  # the lost step did write

    snaps = WorkspaceSnapshots(tmp_path / "boxes" / "snapshots")
    latest = snaps.latest("crashy")
    assert latest is not None
    archive = (
        tmp_path / "boxes" / "snapshots" / session_folder_name("crashy") / f"{latest.digest}.tar"
    )
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["step1.txt"]  # the last committed step's workspace

    resumed = child("resume", tmp_path, ws, backend)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert out.strip().splitlines()[-1] == "completed"
    # the lost call ran again, in the workspace restored from the snapshot
    assert json.loads((ws / "seen.json").read_text()) == ["step1.txt"]
    assert sorted(p.name for p in ws.iterdir()) == ["seen.json", "step1.txt", "step2.txt"]
