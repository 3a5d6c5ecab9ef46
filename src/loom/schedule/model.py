"""What a schedule, a schedule run, a cron monitor and a check-in are (plain data, validated).

Times are epoch seconds (``float``, UTC); a schedule's cron line is read in its IANA
``timezone``. ``Schedule.check()`` raises ``ScheduleError`` naming the field that is wrong.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from loom.errors import ScheduleError

__all__ = [
    "CHECKIN_STATUSES",
    "HEALTH",
    "CheckIn",
    "Misfire",
    "Monitor",
    "Overlap",
    "RunStatus",
    "Schedule",
    "ScheduleRun",
    "SessionPolicy",
    "new_schedule_id",
]

Misfire = Literal["skip", "run_once", "catch_up"]
Overlap = Literal["skip", "queue", "cancel"]
SessionPolicy = Literal["per_schedule", "per_run"]
RunStatus = Literal[
    "claimed",  # the tick is this process's; the run has not started yet
    "queued",  # overlap="queue": waits for the schedule's previous run to end
    "running",  # the run started (run_id names it)
    "cancelling",  # asked to stop (overlap="cancel", a monitor timeout); its owner stops it
    "finished",
    "failed",
    "cancelled",
    "interrupted",  # its process died while it ran
    "skipped",  # overlap="skip": the previous run was still going
    "missed",  # the misfire policy dropped this tick (downtime)
]
ACTIVE: tuple[str, ...] = ("claimed", "running", "cancelling")
CHECKIN_STATUSES = ("ok", "error", "in_progress", "missed", "timeout")
HEALTH = ("new", "ok", "failing", "missed", "timed_out")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def new_schedule_id() -> str:
    return f"sch_{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """An agent run on a cron line (in ``timezone``) or every ``interval`` seconds.

    ``session`` ``"per_schedule"`` continues one session (``session_id``, default
    ``schedule:<id>``) run after run; ``"per_run"`` starts a new one each tick. ``misfire``
    says what a tick later than ``misfire_grace`` seconds gets (after downtime): ``"skip"``
    (recorded as missed), ``"run_once"`` (one run for all of them), ``"catch_up"`` (up to
    ``catch_up`` runs, the newest ticks). ``overlap`` says what a tick does while the previous
    run still goes: ``"skip"``, ``"queue"`` (start after it) or ``"cancel"`` (stop it, start).
    ``job`` names a built-in background job instead of an agent (``loom.schedule.jobs``).
    ``principal`` is the name of the server API key that made it, which alone (with admin
    keys) sees and changes it (``None``: made without keys, from code or the CLI).
    """

    agent: str
    message: str = ""
    cron: str | None = None
    interval: float | None = None
    timezone: str = "UTC"
    id: str = field(default_factory=new_schedule_id)
    name: str = ""
    session: SessionPolicy = "per_schedule"
    session_id: str | None = None
    enabled: bool = True
    start_at: float | None = None
    end_at: float | None = None
    misfire: Misfire = "run_once"
    catch_up: int = 1
    misfire_grace: float = 60.0
    overlap: Overlap = "skip"
    job: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    principal: str | None = None

    def check(self, agents: Any = None) -> Schedule:
        """Raise ``ScheduleError`` (naming the field) unless this schedule can run; ``agents``
        (names the process serves) rejects an unknown agent. Returns ``self``."""
        from loom.schedule.timing import check_timing

        if not _ID.match(self.id):
            raise ScheduleError(
                f"{self.id!r} is not a usable id (letters, digits, _ . : -; up to 128)",
                field="id",
            )
        if self.job is None:
            if not isinstance(self.agent, str) or not self.agent.strip():
                raise ScheduleError("name the agent to run", field="agent")
            if agents is not None and self.agent not in agents:
                known = ", ".join(sorted(agents)) or "none"
                raise ScheduleError(
                    f"no agent named {self.agent!r} here; known agents: {known}", field="agent"
                )
            if not self.message.strip():
                raise ScheduleError("give the message each run sends the agent", field="message")
        check_timing(self)
        if self.session not in ("per_schedule", "per_run"):
            raise ScheduleError(
                f"must be 'per_schedule' or 'per_run', got {self.session!r}", field="session"
            )
        if self.misfire not in ("skip", "run_once", "catch_up"):
            raise ScheduleError(
                f"must be 'skip', 'run_once' or 'catch_up', got {self.misfire!r}", field="misfire"
            )
        if not 1 <= self.catch_up <= 1000:
            raise ScheduleError(f"must be 1..1000, got {self.catch_up}", field="catch_up")
        if self.misfire_grace < 0:
            raise ScheduleError(
                f"must be >= 0 seconds, got {self.misfire_grace}", field="misfire_grace"
            )
        if self.overlap not in ("skip", "queue", "cancel"):
            raise ScheduleError(
                f"must be 'skip', 'queue' or 'cancel', got {self.overlap!r}", field="overlap"
            )
        return self

    def replace(self, **changes: Any) -> Schedule:
        return dataclasses.replace(self, **changes)

    def session_for(self, tick: float) -> str:
        """The session a run of ``tick`` uses."""
        if self.session == "per_run":
            return f"schedule:{self.id}:{int(tick)}"
        return self.session_id or f"schedule:{self.id}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One tick of a schedule and what became of it (a row of ``schedule_runs``)."""

    id: int
    schedule_id: str
    tick: float
    status: str
    run_id: str | None = None
    session_id: str | None = None
    owner: str | None = None
    claimed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    error: str | None = None
    lease_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Monitor:
    """A cron monitor: expects a check-in on ``schedule_id``'s ticks, or on its own ``cron`` /
    ``interval`` (an external job that checks in over HTTP). A check-in later than ``margin``
    seconds past the expected time is *missed*; a job in progress longer than ``max_runtime``
    seconds is *timed out* (and, for a schedule, its run is cancelled). ``principal`` is the
    server API key that made it (as ``Schedule.principal``)."""

    id: str = field(default_factory=lambda: f"mon_{uuid.uuid4().hex[:16]}")
    name: str = ""
    schedule_id: str | None = None
    cron: str | None = None
    interval: float | None = None
    timezone: str = "UTC"
    margin: float = 60.0
    max_runtime: float | None = None
    principal: str | None = None

    def check(self) -> Monitor:
        from loom.schedule.timing import check_timing

        if not _ID.match(self.id):
            raise ScheduleError(f"{self.id!r} is not a usable id", field="id")
        if self.schedule_id is None:
            check_timing(self)
        if self.margin < 0:
            raise ScheduleError(f"must be >= 0 seconds, got {self.margin}", field="margin")
        if self.max_runtime is not None and self.max_runtime <= 0:
            raise ScheduleError(f"must be > 0 seconds, got {self.max_runtime}", field="max_runtime")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Monitor:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class CheckIn:
    """One check-in of a monitor: ``source`` is ``"client"`` (HTTP), ``"schedule"`` (the
    scheduler's own runs) or ``"system"`` (the detector's synthetic ``missed`` / ``timeout``)."""

    id: int
    monitor_id: str
    status: str
    source: str
    at: float
    expected_at: float | None = None
    health: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
