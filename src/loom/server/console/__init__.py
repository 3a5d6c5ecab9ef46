"""The web console at ``/console`` on ``loom serve`` (docs/console.md): sessions with their
transcript and a live timeline of runs, model calls and tool calls (a crew session's member
runs too); approvals; runs; schedules and cron monitors; memories; experiments; budgets; the
error store. Server-rendered (Jinja2) with one small script for live updates."""

from fastapi import APIRouter

from loom.server.console import budgets as _budgets  # noqa: F401  (registers its page)
from loom.server.console import evals as _evals  # noqa: F401  (registers its pages)
from loom.server.console import memories as _memories  # noqa: F401  (registers its pages)
from loom.server.console import schedules as _schedules  # noqa: F401  (registers its pages)
from loom.server.console.routes import favicon, not_found
from loom.server.console.routes import router as pages

__all__ = ["router"]

# last, after every page: any other address under /console is a 404 page
pages.add_api_route("/{rest:path}", not_found, methods=["GET", "POST"], include_in_schema=False)

router = APIRouter(include_in_schema=False)
router.include_router(pages)
# browsers ask for it on every page; it needs no key (security.OPEN_PATHS)
router.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
