"""Each mode of a crew plan, on test models: parallel, router, loop, graph, manager, handoff."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Graph, Handoff, Loop, Manager, Parallel, Router, Sequential, Task
from loom.engine.runtime import Runtime
from loom.events import CrewMemberStart
from loom.messages import Message, ToolSpec
from loom.testing import FunctionModel, ScriptedModel


def scripted(name: str, *answers: str | ModelResponse, tools: list[Any] | None = None) -> Agent:
    return Agent(name=name, model=ScriptedModel(list(answers)), tools=tools or [])


def call(name: str, **arguments: Any) -> ModelResponse:
    return ModelResponse(tool_calls=[ToolCall(name=name, arguments=arguments)])


def tools_seen(agent: Agent) -> list[list[str]]:
    model = agent.model_spec
    assert isinstance(model, ScriptedModel | FunctionModel)
    return [[t.name for t in c.tools] for c in model.calls]


def fails(messages: list[Message], tools: list[ToolSpec]) -> str:
    raise RuntimeError("broken member")


# -- parallel ------------------------------------------------------------------------------------
async def test_parallel_members_run_at_once() -> None:
    """Each member's tool waits until all three are inside their tools: run one after another
    they would each time out waiting; at once they all pass."""
    barrier = asyncio.Barrier(3)

    @tool
    async def meet() -> str:
        """Wait for the others."""
        await asyncio.wait_for(barrier.wait(), 5)
        return "met"

    members = {n: scripted(n, call("meet"), f"{n} done", tools=[meet]) for n in ("a", "b", "c")}
    crew = Crew("p", members=members, plan=Parallel("a", "b", "c"))

    res = await asyncio.wait_for(crew.run("go"), 20)

    assert res.stop_reason == "completed"
    assert res.output == "## a\na done\n\n## b\nb done\n\n## c\nc done"


async def test_parallel_results_come_in_declared_order_not_finishing_order() -> None:
    b_finished = asyncio.Event()

    @tool
    async def wait_for_b() -> str:
        """Wait until b is done."""
        await asyncio.wait_for(b_finished.wait(), 5)
        return "ok"

    @tool
    async def finish_b() -> str:
        """Mark b done."""
        b_finished.set()
        return "ok"

    a = scripted("a", call("wait_for_b"), "A", tools=[wait_for_b])
    b = scripted("b", call("finish_b"), "B", tools=[finish_b])
    crew = Crew("p", members={"a": a, "b": b}, plan=Parallel("a", "b"))

    res = await asyncio.wait_for(crew.run("go"), 20)

    assert res.output == "## a\nA\n\n## b\nB"


async def test_a_parallel_failure_is_reported_and_the_others_still_run() -> None:
    ok1, ok2 = scripted("ok1", "one"), scripted("ok2", "two")
    crew = Crew(
        "p",
        members={"ok1": ok1, "bad": Agent(name="bad", model=FunctionModel(fails)), "ok2": ok2},
        plan=Parallel("ok1", "bad", "ok2"),
    )

    res = await crew.run("go")

    assert res.stop_reason == "completed"
    assert "## ok1\none" in res.output and "## ok2\ntwo" in res.output
    assert "## bad\n(failed: p/bad stopped with error" in res.output
    assert {m.path: m.stop_reason for m in res.members} == {
        "p/ok1": "completed",
        "p/bad": "error",
        "p/ok2": "completed",
    }


async def test_parallel_fail_fast_cancels_the_rest() -> None:
    never = asyncio.Event()

    @tool
    async def block() -> str:
        """Block until cancelled."""
        await never.wait()
        return "unreachable"

    slow = scripted("slow", call("block"), "never", tools=[block])
    crew = Crew(
        "p",
        members={"slow": slow, "bad": Agent(name="bad", model=FunctionModel(fails))},
        plan=Parallel("slow", "bad", fail_fast=True),
    )

    res = await asyncio.wait_for(crew.run("go"), 20)

    assert res.stop_reason == "error"
    assert {m.path: m.stop_reason for m in res.members} == {"p/slow": "cancelled", "p/bad": "error"}


# -- router --------------------------------------------------------------------------------------
async def test_a_router_predicate_picks_the_branch() -> None:
    billing, tech = scripted("billing", "refund issued"), scripted("tech", "reboot it")
    plan = Router(
        {"billing": "billing", "tech": "tech"},
        route=lambda text: "billing" if "refund" in text else "tech",
    )
    crew = Crew("r", members={"billing": billing, "tech": tech}, plan=plan)

    assert (await crew.run("I want a refund")).output == "refund issued"
    assert (await crew.run("my screen is black")).output == "reboot it"


async def test_a_model_router_can_only_choose_among_the_declared_branch_names() -> None:
    def choose(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        if messages[-1].role == "tool":
            return "routed"
        spec = next(t for t in tools if t.name == "choose_branch")
        assert spec.parameters["properties"]["branch"]["enum"] == ["billing", "tech"]
        return call("choose_branch", branch="tech")

    triage = Agent(name="triage", model=FunctionModel(choose))
    billing, tech = scripted("billing", "refund issued"), scripted("tech", "reboot it")
    crew = Crew(
        "r",
        members={"triage": triage, "billing": billing, "tech": tech},
        plan=Router({"billing": "billing", "tech": "tech"}, by="triage"),
    )

    res = await crew.run("black screen")

    assert res.output == "reboot it"
    assert [m.path for m in res.members] == ["r/triage", "r/tech"]
    assert tools_seen(tech) == [[]]  # the branch never sees the router's tool
    # the chooser's first call is forced to choose_branch; the agent itself is unchanged
    model = triage.model_spec
    assert isinstance(model, FunctionModel)
    settings = [c.settings.tool_choice if c.settings else None for c in model.calls]
    assert settings == ["choose_branch", "auto"], settings
    assert triage.model_settings is None or triage.model_settings.tool_choice is None


async def test_a_router_naming_no_branch_is_a_recorded_failure_not_a_run() -> None:
    triage = scripted("triage", call("choose_branch", branch="sales"), "I pick sales")
    billing = scripted("billing", "never")
    crew = Crew(
        "r",
        members={"triage": triage, "billing": billing},
        plan=Router({"billing": "billing"}, by="triage"),
    )
    runtime = Runtime()

    res = await crew.run("hello", runtime=runtime)

    assert res.stop_reason == "error"
    assert res.error is not None and "names no branch" in res.error
    messages = await runtime.store.load_messages(res.members[0].session_id)
    refused = [m for m in messages if m.role == "tool"]
    assert "'sales' is not one of billing" in refused[0].content
    assert tools_seen(billing) == []


async def test_a_router_default_runs_when_the_choice_names_no_branch() -> None:
    triage = scripted("triage", "no tool call at all")
    other = scripted("other", "handled")
    crew = Crew(
        "r",
        members={"triage": triage, "other": other},
        plan=Router({"other": "other"}, by="triage", default="other"),
    )
    res = await crew.run("hello")
    assert res.output == "handled" and res.warnings


# -- loop ----------------------------------------------------------------------------------------
async def test_a_loop_runs_until_its_condition() -> None:
    writer = scripted("writer", "draft 1", "draft 2", "FINAL draft", "never")
    crew = Crew(
        "l",
        members={"writer": writer},
        plan=Loop("writer", until=lambda out: "FINAL" in out, max_iterations=5),
    )
    res = await crew.run("write")
    assert res.output == "FINAL draft" and len(res.members) == 3


async def test_exit_loop_stops_only_the_nearest_loop() -> None:
    inner = scripted("inner", call("exit_loop"), "inner stopped", call("exit_loop"), "again")
    outer = scripted("outer", "outer pass 1", "outer pass 2")
    plan = Loop(Sequential(Loop("inner", max_iterations=3), "outer"), max_iterations=2)
    crew = Crew("l", members={"inner": inner, "outer": outer}, plan=plan)

    res = await crew.run("go")

    assert res.stop_reason == "completed"
    # the inner loop stopped after one pass each time; the outer loop ran both of its passes
    assert [m.path for m in res.members] == ["l/inner", "l/outer", "l/inner", "l/outer"]
    assert res.output == "outer pass 2"
    assert "exit_loop" in tools_seen(inner)[0] and "exit_loop" in tools_seen(outer)[0]


async def test_a_loop_stops_at_max_iterations_and_says_so() -> None:
    worker = scripted("w", "again", "again", "again")
    crew = Crew("l", members={"w": worker}, plan=Loop("w", max_iterations=3))
    res = await crew.run("go")
    assert len(res.members) == 3 and any("max_iterations=3" in w for w in res.warnings)


async def test_a_loop_without_its_exit_tool_offers_none() -> None:
    worker = scripted("w", "a", "DONE")
    crew = Crew(
        "l", members={"w": worker}, plan=Loop("w", until=lambda o: o == "DONE", exit_tool=False)
    )
    await crew.run("go")
    assert tools_seen(worker) == [[], []]


# -- graph ---------------------------------------------------------------------------------------
async def test_a_graph_runs_ready_tasks_at_once_and_feeds_dependents() -> None:
    barrier = asyncio.Barrier(2)

    @tool
    async def meet() -> str:
        """Wait for the other root task."""
        await asyncio.wait_for(barrier.wait(), 5)
        return "met"

    a = scripted("a", call("meet"), "facts A", tools=[meet])
    b = scripted("b", call("meet"), "facts B", tools=[meet])
    c = scripted("c", "report")
    plan = Graph({"ta": Task("a"), "tb": Task("b"), "tc": Task("c", depends_on=["ta", "tb"])})
    crew = Crew("g", members={"a": a, "b": b, "c": c}, plan=plan)

    res = await asyncio.wait_for(crew.run("go"), 20)

    assert res.output == "report"
    c_model = c.model_spec
    assert isinstance(c_model, ScriptedModel)
    assert c_model.calls[0].messages[-1].content == "## ta\nfacts A\n\n## tb\nfacts B"
    assert [m.path for m in res.members][-1] == "g/tc/c"


async def test_a_graph_skips_dependents_of_a_failed_task_and_runs_the_rest() -> None:
    ok, after = scripted("ok", "fine"), scripted("after", "never")
    plan = Graph({"bad": Task("bad"), "ok": Task("ok"), "after": Task("after", ["bad"])})
    crew = Crew(
        "g",
        members={"bad": Agent(name="bad", model=FunctionModel(fails)), "ok": ok, "after": after},
        plan=plan,
    )
    res = await crew.run("go")
    assert res.stop_reason == "error"
    assert res.error is not None and "after: skipped: bad failed" in res.error
    assert tools_seen(after) == [] and tools_seen(ok) == [[]]


# -- hierarchical --------------------------------------------------------------------------------
async def test_a_manager_delegates_only_to_real_members_and_workers_never_see_its_tool() -> None:
    seen_enum: list[Any] = []

    def lead(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        spec = next(t for t in tools if t.name == "delegate")
        seen_enum.append(spec.parameters["properties"]["member"]["enum"])
        results = [m for m in messages if m.role == "tool"]
        if not results:
            return ModelResponse(
                tool_calls=[
                    ToolCall(name="delegate", arguments={"member": "ghost", "task": "haunt"}),
                    ToolCall(
                        name="delegate", arguments={"member": "writer", "task": "write a haiku"}
                    ),
                ]
            )
        return "manager: " + " | ".join(m.content for m in results)

    manager = Agent(name="lead", model=FunctionModel(lead))
    writer, editor = scripted("writer", "a haiku"), scripted("editor", "never")
    crew = Crew(
        "h",
        members={"lead": manager, "writer": writer, "editor": editor},
        plan=Manager("lead", workers=["writer", "editor"]),
    )

    res = await crew.run("make a poem")

    assert seen_enum[0] == ["writer", "editor"]
    assert res.output.startswith("manager: ")
    assert "ghost" in res.output and "is not one of writer, editor" in res.output
    assert "a haiku" in res.output
    assert [m.path for m in res.members] == ["h/lead", "h/lead/writer"]  # in start order
    writer_model = writer.model_spec
    assert isinstance(writer_model, ScriptedModel)
    assert writer_model.calls[0].messages[-1].content == "write a haiku"  # the brief only
    assert tools_seen(writer) == [[]] and tools_seen(editor) == []


async def test_a_manager_reads_a_failed_workers_result() -> None:
    manager = scripted("lead", call("delegate", member="bad", task="do it"), "worker failed, ok")
    crew = Crew(
        "h",
        members={"lead": manager, "bad": Agent(name="bad", model=FunctionModel(fails))},
        plan=Manager("lead", workers=["bad"]),
    )
    runtime = Runtime()
    res = await crew.run("go", runtime=runtime)
    assert res.stop_reason == "completed" and res.output == "worker failed, ok"
    assert [m.path for m in res.members] == ["h/lead", "h/lead/bad"]
    lead_messages = await runtime.store.load_messages(res.members[0].session_id)
    tool_result = next(m for m in lead_messages if m.role == "tool")
    assert tool_result.content.startswith("bad did not finish (error)")


async def test_max_delegations_caps_a_manager() -> None:
    manager = scripted(
        "lead",
        call("delegate", member="w", task="1"),
        call("delegate", member="w", task="2"),
        "stopped",
    )
    worker = scripted("w", "one", "two")
    crew = Crew(
        "h",
        members={"lead": manager, "w": worker},
        plan=Manager("lead", workers=["w"], max_delegations=1),
    )
    runtime = Runtime()
    res = await crew.run("go", runtime=runtime)
    assert res.output == "stopped"
    assert [m.path for m in res.members] == ["h/lead", "h/lead/w"]
    lead_messages = await runtime.store.load_messages(res.members[0].session_id)
    results = [m.content for m in lead_messages if m.role == "tool"]
    assert results[0] == "one" and "delegation limit reached (1)" in results[1]
    assert len(tools_seen(worker)) == 1


# -- handoffs ------------------------------------------------------------------------------------
async def test_a_member_hands_the_conversation_to_another_with_a_brief() -> None:
    triage = scripted(
        "triage", call("transfer", to="billing", brief="refund order 42"), "handed over"
    )
    billing = scripted("billing", "refunded order 42")
    crew = Crew(
        "s",
        members={"triage": triage, "billing": billing},
        plan=Handoff("triage", members=["triage", "billing"]),
    )
    runtime = Runtime()

    res = await crew.run("I was charged twice for order 42", session_id="s1", runtime=runtime)

    assert res.output == "refunded order 42"
    billing_model = billing.model_spec
    assert isinstance(billing_model, ScriptedModel)
    assert billing_model.calls[0].messages[-1].content == "refund order 42"
    spec = next(t for t in billing_model.calls[0].tools if t.name == "transfer")
    assert spec.parameters["properties"]["to"]["enum"] == ["triage"]
    starts = [e for e in await runtime.store.load_events("s1") if isinstance(e, CrewMemberStart)]
    assert [(s.path, s.context) for s in starts] == [
        ("s/triage", "I was charged twice for order 42"),
        ("s/billing", "refund order 42"),
    ]


async def test_endless_handoffs_stop_at_max_handoffs() -> None:
    a = scripted("a", *[r for _ in range(3) for r in (call("transfer", to="b", brief="x"), "ok")])
    b = scripted("b", *[r for _ in range(3) for r in (call("transfer", to="a", brief="y"), "ok")])
    crew = Crew("s", members={"a": a, "b": b}, plan=Handoff("a", ["a", "b"], max_handoffs=2))
    res = await asyncio.wait_for(crew.run("go"), 20)
    assert res.stop_reason == "error" and "max_handoffs=2" in (res.error or "")
    assert len(res.members) == 3


@pytest.mark.parametrize("policy", ["full", "last_n:2"])
async def test_a_handoff_can_pass_the_senders_transcript(policy: str) -> None:
    a = scripted("a", call("transfer", to="b", brief="take it"), "bye")
    b = scripted("b", "done")
    crew = Crew("s", members={"a": a, "b": b}, plan=Handoff("a", ["a", "b"], context=policy))
    await crew.run("hello there")
    b_model = b.model_spec
    assert isinstance(b_model, ScriptedModel)
    got = b_model.calls[0].messages[-1].content
    assert got.startswith("From s/a:") and "assistant: bye" in got
    assert ("user: hello there" in got) is (policy == "full")


async def test_three_sleeping_tasks_take_one_sleep_in_parallel_not_three() -> None:
    """Seed 002's "3 tasks × 30 s → 30 s", scaled down: three members whose tool sleeps 0.5 s
    finish in less than the 1.5 s they need one after another (benchmarks/crews.py measures
    the full figure)."""
    import time

    def sleeper(name: str) -> Agent:
        @tool
        async def work() -> str:
            """Sleep."""
            await asyncio.sleep(0.5)
            return "slept"

        return scripted(name, call("work"), f"{name} done", tools=[work])

    crew = Crew("p", members={n: sleeper(n) for n in "abc"}, plan=Parallel("a", "b", "c"))
    started = time.perf_counter()
    res = await crew.run("go")
    elapsed = time.perf_counter() - started
    assert res.stop_reason == "completed"
    assert elapsed < 1.5, f"{elapsed:.2f} s: the members ran one after another"
