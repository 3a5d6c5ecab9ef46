"""Worker settings a fleet cannot work with are refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.errors import ConfigurationError
from loom.workers import WorkerSettings


def test_defaults_fail_over_within_the_target() -> None:
    s = WorkerSettings("dbname=x")
    s.check()
    # detection (last heartbeat up to `heartbeat` old) + a sweep tick + a poll: under 10 s
    assert s.stalled_after + s.sweep_every + s.poll_every <= 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stalled_after": 1.5, "heartbeat": 1.0}, "at least twice the heartbeat"),
        ({"sweep_every": 0}, "sweep_every must be 1..59"),
        ({"concurrency": 0}, "at least 1"),
        ({"poll_every": 0}, "must be > 0"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        WorkerSettings("dbname=x", **change).check()  # type: ignore[arg-type]


def test_the_cli_says_what_is_wrong() -> None:
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    result = CliRunner().invoke(
        app,
        [
            "worker",
            "--store",
            "dbname=x",
            "--app",
            "x:y",
            "--heartbeat",
            "3",
            "--stalled-after",
            "4",
        ],
    )
    assert result.exit_code == 2
    assert "at least twice the heartbeat" in result.output


def test_a_worker_on_a_sqlite_file_is_told_it_needs_postgres(tmp_path: Path) -> None:
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    result = CliRunner().invoke(
        app, ["worker", "--store", str(tmp_path / "x.db"), "--app", "x:y"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2
    assert "a worker needs a postgres:// URL" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.db").exists()
