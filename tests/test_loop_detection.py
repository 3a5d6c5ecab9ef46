"""Loop detection (loom.loop_detection): a run that repeats a call or an answer stops with
``stop_reason="loop"``; its counts come from the journal, so a resumed run keeps them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, CarryOn, ModelResponse, RunOptions, Runtime, ToolCall, tool
from loom.errors import AgentDefinitionError
from loom.events import EventType
from loom.loop_detection import LOOP_WARNING, LoopDetection, canonical_arguments
from loom.messages import Message, ToolSpec
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel


@tool(effect="pure")
def lookup(key: str, limit: float = 10) -> str:
    """Look a key up."""
    return f"nothing for {key}"


def same_call(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
    """A model stuck on one call: the same tool, the same arguments, for ever."""
    return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": "k"})])


def tool_runs(messages: list[Message]) -> int:
    return sum(m.role == "tool" for m in messages)


async def stored(agent: Agent, result: Any) -> list[Message]:
    """The session's transcript as stored (what the journal committed, not what the run
    reported)."""
    return list(await agent.store.load_messages(result.session_id))


def test_canonical_arguments_sort_keys_and_normalise_numbers() -> None:
    assert canonical_arguments({"b": 1.0, "a": [2.0, {"y": 1, "x": 0.5}]}) == (
        '{"a":[2,{"x":0.5,"y":1}],"b":1}'
    )
    assert canonical_arguments({"a": True}) != canonical_arguments({"a": 1})


@pytest.mark.parametrize("repeats", [2, 3, 5])
async def test_a_repeated_call_stops_the_run_at_exactly_max_repeats(repeats: int) -> None:
    model = FunctionModel(same_call)
    agent = Agent(
        model=model,
        tools=[lookup],
        max_iterations=50,
        loop_detection={"max_repeats": repeats, "window": 20, "same_answer": None},
    )
    result = await agent.run("find k")
    assert result.stop_reason == "loop"
    assert len(model.calls) == repeats and tool_runs(await stored(agent, result)) == repeats
    assert "lookup" in (result.error or "") and '{"key":"k"}' in (result.error or "")
    assert f"{repeats} times" in (result.error or "")


async def test_the_default_stops_a_stuck_model_after_six_calls_and_warns_it_once() -> None:
    model = FunctionModel(same_call)
    events = [e async for e in Agent(model=model, tools=[lookup], max_iterations=50).stream("go")]
    finish = events[-1]
    assert finish.type is EventType.AGENT_FINISH and finish.data["stop_reason"] == "loop"
    assert len(model.calls) == 6
    warnings = [m for m in model.calls[5].messages if LOOP_WARNING in m.metadata]
    assert len(warnings) == 1 and "5 times" in warnings[0].content
    assert warnings[0].role == "system"
    assert not any(LOOP_WARNING in m.metadata for m in model.calls[4].messages)  # not before 5
    recorded = [e for e in events if e.type is EventType.MEMORY_RECORD]
    assert len(recorded) == 1


async def test_arguments_that_differ_do_not_trip_it() -> None:
    def counting(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        n = sum(m.role == "tool" for m in messages)
        if n == 12:
            return "done"
        # the same tool, other arguments each time; key order and 1 vs 1.0 vary too
        return ModelResponse(
            tool_calls=[ToolCall(name="lookup", arguments={"limit": 1.0, "key": f"k{n}"})]
        )

    model = FunctionModel(counting)
    agent = Agent(model=model, tools=[lookup], max_iterations=50)
    result = await agent.run("go")
    assert result.stop_reason == "completed" and len(model.calls) == 13


async def test_the_same_arguments_in_another_key_order_and_number_form_are_the_same() -> None:
    forms = [{"key": "k", "limit": 1}, {"limit": 1.0, "key": "k"}, {"limit": 1, "key": "k"}]

    def varying(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        n = sum(m.role == "tool" for m in messages)
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments=forms[n % 3])])

    model = FunctionModel(varying)
    agent = Agent(model=model, tools=[lookup], max_iterations=50, loop_detection={"max_repeats": 3})
    result = await agent.run("go")
    assert result.stop_reason == "loop" and len(model.calls) == 3


async def test_calls_outside_the_window_do_not_count() -> None:
    def alternating(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        n = sum(m.role == "tool" for m in messages)
        if n == 20:
            return "done"
        key = "same" if n % 4 == 0 else f"other{n}"  # "same" every 4th call
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": key})])

    within = {"max_repeats": 3, "window": 6, "same_answer": None}
    result = await Agent(
        model=FunctionModel(alternating), tools=[lookup], max_iterations=50, loop_detection=within
    ).run("go")
    assert result.stop_reason == "completed"  # at most 2 of "same" in any 6 calls
    wider = {**within, "window": 9}
    agent = Agent(
        model=FunctionModel(alternating), tools=[lookup], max_iterations=50, loop_detection=wider
    )
    result = await agent.run("go")
    assert result.stop_reason == "loop" and tool_runs(await stored(agent, result)) == 9


async def test_the_same_answer_in_a_row_stops_the_run() -> None:
    # the calls differ in name order only within one answer... the whole answer repeats
    def stuck(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        return ModelResponse(
            text="Let me look again.",
            tool_calls=[
                ToolCall(name="lookup", arguments={"key": "a"}),
                ToolCall(name="lookup", arguments={"key": "b"}),
            ],
        )

    model = FunctionModel(stuck)
    settings = {"max_repeats": None, "same_answer": 3}
    result = await Agent(
        model=model, tools=[lookup], max_iterations=50, loop_detection=settings
    ).run("go")
    assert result.stop_reason == "loop" and len(model.calls) == 3
    assert "same answer 3 times in a row" in (result.error or "")
    assert "Let me look again." in (result.error or "")


async def test_a_final_answer_sent_back_unchanged_stops_at_same_answer() -> None:
    from pydantic import BaseModel

    class Out(BaseModel):
        n: int

    model = FunctionModel(lambda m, t: "not json")
    agent = Agent(
        model=model, output_type=Out, output_retries=10, loop_detection={"same_answer": 3}
    )
    result = await agent.run("go")
    assert result.stop_reason == "loop" and len(model.calls) == 3


async def test_loop_detection_off_lets_the_limits_stop_it() -> None:
    model = FunctionModel(same_call)
    agent = Agent(model=model, tools=[lookup], max_iterations=12, loop_detection=False)
    result = await agent.run("go")
    assert result.stop_reason == "max_iterations" and len(model.calls) == 12
    assert not any(LOOP_WARNING in m.metadata for m in result.messages)


async def test_a_new_user_message_starts_a_new_count() -> None:
    def twice(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        since = messages[max(i for i, m in enumerate(messages) if m.role == "user") :]
        if sum(m.role == "tool" for m in since) == 2:
            return "found nothing"
        return same_call(messages, tools)

    agent = Agent(model=FunctionModel(twice), tools=[lookup], loop_detection={"max_repeats": 3})
    rt = Runtime(MemoryStore())
    for text in ("first", "second", "third"):  # 6 identical calls in the session, 2 per turn
        result = await rt.run(agent, text, session_id="s")
        assert result.stop_reason == "completed"


async def test_a_run_carried_on_mid_loop_keeps_the_journal_count(tmp_path: Path) -> None:
    """A run cut after 4 identical calls (as a crash or a limit leaves it) and carried on from
    the journal by a fresh runtime stops after 2 more, not 6."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        cut = await Runtime(store).run(
            Agent(model=FunctionModel(same_call), tools=[lookup], max_iterations=50),
            "find k",
            session_id="s",
            options=RunOptions(max_iterations=4),
        )
        assert cut.stop_reason == "max_iterations"
        assert tool_runs(await store.load_messages("s")) == 4
        model = FunctionModel(same_call)
        agent = Agent(model=model, tools=[lookup], max_iterations=50)
        fresh = Runtime(store)  # another process: nothing in memory but the store
        went_on = await fresh.run(agent, CarryOn(), session_id="s")
        assert went_on.stop_reason == "loop", went_on.error
        assert len(model.calls) == 2  # the 5th and the 6th (after the warning)
        stored = await store.load_messages("s")
        assert sum(LOOP_WARNING in m.metadata for m in stored) == 1
        again = await Runtime(store).run(agent, CarryOn(), session_id="s")
        assert again.stop_reason == "loop" and len(model.calls) == 2  # no model call at all
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"max_repeats": 1}, "loop_detection.max_repeats"),
        ({"max_repeats": 5, "window": 3}, "loop_detection.window"),
        ({"same_answer": 0}, "loop_detection.same_answer"),
        ({"max_repeats": True}, "loop_detection.max_repeats"),
        ({"repeats": 3}, "loop_detection"),
        ("often", "loop_detection"),
    ],
)
def test_bad_settings_name_the_field(value: Any, field: str) -> None:
    with pytest.raises(AgentDefinitionError) as caught:
        Agent(loop_detection=value)
    assert caught.value.field == field


def test_an_agent_file_sets_or_turns_off_loop_detection(tmp_path: Path) -> None:
    off = tmp_path / "off.md"
    off.write_text("---\nname: quiet\nloop_detection: false\n---\nYou help.\n")
    assert Agent.from_file(off).loop_detection is None
    tight = tmp_path / "tight.yaml"
    tight.write_text("name: tight\nloop_detection: {max_repeats: 3, window: 8}\n")
    agent = Agent.from_file(tight)
    assert agent.loop_detection == LoopDetection(max_repeats=3, window=8)
    again = agent.to_definition().to_markdown()
    assert "max_repeats: 3" in again and "window: 8" in again
    plain = tmp_path / "plain.md"
    plain.write_text("---\nname: plain\n---\nYou help.\n")
    assert Agent.from_file(plain).loop_detection == LoopDetection()
    assert "loop_detection" not in Agent.from_file(plain).to_definition().to_markdown()
    bad = tmp_path / "bad.md"
    bad.write_text("---\nname: bad\nloop_detection: {max_repeats: 6, window: 4}\n---\nx\n")
    with pytest.raises(AgentDefinitionError, match="window"):
        Agent.from_file(bad)


async def test_a_looping_crew_member_stops_and_the_plan_decides() -> None:
    from loom.crew import Crew, Parallel, Sequential

    def stuck_member() -> Agent:
        return Agent(
            name="stuck",
            model=FunctionModel(same_call),
            tools=[lookup],
            max_iterations=50,
            loop_detection={"max_repeats": 3},
        )

    after = FunctionModel(lambda m, t: "never asked")
    crew = Crew(
        "seq",
        members={"stuck": stuck_member(), "after": Agent(name="after", model=after)},
        plan=Sequential("stuck", "after"),
    )
    res = await crew.run("go")
    assert res.stop_reason == "error" and "stuck stopped with loop" in (res.error or "")
    assert [m.stop_reason for m in res.members] == ["loop"]
    assert "lookup" in (res.members[0].error or "") and not after.calls

    ok = Agent(name="ok", model=FunctionModel(lambda m, t: "fine"))
    crew = Crew("par", members={"stuck": stuck_member(), "ok": ok}, plan=Parallel("stuck", "ok"))
    res = await crew.run("go")
    assert res.stop_reason == "completed"  # a parallel step without fail_fast keeps the rest
    assert sorted(m.stop_reason for m in res.members) == ["completed", "loop"]
    assert "fine" in res.output and "failed" in res.output


CRASHING = r"""
import asyncio, os, signal, sys
from loom import Agent, ModelResponse, ToolCall, tool
from loom.store import SQLiteStore
from loom.testing import FunctionModel

runs = 0


@tool(effect="pure")
def lookup(key: str, limit: float = 10) -> str:
    '''Look a key up.'''
    global runs
    runs += 1
    if runs == 4:  # the process dies inside the 4th identical call
        os.kill(os.getpid(), signal.SIGKILL)
    return f"nothing for {key}"


def stuck(messages, tools):
    return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": "k"})])


agent = Agent(model=FunctionModel(stuck), tools=[lookup], max_iterations=50,
              store=SQLiteStore(sys.argv[1]))
asyncio.run(agent.run("find k", session_id="s"))
"""


SRC = str(Path(__file__).resolve().parents[1] / "src")


def _killed_mid_loop(db: Path) -> None:
    script = db.with_suffix(".py")
    script.write_text(CRASHING)
    proc = subprocess.run(
        [sys.executable, str(script), str(db)],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr.decode()


async def test_a_run_killed_mid_loop_and_carried_on_stops_at_the_journal_count(
    tmp_path: Path,
) -> None:
    """SIGKILL inside the 4th identical call; the carried-on run (recovery re-runs that pure
    call) asks the model twice more, not six times."""
    db = tmp_path / "crash.db"
    await asyncio.to_thread(_killed_mid_loop, db)
    store = SQLiteStore(db)
    try:
        model = FunctionModel(same_call)
        agent = Agent(model=model, tools=[lookup], max_iterations=50)
        rt = Runtime(store, lease_ttl=0.05)
        went_on = await rt.run(agent, CarryOn(), session_id="s")
        assert went_on.stop_reason == "loop", went_on.error
        assert len(model.calls) == 2 and "6 times" in (went_on.error or "")
        stored_messages = await store.load_messages("s")
        assert tool_runs(stored_messages) == 6  # 3 before the kill, the 4th re-run, 2 more
    finally:
        await store.close()


async def test_runs_resumed_after_approvals_count_the_calls_of_the_runs_before() -> None:
    """Each call waits for approval, so each run makes one call; the resumed runs still add up
    (the journal holds them all) and the third identical call stops the exchange."""

    @tool
    def deploy(target: str) -> str:
        """Deploy (needs approval)."""
        return f"deployed {target}"

    def again(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])

    model = FunctionModel(again)
    agent = Agent(
        model=model,
        tools=[deploy],
        permissions={"ask": ["deploy"]},
        max_iterations=50,
        loop_detection={"max_repeats": 3},
    )
    result = await agent.run("ship it", session_id="s")
    stops = [result.stop_reason]
    while result.stop_reason == "awaiting_approval" and len(stops) < 10:
        result = await agent.resume("s", True)
        stops.append(result.stop_reason)
    assert stops == ["awaiting_approval"] * 3 + ["loop"]
    assert len(model.calls) == 3 and "deploy" in (result.error or "")


async def test_the_same_answer_rule_warns_once_before_it_stops() -> None:
    model = FunctionModel(same_call)
    settings = {"max_repeats": None, "same_answer": 3}
    agent = Agent(model=model, tools=[lookup], max_iterations=50, loop_detection=settings)
    result = await agent.run("go")
    assert result.stop_reason == "loop" and len(model.calls) == 3
    warned = [m for m in model.calls[2].messages if LOOP_WARNING in m.metadata]
    assert len(warned) == 1 and "same answer 2 times in a row" in warned[0].content
    assert not any(LOOP_WARNING in m.metadata for m in model.calls[1].messages)
    quiet = agent.replace(loop_detection={**settings, "warn": False})
    result = await quiet.run("go")
    stored_messages = await stored(quiet, result)
    assert result.stop_reason == "loop" and not any(
        LOOP_WARNING in m.metadata for m in stored_messages
    )


def test_canonical_arguments_match_the_plain_encoder_on_every_shape() -> None:
    """The prebuilt encoder (a hot path) writes what ``json.dumps`` with sorted keys writes
    after normalising numbers, and a circular value is still refused."""
    import json
    import math

    from loom.loop_detection import canonical_arguments

    def normal(v: Any) -> Any:
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {str(k): normal(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [normal(x) for x in v]
        return v

    cases: list[dict[str, Any]] = [
        {},
        {"b": 1, "a": "x"},
        {"a": 1.0, "b": [2.0, {"z": None, "y": "é\u2028"}], "c": True},
        {"n": 1.5, "big": 1e16, "neg": -0.0},
        {"s": "1.0 e+3"},
    ]
    for case in cases:
        want = json.dumps(normal(case), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert canonical_arguments(case) == want
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular"):
        canonical_arguments(loop)
