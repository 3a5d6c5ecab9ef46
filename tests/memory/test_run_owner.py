"""The run's owner is a fact of the run (issue #29): decided once at the front door
(``RunOptions.owner``, else the session's recorded owner), carried as ``RunContext.owner`` and
recorded with the run, so a scheduled run, a worker's queued run and a later run of the same
session act for the same owner without any server request around them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loom import Agent, Message, ModelResponse, ToolCall
from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE, RunOptions
from loom.engine.runtime import Runtime
from loom.errors import InputError
from loom.events import AgentStart
from loom.memory import MemoryConfig
from loom.store import SQLiteStore
from loom.store.base import capabilities_of
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel


def saver(name: str = "keeper") -> Agent:
    """An agent whose model saves the user's message as a memory, then answers ``saved``."""

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        last = messages[-1]
        if last.role == "user":
            return ModelResponse(
                tool_calls=[ToolCall(name="save_memory", arguments={"text": last.content})]
            )
        return "saved"

    return Agent(
        name,
        "You keep notes.",
        model=FunctionModel(fn),
        memory=MemoryConfig(memory_file=None, store_tools=True),
    )


async def owners_of_items(store: Any) -> list[tuple[tuple[str, ...], str | None]]:
    items = capabilities_of(store).items
    assert items is not None
    return [(i.namespace, i.owner) for i in await items.search_items(("memories",))]


async def test_a_scheduled_run_saves_into_its_schedules_owner_namespace(tmp_path: Path) -> None:
    from loom.schedule import RuntimeLauncher, Schedule, Scheduler, ScheduleStore

    store = SQLiteStore(tmp_path / "loom.db")
    now = [1_736_150_400.0]  # 2025-01-06 08:00 UTC
    agents = {"keeper": saver()}
    runtime = Runtime(store=store)
    schedules = ScheduleStore(store, clock=lambda: now[0], agents=agents)
    scheduler = Scheduler(schedules, RuntimeLauncher(runtime, agents), clock=lambda: now[0])
    try:
        await schedules.add(
            Schedule(
                agent="keeper",
                message="the standup moved to 9:30",
                cron="*/10 * * * *",
                id="notes",
                principal="alice",
            )
        )
        now[0] += 10 * 60 + 5
        assert (await scheduler.poll()).started == 1
        await scheduler.drain()
        [run] = await schedules.schedule_runs("notes", limit=0)
        assert run.status == "finished"
        assert await owners_of_items(store) == [(("memories", "alice"), "alice")]
        # recorded with the run and as its session's owner
        [start] = [e for e in await store.load_events(run.session_id) if type(e) is AgentStart]
        assert start.extra["owner"] == "alice"
        assert await runtime.session_owner(run.session_id) == "alice"
    finally:
        await scheduler.aclose()
        await runtime.aclose()
        await store.close()


async def test_a_queued_run_on_a_worker_acts_for_the_owner(tmp_path: Path) -> None:
    """``loom.workers.run_turn`` (the task a `loom worker` runs), given the owner by its job
    (``enqueue_run(owner=...)``) and, in a second job, by the session's recorded owner."""
    from loom.workers.tasks import WorkerContext, run_turn, set_context

    store = SQLiteStore(tmp_path / "loom.db")
    runtime = Runtime(store=store)
    set_context(WorkerContext(runtime, {"keeper": saver()}))
    try:
        job = SimpleNamespace(job=SimpleNamespace(id=1), abort_reason=lambda: None)
        record = await run_turn(job, "keeper", "q1", "my cat is called Miso", owner="alice")  # type: ignore[arg-type]
        assert record["status"] == "finished", record
        assert await owners_of_items(store) == [(("memories", "alice"), "alice")]
        # a session a server claimed for bob: a job that names no owner acts for bob
        kv = capabilities_of(store).kv
        assert kv is not None
        await kv.put_value(SESSION_OWNER_NAMESPACE, "q2", "bob")
        job2 = SimpleNamespace(job=SimpleNamespace(id=2), abort_reason=lambda: None)
        record = await run_turn(job2, "keeper", "q2", "bob likes tea")  # type: ignore[arg-type]
        assert record["status"] == "finished", record
        assert sorted(await owners_of_items(store), key=str) == [
            (("memories", "alice"), "alice"),
            (("memories", "bob"), "bob"),
        ]
    finally:
        set_context(None)
        await runtime.aclose()
        await store.close()


async def test_a_later_run_of_the_session_keeps_the_owner_of_its_first() -> None:
    runtime = Runtime(store=MemoryStore())
    agent = saver()
    await runtime.run(agent, "first fact", session_id="s1", options=RunOptions(owner="carol"))
    await runtime.run(agent, "second fact", session_id="s1")  # no owner named: the session's
    assert await owners_of_items(runtime.store) == [(("memories", "carol"), "carol")] * 2


async def test_a_run_without_an_owner_saves_shared_memories() -> None:
    runtime = Runtime(store=MemoryStore())
    result = await runtime.run(saver(), "a fact for everyone", session_id="s1")
    assert result.stop_reason == "completed"
    assert await owners_of_items(runtime.store) == [(("memories", "shared"), None)]
    assert await runtime.session_owner("s1") is None


def test_the_server_keeps_session_owners_where_the_front_door_reads_them() -> None:
    from loom.server.ownership import OWNER_NS

    assert OWNER_NS == SESSION_OWNER_NAMESPACE


@pytest.mark.parametrize("owner", ["", "  ", 7])
async def test_a_bad_owner_is_an_input_error(owner: Any) -> None:
    runtime = Runtime(store=MemoryStore())
    with pytest.raises(InputError, match="owner"):
        await runtime.start(saver(), "hi", options=RunOptions(owner=owner))


def test_tools_read_the_owner_from_the_run_context() -> None:
    from loom.tools.base import RunContext

    ctx = RunContext("s", "r", "c", owner="alice")
    assert json.loads(json.dumps(ctx.owner)) == "alice"


class Tracer:
    """An observer that opens a run's span (``start_run``): its traceparent joins AGENT_START."""

    def start_run(self, **_: Any) -> dict[str, Any]:
        return {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def __call__(self, event: Any) -> None:
        pass


async def test_the_owner_is_recorded_with_the_run_when_it_is_traced_too() -> None:
    store = MemoryStore()
    runtime = Runtime(store=store, observers=[Tracer()])
    await runtime.run(saver(), "traced fact", session_id="t1", options=RunOptions(owner="dora"))
    [start] = [e for e in await store.load_events("t1") if type(e) is AgentStart]
    assert start.extra["owner"] == "dora" and "traceparent" in start.extra
