"""A crew runs like an agent: child sessions and runs, the crew's journal, one tagged stream,
usage per member and in total, and failures recorded rather than raised."""

from __future__ import annotations

from typing import Any

import pytest

from loom import Agent
from loom.crew import Crew, Sequential, Step
from loom.engine.runtime import Runtime
from loom.events import (
    AgentFinish,
    AgentStart,
    CrewMemberFinish,
    CrewMemberStart,
    EventType,
)
from loom.messages import Message, ModelResponse, ToolSpec, Usage
from loom.testing import FunctionModel, ScriptedModel


def scripted(name: str, *answers: str | ModelResponse) -> Agent:
    return Agent(name=name, model=ScriptedModel(list(answers)))


async def test_sequential_members_run_in_child_sessions_with_the_crew_run_as_parent() -> None:
    runtime = Runtime()
    researcher = scripted("researcher", "notes: anemones live in tide pools")
    writer = scripted("writer", "a post about anemones")
    crew = Crew(
        "blog",
        members={"researcher": researcher, "writer": writer},
        plan=Sequential("researcher", Step("writer", task="Write a post from: {input}")),
    )

    res = await crew.run("tide pools", session_id="s1", runtime=runtime)

    assert res.stop_reason == "completed" and res.output == "a post about anemones"
    assert [m.path for m in res.members] == ["blog/researcher", "blog/writer"]
    assert [m.session_id for m in res.members] == ["s1:blog/researcher", "s1:blog/writer"]
    writer_model = writer.model_spec
    assert isinstance(writer_model, ScriptedModel)
    assert writer_model.calls[0].messages[-1].content == (
        "Write a post from: notes: anemones live in tide pools"
    )
    crew_events = await runtime.store.load_events("s1")
    links = {e.child_run_id: e.run_id for e in crew_events if isinstance(e, CrewMemberStart)}
    for m in res.members:  # each member run is its own run, linked to the crew run
        events = await runtime.store.load_events(m.session_id)
        assert events and {e.run_id for e in events} == {m.run_id}
        assert links[m.run_id] == res.run_id
        info = await runtime.store.get_session(m.session_id)
        assert info is not None and info.metadata["crew_run_id"] == res.run_id
        assert info.metadata["path"] == m.path


async def test_the_crew_session_journal_records_what_each_member_was_handed() -> None:
    runtime = Runtime()
    crew = Crew(
        "blog",
        members={"a": scripted("a", "first"), "b": scripted("b", "second")},
        plan=Sequential("a", Step("b", context="full")),
    )

    res = await crew.run("go", session_id="s1", runtime=runtime)

    events = await runtime.store.load_events("s1")
    kinds = [e.type for e in events]
    assert kinds[0] is EventType.AGENT_START and kinds[-1] is EventType.AGENT_FINISH
    starts = [e for e in events if isinstance(e, CrewMemberStart)]
    finishes = [e for e in events if isinstance(e, CrewMemberFinish)]
    assert [(s.path, s.context_policy) for s in starts] == [("blog/a", "brief"), ("blog/b", "full")]
    assert starts[0].context == "go"
    assert starts[1].context == "From blog/a:\nuser: go\nassistant: first"
    assert [(f.path, f.stop_reason, f.output) for f in finishes] == [
        ("blog/a", "completed", "first"),
        ("blog/b", "completed", "second"),
    ]
    assert starts[1].child_run_id == res.members[1].run_id
    assert isinstance(events[0], AgentStart) and events[0].message_text == "go"
    assert isinstance(events[-1], AgentFinish) and events[-1].output == "second"
    # the stable JSON form round-trips the new event types
    for e in starts + finishes:
        again = type(e).from_dict(e.to_dict(), validate=True)
        assert again.data == e.data


async def test_usage_is_reported_per_member_and_in_total() -> None:
    a = scripted(
        "a", ModelResponse(text="x", usage=Usage(input_tokens=10, output_tokens=5, requests=1))
    )
    b = scripted(
        "b", ModelResponse(text="y", usage=Usage(input_tokens=7, output_tokens=3, requests=1))
    )
    crew = Crew("c", members={"a": a, "b": b}, plan=Sequential("a", "b"))

    res = await crew.run("go")

    assert res.usage_by_member() == {
        "c/a": Usage(input_tokens=10, output_tokens=5, requests=1),
        "c/b": Usage(input_tokens=7, output_tokens=3, requests=1),
    }
    assert res.usage == Usage(input_tokens=17, output_tokens=8, requests=2)


async def test_stream_yields_every_members_events_tagged_with_its_path() -> None:
    crew = Crew(
        "c",
        members={"a": scripted("a", "one two"), "b": scripted("b", "three")},
        plan=Sequential("a", "b"),
    )

    events = [e async for e in crew.stream("go", session_id="s1", runtime=Runtime())]

    assert all("member_path" in e.extra for e in events)
    crew_run = events[-1].run_id
    member_events = [e for e in events if e.extra["member_path"] != "c"]
    assert member_events and all(e.parent_run_id == crew_run for e in member_events)
    assert all(e.run_id != crew_run for e in member_events)
    paths = {e.extra["member_path"] for e in events}
    assert paths == {"c", "c/a", "c/b"}
    deltas = [(e.extra["member_path"], e.text) for e in events if e.type is EventType.LLM_DELTA]
    assert deltas == [("c/a", "one "), ("c/a", "two"), ("c/b", "three")]
    member_finishes = [e for e in events if e.type is EventType.AGENT_FINISH]
    assert [e.extra["member_path"] for e in member_finishes] == ["c/a", "c/b", "c"]
    assert events[-1].session_id == "s1" and events[-1].data["output"] == "three"


async def test_stream_does_not_change_the_journaled_events() -> None:
    runtime = Runtime()
    crew = Crew("c", members={"a": scripted("a", "x")}, plan="a")
    _ = [e async for e in crew.stream("go", session_id="s1", runtime=runtime)]
    stored = await runtime.store.load_events("s1:c/a")
    assert stored and all("member_path" not in e.extra for e in stored)


async def test_a_member_that_raises_is_a_recorded_result_and_the_pipeline_stops() -> None:
    def explode(messages: list[Message], tools: list[ToolSpec]) -> str:
        raise RuntimeError("the member's code is broken")

    after = scripted("after", "never")
    crew = Crew(
        "c",
        members={"bad": Agent(name="bad", model=FunctionModel(explode)), "after": after},
        plan=Sequential("bad", "after"),
    )
    runtime = Runtime()

    res = await crew.run("go", session_id="s1", runtime=runtime)

    assert res.stop_reason == "error"
    assert res.error is not None and "c/bad" in res.error
    assert [m.path for m in res.members] == ["c/bad"]
    assert res.members[0].stop_reason == "error"
    assert "the member's code is broken" in (res.members[0].error or "")
    after_model = after.model_spec
    assert isinstance(after_model, ScriptedModel) and after_model.calls == []
    finishes = [e for e in await runtime.store.load_events("s1") if isinstance(e, CrewMemberFinish)]
    assert [f.stop_reason for f in finishes] == ["error"]


async def test_the_shared_agent_is_never_changed_by_a_crew_run() -> None:
    a = scripted("a", "x")
    before: dict[str, Any] = {"tools": dict(a.tools), "model": a.model_spec}
    crew = Crew("c", members={"a": a}, plan="a", shared_state=True)
    await crew.run("go")
    assert dict(a.tools) == before["tools"] and a.model_spec is before["model"]


def test_run_sync_works_without_an_event_loop() -> None:
    crew = Crew("c", members={"a": scripted("a", "done")}, plan="a")
    assert crew.run_sync("go").output == "done"


@pytest.mark.parametrize("task", ["", "   "])
async def test_an_empty_task_is_an_input_error(task: str) -> None:
    from loom.errors import InputError

    crew = Crew("c", members={"a": scripted("a", "done")}, plan="a")
    with pytest.raises(InputError, match="non-empty"):
        await crew.run(task)
