"""Simulated users: a script or a model with a persona and a goal drives a multi-turn case in
one session; the goal met (the user says DONE, a done_when phrase or rubric holds) ends it, a
goal never met ends at max_turns and fails the case with that reason; assertions apply to the
whole conversation and every turn is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.errors import ConfigurationError
from loom.evals import (
    DatasetError,
    list_experiments,
    load_experiment,
    parse_dataset,
    run_experiment,
)
from loom.messages import Message, ToolSpec
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

SRC = str(Path(__file__).resolve().parents[2] / "src")
BOOKED: list[str] = []


@tool
def find_slots(people: int) -> str:
    """Free tables for this many people."""
    return f"tables for {people}: 19:00, 20:00"


@tool(effect="at_most_once")
def book_table(people: int, time: str) -> str:
    """Book a table."""
    BOOKED.append(f"{people}@{time}")
    return f"booked {people} at {time}"


def host(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    """The agent: asks what is missing, looks slots up, books once told a time."""
    last = messages[-1]
    if last.role == "tool":
        if last.content.startswith("booked"):
            return f"Booked: {last.content.removeprefix('booked ')}. Enjoy!"
        return f"I have {last.content.split(': ')[1]}. Which time?"
    text = last.content.lower()
    if "20:00" in text:
        return ModelResponse(
            tool_calls=[ToolCall(name="book_table", arguments={"people": 2, "time": "20:00"})]
        )
    if "2 people" in text:
        return ModelResponse(tool_calls=[ToolCall(name="find_slots", arguments={"people": 2})])
    return "How many people?"


def agent() -> Agent:
    return Agent("host", "Book tables.", model=FunctionModel(host), tools=[find_slots, book_table])


def diner(messages: list[Message], tools: list[ToolSpec]) -> str:
    """A simulated user: opens, answers the host's questions, says DONE once booked."""
    said = messages[-1].content
    if "conversation starts" in said:
        return "I'd like a table tonight."
    if "Booked" in said:
        return "DONE"
    if "Which time" in said:
        return "20:00 please"
    return "2 people"


BOOKING_ASSERTIONS = """
    assertions:
      - called_in_order: [find_slots, {name: book_table, arguments: {time: "20:00"}}]
      - calls_at_most: {tool: book_table, times: 1}
"""


async def test_a_model_user_with_a_goal_drives_the_conversation_until_it_says_done() -> None:
    user = FunctionModel(diner, name="diner")
    data = parse_dataset(
        """
cases:
  - id: book
    user:
      persona: a hungry regular who answers briefly
      goal: book a table for 2 people tonight
      max_turns: 6
"""
        + BOOKING_ASSERTIONS,
        "sim.yaml",
    )
    store = MemoryStore()
    experiment = await run_experiment(data, agent(), store=store, user_model=user)
    (result,) = experiment.results
    assert result.status == "passed", result.checks
    assert [(t["user"], t["agent"]) for t in result.turns] == [
        ("I'd like a table tonight.", "How many people?"),
        ("2 people", "I have 19:00, 20:00. Which time?"),
        ("20:00 please", "Booked: 2 at 20:00. Enjoy!"),
    ]
    goal = next(c for c in result.checks if c["name"] == "user.goal")
    assert goal["message"] == "the simulated user said its goal was met after 3 turn(s)"
    # one session: each turn's run continues the one before
    assert len({t["run_id"] for t in result.turns}) == 3
    assert [m.content for m in await store.load_messages(result.session_id) if m.role == "user"][
        :3
    ] == ["I'd like a table tonight.", "2 people", "20:00 please"]
    # the simulated user read its persona and goal, and the agent's answers as the other side
    system = user.calls[0].messages[0].content
    assert "hungry regular" in system and "book a table for 2 people tonight" in system
    assert [m.role for m in user.calls[1].messages] == ["system", "user", "assistant", "user"]
    assert user.calls[1].messages[2].content == "I'd like a table tonight."
    # stored with the experiment
    (stored,) = (await load_experiment(store, experiment.record.id)).results
    assert len(stored.turns) == 3


async def test_a_goal_never_met_ends_at_max_turns_and_fails_the_case() -> None:
    def stubborn(messages: list[Message], tools: list[ToolSpec]) -> str:
        return "Sorry, I cannot help with that."

    nagging = FunctionModel(lambda messages, tools: "Please book a table for 2 people.")
    data = parse_dataset(
        """
cases:
  - id: never
    input: Book me a table.
    user: {goal: get a table booked, max_turns: 3}
""",
        "sim.yaml",
    )
    store = MemoryStore()
    sorry = Agent("host", model=FunctionModel(stubborn), tools=[find_slots, book_table])
    (result,) = (await run_experiment(data, sorry, store=store, user_model=nagging)).results
    assert result.status == "failed"
    assert len(result.turns) == 3
    assert result.turns[0]["user"] == "Book me a table."  # the case's input opens
    goal = next(c for c in result.checks if c["name"] == "user.goal")
    assert not goal["passed"]
    assert goal["message"] == (
        "the goal was not met within max_turns (3): the conversation ran 3 turn(s)"
    )
    assert len(nagging.calls) == 3  # two next messages, and one look at the last answer


async def test_a_scripted_user_and_assertions_over_the_whole_conversation() -> None:
    BOOKED.clear()
    data = parse_dataset(
        """
cases:
  - id: scripted
    user: {script: ["Hi", "2 people", "20:00 then"]}
    expected: {contains: "Booked"}
"""
        + BOOKING_ASSERTIONS
        + """
  - id: wrong-order
    user: {script: ["Hi", "2 people"]}
    assertions: [{called: book_table}]
""",
        "sim.yaml",
    )
    results = {
        r.case_id: r for r in (await run_experiment(data, agent(), store=MemoryStore())).results
    }
    scripted = results["scripted"]
    assert scripted.status == "passed", scripted.checks
    assert [t["user"] for t in scripted.turns] == ["Hi", "2 people", "20:00 then"]
    assert [c["name"] for c in scripted.trajectory["tool_calls"]] == ["find_slots", "book_table"]
    assert BOOKED == ["2@20:00"]
    failed = results["wrong-order"]
    assert failed.status == "failed"
    assert {c["name"] for c in failed.checks if not c["passed"]} == {"called"}


async def test_done_when_a_phrase_or_a_judges_rubric_ends_the_conversation() -> None:
    data = parse_dataset(
        """
judge_model: judge
cases:
  - id: phrase
    user: {script: ["Hi", "2 people", "20:00", "thanks", "bye"], done_when: "booked:"}
  - id: rubric
    user:
      script: ["Hi", "2 people", "20:00", "thanks"]
      done_when: {rubric: the table is booked, threshold: 0.5}
  - id: never
    user: {script: ["Hi", "2 people"], done_when: "booked:"}
""",
        "sim.yaml",
    )

    def judge(messages: list[Message], tools: list[ToolSpec]) -> str:
        booked = "Booked" in messages[-1].content
        return json.dumps({"score": 1.0 if booked else 0.0, "reason": "read the answer"})

    experiment = await run_experiment(
        data, agent(), store=MemoryStore(), judge_model=FunctionModel(judge)
    )
    results = {r.case_id: r for r in experiment.results}
    assert results["phrase"].status == "passed" and len(results["phrase"].turns) == 3
    assert results["rubric"].status == "passed" and len(results["rubric"].turns) == 3
    assert "done_when passed in turn 3" in results["rubric"].checks[-1]["message"]
    assert results["never"].status == "failed"
    assert "never held" in results["never"].checks[-1]["message"]


def test_a_bad_simulated_user_is_a_dataset_error_naming_the_field() -> None:
    with pytest.raises(DatasetError, match=r"sim.yaml:4 \(field cases.0.user\).*needs a goal"):
        parse_dataset(
            "cases:\n  - id: x\n    input: hi\n    user:\n      persona: shy\n", "sim.yaml"
        )
    with pytest.raises(DatasetError, match=r"\(field cases.0.input\): Field required"):
        parse_dataset("cases:\n  - id: x\n", "sim.yaml")
    with pytest.raises(DatasetError, match="script, or a persona"):
        parse_dataset("cases:\n  - {id: x, user: {script: [a], goal: g}}\n", "sim.yaml")


async def test_a_goal_user_without_a_model_is_refused_before_anything_runs() -> None:
    store = MemoryStore()
    data = parse_dataset("cases:\n  - {id: x, input: hi, user: {goal: g}}\n", "sim.yaml")
    with pytest.raises(ConfigurationError, match=r"needs a model: give its user\.model"):
        await run_experiment(data, agent(), store=store)
    rubric = "cases:\n  - {id: x, user: {script: [hi], done_when: {rubric: booked}}}\n"
    with pytest.raises(ConfigurationError, match="done_when has a rubric"):
        await run_experiment(parse_dataset(rubric, "sim.yaml"), agent(), store=store)
    assert await list_experiments(store) == []


def test_the_cli_gives_simulated_users_a_model_with_user_model(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(
        "model: demo\ncases:\n  - {id: c, input: 'what is 2 + 3?', user: {goal: g, max_turns: 2}}\n"
    )
    agent = Path(__file__).resolve().parents[2] / "examples" / "agents" / "calculator.md"
    run = [sys.executable, "-m", "loom", "eval", "run", "d.yaml", "--agent", str(agent)]
    env = dict(os.environ, PYTHONPATH=SRC, NO_COLOR="1", COLUMNS="200")

    def loom(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*run, "--db", "e.db", *extra],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )

    refused = loom()
    assert refused.returncode == 2 and "--user-model" in refused.stderr
    ran = loom("--user-model", "test", "--fail-under", "1", "--report", "json", "r.json")
    assert ran.returncode == 1, ran.stdout + ran.stderr  # TestModel never says DONE
    (case,) = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert len(case["turns"]) == 2
    assert "not met within max_turns (2)" in case["checks"][-1]["message"]
