"""The typed event stream every run produces.

Names follow seed 002. Seed 004 names the events its loop must emit; they map one to one:

| seed 004       | Loom EventType                                 |
| -------------- | ---------------------------------------------- |
| ``loop:start``   | ``AGENT_START``                              |
| ``loop:context`` | ``CONTEXT_ASSEMBLY_COMPLETE`` (token_estimate) |
| ``loop:execute`` | ``LLM_START`` (tool_count)                   |
| ``tool:start``   | ``TOOL_EXECUTION_START``                     |
| ``tool:end``     | ``TOOL_RESULT`` or ``TOOL_ERROR``            |
| ``stream:delta`` | ``LLM_DELTA``                                |
| ``loop:persist`` | ``PERSIST_START``                            |
| ``loop:end``     | ``AGENT_FINISH``                             |
| ``loop:error``   | ``ERROR``                                    |

Seed 003's state machine shows up as ``STATE_CHANGE`` events whose ``data`` holds
``{"from": ..., "to": ...}`` with :class:`loom.AgentState` values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["AgentEvent", "EventType"]


class EventType(StrEnum):
    AGENT_START = "agent_start"
    ITERATION_START = "iteration_start"
    STATE_CHANGE = "state_change"
    CONTEXT_ASSEMBLY_START = "context_assembly_start"
    CONTEXT_COMPONENT_INCLUDED = "context_component_included"
    CONTEXT_COMPONENT_TRUNCATED = "context_component_truncated"
    CONTEXT_COMPONENT_EXCLUDED = "context_component_excluded"
    CONTEXT_ASSEMBLY_COMPLETE = "context_assembly_complete"
    COMPRESSION_START = "compression_start"
    COMPRESSION_PROGRESS = "compression_progress"
    COMPRESSION_FALLBACK = "compression_fallback"
    COMPRESSION_COMPLETE = "compression_complete"
    MEMORY_FLUSH = "memory_flush"
    PATTERNS_MATCHED = "patterns_matched"
    LLM_START = "llm_start"
    LLM_DELTA = "llm_delta"
    LLM_TOOL_CALLS = "llm_tool_calls"
    LLM_COMPLETE = "llm_complete"
    LLM_RETRY = "llm_retry"
    TOOL_EXECUTION_START = "tool_execution_start"
    TOOL_RESULT = "tool_result"
    TOOL_ERROR = "tool_error"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DECISION = "approval_decision"
    RECURSION = "recursion"
    JUDGE_START = "judge_start"
    JUDGE_RESULT = "judge_result"
    JUDGE_RETRY = "judge_retry"
    PERSIST_START = "persist_start"
    AGENT_FINISH = "agent_finish"
    ERROR = "error"


@dataclass(slots=True)
class AgentEvent:
    """One thing that happened in a run.

    ``sequence`` is monotonic within a run (starting at 0); ``timestamp`` is wall-clock seconds
    since the epoch. ``data`` holds the event's payload; its keys are documented per type in the
    README's event table.
    """

    type: EventType
    run_id: str
    session_id: str
    iteration: int
    sequence: int
    data: dict[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    @property
    def text(self) -> str:
        """The text delta of an ``LLM_DELTA`` event, empty for every other type."""
        return str(self.data.get("text", "")) if self.type is EventType.LLM_DELTA else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "iteration": self.iteration,
            "sequence": self.sequence,
            "timestamp": self.timestamp,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentEvent:
        """The event ``to_dict`` wrote (an unknown type name is kept as a plain string)."""
        try:
            kind: Any = EventType(d["type"])
        except ValueError:  # written by a newer Loom: keep the name rather than drop the event
            kind = d["type"]
        return cls(kind, d["run_id"], d["session_id"], d.get("iteration", 0), d["sequence"],
                   d.get("data") or {}, d.get("timestamp", 0.0))  # fmt: skip
