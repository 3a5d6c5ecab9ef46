"""What a tracer needs to draw a crew as one trace (``invoke_workflow {crew}`` over member
spans), read from the journal alone: the crew run's ``AGENT_START`` names the crew and its path,
each ``CREW_MEMBER_START`` names a member path and its child run, and every event of that child
run carries the crew run as ``parent_run_id`` — also when read back from a store."""

from __future__ import annotations

from pathlib import Path

from loom import Agent
from loom.crew import Crew, Parallel, Sequential
from loom.engine.runtime import Runtime
from loom.events import AgentEvent, AgentStart, CrewMemberStart
from loom.store import SQLiteStore
from loom.testing import ScriptedModel


def scripted(name: str, *answers: str) -> Agent:
    return Agent(name=name, model=ScriptedModel(list(answers)))


async def test_stored_member_events_name_the_crew_run_and_its_member_path(tmp_path: Path) -> None:
    seen: list[AgentEvent] = []
    store = SQLiteStore(tmp_path / "loom.db")
    runtime = Runtime(store, observers=[seen.append])
    crew = Crew(
        "blog",
        members={"a": scripted("a", "one"), "b": scripted("b", "two"), "c": scripted("c", "3")},
        plan=Sequential("a", Parallel("b", "c", name="fan")),
    )
    try:
        res = await crew.run("go", session_id="s1", runtime=runtime)
        assert res.stop_reason == "completed"

        crew_events = await store.load_events("s1")
        start = next(e for e in crew_events if isinstance(e, AgentStart))
        assert start.run_id == res.run_id and start.agent == "blog"
        assert start.extra["crew"] is True and start.extra["path"] == "blog"
        spans = {e.child_run_id: e.path for e in crew_events if isinstance(e, CrewMemberStart)}
        assert sorted(spans.values()) == ["blog/a", "blog/fan/b", "blog/fan/c"]

        for m in res.members:  # each member's stored events: its own run, the crew run as parent
            stored = await store.load_events(m.session_id, m.run_id)
            assert stored and all(e.parent_run_id == res.run_id for e in stored)
            assert spans[m.run_id] == m.path
        # the live hook (runtime observers) sees the same parentage, before anything is read back
        live = [e for e in seen if e.run_id in spans]
        assert live and all(e.parent_run_id == res.run_id for e in live)
        assert all(e.parent_run_id is None for e in seen if e.run_id == res.run_id)
    finally:
        await store.close()
