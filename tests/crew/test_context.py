"""Context passing per edge: brief, last_n, summary, full, none; recorded in the journal."""

from __future__ import annotations

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import ContextPolicy, Crew, Sequential, Step
from loom.crew.context import parse_policy
from loom.engine.runtime import Runtime
from loom.errors import CrewDefinitionError
from loom.events import CrewMemberStart
from loom.testing import ScriptedModel


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def sender() -> Agent:
    return Agent(
        name="s",
        tools=[lookup],
        model=ScriptedModel(
            [
                ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"q": "anemones"})]),
                "anemones are animals",
            ]
        ),
    )


def received(agent: Agent) -> str:
    model = agent.model_spec
    assert isinstance(model, ScriptedModel)
    return model.calls[0].messages[-1].content


async def run_edge(policy: str, **crew_args: object) -> tuple[str, CrewMemberStart]:
    receiver = Agent(name="r", model=ScriptedModel(["ok"]))
    runtime = Runtime()
    crew = Crew(
        "c",
        members={"s": sender(), "r": receiver},
        plan=Sequential("s", Step("r", context=policy)),
        **crew_args,
    )  # type: ignore[arg-type]
    await crew.run("learn about tide pools", session_id="s1", runtime=runtime)
    starts = [e for e in await runtime.store.load_events("s1") if isinstance(e, CrewMemberStart)]
    assert starts[-1].path == "c/r" and starts[-1].context_policy == policy
    assert starts[-1].context == received(receiver)  # the journal holds exactly what was sent
    return received(receiver), starts[-1]


async def test_brief_passes_only_what_the_sender_wrote() -> None:
    got, _ = await run_edge("brief")
    assert got == "anemones are animals"


async def test_none_passes_nothing_from_the_sender() -> None:
    got, _ = await run_edge("none")
    assert got == "learn about tide pools"


async def test_full_passes_the_senders_whole_run() -> None:
    got, _ = await run_edge("full")
    assert got == (
        "From c/s:\nuser: learn about tide pools\n"
        "assistant: [calls lookup({'q': 'anemones'})]\n"
        "tool lookup: found anemones\nassistant: anemones are animals"
    )


async def test_last_n_passes_the_last_n_messages() -> None:
    got, _ = await run_edge("last_n:2")
    assert got == "From c/s:\ntool lookup: found anemones\nassistant: anemones are animals"


async def test_summary_is_written_by_a_summarizer_run_and_charged_as_a_member_run() -> None:
    summarizer = Agent(name="sum", model=ScriptedModel(["anemones: animals"]))
    got, _ = await run_edge("summary", summarizer=summarizer)
    assert got == "anemones: animals"
    model = summarizer.model_spec
    assert isinstance(model, ScriptedModel)
    assert "tool lookup: found anemones" in model.calls[0].messages[-1].content


@pytest.mark.parametrize("bad", ["last_n", "last_n:0", "everything", "last_n:x"])
def test_a_bad_policy_is_refused_at_build_time_naming_the_field(bad: str) -> None:
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c", members={"a": sender()}, plan=Sequential(Step("a", context=bad)))
    assert info.value.field == "plan.sequential[0].context"


def test_policies_parse() -> None:
    assert parse_policy("last_n:4") == ContextPolicy("last_n", 4)
    assert str(parse_policy(" full ")) == "full"
