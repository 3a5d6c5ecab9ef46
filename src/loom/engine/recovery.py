"""Crash recovery: what an earlier run of a session left open, found at the next turn's INTAKE.

A run that died (SIGKILL, OOM, power cut) can leave three kinds of loose ends:

1. tool calls whose ledger says ``started`` with no end: they were running. The tool's declared
   effect decides: ``pure`` and ``idempotent`` calls run again with the *same* idempotency key
   (``RunContext.idempotency_key`` = ``run_id:tool_call_id`` of the dead run) and their real
   result is recorded; ``at_most_once`` calls (the default) are not repeated and get an
   ``interrupted`` result that says their outcome is unknown;
2. tool calls in a committed assistant message that never reached the ledger: the process died
   between committing the model's answer and starting the tools, so they never ran; they get an
   ``interrupted`` result that says so;
3. the run itself, ``running`` with no end: it gets an end record with status ``"crashed"``.

``find_loose_ends`` only finds them (two indexed lookups when there is nothing to recover); the
loop resolves them in its INTAKE, under the turn timeout, and commits every result through its
journal (``RUN_RECOVERED`` and ``TOOL_RESULT`` / ``TOOL_ERROR`` events with ``recovered`` set),
so every tool call again has exactly one result, which every provider requires of a history.
Recovery runs under the session lease, so no live run of the session can be mistaken for a dead
one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loom.messages import Message, ToolCall, ToolResult
from loom.store.base import LedgerEntry, RunRecord
from loom.tools.executor import error_result

if TYPE_CHECKING:
    from loom.store.base import RunStore, Store

__all__ = ["CRASHED", "LooseEnds", "find_loose_ends", "never_started", "outcome_unknown"]

CRASHED = "crashed"


@dataclass(slots=True)
class LooseEnds:
    """What dead runs left open, and what to do about each."""

    rerun: list[LedgerEntry] = field(default_factory=list)  # pure / idempotent: run again
    unknown: list[LedgerEntry] = field(default_factory=list)  # at_most_once: interrupted
    ledger_only: list[LedgerEntry] = field(default_factory=list)  # answered; close the ledger
    never_ran: list[ToolCall] = field(default_factory=list)  # in a message, not in the ledger
    dead_runs: list[RunRecord] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.rerun or self.unknown or self.ledger_only or self.never_ran or self.dead_runs
        )


async def find_loose_ends(
    store: Store,
    runs: RunStore | None,
    session_id: str,
    unanswered: dict[str, ToolCall],
    waiting: set[str],
    current_run: str,
) -> LooseEnds:
    """Find what earlier runs of the session left open (see the module docstring).

    ``unanswered`` are the calls of the newest exchange without a result and ``waiting`` those
    of them parked for a human decision (not loose: they wait for ``resume``).
    """
    ends = LooseEnds()
    if runs is not None:
        ends.dead_runs = [r for r in await runs.open_runs(session_id) if r.run_id != current_run]
    for entry in await store.open_tool_calls(session_id):
        if entry.run_id == current_run:
            continue
        if entry.tool_call_id not in unanswered:  # its result is stored; the ledger was not closed
            ends.ledger_only.append(entry)
        elif entry.effect in ("pure", "idempotent"):
            ends.rerun.append(entry)
        else:
            ends.unknown.append(entry)
    in_ledger = {e.tool_call_id for e in (*ends.rerun, *ends.unknown)}
    ends.never_ran = [
        c for cid, c in unanswered.items() if cid not in in_ledger and cid not in waiting
    ]
    return ends


def outcome_unknown(call: ToolCall) -> ToolResult:
    return error_result(
        call,
        "interrupted",
        f"the run that made this call stopped before it "
        f"finished; whether {call.name} took effect is unknown. Check before "
        "repeating it.",
    )


def never_started(call: ToolCall) -> ToolResult:
    why = f"the run stopped before this call started: {call.name} did not run. Call it again "
    return error_result(call, "interrupted", why + "if it is still needed.")


def call_of(entry: LedgerEntry) -> ToolCall:
    return ToolCall(id=entry.tool_call_id, name=entry.name, arguments=entry.arguments)


def answered_ids(messages: list[Message]) -> set[str]:
    return {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
