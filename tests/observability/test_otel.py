"""OpenTelemetry spans and metrics of real runs, read back from the SDK's in-memory exporter
and metric reader: the span tree, names, kinds and GenAI attributes; content capture with
redaction; a judge's model call; a run carried on in another process joining the same trace."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.run_inputs import CarryOn
from loom.engine.runtime import Runtime
from loom.judge import JudgePanel, LLMJudge
from loom.messages import Usage
from loom.observability import OtelObserver
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

SRC = str(Path(__file__).resolve().parents[2] / "src")


class Tel:
    def __init__(self, capture: bool = False) -> None:
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.observer = OtelObserver(
            provider, MeterProvider(metric_readers=[self.reader]), capture_content=capture
        )

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def lookup(email: str) -> str:
    """Look a user up."""
    raise ValueError(f"no user {email}")


def two_tools() -> ScriptedModel:
    calls = [
        ToolCall(id="call_add", name="add", arguments={"a": 2, "b": 3}),
        ToolCall(id="call_lookup", name="lookup", arguments={"email": "ann@example.com"}),
    ]
    return ScriptedModel(
        [
            ModelResponse(
                tool_calls=calls,
                usage=Usage(input_tokens=120, output_tokens=30, requests=1, cache_read_tokens=100),
                model="gpt-4o-2024-08-06",
                finish_reason="tool_calls",
            ),
            ModelResponse(
                text="5, and ann@example.com is unknown",
                model="gpt-4o-2024-08-06",
                usage=Usage(input_tokens=200, output_tokens=12, requests=1),
                finish_reason="stop",
            ),
        ],
        name="openai:gpt-4o",
    )


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


async def test_a_two_tool_run_is_one_span_tree_with_genai_attributes() -> None:
    tel = Tel()
    rt = Runtime(observers=[tel.observer])
    agent = Agent(name="helper", model=two_tools(), tools=[add, lookup])
    result = await rt.run(agent, "add 2 and 3, and find ann@example.com", session_id="s-1")
    assert result.stop_reason == "completed"
    spans = by_name(tel.finished())
    assert sorted(spans) == [
        "chat gpt-4o",
        "execute_tool add",
        "execute_tool lookup",
        "invoke_agent helper",
    ]
    (root,) = spans["invoke_agent helper"]
    chats, (t_add,), (t_lookup,) = (
        spans["chat gpt-4o"],
        spans["execute_tool add"],
        spans["execute_tool lookup"],
    )
    assert len(chats) == 2
    assert root.parent is None and root.kind is SpanKind.INTERNAL
    trace_id = root.context.trace_id
    for child in [*chats, t_add, t_lookup]:
        assert child.context.trace_id == trace_id
        assert child.parent is not None and child.parent.span_id == root.context.span_id
    assert all(c.kind is SpanKind.CLIENT for c in chats)
    assert t_add.kind is SpanKind.INTERNAL and t_lookup.kind is SpanKind.INTERNAL
    # the order of the tree: chat, then both tools, then the second chat
    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    assert (first.end_time or 0) <= (t_add.start_time or 0)
    assert (t_lookup.end_time or 0) <= (second.start_time or 0)

    ra = dict(root.attributes or {})
    assert ra["gen_ai.operation.name"] == "invoke_agent"
    assert ra["gen_ai.agent.name"] == "helper"
    assert ra["gen_ai.conversation.id"] == "s-1"
    assert ra["gen_ai.provider.name"] == "openai" and ra["gen_ai.request.model"] == "gpt-4o"
    assert ra["loom.run_id"] == result.run_id and ra["loom.stop_reason"] == "completed"
    assert ra["gen_ai.usage.input_tokens"] == 320 and ra["gen_ai.usage.output_tokens"] == 42
    assert ra["loom.cost.usd"] == pytest.approx(result.usage.cost)
    assert "error.type" not in ra

    fa = dict(first.attributes or {})
    assert fa["gen_ai.operation.name"] == "chat"
    assert fa["gen_ai.provider.name"] == "openai"
    assert fa["gen_ai.request.model"] == "gpt-4o"
    assert fa["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    assert fa["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert fa["gen_ai.usage.input_tokens"] == 120 and fa["gen_ai.usage.output_tokens"] == 30
    assert fa["gen_ai.usage.cache_read.input_tokens"] == 100
    assert fa["gen_ai.conversation.id"] == "s-1"

    aa, la = dict(t_add.attributes or {}), dict(t_lookup.attributes or {})
    assert aa["gen_ai.operation.name"] == "execute_tool"
    assert (aa["gen_ai.tool.name"], aa["gen_ai.tool.call.id"]) == ("add", "call_add")
    assert (la["gen_ai.tool.name"], la["gen_ai.tool.call.id"]) == ("lookup", "call_lookup")
    assert "error.type" not in aa and t_add.status.status_code is not StatusCode.ERROR
    assert la["error.type"] and t_lookup.status.status_code is StatusCode.ERROR
    # no message content unless asked for
    for s in tel.finished():
        content = ("gen_ai.input", "gen_ai.output", "gen_ai.tool.call.arg", "gen_ai.tool.call.res")
        assert not any(k.startswith(content) for k in (s.attributes or {}))

    points = tel.metrics()
    durations = points["gen_ai.client.operation.duration"]
    assert sum(p.count for p in durations) == 2
    assert dict(durations[0].attributes)["gen_ai.request.model"] == "gpt-4o"
    tokens = {
        dict(p.attributes)["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]
    }
    assert tokens == {"input": 320, "output": 42}


async def test_content_is_captured_only_when_asked_and_redacted() -> None:
    tel = Tel(capture=True)
    agent = Agent(name="helper", model=two_tools(), tools=[add, lookup])
    await Runtime(observers=[tel.observer]).run(agent, "find ann@example.com", session_id="s")
    spans = by_name(tel.finished())
    root = dict(spans["invoke_agent helper"][0].attributes or {})
    look = dict(spans["execute_tool lookup"][0].attributes or {})
    texts = [str(v) for s in tel.finished() for v in (s.attributes or {}).values()]
    assert not any("ann@example.com" in t for t in texts)  # redacted everywhere
    assert "find" in str(root["gen_ai.input.messages"])
    assert "is unknown" in str(root["gen_ai.output.messages"])
    assert "gen_ai.tool.call.arguments" in look and "gen_ai.tool.call.result" in look
    chat = dict(spans["chat gpt-4o"][0].attributes or {})
    assert "tool_call" in str(chat["gen_ai.output.messages"])


async def test_the_env_variable_turns_capture_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert OtelObserver().capture is True
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "false")
    assert OtelObserver().capture is False


async def test_a_judge_model_call_is_a_chat_span_of_the_run() -> None:
    tel = Tel()
    judge = LLMJudge(
        ScriptedModel(['{"score": 1, "reason": "fine"}'], name="anthropic:claude-x"), "Is correct."
    )
    agent = Agent(
        name="judged",
        model=ScriptedModel(["Paris"], name="openai:gpt-4o"),
        judges=JudgePanel([judge]),
    )
    await Runtime(observers=[tel.observer]).run(agent, "capital of France?")
    spans = by_name(tel.finished())
    (root,) = spans["invoke_agent judged"]
    (judged,) = spans["chat claude-x"]
    assert judged.kind is SpanKind.CLIENT
    assert judged.parent is not None and judged.parent.span_id == root.context.span_id
    assert dict(judged.attributes or {})["gen_ai.provider.name"] == "anthropic"


async def test_a_model_error_marks_the_chat_and_the_run() -> None:
    tel = Tel()
    agent = Agent(name="broken", model=ScriptedModel([], name="openai:gpt-4o"))
    result = await Runtime(observers=[tel.observer]).run(agent, "hi")
    assert result.stop_reason in ("error", "model_error")
    spans = by_name(tel.finished())
    (chat,) = spans["chat gpt-4o"]
    (root,) = spans["invoke_agent broken"]
    assert dict(chat.attributes or {})["error.type"]
    assert chat.status.status_code is StatusCode.ERROR
    assert dict(root.attributes or {})["error.type"] and root.status.status_code is StatusCode.ERROR


async def test_a_tracer_that_fails_never_fails_the_run() -> None:
    tel = Tel()

    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("exporter bug")

    tel.observer.tracer.start_span = broken  # type: ignore[method-assign]
    agent = Agent(name="helper", model=two_tools(), tools=[add, lookup])
    result = await Runtime(observers=[tel.observer]).run(agent, "go")
    assert result.stop_reason == "completed"


DEAD_ATTEMPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from opentelemetry.sdk.trace import TracerProvider
    from loom import Agent, ModelResponse, ToolCall, tool
    from loom.observability import OtelObserver
    from loom.engine.runtime import Runtime
    from loom.store.sqlite import SQLiteStore
    from loom.testing import ScriptedModel

    @tool(effect="pure")
    def slow(x: int) -> int:
        '''Dies half-way, like a worker that is killed.'''
        os._exit(17)

    async def main():
        call = ToolCall(name="slow", arguments={"x": 1})
        model = ScriptedModel([ModelResponse(tool_calls=[call])], name="openai:gpt-4o")
        rt = Runtime(SQLiteStore(sys.argv[1]), lease_ttl=1.0,
                     observers=[OtelObserver(TracerProvider())])
        await rt.run(Agent(name="worker", model=model, tools=[slow]), "go", session_id="s")

    asyncio.run(main())
    """
)


async def test_a_run_carried_on_in_another_process_joins_the_same_trace(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", DEAD_ATTEMPT, str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 17, proc.stderr
    store = SQLiteStore(db)
    starts = [e for e in await store.load_events("s") if e.type == "agent_start"]
    traceparent = starts[0].extra["traceparent"]
    _, trace_hex, span_hex, _ = traceparent.split("-")

    @tool(effect="pure")
    def slow(x: int) -> int:
        """Now it finishes."""
        return x

    tel = Tel()
    rt = Runtime(store, lease_ttl=1.0, observers=[tel.observer])
    model = ScriptedModel(["done"], name="openai:gpt-4o")
    turn = await rt.start(
        Agent(name="worker", model=model, tools=[slow]), CarryOn(), session_id="s"
    )
    await turn.run(lambda e: None)
    assert turn.result is not None and turn.result.stop_reason == "completed"
    spans = by_name(tel.finished())
    (root,) = spans["invoke_agent worker"]
    assert f"{root.context.trace_id:032x}" == trace_hex  # the dead attempt's trace
    assert root.parent is not None and f"{root.parent.span_id:016x}" == span_hex
    assert dict(root.attributes or {})["loom.carried_on"] is True
    for s in tel.finished():
        assert f"{s.context.trace_id:032x}" == trace_hex
    await store.close()


async def test_workflow_spans_parent_the_member_runs() -> None:
    tel = Tel()
    rt = Runtime(observers=[tel.observer])
    with tel.observer.workflow("research-crew", session_id="c1"):
        await rt.run(Agent(name="a", model=ScriptedModel(["x"], name="openai:gpt-4o")), "go")
        await rt.run(Agent(name="b", model=ScriptedModel(["y"], name="openai:gpt-4o")), "go")
    spans = by_name(tel.finished())
    (crew,) = spans["invoke_workflow research-crew"]
    assert dict(crew.attributes or {})["gen_ai.operation.name"] == "invoke_workflow"
    for name in ("invoke_agent a", "invoke_agent b"):
        (member,) = spans[name]
        assert member.parent is not None and member.parent.span_id == crew.context.span_id


async def test_a_crew_run_is_one_trace_under_its_workflow_span() -> None:
    # the crew opens its tracer's workflow span itself: every member's run (parallel ones in
    # their own tasks too) and their model and tool calls hang under `invoke_workflow {crew}`
    from loom.crew import Crew, Parallel, Sequential

    tel = Tel()
    rt = Runtime(observers=[tel.observer])

    def member(name: str) -> Agent:
        calls = [ToolCall(id=f"{name}1", name="add", arguments={"a": 1, "b": 2})]
        script = [ModelResponse(tool_calls=calls), f"{name} done"]
        return Agent(name=name, model=ScriptedModel(script, name="openai:gpt-4o"), tools=[add])

    crew = Crew(
        "blog",
        members={"research": member("research"), "a": member("a"), "b": member("b")},
        plan=Sequential("research", Parallel("a", "b")),
    )
    result = await crew.run("write", runtime=rt)
    assert result.stop_reason == "completed"
    spans = by_name(tel.finished())
    (workflow,) = spans["invoke_workflow blog"]
    trace_id = workflow.context.trace_id
    assert all(s.context.trace_id == trace_id for s in tel.finished())  # one trace
    (crew_run,) = spans["invoke_agent blog"]  # the crew's own run record, under the workflow
    assert crew_run.parent is not None and crew_run.parent.span_id == workflow.context.span_id
    runs = [s for name in ("research", "a", "b") for s in spans[f"invoke_agent {name}"]]
    assert len(runs) == 3
    assert all(s.parent is not None and s.parent.span_id == crew_run.context.span_id for s in runs)
    run_ids = {s.context.span_id for s in runs}
    tools = spans["execute_tool add"]
    assert len(tools) == 3 and all(
        t.parent is not None and t.parent.span_id in run_ids for t in tools
    )


async def test_a_cache_bust_is_counted_in_a_metric() -> None:
    from loom.memory.tools import set_kernel

    tel = Tel()
    rt = Runtime(observers=[tel.observer])
    agent = Agent(name="helper", model=ScriptedModel(["one", "two"]))
    await rt.run(agent, "first", session_id="s-1")
    assert "loom.prompt_cache.breaks" not in tel.metrics()
    await set_kernel(rt.store, "s-1", "mood", "curious")  # the Kernel changed by code
    await rt.run(agent, "second", session_id="s-1")
    [point] = tel.metrics()["loom.prompt_cache.breaks"]
    assert point.value == 1
    assert dict(point.attributes) == {
        "loom.expected": False,
        "loom.cache.segment": "kernel",
        "loom.cache.reason": "unknown",
        "gen_ai.agent.name": "helper",
    }
