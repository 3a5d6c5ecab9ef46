"""``loom run --crew crew.yaml "task"``: run a crew file and stream every member's events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from loom.cli._console import err
from loom.events import AgentEvent

__all__ = ["run_crew"]


async def _render_crew(events: AsyncIterator[AgentEvent], as_json: bool) -> dict[str, Any]:
    from loom.cli.turn_output import Renderer
    from loom.events import EventType as E

    render = Renderer(as_json)
    member_runs = 0
    try:
        async for event in events:
            if not as_json and event.type is E.CREW_MEMBER_START:
                render.end_text()
                d = event.data
                err.print(
                    f"[magenta]▶ {escape(str(d['path']))}[/] "
                    f"[dim](context: {escape(str(d['context_policy']))})[/]"
                )
            elif event.type is E.CREW_MEMBER_FINISH and as_json:
                member_runs += 1
            elif not as_json and event.type is E.CREW_MEMBER_FINISH:
                member_runs += 1
                render.end_text()
                d = event.data
                reused = " (reused)" if d.get("reused") else ""
                err.print(
                    f"[magenta]■ {escape(str(d['path']))}[/] "
                    f"[dim]{escape(str(d['stop_reason']))}{reused}[/]"
                )
            render(event)
    except BaseException:
        render.end_text()
        raise
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    return {**render.result, "member_runs": member_runs}


def run_crew(
    path: Path, message: str, store: Any, session_id: str, as_json: bool
) -> dict[str, Any]:
    """Load the crew at ``path``, run ``message`` on ``store``; the crew's AGENT_FINISH data."""
    from loom.crew import Crew
    from loom.engine.runtime import Runtime

    crew = Crew.from_file(path)
    runtime = Runtime(store)
    return asyncio.run(
        _render_crew(crew.stream(message, session_id=session_id, runtime=runtime), as_json)
    )
