"""What a crew run returns: the output, why it stopped, and each member run with its usage."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loom.messages import Message, StopReason, Usage

__all__ = ["CrewResult", "MemberResult"]


class MemberResult(BaseModel):
    """One member run: where it ran (``path``, child session and run), how it ended, what it
    cost. ``reused`` means an earlier, interrupted run of the crew had finished it."""

    model_config = ConfigDict(extra="forbid")

    path: str
    member: str
    key: str
    session_id: str
    run_id: str
    stop_reason: str
    output: str = ""
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None
    reused: bool = False
    pending_approvals: list[dict[str, Any]] = Field(default_factory=list)
    remote: dict[str, str] = Field(default_factory=dict)
    """A remote (A2A) member's run: its ``url``, the remote ``task_id`` and ``context_id``, and
    the task's last ``state``; usage is unknown (zero)."""
    messages: list[Message] = Field(default_factory=list, exclude=True)

    @property
    def ok(self) -> bool:
        return self.stop_reason == "completed"


class CrewResult(BaseModel):
    """The outcome of one crew run (``Crew.run``), shaped like ``RunResult``.

    ``usage`` is the total of ``members``' usage. With ``stop_reason="budget"``, ``budget``
    names the budget that stopped the run (``tokens``, ``cost_usd``, ``wall_seconds``,
    ``depth``, ``fan_out``, ``spawns``).
    """

    model_config = ConfigDict(extra="forbid")

    output: str
    stop_reason: StopReason
    session_id: str
    run_id: str
    usage: Usage
    members: list[MemberResult]
    error: str | None = None
    budget: str | None = None
    resumed_from: str | None = None
    pending_approvals: list[dict[str, Any]] = Field(default_factory=list)
    """With ``stop_reason="awaiting_approval"``: each parked call, with its ``member_path``
    and child ``session_id``; decide them with ``Crew.resume``."""
    warnings: list[str] = Field(default_factory=list)

    def usage_by_member(self) -> dict[str, Usage]:
        """Usage summed per member path."""
        out: dict[str, Usage] = {}
        for m in self.members:
            out[m.path] = out.get(m.path, Usage()) + m.usage
        return out
