"""A sandbox lives as long as its session (or run), in the runtime, and its workspace is
snapshotted after each committed step (issue #32 item 2). Uses ``UnsandboxedDirBackend``
(conftest: NO isolation): what is tested is the lifetime, not the isolation."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from loom import Agent
from loom.engine.runtime import Runtime
from loom.sandbox import SandboxSettings
from loom.sandbox.sessions import SandboxPool
from loom.sandbox.snapshots import WorkspaceSnapshots, session_folder_name

from .conftest import UnsandboxedDirBackend
from .helpers import ALLOW, calls


def bash(command: str) -> tuple[str, dict[str, object]]:
    return ("bash", {"command": command})


async def test_one_sandbox_per_session_kept_between_runs_and_closed_with_the_runtime(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    rt = Runtime(sandbox_dir=tmp_path / "boxes")
    agent = Agent(
        tools=["bash"],
        permissions=ALLOW,
        model=calls(bash("echo 1 | tee a"), bash("cat a")),
        sandbox=SandboxSettings(backend=double),
    )
    first = await rt.run(agent, "go", session_id="s1")
    second = await rt.run(agent.replace(model=calls(bash("cat a"))), "again", session_id="s1")
    assert first.stop_reason == second.stop_reason == "completed"
    assert len(double.started) == 1  # one sandbox for the session, kept between its runs
    assert rt.sandboxes.live_sessions() == ["s1"]
    other = await rt.run(agent.replace(model=calls(bash("ls"))), "x", session_id="s2")
    assert other.stop_reason == "completed" and len(double.started) == 2
    # agents without a workspace get a private one per session
    ws1, ws2 = (box.root for box in double.started)
    assert ws1 != ws2 and ws1.parent == tmp_path / "boxes" / "workspaces"
    await rt.aclose()
    assert all(box.closed for box in double.started)
    assert rt.sandboxes.live_sessions() == []


async def test_lifetime_run_closes_the_sandbox_when_the_run_ends(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    rt = Runtime(sandbox_dir=tmp_path / "boxes")
    agent = Agent(
        tools=["bash"],
        permissions=ALLOW,
        model=calls(bash("true"), bash("true")),
        sandbox=SandboxSettings(backend=double, lifetime="run"),
    )
    await rt.run(agent, "go", session_id="s")
    (box,) = double.started
    assert box.closed and len(box.commands) == 2
    await rt.aclose()


async def test_each_committed_step_snapshots_the_workspace_and_old_ones_are_pruned(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    rt = Runtime(sandbox_dir=tmp_path / "boxes")
    ws = tmp_path / "ws"
    ws.mkdir()
    agent = Agent(
        tools=["bash"],
        permissions=ALLOW,
        workspace=ws,
        model=calls(*(bash(f"touch f{i}") for i in range(4))),
        sandbox=SandboxSettings(backend=double, keep_snapshots=2),
    )
    await rt.run(agent, "go", session_id="s")
    snaps = WorkspaceSnapshots(tmp_path / "boxes" / "snapshots", keep=2)
    records = snaps.records("s")
    assert [r.step for r in records] == [3, 4]  # four steps snapshotted, two kept
    assert (
        len(list((tmp_path / "boxes" / "snapshots" / session_folder_name("s")).glob("*.tar"))) == 2
    )
    with tarfile.open(
        tmp_path / "boxes" / "snapshots" / session_folder_name("s") / f"{records[-1].digest}.tar"
    ) as t:
        assert sorted(t.getnames()) == ["f0", "f1", "f2", "f3"]
    await rt.aclose()


async def test_an_idle_sandbox_is_closed_and_the_next_one_restores_the_last_snapshot(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    now = [0.0]
    pool = SandboxPool(tmp_path / "boxes", clock=lambda: now[0])
    settings = SandboxSettings(backend=double, idle_seconds=60)
    ws = tmp_path / "ws"
    ws.mkdir()
    async with pool.use(settings, "s", "r1", ws) as box:
        await box.run(["sh", "-c", "echo kept > kept.txt"])
    await pool.committed("s")  # the step that wrote kept.txt is committed: snapshot
    async with pool.use(settings, "s", "r1", ws) as box:
        await box.run(["sh", "-c", "echo lost > lost.txt"])
    # no commit after it: the idle close must not snapshot lost.txt
    now[0] = 61.0
    await pool.sweep()
    assert pool.live_sessions() == [] and double.started[0].closed
    async with pool.use(settings, "s", "r2", ws) as box:
        assert box is not double.started[0]
    assert sorted(p.name for p in ws.iterdir()) == ["kept.txt"]
    await pool.close_session("s", forget=True)
    assert WorkspaceSnapshots(tmp_path / "boxes" / "snapshots").records("s") == []


async def test_a_command_still_running_at_a_commit_is_snapshotted_at_the_next_one(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    pool = SandboxPool(tmp_path / "boxes")
    settings = SandboxSettings(backend=double)
    ws = tmp_path / "ws"
    ws.mkdir()
    snaps = pool.snapshots(settings)
    async with pool.use(settings, "s", "r", ws) as box:
        await box.run(["sh", "-c", "echo half > half.txt"])
        await pool.committed("s")  # another call's step commits while this one runs
        assert snaps.records("s") == []
    await pool.committed("s")
    assert [r.step for r in snaps.records("s")] == [1]
    await pool.aclose()


async def test_the_local_sandbox_keeps_a_private_workspace_per_session_between_runs() -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    rt = Runtime()  # in-memory store: the sandboxes live in a private temporary directory
    write = ("python", {"code": "open('kept.txt', 'w').write('1')"})
    read = ("python", {"code": "import os\nsorted(os.listdir('.'))"})
    agent = Agent(tools=["python"], permissions=ALLOW, model=calls(write), sandbox=True)
    first = await rt.run(agent, "go", session_id="s")
    second = await rt.run(agent.replace(model=calls(read)), "again", session_id="s")
    other = await rt.run(agent.replace(model=calls(read)), "x", session_id="t")
    shown = [m.content for r in (first, second, other) for m in r.messages if m.role == "tool"]
    assert "[files created or changed: kept.txt]" in shown[0]
    assert "[value] ['kept.txt']" in shown[1]
    assert "[value] []" in shown[2]
    scratch = rt.sandboxes.directory
    await rt.aclose()
    assert not scratch.exists()


async def test_a_failed_snapshot_does_not_fail_the_step_and_is_retried(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    pool = SandboxPool(tmp_path / "boxes")
    settings = SandboxSettings(backend=double)
    ws = tmp_path / "ws"
    ws.mkdir()
    async with pool.use(settings, "s", "r", ws) as box:
        await box.run(["sh", "-c", "echo 1 > one"])
    (tmp_path / "boxes").mkdir()
    (tmp_path / "boxes" / "snapshots").write_text("a file where the folder should be")
    await pool.committed("s")  # cannot write the snapshot: logged, no exception
    (tmp_path / "boxes" / "snapshots").unlink()
    await pool.committed("s")  # still dirty: taken now
    assert [r.step for r in pool.snapshots(settings).records("s")] == [1]
    await pool.aclose()


def test_a_restore_skips_links_out_of_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "plain.txt").write_text("x")
    (ws / "inner").symlink_to("plain.txt")
    (ws / "out").symlink_to("/etc")
    (ws / "up").symlink_to("../../..")
    snaps = WorkspaceSnapshots(tmp_path / "snaps")
    snaps.take("s", ws)
    (ws / "plain.txt").write_text("changed")
    (ws / "extra.txt").write_text("y")
    snaps.restore("s", ws)
    assert sorted(p.name for p in ws.iterdir()) == ["inner", "plain.txt"]
    assert (ws / "plain.txt").read_text() == "x" and (ws / "inner").is_symlink()


def test_two_session_ids_that_read_alike_never_share_snapshots(tmp_path: Path) -> None:
    """A folder name is the id made safe plus a digest of the exact id: "a~b" (a key's
    session) and "a_b" would otherwise share a folder, and a restore would bring back the
    other session's files."""
    snaps = WorkspaceSnapshots(tmp_path / "snapshots")
    workspace = tmp_path / "w"
    workspace.mkdir()
    (workspace / "secret.txt").write_text("alice's")
    snaps.take("a~b", workspace)
    assert session_folder_name("a~b") != session_folder_name("a_b")
    assert snaps.latest("a_b") is None
    assert snaps.latest("a~b") is not None
