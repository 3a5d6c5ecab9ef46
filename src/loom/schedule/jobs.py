"""Background jobs (seed 003 §2): periodic maintenance with retry and exponential backoff.

Each job is a schedule with ``job=<name>`` and id ``job:<name>`` (an interval), so it fires
once per tick across every process, and each run is a row of ``schedule_runs`` (visible with
``ScheduleStore.schedule_runs("job:<name>")`` and ``loom schedule runs job:<name>``) with its
attempts and error. A run is tried up to ``attempts`` times (default 3), waiting
``base_delay * 2**n`` between tries; ``JobFailed(retryable=False)`` (or any ``LoomError`` that
is not a ``JobFailed``) stops at once, other exceptions are retried.

Built-in jobs (``builtin_jobs``): ``cleanup`` (stored errors and large results past a TTL,
what ``loom errors cleanup`` does by hand), ``sessions`` (sessions idle past a TTL, only when
configured), ``history`` (finished schedule runs and check-ins past a TTL), ``monitors``
(the missed-run and timeout detector, every minute), ``items`` (memory items past their
expiry deleted, hourly, on a store with the ``ItemStore`` capability: reads hide them at once,
this frees their rows and search words), ``extract`` (memories from finished turns,
``loom.memory.extraction``; only when ``extraction`` is set or ``LOOM_MEMORY_EXTRACT`` names a
model), ``evaluate`` (online evaluation of a sample of finished runs, ``loom.evals.online``;
only when ``online`` is set or ``LOOM_EVAL_ONLINE`` names a settings file).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from loom.errors import InputError, JobFailed, LoomError
from loom.schedule.launch import Outcome
from loom.schedule.model import Schedule
from loom.store.base import capabilities_of

if TYPE_CHECKING:
    from loom.evals.online import OnlineSettings
    from loom.memory.extraction import ExtractionSettings
    from loom.pricing import PriceTable
    from loom.schedule.model import ScheduleRun
    from loom.schedule.monitors import MonitorStore
    from loom.schedule.storage import ScheduleStore

__all__ = ["Job", "JobRunner", "MaintenanceSettings", "builtin_jobs", "job_schedule"]

log = logging.getLogger("loom.schedule")


@dataclass(frozen=True, slots=True)
class Job:
    """A background job: ``run`` every ``every`` seconds (returns a summary for the log)."""

    name: str
    every: float
    run: Callable[[], Awaitable[Any]]


def job_schedule(job: Job) -> Schedule:
    """The schedule a job fires on (missed ticks after downtime: one run)."""
    return Schedule(
        agent=job.name,
        job=job.name,
        id=f"job:{job.name}",
        interval=job.every,
        misfire="run_once",
        overlap="skip",
        created_at=0.0,
    )


class JobRunner:
    """Runs a job's tick with retry (a ``Launcher`` for schedules with ``job=``)."""

    def __init__(
        self,
        jobs: Mapping[str, Job],
        *,
        attempts: int = 3,
        base_delay: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.jobs = dict(jobs)
        self.attempts = attempts
        self.base_delay = base_delay
        self.sleep = sleep

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        job = self.jobs.get(schedule.job or "")
        if job is None:
            return Outcome(error=f"no background job named {schedule.job!r} in this process")
        return await self.call(job)

    async def call(self, job: Job) -> Outcome:
        """``job.run`` with up to ``attempts`` tries and exponential backoff."""
        error = ""
        for attempt in range(1, self.attempts + 1):
            try:
                summary = await job.run()
                log.info("job %s: %s", job.name, summary)
                return Outcome(attempts=attempt)
            except JobFailed as exc:
                error = str(exc)
                if not exc.retryable:
                    return Outcome(error=f"fatal: {error}", attempts=attempt)
            except LoomError as exc:  # a programmer's error: retrying cannot fix it
                return Outcome(error=f"fatal: {type(exc).__name__}: {exc}", attempts=attempt)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                delay = self.base_delay * 2 ** (attempt - 1)
                log.warning(
                    "job %s attempt %d failed (%s); retrying in %s s",
                    job.name,
                    attempt,
                    error,
                    delay,
                )
                await self.sleep(delay)
        return Outcome(error=error, attempts=self.attempts)


PENDING_PER_RUN = 10_000
"""Pending item embeddings the ``items`` job embeds per run at most."""


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """TTLs (seconds) of the built-in jobs; ``None`` turns a job off. Sessions are only
    expired when ``session_ttl`` is set. ``extraction`` turns on the ``extract`` job (memories
    from finished turns, every ``extraction.every`` seconds); left None, the
    ``LOOM_MEMORY_EXTRACT*`` variables decide (``loom.memory.extraction.settings_from_env``)."""

    error_ttl: float | None = 30 * 86400
    result_ttl: float | None = 30 * 86400
    session_ttl: float | None = None
    history_ttl: float | None = 30 * 86400
    cleanup_every: float = 1800
    sessions_every: float = 3600
    history_every: float = 86400
    detector_every: float = 60
    items_every: float | None = 3600  # purge of expired memory items; None: never
    extraction: ExtractionSettings | None = None
    online: OnlineSettings | None = None
    """Online evaluation (the ``evaluate`` job); left None, ``LOOM_EVAL_ONLINE`` decides."""


def builtin_jobs(
    store: Any,
    schedules: ScheduleStore,
    monitors: MonitorStore,
    settings: MaintenanceSettings | None = None,
    *,
    prices: PriceTable | None = None,
    agents: Mapping[str, Any] | None = None,
) -> list[Job]:
    """The built-in maintenance jobs on ``store`` (seed 003 §2); ``prices`` price the
    extraction model's calls (the runtime's); ``agents`` (the served ones, by name) may carry
    online evaluation settings of their own (an agent file's ``online:``)."""
    s = settings or MaintenanceSettings()
    clock = schedules.clock
    items = capabilities_of(store).items

    def cutoff(ttl: float) -> datetime:
        return datetime.fromtimestamp(clock() - ttl, UTC)

    async def cleanup() -> dict[str, int]:
        out = {}
        if s.error_ttl is not None and hasattr(store, "delete_errors"):
            out["errors"] = await store.delete_errors(cutoff(s.error_ttl))
        if s.result_ttl is not None and hasattr(store, "delete_results"):
            out["results"] = await store.delete_results(cutoff(s.result_ttl))
        return out

    async def sessions() -> dict[str, int]:
        from loom.sandbox.snapshots import default_sandbox_dir, drop_session_snapshots

        assert s.session_ttl is not None
        sandbox_dir = default_sandbox_dir(store)
        old = [
            i for i in await store.list_sessions(limit=0) if i.updated_at < cutoff(s.session_ttl)
        ]
        deleted = 0
        for info in old:
            try:
                await store.delete_session(info.id)
            except InputError:  # other sessions were forked from it: kept while they live
                continue
            drop_session_snapshots(sandbox_dir, info.id)
            deleted += 1
        return {"sessions": deleted}

    async def history() -> dict[str, int]:
        assert s.history_ttl is not None
        before = clock() - s.history_ttl
        runs = await schedules.delete_runs(before)
        checkins = await monitors.delete_checkins(before)
        return {"runs": runs, "checkins": checkins}

    async def purge_items() -> dict[str, int]:
        assert items is not None
        report = {"items": await items.purge_expired_items(datetime.fromtimestamp(clock(), UTC))}
        vectors = capabilities_of(store).vectors
        if vectors is not None:  # items whose embedding failed: embedded now, if it is back
            from loom.embedding import EmbedderUnavailable

            try:
                report["embedded"] = await vectors.embed_pending(limit=PENDING_PER_RUN)
            except EmbedderUnavailable:
                report["embedded"] = 0  # still down: the next run (or a put) tries again
        return report

    async def detect() -> dict[str, int]:
        return {"synthetic_checkins": len(await monitors.detect())}

    jobs = [Job("monitors", s.detector_every, detect)]
    if s.error_ttl is not None or s.result_ttl is not None:
        jobs.append(Job("cleanup", s.cleanup_every, cleanup))
    if s.session_ttl is not None:
        jobs.append(Job("sessions", s.sessions_every, sessions))
    if s.history_ttl is not None:
        jobs.append(Job("history", s.history_every, history))
    if s.items_every is not None and items is not None:
        jobs.append(Job("items", s.items_every, purge_items))
    from loom.memory.extraction import Extractor, job_run, settings_from_env

    extraction = s.extraction if s.extraction is not None else settings_from_env()
    if extraction is not None:
        extractor = Extractor(store, extraction, prices=prices, clock=clock)
        jobs.append(Job("extract", extraction.every, job_run(extractor)))
    from loom.evals import online as online_eval

    online = s.online if s.online is not None else online_eval.settings_from_env()
    per_agent = {
        name: found
        for name, agent in (agents or {}).items()
        if (found := online_eval.online_settings_of(agent)) is not None
    }
    if online is not None or per_agent:
        evaluator = online_eval.OnlineEvaluator(store, online, per_agent=per_agent, clock=clock)
        jobs.append(Job("evaluate", evaluator.every, online_eval.job_run(evaluator)))
    return jobs
