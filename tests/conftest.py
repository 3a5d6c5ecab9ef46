"""Suite-wide fixtures. No test may reach a paid API: provider variables point at a closed port."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Set at import so that every test, fixture and subprocess sees them.
for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LOOM_MODEL"):
    os.environ.pop(var, None)
os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # discard port: fails at once
os.environ["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- a private PostgreSQL 15 cluster for the PostgresStore tests --------------------------------
PG_BIN = "/usr/lib/postgresql/15/bin"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a fresh PostgreSQL 15 cluster (database ``loom_test``), started for this
    test session in a temporary directory and stopped at its end.

    PostgreSQL refuses to run as root, so as root ``initdb`` and ``pg_ctl`` run as the
    ``postgres`` user. Skips only when the binaries (or psycopg) are missing.
    """
    import shutil
    import subprocess
    import tempfile

    initdb, pg_ctl = os.path.join(PG_BIN, "initdb"), os.path.join(PG_BIN, "pg_ctl")
    if not (os.access(initdb, os.X_OK) and os.access(pg_ctl, os.X_OK)):
        pytest.skip(f"PostgreSQL 15 binaries not found in {PG_BIN} (apt install postgresql-15)")
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    as_postgres: list[str] = []
    root = tempfile.mkdtemp(prefix="loom-pg-")
    if os.geteuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, log = os.path.join(root, "data"), os.path.join(root, "log")
    port = _free_port()

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_postgres, *cmd], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            tail = ""
            if os.path.exists(log):
                with open(log) as f:
                    tail = f.read()[-2000:]
            raise RuntimeError(f"{cmd[0]} failed: {done.stdout}{done.stderr}{tail}")

    try:
        run(initdb, "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        # fsync off: a throwaway cluster; the tests kill processes, not the machine.
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
        )
        run(pg_ctl, "-D", data, "-l", log, "-w", "-t", "30", "-o", opts, "start")
        base = f"host=127.0.0.1 port={port} user=postgres"
        with psycopg.connect(f"{base} dbname=postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE loom_test")
        yield f"{base} dbname=loom_test"
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(
                [*as_postgres, pg_ctl, "-D", data, "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_schema_dsn(postgres_dsn: str) -> str:
    """A DSN whose tables go to a new, empty schema of the test cluster (one per test)."""
    import secrets

    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{postgres_dsn} options='-c search_path={schema}'"
