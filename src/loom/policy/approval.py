"""Human-in-the-loop approval (seed 002 ``HITLHook``): pause, decide, resume.

A hook (normally the ``PermissionManager``) answers ``RequireApproval`` for a call. The loop
(``loom.engine.calls``) then commits an ``APPROVAL_REQUIRED`` event carrying the pending call and:

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

This module holds the data and the decisions (pure functions); the loop commits what they
decide through the journal, so approvals write nothing themselves.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import ApprovalHandlerError, InputError
from loom.events import ApprovalDecisionEvent, ApprovalRequired, EventType
from loom.messages import Message, ToolCall, ToolResult
from loom.policy.permissions import Action, PermissionRule, subject_of, subjects_of
from loom.store.base import Store
from loom.tools.executor import error_result

if TYPE_CHECKING:
    from loom.tools.base import Tool

__all__ = [
    "ApprovalDecision",
    "ApprovalHandler",
    "Approve",
    "Edit",
    "PendingApproval",
    "Reject",
    "apply_decision",
    "ask_handler",
    "coerce_decision",
    "decision_payload",
    "match_decisions",
    "pending_approvals",
    "unanswered_calls",
]


@dataclass(frozen=True, slots=True)
class Approve:
    """Run the call. ``remember=True`` allows this exact call for the rest of the session,
    ``remember="tool"`` allows every call of this tool. ``by`` names who decided (the
    server stamps the API key's name), for the record."""

    remember: bool | Literal["tool"] = False
    by: str = ""


@dataclass(frozen=True, slots=True)
class Reject:
    """Do not run the call; the model reads ``reason``. ``remember=True`` denies the same call
    for the rest of the session, ``"tool"`` the whole tool."""

    reason: str = "the user rejected this call"
    remember: bool | Literal["tool"] = False
    by: str = ""


@dataclass(frozen=True, slots=True)
class Edit:
    """Run the call with these arguments instead (the human's edit counts as approval)."""

    arguments: dict[str, Any]
    by: str = ""


ApprovalDecision = Approve | Reject | Edit
"""What a human (or an approval handler) decided about one pending call."""


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


ApprovalHandler = Callable[[PendingApproval], "ApprovalDecision | bool | str | Awaitable[Any]"]


def coerce_decision(value: Any) -> ApprovalDecision:
    """An ``ApprovalDecision`` from what a handler or an API caller returned.

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
        by = str(value.get("by") or "")
        if kind in ("approve", "approved", "allow"):
            return Approve(remember=remember, by=by)
        if kind in ("reject", "rejected", "deny"):
            reason = str(value.get("reason") or "the user rejected this call")
            return Reject(reason, remember, by=by)
        if kind == "edit" and isinstance(value.get("arguments"), Mapping):
            return Edit(dict(value["arguments"]), by=by)
    raise InputError(
        f"cannot use {value!r} as an approval decision: return Approve(), Reject(reason) or "
        "Edit(arguments) (or True/False, 'approve'/'reject')"
    )


def unanswered_calls(history: Sequence[Message]) -> dict[str, ToolCall]:
    """Tool calls of the current exchange (after the last user message) with no result.

    Only the newest exchange can hold any: every turn answers or parks its calls, and a new
    user message closes what was parked, so this reads the tail, not the whole session."""
    start = len(history)
    while start > 0 and not (
        history[start - 1].role == "user"
        and not history[start - 1].metadata.get("judge_correction")
    ):
        start -= 1
    tail = history[start:]
    answered = {m.tool_call_id for m in tail if m.role == "tool"}
    return {
        c.id: c for m in tail if m.role == "assistant" for c in m.tool_calls if c.id not in answered
    }


async def pending_approvals(
    store: Store, session_id: str, history: Sequence[Message] | None = None
) -> list[PendingApproval]:
    """The calls of a session that wait for a decision, oldest first (read from the newest
    exchange only: ``loom.store.transcript``)."""
    from loom.store.transcript import newest_exchange, since_last_request

    if history is None:
        history = await newest_exchange(store, session_id)
    open_calls = unanswered_calls(history)
    if not open_calls:
        return []
    required: dict[str, PendingApproval] = {}
    kinds = [EventType.APPROVAL_REQUIRED, EventType.APPROVAL_DECISION]
    for ev in await since_last_request(store, session_id, kinds):
        if isinstance(ev, ApprovalRequired) and ev.tool_call_id in open_calls:
            required[ev.tool_call_id] = PendingApproval(
                ev.session_id,
                ev.run_id,
                ev.tool_call_id,
                ev.tool_name,
                dict(ev.arguments),
                ev.reason,
            )
        elif isinstance(ev, ApprovalDecisionEvent):
            required.pop(ev.tool_call_id, None)
    return list(required.values())


def match_decisions(
    decisions: Any, pending: list[PendingApproval], session_id: str
) -> dict[str, ApprovalDecision]:
    """Each pending call's decision; ``InputError`` for unknown or missing calls."""
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


def remember_rules(
    p: PendingApproval, decision: ApprovalDecision, tool: Tool | None
) -> list[PermissionRule]:
    """The session rules an "always" / "never" decision adds (none for a one-off)."""
    remember = getattr(decision, "remember", False)
    if not remember:
        return []
    action: Action = "deny" if isinstance(decision, Reject) else "allow"
    if remember == "tool":
        return [PermissionRule(p.tool_name, None, action, "session")]
    key, kind = subject_of(tool, p.tool_name)
    if key is None:  # the same compact JSON the rules match for such tools
        return [
            PermissionRule(p.tool_name, subjects_of(p.call, None, kind, None)[0], action, "session")
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


def decision_payload(
    p: PendingApproval, decision: ApprovalDecision | None, how: str, rules: list[PermissionRule]
) -> dict[str, Any]:
    """The ``APPROVAL_DECISION`` event's payload (``decision=None`` means expired)."""
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
    if decision is not None and decision.by:
        data["by"] = decision.by
    if rules:
        data["remember_rules"] = [
            {"tool": r.tool, "pattern": r.pattern, "action": r.action} for r in rules
        ]
    return data


def apply_decision(
    call: ToolCall, decision: ApprovalDecision
) -> tuple[ToolCall, ToolResult | None]:
    """The call to run (edited arguments applied) and, for a rejection, its ``denied`` result."""
    if isinstance(decision, Reject):
        return call, error_result(call, "denied", f"rejected by the user: {decision.reason}")
    if isinstance(decision, Edit):
        return call.model_copy(
            update={"arguments": decision.arguments, "raw_arguments": None}
        ), None
    return call, None


def expired_result(call: ToolCall) -> ToolResult:
    """The result of a parked call the user answered with a new message instead."""
    return error_result(
        call, "denied", "not approved: the user sent a new message instead of deciding on this call"
    )


async def ask_handler(handler: Any, pending: PendingApproval) -> ApprovalDecision:
    """Ask an approval handler; its failure is an ``ApprovalHandlerError`` naming it."""
    try:
        answer = handler(pending)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:
        name = getattr(handler, "__qualname__", type(handler).__name__)
        raise ApprovalHandlerError(
            f"the approval handler {name} raised {type(exc).__name__}: {exc} (deciding on "
            f"{pending.tool_name} call {pending.tool_call_id}); the call did not run. Fix the "
            "handler, or leave approval_handler unset to pause and decide with resume()."
        ) from exc
    return coerce_decision(answer)
