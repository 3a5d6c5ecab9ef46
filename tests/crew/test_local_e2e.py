"""One crew end to end on the embedded local model: a router whose choice is constrained to the
declared branch names by the decoder (the tool's argument is an enum), then the branch."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom import Agent, tool
from loom.crew import Budget, Crew, Router
from loom.engine.runtime import Runtime
from loom.events import EventType
from loom.models.base import ModelSettings

pytestmark = pytest.mark.slow
ROUTER_FILE = Path(__file__).resolve().parents[2] / "examples" / "crews" / "router.yaml"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_a_router_crew_runs_on_the_embedded_model() -> None:
    triage = Agent(
        name="triage",
        model="local",
        max_iterations=2,
        instructions="Choose the branch for the user's request.",
        model_settings=ModelSettings(max_tokens=48, tool_choice="required"),
    )
    calculator = Agent(
        name="calculator",
        model="local",
        tools=[add],
        max_iterations=3,
        model_settings=ModelSettings(max_tokens=48),
    )
    chatter = Agent(
        name="chatter", model="local", max_iterations=1, model_settings=ModelSettings(max_tokens=16)
    )
    crew = Crew(
        "desk",
        members={"triage": triage, "calculator": calculator, "chatter": chatter},
        plan=Router({"math": "calculator", "chat": "chatter"}, by="triage"),
        budget=Budget(max_spawns=4),
    )
    runtime = Runtime()

    events = [e async for e in crew.stream("What is 17 + 25?", session_id="s1", runtime=runtime)]

    finish = events[-1]
    assert finish.type is EventType.AGENT_FINISH and finish.extra["member_path"] == "desk"
    assert finish.data["stop_reason"] == "completed", finish.data
    choices = [
        e.data["arguments"]
        for e in events
        if e.type is EventType.TOOL_EXECUTION_START and e.data["tool_name"] == "choose_branch"
    ]
    assert choices and choices[0]["branch"] in ("math", "chat")
    branch_member = {"math": "calculator", "chat": "chatter"}[choices[0]["branch"]]
    paths = [e.data["path"] for e in events if e.type is EventType.CREW_MEMBER_FINISH]
    assert paths == ["desk/triage", f"desk/{branch_member}"]
    assert finish.data["output"].strip()
    for path in paths:  # each ran in its own child session, journaled there
        assert await runtime.store.load_messages(f"s1:{path}")


async def test_the_shipped_router_file_routes_on_the_embedded_model() -> None:
    """examples/crews/router.yaml as shipped (no tool_choice in the file): the crew forces the
    chooser's first call to choose_branch, so the 135M model picks a branch instead of
    answering in prose and falling back to the default."""
    crew = Crew.from_file(ROUTER_FILE)
    events = [e async for e in crew.stream("What is 17 + 25?", runtime=Runtime())]
    chosen = [
        e.data["arguments"]["branch"]
        for e in events
        if e.type is EventType.TOOL_EXECUTION_START and e.data["tool_name"] == "choose_branch"
    ]
    warnings = [e.data["message"] for e in events if e.type is EventType.WARNING]
    assert chosen and chosen[0] in ("math", "general"), (chosen, warnings)
    assert not any("no branch" in w for w in warnings), warnings
    assert events[-1].data["stop_reason"] == "completed"
