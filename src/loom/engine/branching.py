"""Moving a session to another point of its history: rewind, regenerate, edit.

The journal stays append-only. A branch is one ``SESSION_BRANCH`` event: the transcript keeps
its first ``at`` messages, gains the messages of an abandoned branch the point brings back
(``restored``), and a note of what the dropped turns did in the world; the dropped turns stay
in the journal (``transcript()`` leaves them out, the console shows them as a branch). The
derived transcript the store keeps is rewritten in the same transaction
(``BranchStore.rewind``), so a crash leaves the old state or the new one.

**Effects are not forgotten.** A dropped turn may have run tools whose effects happened: an
``at_most_once`` call (an email sent, a card charged) or an ``idempotent`` one. The agent's
``branch_effects`` decides: ``"note"`` (the default) adds a system note naming each such call
(tool, arguments, result) to the new branch's transcript, so the model knows; ``"refuse"``
fails the operation with ``BranchRefused`` naming the calls, changing nothing; ``"allow"``
adds no note. The event records the calls in every case (``effects``), and a later call that
repeats a dropped ``at_most_once`` call with the same arguments waits for approval unless the
policy is ``"allow"`` (``repeats_of``).

:func:`plan_branch` is pure: it reads the transcript (and, for an ``AtEvent`` point, the
journal), the ledger and the policy, and returns the :class:`BranchPlan` the turn commits, or
raises ``BranchError`` before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from loom.engine.journal import follow
from loom.engine.run_inputs import AtEvent, AtTurn, BranchInput, Edit, Point, Rewind
from loom.errors import BranchError, BranchRefused
from loom.events import SessionBranch

if TYPE_CHECKING:
    from loom.events import AgentEvent
    from loom.messages import Message
    from loom.store.base import LedgerEntry

__all__ = [
    "BranchPlan",
    "BranchPolicy",
    "Branching",
    "branches_of",
    "fork_plan",
    "journal_prefix",
    "needs_journal",
    "note_of",
    "plan_branch",
    "point_of",
    "repeat_reason",
    "repeats_of",
    "turn_starts",
]

BranchPolicy = Literal["refuse", "note", "allow"]
"""What a branch does about the effects of the turns it drops (see the module docstring)."""

SHOWN = 200  # characters of a call's arguments or result a note shows


@dataclass(frozen=True, slots=True)
class BranchPlan:
    """What a branch does to a session's transcript (see the module docstring)."""

    at: int
    restored: list[Message]
    abandoned: list[Message]
    effects: list[dict[str, Any]]
    reason: str
    point: dict[str, Any]
    note: str = ""
    changes: bool = field(default=True)

    def event_payload(self) -> dict[str, Any]:
        """The ``SESSION_BRANCH`` event's payload."""
        return {
            "at": self.at,
            "restored": [m.model_dump(mode="json") for m in self.restored],
            "abandoned": len(self.abandoned),
            "reason": self.reason,
            "point": self.point,
            "effects": self.effects,
            "note": self.note,
        }


def needs_journal(inp: BranchInput) -> bool:
    """Whether planning ``inp`` reads the session's journal (an event point does)."""
    return isinstance(inp, Rewind) and isinstance(inp.to, AtEvent)


def turn_starts(history: Sequence[Message]) -> list[int]:
    """The positions of the user messages that start each turn."""
    return [i for i, m in enumerate(history) if m.role == "user"]


def point_of(inp: BranchInput) -> dict[str, Any]:
    """What was asked, as the event records it."""
    if isinstance(inp, Rewind):
        to = inp.to
        if isinstance(to, AtEvent):
            return {"run_id": to.run_id, "sequence": to.sequence}
        return {"turns": to.turns if isinstance(to, AtTurn) else int(to)}
    if isinstance(inp, Edit):
        return {"turn": inp.turn}
    return {}


def _kept_turns(
    history: Sequence[Message], turns: int, what: str, *, upto_end: bool = False
) -> list[Message]:
    """The transcript before turn ``turns`` (``upto_end``: the number of turns itself is a
    point too, the session's end)."""
    starts = turn_starts(history)
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 0:
        raise BranchError(f"{what} must be a turn number >= 0, got {turns!r}")
    if upto_end and turns == len(starts):
        return list(history)
    if turns >= len(starts):
        raise BranchError(
            f"{what} {turns} does not exist: the session has {len(starts)} turn"
            f"{'' if len(starts) == 1 else 's'} (numbered from 0)"
        )
    return list(history[: starts[turns]])


def _state_at(events: Sequence[AgentEvent], point: AtEvent) -> list[Message]:
    """The transcript as it was just after the event ``point`` names (branches before it
    applied, as ``transcript()`` does)."""
    out: list[Message] = []
    for event in events:
        follow(out, event)
        if event.run_id == point.run_id and event.sequence == point.sequence:
            return out
    raise BranchError(
        f"no stored event {point.sequence} of run {point.run_id!r} in this session: a point is "
        "an event id a stream of this session gave (only events that were stored have one)"
    )


def _check_whole_steps(target: Sequence[Message], what: str) -> None:
    """``BranchError`` when ``target`` ends inside a step: a tool call without its result."""
    answered = {m.tool_call_id for m in target if m.role == "tool"}
    for m in target:
        for c in m.tool_calls:
            if c.id not in answered:
                raise BranchError(
                    f"{what} lies inside a step: tool call {c.name} ({c.id}) has no result "
                    "there; pick the point after its result, or before the answer that made it"
                )


def _target(
    inp: BranchInput, history: Sequence[Message], events: Sequence[AgentEvent] | None
) -> tuple[list[Message], str]:
    if isinstance(inp, Rewind):
        to = inp.to
        if isinstance(to, AtEvent):
            if events is None:
                raise BranchError("an event point needs the session's journal")  # the caller's
            target = _state_at(events, to)
            _check_whole_steps(target, f"event {to.sequence} of run {to.run_id!r}")
            return target, "rewind"
        turns = to.turns if isinstance(to, AtTurn) else to
        return _kept_turns(history, turns, "turn", upto_end=True), "rewind"
    if isinstance(inp, Edit):
        if not isinstance(inp.text, str):
            raise BranchError(f"an edit's text must be a string, got {type(inp.text).__name__}")
        return _kept_turns(history, inp.turn, "turn"), "edit"
    starts = turn_starts(history)
    if not starts:
        raise BranchError("the session has no user message to answer again")
    return list(history[: starts[-1] + 1]), "regenerate"


def _effects(
    abandoned: Sequence[Message], restored: Sequence[Message], ledger: Sequence[LedgerEntry]
) -> list[dict[str, Any]]:
    """The dropped calls that had effects: each ended ``idempotent`` or ``at_most_once`` call
    whose result leaves the transcript (and does not come back with ``restored``)."""
    kept = {m.tool_call_id for m in restored if m.role == "tool"}
    dropped = [m.tool_call_id for m in abandoned if m.role == "tool" and m.tool_call_id]
    wanted = [c for c in dropped if c not in kept]
    last: dict[str, LedgerEntry] = {}
    for entry in ledger:  # oldest first: the last entry of a call is its end
        last[entry.tool_call_id] = entry
    out: list[dict[str, Any]] = []
    for call_id in wanted:
        found = last.get(call_id)
        if found is None or found.effect == "pure" or found.status == "started":
            continue
        entry = found
        result = entry.result.to_content() if entry.result is not None else ""
        out.append(
            {
                "tool": entry.name,
                "arguments": entry.arguments,
                "result": result,
                "effect": entry.effect,
                "status": entry.status,
                "tool_call_id": call_id,
                "at": entry.timestamp.isoformat(timespec="seconds"),
            }
        )
    return out


def _short(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def note_of(effects: Sequence[dict[str, Any]], reason: str) -> str:
    """The system note that tells the new branch what the dropped turns did in the world."""
    if reason == "fork":
        head = (
            "Note: this conversation continues from an earlier point of another one. There, "
            "these tool calls ran afterwards, and their effects remain in the world:"
        )
    else:
        head = (
            f"Note: turns of this conversation were undone ({reason}). These tool calls had "
            "already run in them, and their effects remain in the world (they were not undone):"
        )
    lines = [head]
    for e in effects:
        args = _short(json.dumps(e["arguments"], ensure_ascii=False, sort_keys=True))
        lines.append(f"- {e['tool']}({args}) -> {_short(str(e['result']))} [{e['effect']}]")
    return "\n".join(lines)


def plan_branch(
    inp: BranchInput,
    history: Sequence[Message],
    ledger: Sequence[LedgerEntry],
    policy: BranchPolicy,
    events: Sequence[AgentEvent] | None = None,
) -> BranchPlan:
    """The branch ``inp`` asks of a session whose transcript is ``history`` (see the module
    docstring). ``events`` (the session's journal) is needed for an ``AtEvent`` point only.
    ``BranchError`` for a point that does not exist or lies inside a step; ``BranchRefused``
    under ``policy="refuse"`` when dropped turns had effects."""
    target, reason = _target(inp, history, events)
    at = 0
    for mine, theirs in zip(history, target, strict=False):
        if mine != theirs:
            break
        at += 1
    restored = list(target[at:])
    abandoned = list(history[at:])
    # an earlier branch's note leaves with the turns it followed, but what it tells stays
    # true: it is carried into the new branch, after the restored messages
    restored.extend(m for m in abandoned if m.metadata.get("branch_note") and m not in restored)
    changes = bool(restored or abandoned)
    if isinstance(inp, Rewind) and not changes:
        raise BranchError("the session is already at that point: nothing to rewind")
    effects = _effects(abandoned, restored, ledger)
    if effects and policy == "refuse":
        names = ", ".join(f"{e['tool']} ({e['tool_call_id']})" for e in effects)
        raise BranchRefused(
            f"this {reason} would drop turns whose tool calls had effects in the world: "
            f"{names}; the agent's branch_effects is 'refuse'. Set it to 'note' (the new "
            "branch is told of them) or 'allow', or pick a later point",
            calls=[{"tool": e["tool"], "arguments": e["arguments"]} for e in effects],
        )
    note = note_of(effects, reason) if effects and policy == "note" else ""
    return BranchPlan(
        at=at,
        restored=restored,
        abandoned=abandoned,
        effects=effects,
        reason=reason,
        point=point_of(inp),
        note=note,
        changes=changes,
    )


def journal_prefix(events: Sequence[AgentEvent], kept: Sequence[Message]) -> int:
    """How many of ``events`` a fork shares so that their transcript is ``kept``: the last
    journal position where the derived transcript is exactly ``kept`` (the run that made its
    last message included, to its end)."""
    out: list[Message] = []
    best = 0 if not kept else -1
    for i, event in enumerate(events):
        follow(out, event)
        if len(out) == len(kept) and out == list(kept):
            best = i + 1
    if best < 0:
        raise BranchError("the point is not in this session's journal")  # a store out of step
    return best


def fork_plan(
    session_id: str,
    to: Point | None,
    history: Sequence[Message],
    events: Sequence[AgentEvent],
    ledger: Sequence[LedgerEntry],
    policy: BranchPolicy,
) -> tuple[BranchPlan, int]:
    """A fork of ``session_id`` at ``to`` (``None``: its end): the plan (what the new session
    shares, brings back and is told) and how many journal events it shares."""
    if to is None:
        plan = BranchPlan(
            at=len(history), restored=[], abandoned=[], effects=[], reason="fork", point={}
        )
    else:
        try:
            plan = plan_branch(Rewind(to), history, ledger, policy, events)
        except BranchRefused:
            raise
        except BranchError as exc:
            if "already at that point" not in str(exc):
                raise
            plan = BranchPlan(
                at=len(history), restored=[], abandoned=[], effects=[], reason="fork", point={}
            )
    point = {"session_id": session_id, **plan.point}
    shared = journal_prefix(events, history[: plan.at])
    fork = BranchPlan(
        at=plan.at,
        restored=plan.restored,
        abandoned=plan.abandoned,
        effects=plan.effects,
        reason="fork",
        point=point,
        note=note_of(plan.effects, "fork") if plan.note else "",
    )
    return fork, shared


def repeats_of(
    events: Sequence[AgentEvent], name: str, arguments: dict[str, Any]
) -> dict[str, Any] | None:
    """The dropped ``at_most_once`` call (from the session's ``SESSION_BRANCH`` events) that a
    new call of ``name`` with ``arguments`` repeats, or None."""
    for event in reversed(events):
        if type(event) is not SessionBranch:
            continue
        for e in event.effects:
            same = e.get("tool") == name and e.get("arguments") == arguments
            if same and e.get("effect") == "at_most_once":
                return e
    return None


def repeat_reason(events: Sequence[AgentEvent], repeated: dict[str, Any]) -> str:
    """Why a call that repeats ``repeated`` (what ``repeats_of`` found in ``events``) waits for
    approval: which call of which undone turn, when it ran and when its turn was undone."""
    undone = next(
        (e for e in reversed(events) if type(e) is SessionBranch and repeated in e.effects), None
    )
    args = _short(json.dumps(repeated.get("arguments"), ensure_ascii=False, sort_keys=True))
    ran = f" at {repeated['at']}" if repeated.get("at") else ""
    how = ""
    if undone is not None:
        what = "a fork" if undone.reason == "fork" else f"a {undone.reason or 'branch'}"
        when = datetime.fromtimestamp(undone.timestamp, UTC).isoformat(timespec="seconds")
        how = f", undone by {what} at {when}"
    return (
        f"{repeated.get('tool')}({args}) repeats an at_most_once call of an undone turn "
        f"(it ran{ran}{how}, result: {_short(str(repeated.get('result', '')))}); its effect "
        "was not undone: approve to run it again"
    )


@dataclass(frozen=True, slots=True)
class Branching:
    """One ``SESSION_BRANCH`` of a session's journal and the messages it took out of the
    transcript (what the console and ``loom sessions branches`` show as an abandoned
    branch)."""

    event: SessionBranch
    abandoned: list[Message]


def branches_of(events: Sequence[AgentEvent]) -> list[Branching]:
    """The session's branches in journal order, each with the messages it abandoned (derived
    as ``transcript()`` derives the transcript; what the branch restored is not abandoned)."""
    out: list[Message] = []
    found: list[Branching] = []
    for event in events:
        if type(event) is SessionBranch:
            restored = event.restored_messages()  # a carried note is not abandoned
            found.append(Branching(event, [m for m in out[event.at :] if m not in restored]))
            del out[event.at :]
            out.extend(restored)
        m = event.message()
        if m is not None:
            out.append(m)
    return found
