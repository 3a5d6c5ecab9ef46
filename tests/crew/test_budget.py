"""Tree-wide budgets: checked before every model call and spawn, failing closed, and a run that
hits one stops with stop_reason "budget" naming it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Budget, BudgetScope, Crew, Loop, Manager, Parallel, Sequential
from loom.engine.runtime import Runtime
from loom.errors import BudgetExceeded, CrewDefinitionError
from loom.events import EventType
from loom.messages import Message, ToolSpec, Usage
from loom.testing import FunctionModel, ScriptedModel


def used(tokens: int, text: str = "ok") -> ModelResponse:
    return ModelResponse(text=text, usage=Usage(input_tokens=tokens, requests=1))


def scripted(name: str, *answers: str | ModelResponse, tools: list[Any] | None = None) -> Agent:
    return Agent(name=name, model=ScriptedModel(list(answers)), tools=tools or [])


def calls_of(agent: Agent) -> int:
    model = agent.model_spec
    assert isinstance(model, ScriptedModel | FunctionModel)
    return len(model.calls)


async def test_a_tree_wide_token_budget_stops_a_runaway_manager() -> None:
    """Per-agent caps do not bound a tree; this one does: a manager that never stops delegating
    is stopped once the tree has spent its tokens, and nothing runs after that."""
    worker_calls = 0

    def lead(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        return ModelResponse(
            tool_calls=[ToolCall(name="delegate", arguments={"member": "w", "task": "more"})],
            usage=Usage(input_tokens=10, requests=1),
        )

    def work(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        nonlocal worker_calls
        worker_calls += 1
        return used(100, "result")

    manager = Agent(
        name="lead", model=FunctionModel(lead), max_iterations=1000, max_tool_calls=1000
    )
    crew = Crew(
        "h",
        members={"lead": manager, "w": Agent(name="w", model=FunctionModel(work))},
        plan=Manager("lead", workers=["w"], max_delegations=1000),
        budget=Budget(tokens=450),
    )

    res = await asyncio.wait_for(crew.run("go"), 20)

    assert res.stop_reason == "budget" and res.budget == "tokens"
    assert "token budget exhausted" in (res.error or "")
    # 4 workers at 100 + manager calls at 10 reach 450: after that no model call ran
    assert worker_calls == 4
    assert res.usage.total_tokens < 450 + 100  # overshoot at most the one answer in flight
    assert res.members[0].stop_reason == "budget"


async def test_an_exhausted_parent_refuses_a_child_that_has_budget_of_its_own() -> None:
    first = scripted("first", used(1000, "spent it all"))
    second = scripted("second", "never")
    inner = Crew(
        "inner",
        members={"second": second},
        plan="second",
        budget=Budget(tokens=1_000_000, max_depth=2),
    )
    crew = Crew(
        "outer",
        members={"first": first, "team": inner},
        plan=Sequential("first", "team"),
        budget=Budget(tokens=500, max_depth=2),
    )

    res = await crew.run("go")

    assert res.stop_reason == "budget" and res.budget == "tokens"
    assert calls_of(second) == 0  # the child's own large budget did not let it draw more


def test_a_child_scope_draws_from_its_parents_remaining_budget() -> None:
    root = BudgetScope(Budget(tokens=100))
    a, b = root.child(), root.child(Budget(tokens=1000))
    a.charge(Usage(input_tokens=60), "m")
    b.check()  # 60 of 100 used: still open
    b.charge(Usage(input_tokens=40), "m")
    with pytest.raises(BudgetExceeded) as info:
        a.check()
    assert info.value.budget == "tokens"
    assert root.usage.total_tokens == 100
    with pytest.raises(BudgetExceeded):  # sticky: stays closed for every scope in the tree
        root.child().check()


async def test_a_cost_budget_refuses_a_model_it_cannot_price() -> None:
    member = scripted("m", "never")
    crew = Crew("c", members={"m": member}, plan="m", budget=Budget(cost_usd=1.0))
    res = await crew.run("go")
    assert res.stop_reason == "budget" and res.budget == "cost_usd"
    assert "no price is known for model 'scripted'" in (res.error or "")
    assert calls_of(member) == 0


async def test_a_cost_budget_stops_spending_once_spent() -> None:
    member = scripted(
        "m",
        ModelResponse(tool_calls=[ToolCall(name="noop")], usage=Usage(input_tokens=3, requests=1)),
        "never",
    )

    @tool
    def noop() -> str:
        """Nothing."""
        return "ok"

    member = member.replace(tools=[noop])
    prices = {"scripted": (1_000_000.0, 0.0)}  # $1 per input token
    crew = Crew("c", members={"m": member}, plan="m", budget=Budget(cost_usd=2.0, prices=prices))
    res = await crew.run("go")
    assert res.stop_reason == "budget" and res.budget == "cost_usd"
    assert calls_of(member) == 1


async def test_nested_spawning_is_off_by_default() -> None:
    leaf = scripted("leaf", "never")
    inner = Crew("inner", members={"leaf": leaf}, plan="leaf")
    crew = Crew("outer", members={"team": inner}, plan="team")

    res = await crew.run("go")

    assert res.stop_reason == "budget" and res.budget == "depth"
    assert "max_depth=1" in (res.error or "")
    assert calls_of(leaf) == 0


async def test_nested_crews_run_when_depth_allows_and_paths_nest() -> None:
    leaf = scripted("leaf", "leaf answer")
    inner = Crew("inner", members={"leaf": leaf}, plan="leaf")
    crew = Crew("outer", members={"team": inner}, plan="team", budget=Budget(max_depth=2))
    events = [e async for e in crew.stream("go", session_id="s1", runtime=Runtime())]
    assert events[-1].data["stop_reason"] == "completed"
    assert events[-1].data["output"] == "leaf answer"
    assert "outer/team/leaf" in {e.extra["member_path"] for e in events}


async def test_a_fan_out_wider_than_allowed_starts_nothing() -> None:
    members = {n: scripted(n, "x") for n in ("a", "b", "c")}
    crew = Crew("p", members=members, plan=Parallel("a", "b", "c"), budget=Budget(max_fan_out=2))
    res = await crew.run("go")
    assert res.stop_reason == "budget" and res.budget == "fan_out"
    assert res.members == [] and all(calls_of(m) == 0 for m in members.values())


async def test_a_manager_fanning_out_too_wide_is_stopped() -> None:
    """Three delegations in one answer, two allowed at once: the first two hold inside their
    worker until the third has been refused (the tree's scope is closed), so all three were
    in flight together."""
    scope = BudgetScope(Budget(max_fan_out=2))

    async def closed() -> None:
        # the scope has no event to wait on: yield to the other tasks until it closes
        while scope.exhausted is None:  # noqa: ASYNC110
            await asyncio.sleep(0)

    @tool
    async def hold() -> str:
        """Hold until the third delegation was refused."""
        await asyncio.wait_for(closed(), 5)
        return "held"

    lead = scripted(
        "lead",
        ModelResponse(
            tool_calls=[
                ToolCall(name="delegate", arguments={"member": "w", "task": str(i)})
                for i in range(3)
            ]
        ),
        "never",
    )
    worker = Agent(
        name="w",
        tools=[hold],
        model=FunctionModel(
            lambda m, t: (
                "done"
                if m[-1].role == "tool"
                else ModelResponse(tool_calls=[ToolCall(name="hold")])
            )
        ),
    )
    crew = Crew(
        "h",
        members={"lead": lead, "w": worker},
        plan=Manager("lead", ["w"]),
        budget=Budget(max_fan_out=2),
    )

    res = await asyncio.wait_for(crew.execute(Runtime(), "go", scope=scope), 20)

    assert res.stop_reason == "budget" and res.budget == "fan_out"
    assert [m.path for m in res.members].count("h/lead/w") == 2
    assert all(m.stop_reason == "budget" for m in res.members)  # no model call after it closed
    assert calls_of(lead) == 1


async def test_the_spawn_budget_stops_a_loop() -> None:
    worker = scripted("w", *["again"] * 10)
    crew = Crew(
        "l", members={"w": worker}, plan=Loop("w", max_iterations=10), budget=Budget(max_spawns=3)
    )
    res = await crew.run("go")
    assert res.stop_reason == "budget" and res.budget == "spawns"
    assert calls_of(worker) == 3


async def test_the_wall_time_budget_stops_a_member_that_hangs() -> None:
    never = asyncio.Event()

    @tool(timeout=60)
    async def hang() -> str:
        """Hang."""
        await never.wait()
        return "unreachable"

    member = scripted("m", ModelResponse(tool_calls=[ToolCall(name="hang")]), "never", tools=[hang])
    crew = Crew("c", members={"m": member}, plan="m", budget=Budget(wall_seconds=0.3))
    res = await asyncio.wait_for(crew.run("go"), 20)
    assert res.stop_reason == "budget" and res.budget == "wall_seconds"
    assert res.members[0].stop_reason == "cancelled"


async def test_a_member_stopped_by_the_budget_records_stop_reason_budget() -> None:
    @tool
    def noop() -> str:
        """Nothing."""
        return "ok"

    member = scripted(
        "m",
        ModelResponse(
            tool_calls=[ToolCall(name="noop")], usage=Usage(input_tokens=100, requests=1)
        ),
        "never",
        tools=[noop],
    )
    runtime = Runtime()
    crew = Crew("c", members={"m": member}, plan="m", budget=Budget(tokens=50))
    res = await crew.run("go", session_id="s1", runtime=runtime)
    assert res.stop_reason == "budget" and res.members[0].stop_reason == "budget"
    finish = (await runtime.store.load_events("s1:c/m"))[-1]
    assert finish.type is EventType.AGENT_FINISH and finish.data["stop_reason"] == "budget"
    assert calls_of(member) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tokens": 0}, "budget.tokens"),
        ({"max_depth": 0}, "budget.max_depth"),
        ({"wall_seconds": -1}, "budget.wall_seconds"),
        ({"max_spawns": 1.5}, "budget.max_spawns"),
    ],
)
def test_bad_budgets_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(CrewDefinitionError) as info:
        Budget(**kwargs)
    assert info.value.field == field
