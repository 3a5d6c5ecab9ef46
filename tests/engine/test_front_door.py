"""The front door: ``Runtime.start(target, input, session_id=..., options=...)`` starts every
run, of an agent or a crew, for every kind of input; per-run overrides change that run only;
bad input is an ``InputError`` before anything is committed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Sequential
from loom.crew.turn import CrewTurn
from loom.engine.driving import discard
from loom.engine.loop import Turn
from loom.engine.run_inputs import Answer, CarryOn, NewMessage, Resume, RunOptions
from loom.engine.runtime import Runtime
from loom.errors import InputError
from loom.messages import Message, RunResult
from loom.store import MemoryStore
from loom.testing import FunctionModel, ScriptedModel

SRC = Path(__file__).resolve().parents[2] / "src" / "loom"

deployed: list[str] = []


@tool
def deploy(target: str) -> str:
    """Deploy to a target."""
    deployed.append(target)
    return f"deployed {target}"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def deployer() -> Agent:
    """Asks to deploy (a call that waits for approval), then answers."""

    def answer(messages: list[Message], tools: object) -> ModelResponse | str:
        if messages[-1].role == "tool":
            return f"done: {messages[-1].content}"
        return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])

    return Agent(
        name="deployer",
        model=FunctionModel(answer),
        tools=[deploy],
        permissions={"ask": ["deploy"]},
    )


def asker() -> Agent:
    """Asks the client to read a file (a server query), then answers with what it got."""

    def answer(messages: list[Message], tools: object) -> str:
        if messages[-1].metadata.get("server_query"):
            return f"it begins with {messages[-1].content.splitlines()[1]}"
        return "I need to read main.rs first."

    return Agent(
        name="asker",
        model=FunctionModel(answer),
        query_detector={"file_read": r"I need to read (?P<path>\S+)"},
    )


async def run(turn: Turn | CrewTurn) -> RunResult:
    await turn.run(discard)
    assert turn.result is not None
    return turn.result


# -- every input kind, on an agent and on a crew -------------------------------------------------
async def test_a_new_message_as_text_or_new_message_on_an_agent() -> None:
    rt = Runtime(MemoryStore())
    agent = Agent(model=ScriptedModel(["one", "two"]))
    turn = await rt.start(agent, "hello", session_id="s")
    assert isinstance(turn, Turn) and turn.result is None  # named, not started
    assert turn.run_id.startswith("run_") and turn.session_id == "s"
    assert await rt.store.load_events("s") == []  # nothing committed before it runs
    assert (await run(turn)).output == "one"
    again = await run(await rt.start(agent, NewMessage("again"), session_id="s"))
    assert again.output == "two"
    stored = await rt.store.load_messages("s")
    assert [m.content for m in stored if m.role == "user"] == ["hello", "again"]


async def test_resume_continues_the_parked_call() -> None:
    deployed.clear()
    rt = Runtime(MemoryStore())
    agent = deployer()
    first = await run(await rt.start(agent, "ship it", session_id="s"))
    assert first.stop_reason == "awaiting_approval" and deployed == []
    done = await run(await rt.start(agent, Resume(True), session_id="s"))
    assert done.stop_reason == "completed" and done.output == "done: deployed prod"
    assert deployed == ["prod"]


async def test_answer_continues_the_turn_that_asked() -> None:
    rt = Runtime(MemoryStore())
    agent = asker()
    first = await run(await rt.start(agent, "what does main do?", session_id="s"))
    assert first.stop_reason == "awaiting_input" and first.pending_query is not None
    query_id = first.pending_query["query_id"]
    answer = Answer("fn main() {}", query_id=query_id)
    done = await run(await rt.start(agent, answer, session_id="s"))
    assert done.stop_reason == "completed" and done.output == "it begins with fn main() {}"


async def test_carry_on_goes_on_from_the_transcript_without_a_new_message() -> None:
    def answer(messages: list[Message], tools: object) -> ModelResponse | str:
        if messages[-1].role == "tool":
            return f"found {messages[-1].content}"
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": "k"})])

    rt = Runtime(MemoryStore())
    agent = Agent(model=FunctionModel(answer), tools=[lookup])
    # one model call only for this run: it stops after the tool ran, before answering
    cut = await run(
        await rt.start(agent, "find k", session_id="s", options=RunOptions(max_iterations=1))
    )
    assert cut.stop_reason == "max_iterations"
    went_on = await run(await rt.start(agent, CarryOn(), session_id="s"))
    assert went_on.stop_reason == "completed" and went_on.output == "found value of k"
    stored = await rt.store.load_messages("s")
    assert [m.content for m in stored if m.role == "user"] == ["find k"]  # no new message


def release_crew() -> Crew:
    builder = Agent(name="builder", model=ScriptedModel(["built"]))
    return Crew(
        "rel",
        members={"builder": builder, "shipper": deployer()},
        plan=Sequential("builder", "shipper"),
    )


async def test_a_crew_takes_a_new_message_resume_and_carry_on() -> None:
    deployed.clear()
    rt = Runtime(MemoryStore())
    crew = release_crew()
    turn = await rt.start(crew, "release 1.2", session_id="c")
    assert isinstance(turn, CrewTurn) and turn.session_id == "c"
    parked = await run(turn)
    assert parked.stop_reason == "awaiting_approval" and deployed == []
    assert [p["member_path"] for p in parked.pending_approvals] == ["rel/shipper"]
    # carry on with no decision: the crew runs again, the parked member stays parked
    still = await run(await rt.start(crew, CarryOn(), session_id="c"))
    assert still.stop_reason == "awaiting_approval" and deployed == []
    done = await run(await rt.start(crew, Resume({"rel/shipper": True}), session_id="c"))
    assert done.stop_reason == "completed" and done.output == "done: deployed prod"
    assert deployed == ["prod"]


async def test_crew_run_stream_and_resume_go_through_start() -> None:
    started: list[tuple[str, str]] = []

    class Counting(Runtime):
        async def start(self, target: Any, input: Any, **kw: Any) -> Any:
            started.append((type(target).__name__, type(input).__name__))
            return await super().start(target, input, **kw)

    deployed.clear()
    rt = Counting(MemoryStore())
    crew = release_crew()
    res = await crew.run("release 1.2", session_id="c", runtime=rt)
    assert res.stop_reason == "awaiting_approval"
    done = await crew.resume("c", True, runtime=rt)
    assert done.stop_reason == "completed"
    [_ async for _ in crew.stream("release 1.3", session_id="d", runtime=rt)]
    assert ("Crew", "str") in started and ("Crew", "Resume") in started
    assert ("Agent", "str") in started  # the members' runs too
    assert ("Agent", "Resume") in started  # the parked member's own turn goes on


# -- per-run overrides: this run only, the agent unchanged ----------------------------------------
async def test_a_model_override_runs_this_turn_on_that_model_only() -> None:
    own, other = ScriptedModel(["mine"], name="own"), ScriptedModel(["other"], name="other")
    agent = Agent(model=own)
    before = dict(agent.given)
    rt = Runtime(MemoryStore())
    assert (await rt.run(agent, "a", session_id="s", options=RunOptions(model=other))).output == (
        "other"
    )
    assert (await rt.run(agent, "b", session_id="s")).output == "mine"
    assert agent.model_spec is own and dict(agent.given) == before
    assert len(other.calls) == 1 and len(own.calls) == 1
    starts = [e for e in await rt.store.load_events("s") if e.type == "agent_start"]
    assert [e.extra["model"] for e in starts] == ["other", "own"]  # what each run ran with


async def test_a_model_override_by_keyword_on_agent_run() -> None:
    own, other = ScriptedModel(["mine"]), ScriptedModel(["other"])
    agent = Agent(model=own)
    assert (await agent.run("a", model=other)).output == "other"
    assert (await agent.run("b")).output == "mine"
    assert agent.model_spec is own and len(other.calls) == 1 and len(own.calls) == 1


async def test_an_extra_tool_is_offered_and_runs_for_that_run_only() -> None:
    seen: list[list[str]] = []

    def answer(messages: list[Message], tools: Any) -> ModelResponse | str:
        names = [t.name for t in tools]
        seen.append(names)
        if messages[-1].role == "tool":
            return messages[-1].content
        if "lookup" in names:
            return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": "x"})])
        return "no tools"

    agent = Agent(model=FunctionModel(answer))
    rt = Runtime(MemoryStore())
    with_tool = await rt.run(agent, "look x up", options=RunOptions(extra_tools=[lookup]))
    assert with_tool.output == "value of x"
    assert "lookup" in seen[0]
    plain = await rt.run(agent, "again")
    assert plain.output == "no tools" and "lookup" not in seen[-1]
    assert dict(agent.tools) == {} and agent.tool_specs == []


class Verdict(BaseModel):
    ok: bool


async def test_an_output_type_override_types_that_run_only() -> None:
    agent = Agent(model=ScriptedModel(['{"ok": true}', "plain text"]))
    rt = Runtime(MemoryStore())
    typed = await rt.run(agent, "judge", options=RunOptions(output_type=Verdict))
    assert typed.output == Verdict(ok=True)
    text = await rt.run(agent, "again")
    assert text.output == "plain text"
    assert agent.output_type is None and agent.output_spec is None


async def test_limit_overrides_apply_to_that_run_only() -> None:
    def answer(messages: list[Message], tools: object) -> ModelResponse:
        return ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"key": "k"})])

    agent = Agent(model=FunctionModel(answer), tools=[lookup], max_iterations=3)
    rt = Runtime(MemoryStore())
    one = await rt.run(agent, "a", session_id="s", options=RunOptions(max_iterations=1))
    assert one.stop_reason == "max_iterations" and "max_iterations=1" in (one.error or "")
    calls = await rt.run(agent, "b", session_id="t", options=RunOptions(max_tool_calls=2))
    assert calls.stop_reason == "max_tool_calls" and "max_tool_calls=2" in (calls.error or "")
    own = await rt.run(agent, "c", session_id="u")
    assert own.stop_reason == "max_iterations" and "max_iterations=3" in (own.error or "")
    assert agent.max_iterations == 3 and agent.max_tool_calls == 50


async def test_a_queue_timeout_override_bounds_this_runs_wait_only() -> None:
    import asyncio

    from loom.errors import QueueTimeout

    release, holding = asyncio.Event(), asyncio.Event()

    async def answer(messages: list[Message], tools: object) -> str:
        holding.set()
        await release.wait()
        return "held"

    agent = Agent(model=FunctionModel(answer))  # queue_timeout 30 s
    rt = Runtime(MemoryStore())
    first = asyncio.ensure_future(rt.run(agent, "hold", session_id="s"))
    await holding.wait()
    with pytest.raises(QueueTimeout, match=r"waited 0\.05 s"):
        await rt.run(agent, "wait", session_id="s", options=RunOptions(queue_timeout=0.05))
    assert agent.queue_timeout == 30.0
    release.set()
    assert (await first).output == "held"


# -- bad input: InputError, nothing committed ----------------------------------------------------
async def committed(rt: Runtime, session_id: str) -> int:
    return len(await rt.store.load_events(session_id))


async def test_bad_inputs_are_input_errors_before_anything_is_committed() -> None:
    rt = Runtime(MemoryStore())
    agent, plain = asker(), Agent(model=ScriptedModel(["hi"]))
    await rt.run(plain, "hello", session_id="done")  # a session that waits on nothing
    await rt.run(agent, "what does main do?", session_id="asking")  # waits on a query
    before = {s: await committed(rt, s) for s in ("done", "asking")}

    cases: list[tuple[Any, Any, str | None, Any, str]] = [
        (plain, 42, "done", None, "a str .*NewMessage.*Resume.*Answer.*CarryOn.*got int"),
        (plain, {"text": "hi"}, "done", None, "got dict"),
        (plain, Resume(True), "done", None, "no tool calls waiting for approval"),
        (plain, Answer("x"), "done", None, "no server query waiting"),
        (agent, Answer("x", query_id="query_nope"), "asking", None, "not 'query_nope'"),
        (agent, Answer(42), "asking", None, "must be text"),  # type: ignore[arg-type]
        (plain, Resume(True), None, None, "pass the session_id"),
        (
            plain,
            "hi",
            "done",
            {"model": "x"},
            "options must be a loom.engine.run_inputs.RunOptions",
        ),
        (plain, "hi", "done", RunOptions(on_busy="wait"), "on_busy must be"),  # type: ignore[arg-type]
        (plain, "hi", "done", RunOptions(model="nope:model"), "unknown model provider 'nope'"),
        (agent, "hi", "asking", RunOptions(extra_tools=[deploy, deploy]), "extra tool 'deploy'"),
        (plain, "hi", "done", RunOptions(max_iterations=0), "max_iterations must be"),
        (plain, "", "done", None, "message is empty"),
        (object(), "hi", "done", None, "must be an Agent or a Crew"),
    ]
    for target, what, sid, options, error in cases:
        with pytest.raises(InputError, match=error):
            await rt.start(target, what, session_id=sid, options=options)
    assert {s: await committed(rt, s) for s in ("done", "asking")} == before
    assert await rt.pending_query("asking") is not None  # still waiting on its query


async def test_an_extra_tool_named_like_the_agents_own_is_an_input_error() -> None:
    rt = Runtime(MemoryStore())
    agent = Agent(model=ScriptedModel(["x"]), tools=[lookup])
    with pytest.raises(InputError, match="extra tool 'lookup' has the name of another tool"):
        await rt.start(agent, "hi", session_id="s", options=RunOptions(extra_tools=[lookup]))
    with pytest.raises(InputError, match="extra_tools must be a list of tools, got str"):
        RunOptions(extra_tools="lookup")  # type: ignore[arg-type]
    assert await rt.store.load_events("s") == []


async def test_bad_crew_inputs_are_input_errors_before_anything_is_committed() -> None:
    rt = Runtime(MemoryStore())
    crew = release_crew()
    for what, options, error in [
        (Answer("x"), None, "a crew asks no server queries"),
        (Resume(True), None, "no member call waiting for approval"),
        (CarryOn(), None, "no crew run to carry on"),
        ("go", RunOptions(model=ScriptedModel([])), "takes no per-run model"),
        ("   ", None, "non-empty text"),
    ]:
        with pytest.raises(InputError, match=error):
            await rt.start(crew, what, session_id="c", options=options)
    assert await rt.store.load_events("c") == []
    assert await rt.store.get_session("c") is None


# -- the old doors are gone ----------------------------------------------------------------------
def test_no_module_defines_or_calls_the_prepare_family() -> None:
    door = re.compile(r"\bprepare(_resume|_answer)?\s*\(")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            hit = door.search(line)
            # graphlib.TopologicalSorter.prepare() is the standard library's, not a door
            if hit and "sorter.prepare()" not in line:
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert found == [], "use Runtime.start instead:\n" + "\n".join(found)


# -- the server's runtime admits at the door ------------------------------------------------------
async def test_the_server_runtime_admits_every_run_at_start() -> None:
    from loom.errors import QueueFull
    from loom.server.lifecycle import ServerRuntime
    from loom.server.security import Principal, current_principal

    rt = ServerRuntime(MemoryStore(), max_concurrent_runs=1)
    token = current_principal.set(Principal("alice", b"digest"))
    try:
        crew_run = await rt.start(release_crew(), "release", session_id="c")
        assert rt.live_turns("alice") == [crew_run]  # a crew run counts like a turn
        with pytest.raises(QueueFull, match="'alice' has 1 runs in progress"):
            await rt.start(Agent(model=ScriptedModel(["x"])), "hi", session_id="s")
        # a member run of the crew (it names its crew run as parent) counts as the crew's
        member = await rt.start(
            Agent(model=ScriptedModel(["x"])),
            "hi",
            session_id="c:rel/m",
            options=RunOptions(parent_run_id=crew_run.run_id),
        )
        assert set(rt.live_turns("alice")) == {crew_run, member}
        rt.track(crew_run)  # counted once: tracking again is a no-op
        assert len(rt.live_turns("alice")) == 2
    finally:
        current_principal.reset(token)
