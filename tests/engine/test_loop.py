"""The turn: event order, concurrency, error results, limits, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from loom import Agent, AgentState, EventType, ModelResponse, ToolCall, tool
from loom.errors import ModelUnavailable
from loom.events import AgentEvent
from loom.messages import Message, Usage
from loom.models.base import ModelSettings, TextDelta
from loom.testing import FunctionModel, ScriptedModel

E = EventType


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def slow(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@tool
def boom() -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


def calls(*pairs: tuple[str, dict[str, object]]) -> ModelResponse:
    return ModelResponse(tool_calls=[ToolCall(name=n, arguments=a) for n, a in pairs])


async def collect(agent: Agent, message: str = "go", **kw: object) -> list[AgentEvent]:
    return [e async for e in agent.stream(message, **kw)]  # type: ignore[arg-type]


COMPONENTS = (
    E.CONTEXT_COMPONENT_INCLUDED,
    E.CONTEXT_COMPONENT_TRUNCATED,
    E.CONTEXT_COMPONENT_EXCLUDED,
)


def types(events: list[AgentEvent], *, skip: tuple[EventType, ...] = ()) -> list[EventType]:
    """Event types without state changes, deltas and context-component decisions."""
    noise = (E.STATE_CHANGE, E.LLM_DELTA, *COMPONENTS, *skip)
    return [e.type for e in events if e.type not in noise]


async def test_two_tool_run_event_sequence() -> None:
    model = ScriptedModel([calls(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})), "3 and 7"])
    events = await collect(Agent(model=model, tools=[add]))
    assert types(events) == [
        E.AGENT_START,
        E.USER_MESSAGE,  # the user's message enters the transcript after INTAKE
        E.ITERATION_START,
        E.CONTEXT_ASSEMBLY_START,
        E.CONTEXT_ASSEMBLY_COMPLETE,
        E.LLM_START,
        E.LLM_TOOL_CALLS,
        E.LLM_COMPLETE,
        E.TOOL_EXECUTION_START,
        E.TOOL_EXECUTION_START,
        E.TOOL_RESULT,
        E.TOOL_RESULT,
        E.RECURSION,
        E.ITERATION_START,
        E.CONTEXT_ASSEMBLY_START,
        E.CONTEXT_ASSEMBLY_COMPLETE,
        E.LLM_START,
        E.LLM_COMPLETE,
        E.PERSIST_START,
        E.AGENT_FINISH,
    ]
    assert [e.sequence for e in events] == list(range(len(events)))
    starts = [i for i, e in enumerate(events) if e.type is E.CONTEXT_ASSEMBLY_START]
    for i in starts:  # each assembly reports its component decisions before it completes
        assert events[i + 1].type in COMPONENTS
    assert len({(e.run_id, e.session_id) for e in events}) == 1
    assert [e.iteration for e in events if e.type is E.ITERATION_START] == [1, 2]
    results = [e.data["content"] for e in events if e.type is E.TOOL_RESULT]
    assert results == ["3", "7"]
    deltas = "".join(e.text for e in events if e.type is E.LLM_DELTA)
    assert deltas == "3 and 7"
    assert events[-1].data["stop_reason"] == "completed"
    states = [e.data["to"] for e in events if e.type is E.STATE_CHANGE]
    assert states[:4] == [
        AgentState.CALLING_LLM,
        AgentState.PROCESSING_LLM_RESPONSE,
        AgentState.EXECUTING_TOOLS,
        AgentState.POST_TOOLS_HOOK,
    ]
    assert states[-1] == AgentState.WAITING_FOR_USER_INPUT
    model.assert_all_consumed()


async def test_model_sees_tool_results_in_call_order() -> None:
    model = ScriptedModel([calls(("slow", {"seconds": 0.2}), ("slow", {"seconds": 0.01})), "ok"])
    result = await Agent(model=model, tools=[slow]).run("go")
    sent = model.calls[1].messages
    assistant = next(m for m in sent if m.role == "assistant")
    tool_msgs = [m for m in sent if m.role == "tool"]
    assert {m.tool_call_id for m in tool_msgs} == {c.id for c in assistant.tool_calls}
    assert result.output == "ok"


async def test_three_slow_tools_run_concurrently() -> None:
    model = ScriptedModel([calls(*[("slow", {"seconds": 0.3})] * 3), "done"])
    started = time.perf_counter()
    result = await Agent(model=model, tools=[slow]).run("go")
    elapsed = time.perf_counter() - started
    assert result.stop_reason == "completed"
    assert elapsed < 0.6, f"three 0.3 s tools took {elapsed:.2f} s: not concurrent"
    assert [m.content for m in result.messages if m.role == "tool"] == ["slept 0.3"] * 3


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (ToolCall(name="nope"), "unknown_tool"),
        (ToolCall(name="add", raw_arguments="{a: 1"), "invalid_json"),
        (ToolCall(name="add", arguments={"a": "x", "b": 2}), "invalid_arguments"),
        (ToolCall(name="add", arguments={"a": 1}), "invalid_arguments"),
        (ToolCall(name="add", arguments={"a": 1, "b": 2, "c": 3}), "invalid_arguments"),
        (ToolCall(name="boom"), "tool_exception"),
        (ToolCall(name="slow", arguments={"seconds": 5}), "timeout"),
    ],
)
async def test_bad_calls_become_error_results_and_the_loop_goes_on(
    call: ToolCall, code: str
) -> None:
    model = ScriptedModel([ModelResponse(tool_calls=[call]), "recovered"])
    agent = Agent(model=model, tools=[add, slow, boom], tool_timeout=0.2)
    events = await collect(agent)
    errors = [e for e in events if e.type is E.TOOL_ERROR]
    assert [e.data["error_code"] for e in errors] == [code]
    assert events[-1].data["stop_reason"] == "completed"
    assert events[-1].data["output"] == "recovered"
    tool_msg = next(m for m in model.calls[1].messages if m.role == "tool")
    assert tool_msg.content.startswith(f"Error ({code})")


async def test_partial_failure_is_aggregated_not_short_circuited() -> None:
    model = ScriptedModel([calls(("boom", {}), ("add", {"a": 2, "b": 2})), "ok"])
    result = await Agent(model=model, tools=[add, boom]).run("go")
    contents = sorted(m.content for m in result.messages if m.role == "tool")
    assert contents[0] == "4" and "disk on fire" in contents[1]


async def test_sync_tool_timeout_abandons_the_thread_and_flags_it() -> None:
    seen: list[bool] = []
    release = threading.Event()

    @tool(timeout=0.1)
    def stuck(ctx: RunContext) -> str:
        """Blocks until released."""
        release.wait(2)
        seen.append(ctx.cancelled)
        return "late"

    model = ScriptedModel([calls(("stuck", {})), "fine"])
    started = time.perf_counter()
    result = await Agent(model=model, tools=[stuck]).run("go")
    assert time.perf_counter() - started < 1.0
    assert result.messages[2].metadata["error_code"] == "timeout"
    release.set()
    for _ in range(50):
        if seen:
            break
        await asyncio.sleep(0.02)
    assert seen == [True]


async def test_max_iterations_stops_with_its_reason() -> None:
    model = FunctionModel(lambda m, t: calls(("add", {"a": 1, "b": 1})))
    result = await Agent(model=model, tools=[add], max_iterations=3).run("loop forever")
    assert result.stop_reason == "max_iterations"
    assert result.iterations == 3
    assert len(model.calls) == 3
    assert sum(m.role == "tool" for m in result.messages) == 3


async def test_max_tool_calls_refuses_the_excess_and_stops() -> None:
    model = FunctionModel(lambda m, t: calls(*[("add", {"a": 1, "b": 1})] * 4))
    result = await Agent(model=model, tools=[add], max_tool_calls=6).run("go")
    assert result.stop_reason == "max_tool_calls"
    tool_msgs = [m for m in result.messages if m.role == "tool"]
    assert len(tool_msgs) == 8  # every call has a result, even the refused ones
    assert sum(m.metadata.get("error_code") == "limit" for m in tool_msgs) == 2


async def test_turn_timeout_stops_and_closes_open_calls() -> None:
    model = ScriptedModel([calls(("slow", {"seconds": 5}))])
    agent = Agent(model=model, tools=[slow], timeout=0.3)
    started = time.perf_counter()
    result = await agent.run("go")
    assert time.perf_counter() - started < 2
    assert result.stop_reason == "timeout"
    assert result.messages[-1].role == "tool"
    assert result.messages[-1].metadata["error_code"] == "interrupted"


async def test_cancel_event_stops_with_cancelled_and_history_stays_valid() -> None:
    model = ScriptedModel([calls(("slow", {"seconds": 5})), "after"])
    agent = Agent(model=model, tools=[slow])
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, cancel.set)
    result = await agent.run("go", session_id="c1", cancel=cancel)
    assert result.stop_reason == "cancelled"
    history = await agent.store.load_messages("c1")
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[-1].metadata["error_code"] == "interrupted"
    again = await agent.run("continue", session_id="c1")
    assert again.output == "after"


async def test_leaving_the_stream_early_closes_the_turn() -> None:
    model = ScriptedModel([calls(("slow", {"seconds": 5}))])
    agent = Agent(model=model, tools=[slow])
    async for event in agent.stream("go", session_id="s"):
        if event.type is E.TOOL_EXECUTION_START:
            break
    await asyncio.sleep(0.05)
    history = await agent.store.load_messages("s")
    assert history[-1].role == "tool"
    assert history[-1].metadata["error_code"] == "interrupted"
    assert await agent.store.open_tool_calls("s") == []


async def test_empty_model_response_ends_with_model_error() -> None:
    result = await Agent(model=ScriptedModel([ModelResponse()])).run("hi")
    assert result.stop_reason == "model_error"
    assert "empty" in (result.error or "")


async def test_stream_cut_without_final_response_stores_no_partial_answer() -> None:
    class CutModel:
        name = "cut"

        async def stream(self, messages, tools, settings=None):  # type: ignore[no-untyped-def]
            yield TextDelta("half an ans")

    agent = Agent(model=CutModel())
    result = await agent.run("hi", session_id="cut")
    assert result.stop_reason == "model_error"
    history = await agent.store.load_messages("cut")
    assert [m.role for m in history] == ["user"]


async def test_provider_failure_is_a_stop_reason_not_a_crash() -> None:
    class DownModel:
        name = "down"

        async def stream(self, messages, tools, settings=None):  # type: ignore[no-untyped-def]
            raise ModelUnavailable("server at 127.0.0.1:1 refused the connection")
            yield  # pragma: no cover

    result = await Agent(model=DownModel()).run("hi")
    assert result.stop_reason == "model_error"
    assert "refused" in (result.error or "")


async def test_session_continues_across_runs() -> None:
    model = ScriptedModel(["first", "second"])
    agent = Agent(instructions="be brief", model=model)
    await agent.run("one", session_id="s1")
    result = await agent.run("two", session_id="s1")
    assert result.output == "second"
    sent = model.calls[1].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0].content == "be brief"
    assert [m.content for m in sent[1:]] == ["one", "first", "two"]


async def test_usage_and_run_result_fields() -> None:
    first = calls(("add", {"a": 1, "b": 2}))
    first.usage = Usage(input_tokens=30, output_tokens=5, requests=1)
    last = ModelResponse(text="3", usage=Usage(input_tokens=40, output_tokens=1, requests=1))
    model = ScriptedModel([first, last])
    result = await Agent(model=model, tools=[add]).run("sum")
    assert result.usage.requests == 2
    assert (result.usage.input_tokens, result.usage.output_tokens) == (70, 6)  # summed per call
    assert result.iterations == 2
    assert result.run_id.startswith("run_") and result.session_id.startswith("session_")
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]


async def test_events_are_persisted_before_they_are_announced() -> None:
    model = ScriptedModel([calls(("add", {"a": 1, "b": 2})), "3"])
    agent = Agent(model=model, tools=[add])
    async for event in agent.stream("go", session_id="p"):
        if event.type in (E.LLM_COMPLETE, E.TOOL_RESULT, E.AGENT_FINISH):
            stored = await agent.store.load_events("p")
            assert event in stored, f"{event.type} announced before it was stored"
        if event.type is E.TOOL_RESULT:
            history = await agent.store.load_messages("p")
            assert any(m.tool_call_id == event.data["tool_call_id"] for m in history)


async def test_programmer_errors_raise_typed_exceptions() -> None:
    from loom.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown model provider"):
        await Agent(model="nosuch:model").run("hi")


def test_message_is_validated_at_intake() -> None:
    from loom.errors import InputError

    agent = Agent(model=ScriptedModel(["x"]), max_message_chars=10)
    with pytest.raises(InputError, match="empty"):
        agent.run_sync("   ")
    with pytest.raises(InputError, match="max_message_chars"):
        agent.run_sync("x" * 11)
    with pytest.raises(InputError, match="on_busy"):
        agent.run_sync("hi", on_busy="later")  # type: ignore[arg-type]


async def test_run_sync_inside_a_loop_says_what_to_do() -> None:
    from loom.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"await agent\.run"):
        Agent(model=ScriptedModel(["x"])).run_sync("hi")


def test_hook_context_messages_type() -> None:
    assert Message.user("x").role == "user"


from loom.tools.base import RunContext  # noqa: E402  (used in a tool annotation above)


@pytest.mark.parametrize("forced", ["required", "add"])
async def test_a_forced_tool_choice_holds_until_a_tool_is_called_then_is_auto(
    forced: str,
) -> None:
    """The first call of each turn is forced; after the tool round the model may answer."""
    model = ScriptedModel(
        [calls(("add", {"a": 1, "b": 2})), "3", calls(("add", {"a": 2, "b": 2})), "4"]
    )
    agent = Agent(model=model, tools=[add], model_settings=ModelSettings(tool_choice=forced))
    result = await agent.run("1 + 2?")
    await agent.run("2 + 2?", session_id=result.session_id)
    sent = [c.settings.tool_choice if c.settings else None for c in model.calls]
    assert sent == [forced, "auto", forced, "auto"]
    assert agent.model_settings is not None and agent.model_settings.tool_choice == forced


async def test_reset_tool_choice_off_keeps_the_choice_forced_on_every_call() -> None:
    model = ScriptedModel([calls(("add", {"a": 1, "b": 2})), "3"])
    settings = ModelSettings(tool_choice="required", reset_tool_choice=False)
    agent = Agent(model=model, tools=[add], model_settings=settings)
    await agent.run("1 + 2?")
    assert [c.settings.tool_choice if c.settings else None for c in model.calls] == [
        "required",
        "required",
    ]


async def test_a_limit_stop_keeps_the_last_pure_result_in_the_run_result() -> None:
    """A quiet run holds a pure call's result into the next commit; when a limit stops the run
    right after it, that commit is the run's end, and ``RunResult.messages`` still has it."""

    @tool(effect="pure")
    def look(key: str) -> str:
        """Look a key up."""
        return f"nothing for {key}"

    model = FunctionModel(lambda m, t: calls(("look", {"key": "k"})))
    agent = Agent(model=model, tools=[look], max_iterations=2, loop_detection=False)
    result = await agent.run("go")
    assert result.stop_reason == "max_iterations"
    stored = await agent.store.load_messages(result.session_id)
    assert [m.role for m in result.messages] == [m.role for m in stored]
    assert sum(m.role == "tool" for m in result.messages) == 2
