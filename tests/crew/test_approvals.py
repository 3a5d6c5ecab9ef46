"""A member's tool call waiting for a human: it surfaces with the member's path, the crew waits
(stop_reason awaiting_approval), and Crew.resume continues that member's own turn."""

from __future__ import annotations

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Sequential
from loom.engine.runtime import Runtime
from loom.errors import InputError
from loom.events import EventType
from loom.testing import ScriptedModel

ran: list[str] = []


@tool
def deploy(target: str) -> str:
    """Deploy to a target."""
    ran.append(target)
    return f"deployed {target}"


def crew() -> tuple[Crew, Agent]:
    builder = Agent(name="builder", model=ScriptedModel(["built", "built again"]))
    shipper = Agent(
        name="shipper",
        tools=[deploy],
        permissions={"ask": ["deploy"]},
        model=ScriptedModel(
            [
                ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})]),
                "shipped to prod",
            ]
        ),
    )
    return Crew(
        "rel",
        members={"builder": builder, "shipper": shipper},
        plan=Sequential("builder", "shipper"),
    ), builder


async def test_an_approval_surfaces_with_the_member_path_and_resume_continues_it() -> None:
    ran.clear()
    the_crew, builder = crew()
    runtime = Runtime()

    events = [e async for e in the_crew.stream("release 1.2", session_id="s1", runtime=runtime)]

    asked = [e for e in events if e.type is EventType.APPROVAL_REQUIRED]
    assert [e.extra["member_path"] for e in asked] == ["rel/shipper"]
    assert events[-1].data["stop_reason"] == "awaiting_approval"
    assert ran == []

    res = await the_crew.resume("s1", {"rel/shipper": True}, runtime=runtime)

    assert res.stop_reason == "completed" and res.output == "shipped to prod"
    assert ran == ["prod"]
    assert [(m.path, m.reused) for m in res.members] == [
        ("rel/builder", True),
        ("rel/shipper", False),
    ]
    model = builder.model_spec
    assert isinstance(model, ScriptedModel) and len(model.calls) == 1  # not re-run


async def test_the_crew_result_lists_the_parked_calls_and_a_member_without_a_decision_waits() -> (
    None
):
    ran.clear()
    the_crew, _ = crew()
    runtime = Runtime()
    res = await the_crew.run("release 1.2", session_id="s1", runtime=runtime)
    assert res.stop_reason == "awaiting_approval"
    [parked] = res.pending_approvals
    assert parked["member_path"] == "rel/shipper" and parked["tool_name"] == "deploy"
    assert parked["session_id"] == "s1:rel/shipper"

    still = await the_crew.resume("s1", {"rel/other": True}, runtime=runtime)
    assert still.stop_reason == "awaiting_approval" and ran == []

    rejected = await the_crew.resume("s1", False, runtime=runtime)
    assert ran == [] and rejected.stop_reason == "completed"


async def test_resume_without_a_crew_run_is_an_input_error() -> None:
    the_crew, _ = crew()
    with pytest.raises(InputError, match="no crew run to resume"):
        await the_crew.resume("nope", True, runtime=Runtime())
