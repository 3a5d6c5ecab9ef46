"""Fixtures of the sandbox tests.

``UnsandboxedDirBackend`` runs commands in the workspace directory WITHOUT any isolation: it is
a test double for the logic around a sandbox (sessions, snapshots, results, effects), used only
where isolation is not what a test checks. Real isolation is tested with the bubblewrap
backend (``loom.sandbox.local``), skipped with its reason where bubblewrap cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from loom.sandbox.base import ExecResult, LimitHit, SandboxLimits, SandboxSettings, Snapshot
from loom.sandbox.container import copy_tree_or_file


def _state(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            p = Path(folder) / name
            with contextlib.suppress(OSError):
                st = p.stat()
                out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


class UnsandboxedDir:
    """A "sandbox" that is just a directory on the host (no isolation at all)."""

    def __init__(self, root: Path, settings: SandboxSettings) -> None:
        self.root = root
        self.settings = settings
        self.closed = False
        self.commands: list[list[str]] = []

    async def run(
        self,
        command: Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecResult:
        assert not self.closed, "run on a closed sandbox"
        self.commands.append(list(command))
        limits = limits or self.settings.limits
        before = _state(self.root)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=self.root / cwd,
            env={"PATH": os.defpath + ":/usr/local/bin", **(env or {})},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        hit = None
        try:
            async with asyncio.timeout(limits.wall_seconds):
                out, err = await proc.communicate(stdin or b"")
        except TimeoutError:
            hit = LimitHit("wall_seconds", limits.wall_seconds or 0)
            out, err = b"", b""
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await proc.wait()
        cut = 0
        cap = limits.output_bytes
        if cap is not None and len(out) > cap:
            cut, out = len(out) - cap, out[:cap]
        after = _state(self.root)
        files = tuple(sorted(k for k, v in after.items() if before.get(k) != v))
        return ExecResult(
            proc.returncode if proc.returncode is not None else -9,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            time.monotonic() - started,
            truncated_bytes=cut,
            files=files,
            limit=hit,
        )

    async def copy_in(self, source: Path, dest: str) -> None:
        await asyncio.to_thread(copy_tree_or_file, source, self.root / dest)

    async def copy_out(self, source: str, dest: Path) -> None:
        await asyncio.to_thread(copy_tree_or_file, self.root / source, dest)

    async def snapshot(self, step: int) -> Snapshot:
        return Snapshot("unsandboxed", str(self.root), step)

    async def close(self) -> None:
        self.closed = True


class UnsandboxedDirBackend:
    """Makes ``UnsandboxedDir``s and remembers them (tests look at what ran)."""

    name = "unsandboxed-test-double"
    enforces: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.started: list[UnsandboxedDir] = []

    async def start(
        self, settings: SandboxSettings, workspace: Path, *, restore: Snapshot | None = None
    ) -> UnsandboxedDir:
        box = UnsandboxedDir(workspace, settings)
        self.started.append(box)
        return box


@pytest.fixture
def double() -> UnsandboxedDirBackend:
    return UnsandboxedDirBackend()


@pytest.fixture
def open_workspace() -> Iterator[Path]:
    """A workspace the local sandbox can reach: run as root, it drops to an unprivileged uid,
    which cannot enter pytest's root-only temporary directories."""
    path = Path(tempfile.mkdtemp(prefix="loom-sandbox-ws-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
