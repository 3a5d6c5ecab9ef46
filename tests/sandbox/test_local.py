"""The local sandbox backend (issue #32 item 1): what a command gets, files in and out,
snapshots, limits as data, settings it refuses. The escape attempts are in test_escapes.py."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from loom.sandbox.base import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
)
from loom.sandbox.local import LocalSandbox, bubblewrap_available, seccomp_program

_UNAVAILABLE = bubblewrap_available()
needs_bwrap = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"the local sandbox cannot run here: {_UNAVAILABLE}"
)


def _workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "data.txt").write_text("data\n")
    return workspace


def _read(path: Path) -> str:
    return path.read_text()


def _names(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def test_the_backend_and_its_sandbox_follow_the_seam() -> None:
    backend = LocalSandbox()
    assert isinstance(backend, SandboxBackend)
    assert backend.name == "local"
    assert "network:hosts" not in backend.enforces
    assert {"cpu_seconds", "memory_bytes", "processes", "output_bytes"} <= backend.enforces


def test_the_seccomp_program_is_whole_instructions() -> None:
    program = seccomp_program()
    if program is None:
        pytest.skip("seccomp filter is x86-64 only")
    assert len(program) % 8 == 0
    first = struct.unpack("<HBBI", program[:8])
    assert first == (0x20, 0, 0, 4)  # loads the architecture first


@needs_bwrap
async def test_a_command_runs_in_the_workspace_with_only_the_given_env(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    settings = SandboxSettings(env={"GREETING": "hi"})
    sandbox = await LocalSandbox().start(settings, workspace)
    assert isinstance(sandbox, Sandbox)
    try:
        result = await sandbox.run(
            ["sh", "-c", 'echo "$GREETING $EXTRA"; pwd; cat data.txt; echo new > made.txt'],
            cwd="sub",
            env={"EXTRA": "there"},
        )
    finally:
        await sandbox.close()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["hi there", "/workspace/sub", "data"]
    assert result.files == ("sub/made.txt",)
    assert result.limit is None
    assert _read(workspace / "sub" / "made.txt") == "new\n"


@needs_bwrap
async def test_stdin_reaches_the_command(tmp_path: Path) -> None:
    sandbox = await LocalSandbox().start(SandboxSettings(), _workspace(tmp_path))
    try:
        result = await sandbox.run(["tr", "a-z", "A-Z"], stdin=b"shout\n")
    finally:
        await sandbox.close()
    assert result.stdout == "SHOUT\n"


@needs_bwrap
async def test_copy_mode_leaves_the_workspace_alone_until_copied_out(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    sandbox = await LocalSandbox().start(SandboxSettings(workspace="copy"), workspace)
    try:
        result = await sandbox.run(["sh", "-c", "echo x > out.txt; rm sub/data.txt"])
        assert result.exit_code == 0, result.stderr
        assert result.files == ("out.txt",)
        assert _names(workspace) == ["sub"]
        assert _read(workspace / "sub" / "data.txt") == "data\n"
        await sandbox.copy_out("out.txt", tmp_path / "fetched.txt")
        assert _read(tmp_path / "fetched.txt") == "x\n"
        second = await sandbox.run(["cat", "out.txt"])  # files persist between calls
        assert second.stdout == "x\n"
    finally:
        await sandbox.close()


@needs_bwrap
async def test_copy_in_and_out_round_trip_a_directory(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "deep").mkdir(parents=True)
    (source / "deep" / "f.txt").write_text("f\n")
    sandbox = await LocalSandbox().start(SandboxSettings(), _workspace(tmp_path))
    try:
        await sandbox.copy_in(source, "incoming")
        result = await sandbox.run(["cat", "incoming/deep/f.txt"])
        assert result.stdout == "f\n"
        await sandbox.copy_out("incoming", tmp_path / "back")
    finally:
        await sandbox.close()
    assert _read(tmp_path / "back" / "deep" / "f.txt") == "f\n"


@needs_bwrap
async def test_a_snapshot_restores_the_workspace_as_it_was(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    backend = LocalSandbox(snapshot_dir=tmp_path / "snaps")
    sandbox = await backend.start(SandboxSettings(), workspace)
    try:
        await sandbox.run(["sh", "-c", "echo one > step.txt"])
        snapshot = await sandbox.snapshot(1)
        await sandbox.run(["sh", "-c", "echo two > step.txt; echo junk > later.txt"])
    finally:
        await sandbox.close()
    assert snapshot.backend == "local" and snapshot.step == 1
    restored = await backend.start(SandboxSettings(), workspace, restore=snapshot)
    try:
        result = await restored.run(["sh", "-c", "cat step.txt; ls"])
    finally:
        await restored.close()
    assert result.stdout.split() == ["one", "step.txt", "sub"]


@needs_bwrap
async def test_a_limit_is_data_naming_the_limit_and_its_value(tmp_path: Path) -> None:
    sandbox = await LocalSandbox().start(SandboxSettings(), _workspace(tmp_path))
    try:
        result = await sandbox.run(
            ["sh", "-c", "echo start; sleep 100"], limits=SandboxLimits(wall_seconds=0.5)
        )
    finally:
        await sandbox.close()
    assert result.limit is not None
    assert (result.limit.limit, result.limit.value) == ("wall_seconds", 0.5)
    assert "wall_seconds limit (0.5)" in result.limit.describe()
    assert result.stdout == "start\n"


@needs_bwrap
async def test_the_network_all_setting_shares_the_hosts_network(tmp_path: Path) -> None:
    sandbox = await LocalSandbox().start(SandboxSettings(network="all"), _workspace(tmp_path))
    try:
        result = await sandbox.run(["cat", "/proc/net/dev"])
    finally:
        await sandbox.close()
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line}
    host = {
        line.split(":")[0].strip()
        for line in _read(Path("/proc/net/dev")).splitlines()
        if ":" in line
    }
    assert interfaces == host
    assert interfaces != {"lo"} or host == {"lo"}


async def test_settings_it_cannot_enforce_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="list of hosts"):
        await LocalSandbox().start(SandboxSettings(network=("pypi.org",)), tmp_path)


async def test_a_missing_bwrap_is_unavailable_with_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        await LocalSandbox(bwrap="no-such-bwrap-here").start(SandboxSettings(), tmp_path)


@needs_bwrap
async def test_a_closed_sandbox_and_bad_arguments_raise(tmp_path: Path) -> None:
    sandbox = await LocalSandbox().start(SandboxSettings(), _workspace(tmp_path))
    with pytest.raises(SandboxError, match="empty command"):
        await sandbox.run([])
    await sandbox.close()
    await sandbox.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        await sandbox.run(["true"])
    with pytest.raises(SandboxError, match="not a directory"):
        await LocalSandbox().start(SandboxSettings(), tmp_path / "missing")


_AS_NON_ROOT = """
import asyncio, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from loom.sandbox.base import SandboxLimits, SandboxSettings
from loom.sandbox.local import LocalSandbox

async def main():
    sandbox = await LocalSandbox().start(SandboxSettings(), Path(sys.argv[2]))
    ran = await sandbox.run(["sh", "-c", "id -u; echo x > made.txt"])
    bomb = await sandbox.run(
        ["bash", "-c", "b() { b | b & }; b; wait"],
        limits=SandboxLimits(processes=16, wall_seconds=10),
    )
    await sandbox.close()
    limit = bomb.limit.limit if bomb.limit else None
    print(json.dumps([ran.stdout, list(ran.files), limit, "fork" in bomb.stderr]))

asyncio.run(main())
"""


@needs_bwrap
def test_a_non_root_loom_runs_the_sandbox_as_itself() -> None:
    system_python = Path("/usr/bin/python3")
    if os.getuid() != 0 or not system_python.exists():
        pytest.skip("needs root (to become an unprivileged user) and /usr/bin/python3")
    src = Path(__file__).resolve().parents[2] / "src"
    scratch = Path(tempfile.mkdtemp(prefix="loom-nonroot-", dir="/tmp"))
    try:
        workspace = scratch / "ws"
        workspace.mkdir()
        for path in (scratch, workspace):
            os.chown(path, 65534, 65534)
        done = subprocess.run(
            [str(system_python), "-c", _AS_NON_ROOT, str(src), str(workspace)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            user=65534,
            group=65534,
            extra_groups=[],
            cwd=scratch,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        stdout, files, bomb_limit, fork_refused = json.loads(done.stdout)
        assert stdout == "65534\n"
        assert files == ["made.txt"]
        # bash retries a refused fork for a while: the wall timeout may end it first
        assert bomb_limit in ("processes", "wall_seconds")
        assert fork_refused
        assert os.stat(workspace / "made.txt").st_uid == 65534
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
