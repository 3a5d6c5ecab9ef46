"""``loom eval capture``: a stored session becomes a case whose tool calls are answered from the
recording. A captured session replayed offline reproduces the recorded trajectory exactly; an
agent changed so that it calls another tool fails the case's trajectory assertion; unmatched
calls fail with the closest recorded call named, or run the real tool when the case allows;
another owner's session is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.evals import (
    CaptureRefused,
    Dataset,
    capture_case,
    load_dataset,
    run_experiment,
)
from loom.evals.capture import OWNER_NAMESPACE, dataset_yaml
from loom.messages import Message, ToolSpec
from loom.store.base import capabilities_of
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel, ScriptedModel
from loom.tools.base import FunctionTool

SRC = str(Path(__file__).resolve().parents[2] / "src")

SIDE_EFFECTS: list[str] = []  # what the real tools did: a replay must leave it as it was


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    SIDE_EFFECTS.append(f"lookup {order_id}")
    return f"order {order_id}: 2 mugs, 18 EUR, delivered"


@tool(effect="at_most_once")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    SIDE_EFFECTS.append(f"refund {order_id} {amount}")
    return f"refunded {amount} EUR on {order_id} (ref R-{len(SIDE_EFFECTS)})"


@tool(effect="at_most_once")
def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    SIDE_EFFECTS.append(f"cancel {order_id}")
    return f"cancelled {order_id}"


TOOLS = [lookup_order, refund, cancel_order]
RECORDED_ANSWER = "I refunded 18 EUR on order A7 (ref R-2)."


def support_model() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(name="lookup_order", arguments={"order_id": "A7"})]),
            ModelResponse(
                tool_calls=[ToolCall(name="refund", arguments={"order_id": "A7", "amount": 18})]
            ),
            RECORDED_ANSWER,
        ],
        name="support-model",
    )


def tool_results(messages: list[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "tool"]


@pytest.fixture
async def recorded(tmp_path: Path) -> Any:
    """A store holding one recorded support session; yields (store, session id, tool results)."""
    store = SQLiteStore(tmp_path / "loom.db")
    agent = Agent("support", "Help with orders.", model=support_model(), tools=TOOLS)
    result = await agent.runtime.__class__(store).run(agent, "Refund my order A7 please")
    assert result.text == RECORDED_ANSWER
    SIDE_EFFECTS.clear()
    yield store, result.session_id, tool_results(result.messages)
    await store.close()


def replay_agent(model: Any = None, instructions: str = "Help with orders.") -> Agent:
    return Agent("support", instructions, model=model or "demo", tools=TOOLS)


async def test_a_captured_session_replayed_offline_reproduces_the_recorded_trajectory(
    recorded: Any,
) -> None:
    store, session_id, results = recorded
    case = await capture_case(store, session_id, replay_model=True)
    assert case.input == "Refund my order A7 please"
    assert case.expected is not None and case.expected.text == RECORDED_ANSWER
    assert case.assertions == [
        {
            "called_in_order": [
                {"name": "lookup_order", "arguments": {"order_id": "A7"}},
                {"name": "refund", "arguments": {"order_id": "A7", "amount": 18}},
            ]
        }
    ]
    assert case.environment is not None
    assert [c.content for c in case.environment.calls] == results
    # through a file and back, as `loom eval capture -o` writes it
    dataset = Dataset.model_validate(
        __import__("yaml").safe_load(dataset_yaml(Dataset(cases=[case])))
    )
    experiment = await run_experiment(dataset, replay_agent(), store=store)
    (outcome,) = experiment.results
    assert outcome.status == "passed", outcome.checks
    assert outcome.output == RECORDED_ANSWER
    assert [(c["name"], c["arguments"]) for c in outcome.trajectory["tool_calls"]] == [
        ("lookup_order", {"order_id": "A7"}),
        ("refund", {"order_id": "A7", "amount": 18}),
    ]
    replayed = await store.load_messages(outcome.session_id)
    assert tool_results(replayed) == results  # the same results, from the recording
    assert SIDE_EFFECTS == []  # offline: no real tool ran


def follows_instructions(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    """A stand-in for a model that does what its instructions say: told to cancel, it cancels;
    otherwise it looks the order up, refunds it and says so, as the recorded model did."""
    system = " ".join(m.content for m in messages if m.role == "system")
    done = [m.name for m in messages if m.role == "tool"]
    if "Cancel" in system:
        if not done:
            return ModelResponse(
                tool_calls=[ToolCall(name="cancel_order", arguments={"order_id": "A7"})]
            )
        return "I cancelled it."
    if not done:
        return ModelResponse(
            tool_calls=[ToolCall(name="lookup_order", arguments={"order_id": "A7"})]
        )
    if len(done) == 1:
        return ModelResponse(
            tool_calls=[ToolCall(name="refund", arguments={"order_id": "A7", "amount": 18.0})]
        )
    return RECORDED_ANSWER


async def test_changing_the_agents_instructions_to_call_another_tool_fails_the_case(
    recorded: Any,
) -> None:
    store, session_id, _ = recorded
    case = await capture_case(store, session_id)  # the agent's own model answers
    dataset = Dataset(cases=[case])
    model = FunctionModel(follows_instructions)
    same = await run_experiment(dataset, replay_agent(model), store=store)
    assert same.results[0].status == "passed", same.results[0].checks

    changed = replay_agent(model, instructions="Cancel orders instead.")
    (outcome,) = (await run_experiment(dataset, changed, store=store)).results
    assert outcome.status == "failed"
    failed = {c["name"]: c["message"] for c in outcome.checks if not c["passed"]}
    assert set(failed) == {"called_in_order", "environment", "expected.text"}
    assert failed["called_in_order"].startswith("expected calls in order lookup_order")
    assert failed["environment"] == (
        'the call cancel_order({"order_id": "A7"}) has no recorded result (closest recorded '
        'call: lookup_order({"order_id": "A7"}))'
    )
    assert SIDE_EFFECTS == []  # the unmatched call did not run the real tool


async def test_an_unmatched_call_runs_the_real_tool_when_the_case_allows(recorded: Any) -> None:
    store, session_id, _ = recorded
    case = await capture_case(store, session_id, unmatched="run_real", expect="none")
    script: list[ModelResponse | str] = [
        ModelResponse(tool_calls=[ToolCall(name="lookup_order", arguments={"order_id": "B9"})]),
        "done",
    ]
    experiment = await run_experiment(
        Dataset(cases=[case]), replay_agent(ScriptedModel(script)), store=store
    )
    (outcome,) = experiment.results
    environment = next(c for c in outcome.checks if c["name"] == "environment")
    assert environment["passed"] and "1 run for real" in environment["message"]
    assert SIDE_EFFECTS == ["lookup B9"]


async def test_a_repeated_identical_call_takes_the_next_recording(tmp_path: Path) -> None:
    counter = iter(range(1, 10))

    @tool
    def next_ticket(queue: str) -> str:
        """The next ticket of a queue."""
        return f"ticket {next(counter)} of {queue}"

    twice = ModelResponse(tool_calls=[ToolCall(name="next_ticket", arguments={"queue": "q"})])
    store = SQLiteStore(tmp_path / "loom.db")
    try:
        agent = Agent("t", model=ScriptedModel([twice, twice, "ok"]), tools=[next_ticket])
        recorded = await agent.runtime.__class__(store).run(agent, "two tickets")
        case = await capture_case(store, recorded.session_id, replay_model=True)
        replay = Agent("t", model="demo", tools=[next_ticket])
        (outcome,) = (await run_experiment(Dataset(cases=[case]), replay, store=store)).results
        assert outcome.status == "passed", outcome.checks
        assert tool_results(await store.load_messages(outcome.session_id)) == [
            "ticket 1 of q",
            "ticket 2 of q",
        ]
        assert next(counter) == 3  # the real tool ran only while recording
        # a third identical call has no recording left: the case fails naming it
        thrice = ScriptedModel([twice, twice, twice, "ok"])
        case = await capture_case(store, recorded.session_id, expect="none")
        (outcome,) = (
            await run_experiment(
                Dataset(cases=[case]), Agent("t", model=thrice, tools=[next_ticket]), store=store
            )
        ).results
        assert outcome.status == "failed"
        assert "next_ticket" in next(c for c in outcome.checks if not c["passed"])["message"]
    finally:
        await store.close()


async def test_a_later_turn_continues_the_stored_session(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    try:
        agent = Agent("t", model=ScriptedModel(["hello", "bye"]))
        runtime = agent.runtime.__class__(store)
        first = await runtime.run(agent, "hi")
        await runtime.run(agent, "see you", session_id=first.session_id)
        case = await capture_case(store, first.session_id, turn=2, replay_model=True)
        assert not isinstance(case.input, str)
        assert (case.input.session, case.input.checkpoint, case.input.message) == (
            first.session_id,
            1,
            "see you",
        )
        assert case.expected is not None and case.expected.text == "bye"
        (outcome,) = (
            await run_experiment(Dataset(cases=[case]), Agent("t", model="demo"), store=store)
        ).results
        assert outcome.status == "passed", outcome.checks
        with pytest.raises(Exception, match="turns 1 to 2, not 3"):
            await capture_case(store, first.session_id, turn=3)
    finally:
        await store.close()


async def test_another_owners_session_is_refused(recorded: Any) -> None:
    from loom.server.ownership import OWNER_NS

    assert OWNER_NAMESPACE == OWNER_NS  # the server's record of who owns a thread
    store, session_id, _ = recorded
    kv = capabilities_of(store).kv
    assert kv is not None
    await kv.put_value(OWNER_NAMESPACE, session_id, "alice")
    with pytest.raises(CaptureRefused, match=r"belongs to 'alice'.*--as alice"):
        await capture_case(store, session_id)
    with pytest.raises(CaptureRefused, match=r"you \('bob'\)"):
        await capture_case(store, session_id, owner="bob")
    assert (await capture_case(store, session_id, owner="alice")).environment is not None
    assert (await capture_case(store, session_id, any_owner=True)).environment is not None


def loom(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp)]), NO_COLOR="1"),
        timeout=120,
    )


AGENT_PY = """\
from loom import Agent, tool


@tool
def lookup_order(order_id: str) -> str:
    \"\"\"Look an order up.\"\"\"
    raise RuntimeError("offline: the recording answers")


@tool(effect="at_most_once")
def refund(order_id: str, amount: float) -> str:
    \"\"\"Refund an order.\"\"\"
    raise RuntimeError("offline: the recording answers")


@tool(effect="at_most_once")
def cancel_order(order_id: str) -> str:
    \"\"\"Cancel an order.\"\"\"
    raise RuntimeError("offline: the recording answers")


TOOLS = [lookup_order, refund, cancel_order]
agent = Agent("support", "Help with orders.", model="demo", tools=TOOLS)
"""


APPEND = ("--append", "--id", "contains", "--expect", "contains", "--replay-model")


async def test_the_cli_captures_appends_refuses_and_the_case_runs(recorded: Any) -> None:
    store, session_id, _ = recorded
    tmp = Path(store.path).parent
    (tmp / "agent.py").write_text(AGENT_PY, encoding="utf-8")
    db = str(tmp / "loom.db")
    printed = loom(tmp, "eval", "capture", session_id, "--db", db, "--replay-model")
    assert printed.returncode == 0, printed.stderr
    assert "lookup_order" in printed.stdout and "environment:" in printed.stdout
    made = loom(tmp, "eval", "capture", session_id, "--db", db, "--replay-model", "-o", "d.yaml")
    assert made.returncode == 0, made.stderr
    again = loom(tmp, "eval", "capture", session_id, "--db", db, "-o", "d.yaml")
    assert again.returncode == 2 and "--append" in again.stderr
    added = loom(tmp, "eval", "capture", session_id, "--db", db, "-o", "d.yaml", *APPEND)
    assert added.returncode == 0, added.stderr
    assert [c.id for c in load_dataset(tmp / "d.yaml").cases] == [
        f"{session_id}-turn1",
        "contains",
    ]
    ran = loom(tmp, "eval", "run", "d.yaml", "--agent", "agent.py:agent", "--db", db)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 case(s) run now" in ran.stderr
    await capabilities_of(store).kv.put_value(  # type: ignore[union-attr]
        OWNER_NAMESPACE, session_id, "alice"
    )
    refused = loom(tmp, "eval", "capture", session_id, "--db", db, "--as", "bob")
    assert refused.returncode == 2 and "belongs to 'alice'" in refused.stderr


def test_the_example_dataset_of_captured_cases_and_a_simulated_user_passes(
    tmp_path: Path,
) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "agents"
    ran = loom(
        tmp_path,
        "eval",
        "run",
        str(examples / "calculator.captured.evals.yaml"),
        "--agent",
        str(examples / "calculator.md"),
        "--db",
        "e.db",
        "--fail-under",
        "1",
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 passed, 0 failed, 0 errored" in ran.stdout


async def test_a_recorded_failure_replays_as_the_same_failure(tmp_path: Path) -> None:
    @tool
    def flaky(x: int) -> str:
        """Fails."""
        raise ValueError("no such thing")

    call = ModelResponse(tool_calls=[ToolCall(name="flaky", arguments={"x": 1})])
    store = SQLiteStore(tmp_path / "loom.db")
    try:
        agent = Agent("f", model=ScriptedModel([call, "it failed"]), tools=[flaky])
        recorded = await agent.runtime.__class__(store).run(agent, "go")
        case = await capture_case(store, recorded.session_id, replay_model=True)
        assert case.environment is not None
        (failure,) = case.environment.calls
        assert (failure.success, failure.error_code, failure.content) == (
            False,
            "tool_exception",
            "ValueError: no such thing",
        )
        mended = FunctionTool(lambda x: "fine now", name="flaky", description="Fails.")
        replay = Agent("f", model="demo", tools=[mended])  # the real tool would not fail
        (outcome,) = (await run_experiment(Dataset(cases=[case]), replay, store=store)).results
        assert outcome.status == "passed", outcome.checks

        def without_error_id(messages: list[Message]) -> list[str]:
            return [text.split("\n[Error ID")[0] for text in tool_results(messages)]

        assert without_error_id(await store.load_messages(outcome.session_id)) == [
            "Error (tool_exception): Tool 'flaky' failed: ValueError: no such thing"
        ]
        assert without_error_id(recorded.messages) == without_error_id(
            await store.load_messages(outcome.session_id)
        )
    finally:
        await store.close()
