"""The web console at ``/console`` on ``loom serve`` (docs/console.md): sessions with their
transcript and a live timeline of runs, model calls and tool calls; approvals; runs;
schedules and cron monitors; the error store. Server-rendered (Jinja2) with one small script
for live updates."""

from loom.server.console import schedules as _schedules  # noqa: F401  (registers its pages)
from loom.server.console.routes import router

__all__ = ["router"]
