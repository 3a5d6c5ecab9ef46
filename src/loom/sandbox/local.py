"""The local sandbox (issue #32): Linux namespaces through ``bubblewrap``, no daemon.

Every ``run`` is one ``bwrap`` process with fresh user, mount, PID, IPC, UTS, cgroup and
(unless ``network="all"``) network namespaces. Inside, the command runs as an unprivileged
uid/gid (65534) with every capability dropped, in a file system made of the host's system
directories read-only (``/usr`` and the ``/bin``, ``/lib*``, ``/sbin`` links or binds), a
minimal ``/etc`` (a few read-only host files and a generated ``passwd`` / ``group`` /
``hosts``), a fresh ``/proc`` of its own PID namespace, a minimal ``/dev``, a private
size-limited ``/tmp`` and the workspace at ``/workspace``. Nothing else of the host is there:
no ``/root``, ``/home``, host ``/tmp``, ``/sys``, ``/run``, ``/etc/shadow``.

Limits are set by ``prlimit`` inside, before the command is executed: ``RLIMIT_CPU``,
``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE`` and ``RLIMIT_CORE=0``. ``RLIMIT_NPROC``
counts the processes of the *host* uid the sandbox maps to, so when Loom runs as root the
sandbox runs as a dedicated host uid (``sandbox_uid``, by default one of 61000-61999), which
makes the count the sandbox's own. The output limit is enforced here, reading the pipes as
they fill and killing the sandbox at the limit; the wall timeout kills ``bwrap``, whose PID
namespace init dies with it (``--die-with-parent``), which kills every process inside,
daemonised or not.

How a limit is recognised (no cgroup is available to ask): wall and output are ours; CPU by
``SIGXCPU`` (or ``SIGKILL`` after CPU use reached the hard limit); file size by ``SIGXFSZ``;
disk (``copy`` mode) by ``ENOSPC`` on the size-limited workspace, or by the workspace's growth
when no size-limited mount could be made; memory and processes by the errors the command
reports when an allocation or a ``fork`` is refused (``MemoryError``, ``Cannot allocate
memory``, ``Resource temporarily unavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import itertools
import json
import os
import platform
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from loom.sandbox.base import (
    ExecResult,
    LimitHit,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
    Snapshot,
)

__all__ = [
    "SANDBOX_WORKSPACE",
    "BubblewrapSandbox",
    "LocalSandbox",
    "bubblewrap_available",
    "seccomp_program",
]

SANDBOX_WORKSPACE = "/workspace"
"""Where the workspace is mounted inside the sandbox (and the commands' default cwd)."""

_INSIDE_ID = 65534  # nobody/nogroup: the uid and gid a command has inside
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_UID_POOL = range(61000, 62000)
_uid_counter = itertools.count()

# Host /etc files a program commonly needs and that hold no secret (read-only).
_ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "nsswitch.conf",
    "ssl",
    "ca-certificates",
    "mime.types",
    "protocols",
    "services",
    "debian_version",
    "os-release",
)
_NETWORK_ETC_FILES = ("resolv.conf", "gai.conf", "host.conf")
_SYSTEM_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_FILES_SCAN_LIMIT = 10000  # workspace entries compared per run for ExecResult.files
_READ_CHUNK = 65536

# Signals a command's exit shows, as bwrap reports them (128 + signal number).
_SIGNAL_EXIT_BASE = 128

_MEMORY_MARKERS = (
    "MemoryError",
    "Cannot allocate memory",
    "out of memory",
    "std::bad_alloc",
    "cannot allocate",
)
_PROCESS_MARKERS = ("Resource temporarily unavailable", "fork: retry", "Cannot fork", "can't fork")
_DISK_MARKERS = ("No space left on device", "File too large", "Disk quota exceeded")

_ENFORCES = frozenset(
    {
        "network:none",
        "network:all",
        "workspace:bind",
        "workspace:copy",
        "cpu_seconds",
        "memory_bytes",
        "processes",
        "output_bytes",
        "disk_bytes",
        "wall_seconds",
    }
)


def bubblewrap_available(bwrap: str = "bwrap", *, as_uid: int | None = None) -> str | None:
    """Why the local sandbox cannot run here (``None`` when it can): ``bwrap`` missing, or
    user namespaces refused by the kernel. When Loom runs as root the probe runs as
    ``as_uid`` (by default a sandbox uid), as sandboxes will: unprivileged user namespaces
    may be refused to it when they are allowed to root."""
    if as_uid is None and os.getuid() == 0:
        as_uid = _UID_POOL[-1]
    path = shutil.which(bwrap)
    if path is None:
        return (
            "bubblewrap is not installed: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap; Fedora: dnf install bubblewrap)"
        )
    probe = [path, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--", "/bin/true"]
    try:
        done = subprocess.run(
            probe,
            capture_output=True,
            timeout=30,
            check=False,
            user=as_uid,
            group=as_uid,
            extra_groups=[] if as_uid is not None else None,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap could not be started ({error})"
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        return (
            f"bubblewrap cannot create namespaces here ({message or done.returncode}): allow "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
            "user.max_user_namespaces > 0) or run in a container that permits them"
        )
    return None


class LocalSandbox:
    """The local backend: a ``bubblewrap`` sandbox per ``run`` over one workspace.

    ``snapshot_dir`` keeps the workspace snapshots (a private temporary directory when not
    given). ``sandbox_uid``: the host uid a sandbox runs as when Loom runs as root (a
    non-root Loom runs it as itself); by default a uid of 61000-61999 per sandbox, so that
    the process limit counts only that sandbox's processes. ``extra_ro_paths``: host paths
    made visible read-only at the same place (an interpreter outside ``/usr``, say)."""

    name = "local"
    enforces: frozenset[str] = _ENFORCES

    def __init__(
        self,
        *,
        bwrap: str = "bwrap",
        snapshot_dir: Path | None = None,
        sandbox_uid: int | None = None,
        extra_ro_paths: Sequence[Path] = (),
    ) -> None:
        self._bwrap = bwrap
        self._snapshot_dir = snapshot_dir
        self._sandbox_uid = sandbox_uid
        self._extra_ro_paths = tuple(Path(path) for path in extra_ro_paths)
        self._checked: str | None = None

    async def start(
        self, settings: SandboxSettings, workspace: Path, *, restore: Snapshot | None = None
    ) -> BubblewrapSandbox:
        """A sandbox over ``workspace`` (restored from ``restore`` first, when given).

        Raises ``SandboxUnavailable`` when bubblewrap cannot run here or a setting cannot be
        enforced (a list of network hosts: this backend cannot filter by host)."""
        if not isinstance(settings.network, str):
            raise SandboxUnavailable(
                "the local sandbox cannot limit the network to a list of hosts "
                f"({', '.join(settings.network)}): use network='none' or 'all', or a backend "
                "whose `enforces` includes 'network:hosts'"
            )
        if settings.network not in ("none", "all"):
            raise SandboxUnavailable(
                f"unknown network setting {settings.network!r}: use 'none', 'all' or a host list"
            )
        if settings.workspace not in ("bind", "copy"):
            raise SandboxUnavailable(
                f"unknown workspace setting {settings.workspace!r}: use 'bind' or 'copy'"
            )
        bwrap_path = shutil.which(self._bwrap)
        if bwrap_path is None or self._checked is None:
            reason = await asyncio.to_thread(
                bubblewrap_available, self._bwrap, as_uid=self._sandbox_uid
            )
            if reason is not None:
                raise SandboxUnavailable(reason)
            bwrap_path = shutil.which(self._bwrap)
            assert bwrap_path is not None
            self._checked = bwrap_path
        workspace = await asyncio.to_thread(Path(workspace).resolve)
        if restore is None and not await asyncio.to_thread(workspace.is_dir):
            raise SandboxError(f"the workspace {workspace} is not a directory: create it first")
        if restore is not None and restore.backend != self.name:
            raise SandboxError(
                f"snapshot {restore.ref!r} was made by backend {restore.backend!r}, "
                f"not {self.name!r}: restore it with that backend"
            )
        host_uid = os.getuid()
        run_uid: int | None = None
        if host_uid == 0:
            run_uid = (
                self._sandbox_uid
                if self._sandbox_uid is not None
                else _UID_POOL[next(_uid_counter) % len(_UID_POOL)]
            )
        snapshot_root = self._snapshot_dir or Path(tempfile.gettempdir()) / "loom-sandbox-snapshots"
        sandbox = BubblewrapSandbox(
            bwrap=self._checked,
            settings=settings,
            workspace=workspace,
            run_uid=run_uid,
            snapshot_root=snapshot_root,
            extra_ro_paths=self._extra_ro_paths,
        )
        await asyncio.to_thread(sandbox.set_up, restore)
        return sandbox


@dataclass(frozen=True, slots=True)
class _FileState:
    size: int
    mtime_ns: int
    inode: int


class BubblewrapSandbox(Sandbox):
    """One local sandbox over one workspace (made by ``LocalSandbox.start``)."""

    def __init__(
        self,
        *,
        bwrap: str,
        settings: SandboxSettings,
        workspace: Path,
        run_uid: int | None,
        snapshot_root: Path,
        extra_ro_paths: tuple[Path, ...],
    ) -> None:
        self._bwrap = bwrap
        self.settings = settings
        self.workspace = workspace
        self._run_uid = run_uid
        self._snapshot_root = snapshot_root
        self._extra_ro_paths = extra_ro_paths
        self._id = uuid.uuid4().hex[:12]
        self._private = Path(tempfile.mkdtemp(prefix="loom-sandbox-", dir=_private_parent()))
        self._etc = self._private / "etc"
        self._copy_root: Path | None = None
        self._copy_mounted = False
        self._disk_capped = False
        self._processes: set[_Running] = set()
        self._closed = False
        self._staging = _Staging(self._private / "staged", run_uid)
        self._seccomp: Path | None = None

    # ---- setup -------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The host directory mounted at ``/workspace`` (the workspace, or its copy)."""
        return self._copy_root if self._copy_root is not None else self.workspace

    @property
    def host_uid(self) -> int:
        """The host uid the sandbox's processes have (a dedicated one when Loom is root)."""
        return self._run_uid if self._run_uid is not None else os.getuid()

    @property
    def private_dir(self) -> Path:
        """The host directory holding this sandbox's generated files (in its command lines)."""
        return self._private

    @property
    def sandbox_id(self) -> str:
        """This sandbox's id (in its snapshot directory's name)."""
        return self._id

    def set_up(self, restore: Snapshot | None) -> None:
        """Make the private /etc, the workspace copy (``copy`` mode) and restore a snapshot."""
        self._write_etc()
        if restore is not None:
            source = Path(restore.ref)
            if not source.is_dir():
                raise SandboxError(f"snapshot {restore.ref} is missing: it cannot be restored")
            self.workspace.mkdir(parents=True, exist_ok=True)
            _clear_directory(self.workspace)
            _copy_tree_no_follow(source, self.workspace)
        if self.settings.workspace == "copy":
            self._copy_root = self._private / "workspace"
            self._copy_root.mkdir()
            self._mount_copy_tmpfs()
            _copy_tree_no_follow(self.workspace, self._copy_root)
        if self._run_uid is not None:
            _chown_tree(self.root, self._run_uid)
            self._staging.stage([self.root, *self._extra_ro_paths])

    def _write_etc(self) -> None:
        program = seccomp_program()
        if program is not None:
            self._seccomp = self._private / "seccomp.bpf"
            self._seccomp.write_bytes(program)
        self._etc.mkdir()
        (self._etc / "passwd").write_text(
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{_INSIDE_ID}:{_INSIDE_ID}:sandbox:{SANDBOX_WORKSPACE}:/bin/sh\n"
        )
        (self._etc / "group").write_text(f"root:x:0:\nsandbox:x:{_INSIDE_ID}:\n")
        (self._etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
        (self._etc / "hostname").write_text("sandbox\n")
        self._private.chmod(0o755)

    def _mount_copy_tmpfs(self) -> None:
        """``copy`` mode: the copy on a tmpfs of its current size + ``disk_bytes`` (needs
        root; without it the growth is checked after each run instead)."""
        assert self._copy_root is not None
        disk = self.settings.limits.disk_bytes
        if disk is None or os.getuid() != 0 or shutil.which("mount") is None:
            return
        size = _tree_size(self.workspace) + disk + 1024 * 1024
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(self._copy_root)],
            capture_output=True,
            check=False,
        )
        self._copy_mounted = done.returncode == 0
        self._disk_capped = self._copy_mounted

    # ---- running -----------------------------------------------------------------------

    def _bwrap_args(
        self, cwd: str, env: Mapping[str, str], limits: SandboxLimits, fds: list[int]
    ) -> list[str]:
        """bwrap's arguments. When the sandbox runs as a dedicated uid it may not be able to
        reach the workspace or an extra path (a 0700 parent): those are bind-mounted, in a
        mount namespace of bwrap's own made just before it starts, under the private
        directory (``_Staging``), and bwrap binds them from there."""
        info_read, info_write = os.pipe()
        fds[:0] = [info_write, info_read]  # the read end (fds[1]) is kept by run()

        def reach(path: Path) -> str:
            if self._run_uid is None:
                return str(path)
            return str(self._staging.target(path))

        args = [
            self._bwrap,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(_INSIDE_ID),
            "--gid",
            str(_INSIDE_ID),
            "--hostname",
            "sandbox",
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--info-fd",
            str(info_write),
            "--disable-userns",
            "--clearenv",
        ]
        if self.settings.network == "all":
            args.append("--share-net")
        args += ["--ro-bind", "/usr", "/usr"]
        for top in _SYSTEM_TOP_DIRS:
            host = Path("/") / top
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{top}"]
        etc_names = _ETC_FILES + (_NETWORK_ETC_FILES if self.settings.network == "all" else ())
        args += ["--dir", "/etc"]
        for name in ("passwd", "group", "hosts", "hostname"):
            args += ["--ro-bind", str(self._etc / name), f"/etc/{name}"]
        for name in etc_names:
            host = Path("/etc") / name
            if host.exists():
                args += ["--ro-bind", str(host), f"/etc/{name}"]
        for extra in self._extra_ro_paths:
            if extra.exists():
                args += ["--ro-bind", reach(extra), str(extra)]
        args += ["--proc", "/proc", "--dev", "/dev"]
        tmp_size = limits.disk_bytes if limits.disk_bytes is not None else 64 * 1024 * 1024
        args += ["--size", str(tmp_size), "--tmpfs", "/tmp"]
        args += ["--bind", reach(self.root), SANDBOX_WORKSPACE]
        args += ["--remount-ro", "/"]  # the root tmpfs and /etc: nothing to write there
        if self._seccomp is not None:
            fds.append(os.open(self._seccomp, os.O_RDONLY | os.O_CLOEXEC))
            args += ["--seccomp", str(fds[-1])]
        args += ["--chdir", _inside_path(cwd)]
        merged = {
            "PATH": _DEFAULT_PATH,
            "HOME": SANDBOX_WORKSPACE,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        merged.update(self.settings.env)
        merged.update(env)
        for key, value in merged.items():
            args += ["--setenv", key, value]
        args.append("--")
        args += self._prlimit_args(limits)
        return args

    def _prlimit_args(self, limits: SandboxLimits) -> list[str]:
        args = ["/usr/bin/prlimit", "--core=0"]
        if limits.cpu_seconds is not None:
            soft = max(1, int(limits.cpu_seconds + 0.999))
            args.append(f"--cpu={soft}:{soft + 1}")
        if limits.memory_bytes is not None:
            args.append(f"--as={limits.memory_bytes}")
        if limits.processes is not None:
            allowed = limits.processes
            if self._run_uid is None:
                # Not root: the count includes the host user's own processes.
                allowed += _processes_of_uid(os.getuid())
            args.append(f"--nproc={allowed}")
        if limits.disk_bytes is not None:
            args.append(f"--fsize={limits.disk_bytes}")
        args.append("--")
        return args

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
        for what the command does: a non-zero exit or a limit is the result."""
        if self._closed:
            raise SandboxError("this sandbox is closed: start a new one")
        if not command:
            raise SandboxError("an empty command: give the program and its arguments")
        limits = limits or self.settings.limits
        _check_relative(cwd, "cwd")
        before = await asyncio.to_thread(_scan_tree, self.root)
        size_before = sum(state.size for state in before.values())
        fds: list[int] = []
        started = time.monotonic()
        try:
            args = self._bwrap_args(cwd, env or {}, limits, fds) + list(command)
            info_fd = fds.pop(1)
            process = await self._spawn(args, stdin is not None, fds)
        except BaseException:
            fds.append(info_fd)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        running = _Running(process, info_fd)
        self._processes.add(running)
        try:
            outcome = await self._collect(running, stdin, limits)
        finally:
            self._processes.discard(running)
            await running.finish()
        duration = time.monotonic() - started
        after = await asyncio.to_thread(_scan_tree, self.root)
        files = tuple(sorted(path for path, state in after.items() if before.get(path) != state))
        exit_code = process.returncode if process.returncode is not None else -signal.SIGKILL
        stdout = outcome.stdout.decode(errors="replace")
        stderr = outcome.stderr.decode(errors="replace")
        if exit_code == 1 and stderr.startswith("bwrap: ") and outcome.limit is None:
            # bwrap itself failed to build the sandbox: the command never ran.
            raise SandboxError(f"the sandbox could not be set up: {stderr.strip()}")
        limit = outcome.limit
        if limit is None:
            grown = sum(state.size for state in after.values()) - size_before
            limit = _classify_limit(exit_code, stderr, limits, grown, self._disk_capped)
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            duration=duration,
            truncated_bytes=outcome.truncated,
            files=files,
            limit=limit,
        )

    async def _spawn(
        self, args: list[str], with_stdin: bool, fds: list[int]
    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": _DEFAULT_PATH, "LANG": "C.UTF-8"},
            start_new_session=True,
            close_fds=True,
            pass_fds=fds,
            preexec_fn=self._staging.enter if self._run_uid is not None else None,
        )

    async def _collect(
        self, running: _Running, stdin: bytes | None, limits: SandboxLimits
    ) -> _Outcome:
        process = running.process
        outcome = _Outcome(budget=limits.output_bytes)
        assert process.stdout is not None and process.stderr is not None
        over = asyncio.Event()

        async def feed() -> None:
            if process.stdin is None:
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if stdin:
                    process.stdin.write(stdin)
                    await process.stdin.drain()
                process.stdin.close()

        async def pump(stream: asyncio.StreamReader, into: bytearray) -> None:
            while chunk := await stream.read(_READ_CHUNK):
                if not outcome.keep(chunk, into):
                    over.set()
                    return

        async def pump_all() -> None:
            assert process.stdout is not None and process.stderr is not None
            await asyncio.gather(
                pump(process.stdout, outcome.stdout), pump(process.stderr, outcome.stderr), feed()
            )

        pumps: asyncio.Future[None] = asyncio.ensure_future(pump_all())
        over_wait: asyncio.Future[None] = asyncio.ensure_future(_wait_event(over))
        try:
            done, _ = await asyncio.wait(
                {pumps, over_wait},
                timeout=limits.wall_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if over_wait in done:
                assert limits.output_bytes is not None
                outcome.limit = LimitHit("output_bytes", float(limits.output_bytes))
            elif not done:
                assert limits.wall_seconds is not None
                outcome.limit = LimitHit("wall_seconds", float(limits.wall_seconds))
        finally:
            over_wait.cancel()
            if outcome.limit is not None or not pumps.done():
                await running.kill()
            pumps.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pumps
            # Read the pipes to their end (discarding): a paused pipe never reports its end,
            # and asyncio's wait() waits for that.
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                drained = await asyncio.wait_for(
                    asyncio.gather(_drain(process.stdout), _drain(process.stderr)), 10
                )
                if outcome.limit is not None:
                    outcome.truncated += sum(drained)
        return outcome

    # ---- files -------------------------------------------------------------------------

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host file or directory into the workspace at ``dest`` (relative). A path
        in the workspace is never followed through a symbolic link."""
        self._check_open()
        parts = _check_relative(dest, "dest")
        await asyncio.to_thread(self._copy_in, Path(source), parts)

    def _copy_in(self, source: Path, parts: tuple[str, ...]) -> None:
        if not source.exists():
            raise SandboxError(f"copy_in: {source} does not exist on the host")
        if not parts:
            raise SandboxError("copy_in: give a destination inside the workspace, not '.'")
        parent_fd = _open_dir_no_follow(self.root, parts[:-1], create=True)
        try:
            _copy_host_to_fd(source, parent_fd, parts[-1], self._run_uid)
        finally:
            os.close(parent_fd)

    async def copy_out(self, source: str, dest: Path) -> None:
        """Copy a workspace file or directory (relative ``source``) to the host. Symbolic
        links in the workspace are never followed (a link is skipped; the requested path
        itself being a link is an error), so a link cannot lead the copy out."""
        self._check_open()
        parts = _check_relative(source, "source")
        await asyncio.to_thread(self._copy_out, parts, Path(dest))

    def _copy_out(self, parts: tuple[str, ...], dest: Path) -> None:
        parent_fd = _open_dir_no_follow(self.root, parts[:-1], create=False)
        try:
            name = parts[-1] if parts else "."
            _copy_fd_to_host(parent_fd, name, dest, top=True)
        finally:
            os.close(parent_fd)

    async def snapshot(self, step: int) -> Snapshot:
        """Record the workspace (a directory copy under the snapshot root; links kept as
        links, never followed)."""
        self._check_open()
        target = self._snapshot_root / self._id / f"step-{step:06d}"

        def record() -> None:
            self._snapshot_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            _copy_tree_no_follow(self.root, target)

        await asyncio.to_thread(record)
        return Snapshot(backend="local", ref=str(target), step=step)

    async def close(self) -> None:
        """Kill what still runs, drop the copy (``copy`` mode) and the private files."""
        if self._closed:
            return
        self._closed = True
        for running in list(self._processes):
            await running.kill()
        self._processes.clear()
        await asyncio.to_thread(self._cleanup)

    def _cleanup(self) -> None:
        if self._copy_mounted and self._copy_root is not None:
            subprocess.run(["umount", "-l", str(self._copy_root)], capture_output=True, check=False)
        shutil.rmtree(self._private, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("this sandbox is closed: start a new one")


# Seccomp: system calls refused with EPERM inside (x86-64 numbers), on top of what the
# namespaces and the dropped capabilities already refuse: tracing (``ptrace`` even of the
# sandbox's own PID 1), mounting, namespaces, kernel keyrings, modules, BPF, perf, kexec.
_DENIED_SYSCALLS_X86_64 = {
    "ptrace": 101,
    "syslog": 103,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
}
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000


def seccomp_program() -> bytes | None:
    """The classic-BPF seccomp filter bwrap loads (``--seccomp``): the calls in
    ``_DENIED_SYSCALLS_X86_64`` fail with EPERM, other architectures' calls kill. ``None``
    off x86-64 (the namespaces and capabilities still hold there; see docs/tools.md)."""
    if platform.machine() != "x86_64" or sys.byteorder != "little":
        return None
    denied = sorted(_DENIED_SYSCALLS_X86_64.values())
    eperm = _SECCOMP_RET_ERRNO | errno.EPERM
    # (code, jump-if-true, jump-if-false, k)
    program: list[tuple[int, int, int, int]] = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (_BPF_JGE_K, len(denied) + 1, 0, _X32_SYSCALL_BIT),
    ]
    for index, number in enumerate(denied):
        program.append((_BPF_JEQ_K, len(denied) - index, 0, number))
    program.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    program.append((_BPF_RET_K, 0, 0, eperm))
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)


def _private_parent() -> str:
    """Where private directories go: a world-searchable place (``/tmp``) so that the
    sandbox's dedicated uid can reach the generated files."""
    tmp = Path("/tmp")
    if tmp.is_dir() and tmp.stat().st_mode & 0o001:
        return str(tmp)
    return tempfile.gettempdir()


class _Staging:
    """Host paths the dedicated uid may not reach, bind-mounted under a private directory in
    a fresh mount namespace made in the child just before bwrap starts (so nothing is
    mounted on the host and nothing is left behind); then the child becomes the uid."""

    def __init__(self, directory: Path, uid: int | None) -> None:
        self._directory = directory
        self._uid = uid
        self._targets: dict[Path, Path] = {}
        self._plan: list[tuple[bytes, bytes]] = []
        self._libc: ctypes.CDLL | None = None

    def stage(self, paths: Sequence[Path]) -> None:
        """Make a mount point per path (called once, before any run)."""
        self._directory.mkdir(mode=0o755)
        for index, path in enumerate(paths):
            if not path.exists():
                continue
            target = self._directory / str(index)
            if path.is_dir():
                target.mkdir(mode=0o755)
            else:
                target.touch(mode=0o644)
            self._targets[path] = target
            self._plan.append((os.fsencode(path), os.fsencode(target)))
        self._libc = ctypes.CDLL(None, use_errno=True)

    def target(self, path: Path) -> Path:
        """Where ``path`` is reachable for bwrap."""
        return self._targets[path]

    def enter(self) -> None:
        """In the child, before exec: a private mount namespace, the binds, then the uid.
        Only async-signal-safe work (system calls through a preloaded libc)."""
        libc = self._libc
        assert libc is not None and self._uid is not None
        if libc.unshare(_CLONE_NEWNS) != 0:
            os._exit(125)
        if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            os._exit(125)
        for source, target in self._plan:
            if libc.mount(source, target, None, _MS_BIND | _MS_REC, None) != 0:
                os._exit(125)
        os.setgroups([])
        os.setresgid(self._uid, self._uid, self._uid)
        os.setresuid(self._uid, self._uid, self._uid)


class _Running:
    """A bwrap process and the host pid of its sandbox's PID 1 (from ``--info-fd``).

    Stopping kills that PID 1 first: the kernel then kills every process of the PID
    namespace and bwrap, still alive, reaps it and exits. Killing bwrap first would leave its
    PID 1 to the host's init as a zombie."""

    def __init__(self, process: asyncio.subprocess.Process, info_fd: int) -> None:
        self.process = process
        self._info = asyncio.ensure_future(asyncio.to_thread(_read_child_pid, info_fd))

    async def kill(self) -> None:
        """Kill everything inside (PID 1), then bwrap if it does not exit by itself."""
        if self.process.returncode is not None:
            return
        child: int | None = None
        with contextlib.suppress(asyncio.TimeoutError):
            child = await asyncio.wait_for(asyncio.shield(self._info), 5)
        if child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        else:
            _kill(self.process)

    async def finish(self) -> None:
        """Wait for bwrap's exit (killing it if it lingers), and for the info reader."""
        try:
            await asyncio.wait_for(asyncio.shield(self.process.wait()), 10)
        except TimeoutError:
            await self.kill()
            _kill(self.process)
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                await self.process.wait()
        child: int | None = None
        with contextlib.suppress(Exception):
            child = await asyncio.wait_for(self._info, 10)
        if child is not None:
            await _wait_gone(child)


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()


async def _wait_gone(pid: int, patience: float = 10.0) -> None:
    """Wait until ``pid`` (a sandbox's PID 1) has exited: its exit waits for every process of
    its PID namespace to die, so then nothing of the sandbox runs (a pidfd turns readable)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(gone, patience)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _read_child_pid(fd: int) -> int | None:
    """bwrap's ``--info-fd`` JSON (``{"child-pid": N, ...}``), read until its end."""
    data = b""
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 30)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(data)["child-pid"])
    finally:
        os.close(fd)
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return int(json.loads(data)["child-pid"])
    return None


class _Outcome:
    """What a run printed, cut at the output limit."""

    def __init__(self, budget: int | None) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.truncated = 0
        self.limit: LimitHit | None = None
        self._budget = budget

    def keep(self, chunk: bytes, into: bytearray) -> bool:
        """Keep what fits; ``False`` once the limit is passed."""
        if self._budget is None:
            into += chunk
            return True
        room = self._budget - len(self.stdout) - len(self.stderr)
        if len(chunk) <= room:
            into += chunk
            return True
        into += chunk[: max(room, 0)]
        self.truncated += len(chunk) - max(room, 0)
        return False


# ---- helpers ---------------------------------------------------------------------------


async def _drain(stream: asyncio.StreamReader | None) -> int:
    """Read ``stream`` to its end; how many bytes were discarded."""
    if stream is None:
        return 0
    discarded = 0
    while chunk := await stream.read(_READ_CHUNK):
        discarded += len(chunk)
    return discarded


def _kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL bwrap's session: the sandbox's PID 1 dies with it, and every process inside."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    # Not process.kill(): it polls first, reaping the child behind asyncio's watcher.
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)


def _classify_limit(
    exit_code: int, stderr: str, limits: SandboxLimits, grown: int, disk_capped: bool
) -> LimitHit | None:
    """Which limit stopped a command, from how it ended (see the module docstring)."""
    if limits.processes is not None and any(marker in stderr for marker in _PROCESS_MARKERS):
        # A refused fork may not fail the command (a shell retries, then goes on).
        return LimitHit("processes", float(limits.processes))
    if exit_code == 0 and (limits.disk_bytes is None or grown <= limits.disk_bytes):
        return None
    signalled = exit_code - _SIGNAL_EXIT_BASE if exit_code > _SIGNAL_EXIT_BASE else None
    if signalled == signal.SIGXCPU and limits.cpu_seconds is not None:
        return LimitHit("cpu_seconds", limits.cpu_seconds)
    if signalled == signal.SIGXFSZ and limits.disk_bytes is not None:
        return LimitHit("disk_bytes", float(limits.disk_bytes))
    if limits.disk_bytes is not None and (
        any(marker in stderr for marker in _DISK_MARKERS)
        or (not disk_capped and grown > limits.disk_bytes)
    ):
        return LimitHit("disk_bytes", float(limits.disk_bytes))
    if limits.processes is not None and any(marker in stderr for marker in _PROCESS_MARKERS):
        return LimitHit("processes", float(limits.processes))
    if limits.memory_bytes is not None and any(marker in stderr for marker in _MEMORY_MARKERS):
        return LimitHit("memory_bytes", float(limits.memory_bytes))
    if signalled == signal.SIGKILL and limits.cpu_seconds is not None:
        # RLIMIT_CPU's hard limit ends in SIGKILL when SIGXCPU was caught or ignored.
        return LimitHit("cpu_seconds", limits.cpu_seconds)
    return None


def _processes_of_uid(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry.path).st_uid == uid:
                    count += 1
    return count


def _check_relative(path: str, what: str) -> tuple[str, ...]:
    """The parts of a workspace-relative path; absolute paths and ``..`` are refused."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise SandboxError(f"{what} {path!r} is absolute: give a path relative to the workspace")
    parts = tuple(part for part in pure.parts if part not in ("", "."))
    if ".." in parts:
        raise SandboxError(f"{what} {path!r} leaves the workspace ('..'): stay inside it")
    return parts


def _inside_path(cwd: str) -> str:
    parts = _check_relative(cwd, "cwd")
    return str(PurePosixPath(SANDBOX_WORKSPACE, *parts))


def _open_dir_no_follow(root: Path, parts: Sequence[str], *, create: bool) -> int:
    """An fd on ``root/parts``, each step opened without following a symbolic link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parts:
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise SandboxError(
                        f"{'/'.join(parts)} does not exist in the workspace"
                    ) from None
                os.mkdir(part, 0o755, dir_fd=fd)
                next_fd = os.open(part, flags, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SandboxError(
                        f"{'/'.join(parts)}: {part!r} is a symbolic link or not a directory; "
                        "the sandbox never follows links out of the workspace"
                    ) from error
                raise
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_host_to_fd(source: Path, parent_fd: int, name: str, owner: int | None) -> None:
    """Copy trusted host ``source`` into ``parent_fd/name`` (links in the source skipped)."""
    if source.is_symlink():
        return
    if source.is_dir():
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        try:
            if owner is not None:
                os.fchown(child, owner, owner)
            for entry in sorted(source.iterdir()):
                _copy_host_to_fd(entry, child, entry.name, owner)
        finally:
            os.close(child)
        return
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        # An existing link or file at the destination is replaced, never written through.
        existing = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(existing.st_mode):
            os.unlink(name, dir_fd=parent_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(name, flags, source.stat().st_mode & 0o777, dir_fd=parent_fd)
    try:
        with source.open("rb") as reader:
            while block := reader.read(_READ_CHUNK * 16):
                os.write(out, block)
        if owner is not None:
            os.fchown(out, owner, owner)
    finally:
        os.close(out)


def _copy_fd_to_host(parent_fd: int, name: str, dest: Path, *, top: bool) -> None:
    """Copy ``parent_fd/name`` out to host ``dest`` without following links."""
    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        if top:
            raise SandboxError(
                f"copy_out: {name!r} is a symbolic link; the sandbox never follows links out "
                "of the workspace"
            )
        return
    if stat.S_ISDIR(info.st_mode):
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for entry in sorted(os.listdir(child)):
                _copy_fd_to_host(child, entry, dest / entry, top=False)
        finally:
            os.close(child)
        return
    if not stat.S_ISREG(info.st_mode):
        return  # fifos, sockets, devices: nothing to copy
    reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent_fd)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with dest.open("wb") as writer:
            while block := os.read(reader, _READ_CHUNK * 16):
                writer.write(block)
    finally:
        os.close(reader)


def _copy_tree_no_follow(source: Path, dest: Path) -> None:
    """Copy a directory's contents, links as links (never followed), specials skipped."""
    for entry in os.scandir(source):
        target = dest / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            target.mkdir(exist_ok=True)
            _copy_tree_no_follow(Path(entry.path), target)
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, target, follow_symlinks=False)


def _clear_directory(directory: Path) -> None:
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _chown_tree(root: Path, uid: int) -> None:
    """Hand the workspace to the sandbox's host uid (Loom runs as root): without it an
    unprivileged, capability-less process could not write there."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_uid != uid:
                    os.chown(path, uid, uid, follow_symlinks=False)


def _scan_tree(root: Path) -> dict[str, _FileState]:
    """Regular files and links under ``root`` (bounded), for what a run created or changed."""
    found: dict[str, _FileState] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(directory, d))]:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                found[os.path.relpath(path, root)] = _FileState(
                    info.st_size, info.st_mtime_ns, info.st_ino
                )
            if len(found) >= _FILES_SCAN_LIMIT:
                return found
    return found


def _tree_size(root: Path) -> int:
    total = 0
    for directory, _, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total
