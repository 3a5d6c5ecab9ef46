"""Sandboxes that live as long as a session (or a run), and the agent's ``sandbox:`` setting.

``AgentSandbox`` is what ``Agent(sandbox=..., python_unsandboxed=...)`` keeps: whether
``bash`` runs sandboxed (off unless set: ``bash`` keeps running on the host), whether the
``python`` tool may run at all (always sandboxed unless the agent says ``sandbox: false`` and
``python_unsandboxed: true``) and the ``SandboxSettings``.

``SandboxPool`` is the runtime's registry of live sandboxes, keyed by session (or by run, with
``lifetime="run"``). A sandbox is started on the first call that needs it and closed when its
run ends (``lifetime="run"``), when it has been idle for ``idle_seconds``, when the session is
closed (``close_session``) or when the runtime shuts down (``aclose``). After each committed
step in which a sandboxed command ran, the pool snapshots the workspace
(``loom.sandbox.snapshots``); a sandbox started for a session that has snapshots (a new
process after a crash, or after an idle close) first restores the newest one, so the files are
as they were when the last step was committed.

``SandboxAccess`` is what a tool sees (``RunContext.sandbox``): the setting and ``use()``, the
sandbox of the call's session for the duration of one command.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from loom.errors import AgentDefinitionError
from loom.sandbox.base import (
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
)
from loom.sandbox.snapshots import WorkspaceSnapshots, session_folder_name

__all__ = [
    "AgentSandbox",
    "SandboxAccess",
    "SandboxPool",
    "agent_sandbox",
    "backend_named",
]

log = logging.getLogger("loom.sandbox")


@dataclass(frozen=True, slots=True)
class AgentSandbox:
    """An agent's sandbox setting. ``enabled``: ``True`` / ``False`` as the agent set it,
    ``None`` when it did not (then ``bash`` runs on the host and ``python`` sandboxed)."""

    enabled: bool | None = None
    settings: SandboxSettings = field(default_factory=SandboxSettings)
    python_unsandboxed: bool = False
    in_use: bool = False
    """Whether one of the agent's tools runs sandboxed under this setting (the runtime makes
    sandboxes, and snapshots, only for such agents)."""

    @property
    def bash_sandboxed(self) -> bool:
        """Whether ``bash`` runs in the sandbox (only when the agent turned it on)."""
        return self.enabled is True

    @property
    def python_allowed_on_host(self) -> bool:
        """Whether ``python`` may run on the host: only with ``sandbox: false`` and
        ``python_unsandboxed: true`` both set."""
        return self.enabled is False and self.python_unsandboxed


def agent_sandbox(value: object, python_unsandboxed: object = False) -> AgentSandbox:
    """Parse ``Agent(sandbox=...)``: ``None`` (unset), ``True`` / ``False``, a
    ``SandboxSettings`` (on), or a mapping of its fields as an agent file writes them
    (``{"network": "none", "limits": {"memory_bytes": 268435456}}``: on)."""
    if not isinstance(python_unsandboxed, bool):
        raise AgentDefinitionError(
            f"must be true or false, got {python_unsandboxed!r}", field="python_unsandboxed"
        )
    if value is None or isinstance(value, bool):
        return AgentSandbox(value, SandboxSettings(), python_unsandboxed)
    if isinstance(value, SandboxSettings):
        return AgentSandbox(True, value, python_unsandboxed)
    if isinstance(value, Mapping):
        return AgentSandbox(True, _settings_of(value), python_unsandboxed)
    raise AgentDefinitionError(
        "must be true, false, a loom.sandbox.SandboxSettings or a mapping of its fields, "
        f"got {type(value).__name__}",
        field="sandbox",
    )


def _settings_of(raw: Mapping[Any, Any]) -> SandboxSettings:
    known = {f.name for f in fields(SandboxSettings)}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise AgentDefinitionError(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            field="sandbox",
        )
    values = dict(raw)
    try:
        if isinstance(values.get("limits"), Mapping):
            values["limits"] = SandboxLimits(**values["limits"])
        if isinstance(values.get("network"), list):
            values["network"] = tuple(str(h) for h in values["network"])
        settings = SandboxSettings(**values)
    except TypeError as exc:
        raise AgentDefinitionError(str(exc), field="sandbox") from None
    if settings.network not in ("none", "all") and not isinstance(settings.network, tuple):
        raise AgentDefinitionError(
            f"network must be 'none', 'all' or a list of host names, got {settings.network!r}",
            field="sandbox",
        )
    for name, value, allowed in (
        ("workspace", settings.workspace, ("bind", "copy")),
        ("lifetime", settings.lifetime, ("session", "run")),
    ):
        if value not in allowed:
            raise AgentDefinitionError(
                f"{name} must be one of {', '.join(allowed)}, got {value!r}", field="sandbox"
            )
    if not isinstance(settings.keep_snapshots, int) or settings.keep_snapshots < 1:
        raise AgentDefinitionError("keep_snapshots must be at least 1", field="sandbox")
    return settings


def backend_named(backend: str | SandboxBackend) -> SandboxBackend:
    """The backend a setting names: ``"local"`` (bubblewrap, ``loom.sandbox.local``),
    ``"docker"`` or ``"podman"`` (``loom.sandbox.container``), or the object itself."""
    if not isinstance(backend, str):
        return backend
    if backend in ("docker", "podman"):
        from loom.sandbox.container import ContainerBackend

        return ContainerBackend(program=backend)
    if backend == "local":
        try:
            module = importlib.import_module("loom.sandbox.local")
        except ImportError:
            raise SandboxUnavailable(
                "the local (bubblewrap) sandbox backend is not part of this build of Loom; "
                "use backend: docker or podman, or pass a SandboxBackend"
            ) from None
        for name in ("LocalSandbox", "LocalBackend"):
            made = getattr(module, name, None)
            if made is not None:
                found: SandboxBackend = made()
                return found
        raise SandboxUnavailable("loom.sandbox.local defines no backend class")
    raise SandboxUnavailable(
        f"unknown sandbox backend {backend!r}; use 'local', 'docker', 'podman' or a "
        "SandboxBackend object"
    )


@dataclass(slots=True)
class _Live:
    sandbox: Sandbox
    settings: SandboxSettings
    session_id: str
    run_id: str | None
    workspace: Path
    last_used: float
    in_flight: int = 0
    dirty: bool = False


class SandboxPool:
    """The runtime's live sandboxes and their snapshots (see the module docstring).

    ``directory`` holds the snapshots (``snapshots/``) and the workspaces of agents that have
    none (``workspaces/<session>``)."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self._live: dict[str, _Live] = {}
        self._lock = asyncio.Lock()
        self.snapshots_taken = 0

    def snapshots(self, settings: SandboxSettings) -> WorkspaceSnapshots:
        """The snapshot store for sandboxes with ``settings``."""
        return WorkspaceSnapshots(self.directory / "snapshots", keep=settings.keep_snapshots)

    def workspace_for(self, session_id: str, agent_workspace: Path | None) -> Path:
        """Where a session's sandbox works: the agent's workspace, else a private folder."""
        if agent_workspace is not None:
            return agent_workspace
        folder = self.directory / "workspaces"
        folder.mkdir(parents=True, exist_ok=True)
        # traversable, not listable, by others: a backend run as root drops to another uid
        # (the local one chowns the workspace to it), which must reach the workspace
        folder.chmod(0o711)
        path = folder / session_folder_name(session_id)
        path.mkdir(exist_ok=True)
        return path

    @staticmethod
    def _key(settings: SandboxSettings, session_id: str, run_id: str) -> str:
        return f"run:{run_id}" if settings.lifetime == "run" else f"session:{session_id}"

    async def _acquire(
        self, settings: SandboxSettings, session_id: str, run_id: str, workspace: Path | None
    ) -> _Live:
        await self.sweep()
        key = self._key(settings, session_id, run_id)
        async with self._lock:
            live = self._live.get(key)
            if live is None:
                live = await self._start(settings, session_id, run_id, workspace)
                self._live[key] = live
            live.in_flight += 1
            live.last_used = self.clock()
            return live

    async def _start(
        self, settings: SandboxSettings, session_id: str, run_id: str, workspace: Path | None
    ) -> _Live:
        root = self.workspace_for(session_id, workspace)
        snaps = self.snapshots(settings)
        backend = backend_named(settings.backend)
        if settings.workspace == "bind":
            snaps.restore(session_id, root)
            sandbox = await backend.start(settings, root)
        else:
            sandbox = await backend.start(settings, root)
            if snaps.latest(session_id) is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    snaps.restore(session_id, Path(tmp))
                    for entry in await asyncio.to_thread(os.listdir, tmp):
                        await sandbox.copy_in(Path(tmp) / entry, entry)
        run = run_id if settings.lifetime == "run" else None
        return _Live(sandbox, settings, session_id, run, root, self.clock())

    @contextlib.asynccontextmanager
    async def use(
        self, settings: SandboxSettings, session_id: str, run_id: str, workspace: Path | None
    ) -> AsyncIterator[Sandbox]:
        """The sandbox for one command of ``session_id``'s run ``run_id`` (started, or restored
        from its newest snapshot, when it has none live); the workspace is snapshotted after
        the next committed step."""
        live = await self._acquire(settings, session_id, run_id, workspace)
        try:
            yield live.sandbox
        finally:
            live.dirty = True
            live.in_flight -= 1
            live.last_used = self.clock()

    async def committed(self, session_id: str) -> None:
        """A step of ``session_id`` was committed: snapshot its sandboxes that ran something
        since their last snapshot. One with a command still running is left dirty for the next
        commit (its files are half-written)."""
        for live in list(self._live.values()):
            if live.session_id != session_id or not live.dirty or live.in_flight:
                continue
            live.dirty = False
            try:
                await self._snapshot(live)
            except (OSError, SandboxError) as exc:
                # the step is committed either way; the run goes on, and the next commit
                # tries again (until then a crash restores an older snapshot)
                live.dirty = True
                log.warning("sandbox snapshot of session %s failed: %s", session_id, exc)

    async def _snapshot(self, live: _Live) -> None:
        snaps = self.snapshots(live.settings)
        if live.settings.workspace == "bind":
            await asyncio.to_thread(snaps.take, live.session_id, live.workspace)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                await live.sandbox.copy_out(".", Path(tmp) / "ws")
                await asyncio.to_thread(snaps.take, live.session_id, Path(tmp) / "ws")
        self.snapshots_taken += 1

    async def run_ended(self, run_id: str) -> None:
        """Close the sandbox of a run with ``lifetime="run"``."""
        live = self._live.pop(f"run:{run_id}", None)
        if live is not None:
            await live.sandbox.close()

    async def close_session(self, session_id: str, *, forget: bool = False) -> None:
        """Close the session's sandboxes (``forget``: also drop its snapshots)."""
        for key, live in list(self._live.items()):
            if live.session_id == session_id:
                del self._live[key]
                await live.sandbox.close()
                if forget:
                    self.snapshots(live.settings).drop(session_id)

    async def sweep(self) -> None:
        """Close sandboxes idle longer than their ``idle_seconds``."""
        now = self.clock()
        for key, live in list(self._live.items()):
            idle = live.settings.idle_seconds
            if idle is not None and not live.in_flight and now - live.last_used >= idle:
                del self._live[key]
                if live.dirty:
                    # its last command's step may not be committed: no snapshot of it
                    live.dirty = False
                await live.sandbox.close()

    def live_sessions(self) -> list[str]:
        """Sessions with a live sandbox (for tests and diagnostics)."""
        return [live.session_id for live in self._live.values()]

    async def aclose(self) -> None:
        """Close every sandbox (the runtime is shutting down)."""
        lives, self._live = list(self._live.values()), {}
        for live in lives:
            await live.sandbox.close()


class SandboxAccess:
    """What a tool sees of the sandbox (``RunContext.sandbox``)."""

    __slots__ = ("pool", "run_id", "session_id", "setting", "workspace")

    def __init__(
        self,
        pool: SandboxPool | None,
        setting: AgentSandbox,
        session_id: str,
        run_id: str,
        workspace: Path | None,
    ) -> None:
        self.pool = pool
        self.setting = setting
        self.session_id = session_id
        self.run_id = run_id
        self.workspace = workspace

    def use(self) -> contextlib.AbstractAsyncContextManager[Sandbox]:
        """The call's session sandbox for one command (pass limits to its ``run``)."""
        if self.pool is None:
            raise SandboxUnavailable("this run has no sandbox pool (run it through a Runtime)")
        return self.pool.use(self.setting.settings, self.session_id, self.run_id, self.workspace)

    def with_settings(self, **changes: Any) -> SandboxAccess:
        """A copy with some settings changed (tests, per-tool overrides)."""
        setting = replace(self.setting, settings=replace(self.setting.settings, **changes))
        return SandboxAccess(self.pool, setting, self.session_id, self.run_id, self.workspace)


def scratch_directory() -> Path:
    """A private directory for a runtime whose store keeps nothing on disk (traversable by a
    sandbox's uid, not listable by other users)."""
    path = Path(tempfile.mkdtemp(prefix="loom-sandboxes-"))
    path.chmod(0o711)
    return path


def remove_directory(path: Path) -> None:
    """Remove a scratch directory made by ``scratch_directory``."""
    shutil.rmtree(path, ignore_errors=True)
