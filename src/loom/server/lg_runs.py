"""Runs of the LangGraph-compatible API: background tasks, their SSE frames, reconnects.

A run is one Loom turn (``run_id`` is the turn's run id). Whatever the endpoint (streaming,
blocking, background), the turn runs in a task of its own that takes each ``AgentEvent`` into
the run's buffer; responses are readers of that buffer, so a client that drops and comes back
(``Last-Event-ID``) reads on from where it was, and a run whose stream was closed keeps running
(``on_disconnect="continue"``). The frames of every stream mode are made from the events when
someone reads them, their data when it is encoded (a blocking run nobody streams makes none);
a finished run's buffer is dropped once 16 runs finished after it and nobody reads it
(``RunManager.keep_whole``), so the buffers are bounded whatever the threads' number and length.

Frame ids are ``"<event sequence>.<slot>"``: the journal sequence of the event the frame
comes from and a fixed slot for the frame's kind (0 messages-tuple, 1 messages, 2 updates,
3 values, 4/5 an interrupt's updates/values, 6 events). Only the frames of a run's steps
(``loom.engine.journal.STEP_TYPES``: events committed before they are emitted) carry an id; token
deltas and lifecycle events (``iteration_start``, ``context_*``, ``state_change``,
``llm_start``, ``recursion``, …) are sent without one, because a crash may lose them: every id a
client received is in the journal, so a rejoin from it works after a restart. A run carried on
after a crash has more than one attempt (turn): the frames of attempt ``n`` (0 = the first) add
``attempt_offset(n)`` to their sequences, so no two frames of a run share an id. The buffer is
the live truth while the process holds the run whole; a run it no longer holds (evicted,
released, or the server restarted) is replayed from the journal (``Store.load_events``), which
yields the same frames with the same ids (token deltas, never journaled, carry no id and are
not replayed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from loom.engine.driving import drive
from loom.engine.journal import STEP_TYPES, transcript
from loom.errors import InputError, LoomError
from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    EventType,
    LlmComplete,
    LlmDelta,
    OutputPartial,
)
from loom.messages import Message, RunResult
from loom.server.content_blocks import langchain_content
from loom.store.base import Store
from loom.text import whole_number

__all__ = [
    "ALL_MODES",
    "Frame",
    "FrameMaker",
    "LgRun",
    "RunManager",
    "Segment",
    "attempt_offset",
    "lc_message",
    "parse_event_id",
    "run_status",
]

log = logging.getLogger("loom.server.langgraph")

ALL_MODES = ("values", "updates", "messages-tuple", "messages", "events", "custom", "debug")
"""Stream modes a client may ask for (``custom`` and ``debug`` are accepted; Loom emits none)."""

_STATUS = {
    "completed": "success",
    "awaiting_approval": "success",  # LangGraph: the run succeeded, the thread is interrupted
    "awaiting_input": "success",  # a server query waits for the client's answer
    "max_iterations": "success",
    "max_tool_calls": "success",
    "cancelled": "interrupted",
    "crashed": "interrupted",  # the process died mid-run; a later turn recovered it
    "timeout": "timeout",
    "model_error": "error",
    "guardrail": "error",  # a guardrail stopped it: no answer; the run's error names which
    "budget": "error",  # a crew's budget stopped it
    "loop": "error",  # the model repeated itself (as LangGraph's recursion limit: an error)
    "error": "error",
}


_ATTEMPT = 1_000_000  # frame ids of attempt n start at n * this: unique across attempts


def attempt_offset(index: int) -> int:
    """What the frame ids of the ``index``-th attempt (0 = the first) add to event sequences:
    a retry's run numbers its events from 0 again, its frames must not reuse the first's ids."""
    return index * _ATTEMPT


def run_status(stop_reason: str) -> str:
    """LangGraph's run status for a Loom stop reason."""
    if stop_reason == "running":
        return "running"
    return _STATUS.get(stop_reason, "error")


def _iso(ts: float | datetime) -> str:
    if isinstance(ts, datetime):
        return ts.astimezone(UTC).isoformat()
    return datetime.fromtimestamp(ts, UTC).isoformat()


def lc_message(m: Message, msg_id: str) -> dict[str, Any]:
    """A Loom message in LangChain's serialized form (what LangGraph clients expect). A message
    with parts has a list of content blocks, its media as references to the thread's media
    route (``msg_id`` is ``<thread id>:<index>``), never their bytes."""
    kind = {"user": "human", "assistant": "ai", "tool": "tool", "system": "system"}[m.role]
    out: dict[str, Any] = {
        "type": kind,
        "content": langchain_content(m, msg_id.rpartition(":")[0]) if m.parts else m.content,
        "id": msg_id,
        "name": m.name,
        "additional_kwargs": {},
        "response_metadata": {},
    }
    if kind == "ai":
        out["tool_calls"] = [
            {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"}
            for c in m.tool_calls
        ]
        out["invalid_tool_calls"] = []
    if kind == "tool":
        out["tool_call_id"] = m.tool_call_id
        out["status"] = "error" if m.metadata.get("success") is False else "success"
    return out


class Frame:
    """One SSE event: the stream mode it belongs to (None: every reader gets it).

    Its ``data`` is either given or made on demand (``make``): an ``events`` frame keeps its
    event, a ``values`` frame keeps its ``FrameMaker`` and how many messages it shows, so a run
    nobody streams builds neither, and a run's ``values`` frames share one transcript instead of
    each holding a copy of it."""

    __slots__ = ("_data", "event", "id", "live_only", "make", "mode", "needs_base")

    def __init__(
        self,
        mode: str | None,
        event: str,
        data: Any = None,
        id: str | None = None,
        *,
        make: Callable[[], Any] | None = None,
        needs_base: Segment | None = None,
    ) -> None:
        self.mode, self.event, self._data, self.id = mode, event, data, id
        self.make = make
        self.needs_base = needs_base  # its data reads the thread's transcript before the run
        self.live_only = False  # a token delta's: no replay from the journal makes it again

    @property
    def data(self) -> Any:
        return self._data if self.make is None else self.make()

    def encode(self) -> bytes:
        lines = f"event: {self.event}\ndata: {json.dumps(self.data, default=str)}\n"
        if self.id is not None:
            lines += f"id: {self.id}\n"
        return (lines + "\n").encode()


def parse_event_id(value: str) -> tuple[int, int]:
    """``"<sequence>.<k>"`` as a pair; ``InputError`` (a 422 that says what an id looks like)
    when it is not one."""
    seq, _, k = value.strip().partition(".")
    if whole_number(seq) is None or whole_number(k or "0") is None or len(value) > 40:
        raise InputError(
            f"Last-Event-ID {value[:60]!r} is not an event id of this run API (ids are "
            "'<sequence>.<slot>', e.g. '12.3', as sent in each event); reconnect with the id "
            "of the last event received, or without Last-Event-ID to read the whole run"
        )
    return int(seq), int(k or 0)


_NODES = {"assistant": "agent", "tool": "tools", "user": "__start__"}
"""The LangGraph node a message of each role comes from."""

_SLOTS = {
    ("messages", False): 0,
    ("messages/partial", False): 1,
    ("messages/complete", False): 1,
    ("updates", False): 2,
    ("values", False): 3,
    ("updates", True): 4,
    ("values", True): 5,
    ("events", False): 6,
}


class Segment:
    """The transcript a run's frames show: the thread's messages before the run (or its
    attempt), read on demand, and the run's own messages since, in LangChain form when read."""

    __slots__ = ("base", "load_base", "own", "own_lc", "thread_id")

    def __init__(
        self,
        thread_id: str,
        base: list[dict[str, Any]] | None,
        load_base: Callable[[], Awaitable[Sequence[Message | dict[str, Any]]]] | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.base = base  # LangChain form; None: not read yet (``read_base``)
        self.load_base = load_base
        self.own: list[Message] = []  # the run's messages
        self.own_lc: list[dict[str, Any]] = []  # the first of them in LangChain form (cache)

    async def read_base(self) -> None:
        """Read the transcript before the run, if it is not read yet."""
        if self.base is None and self.load_base is not None:
            base = await self.load_base()
            self.base = [
                m if isinstance(m, dict) else lc_message(m, f"{self.thread_id}:{i}")
                for i, m in enumerate(base)
            ]

    def base_count(self) -> int:
        if self.base is None:
            raise RuntimeError("the transcript before the run is not read yet (read_base)")
        return len(self.base)

    @property
    def next_index(self) -> int:
        """The index the thread's next message gets."""
        return self.base_count() + len(self.own)

    def own_message(self, k: int) -> dict[str, Any]:
        """The run's ``k``-th message in LangChain form (made once, when first read)."""
        base = self.base_count()
        while len(self.own_lc) <= k:
            i = len(self.own_lc)
            self.own_lc.append(lc_message(self.own[i], f"{self.thread_id}:{base + i}"))
        return self.own_lc[k]

    def values(self, shown: int | None = None) -> dict[str, Any]:
        """The thread's values with the first ``shown`` of the run's messages (None: all)."""
        count = len(self.own) if shown is None else shown
        if self.base is None:
            raise RuntimeError("the transcript before the run is not read yet (read_base)")
        return {"messages": [*self.base, *(self.own_message(k) for k in range(count))]}


class FrameMaker:
    """Turns one run's events into frames of every stream mode, deterministically (so a replay
    from the journal gives the same frames, with the same ids, as the live run did)."""

    def __init__(self, thread_id: str, run_id: str, assistant_id: str) -> None:
        self.thread_id, self.run_id, self.assistant_id = thread_id, run_id, assistant_id
        self.seg = Segment(thread_id, [])  # the current attempt's transcript
        self.streamed = ""  # text deltas of the AI message being streamed

    def start(self, base: Sequence[Message]) -> None:
        """The thread's transcript before this run (or its attempt: frames made before keep
        the transcript they were made with)."""
        self.seg = Segment(self.thread_id, [])
        self.seg.base = [lc_message(m, self.msg_id(i)) for i, m in enumerate(base)]

    def start_lazily(
        self, load: Callable[[], Awaitable[Sequence[Message | dict[str, Any]]]]
    ) -> None:
        """The thread's transcript before this run is what ``load`` answers, read only when a
        reader needs a frame (``Segment.read_base``): a run nobody streams never reads it, and
        the frames of its messages (whose ids number them in the thread) are made on demand."""
        self.seg = Segment(self.thread_id, None, load)

    @property
    def next_index(self) -> int:
        """The index the thread's next message gets."""
        return self.seg.next_index

    def msg_id(self, index: int) -> str:
        return f"{self.thread_id}:{index}"

    def meta(self, ev: AgentEvent, node: str) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "graph_id": self.assistant_id,
            "langgraph_node": node,
            "langgraph_step": ev.iteration,
        }

    def values(self, shown: int | None = None) -> dict[str, Any]:
        """The thread's values with the first ``shown`` of this run's messages (None: all)."""
        return self.seg.values(shown)

    def frames(self, ev: AgentEvent, offset: int = 0) -> list[Frame]:
        """The frames of ``ev`` (``offset``: its attempt's, see ``attempt_offset``). Their data
        is made when a reader encodes them: a run nobody streams builds none of it."""
        out: list[Frame] = []
        seg = self.seg
        if isinstance(ev, LlmDelta):
            self.streamed += ev.delta
            k, text, meta = len(seg.own), self.streamed, self.meta(ev, "agent")

            def chunk(content: str, kind: str = "AIMessageChunk") -> dict[str, Any]:
                return {
                    "type": kind,
                    "content": content,
                    "id": self.msg_id(seg.base_count() + k),
                    "tool_calls": [],
                    "tool_call_chunks": [],
                    "additional_kwargs": {},
                    "response_metadata": {},
                }

            delta = ev.delta
            out.append(
                Frame(
                    "messages-tuple", "messages", make=lambda: [chunk(delta), meta], needs_base=seg
                )
            )
            out.append(
                Frame(
                    "messages",
                    "messages/partial",
                    make=lambda: [chunk(text, "ai")],
                    needs_base=seg,
                )
            )
        m = ev.message()
        if m is not None:
            k = len(seg.own)
            seg.own.append(m)
            node = _NODES.get(m.role, "loom")
            if m.role != "user":
                meta = self.meta(ev, node)
                if isinstance(ev, LlmComplete) and self.streamed:
                    if m.tool_calls:  # the text came as deltas; the calls come now
                        out.append(
                            Frame(
                                "messages-tuple",
                                "messages",
                                make=lambda: [
                                    {
                                        **seg.own_message(k),
                                        "type": "AIMessageChunk",
                                        "content": "",
                                    },
                                    meta,
                                ],
                                needs_base=seg,
                            )
                        )
                else:
                    out.append(
                        Frame(
                            "messages-tuple",
                            "messages",
                            make=lambda: [seg.own_message(k), meta],
                            needs_base=seg,
                        )
                    )
                out.append(
                    Frame(
                        "messages",
                        "messages/complete",
                        make=lambda: [seg.own_message(k)],
                        needs_base=seg,
                    )
                )
                out.append(
                    Frame(
                        "updates",
                        "updates",
                        make=lambda: {node: {"messages": [seg.own_message(k)]}},
                        needs_base=seg,
                    )
                )
            self.streamed = "" if isinstance(ev, LlmComplete) else self.streamed
            out.append(Frame("values", "values", make=lambda: seg.values(k + 1), needs_base=seg))
        if isinstance(ev, AgentFinish) and ev.stop_reason in (
            "awaiting_approval",
            "awaiting_input",
        ):
            interrupts = (
                interrupts_of(ev.pending_approvals)
                if ev.pending_query is None
                else query_interrupts(ev.session_id, ev.pending_query)
            )
            out.append(Frame("values", "values", {"__interrupt__": interrupts}))
            out.append(Frame("updates", "updates", {"__interrupt__": interrupts}))
        out.append(Frame("events", "events", make=ev.to_dict))
        if isinstance(ev, LlmDelta | OutputPartial):  # never journaled: live only
            for f in out:
                f.live_only = True
        if ev.type not in STEP_TYPES:  # a crash may lose it: no id a rejoin could not find
            return out
        seq = ev.sequence + offset
        for f in out:  # a fixed slot per kind: the same id whichever frames an event has
            interrupt = f.make is None and "__interrupt__" in f.data
            f.id = f"{seq}.{_SLOTS[f.event, interrupt]}"
        return out


def query_interrupts(thread_id: str, query: dict[str, Any]) -> list[dict[str, Any]]:
    """The LangGraph interrupt for a server query (seed 003) waiting for the client."""
    value = {"type": "server_query", **query, "answer_with": f"POST /threads/{thread_id}/answer"}
    return [{"id": query.get("query_id", ""), "value": value, "when": "during"}]


def interrupts_of(pending: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """LangGraph interrupts for calls waiting for approval (one per call, id = call id)."""
    return [
        {
            "id": p.get("tool_call_id", ""),
            "value": {
                "type": "approval_required",
                "tool_call_id": p.get("tool_call_id", ""),
                "tool_name": p.get("tool_name", ""),
                "arguments": p.get("arguments", {}),
                "reason": p.get("reason", ""),
                **({"member_path": p["member_path"]} if "member_path" in p else {}),
                "approve_with": f"POST /threads/{p.get('session_id', '{thread_id}')}/approvals/"
                f"{p.get('tool_call_id', '')}",
            },
        }
        for p in pending
    ]


def _finished() -> asyncio.Event:
    ended = asyncio.Event()
    ended.set()
    return ended


_FINISHED = _finished()
"""One set event every released run shares as its ``done``, ``cancel`` and wake-up (an
``asyncio.Event`` with its waiter queue is most of what a finished run would hold)."""


@dataclass(slots=True)
class LgRun:
    """A run this process started: its record, its frames, its task."""

    run_id: str
    thread_id: str
    assistant_id: str
    multitask_strategy: str
    stream_modes: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    on_disconnect: str = "continue"
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    status: str = "pending"
    stop_reason: str | None = None
    error: str | None = None
    frames: list[Frame] = field(default_factory=list)
    # events (with their attempt's offset) whose frames are not made yet, and frames added
    # after them
    backlog: list[tuple[AgentEvent, int] | list[Frame]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)  # frame id -> position
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    result: RunResult | None = None
    maker: FrameMaker | None = None
    final: dict[str, Any] | None = None  # final values kept past the thread (stateless runs)
    on_end: Callable[[LgRun], Awaitable[None]] | None = None  # before ``done`` is set
    job_id: int | None = None  # a queued run: its job (another process executes it)
    abort: Callable[[], Awaitable[Any]] | None = None  # a queued run: abort its job
    attempts: list[str] = field(default_factory=list)  # its turns' run ids; [] = [run_id]
    background: bool = False  # acknowledged before it ran: re-run at start-up if cut short
    revision: str | None = None  # its agent's revision (loom.definition.revision_of)
    assistant_version: int | None = None  # a stored assistant's version it ran
    readers: int = 0  # followers reading its frames now (see ``follow``)
    releasable: bool = False  # a replay from the journal makes its frames (but token deltas)
    expired: bool = False  # no longer one of the newest finished runs: its frames may go
    released: bool = False  # they were: a reader replays it from the journal (``rehydrate``)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def attempt_ids(self) -> list[str]:
        """The run ids of its turns, oldest first (one, unless carried on after a crash)."""
        return self.attempts or [self.run_id]

    @property
    def active(self) -> bool:
        return not self.done.is_set()

    def add_event(self, ev: AgentEvent, offset: int) -> None:
        """Take ``ev`` of the run (``offset``: its attempt's); its frames are made by the run's
        ``maker`` when someone reads them (``materialize``): a run nobody streams makes none."""
        self.backlog.append((ev, offset))
        self.updated_at = datetime.now(UTC)
        self._wake.set()
        self._wake = asyncio.Event()

    def materialize(self) -> None:
        """Make the frames of the events taken so far (in order, so their ids are the same
        whenever this happens)."""
        if self.backlog and self.maker is not None:
            backlog, self.backlog = self.backlog, []
            for item in backlog:
                self._append(item if isinstance(item, list) else self.maker.frames(*item))

    def add(self, frames: Iterable[Frame]) -> None:
        """Append ``frames`` (after the frames of the events taken before them)."""
        ready = list(frames)
        if self.backlog:
            self.backlog.append(ready)
            self.releasable = self.releasable and not any(f.event == "error" for f in ready)
        else:
            self._append(ready)
        self.updated_at = datetime.now(UTC)
        self._wake.set()
        self._wake = asyncio.Event()

    def _append(self, frames: Iterable[Frame]) -> None:
        for f in frames:
            if f.id is not None:
                self.index[f.id] = len(self.frames)
            if f.event == "error":  # a replay would lack it: keep the frames as they were sent
                self.releasable = False
            self.frames.append(f)

    def stop(self) -> Awaitable[Any] | None:
        """Ask the run to stop: a turn here at its next step, a queued run's job by abort
        (returned: await it)."""
        if self.abort is not None:
            return self.abort()
        self.cancel.set()
        return None

    def finish(self) -> None:
        self.done.set()
        self._wake.set()

    def release_if_unread(self) -> None:
        """Drop what only a reader needs (frames, their index, the frame maker with its copy of
        the transcript) once the run ended, left the newest finished runs (``expired``) and
        nobody reads it: a finished run this process still holds then costs a few hundred
        bytes, whatever the thread's length; a later reader gets its frames again, with the
        same ids, from the journal (without the token deltas, which are never journaled)."""
        if not (self.releasable and self.expired) or self.readers or self.released:
            return
        if self.final is not None:  # a stateless run: its thread (and journal) is deleted
            return
        self.frames, self.index, self.maker, self.result, self.task = [], {}, None, None, None
        self.backlog = []
        self.done = self.cancel = self._wake = _FINISHED  # set: nothing waits on it any more
        self.released = True

    def template(self) -> LgRun:
        """A copy of this run's record without its frames (what a replay starts from)."""
        return LgRun(
            self.run_id,
            self.thread_id,
            self.assistant_id,
            self.multitask_strategy,
            list(self.stream_modes),
            metadata=dict(self.metadata),
            on_disconnect=self.on_disconnect,
            created_at=self.created_at,
            attempts=list(self.attempts),
            background=self.background,
            revision=self.revision,
            assistant_version=self.assistant_version,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "agent_id": self.assistant_id,  # the open Agent Protocol's name for it
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": {"stream_mode": self.stream_modes, "on_disconnect": self.on_disconnect},
            "stop_reason": self.stop_reason,
            "error": self.error,
            "revision": self.revision,
            "assistant_version": self.assistant_version,
        }

    def start_at(self, last_event_id: str | None) -> int:
        """The buffer position after ``last_event_id`` (``InputError``-like ``ValueError`` for
        an id this run never sent)."""
        self.materialize()
        if not last_event_id:
            return 0
        pos = self.index.get(last_event_id.strip())
        if pos is not None:
            return pos + 1
        seq, _ = parse_event_id(last_event_id)  # InputError when malformed
        same = None
        for i, f in enumerate(self.frames):  # an id this buffer lacks: next event on
            if f.id is None:
                continue
            at = parse_event_id(f.id)[0]
            if at > seq:
                return i
            if at == seq:
                same = i
        if same is not None:  # a frame of an event it holds (a crew member's): after it
            return same + 1
        if self.done.is_set():
            raise ValueError(f"Last-Event-ID {last_event_id!r} is past the end of the run")
        raise ValueError(f"Last-Event-ID {last_event_id!r} was never sent by this run")

    def follow(self, start: int) -> AsyncIterator[Frame]:
        """The frames from ``start`` on, then the live tail until the run ends. The run counts
        as read from this call on (not from the first iteration), so its frames stay until the
        reader is done with them."""
        if self.released:
            raise RuntimeError(f"run {self.run_id}'s frames were released; rehydrate it first")
        self.readers += 1
        return self._follow(start)

    async def _follow(self, start: int) -> AsyncIterator[Frame]:
        i = start
        try:
            while True:
                wake = self._wake
                self.materialize()
                while i < len(self.frames):
                    frame = self.frames[i]
                    # what the frame shows, or what a reader numbers messages with
                    seg = frame.needs_base or (self.maker.seg if self.maker else None)
                    if seg is not None and seg.base is None:
                        await seg.read_base()
                    yield frame
                    i += 1
                if self.done.is_set():
                    return
                await wake.wait()
        finally:
            self.readers -= 1
            self.release_if_unread()


class RunManager:
    """The server's runs: the ones running and the last ``keep`` finished, by id."""

    def __init__(
        self,
        store: Store,
        keep: int = 1000,
        on_end: Callable[[LgRun], Awaitable[None]] | None = None,
        keep_whole: int = 16,
    ) -> None:
        self.store = store
        self.keep = keep
        self.runs: OrderedDict[str, LgRun] = OrderedDict()
        self.by_thread: dict[str, list[str]] = {}
        self.on_end = on_end  # every run this process ran, after its turn ended
        self.keep_whole = keep_whole
        # the thread's messages in LangChain form, shared (``loom.server.runs.transcript_values``)
        self.transcript: Callable[[str], Awaitable[list[dict[str, Any]]]] | None = None
        self.whole: deque[LgRun] = deque()  # the newest finished runs, frames kept as sent

    def get(self, run_id: str) -> LgRun | None:
        return self.runs.get(run_id)

    def of_thread(self, thread_id: str) -> list[LgRun]:
        return [self.runs[r] for r in self.by_thread.get(thread_id, ()) if r in self.runs]

    def active_on(self, thread_id: str) -> list[LgRun]:
        return [r for r in self.of_thread(thread_id) if r.active]

    def forget_thread(self, thread_id: str) -> None:
        for run_id in self.by_thread.pop(thread_id, []):
            self.runs.pop(run_id, None)

    def start(self, run: LgRun, turn: Any) -> None:
        """Run ``turn`` (a ``loom.engine.loop.Turn``, or a crew's ``CrewTurn``) in a task of its
        own, feeding ``run``."""
        self.runs[run.run_id] = run
        self.by_thread.setdefault(run.thread_id, []).append(run.run_id)
        if run.maker is None:  # a crew run comes with its own (loom.server.lg_crews)
            run.maker = FrameMaker(run.thread_id, run.run_id, run.assistant_id)
        if not run.frames:  # a carried-on run holds its earlier attempts' frames already
            run.add([Frame(None, "metadata", {"run_id": run.run_id, "attempt": 1})])
        # a crew's frames are not replayed from the journal as they were made: kept whole
        run.releasable = type(run.maker) is FrameMaker and not any(
            f.event == "error" for f in run.frames
        )
        run.task = asyncio.ensure_future(self._execute(run, turn))
        self._evict()

    def attach(self, run: LgRun, feed: Callable[[LgRun], Awaitable[None]]) -> None:
        """Hold ``run``, fed by ``feed`` (a queued run's journal tail) instead of a turn."""
        self.runs[run.run_id] = run
        ids = self.by_thread.setdefault(run.thread_id, [])
        if run.run_id not in ids:
            ids.append(run.run_id)
        run.add([Frame(None, "metadata", {"run_id": run.run_id, "attempt": 1})])
        run.task = asyncio.ensure_future(self._feed(run, feed))
        self._evict()

    async def _feed(self, run: LgRun, feed: Callable[[LgRun], Awaitable[None]]) -> None:
        try:
            await feed(run)
        except Exception as exc:  # lost track of it: say so, and let the next reader tail anew
            log.exception("following run %s failed", run.run_id)
            run.add([Frame(None, "error", {"error": type(exc).__name__, "message": str(exc)})])
            self.runs.pop(run.run_id, None)
        finally:
            if not run.done.is_set():
                run.add([Frame(None, "end", {"run_id": run.run_id, "status": run.status})])
                run.finish()

    async def _execute(self, run: LgRun, turn: Any) -> None:
        maker = run.maker
        assert maker is not None
        attempts = run.attempt_ids()
        turn_id = str(getattr(turn, "run_id", run.run_id))
        offset = attempt_offset(attempts.index(turn_id)) if turn_id in attempts else 0
        try:
            async for ev in drive(turn, run.cancel):
                own = ev.run_id == turn_id  # not a crew member's (their runs are their own)
                if own and isinstance(ev, AgentStart):
                    run.status = "running"
                    run.materialize()  # what came before, with the maker's state before
                    maker.start_lazily(partial(self._base, run, turn_id, attempts))
                run.add_event(ev, offset if own else 0)
                if own and isinstance(ev, AgentFinish):
                    run.stop_reason = ev.stop_reason
                    run.status = run_status(ev.stop_reason)
                    run.error = ev.error
            run.result = turn.result
        except LoomError as exc:
            run.status, run.error = "error", f"{type(exc).__name__}: {exc}"
            if "Cancelled" in type(exc).__name__:
                run.status = "interrupted"
            run.add([Frame(None, "error", {"error": type(exc).__name__, "message": str(exc)})])
        except Exception as exc:  # an internal failure: say so on the stream, keep serving
            log.exception("run %s failed", run.run_id)
            run.status, run.error = "error", f"{type(exc).__name__}: {exc}"
            run.add([Frame(None, "error", {"error": type(exc).__name__, "message": str(exc)})])
        finally:
            if run.status in ("pending", "running"):
                run.status = "interrupted"
            for on_end in (self.on_end, run.on_end):
                if on_end is None:
                    continue
                try:
                    await on_end(run)
                except Exception:  # cleanup only: the run's outcome stands
                    log.exception("cleaning up after run %s failed", run.run_id)
            run.add([Frame(None, "end", {"run_id": run.run_id, "status": run.status})])
            run.finish()
            self._retire(run)

    def _retire(self, run: LgRun) -> None:
        """Keep ``run``'s frames as sent while it is one of the ``keep_whole`` newest finished
        runs (a client that rejoins right after the end reads its token deltas too); then
        release them (``LgRun.release_if_unread``): the buffers of finished runs are bounded
        whatever the number and length of threads."""
        if not run.releasable:
            return
        self.whole.append(run)
        while len(self.whole) > self.keep_whole:
            old = self.whole.popleft()
            old.expired = True
            old.release_if_unread()

    async def _base(
        self, run: LgRun, run_id: str, attempts: list[str]
    ) -> Sequence[Message | dict[str, Any]]:
        """The thread's transcript before ``run`` (before ``run_id``, its current attempt, and
        the attempts before it), read when a reader first needs it. While the run goes on:
        the message count less the run's own messages, read consistently (the turn may commit
        more meanwhile). Once it ended (another run may have followed on the thread): the
        transcript of the journal's events before its first one, as a replay reads it."""
        thread_id = run.thread_id
        if run.done.is_set():
            events = await self.store.load_events(thread_id)
            first = next((i for i, e in enumerate(events) if e.run_id in attempts), len(events))
            return transcript(events[:first])
        mine = [a for a in attempts[: attempts.index(run_id) + 1]] if run_id in attempts else []
        count = own = 0
        for _ in range(20):
            count = await self.store.message_count(thread_id)
            own = 0
            for attempt in mine or [run_id]:
                own += len(transcript(await self.store.load_events(thread_id, attempt)))
            if await self.store.message_count(thread_id) == count:
                break
        if self.transcript is not None:  # shared with other runs (and the blocking answers)
            return (await self.transcript(thread_id))[: count - own]
        return (await self.store.load_messages(thread_id))[: count - own]

    def _evict(self) -> None:
        while len(self.runs) > self.keep:
            victim = next((r for r in self.runs.values() if not r.active), None)
            if victim is None:
                return
            del self.runs[victim.run_id]
            ids = self.by_thread.get(victim.thread_id, [])
            with contextlib.suppress(ValueError):
                ids.remove(victim.run_id)

    async def replay(
        self,
        thread_id: str,
        run_id: str,
        assistant_id: str,
        *,
        template: LgRun | None = None,
        ended: bool = True,
    ) -> LgRun | None:
        """A run this process does not hold, rebuilt from the journal: ``template`` (its
        stored record: stream modes, attempts, metadata) or defaults. ``ended=False`` leaves
        it open (a run about to be carried on here): no end frame, not finished. None when
        the journal holds nothing of it and there is no record."""
        run = template or LgRun(run_id, thread_id, assistant_id, "enqueue", ["values"])
        attempts = run.attempt_ids()
        events = await self.store.load_events(thread_id)
        first = next((i for i, e in enumerate(events) if e.run_id in attempts), None)
        if first is None and template is None:
            return None
        maker = FrameMaker(thread_id, run_id, run.assistant_id)
        maker.start(transcript(events[:first]))
        run.add([Frame(None, "metadata", {"run_id": run_id, "attempt": 1})])
        started = False
        for ev in events[len(events) if first is None else first :]:
            if ev.run_id not in attempts:
                continue
            started = True
            run.add(maker.frames(ev, attempt_offset(attempts.index(ev.run_id))))
            if ev.type == EventType.AGENT_FINISH and isinstance(ev, AgentFinish):
                run.stop_reason, run.error = ev.stop_reason, ev.error
                run.status = run_status(ev.stop_reason)
        if run.stop_reason is None:  # no end in the journal
            # never started: still to run; started: its process died mid-run
            run.status = "pending" if not started else "running" if not ended else "interrupted"
        if first is not None:
            run.updated_at = datetime.fromtimestamp(events[-1].timestamp, UTC)
            if template is None:
                run.created_at = datetime.fromtimestamp(events[first].timestamp, UTC)
        run.maker = maker
        if ended:
            run.add([Frame(None, "end", {"run_id": run_id, "status": run.status})])
            run.finish()
        return run
