"""Lifecycle hooks: order, denial, argument replacement, per-call messages, failures."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loom import Agent, EventType, ModelResponse, ToolCall, tool
from loom.errors import ConfigurationError, HookDefinitionError
from loom.hooks import (
    Deny,
    HookContext,
    LoggingHook,
    MetricsHook,
    ReplaceArguments,
    compile_hooks,
)
from loom.messages import Message
from loom.testing import ScriptedModel


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def one_call(**arguments: Any) -> list[ModelResponse | str]:
    return [ModelResponse(tool_calls=[ToolCall(name="echo", arguments=arguments)]), "done"]


class Recorder:
    def __init__(self) -> None:
        self.points: list[str] = []

    def __getattr__(self, point: str) -> Any:
        if not point.startswith(("before_", "after_", "post_")):
            raise AttributeError(point)

        async def record(ctx: HookContext, *args: Any) -> None:
            self.points.append(point)

        return record


async def test_hooks_fire_in_the_seed_order() -> None:
    rec = Recorder()
    await Agent(model=ScriptedModel(one_call(text="x")), tools=[echo], hooks=[rec]).run("go")
    assert rec.points == [
        "before_iteration_start",
        "before_context_assembly",
        "after_context_assembly",
        "before_llm_call",
        "after_llm_response",
        "before_tool_execution",
        "after_tool_execution",
        "post_tools",
        "before_recursion",
        "before_iteration_start",
        "before_context_assembly",
        "after_context_assembly",
        "before_llm_call",
        "after_llm_response",
        "after_iteration_end",
    ]


async def test_before_tool_execution_can_deny_a_call() -> None:
    class Guard:
        async def before_tool_execution(self, ctx: HookContext, call: ToolCall) -> Deny:
            return Deny("echo is switched off today")

    model = ScriptedModel(one_call(text="x"))
    events = [e async for e in Agent(model=model, tools=[echo], hooks=[Guard()]).stream("go")]
    errors = [e for e in events if e.type is EventType.TOOL_ERROR]
    assert [e.data["error_code"] for e in errors] == ["denied"]
    assert not [e for e in events if e.type is EventType.TOOL_EXECUTION_START]
    tool_msg = next(m for m in model.calls[1].messages if m.role == "tool")
    assert "switched off" in tool_msg.content


async def test_hooks_compose_in_order_and_can_replace_arguments() -> None:
    seen: list[dict[str, Any]] = []

    class Rewrite:
        def before_tool_execution(self, ctx: HookContext, call: ToolCall) -> ReplaceArguments:
            return ReplaceArguments({"text": call.arguments["text"].upper()})

    class Observe:
        def before_tool_execution(self, ctx: HookContext, call: ToolCall) -> None:
            seen.append(call.arguments)

    model = ScriptedModel(one_call(text="quiet"))
    result = await Agent(model=model, tools=[echo], hooks=[Rewrite(), Observe()]).run("go")
    assert seen == [{"text": "QUIET"}]
    assert next(m for m in result.messages if m.role == "tool").content == "QUIET"


async def test_before_llm_call_adds_messages_for_that_call_only() -> None:
    class Remind:
        async def before_llm_call(self, ctx: HookContext, messages: list[Message]) -> list[Message]:
            return [Message.system(f"reminder {ctx.iteration}")]

    model = ScriptedModel(["a", "b"])
    agent = Agent(model=model, hooks=[Remind()])
    await agent.run("one", session_id="s")
    await agent.run("two", session_id="s")
    assert model.calls[0].messages[-1].content == "reminder 1"
    second = [m.content for m in model.calls[1].messages]
    assert second[-1] == "reminder 1" and "reminder 1" not in second[:-1]
    stored = await agent.store.load_messages("s")
    assert not any(m.content.startswith("reminder") for m in stored)


async def test_a_raising_hook_stops_the_run_with_an_error_event() -> None:
    class Broken:
        async def before_llm_call(self, ctx: HookContext, messages: list[Message]) -> None:
            raise ValueError("bad hook")

    model = ScriptedModel(["never"])
    events = [e async for e in Agent(model=model, hooks=[Broken()]).stream("go")]
    assert events[-1].data["stop_reason"] == "error"
    errors = [e for e in events if e.type is EventType.ERROR]
    assert errors and "bad hook" in errors[0].data["error"]
    assert model.calls == []


async def test_a_non_fatal_hook_is_reported_and_the_run_goes_on() -> None:
    class Flaky:
        fatal = False

        async def before_llm_call(self, ctx: HookContext, messages: list[Message]) -> None:
            raise ValueError("metrics backend down")

    events = [e async for e in Agent(model=ScriptedModel(["ok"]), hooks=[Flaky()]).stream("go")]
    assert events[-1].data["stop_reason"] == "completed"
    assert any(e.type is EventType.ERROR and not e.data["fatal"] for e in events)


async def test_metrics_hook_counts_a_run() -> None:
    metrics = MetricsHook()
    model = ScriptedModel(one_call(text="x"))
    result = await Agent(model=model, tools=[echo], hooks=[metrics]).run("go")
    m = metrics.metrics[result.run_id]
    assert (m.llm_calls, m.tool_calls, m.iterations, m.stop_reason) == (2, 1, 2, "completed")
    assert m.usage.requests == 2


async def test_logging_hook_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="loom")
    await Agent(model=ScriptedModel(one_call(text="x")), tools=[echo], hooks=[LoggingHook()]).run(
        "go"
    )
    text = caplog.text
    assert "tool echo" in text and "finished: completed" in text


# -- misspelled hook points (issue #12 item 18) ----------------------------------------------
class Misspelled:
    async def before_tool_exec(self, ctx: HookContext, call: ToolCall) -> None:
        """Never called: not a hook point."""

    def _before_helper(self) -> None:
        """Private helpers are not checked."""

    def summary(self) -> str:
        return "other public methods are fine"


def test_a_misspelled_hook_method_is_a_typed_error_naming_the_closest_point() -> None:
    with pytest.raises(HookDefinitionError, match="did you mean 'before_tool_execution'") as info:
        Agent(model=ScriptedModel(["x"]), hooks=[Misspelled()])
    assert "before_tool_exec" in str(info.value)
    assert isinstance(info.value, ConfigurationError)


def test_close_misspellings_without_a_prefix_are_caught_too() -> None:
    class Typo:
        def befor_llm_call(self, ctx: HookContext, messages: list[Message]) -> None:
            """Never called."""

    with pytest.raises(HookDefinitionError, match="did you mean 'before_llm_call'"):
        compile_hooks([Typo()])
    assert compile_hooks([LoggingHook(), MetricsHook()])  # the built-in hooks pass
