"""``loom worker``: execute queued runs from a PostgreSQL database (the ``postgres`` extra)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from loom.cli._console import say_error

__all__ = ["worker"]


def worker(
    store: Annotated[
        str,
        typer.Option(
            "--store",
            help="PostgreSQL connection string: postgres://user@host/db or libpq's "
            "'host=... dbname=...' form.",
        ),
    ],
    agents: Annotated[
        Path | None,
        typer.Option("--agents", help="A directory of AGENT.md / YAML agent definitions."),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="module:attr naming an AgentRegistry, an Agent or a list."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Runs this worker executes at once.")] = 4,
    queue: Annotated[
        list[str] | None, typer.Option("--queue", help="Queue to take runs from (repeatable).")
    ] = None,
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", help="Seconds a session lease lasts unrenewed.")
    ] = 30.0,
    heartbeat: Annotated[float, typer.Option(help="Seconds between worker heartbeats.")] = 1.0,
    stalled_after: Annotated[
        float,
        typer.Option(
            "--stalled-after",
            help="Seconds without a heartbeat before a worker is dead and its runs are "
            "retried elsewhere (at least twice --heartbeat; the same on every worker).",
        ),
    ] = 5.0,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", help="Attempts of a run whose worker keeps dying.")
    ] = 3,
    scheduler: Annotated[
        bool,
        typer.Option(
            "--scheduler/--no-scheduler",
            help="Fire the store's schedules and background jobs (one worker per tick).",
        ),
    ] = True,
    schedule_every: Annotated[
        int, typer.Option("--schedule-every", help="Seconds between scheduler passes (1..59).")
    ] = 1,
    grace: Annotated[
        float,
        typer.Option(
            help="Seconds running turns get to finish on SIGTERM / SIGINT before they are "
            "aborted (cancelled; their committed steps stay)."
        ),
    ] = 30.0,
    db_wait: Annotated[
        float,
        typer.Option(
            "--db-wait",
            help="Seconds the worker waits for its database after losing it (a restart) "
            "before it exits with an error.",
        ),
    ] = 300.0,
) -> None:
    """Execute queued runs (background runs of `loom serve --queue`, `enqueue_run`) and fire
    schedules (docs/scheduling.md)."""
    from loom.errors import ConfigurationError, LoomError, MissingDependencyError

    try:
        try:
            import procrastinate  # noqa: F401

            from loom.server.registry import AgentRegistry, load_registry
        except ImportError as exc:
            raise MissingDependencyError(
                exc.name or "procrastinate", "postgres", "loom worker"
            ) from None
        from loom.workers import WorkerSettings, run_worker

        if not store.startswith(("postgres://", "postgresql://")) and "=" not in store:
            raise ConfigurationError(
                f"--store {store}: a worker needs a postgres:// URL (queued runs live in "
                "PostgreSQL), e.g. --store postgres://loom@127.0.0.1/loom; SQLite serves one "
                "process: use `loom serve` without --queue"
            )
        if (agents is None) == (app_spec is None):
            raise ConfigurationError(
                "give the agents to run: --agents DIR (AGENT.md files) or --app module:attr"
            )
        settings = WorkerSettings(
            conninfo=store,
            concurrency=concurrency,
            queues=tuple(queue or ("loom",)),
            lease_ttl=lease_ttl,
            heartbeat=heartbeat,
            stalled_after=stalled_after,
            max_attempts=max_attempts,
            scheduler=scheduler,
            schedule_every=schedule_every,
            grace=grace,
            db_wait=db_wait,
        )
        settings.check()  # before loading agents: a bad fleet setting says so first
        registry = (
            AgentRegistry.from_dir(agents) if agents is not None else load_registry(str(app_spec))
        )
        _log_to_stderr()  # the start-up line, database outages and stops
        asyncio.run(run_worker(settings, registry))
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _log_to_stderr() -> None:
    import logging
    import sys

    logger = logging.getLogger("loom.workers")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
