"""``Scheduler``: the poller that fires each tick exactly once, however many processes poll.

One pass (``poll``) does, in order:

1. renew the lease of this process's unfinished runs;
2. take over the unfinished runs of dead processes (lease run out, or a dead pid on this
   host): a tick claimed but never started is started (not lost); a run marked started whose
   turn never reached the store is started again under the same run id; one that did reach
   the store is marked ``interrupted`` (not doubled: the session's next turn recovers it);
3. claim due schedules: one conditional UPDATE moves ``next_fire_at`` past now and records the
   ticks (fired ones ``claimed``, dropped ones ``missed``) in the same transaction, so of any
   number of pollers exactly one claims a tick; the misfire policy picks which late ticks fire;
4. start what this process claimed, applying the overlap policy against the schedule's runs;
5. cancel runs that were asked to stop (``cancelling``).

Steps 1, 4 and 5 concern only this process's own runs: ``tend`` does just those. A worker
fleet (``loom worker``) runs the whole pass as a procrastinate periodic task, once per tick on
one worker of the fleet, and ``tend`` on every worker every second, so a worker's runs are
renewed, started and cancelled whichever worker got the tick.

``LOOM_SCHEDULE_FAULT=after_claim`` / ``after_start`` makes the process exit right after it
claimed a tick / recorded its start: the crash tests' fault hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.errors import ScheduleNotFound, UnknownTarget
from loom.schedule.launch import Launcher, Outcome, Target
from loom.schedule.model import Schedule, ScheduleRun
from loom.schedule.storage import ScheduleState, ScheduleStore
from loom.schedule.timing import next_tick, ticks_between

if TYPE_CHECKING:
    from loom.schedule.monitors import MonitorStore

__all__ = ["QUEUE_LIMIT", "PollReport", "Scheduler", "owner_id"]

log = logging.getLogger("loom.schedule")

QUEUE_LIMIT = 10
"""Runs of one schedule (``overlap="queue"``) that may wait behind its running one (or its
``catch_up``, when larger); a tick past that is recorded ``skipped``, so a run that hangs does
not grow an unbounded backlog."""
_MISSED_ROWS = 100  # missed ticks recorded one row each, newest first; older ones are counted


def owner_id() -> str:
    """This process as a run owner: ``host:pid:start_ticks`` (a reused pid is told apart)."""
    from loom.store.owner import Owner

    return str(Owner.me())


def _owner_dead(owner: str | None) -> bool:
    from loom.store.owner import Owner

    found = Owner.parse(owner) if owner else None
    return found is not None and not found.alive()


def _fault(point: str) -> None:
    if os.environ.get("LOOM_SCHEDULE_FAULT") == point:
        os._exit(17)  # a crash at exactly this point (tests); no cleanup on purpose


@dataclass(slots=True)
class PollReport:
    """What one pass did (counts)."""

    claimed: int = 0
    missed: int = 0
    started: int = 0
    skipped: int = 0
    recovered: int = 0


class Scheduler:
    """Fires the schedules of ``store`` (a ``ScheduleStore``) through ``launcher``.

    ``clock`` is the time source (tests inject one); ``lease`` seconds is how long a run of a
    silent process stays its own (each ``poll`` renews it); ``jobs`` runs background jobs
    (schedules with ``job=``); ``monitors`` gets the schedule's check-ins.
    """

    def __init__(
        self,
        store: ScheduleStore,
        launcher: Launcher,
        *,
        clock: Callable[[], float] | None = None,
        lease: float = 60.0,
        owner: str | None = None,
        jobs: Launcher | None = None,
        monitors: MonitorStore | None = None,
    ) -> None:
        self.store = store
        self.launcher = launcher
        self.jobs = jobs
        self.monitors = monitors
        self.clock = clock or store.clock
        self.lease = lease
        self.owner = owner or owner_id()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._detached = False
        # a worker's periodic pass and its tend loop must not start the same runs at once
        self._pass = asyncio.Lock()

    # -- from code ------------------------------------------------------------------------------
    async def schedule(
        self,
        target: Target,
        message: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        **options: Any,
    ) -> Schedule:
        """Run ``target`` (an ``Agent`` or a ``Crew``) with ``message`` on the cron line ``cron``
        (read in the IANA time zone ``tz``) or every ``every`` seconds; ``options`` are the other
        ``Schedule`` fields (``id``, ``session``, ``misfire``, ``catch_up``, ``overlap``,
        ``start_at``, ``end_at``, ...). Stores the schedule and returns it; a bad field is a
        ``ScheduleError`` naming it.

        This process runs it when its launcher runs in process (``RuntimeLauncher``: the target
        is added to it). A worker fleet runs agents by name: give the workers the agent.
        """
        from loom.errors import ScheduleError

        if not isinstance(getattr(target, "name", None), str):
            raise ScheduleError("schedule an Agent or a Crew (it needs a name)", field="agent")
        schedule = Schedule(
            agent=target.name, message=message, cron=cron, interval=every, timezone=tz, **options
        )
        add = getattr(self.launcher, "add", None)
        if add is not None:
            add(target)  # before the schedule exists: its first tick finds it
        state = await self.store.add(schedule, known=add is not None)
        return state.schedule

    # -- one pass -------------------------------------------------------------------------------
    async def poll(self, now: float | None = None) -> PollReport:
        """One pass of the poller at ``now`` (default the clock)."""
        async with self._pass:
            now = self.clock() if now is None else now
            report = PollReport()
            await self.store.renew(self.owner, now + self.lease)
            await self._recover(now, report)
            for state in await self.store.due(now):
                await self._claim(state, now, report)
            await self._own(now, report)
            return report

    async def tend(self, now: float | None = None) -> PollReport:
        """This process's share of a pass: renew the lease of its runs, start its claimed and
        queued ones, stop those asked to stop. Claims nothing, takes nothing over."""
        async with self._pass:
            now = self.clock() if now is None else now
            report = PollReport()
            await self.store.renew(self.owner, now + self.lease)
            await self._own(now, report)
            return report

    async def _own(self, now: float, report: PollReport) -> None:
        await self._start(now, report)
        for run in await self.store.schedule_runs(
            status=("cancelling",), owner=self.owner, limit=0
        ):
            task = self.tasks.get(run.id)
            if task is not None:
                task.cancel()

    async def _claim(self, state: ScheduleState, now: float, report: PollReport) -> None:
        s, first = state.schedule, state.next_fire_at
        assert first is not None
        ticks, count = ticks_between(s, first, now, max(_MISSED_ROWS, s.catch_up))
        on_time = [t for t in ticks if now - t <= s.misfire_grace]
        late = [t for t in ticks if now - t > s.misfire_grace]
        if s.misfire == "catch_up":
            fired = late[-s.catch_up :] + on_time
        elif s.misfire == "run_once" and late and not on_time:
            fired = late[-1:]
        else:  # skip, or run_once with a tick on time: that one stands for the late ones
            fired = on_time[-1:] if s.misfire == "run_once" else on_time
        missed = [t for t in ticks if t not in fired][-_MISSED_ROWS:]
        new_next = next_tick(s, max(now, first))
        won = await self.store.claim(
            s.id,
            first,
            new_next,
            fired,
            missed,
            owner=self.owner,
            lease_until=now + self.lease,
            session_of=s.session_for,
        )
        if not won:
            return
        report.claimed += len(fired)
        report.missed += count - len(fired)
        if count > len(fired):
            log.warning(
                "schedule %s: %d tick(s) missed (misfire=%s)", s.id, count - len(fired), s.misfire
            )
        _fault("after_claim")

    async def _start(self, now: float, report: PollReport) -> None:
        mine = await self.store.schedule_runs(
            status=("claimed", "queued"), owner=self.owner, limit=0
        )
        by_schedule: dict[str, list[ScheduleRun]] = {}
        for run in sorted(mine, key=lambda r: r.tick):
            by_schedule.setdefault(run.schedule_id, []).append(run)
        for schedule_id, waiting in by_schedule.items():
            try:
                schedule = (await self.store.get(schedule_id)).schedule
            except ScheduleNotFound:
                for run in waiting:  # deleted meanwhile
                    await self.store.transition(
                        run.id,
                        "cancelled",
                        expect=(run.status,),
                        finished_at=now,
                        error="schedule deleted",
                    )
                continue
            busy = [
                r
                for r in await self.store.active_runs(schedule_id)
                if r.status in ("running", "cancelling")
            ]
            queued = sum(r.status == "queued" for r in waiting)
            for run in waiting:
                if busy and run.status == "claimed":
                    if schedule.overlap == "skip":
                        await self.store.transition(
                            run.id,
                            "skipped",
                            expect=("claimed",),
                            finished_at=now,
                            error="the previous run was still running",
                        )
                        report.skipped += 1
                    elif schedule.overlap == "queue":
                        limit = max(QUEUE_LIMIT, schedule.catch_up)  # catch-up asks for more
                        if queued >= limit:  # a stuck run must not grow a backlog
                            await self.store.transition(
                                run.id,
                                "skipped",
                                expect=("claimed",),
                                finished_at=now,
                                error=f"{limit} runs already queued behind the running one",
                            )
                            report.skipped += 1
                            continue
                        await self.store.transition(run.id, "queued", expect=("claimed",))
                        queued += 1
                    else:  # cancel the previous run(s); this one starts once they ended
                        for other in busy:
                            await self.store.transition(other.id, "cancelling", expect=("running",))
                            task = self.tasks.get(other.id)
                            if task is not None:
                                task.cancel()
                    continue
                if busy:
                    continue  # queued behind the running one
                await self._launch(schedule, run, now)
                report.started += 1
                busy = [run]

    async def _launch(self, schedule: Schedule, run: ScheduleRun, now: float) -> None:
        run_id = run.run_id or f"run_sched_{schedule.id}_{int(run.tick)}"
        started = await self.store.transition(
            run.id,
            "running",
            expect=("claimed", "queued"),
            owner=self.owner,
            run_id=run_id,
            started_at=now,
            lease_until=now + self.lease,
        )
        if not started:
            return
        _fault("after_start")
        run = ScheduleRun(
            run.id,
            run.schedule_id,
            run.tick,
            "running",
            run_id,
            run.session_id,
            self.owner,
            run.claimed_at,
            now,
            None,
            run.attempts,
            None,
        )
        task = asyncio.create_task(self._execute(schedule, run, run_id))
        self.tasks[run.id] = task
        key = run.id
        task.add_done_callback(lambda _t: self.tasks.pop(key, None))

    async def _execute(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> None:
        launcher = self.jobs if schedule.job is not None and self.jobs is not None else None
        launcher = launcher or self.launcher
        await self._checkin(schedule.id, "in_progress")
        try:
            outcome = await launcher.run(schedule, run, run_id)
        except asyncio.CancelledError:
            if self._detached:  # this process stops, the run goes on: aclose hands it over
                raise
            await self.store.transition(
                run.id,
                "cancelled",
                expect=("running", "cancelling"),
                finished_at=self.clock(),
                error="cancelled",
            )
            await self._checkin(schedule.id, "error")
            return
        except UnknownTarget as exc:  # every tick would fail the same way: pause, say why once
            outcome = Outcome(error=str(exc))
            await self.store.pause(schedule.id)
            log.warning(
                "schedule %s paused: %s; add it to this process (or `loom schedule update %s "
                "--agent NAME`), then `loom schedule resume %s`",
                schedule.id,
                exc,
                schedule.id,
                schedule.id,
            )
        except Exception as exc:  # a launcher that raises: the run failed, the poller goes on
            log.exception("schedule %s: run %s failed", schedule.id, run_id)
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
        status = "failed" if outcome.error else "finished"
        await self.store.transition(
            run.id,
            status,
            expect=("running", "cancelling"),
            finished_at=self.clock(),
            error=outcome.error,
            attempts=outcome.attempts,
        )
        await self._checkin(schedule.id, "error" if outcome.error else "ok")

    async def _checkin(self, schedule_id: str, status: str) -> None:
        if self.monitors is None:
            return
        try:
            await self.monitors.schedule_checkin(schedule_id, status)
        except Exception:  # a monitor's bookkeeping never stops the run itself
            log.exception("schedule %s: check-in failed", schedule_id)

    async def _recover(self, now: float, report: PollReport) -> None:
        unfinished = await self.store.schedule_runs(
            status=("claimed", "queued", "running", "cancelling"), limit=0
        )
        for run in unfinished:
            if run.owner == self.owner:
                continue
            expired = _lease_out(run, now)
            if not (expired or _owner_dead(run.owner)):
                continue
            if not await self.store.take_over(run, self.owner, now + self.lease):
                continue  # another poller took it
            report.recovered += 1
            if run.status in ("running", "cancelling"):
                if _reattaches(self.launcher) and not run.schedule_id.startswith("job:"):
                    # its run goes on without its first owner (a queued job): start it again,
                    # the launcher waits for the same run instead of starting another
                    await self.store.transition(run.id, "claimed", expect=(run.status,))
                elif await self._reached_store(run):
                    await self.store.transition(
                        run.id,
                        "interrupted",
                        expect=(run.status,),
                        finished_at=now,
                        error="its process died while it ran",
                    )
                else:  # crashed between recording the start and starting: start it now
                    await self.store.transition(run.id, "claimed", expect=(run.status,))
            log.warning(
                "schedule %s: took over tick %s from %s", run.schedule_id, run.tick, run.owner
            )

    async def _reached_store(self, run: ScheduleRun) -> bool:
        """Whether run ``run.run_id`` wrote its start to the session (then it must not run
        again)."""
        if run.run_id is None or run.session_id is None:
            return False
        store = self.store.store
        list_runs = getattr(store, "list_runs", None)
        if list_runs is None:
            return True  # cannot tell: never run twice
        return any(r.run_id == run.run_id for r in await list_runs(run.session_id))

    # -- running --------------------------------------------------------------------------------
    async def run_forever(self, every: float = 1.0, *, claim: bool = True) -> None:
        """Poll every ``every`` seconds until cancelled (``claim=False``: only ``tend``); a
        failing pass is logged and retried."""
        while True:
            try:
                await (self.poll() if claim else self.tend())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler pass failed; retrying in %s s", every)
            await asyncio.sleep(every)

    def start(self, every: float = 1.0, *, claim: bool = True) -> asyncio.Task[None]:
        """Run ``run_forever`` in a task of the running loop (``aclose`` stops it)."""
        self._loop_task = asyncio.create_task(
            self.run_forever(every, claim=claim), name="loom-scheduler"
        )
        return self._loop_task

    async def drain(self) -> None:
        """Wait until every run this process started has ended (tests, shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks.values()), return_exceptions=True)

    async def aclose(self, *, cancel_runs: bool = True) -> None:
        """Stop polling and cancel this process's runs (their rows say ``cancelled``).

        ``cancel_runs=False`` (a worker shutting down, whose runs are queued jobs that go on
        elsewhere): stop waiting for them and hand them over (their lease ends now), so the
        next pass of another process takes them over and waits for the same runs."""
        if not cancel_runs:
            self._detached = True
            detach = getattr(self.launcher, "detach", None)
            if detach is not None:
                detach()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self.tasks.values()):
            task.cancel()
        await self.drain()
        if self._detached:
            await self.store.renew(self.owner, 0.0)  # a lease that ended: any pass takes over


def _reattaches(launcher: Launcher) -> bool:
    """Whether ``launcher`` re-attaches to a run started before (``QueueLauncher``)."""
    return bool(getattr(launcher, "reattaches", False))


def _lease_out(run: ScheduleRun, now: float) -> bool:
    return run.lease_until is not None and run.lease_until < now
