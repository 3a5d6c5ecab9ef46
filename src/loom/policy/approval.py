"""Human-in-the-loop approval (seed 002 ``HITLHook``): pause, decide, resume.

A hook (normally the ``PermissionManager``) answers ``RequireApproval`` for a call. The turn
then commits an ``APPROVAL_REQUIRED`` event carrying the pending call and:

- with an ``approval_handler`` (sync or async, receives a ``PendingApproval``) awaits its
  ``Approve()`` / ``Reject(reason)`` / ``Edit(arguments)`` and goes on;
- without one, leaves the call unanswered and stops with ``stop_reason="awaiting_approval"``
  and ``RunResult.pending_approvals``. ``agent.resume(session_id, decisions)``, in this process
  or another one using the same store, applies the decisions: approved calls run, rejected
  ones get a ``denied`` result whose text the model reads, and the turn continues. Nothing that
  already ran runs again.

How a pending call is recognised in the store (for recovery code and other processes): its id
is in an assistant message's tool calls, no tool message answers it, no ledger entry exists
for it, and an ``APPROVAL_REQUIRED`` event names it with no ``APPROVAL_DECISION`` after it.
``pending_approvals()`` implements exactly that. A new user message on a session with pending
calls closes them as ``denied`` ("not approved") before the new turn starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import InputError
from loom.events import AgentEvent, EventType
from loom.messages import Message, ToolCall, ToolResult
from loom.policy.permissions import Action, PermissionRule, _subject_of, _subjects
from loom.store.base import RunRecord, Store
from loom.tools.executor import error_result

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.loop import Turn

__all__ = [
    "ApprovalGate",
    "ApprovalHandler",
    "Approve",
    "Decision",
    "Edit",
    "PendingApproval",
    "Reject",
    "coerce_decision",
    "pending_approvals",
]

E = EventType


@dataclass(frozen=True, slots=True)
class Approve:
    """Run the call. ``remember=True`` allows this exact call for the rest of the session,
    ``remember="tool"`` allows every call of this tool."""

    remember: bool | Literal["tool"] = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Do not run the call; the model reads ``reason``. ``remember=True`` denies the same call
    for the rest of the session, ``"tool"`` the whole tool."""

    reason: str = "the user rejected this call"
    remember: bool | Literal["tool"] = False


@dataclass(frozen=True, slots=True)
class Edit:
    """Run the call with these arguments instead (the human's edit counts as approval)."""

    arguments: dict[str, Any]


Decision = Approve | Reject | Edit


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a human: what it is and why it needs approval."""

    session_id: str
    run_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingApproval:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @property
    def call(self) -> ToolCall:
        return ToolCall(id=self.tool_call_id, name=self.tool_name, arguments=dict(self.arguments))


ApprovalHandler = Callable[[PendingApproval], "Decision | bool | str | Awaitable[Any]"]


def coerce_decision(value: Any) -> Decision:
    """A ``Decision`` from what a handler or an API caller returned.

    Accepts a ``Decision``, ``True``/``False``, ``"approve"``/``"reject"`` (also ``"yes"``,
    ``"no"``, ``"always"``), or a mapping ``{"decision": "approve" | "reject" | "edit",
    "reason": ..., "arguments": ..., "remember": ...}`` such as JSON from a web UI.
    """
    if isinstance(value, Approve | Reject | Edit):
        return value
    if value is True:
        return Approve()
    if value is False:
        return Reject()
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("approve", "approved", "yes", "y", "allow"):
            return Approve()
        if word in ("always",):
            return Approve(remember=True)
        if word in ("reject", "rejected", "no", "n", "deny"):
            return Reject()
    if isinstance(value, Mapping):
        kind = str(value.get("decision", "")).lower()
        remember = value.get("remember", False)
        if kind in ("approve", "approved", "allow"):
            return Approve(remember=remember)
        if kind in ("reject", "rejected", "deny"):
            return Reject(str(value.get("reason") or "the user rejected this call"), remember)
        if kind == "edit" and isinstance(value.get("arguments"), Mapping):
            return Edit(dict(value["arguments"]))
    raise InputError(
        f"cannot use {value!r} as an approval decision: return Approve(), Reject(reason) or "
        "Edit(arguments) (or True/False, 'approve'/'reject')"
    )


def _unanswered(history: Sequence[Message]) -> dict[str, ToolCall]:
    answered = {m.tool_call_id for m in history if m.role == "tool"}
    return {
        c.id: c
        for m in history
        if m.role == "assistant"
        for c in m.tool_calls
        if c.id not in answered
    }


async def pending_approvals(
    store: Store, session_id: str, history: Sequence[Message] | None = None
) -> list[PendingApproval]:
    """The calls of a session that wait for a decision, oldest first."""
    if history is None:
        history = await store.load_messages(session_id)
    open_calls = _unanswered(history)
    if not open_calls:
        return []
    required: dict[str, PendingApproval] = {}
    for ev in await store.load_events(session_id):
        cid = str(ev.data.get("tool_call_id", ""))
        if ev.type is E.APPROVAL_REQUIRED and cid in open_calls:
            required[cid] = PendingApproval.from_dict(ev.data)
        elif ev.type is E.APPROVAL_DECISION:
            required.pop(cid, None)
    return list(required.values())


def _match(decisions: Any, pending: list[PendingApproval], session_id: str) -> dict[str, Decision]:
    ids = [p.tool_call_id for p in pending]
    if isinstance(decisions, Mapping) and not (
        "decision" in decisions and len(ids) == 1 and ids[0] not in decisions
    ):
        unknown = [k for k in decisions if k not in ids]
        if unknown:
            raise InputError(
                f"session {session_id!r} has no pending call {unknown[0]!r}; "
                f"pending calls: {', '.join(ids)}"
            )
        missing = [i for i in ids if i not in decisions]
        if missing:
            raise InputError(
                f"no decision for pending call {missing[0]!r} of session "
                f"{session_id!r}; decide every pending call: {', '.join(ids)}"
            )
        return {k: coerce_decision(v) for k, v in decisions.items()}
    one = coerce_decision(decisions)  # a single decision applies to every pending call
    return dict.fromkeys(ids, one)


def _remember_rules(p: PendingApproval, decision: Decision, agent: Agent) -> list[PermissionRule]:
    remember = getattr(decision, "remember", False)
    if not remember:
        return []
    action: Action = "deny" if isinstance(decision, Reject) else "allow"
    if remember == "tool":
        return [PermissionRule(p.tool_name, None, action, "session")]
    key, kind = _subject_of(agent.tools.get(p.tool_name), p.tool_name)
    if key is None:  # the same compact JSON the rules match for such tools
        return [
            PermissionRule(p.tool_name, _subjects(p.call, None, kind, None)[0], action, "session")
        ]
    value = str(p.arguments.get(key, ""))
    if kind == "command":
        from loom.policy.shell import analyze

        found = analyze(value)
        if found.error is None and found.commands:
            return [
                PermissionRule(p.tool_name, c.source if c.risks else c.text, action, "session")
                for c in found.commands
            ]
    return [PermissionRule(p.tool_name, value, action, "session")]


class ApprovalGate:
    """The turn's side of approvals: asks the handler or parks the call; resumes later."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def _decision_event(
        self, turn: Turn, p: PendingApproval, decision: Decision | None, how: str
    ) -> AgentEvent:
        data: dict[str, Any] = {
            "tool_call_id": p.tool_call_id,
            "tool_name": p.tool_name,
            "decided_by": how,
        }
        if isinstance(decision, Approve):
            data["decision"] = "approve"
        elif isinstance(decision, Reject):
            data.update(decision="reject", reason=decision.reason)
        elif isinstance(decision, Edit):
            data.update(decision="edit", arguments=decision.arguments)
        else:
            data["decision"] = "expired"
        rules = _remember_rules(p, decision, self.agent) if decision is not None else []
        for rule in rules:
            self.agent.permissions.remember(turn.session_id, rule)
        if rules:
            data["remember_rules"] = [
                {"tool": r.tool, "pattern": r.pattern, "action": r.action} for r in rules
            ]
        return turn._event(E.APPROVAL_DECISION, data)

    async def request(
        self, turn: Turn, call: ToolCall, reason: str
    ) -> tuple[ToolCall | None, ToolResult | None]:
        """``(call to run, None)``, ``(call, denied result)``, or ``(None, None)`` if parked."""
        if turn.decided.pop(call.id, None) is not None:
            return call, None  # decided at resume, before the hooks ran again
        p = PendingApproval(
            turn.session_id, turn.run_id, call.id, call.name, dict(call.arguments), reason
        )
        await turn._commit([turn._event(E.APPROVAL_REQUIRED, p.to_dict())])
        handler = self.agent.approval_handler
        if handler is None:
            turn.pending_approvals.append(p.to_dict())
            turn._unanswered.pop(call.id, None)  # not interrupted: parked for a decision
            return None, None
        answer = handler(p)
        if inspect.isawaitable(answer):
            answer = await answer
        decision = coerce_decision(answer)
        await turn._commit([self._decision_event(turn, p, decision, "handler")])
        return self._apply(call, decision)

    @staticmethod
    def _apply(call: ToolCall, decision: Decision) -> tuple[ToolCall, ToolResult | None]:
        if isinstance(decision, Reject):
            return call, error_result(call, "denied", f"rejected by the user: {decision.reason}")
        if isinstance(decision, Edit):
            return call.model_copy(
                update={"arguments": decision.arguments, "raw_arguments": None}
            ), None
        return call, None

    async def settle(self, turn: Turn) -> bool:
        """At intake: resume a paused turn (True), or expire stale pending calls (False)."""
        if turn.resume is None and not _unanswered(turn.history):
            return False
        store, sid = self.agent.store, turn.session_id
        pending = await pending_approvals(store, sid, turn.history)
        if turn.resume is None:
            await self._expire(turn, pending)
            return False
        if not pending:
            raise InputError(f"session {sid!r} has no tool calls waiting for approval")
        decisions = _match(turn.resume, pending, sid)
        last_user = next((m.content for m in reversed(turn.history) if m.role == "user"), "")
        turn.message = last_user
        start = turn._event(
            E.AGENT_START, {"message": last_user, "agent": self.agent.name, "resume": True}
        )
        await turn._commit([start], run=RunRecord(turn.run_id, sid, "running"))
        await self.agent._prepare_tools(turn)  # MCP tools must exist before approved calls run
        to_run: list[ToolCall] = []
        for p in pending:
            d = decisions[p.tool_call_id]
            call = p.call
            turn._unanswered[call.id] = call
            await turn._commit([self._decision_event(turn, p, d, "resume")])
            call, refusal = self._apply(call, d)
            if refusal is not None:
                await turn._record_result(call, refusal, started=False)
            else:
                turn.decided[call.id] = d
                to_run.append(call)
        if to_run:
            await turn._run_tools(to_run)
        return True

    async def _expire(self, turn: Turn, pending: list[PendingApproval]) -> None:
        for p in pending:
            result = error_result(
                p.call,
                "denied",
                "not approved: the user sent a new message instead of deciding on this call",
            )
            msg = Message.tool(result)
            await self.agent.store.append(
                turn.session_id,
                messages=[msg],
                events=[self._decision_event(turn, p, None, "new_message")],
            )
            turn.history.append(msg)
