"""A container backend (Docker or Podman CLI) for the sandbox seam (issue #32 item 2).

Each command runs in a fresh container (``docker run --rm``) over the session's workspace,
mounted at ``/workspace``: no network (``--network none``) unless the setting allows it,
``--memory``, ``--pids-limit``, ``--ulimit cpu``, all capabilities dropped, no new privileges,
a read-only root file system with a ``/tmp`` tmpfs, the host user's uid, and only the
environment the setting names. Files persist between commands through the workspace, so a
session's sandbox is its workspace (``workspace="copy"``: a private copy made at start, files
come back through ``copy_out``). A wall timeout kills the container (``docker kill``), so
nothing it started survives.

Honest limits: this backend cannot filter the network by host (a host list is refused at
start); the workspace's growth (``disk_bytes``) is checked after each command, not prevented;
a memory kill is reported when the container ends with exit code 137 and no timeout. It was
NOT exercised on the machine it was written on (no daemon there): its tests skip, saying so,
when ``docker info`` fails; the command line it builds is tested without a daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from loom.sandbox.base import (
    ExecResult,
    LimitHit,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
    Snapshot,
)

__all__ = ["ContainerBackend", "ContainerSandbox", "container_command", "copy_tree_or_file"]

DEFAULT_IMAGE = "python:3.12-slim"
_OOM_EXIT = 137


def container_command(
    program: str,
    image: str,
    name: str,
    workspace: Path,
    settings: SandboxSettings,
    limits: SandboxLimits,
    command: Sequence[str],
    *,
    cwd: str = ".",
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``docker run`` (or ``podman run``) argv for one command."""
    argv = [program, "run", "--rm", "-i", "--name", name]
    if settings.network == "none":
        argv += ["--network", "none"]
    if limits.memory_bytes is not None:
        argv += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    if limits.processes is not None:
        argv += ["--pids-limit", str(limits.processes)]
    if limits.cpu_seconds is not None:
        seconds = max(1, int(limits.cpu_seconds))
        argv += ["--ulimit", f"cpu={seconds}:{seconds}"]
    argv += [
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,size=64m",
        "--user",
        f"{os.getuid()}:{os.getgid()}",
        "-v",
        f"{workspace}:/workspace:rw",
        "-w",
        str(Path("/workspace") / cwd),
    ]
    for key, value in {**settings.env, **(env or {})}.items():
        argv += ["-e", f"{key}={value}"]
    return [*argv, image, *command]


def copy_tree_or_file(source: Path, target: Path) -> None:
    """Copy ``source`` (a file, or a directory merged into ``target``) to ``target``."""
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def _state(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for folder, _, files in os.walk(root):
        for file in files:
            path = Path(folder) / file
            with contextlib.suppress(OSError):
                st = path.lstat()
                out[str(path.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


class ContainerSandbox:
    """A session's container sandbox: its workspace plus one container per command."""

    def __init__(
        self, backend: ContainerBackend, settings: SandboxSettings, workspace: Path, copy: bool
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.workspace = workspace
        self._copy = copy
        self._running: set[str] = set()
        self._closed = False

    async def run(
        self,
        command: Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecResult:
        """Run ``command`` in a new container over the workspace (see the module docstring)."""
        if self._closed:
            raise SandboxError("this container sandbox is closed")
        limits = limits or self.settings.limits
        name = f"loom-{secrets.token_hex(6)}"
        argv = container_command(
            self.backend.program,
            self.backend.image,
            name,
            self.workspace,
            self.settings,
            limits,
            command,
            cwd=cwd,
            env=env,
        )
        before = _state(self.workspace)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._running.add(name)
        hit: LimitHit | None = None
        out = err = b""
        try:
            async with asyncio.timeout(limits.wall_seconds):
                out, err = await proc.communicate(stdin or b"")
        except TimeoutError:
            hit = LimitHit("wall_seconds", limits.wall_seconds or 0)
            await self.backend.kill(name)
            with contextlib.suppress(Exception):
                await proc.wait()
        finally:
            self._running.discard(name)
        code = proc.returncode if proc.returncode is not None else -9
        if hit is None and code == _OOM_EXIT and limits.memory_bytes is not None:
            hit = LimitHit("memory_bytes", limits.memory_bytes)
        cut = 0
        if limits.output_bytes is not None and len(out) + len(err) > limits.output_bytes:
            keep = limits.output_bytes
            cut = len(out) + len(err) - keep
            out, err = out[:keep], err[: max(0, keep - len(out))]
        after = _state(self.workspace)
        if hit is None and limits.disk_bytes is not None:
            grown = sum(v[1] for v in after.values()) - sum(v[1] for v in before.values())
            if grown > limits.disk_bytes:
                hit = LimitHit("disk_bytes", limits.disk_bytes)
        return ExecResult(
            code,
            out.decode("utf-8", errors="replace"),
            err.decode("utf-8", errors="replace"),
            time.monotonic() - started,
            truncated_bytes=cut,
            files=tuple(sorted(k for k, v in after.items() if before.get(k) != v)),
            limit=hit,
        )

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host file or directory into the workspace."""
        await asyncio.to_thread(copy_tree_or_file, source, self.workspace / dest)

    async def copy_out(self, source: str, dest: Path) -> None:
        """Copy a workspace file or directory to the host."""
        await asyncio.to_thread(copy_tree_or_file, self.workspace / source, dest)

    async def snapshot(self, step: int) -> Snapshot:
        """The workspace directory names the snapshot (the session pool archives it)."""
        return Snapshot(self.backend.name, str(self.workspace), step)

    async def close(self) -> None:
        """Kill the containers still running; drop the private copy (``workspace="copy"``)."""
        if self._closed:
            return
        self._closed = True
        for name in list(self._running):
            await self.backend.kill(name)
        if self._copy:
            shutil.rmtree(self.workspace, ignore_errors=True)


class ContainerBackend:
    """Docker or Podman through its CLI (``program``), running ``image``."""

    enforces = frozenset(
        {
            "network:none",
            "network:all",
            "memory_bytes",
            "processes",
            "cpu_seconds",
            "wall_seconds",
            "output_bytes",
            "disk_bytes:after",
        }
    )

    def __init__(self, program: str = "docker", image: str = DEFAULT_IMAGE) -> None:
        self.program = program
        self.image = image
        self.name = program

    async def available(self) -> str | None:
        """None when the daemon answers, else why not (for the error and for test skips)."""
        if shutil.which(self.program) is None:
            return f"{self.program} is not installed"
        proc = await asyncio.create_subprocess_exec(
            self.program, "info", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            first = err.decode(errors="replace").strip().splitlines()
            return f"`{self.program} info` failed: {first[0] if first else proc.returncode}"
        return None

    async def start(
        self, settings: SandboxSettings, workspace: Path, *, restore: Snapshot | None = None
    ) -> ContainerSandbox:
        """A sandbox over ``workspace``; ``SandboxUnavailable`` when the daemon does not answer
        or the setting asks for what containers here cannot do (a network host list)."""
        if isinstance(settings.network, tuple):
            raise SandboxUnavailable(
                f"the {self.program} backend cannot limit the network to listed hosts; use "
                "network: none or all"
            )
        why = await self.available()
        if why is not None:
            raise SandboxUnavailable(
                f"the {self.program} sandbox backend cannot run: {why}. Start the daemon, or "
                "use backend: local (bubblewrap)"
            )
        copy = settings.workspace == "copy"
        root = workspace
        if copy:
            root = Path(tempfile.mkdtemp(prefix="loom-container-ws-"))
            await asyncio.to_thread(shutil.copytree, workspace, root, dirs_exist_ok=True)
        if restore is not None and restore.ref != str(root):
            await asyncio.to_thread(copy_tree_or_file, Path(restore.ref), root)
        return ContainerSandbox(self, settings, root, copy)

    async def kill(self, name: str) -> None:
        """Kill a container by name (ignoring one already gone)."""
        proc = await asyncio.create_subprocess_exec(
            self.program,
            "kill",
            name,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await proc.wait()
