"""Workspace snapshots of sandboxes, taken after committed steps (issue #32 item 3).

A snapshot is a tar archive of the workspace stored by content hash under
``<directory>/<session>/<sha256>.tar``; ``index.json`` beside them lists the session's
snapshots oldest first (at most ``keep``; archives no entry names are deleted). ``restore``
makes a directory hold exactly what the newest snapshot holds, so a run resumed after a crash
finds the files as they were when its last step was committed, and nothing a lost step wrote.

The index is replaced atomically (write, fsync, rename) after the archive is on disk: a crash
while snapshotting leaves the previous snapshot as the newest one.

A runtime keeps these under its sandbox directory (``<dir>/snapshots/``, beside the private
workspaces in ``<dir>/workspaces/``), by default beside a store file (``default_sandbox_dir``).
Deleting a session (``loom sessions delete``, a server's thread delete, the TTL ``sessions``
job, ``forget_owner``) removes both with ``drop_session_snapshots``: a session's files do not
outlive it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from loom.sandbox.base import SandboxError

__all__ = [
    "SnapshotRecord",
    "WorkspaceSnapshots",
    "default_sandbox_dir",
    "drop_session_snapshots",
    "session_folder_name",
]

_SAFE_SESSION = re.compile(r"[^A-Za-z0-9_.-]")


def session_folder_name(session_id: str) -> str:
    """The folder a session's snapshots and private workspace live in: its id made safe for a
    file name (at most 64 characters) and a digest of the exact id, so two ids that read the
    same once made safe ("a~b", "a_b") never share a folder (nor each other's files)."""
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_SAFE_SESSION.sub('_', session_id)[:64]}-{digest}"


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """One stored snapshot: its step counter (per session, increasing) and archive hash."""

    step: int
    digest: str


class WorkspaceSnapshots:
    """Snapshots of session workspaces under ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep

    def _session_dir(self, session_id: str) -> Path:
        return self.directory / session_folder_name(session_id)

    def records(self, session_id: str) -> list[SnapshotRecord]:
        """The session's snapshots, oldest first (empty when it has none)."""
        index = self._session_dir(session_id) / "index.json"
        try:
            rows = json.loads(index.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise SandboxError(f"the snapshot index {index} cannot be read: {exc}") from exc
        return [SnapshotRecord(int(r["step"]), str(r["digest"])) for r in rows]

    def latest(self, session_id: str) -> SnapshotRecord | None:
        """The newest snapshot of the session, or None."""
        rows = self.records(session_id)
        return rows[-1] if rows else None

    def take(self, session_id: str, workspace: Path) -> SnapshotRecord:
        """Archive ``workspace`` as the session's newest snapshot; prune beyond ``keep``."""
        folder = self._session_dir(session_id)
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=folder, suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
                for entry in sorted(os.listdir(workspace)):
                    tar.add(workspace / entry, arcname=entry)
            digest = _sha256(tmp)
            target = folder / f"{digest}.tar"
            if target.exists():
                tmp.unlink()
            else:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                tmp.replace(target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        rows = self.records(session_id)
        record = SnapshotRecord((rows[-1].step + 1) if rows else 1, digest)
        rows = [*rows, record][-self.keep :]
        self._write_index(folder, rows)
        named = {f"{r.digest}.tar" for r in rows}
        for old in folder.glob("*.tar"):
            if old.name not in named:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()
        return record

    def restore(self, session_id: str, workspace: Path) -> SnapshotRecord | None:
        """Make ``workspace`` hold exactly the newest snapshot (None: no snapshot, untouched)."""
        record = self.latest(session_id)
        if record is None:
            return None
        archive = self._session_dir(session_id) / f"{record.digest}.tar"
        if not archive.exists():
            raise SandboxError(
                f"snapshot {record.step} of session {session_id!r} is missing ({archive}); "
                "delete the session's index.json to start from the workspace as it is"
            )
        workspace.mkdir(parents=True, exist_ok=True)
        for entry in os.listdir(workspace):
            path = workspace / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if not hasattr(tarfile, "data_filter"):
            raise SandboxError(
                "restoring a sandbox snapshot needs Python 3.11.4 or later (tarfile's "
                "extraction filters refuse links out of the workspace); upgrade Python"
            )
        with tarfile.open(archive) as tar:
            tar.extractall(workspace, filter=_safe_member)
        return record

    def drop(self, session_id: str) -> None:
        """Forget every snapshot of the session."""
        shutil.rmtree(self._session_dir(session_id), ignore_errors=True)

    @staticmethod
    def _write_index(folder: Path, rows: list[SnapshotRecord]) -> None:
        fd, tmp_name = tempfile.mkstemp(dir=folder, suffix=".json.part")
        with os.fdopen(fd, "w") as f:
            json.dump([{"step": r.step, "digest": r.digest} for r in rows], f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, folder / "index.json")


def _safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, skipping (not failing on) what it refuses: absolute names,
    links out of the workspace, device files. The archive holds what an agent's code wrote,
    and one such entry must not make the whole workspace unrestorable."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def default_sandbox_dir(store: object) -> Path | None:
    """The sandbox directory a runtime uses by default for ``store``: ``<file>.sandboxes``
    beside a file-backed store (one with a ``path``, e.g. ``loom.db.sandboxes``); None for an
    in-memory store or one without a file (its runtime uses a temporary directory)."""
    path = getattr(store, "path", None)
    if not isinstance(path, str) or path in ("", ":memory:"):
        return None
    return Path(path + ".sandboxes")


def drop_session_snapshots(sandbox_dir: Path | None, session_id: str) -> bool:
    """Remove what a deleted session left under ``sandbox_dir``: its workspace snapshots
    (``snapshots/<session>/``) and its private workspace (``workspaces/<session>/``, made for
    agents without a workspace of their own). True when something was removed; a missing
    directory (None, or a session that never ran a sandbox) is no error."""
    if sandbox_dir is None:
        return False
    name = session_folder_name(session_id)
    removed = False
    for folder in (sandbox_dir / "snapshots" / name, sandbox_dir / "workspaces" / name):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
            removed = True
    return removed
