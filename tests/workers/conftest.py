"""A fleet of real `loom worker` processes on the private PostgreSQL cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


class Fleet:
    """Starts and kills worker processes; reads what their tools did."""

    def __init__(self, dsn: str, workdir: Path, **options: Any) -> None:
        self.dsn, self.dir = dsn, workdir
        self.options = {
            "concurrency": 3,
            "lease-ttl": 2,
            "heartbeat": 0.5,
            "stalled-after": 2,
            "max-attempts": 10,
            **options,
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "LOOM_FLEET_DIR": str(workdir),
            "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
        }

    def start(self, *script: str) -> subprocess.Popen[bytes]:
        """Start a `loom worker` with ``self.options`` (or ``python script args...``)."""
        args = [
            sys.executable,
            "-m",
            "loom",
            "worker",
            "--store",
            self.dsn,
            "--app",
            "fleet_app:agents",
        ]
        for k, v in self.options.items():
            args += [f"--{k}", str(v)]
        if script:
            args = [sys.executable, *script]
        n = len(self.procs)
        log = open(self.dir / f"worker{n}.log", "wb")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        """What worker ``proc`` wrote so far (stdout and stderr)."""
        return (self.dir / f"worker{self.procs.index(proc)}.log").read_text(errors="replace")

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def effects(self) -> list[list[str]]:
        path = self.dir / "effects.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        for p in self.alive():
            p.send_signal(signal.SIGKILL)
            p.send_signal(signal.SIGCONT)  # a stopped process dies only once it runs
        for p in self.procs:
            p.wait(10)


@pytest.fixture
def fleet(pg_schema_dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    f = Fleet(pg_schema_dsn, tmp_path)
    try:
        yield f
    finally:
        f.stop()


INITDB_ARGS = ("-A", "trust", "-U", "postgres", "--no-sync")


class Cluster:
    """A PostgreSQL cluster of its own (not the session's), for stopping and restarting."""

    BIN = "/usr/lib/postgresql/15/bin"

    def __init__(self, root: str) -> None:
        import socket

        self.root, self.data = root, f"{root}/data"
        self.as_pg: list[str] = []
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
            self.as_pg = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {root} -c fsync=off "
            "-c max_connections=100"
        )
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_pg, f"{self.BIN}/pg_ctl", "-D", self.data, "-l", f"{self.root}/log", *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def init(self) -> None:
        subprocess.run(
            [*self.as_pg, f"{self.BIN}/initdb", "-D", self.data, *INITDB_ARGS],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.start()

    def start(self) -> None:
        self.ctl("-w", "-o", self.opts, "start")

    def stop(self, mode: str = "fast") -> None:
        self.ctl("-w", "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self.ctl("-w", "-m", mode, "-o", self.opts, "restart")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A private cluster to restart with pg_ctl (the session's stays up for everyone else)."""
    import shutil
    import tempfile

    if not os.access(f"{Cluster.BIN}/pg_ctl", os.X_OK):
        pytest.skip(f"PostgreSQL 15 binaries not found in {Cluster.BIN}")
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    c = Cluster(tempfile.mkdtemp(prefix="loom-pg-restart-"))
    c.init()
    try:
        yield c
    finally:
        if os.path.exists(f"{c.data}/postmaster.pid"):
            subprocess.run(
                [*c.as_pg, f"{Cluster.BIN}/pg_ctl", "-D", c.data, "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(c.root, ignore_errors=True)
