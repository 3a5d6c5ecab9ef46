"""Agents that run on their own: schedules, background jobs and cron monitors (issue #18).

```python
from loom.schedule import Schedule, ScheduleStore

schedules = ScheduleStore(SQLiteStore("loom.db"))
await schedules.add(Schedule(agent="reporter", message="Daily summary", cron="0 9 * * 1-5",
                             timezone="Europe/Berlin"))
```

``loom serve`` and ``loom worker`` poll the schedules (``Scheduler``); see docs/scheduling.md.
"""

from loom.schedule.jobs import Job, JobRunner, MaintenanceSettings, builtin_jobs
from loom.schedule.launch import Launcher, Outcome, QueueLauncher, RuntimeLauncher
from loom.schedule.model import CheckIn, Monitor, Schedule, ScheduleRun
from loom.schedule.monitors import MonitorChange, MonitorState, MonitorStore
from loom.schedule.scheduler import PollReport, Scheduler
from loom.schedule.service import build_scheduler, schedule_tick
from loom.schedule.storage import ScheduleState, ScheduleStore
from loom.schedule.timing import next_tick

__all__ = [
    "CheckIn",
    "Job",
    "JobRunner",
    "Launcher",
    "MaintenanceSettings",
    "Monitor",
    "MonitorChange",
    "MonitorState",
    "MonitorStore",
    "Outcome",
    "PollReport",
    "QueueLauncher",
    "RuntimeLauncher",
    "Schedule",
    "ScheduleRun",
    "ScheduleState",
    "ScheduleStore",
    "Scheduler",
    "build_scheduler",
    "builtin_jobs",
    "next_tick",
    "schedule_tick",
]
