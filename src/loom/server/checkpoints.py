"""Checkpoints of a thread: the run API's time travel (LangGraph's checkpoints, OpenAI's
``previous_response_id``) over a session's journal.

**A checkpoint is a stored event.** Its id is ``"<run_id>.<sequence>"``: the run that stored
the event and the event's sequence in that run, the point ``AtEvent(run_id, sequence)``
(``loom.engine.run_inputs``). A stream's frame ids are ``"<sequence>.<slot>"`` per run
(``loom.server.lg_runs``), so every frame with an id a client received names a checkpoint:
``"<run_id>.<sequence>"`` with the run id of the stream (a run carried on after a crash: the
sequence's millions name its attempt, ``attempt_offset``; both forms are read). The thread's
values at a checkpoint are its transcript just after that event, the journal replayed to it
(branches before it applied, as ``loom.engine.journal.transcript`` does).

**History lists one checkpoint per run**: the last stored event of each run (a state update's
and a fork's start count as runs), newest first, the abandoned branches' included, as
LangGraph lists every checkpoint of a thread. A checkpoint's parent is the one before it; a
run that branched (a rewind, an edit, a regenerate, a run from a checkpoint, a fork's start)
has for parent the stored event whose state it went back to. Any other stored event is a
checkpoint too (``GET /threads/{id}/state/{checkpoint_id}`` replays to it), so an id derived
from any frame a client received is usable.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from loom.engine.journal import follow
from loom.engine.run_inputs import AtEvent, Rewind
from loom.errors import InputError, SessionBusy
from loom.events import AgentEvent, EventType, SessionBranch, make_event
from loom.messages import Message
from loom.server.lg_runs import attempt_offset
from loom.text import whole_number

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.engine.runtime import Runtime

__all__ = [
    "UPDATE_PREFIX",
    "Checkpoint",
    "append_update",
    "checkpoint_id",
    "move_to",
    "next_nodes",
    "parent_of",
    "parse_checkpoint_id",
    "point_of_id",
    "resolve",
    "roll_back",
    "same_state",
    "snapshot_metadata",
    "state_at",
    "states_at",
    "unknown_checkpoint",
    "update_messages",
    "walk",
]

UPDATE_PREFIX = "update_"
"""The run id prefix of the events a state update (``POST /threads/{id}/state``) stores."""

_ID_HELP = (
    "a checkpoint id is '<run_id>.<sequence>': a run's id and the sequence of one of its "
    "stored events (the number before the dot of an event id the run's stream sent, e.g. "
    "'run_ab12.7' for event id '7.3' of run 'run_ab12'), as GET /threads/{id}/state and "
    "POST /threads/{id}/history give them"
)


@dataclass(slots=True)
class Checkpoint:
    """One listed checkpoint: the event that changed the thread's state."""

    id: str
    run_id: str
    sequence: int
    position: int  # in the journal
    parent: str | None
    source: str  # LangGraph's: "input", "loop", "update", "fork"
    timestamp: float
    count: int  # messages in the state


def checkpoint_id(event: AgentEvent) -> str:
    """The checkpoint id of a stored event."""
    return f"{event.run_id}.{event.sequence}"


def parse_checkpoint_id(value: object) -> tuple[str, int]:
    """``"<run_id>.<sequence>"`` as a pair; ``InputError`` (422) saying what an id looks like.
    A LangGraph ``checkpoint`` object (``{"checkpoint_id": ...}``) is read too."""
    if isinstance(value, dict):
        value = value.get("checkpoint_id")
    if not isinstance(value, str) or len(value) > 300:
        raise InputError(f"checkpoint id {str(value)[:60]!r} is unusable: {_ID_HELP}")
    run_id, dot, seq = value.strip().rpartition(".")
    if not dot or not run_id or whole_number(seq) is None:
        raise InputError(f"checkpoint id {value[:60]!r} is not one: {_ID_HELP}")
    return run_id, int(seq)


def point_of_id(value: object, events: Sequence[AgentEvent]) -> tuple[str, AtEvent] | None:
    """The stored event a checkpoint id names, as (its canonical id, its point); None when the
    journal holds no such event. A sequence past ``attempt_offset(1)`` names an attempt of a
    run carried on after a crash (``<run_id>-a<n + 1>``), as its frame ids count them."""
    run_id, seq = parse_checkpoint_id(value)
    candidates = [(run_id, seq)]
    attempt, rest = divmod(seq, attempt_offset(1))
    if attempt > 0:
        candidates.append((f"{run_id}-a{attempt + 1}", rest))
    keys = {(e.run_id, e.sequence) for e in events}
    for rid, s in candidates:
        if (rid, s) in keys:
            return f"{rid}.{s}", AtEvent(rid, s)
    return None


def _source(run_id: str, branched: str | None) -> str:
    if branched is not None:
        return "fork" if branched == "fork" else "update"
    return "update" if run_id.startswith(UPDATE_PREFIX) else "loop"


def walk(events: Sequence[AgentEvent]) -> list[Checkpoint]:
    """The listed checkpoints of a journal, oldest first: the last stored event of each run
    (a state update's and a fork's start included). A checkpoint's parent is the one before
    it; a run that branched (a rewind, an edit, a regenerate, a fork's start) has for parent
    the stored event whose state it went back to."""
    out: list[Message] = []
    creators: list[str] = []  # the stored event that put each message of ``out`` there
    listed: list[Checkpoint] = []
    previous: str | None = None
    parent: str | None = None
    branched: str | None = None
    first = checkpoint_id(events[0]) if events else None
    for i, event in enumerate(events):
        starts = i == 0 or events[i - 1].run_id != event.run_id
        if starts:
            parent, branched = previous, None
        if type(event) is SessionBranch:
            assert isinstance(event, SessionBranch)
            point = event.point
            if "run_id" in point and "sequence" in point:
                parent = f"{point['run_id']}.{point['sequence']}"
            else:
                parent = creators[event.at - 1] if 0 < event.at <= len(creators) else first
            branched = event.reason
            del creators[event.at :]
        follow(out, event)
        creators.extend([checkpoint_id(event)] * (len(out) - len(creators)))
        if i + 1 == len(events) or events[i + 1].run_id != event.run_id:
            cid = checkpoint_id(event)
            listed.append(
                Checkpoint(
                    cid,
                    event.run_id,
                    event.sequence,
                    i,
                    parent,
                    _source(event.run_id, branched),
                    event.timestamp,
                    len(out),
                )
            )
            previous = cid
    return listed


def parent_of(events: Sequence[AgentEvent], position: int) -> str | None:
    """The parent of the stored event at ``position`` that history does not list: the listed
    checkpoint its run continued from."""
    listed = walk(events[: position + 1])
    return listed[-1].parent if listed else None


def states_at(events: Sequence[AgentEvent], positions: set[int]) -> dict[int, list[Message]]:
    """The transcript just after each journal position of ``positions``, in one pass."""
    out: list[Message] = []
    found: dict[int, list[Message]] = {}
    last = max(positions, default=-1)
    for i, event in enumerate(events[: last + 1]):
        follow(out, event)
        if i in positions:
            found[i] = list(out)
    return found


def state_at(events: Sequence[AgentEvent], point: AtEvent) -> list[Message] | None:
    """The transcript just after the stored event ``point`` names (None: no such event)."""
    for i, event in enumerate(events):
        if event.run_id == point.run_id and event.sequence == point.sequence:
            return states_at(events, {i})[i]
    return None


def same_state(a: Sequence[Message], b: Sequence[Message]) -> bool:
    """Whether two transcripts are the same state: the same messages (role, text, calls and
    results) in the same order. A replayed message and its stored copy may differ in what is
    not the conversation (a timestamp's precision, metadata), so that is not compared."""
    if len(a) != len(b):
        return False
    return all(_key(x) == _key(y) for x, y in zip(a, b, strict=True))


def _key(m: Message) -> tuple[object, ...]:
    calls = tuple((c.id, c.name) for c in m.tool_calls)
    return (m.role, m.content, m.tool_call_id, calls, len(m.parts))


def next_nodes(messages: Sequence[Message], pending: bool) -> list[str]:
    """LangGraph's ``next`` for a state: what runs after it."""
    if pending:
        return ["tools"]
    if not messages:
        return []
    last = messages[-1]
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    if any(c.id not in answered for m in messages for c in m.tool_calls):
        return ["tools"]
    if last.role in ("user", "tool"):
        return ["agent"]
    return []


def snapshot_metadata(base: dict[str, Any], cp: Checkpoint | None, step: int) -> dict[str, Any]:
    """A checkpoint's metadata: the thread's, with where it came from."""
    if cp is None:
        return {**base, "source": "input", "step": -1, "writes": None, "parents": {}}
    return {
        **base,
        "source": cp.source,
        "step": step,
        "run_id": cp.run_id,
        "writes": None,
        "parents": {},
    }


# -- moving a thread ----------------------------------------------------------------------------
def unknown_checkpoint(thread_id: str, value: object) -> HTTPException:
    """The 404 for a checkpoint the thread's journal does not hold (saying what one is)."""
    return HTTPException(
        404,
        f"thread {thread_id!r} has no checkpoint {str(value)[:80]!r}: {_ID_HELP}",
    )


async def resolve(
    runtime: Runtime, thread_id: str, value: object
) -> tuple[str, AtEvent, list[AgentEvent]]:
    """The checkpoint ``value`` names in ``thread_id``'s journal: its canonical id, its point
    and the journal; 422 for a malformed id, 404 for one the journal does not hold."""
    events = await runtime.store.load_events(thread_id)
    found = point_of_id(value, events)
    if found is None:
        raise unknown_checkpoint(thread_id, value)
    return found[0], found[1], events


async def move_to(runtime: Runtime, agent: Agent, thread_id: str, value: object) -> bool:
    """Rewind ``thread_id`` to the checkpoint ``value`` names (a ``Rewind`` turn: the later
    messages leave the transcript and stay in the journal, under the agent's
    ``branch_effects``); nothing when the thread is at that state already. ``BranchError``
    (422) for a checkpoint inside a step. Whether the thread moved."""
    _, point, events = await resolve(runtime, thread_id, value)
    target = state_at(events, point)
    if target is not None and same_state(target, await runtime.store.load_messages(thread_id)):
        return False
    await runtime.run(agent, Rewind(point), session_id=thread_id)
    return True


async def roll_back(runtime: Runtime, agent: Agent, thread_id: str, run_ids: list[str]) -> bool:
    """Rewind ``thread_id`` to the state the earliest of ``run_ids`` (interrupted runs, ended)
    started from: their turns leave the transcript and stay in the journal. Whether it moved
    (a run that stored nothing left nothing to undo)."""
    events = await runtime.store.load_events(thread_id)
    wanted = set(run_ids)
    first = next((e for e in events if e.run_id in wanted), None)
    if first is None:
        return False
    target = state_at(events, AtEvent(first.run_id, first.sequence))
    if target is None or same_state(target, await runtime.store.load_messages(thread_id)):
        return False
    await runtime.run(agent, Rewind(AtEvent(first.run_id, first.sequence)), session_id=thread_id)
    return True


def _update_message(item: object, where: str) -> tuple[EventType, dict[str, Any]]:
    """One message of a state update as the event that adds it."""
    if isinstance(item, str):
        return EventType.USER_MESSAGE, {"content": item}
    if not isinstance(item, dict):
        raise InputError(f"{where} must be a message object or a string, got {item!r:.60}")
    kind = item.get("role") or item.get("type")
    content = item.get("content", "")
    if not isinstance(content, str):
        raise InputError(f"{where}.content must be text in a state update (no media)")
    if kind in ("human", "user"):
        return EventType.USER_MESSAGE, {"content": content}
    if kind in ("ai", "assistant") and not item.get("tool_calls"):
        return EventType.LLM_COMPLETE, {"text": content}
    raise InputError(
        f"{where} is a {kind!r} message; a state update adds user (human) messages and "
        "assistant (ai) text answers: tool calls and results come from runs"
    )


def update_messages(values: object) -> list[tuple[EventType, dict[str, Any]]]:
    """What a state update's ``values`` add: ``{"messages": [...]}`` (or a list of them)."""
    if values is None:
        return []
    updates = values if isinstance(values, list) else [values]
    out: list[tuple[EventType, dict[str, Any]]] = []
    for update in updates:
        if not isinstance(update, dict) or set(update) - {"messages"}:
            raise InputError(
                "a state update's values are {\"messages\": [...]} (a thread's only key); "
                f"got {str(update)[:80]!r}"
            )
        messages = update.get("messages")
        if isinstance(messages, dict | str):
            messages = [messages]
        if not isinstance(messages, list):
            raise InputError("values.messages must be a list of messages")
        out.extend(_update_message(m, f"values.messages[{i}]") for i, m in enumerate(messages))
    return out


async def append_update(
    runtime: Runtime, thread_id: str, added: list[tuple[EventType, dict[str, Any]]]
) -> str | None:
    """Commit a state update's messages as one step of their own run (``update_<hex>``),
    under the session's lease; the checkpoint id of the last one (None: nothing added).
    ``SessionBusy`` when a run holds the thread."""
    if not added:
        return None
    run_id = f"{UPDATE_PREFIX}{uuid.uuid4().hex}"
    lease = await runtime.store.acquire_lease(thread_id, run_id, 30.0)
    if lease is None:
        raise SessionBusy(f"thread {thread_id!r} is running a run; update its state after it ends")
    try:
        events = [
            make_event(kind, run_id, thread_id, 0, seq, data)
            for seq, (kind, data) in enumerate(added)
        ]
        messages = [m for m in (e.message() for e in events) if m is not None]
        await runtime.store.append(thread_id, messages=messages, events=events, lease=lease)
    finally:
        await runtime.store.release_lease(lease)
    return checkpoint_id(events[-1])
