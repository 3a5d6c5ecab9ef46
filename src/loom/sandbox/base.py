"""The sandbox seam (issue #32): where agent-generated code runs without reaching the host.

A ``SandboxBackend`` starts a ``Sandbox`` for one workspace; a sandbox runs commands in it
(``run``), moves files in and out (``copy_in`` / ``copy_out``), records its workspace
(``snapshot``, restored by ``SandboxBackend.start(..., restore=...)`` after a crash) and is
closed with everything it started (``close``). Backends: the local one (Linux namespaces
through ``bubblewrap``), containers (Docker / Podman), remote services; each declares what it
enforces (``SandboxBackend.enforces``) so a setting it cannot honour is refused when the
sandbox starts, never silently ignored.

What a command did is data (``ExecResult``): a limit it hit is ``ExecResult.limit`` (which
limit, its value), not an exception, because the model can change its code. What raises is what
the programmer must fix: ``SandboxUnavailable`` (the backend cannot run here: bubblewrap
missing, namespaces refused; says how to install or configure) and ``SandboxError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from loom.errors import ConfigurationError, LoomError

__all__ = [
    "ExecResult",
    "LimitHit",
    "LimitName",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxLimits",
    "SandboxSettings",
    "SandboxUnavailable",
    "Snapshot",
]

LimitName = Literal[
    "cpu_seconds", "memory_bytes", "processes", "output_bytes", "disk_bytes", "wall_seconds"
]


class SandboxError(LoomError):
    """A sandbox could not be started, used or cleaned up (the message says which step)."""


class SandboxUnavailable(SandboxError, ConfigurationError):
    """The backend cannot run on this host (a missing program, namespaces refused, a setting
    it cannot enforce): the message says what to install or change."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What one command may use. ``None``: no limit of that kind (not advised)."""

    cpu_seconds: float | None = 30.0
    memory_bytes: int | None = 512 * 1024 * 1024
    processes: int | None = 64
    output_bytes: int | None = 1024 * 1024  # stdout + stderr kept; the rest is cut and counted
    disk_bytes: int | None = 256 * 1024 * 1024  # what the workspace may grow by
    wall_seconds: float | None = 60.0  # then the whole process tree is killed


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """How a sandbox is made. ``network``: ``"none"`` (no interface but loopback), ``"all"``,
    or a list of host names reachable (backends that cannot filter refuse a list).
    ``workspace``: ``"bind"`` (the workspace itself, read-write) or ``"copy"`` (a copy; files
    come back only through ``copy_out``). ``env``: the variables the command gets (nothing of
    the host's environment passes unless named here). ``lifetime``: one sandbox per session
    (files persist between calls) or per run."""

    network: Literal["none", "all"] | tuple[str, ...] = "none"
    workspace: Literal["bind", "copy"] = "bind"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: Mapping[str, str] = field(default_factory=dict)
    lifetime: Literal["session", "run"] = "session"
    backend: str | SandboxBackend = "local"
    """Which backend makes it: ``"local"`` (bubblewrap), ``"docker"`` / ``"podman"``
    (``loom.sandbox.container``), or a ``SandboxBackend`` object."""
    idle_seconds: float | None = 900.0
    """A session's sandbox unused this long is closed (made again, from its last snapshot,
    on the next call)."""
    keep_snapshots: int = 3
    """Workspace snapshots kept per session (older ones are pruned)."""


@dataclass(frozen=True, slots=True)
class LimitHit:
    """A limit a command ran into: which, and its value (bytes, seconds or processes)."""

    limit: LimitName
    value: float

    def describe(self) -> str:
        """For the model: what was hit and what to do."""
        return f"the sandbox's {self.limit} limit ({self.value:g}) was reached"


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a command did. ``stdout`` / ``stderr`` are cut at the output limit
    (``truncated_bytes`` says how much was dropped); ``files`` are workspace paths created or
    changed; ``limit`` is the limit that stopped it, if one did."""

    exit_code: int
    stdout: str
    stderr: str
    duration: float
    truncated_bytes: int = 0
    files: tuple[str, ...] = ()
    limit: LimitHit | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A workspace recorded at a committed step: ``ref`` names it to the backend that made it
    (a directory, an archive, an image id)."""

    backend: str
    ref: str
    step: int


@runtime_checkable
class Sandbox(Protocol):
    """One running sandbox over one workspace."""

    async def run(
        self,
        command: Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecResult:
        """Run ``command`` (argv) inside; ``cwd`` is relative to the workspace. Never raises
        for what the command does (a non-zero exit, a limit): that is the result."""
        ...

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host file or directory into the workspace at ``dest`` (relative)."""
        ...

    async def copy_out(self, source: str, dest: Path) -> None:
        """Copy a workspace file or directory (relative ``source``) to the host."""
        ...

    async def snapshot(self, step: int) -> Snapshot:
        """Record the workspace as it is now (called after each committed step)."""
        ...

    async def close(self) -> None:
        """Stop every process it started and free what it holds; idempotent."""
        ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Makes sandboxes. ``enforces`` lists the settings it can honour (e.g. ``"network:hosts"``,
    ``"memory_bytes"``); ``start`` refuses others with ``SandboxUnavailable``."""

    name: str
    enforces: frozenset[str]

    async def start(
        self, settings: SandboxSettings, workspace: Path, *, restore: Snapshot | None = None
    ) -> Sandbox:
        """A sandbox over ``workspace`` (restored from ``restore`` first, when given)."""
        ...
