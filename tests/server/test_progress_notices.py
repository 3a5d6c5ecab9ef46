"""Progress notices on a served run (issue 26): built only when the run's stream modes show them.

A state change, an iteration or a context notice costs a step more than the step's own work
and, once shown, must be journaled (every event a client saw is in the journal). A LangGraph run
streamed only as ``values`` / ``updates`` (a blocking ``/runs/wait``) shows none, so it builds
none: its journal holds the steps alone. A run streamed with ``events`` shows them and journals
what it showed. Driven by the LangGraph SDK against the shared ``loom serve`` subprocess; the
journal is read from the server's SQLite file.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from tests.server.conftest import Server

pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client

PROGRESS = {"state_change", "iteration_start", "context_assembly_start", "recursion"}
ADD = {"messages": [{"role": "user", "content": "add 2 3"}]}


def journal_types(server: Server, thread_id: str) -> list[str]:
    with sqlite3.connect(server.db) as db:
        rows = db.execute(
            "SELECT type FROM events WHERE session_id = ? ORDER BY seq", (thread_id,)
        ).fetchall()
    return [t for (t,) in rows]


async def test_a_blocking_run_builds_and_journals_no_progress_notice(server: Server) -> None:
    client = get_client(url=server.url)
    thread = await client.threads.create()
    values: Any = await client.runs.wait(thread["thread_id"], "calc", input=ADD)
    assert values["messages"][-1]["content"] == "The sum is 5."
    types = journal_types(server, thread["thread_id"])
    # the steps are all there: the answer with its call, the call, its result, the end
    for step in ("user_message", "llm_complete", "tool_execution_start", "tool_result"):
        assert step in types
    assert types[-1] == "agent_finish"
    assert PROGRESS.isdisjoint(types), types


async def test_a_run_streamed_as_events_shows_its_notices_and_journals_what_it_showed(
    server: Server,
) -> None:
    client = get_client(url=server.url)
    thread = await client.threads.create()
    seen: list[str] = []
    async for part in client.runs.stream(
        thread["thread_id"], "calc", input=ADD, stream_mode=["events"]
    ):
        if part.event == "events" and isinstance(part.data, dict):
            seen.append(str(part.data.get("type")))
    assert "state_change" in seen and "iteration_start" in seen
    types = journal_types(server, thread["thread_id"])
    shown = {t for t in seen if t in PROGRESS}
    assert shown <= set(types), shown - set(types)
