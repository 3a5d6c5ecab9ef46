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
