"""The escape suite (issue #32 "Proof"): attempts to leave the local sandbox, each refused or
bounded, and the host checked unchanged afterwards.

Every test runs against a real ``bwrap``. The ``host`` fixture places a canary file outside the
workspace (next to it and in the host's ``/tmp``), a secret in the test process's environment,
and after the sandbox is closed checks the canaries are byte-for-byte unchanged and that no
process of the sandbox is left (none with its host uid, none naming its private directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loom.sandbox.base import (
    ExecResult,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
)
from loom.sandbox.local import BubblewrapSandbox, LocalSandbox, bubblewrap_available

_UNAVAILABLE = bubblewrap_available()
pytestmark = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"the local sandbox cannot run here: {_UNAVAILABLE}"
)

SECRET_NAME = "LOOM_TEST_SECRET"
LIMITS = SandboxLimits(
    cpu_seconds=10,
    memory_bytes=256 * 1024 * 1024,
    processes=32,
    output_bytes=64 * 1024,
    disk_bytes=8 * 1024 * 1024,
    wall_seconds=20,
)
PY = "/usr/bin/python3"


@dataclass
class Host:
    """What a test's sandbox must not touch, and the sandbox itself."""

    sandbox: BubblewrapSandbox
    workspace: Path
    outside: Path
    canary: Path
    tmp_canary: Path
    secret: str
    canary_text: str = field(default="")

    async def sh(self, script: str, limits: SandboxLimits | None = None) -> ExecResult:
        return await self.sandbox.run(["/bin/bash", "-c", script], limits=limits)

    async def py(self, code: str, limits: SandboxLimits | None = None) -> ExecResult:
        return await self.sandbox.run([PY, "-c", code], limits=limits)


def _sandbox_processes(sandbox: BubblewrapSandbox) -> list[str]:
    """Host processes left by ``sandbox``: its host uid (when dedicated) or its private dir."""
    left = []
    dedicated = sandbox.host_uid != os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            uid = os.stat(entry.path).st_uid
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if (dedicated and uid == sandbox.host_uid) or str(sandbox.private_dir) in cmdline:
            with contextlib.suppress(OSError):
                if "\nState:\tZ" in Path(entry.path, "status").read_text():
                    # bwrap's PID 1 is reaped by the host's init (a zombie holds nothing)
                    continue
                left.append(f"{entry.name}: {cmdline}")
    return left


async def _start(
    workspace: Path, *, mode: str = "bind", network: str = "none"
) -> BubblewrapSandbox:
    settings = SandboxSettings(
        workspace=mode,  # type: ignore[arg-type]
        network=network,  # type: ignore[arg-type]
        limits=LIMITS,
    )
    return await LocalSandbox(snapshot_dir=workspace.parent / "snapshots").start(
        settings, workspace
    )


@pytest.fixture
def tmp_canary() -> Iterator[Path]:
    handle, name = tempfile.mkstemp(prefix="loom-canary-", dir="/tmp")
    os.close(handle)
    path = Path(name)
    path.write_text(f"host tmp canary {uuid.uuid4()}\n")
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
async def host(
    tmp_path: Path, tmp_canary: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[Host]:
    secret = f"s3cr3t-{uuid.uuid4()}"
    monkeypatch.setenv(SECRET_NAME, secret)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary.txt"
    canary.write_text(f"outside canary {uuid.uuid4()}\n")
    tmp_path.chmod(0o755)
    outside.chmod(0o755)
    canary.chmod(0o644)
    mode = getattr(request, "param", "bind")
    sandbox = await _start(workspace, mode=mode)
    before = (canary.read_bytes(), tmp_canary.read_bytes(), sorted(os.listdir(outside)))
    h = Host(sandbox, workspace, outside, canary, tmp_canary, secret, canary.read_text())
    try:
        yield h
    finally:
        await sandbox.close()
    after = (canary.read_bytes(), tmp_canary.read_bytes(), sorted(os.listdir(outside)))
    assert after == before, "the host changed outside the workspace"
    assert _sandbox_processes(sandbox) == [], "a sandbox process outlived close()"


def _refused(result: ExecResult) -> None:
    assert result.exit_code != 0, (result.stdout, result.stderr)


# ---- reading host files ------------------------------------------------------------------


async def test_reading_etc_shadow_is_refused(host: Host) -> None:
    result = await host.sh("cat /etc/shadow")
    _refused(result)
    shadow = Path("/etc/shadow")
    if shadow.exists():
        first = shadow.read_text().splitlines()[0]
        assert first not in result.stdout


async def test_reading_pid1_environ_shows_no_host_secret(host: Host) -> None:
    result = await host.sh("cat /proc/1/environ | tr '\\0' '\\n'; echo; ls /proc/1/root/")
    assert host.secret not in result.stdout + result.stderr
    assert SECRET_NAME not in result.stdout


async def test_reading_the_parents_environ_shows_no_host_secret(host: Host) -> None:
    result = await host.sh("cat /proc/$PPID/environ; cat /proc/self/environ")
    assert host.secret not in result.stdout
    assert SECRET_NAME not in result.stdout


async def test_host_environment_variables_do_not_pass(host: Host) -> None:
    result = await host.sh("env")
    assert result.exit_code == 0
    assert host.secret not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "TMPDIR", "PWD", "SHLVL", "_"}, names


@pytest.mark.parametrize("directory", ["/root", "/home", "/run", "/var", "/sys", "/boot", "/mnt"])
async def test_other_host_directories_are_absent(host: Host, directory: str) -> None:
    result = await host.sh(f"ls -la {directory}")
    _refused(result)
    assert "No such file or directory" in result.stderr


async def test_host_tmp_is_not_visible(host: Host) -> None:
    result = await host.sh(f"cat {host.tmp_canary}; ls -A /tmp | wc -l")
    assert host.tmp_canary.read_text() not in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "0"


async def test_reading_a_file_beside_the_workspace_by_absolute_path_fails(host: Host) -> None:
    result = await host.sh(f"cat {host.canary}")
    _refused(result)
    assert host.canary_text not in result.stdout


async def test_reading_beside_the_workspace_through_dotdot_fails(host: Host) -> None:
    result = await host.sh("cat ../outside/canary.txt ../../outside/canary.txt ../../../*/canary*")
    _refused(result)
    assert host.canary_text not in result.stdout


async def test_etc_passwd_is_the_sandboxs_own(host: Host) -> None:
    result = await host.sh("cat /etc/passwd; cat /etc/group; cat /etc/gshadow")
    assert "sandbox:x:65534" in result.stdout
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    seen = {line.split(":")[0] for line in result.stdout.splitlines() if ":" in line}
    assert seen <= {"root", "sandbox"}, seen & host_users
    assert "gshadow" in result.stderr


# ---- writing outside the workspace ---------------------------------------------------------


@pytest.mark.parametrize(
    "target", ["/escape.txt", "/usr/escape.txt", "/etc/escape.txt", "/usr/bin/python3"]
)
async def test_writing_system_paths_is_refused(host: Host, target: str) -> None:
    result = await host.sh(f"echo pwned > {target}")
    _refused(result)
    assert not Path("/escape.txt").exists()
    assert not Path("/usr/escape.txt").exists()
    assert not Path("/etc/escape.txt").exists()


async def test_writing_host_tmp_through_dotdot_lands_in_the_private_tmp(host: Host) -> None:
    name = f"loom-escape-{uuid.uuid4().hex}"
    result = await host.sh(f"echo pwned > ../../../tmp/{name} && cat /tmp/{name}")
    assert not Path("/tmp", name).exists()
    assert result.stdout.strip() in ("pwned", "")


async def test_overwriting_the_canary_through_dotdot_fails(host: Host) -> None:
    result = await host.sh(
        "echo pwned > ../outside/canary.txt; echo pwned > ../../outside/canary.txt; "
        f"echo pwned > {host.canary}"
    )
    _refused(result)


# ---- network -----------------------------------------------------------------------------


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def _nothing_accepted(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


def _host_address() -> str | None:
    try:
        addresses = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, check=False
        ).stdout.split()
    except OSError:
        return None
    return next((a for a in addresses if "." in a and not a.startswith("127.")), None)


_CONNECT = (
    "import socket,sys\n"
    "s=socket.socket()\n"
    "s.settimeout(3)\n"
    "s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "print('CONNECTED')\n"
)


async def test_tcp_to_the_hosts_loopback_is_refused(host: Host, tcp_listener: socket.socket) -> None:
    port = tcp_listener.getsockname()[1]
    result = await host.sandbox.run([PY, "-c", _CONNECT, "127.0.0.1", str(port)])
    _refused(result)
    assert "CONNECTED" not in result.stdout
    assert _nothing_accepted(tcp_listener)


async def test_tcp_to_a_non_loopback_host_address_is_refused(
    host: Host, tcp_listener: socket.socket
) -> None:
    address = _host_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to aim at")
    port = tcp_listener.getsockname()[1]
    result = await host.sandbox.run([PY, "-c", _CONNECT, address, str(port)])
    _refused(result)
    assert "Network is unreachable" in result.stderr
    assert _nothing_accepted(tcp_listener)


async def test_udp_to_the_host_arrives_nowhere(host: Host) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("0.0.0.0", 0))
    receiver.setblocking(False)
    port = receiver.getsockname()[1]
    targets = ["127.0.0.1"] + ([a] if (a := _host_address()) else [])
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for t in sys.argv[2:]:\n"
        "    try: s.sendto(b'escape', (t, int(sys.argv[1])))\n"
        "    except OSError as e: print(t, e)\n"
    )
    try:
        await host.sandbox.run([PY, "-c", code, str(port), *targets])
        with pytest.raises(BlockingIOError):
            receiver.recvfrom(100)
    finally:
        receiver.close()


async def test_dns_resolution_fails(host: Host) -> None:
    result = await host.py("import socket; print(socket.getaddrinfo('example.com', 80))")
    _refused(result)
    assert "gaierror" in result.stderr
    result = await host.sh("getent hosts example.com")
    _refused(result)


async def test_only_loopback_exists(host: Host) -> None:
    result = await host.sh("cat /proc/net/dev")
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line}
    assert interfaces == {"lo"}


async def test_a_host_unix_socket_cannot_be_reached(host: Host) -> None:
    path = host.outside / "host.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen(1)
    server.setblocking(False)
    code = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint('C')"
    try:
        for target in (str(path), "../outside/host.sock"):
            result = await host.sandbox.run([PY, "-c", code, target])
            _refused(result)
        assert _nothing_accepted(server)
    finally:
        server.close()
        path.unlink()


async def test_an_abstract_unix_socket_of_the_host_cannot_be_reached(host: Host) -> None:
    name = f"\0loom-test-{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen(1)
    server.setblocking(False)
    code = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect('\\0'+sys.argv[1])"
    try:
        result = await host.sandbox.run([PY, "-c", code, name[1:]])
        _refused(result)
        assert _nothing_accepted(server)
    finally:
        server.close()


async def test_a_host_list_network_is_refused_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="list of hosts"):
        await LocalSandbox().start(SandboxSettings(network=("example.com",)), tmp_path)


# ---- resources ---------------------------------------------------------------------------


async def test_a_fork_bomb_is_bounded_by_the_process_limit(host: Host) -> None:
    before = len([p for p in os.listdir("/proc") if p.isdigit()])
    limits = SandboxLimits(processes=16, wall_seconds=5, cpu_seconds=5, output_bytes=4096)
    result = await host.sh("bomb() { bomb | bomb & }; bomb; wait", limits=limits)
    assert result.limit is not None
    assert result.limit.limit in ("processes", "wall_seconds", "output_bytes")
    after = len([p for p in os.listdir("/proc") if p.isdigit()])
    assert after < before + 16
    assert _sandbox_processes(host.sandbox) == []


async def test_the_process_count_never_exceeds_the_limit(host: Host) -> None:
    limits = SandboxLimits(processes=8, wall_seconds=10)
    code = (
        "import os\n"
        "n=0\n"
        "try:\n"
        "    for _ in range(50):\n"
        "        if os.fork()==0:\n"
        "            os.read(os.open('/dev/zero', 0), 1); import time; time.sleep(30)\n"
        "        n+=1\n"
        "except OSError as e: print('refused', n, e.errno)\n"
        "os._exit(0)\n"
    )
    result = await host.py(code, limits=limits)
    assert result.stdout.startswith("refused")
    assert int(result.stdout.split()[1]) < 8
    assert _sandbox_processes(host.sandbox) == []


async def test_a_memory_bomb_is_bounded(host: Host) -> None:
    result = await host.py("x = bytearray(2 * 1024**3)")
    _refused(result)
    assert result.limit is not None and result.limit.limit == "memory_bytes"
    assert result.limit.value == LIMITS.memory_bytes


async def test_filling_the_disk_one_file_is_bounded_in_bind_mode(host: Host) -> None:
    result = await host.sh("head -c 100000000 /dev/zero > big")
    assert result.limit is not None and result.limit.limit == "disk_bytes"
    assert (host.workspace / "big").stat().st_size <= LIMITS.disk_bytes  # type: ignore[operator]


@pytest.mark.parametrize("host", ["copy"], indirect=True)
async def test_filling_the_disk_many_files_is_bounded_in_copy_mode(host: Host) -> None:
    if os.getuid() != 0:
        pytest.skip("the size-limited copy needs root to mount its tmpfs")
    result = await host.sh("for i in $(seq 1 40); do head -c 1000000 /dev/zero > f$i || exit 1; done")
    assert result.limit is not None and result.limit.limit == "disk_bytes"
    assert sorted(os.listdir(host.workspace)) == ["hello.txt"]  # the copy took it, not the host
    assert sum(p.stat().st_size for p in host.sandbox.root.iterdir()) <= 2 * LIMITS.disk_bytes  # type: ignore[operator]


async def test_filling_the_private_tmp_is_bounded(host: Host) -> None:
    result = await host.sh(
        "for i in $(seq 1 40); do head -c 1000000 /dev/zero > /tmp/f$i || exit 1; done"
    )
    _refused(result)
    assert result.limit is not None and result.limit.limit == "disk_bytes"


async def test_a_huge_stdout_is_cut_at_the_output_limit(host: Host) -> None:
    result = await host.sh("yes escape")
    assert result.limit is not None and result.limit.limit == "output_bytes"
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= LIMITS.output_bytes  # type: ignore[operator]
    assert result.truncated_bytes > 0


async def test_a_cpu_burn_hits_the_cpu_limit(host: Host) -> None:
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=60)
    result = await host.py("while True: pass", limits=limits)
    assert result.limit is not None and result.limit.limit == "cpu_seconds"


async def test_a_command_past_the_wall_timeout_is_killed(host: Host) -> None:
    result = await host.sh("sleep 1000", limits=SandboxLimits(wall_seconds=1))
    assert result.limit is not None and result.limit.limit == "wall_seconds"
    assert result.duration < 30
    assert _sandbox_processes(host.sandbox) == []


async def test_a_daemonised_process_is_gone_after_the_wall_timeout(host: Host) -> None:
    result = await host.sh(
        "setsid nohup sleep 1000 >/dev/null 2>&1 & disown; (trap '' HUP TERM; sleep 1000) & "
        "sleep 1000",
        limits=SandboxLimits(wall_seconds=1),
    )
    assert result.limit is not None and result.limit.limit == "wall_seconds"
    assert _sandbox_processes(host.sandbox) == []


async def test_a_daemonised_process_is_gone_when_the_command_exits(host: Host) -> None:
    result = await host.sh("setsid nohup sleep 1000 >/dev/null 2>&1 & disown; echo started")
    assert result.exit_code == 0 and "started" in result.stdout
    assert _sandbox_processes(host.sandbox) == []


# ---- processes, signals, ptrace ------------------------------------------------------------


async def test_host_processes_are_not_visible(host: Host) -> None:
    result = await host.sh("ls /proc | grep -E '^[0-9]+$' | wc -l; ls /proc")
    count = int(result.stdout.splitlines()[0])
    assert count < 10
    assert str(os.getpid()) not in result.stdout.split() or os.getpid() < 10


async def test_killing_a_host_process_is_impossible(host: Host) -> None:
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        result = await host.sh(f"kill -9 {victim.pid}; kill -9 -1; echo tried")
        assert "tried" in result.stdout
        assert victim.poll() is None, "a host process was killed from inside"
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


_PTRACE = (
    "import ctypes,os,sys\n"
    "libc=ctypes.CDLL(None, use_errno=True)\n"
    "r=libc.ptrace(16, int(sys.argv[1]), 0, 0)\n"  # PTRACE_ATTACH
    "print('ptrace', r, ctypes.get_errno())\n"
    "sys.exit(0 if r==0 else 1)\n"
)


async def test_ptrace_of_the_parent_is_refused(host: Host) -> None:
    result = await host.sandbox.run([PY, "-c", _PTRACE, "1"])
    _refused(result)
    assert "ptrace -1" in result.stdout


async def test_ptrace_of_a_host_process_is_refused(host: Host) -> None:
    result = await host.sandbox.run([PY, "-c", _PTRACE, str(os.getpid())])
    _refused(result)
    assert "ptrace -1" in result.stdout


# ---- privileges, mounts, namespaces --------------------------------------------------------


async def test_no_capabilities_and_an_unprivileged_uid(host: Host) -> None:
    result = await host.sh("grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status")
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert fields["Uid"].split()[0] == "65534"
    assert fields["Gid"].split()[0] == "65534"
    assert int(fields["CapEff"].strip(), 16) == 0
    assert int(fields["CapPrm"].strip(), 16) == 0
    assert int(fields["CapBnd"].strip(), 16) == 0


async def test_the_sandbox_runs_as_a_non_root_host_uid(host: Host) -> None:
    await host.sh("sleep 0")
    assert host.sandbox.host_uid != 0 or os.getuid() != 0


@pytest.mark.parametrize(
    "script",
    [
        "mount -t tmpfs tmpfs /workspace",
        "mount --bind / /workspace",
        "mount -o remount,rw /usr",
        "umount /usr",
    ],
)
async def test_mount_attempts_are_refused(host: Host, script: str) -> None:
    result = await host.sh(script)
    _refused(result)


@pytest.mark.parametrize(
    "script",
    [
        "unshare -r id",
        "unshare --user --map-root-user --mount sh -c 'mount -t tmpfs t /usr'",
        "nsenter -t 1 -m -u -i -n -p id",
        f"{PY} -c 'import os; os.unshare(os.CLONE_NEWUSER)'",
        f"{PY} -c 'import os; os.setns(os.open(\"/proc/1/ns/mnt\", 0), 0)'",
    ],
)
async def test_namespace_tricks_are_refused(host: Host, script: str) -> None:
    result = await host.sh(script)
    _refused(result)


async def test_chroot_is_refused(host: Host) -> None:
    result = await host.sh("chroot / id")
    _refused(result)


async def test_setuid_is_refused_and_setuid_binaries_gain_nothing(host: Host) -> None:
    result = await host.py("import os; os.setuid(0)")
    _refused(result)
    result = await host.sh("su -c id root </dev/null; id -u")
    assert result.stdout.strip().splitlines()[-1] == "65534"
    result = await host.sh("grep -E 'nosuid' /proc/self/mountinfo | grep -c ' /usr '")
    assert result.stdout.strip() != "0"


# ---- links -------------------------------------------------------------------------------


async def test_a_symlink_made_inside_to_etc_shadow_reads_nothing(host: Host) -> None:
    result = await host.sh("ln -s /etc/shadow leak && cat leak")
    _refused(result)
    with pytest.raises(SandboxError, match="symbolic link"):
        await host.sandbox.copy_out("leak", host.outside.parent / "copied")
    assert not (host.outside.parent / "copied").exists()


async def test_a_preplaced_symlink_to_a_host_file_is_not_followed(host: Host) -> None:
    (host.workspace / "link").symlink_to(host.canary)
    result = await host.sh("cat link; echo pwned > link")
    _refused(result)
    assert host.canary_text not in result.stdout
    with pytest.raises(SandboxError, match="symbolic link"):
        await host.sandbox.copy_out("link", host.outside.parent / "copied")
    # copy_in over the link replaces the link, never writes through it
    source = host.outside.parent / "payload.txt"
    source.write_text("payload\n")
    await host.sandbox.copy_in(source, "link")
    assert (host.workspace / "link").read_text() == "payload\n"
    assert not (host.workspace / "link").is_symlink()


async def test_a_dotdot_symlink_directory_is_not_followed_by_copies(host: Host) -> None:
    (host.workspace / "up").symlink_to("../..")
    result = await host.sh("ls up/; cat up/outside/canary.txt")
    assert host.canary_text not in result.stdout
    with pytest.raises(SandboxError, match="symbolic link"):
        await host.sandbox.copy_out(f"up/{host.outside.name}/canary.txt", host.outside.parent / "c")
    with pytest.raises(SandboxError, match="symbolic link"):
        await host.sandbox.copy_in(host.outside.parent / "ws" / "hello.txt", "up/outside/x.txt")
    copied = host.outside.parent / "whole"
    await host.sandbox.copy_out(".", copied)
    assert sorted(os.listdir(copied)) == ["hello.txt"]


async def test_hard_links_to_files_outside_are_refused(host: Host) -> None:
    result = await host.sh("ln /etc/passwd pw; ln /usr/bin/env e; ln /tmp/../etc/hosts h")
    _refused(result)
    assert sorted(os.listdir(host.workspace)) == ["hello.txt"]


async def test_copy_out_during_a_symlink_swap_race_never_leaves_the_workspace(host: Host) -> None:
    directory = host.workspace / "d"
    directory.mkdir()
    (directory / "canary.txt").write_text("inside\n")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                directory.symlink_to(host.outside)
            with contextlib.suppress(FileExistsError, FileNotFoundError, OSError):
                directory.unlink()
                directory.mkdir()
                (directory / "canary.txt").write_text("inside\n")

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for attempt in range(200):
            dest = host.outside.parent / f"out{attempt}"
            try:
                await host.sandbox.copy_out("d", dest)
            except (SandboxError, OSError):
                continue
            copied = dest / "canary.txt"
            if copied.exists():
                assert copied.read_text() in ("inside\n", "")
    finally:
        stop.set()
        swapper.join()


async def test_copy_in_during_a_symlink_swap_race_never_writes_outside(host: Host) -> None:
    directory = host.workspace / "d"
    source = host.outside.parent / "payload.txt"
    source.write_text("payload\n")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                directory.symlink_to(host.outside)
            with contextlib.suppress(OSError):
                directory.unlink()

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(200):
            try:
                await host.sandbox.copy_in(source, "d/canary.txt")
            except (SandboxError, OSError):
                pass
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        stop.set()
        swapper.join()
    # the fixture checks the canary beside the workspace is unchanged


# ---- devices and kernel interfaces ---------------------------------------------------------


@pytest.mark.parametrize("device", ["/dev/mem", "/dev/kmem", "/dev/sda", "/dev/kmsg", "/dev/port"])
async def test_host_devices_are_absent(host: Host, device: str) -> None:
    result = await host.sh(f"head -c 16 {device} | od -c")
    assert "No such file or directory" in result.stderr


async def test_creating_a_device_node_is_refused(host: Host) -> None:
    result = await host.sh("mknod mem c 1 1")
    _refused(result)


@pytest.mark.parametrize(
    "script",
    [
        "echo b > /proc/sysrq-trigger",
        "echo 1 > /proc/sys/kernel/sysrq",
        "echo 0 > /proc/sys/kernel/randomize_va_space",
        "echo 1 > /sys/kernel/mm/ksm/run",
        "echo c > /proc/sys/vm/drop_caches",
    ],
)
async def test_kernel_interfaces_cannot_be_written(host: Host, script: str) -> None:
    result = await host.sh(script)
    _refused(result)


async def test_proc_self_exe_cannot_be_overwritten(host: Host) -> None:
    result = await host.sh("cp /bin/true /proc/self/exe; echo x >> /proc/self/exe; echo x > /proc/1/exe")
    _refused(result)


async def test_proc_1_root_is_the_sandboxs_root(host: Host) -> None:
    result = await host.sh("ls /proc/1/root/; cat /proc/1/root/etc/shadow")
    assert "workspace" in result.stdout
    assert "root" not in result.stdout.split()
    _refused(result)


async def test_host_shared_memory_is_not_visible(host: Host) -> None:
    name = f"loom-shm-{uuid.uuid4().hex}"
    shm = Path("/dev/shm") / name
    if not shm.parent.is_dir():
        pytest.skip("this host has no /dev/shm")
    shm.write_text("host shm\n")
    try:
        result = await host.sh(f"cat /dev/shm/{name}")
        _refused(result)
    finally:
        shm.unlink()


async def test_the_hostname_is_not_the_hosts(host: Host) -> None:
    result = await host.sh("hostname; cat /proc/sys/kernel/hostname")
    assert set(result.stdout.split()) == {"sandbox"}


# ---- the API refuses paths that leave the workspace -----------------------------------------


@pytest.mark.parametrize("path", ["../outside", "/etc", "a/../../outside"])
async def test_api_paths_leaving_the_workspace_are_refused(host: Host, path: str) -> None:
    with pytest.raises(SandboxError):
        await host.sandbox.run(["true"], cwd=path)
    with pytest.raises(SandboxError):
        await host.sandbox.copy_out(path, host.outside.parent / "x")
    with pytest.raises(SandboxError):
        await host.sandbox.copy_in(host.canary, path)


def test_the_suite_counts_at_least_forty_attempts() -> None:
    tests = [
        line
        for line in Path(__file__).read_text().splitlines()
        if line.startswith("async def test_")
    ]
    assert len(tests) >= 40, len(tests)
    assert sys.platform.startswith("linux")
    assert asyncio.iscoroutinefunction(test_reading_etc_shadow_is_refused)
