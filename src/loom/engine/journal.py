"""The journal: the only writer of a session's history.

A ``Journal`` belongs to one run. It numbers the run's events, makes the text they carry
representable (lone surrogates from undecodable bytes become visible escapes), commits each
step (events, the messages those events put into the transcript, ledger rows, run records)
in one ``Store.append`` under the session's lease, and only then emits the events: persist
before you announce. Events that are not steps (``ITERATION_START``, ``STATE_CHANGE``, …) are
emitted at once and journaled with the next commit; ``LLM_DELTA``, ``LLM_REASONING_DELTA`` and
``OUTPUT_PARTIAL`` are never journaled (the ``LLM_COMPLETE`` that follows carries the whole
answer), and in a run nobody watches live the progress notices (:data:`PROGRESS_TYPES`) are
not even built (``Journal.notices``). :data:`STEP_TYPES` names the types that are only ever
emitted after their commit: a stream that lets a client resume by event id gives ids to those
alone, so every id a client received is in the journal after a crash. A step may be held
(``commit(..., hold=True)``) into the next commit: one transaction (one fsync) for both, its
events emitted after that commit. The loop holds a model answer with tool calls until its
calls' ``started`` rows are committed; and, in a run nobody watches live (no stream, no
observer, no user hook), the result of a ``pure`` or ``idempotent`` call (with its ledger end)
until the next model answer's commit, so that a tool step costs one commit. A held step's
messages are in ``history`` at once (the next model call must see them); a crash before the
commit loses only what nobody was told: the call's ``started`` row has no end, and recovery
runs it again with the same idempotency key (which those effects allow). An ``at_most_once``
call's result is never held: it is committed as soon as it exists, since its tool cannot run
again.

The transcript is a function of the journal: ``transcript(events)`` keeps, in order, the
message each event adds (``AgentEvent.message()``). The journal derives the messages it commits
with that same function, so ``Store.load_messages`` always equals ``transcript(load_events)``;
the JSONL export, ``loom sessions show`` and the context builder all read that transcript.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic_core import to_json

from loom.events import (
    AgentEvent,
    EventType,
    LlmDelta,
    LlmReasoningDelta,
    OutputPartial,
    SessionBranch,
    make_event,
)
from loom.messages import Message
from loom.store.base import LedgerEntry, RunRecord
from loom.text import representable

if TYPE_CHECKING:
    from loom.store.base import Lease, Store

__all__ = ["PROGRESS_TYPES", "STEP_TYPES", "Journal", "clean", "follow", "transcript"]

Ev = TypeVar("Ev", bound=AgentEvent)

STEP_TYPES: frozenset[EventType] = frozenset(
    {
        EventType.AGENT_START,
        EventType.USER_MESSAGE,
        EventType.QUERY_ANSWER,
        EventType.MEMORY_RECORD,
        EventType.LLM_COMPLETE,
        EventType.SERVER_QUERY,
        EventType.JUDGE_RESULT,
        EventType.JUDGE_RETRY,
        EventType.OUTPUT_RETRY,
        EventType.TOOL_EXECUTION_START,
        EventType.TOOL_RESULT,
        EventType.TOOL_ERROR,
        EventType.APPROVAL_REQUIRED,
        EventType.APPROVAL_DECISION,
        EventType.RUN_RECOVERED,
        EventType.SESSION_BRANCH,
        EventType.CREW_MEMBER_START,
        EventType.CREW_MEMBER_FINISH,
        EventType.AGENT_FINISH,
    }
)
"""Event types a journal emits only after committing them (``Journal.commit``'s events): the
steps of a run. Every other type (``ITERATION_START``, ``CONTEXT_*``, ``STATE_CHANGE``,
``LLM_START``, ``RECURSION``, ``WARNING``, …) is announced as it happens and journaled with the
next step, so a crash can lose it; deltas are never journaled."""


PROGRESS_TYPES: frozenset[EventType] = frozenset(
    {
        EventType.ITERATION_START,
        EventType.STATE_CHANGE,
        EventType.CONTEXT_ASSEMBLY_START,
        EventType.CONTEXT_COMPONENT_INCLUDED,
        EventType.CONTEXT_COMPONENT_EXCLUDED,
        EventType.CONTEXT_COMPONENT_TRUNCATED,
        EventType.CONTEXT_ASSEMBLY_COMPLETE,
        EventType.RECURSION,
        EventType.LLM_TOOL_CALLS,
        EventType.LLM_DELTA,
        EventType.LLM_REASONING_DELTA,
        EventType.OUTPUT_PARTIAL,
    }
)
"""Progress notices: events that only report where a run is (its state, iteration, context
assembly, the calls the answer being committed asks for, which its ``LLM_COMPLETE`` carries
too), which nothing reads back from the journal and no step depends on. A run someone watches
live (a stream, an observer) announces them and journals them with the next step (deltas
never); a run nobody watches (``Runtime.run``, ``Agent.run`` without observers) does not build
them at all (``Journal.notices``): a tool step then stores its steps (``LLM_COMPLETE``,
``TOOL_EXECUTION_START``, ``TOOL_RESULT``) and the notices that are not progress
(``LLM_START``, guardrail decisions, warnings, ...)."""


def transcript(events: Iterable[AgentEvent]) -> list[Message]:
    """The session's messages, derived from its journal (events in journal order). A
    ``SESSION_BRANCH`` keeps the first ``at`` messages, then its restored messages and its
    note: the turns it abandoned stay in the journal, outside the transcript."""
    out: list[Message] = []
    for event in events:
        follow(out, event)
    return out


def follow(out: list[Message], event: AgentEvent) -> bool:
    """``out`` (a transcript so far) after ``event``: what ``transcript`` does for each.
    Whether ``event`` changed it."""
    changed = False
    if type(event) is SessionBranch:
        del out[event.at :]
        out.extend(event.restored_messages())
        changed = True
    m = event.message()
    if m is not None:
        out.append(m)
        changed = True
    return changed


def clean(value: Any) -> tuple[Any, bool]:
    """``value`` (str, list, dict of them) with every string made representable."""
    if isinstance(value, str):
        # Only text with a non-ASCII character can hold a surrogate: one C call for the rest.
        return (value, False) if value.isascii() else representable(value)
    if isinstance(value, dict):
        changed = False
        out_d: dict[Any, Any] = {}
        for k, v in value.items():
            ck, c1 = clean(k) if isinstance(k, str) else (k, False)
            cv, c2 = clean(v)
            changed = changed or c1 or c2
            out_d[ck] = cv
        return (out_d, True) if changed else (value, False)
    if isinstance(value, list | tuple):
        items = [clean(v) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False


_TEXT_FIELDS = ("content", "answer", "correction", "message_text", "arguments", "tool_calls")
_TEXT_OF: dict[type[AgentEvent], attrgetter[Any] | None] = {}


def _text_getter(cls: type[AgentEvent]) -> attrgetter[Any] | None:
    names = [n for n in _TEXT_FIELDS if n in cls.PAYLOAD]
    getter = _TEXT_OF[cls] = attrgetter(*names) if names else None
    return getter


def _all_ascii(events: Sequence[AgentEvent]) -> bool:
    """True when no text field of ``events`` holds a non-ASCII character (so none can hold a
    lone surrogate): one JSON encoding in C instead of walking each value. False whenever in
    doubt (a value without a JSON form, a surrogate): ``clean`` then walks the values."""
    values = []
    for ev in events:
        cls = type(ev)
        getter = _TEXT_OF[cls] if cls in _TEXT_OF else _text_getter(cls)
        if getter is not None:
            values.append(getter(ev))
    if not values:
        return True
    try:
        return to_json(values).isascii()
    except (ValueError, RecursionError):  # PydanticSerializationError too
        return False


_EPHEMERAL = (LlmDelta, LlmReasoningDelta, OutputPartial)  # shown as they stream, never journaled


class Journal:
    """Numbers, commits and emits one run's events (see the module docstring).

    ``history`` is the session's transcript as committed (shared with the runtime's session
    cache, so the next turn reads it without going back to the store); ``added`` is what this
    run committed to it.
    """

    __slots__ = (
        "added",
        "after_commit",
        "emit",
        "held",
        "held_from",
        "held_out",
        "history",
        "iteration",
        "lease",
        "notices",
        "observers",
        "parent_run_id",
        "pending",
        "run_id",
        "seq",
        "session_id",
        "store",
        "warnings",
    )

    def __init__(
        self,
        store: Store,
        session_id: str,
        run_id: str,
        history: list[Message],
        *,
        lease: Lease | None = None,
        parent_run_id: str | None = None,
        observers: Sequence[Callable[[AgentEvent], None]] = (),
    ) -> None:
        self.store, self.session_id, self.run_id = store, session_id, run_id
        self.history = history
        self.added: list[Message] = []
        self.lease = lease
        self.parent_run_id = parent_run_id
        self.iteration = 0
        self.seq = 0
        self.pending: list[AgentEvent] = []
        # A step held back (``commit(..., hold=True)``): its journal slice, messages and
        # ledger rows, and what to emit once it is committed (its events, then what was sent
        # meanwhile); ``held_from`` is where its messages start in ``history`` (a failed
        # commit takes them out again).
        self.held: tuple[list[AgentEvent], list[Message], list[LedgerEntry]] | None = None
        self.held_from = 0
        self.held_out: list[AgentEvent] = []
        self.emit: Callable[[AgentEvent], None] = _discard
        self.observers = tuple(observers)
        self.warnings: list[str] = []
        # Called after each commit reaches the store (the sandbox pool snapshots workspaces
        # there: a snapshot never holds what an uncommitted step wrote).
        self.after_commit: Callable[[], Awaitable[None]] | None = None
        # Whether progress notices (``PROGRESS_TYPES``) are built: the turn turns it off in a
        # run nobody watches live (no stream, no observer), where nobody could see them.
        self.notices = True

    def event(self, cls: type[Ev], **payload: Any) -> Ev:
        """A new event of this run, numbered next."""
        ev = cls(
            run_id=self.run_id,
            session_id=self.session_id,
            iteration=self.iteration,
            sequence=self.seq,
            parent_run_id=self.parent_run_id,
            **payload,
        )
        self.seq += 1
        return ev

    def event_of(self, type: EventType, data: dict[str, Any]) -> AgentEvent:
        """A new event of this run from a payload dict (plugins describe events that way)."""
        ev = make_event(
            type,
            self.run_id,
            self.session_id,
            self.iteration,
            self.seq,
            data,
            parent_run_id=self.parent_run_id,
        )
        self.seq += 1
        return ev

    def announce(self, cls: type[AgentEvent], **payload: Any) -> None:
        """Emit an event that is not a step (journaled with the next commit; deltas never)."""
        self.send(self.event(cls, **payload))

    def notice(self, cls: type[AgentEvent], **payload: Any) -> None:
        """Announce a progress notice (a ``PROGRESS_TYPES`` event), unless nobody watches
        this run live (``notices`` off): then it is neither built, numbered nor journaled."""
        if self.notices:
            self.send(self.event(cls, **payload))

    def send(self, ev: AgentEvent) -> None:
        """Emit a numbered event that is not a step (journaled with the next commit)."""
        if type(ev) not in _EPHEMERAL:
            self.pending.append(ev)
        if self.held is not None:  # after the held step's events, never before them
            self.held_out.append(ev)
        else:
            self._out(ev)

    def warn(self, text: str, source: str) -> None:
        """Record a warning: in ``RunResult.warnings`` and as a ``WARNING`` event."""
        from loom.events import Warning

        self.warnings.append(text)
        self.announce(Warning, warning=text, source=source)

    async def commit(
        self,
        events: Sequence[AgentEvent],
        *,
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
        hold: bool = False,
    ) -> list[Message]:
        """Commit a step (its events, their messages, ledger rows, a run record), then emit
        the events. Returns the messages the step added to the transcript.

        ``hold=True`` commits nothing yet: the step goes into the next commit, in journal
        order, and its events (and any event sent meanwhile) are emitted after that commit,
        still persisted before announced; its messages join ``history`` at once. The loop
        holds a model answer with tool calls when nothing can look at the transcript before
        the calls' ``started`` rows are committed (no hooks there), and a quiet run's pure or
        idempotent result until the next answer (see the module docstring): one commit, one
        fsync, per step. A run that dies in between loses only steps nobody saw; the next turn
        asks the model again, and recovery re-runs a call whose result was lost. A run record
        is never held."""
        messages: list[Message] = []
        if events and not _all_ascii(events):
            for ev in events:
                self._make_representable(ev)
        for ev in events:
            m = ev.message()
            if m is not None:
                messages.append(m)
        journal, self.pending = [*self.pending, *events], []
        if hold and run is None:
            if self.held is None:
                self.held = (journal, messages, list(ledger))
                self.held_from = len(self.history)
            else:
                self.held[0].extend(journal)
                self.held[1].extend(messages)
                self.held[2].extend(ledger)
            self.history.extend(messages)
            self.held_out.extend(events)
            return messages
        out: Sequence[AgentEvent] = events
        added = messages
        in_history = len(self.history)  # where this commit's messages start in ``history``
        if self.held is not None:
            journal = [*self.held[0], *journal]
            added = [*self.held[1], *messages]
            ledger = [*self.held[2], *ledger]
            out = [*self.held_out, *events]
            in_history = self.held_from
            self.held, self.held_out = None, []  # committed below, or lost with this commit
        try:
            if any(m.parts for m in added):  # media bytes before the messages naming them
                await self._store_media(added)
            await self.store.append(
                self.session_id,
                messages=added,
                events=journal,
                ledger=ledger,
                run=run,
                lease=self.lease,
            )
        except BaseException:
            del self.history[in_history:]  # held messages that never reached the store
            raise
        self.history.extend(messages)
        self.added.extend(added)
        if self.after_commit is not None:
            await self.after_commit()
        for ev in out:
            self._out(ev)
        return messages

    async def branch(self, event: SessionBranch) -> list[Message]:
        """Commit a ``SESSION_BRANCH`` (``loom.engine.branching``), then emit it: in one store
        transaction the derived transcript drops its messages after ``event.at`` and gains the
        restored ones and the note (``BranchStore.rewind``), the journal gains the event, so a
        crash leaves the old state or the new one. ``history`` follows. Returns what the
        transcript gained. Nothing may be held (a branch starts a turn's INTAKE)."""
        from loom.errors import StoreError
        from loom.store.base import capabilities_of

        if self.held is not None:
            raise RuntimeError("a branch cannot follow a held step")  # the loop never does
        store = capabilities_of(self.store).branches
        if store is None:
            raise StoreError(
                f"{type(self.store).__name__} cannot move a session to another point (it has "
                "no BranchStore capability); use MemoryStore, SQLiteStore or PostgresStore"
            )
        gained = event.restored_messages()
        note = event.message()
        if note is not None:
            gained.append(note)
        journal, self.pending = [*self.pending, event], []
        if any(m.parts for m in gained):
            await self._store_media(gained)
        await store.rewind(
            self.session_id, event.at, messages=gained, events=journal, lease=self.lease
        )
        del self.history[event.at :]
        self.history.extend(gained)
        self.added.extend(gained)
        self._out(event)
        return gained

    async def _store_media(self, messages: Sequence[Message]) -> None:
        from loom.errors import UnsupportedContent
        from loom.store.base import capabilities_of
        from loom.store.media import blobs_of

        blobs = blobs_of(messages)
        if not blobs:
            return
        store = capabilities_of(self.store).blobs
        if store is None:
            raise UnsupportedContent(
                f"{type(self.store).__name__} cannot keep media (images, files, audio): use a "
                "store that does (MemoryStore, SQLiteStore, PostgresStore) or send text"
            )
        await store.put_blobs(self.session_id, blobs)

    def _out(self, ev: AgentEvent) -> None:
        self.emit(ev)
        for observe in self.observers:
            observe(ev)

    def _make_representable(self, ev: AgentEvent) -> None:
        changed: list[str] = []
        for name in _TEXT_FIELDS:
            value = getattr(ev, name, None)
            if value is None or isinstance(value, int | float):
                continue
            fixed, did = clean(value)
            if did:
                setattr(ev, name, fixed)
                changed.append(name)
        if changed:
            note = (
                f"{ev.type} {'/'.join(changed)} held text that was not valid Unicode (bytes "
                "that were not UTF-8); it was stored with those bytes shown as \\xNN escapes"
            )
            if note not in self.warnings:
                self.warnings.append(note)
            ev.extra["escaped"] = changed


def _discard(event: AgentEvent) -> None:
    return None
