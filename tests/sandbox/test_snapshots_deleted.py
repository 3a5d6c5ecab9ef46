"""A session's sandbox files (workspace snapshots, private workspace) go when the session is
deleted: forgetting an owner and ``loom sessions delete`` leave no byte of them on disk
(issue #32 item 3, with #29's forgetting). Uses ``UnsandboxedDirBackend`` (conftest: NO
isolation): what is tested is where the files go, not the isolation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from loom import Agent
from loom.cli import app
from loom.engine.runtime import Runtime
from loom.sandbox import SandboxSettings
from loom.server.forget import forget_owner
from loom.store import SQLiteStore

from .conftest import UnsandboxedDirBackend
from .helpers import ALLOW, calls

MARKER = "snapshot-marker-7f3c91e2"


def _files_holding(root: Path, marker: str) -> list[Path]:
    needle = marker.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def _sandboxed_session(
    db: Path, session_id: str, backend: UnsandboxedDirBackend, marker: str = MARKER
) -> Path:
    """Run one sandboxed step writing ``marker`` into the workspace of ``session_id`` on the
    store at ``db``; return the sandbox directory, checked to hold the marker in a snapshot."""
    store = SQLiteStore(db)
    rt = Runtime(store)
    agent = Agent(
        tools=["bash"],
        permissions=ALLOW,
        model=calls(("bash", {"command": f"echo {marker} | tee notes.txt"})),
        sandbox=SandboxSettings(backend=backend),
    )
    result = await rt.run(agent, "go", session_id=session_id)
    assert result.stop_reason == "completed"
    await rt.aclose()
    await store.close()
    boxes = Path(str(db) + ".sandboxes")
    held = _files_holding(boxes, marker)
    assert any("snapshots" in p.parts for p in held), held  # the snapshot holds it
    return boxes


async def test_forgetting_an_owner_leaves_no_file_of_its_snapshots(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    db = tmp_path / "loom.db"
    boxes = await _sandboxed_session(db, "alice~s1", double)
    other = await _sandboxed_session(db, "bob~s1", double, marker="bob-marker-0c1d")
    assert other == boxes
    store = SQLiteStore(db)
    try:
        done = await forget_owner(store, "alice")
        assert done.sessions == 1
    finally:
        await store.close()
    assert _files_holding(boxes, MARKER) == []
    assert _files_holding(boxes, "bob-marker-0c1d")  # another owner's snapshots are kept


def test_sessions_delete_removes_the_sessions_snapshots(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    db = tmp_path / "loom.db"
    boxes = asyncio.run(_sandboxed_session(db, "s1", double))
    r = CliRunner().invoke(app, ["sessions", "delete", "s1", "--yes", "--store", str(db)])
    assert r.exit_code == 0, r.output
    assert _files_holding(boxes, MARKER) == []


def test_dropping_a_session_that_left_nothing_is_no_error(tmp_path: Path) -> None:
    from loom.sandbox.snapshots import default_sandbox_dir, drop_session_snapshots

    assert drop_session_snapshots(None, "s") is False
    assert drop_session_snapshots(tmp_path / "none", "s") is False
    assert default_sandbox_dir(object()) is None


async def test_the_default_sandbox_dir_is_beside_the_store_file(tmp_path: Path) -> None:
    from loom.sandbox.snapshots import default_sandbox_dir

    store = SQLiteStore(tmp_path / "loom.db")
    rt = Runtime(store)
    try:
        assert rt.sandbox_dir == default_sandbox_dir(store) == tmp_path / "loom.db.sandboxes"
        assert Runtime(sandbox_dir=tmp_path / "b").sandbox_dir == tmp_path / "b"
    finally:
        await rt.aclose()
        await store.close()


async def test_a_runtime_forgetting_a_session_closes_its_sandbox_and_drops_its_files(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    """The server's thread delete calls ``Runtime.forget_session_sandbox``: a sandbox still
    live for the session is closed, and its files under ``sandbox_dir`` go."""
    rt = Runtime(sandbox_dir=tmp_path / "boxes")
    agent = Agent(
        tools=["bash"],
        permissions=ALLOW,
        model=calls(("bash", {"command": f"echo {MARKER} | tee notes.txt"})),
        sandbox=SandboxSettings(backend=double),
    )
    assert (await rt.run(agent, "go", session_id="t1")).stop_reason == "completed"
    assert rt.sandboxes.live_sessions() == ["t1"] and _files_holding(tmp_path / "boxes", MARKER)
    await rt.forget_session_sandbox("t1")
    (box,) = double.started
    assert box.closed and rt.sandboxes.live_sessions() == []
    assert _files_holding(tmp_path / "boxes", MARKER) == []
    await rt.aclose()
