"""Thread-centric streaming (LangGraph's v3 streaming protocol, the Agent Protocol's
``/threads/{id}/commands`` and ``/threads/{id}/stream``): what ``langgraph-sdk``'s
``client.threads.stream(...)`` speaks.

A client sends commands (``run.start``, ``input.respond``, ``state.get``) to ``POST
/threads/{id}/commands`` and reads the thread's events from ``POST
/threads/{id}/stream/events`` (server-sent events, filtered by channel). This module holds the
protocol-neutral half: each thread's event log (``ThreadBus``: numbered events, replay after a
sequence number, live delivery), and the translation of a run's Loom events into the
protocol's channels (``lifecycle``, ``values``, ``updates``, ``messages``, ``tools``,
``input``). ``loom.server.langgraph_api`` serves the endpoints.

Every run a command starts is followed into its thread's log (``follow_run``). A stream opened
with ``since`` replays the events after that sequence number; one opened without it starts
with the thread's latest commanded run while no such stream has yet been told how it ended (a
client that starts a run and only then watches it misses nothing), else with what comes next.
The log lives in this process and keeps the last ``MAX_EVENTS`` events of each of the last
``MAX_THREADS`` threads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    LlmComplete,
    LlmDelta,
    ToolErrorEvent,
    ToolExecutionStart,
    ToolResultEvent,
)
from loom.server.lg_runs import Frame, LgRun, interrupts_of, query_interrupts, run_status

__all__ = [
    "CHANNELS",
    "BusRegistry",
    "RunTranslator",
    "ThreadBus",
    "follow_run",
]

CHANNELS = (
    "values",
    "updates",
    "messages",
    "tools",
    "lifecycle",
    "input",
    "checkpoints",
    "tasks",
    "custom",
)
"""The channels a stream may ask for, and ``custom:<name>`` (Loom emits no ``checkpoints``,
``tasks`` or ``custom`` events)."""

MAX_EVENTS = 10_000
MAX_THREADS = 1_000
KEEP_ALIVE = 15.0  # seconds between comments on an idle stream (so a gone client is noticed)


def _channel(method: str) -> str:
    return "input" if method == "input.requested" else method


@dataclass
class ThreadBus:
    """One thread's protocol events, numbered from 1 (``seq``), and who waits for more."""

    events: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    replay_from: int = 0  # where a stream without ``since`` starts
    told_end: bool = True  # a stream has delivered the latest run's terminal lifecycle event
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def run_starting(self) -> int:
        """A commanded run starts: streams opened without ``since`` replay it from here.
        Answers the sequence number before its first event."""
        self.replay_from, self.told_end = self.seq, False
        return self.seq

    def publish(self, method: str, data: dict[str, Any]) -> None:
        self.seq += 1
        self.events.append(
            {
                "type": "event",
                "event_id": str(self.seq),
                "seq": self.seq,
                "method": method,
                "params": {"namespace": [], "timestamp": int(time.time() * 1000), "data": data},
            }
        )
        del self.events[:-MAX_EVENTS]
        self._wake.set()
        self._wake = asyncio.Event()

    async def follow(
        self,
        channels: list[str],
        namespaces: list[list[str]] | None,
        since: int | None,
        stop: Callable[[], bool],
    ) -> AsyncIterator[dict[str, Any] | None]:
        """The matching events after ``since`` (see the module docstring without it), then
        live ones, until ``stop()``; ``None`` now and then while idle (a keep-alive)."""
        wanted = set(channels)
        root = namespaces is None or any(ns == [] for ns in namespaces)  # Loom's are all root
        # only a stream without a cursor (a client's run watcher) can have missed the end
        tells = since is None
        after = self.replay_from if since is None and not self.told_end else since
        after = self.seq if after is None else after
        while not stop():
            wake = self._wake
            for event in [e for e in self.events if e["seq"] > after]:
                after = event["seq"]
                if root and _channel(event["method"]) in wanted:
                    if tells and _is_end(event):
                        self.told_end = True
                    yield event
            try:
                await asyncio.wait_for(wake.wait(), KEEP_ALIVE)
            except TimeoutError:
                yield None


def _is_end(event: dict[str, Any]) -> bool:
    data = event["params"]["data"]
    return event["method"] == "lifecycle" and data.get("event") in ("completed", "failed")


class BusRegistry:
    """The buses of the last ``MAX_THREADS`` threads, by thread id."""

    def __init__(self) -> None:
        self._buses: OrderedDict[str, ThreadBus] = OrderedDict()

    def get(self, thread_id: str) -> ThreadBus:
        bus = self._buses.get(thread_id)
        if bus is None:
            bus = self._buses[thread_id] = ThreadBus()
        self._buses.move_to_end(thread_id)
        while len(self._buses) > MAX_THREADS:
            self._buses.popitem(last=False)
        return bus

    def forget(self, thread_id: str) -> None:
        self._buses.pop(thread_id, None)


class RunTranslator:
    """One run's frames (``loom.server.lg_runs``) as protocol events ``(method, data)``."""

    def __init__(self, run: LgRun) -> None:
        self.run = run
        self.message_id: str | None = None  # the AI message being streamed
        self.streamed = ""
        self.ended = False

    def feed(self, frame: Frame) -> list[tuple[str, dict[str, Any]]]:
        if frame.mode is None:  # metadata, error, end: for every reader
            if frame.event == "error" and not self.ended:
                self.ended = True
                message = f"{frame.data.get('error')}: {frame.data.get('message')}"
                return [("lifecycle", {"event": "failed", "error": message})]
            if frame.event == "end" and not self.ended:
                self.ended = True
                status = frame.data.get("status")
                return [("lifecycle", {"event": "failed", "error": f"the run ended {status}"})]
            return []
        if frame.mode == "values" and "__interrupt__" not in frame.data:
            return [("values", frame.data)]
        if frame.mode == "updates" and "__interrupt__" not in frame.data:
            return [("updates", {"node": k, "values": v}) for k, v in frame.data.items()]
        if frame.mode == "events":
            return self._event(AgentEvent.from_dict(frame.data))
        return []

    def _message_id(self) -> str:
        if self.message_id is None:
            # the id the message gets in the thread's values (a crew run's maker keeps none)
            index = getattr(self.run.maker, "next_index", 0)
            self.message_id = f"{self.run.thread_id}:{index}"
        return self.message_id

    def _start_message(self) -> list[tuple[str, dict[str, Any]]]:
        meta = {"run_id": self.run.run_id, "thread_id": self.run.thread_id}
        msg_id = self._message_id()
        return [
            ("messages", {"event": "message-start", "role": "ai", "id": msg_id, "metadata": meta})
        ]

    def _event(self, ev: AgentEvent) -> list[tuple[str, dict[str, Any]]]:
        own = ev.run_id == self.run.run_id
        if isinstance(ev, AgentStart) and own:
            return [("lifecycle", {"event": "started", "graph_name": self.run.assistant_id})]
        if isinstance(ev, LlmDelta):
            out = []
            if not self.streamed:
                out += self._start_message()
                block = {"type": "text", "text": ""}
                out.append(
                    self._msg({"event": "content-block-start", "index": 0, "content": block})
                )
            self.streamed += ev.delta
            delta = {"type": "text-delta", "text": ev.delta}
            out.append(self._msg({"event": "content-block-delta", "index": 0, "delta": delta}))
            return out
        if isinstance(ev, LlmComplete):
            return self._complete(ev)
        if isinstance(ev, ToolExecutionStart):
            data = {
                "event": "tool-started",
                "tool_call_id": ev.tool_call_id,
                "tool_name": ev.tool_name,
                "input": ev.arguments,
            }
            return [("tools", data)]
        if isinstance(ev, ToolResultEvent | ToolErrorEvent):
            if ev.success:
                done = {"event": "tool-finished", "tool_call_id": ev.tool_call_id}
                return [("tools", {**done, "output": ev.content})]
            failed = {"event": "tool-error", "tool_call_id": ev.tool_call_id}
            return [("tools", {**failed, "message": ev.content, "code": ev.error_code or ""})]
        if isinstance(ev, AgentFinish) and own:
            return self._finish(ev)
        return []

    def _msg(self, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("messages", {**data, "id": self._message_id()})

    def _complete(self, ev: LlmComplete) -> list[tuple[str, dict[str, Any]]]:
        out = [] if self.streamed else self._start_message()
        index = 0
        if ev.answer or self.streamed:
            if not self.streamed:
                empty = {"type": "text", "text": ""}
                out.append(
                    self._msg({"event": "content-block-start", "index": 0, "content": empty})
                )
            text = {"type": "text", "text": ev.answer}
            out.append(self._msg({"event": "content-block-finish", "index": 0, "content": text}))
            index = 1
        for i, call in enumerate(ev.tool_calls, index):
            call_block: dict[str, Any] = {
                "type": "tool_call",
                "id": call.get("id"),
                "name": call.get("name", ""),
                "args": call.get("arguments", {}),
            }
            start = {"event": "content-block-start", "index": i, "content": call_block}
            out.append(self._msg(start))
            out.append(self._msg({**start, "event": "content-block-finish"}))
        usage = ev.usage or {}
        tokens = {k: int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens")}
        tokens["total_tokens"] = tokens["input_tokens"] + tokens["output_tokens"]
        out.append(self._msg({"event": "message-finish", "usage": tokens}))
        self.message_id, self.streamed = None, ""
        return out

    def _finish(self, ev: AgentFinish) -> list[tuple[str, dict[str, Any]]]:
        self.ended = True
        if ev.stop_reason in ("awaiting_approval", "awaiting_input"):
            interrupts = (
                interrupts_of(ev.pending_approvals)
                if ev.pending_query is None
                else query_interrupts(ev.session_id, ev.pending_query)
            )
            out: list[tuple[str, dict[str, Any]]] = [
                (
                    "input.requested",
                    {"interrupt_id": i["id"], "payload": i["value"], "value": i["value"]},
                )
                for i in interrupts
            ]
            return [*out, ("lifecycle", {"event": "interrupted"})]
        if run_status(ev.stop_reason) != "success":
            return [("lifecycle", {"event": "failed", "error": ev.error or ev.stop_reason})]
        return [("lifecycle", {"event": "completed"})]


def follow_run(bus: ThreadBus, run: LgRun) -> Coroutine[Any, Any, None]:
    """Publish ``run``'s events on ``bus`` as they come, until the run ends (await the answer;
    the run counts as read from this call on, so its frames stay until it is done)."""
    translator = RunTranslator(run)
    frames = run.follow(0)

    async def publish() -> None:
        async for frame in frames:
            for method, data in translator.feed(frame):
                bus.publish(method, data)

    return publish()


def encode(event: dict[str, Any] | None) -> bytes:
    """One server-sent event (a comment for ``None``: a keep-alive)."""
    if event is None:
        return b": keep-alive\n\n"
    data = json.dumps(event, default=str)
    return f"id: {event['event_id']}\nevent: {event['method']}\ndata: {data}\n\n".encode()
