"""A session's events as the console's tree: runs → model calls → tool calls, and for a crew
session runs → member runs (from the crew log: ``CREW_MEMBER_START`` / ``CREW_MEMBER_FINISH``).

:class:`Timeline` takes events one at a time (``add``) and answers what changed, so the page
(every stored event at once) and the live stream (one event per SSE message) build the same
nodes with the same code and render them with the same templates.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    ApprovalDecisionEvent,
    ApprovalRequired,
    CrewMemberFinish,
    CrewMemberStart,
    ErrorEvent,
    GuardrailEvent,
    LlmComplete,
    LlmStart,
    RunRecovered,
    ToolErrorEvent,
    ToolExecutionStart,
    ToolResultEvent,
    UserMessage,
    Warning,
    parts_of,
)

__all__ = [
    "MEDIA_REF",
    "Change",
    "LlmNode",
    "MemberNode",
    "NoteNode",
    "PartView",
    "RunNode",
    "Timeline",
    "ToolNode",
    "cost_of",
    "media_url",
    "part_views",
]

MEDIA_REF = re.compile(r"sha256:[0-9a-f]{64}")
"""What a stored medium's reference looks like (``loom.content.media_ref``)."""


def media_url(session_id: str, ref: str) -> str:
    """The console's address of medium ``ref`` of session ``session_id`` (as the current key
    names the session)."""
    from loom.server.ownership import unscoped_session_id

    return f"/console/sessions/{quote(unscoped_session_id(session_id), safe='')}/media/{ref}"


@dataclass(frozen=True, slots=True)
class PartView:
    """One part of a message as the console shows it: an ``image`` (inline), ``audio`` (a
    player), a ``file`` (a download link), a ``link`` (a medium the provider fetches from its
    URL, shown as that URL) or ``reasoning`` (folded)."""

    kind: Literal["image", "audio", "file", "link", "reasoning"]
    label: str
    media_type: str = ""
    size: int | None = None
    url: str = ""
    text: str = ""

    @property
    def download(self) -> str:
        """The address that downloads the medium under its name."""
        return f"{self.url}?name={quote(self.label)}"


_SHOWN_AS: dict[str, Literal["image", "audio", "file"]] = {"image": "image", "audio": "audio"}


def part_views(parts: Sequence[Any], session_id: str) -> list[PartView]:
    """``parts`` (a message's or an event's, objects or their stored dicts) as the console
    shows them."""
    from loom.content import Media, Reasoning

    views: list[PartView] = []
    for p in parts_of(list(parts)):
        if isinstance(p, Reasoning):
            label = "reasoning" if p.text else "reasoning (redacted)"
            views.append(PartView("reasoning", label, text=p.text))
        elif isinstance(p, Media):
            label = p.name or f"{p.kind} ({p.media_type or 'unknown type'})"
            if p.ref is not None and MEDIA_REF.fullmatch(p.ref):
                kind = _SHOWN_AS.get(p.kind, "file")
                url = media_url(session_id, p.ref)
                views.append(PartView(kind, label, p.media_type, p.size, url))
            elif p.url is not None and p.url.lower().startswith(("http://", "https://")):
                views.append(PartView("link", label, p.media_type, None, p.url))
            else:  # a URL of another scheme is never made a link (javascript:, data:)
                views.append(PartView("link", label, p.media_type))
    return views


def cost_of(usage: Any) -> float | None:
    """The cost a usage carries (a ``Usage`` or its dict form), or None when it has none:
    cost accounting may not exist in this build or may not know the model's price."""
    if usage is None:
        return None
    value = usage.get("cost") if isinstance(usage, dict) else getattr(usage, "cost", None)
    return float(value) if isinstance(value, int | float) else None


def _tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    if not usage:
        return 0, 0
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)


@dataclass
class ToolNode:
    """One tool call: its input, then its output (or error), and any approval on the way."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    run_id: str
    started: float
    done: bool = False
    success: bool = True
    content: str = ""
    error_code: str | None = None
    duration_ms: float | None = None
    approval: str | None = None  # "required", then the decision
    decided_by: str = ""  # who decided (the API key's name), when the decision says
    decided_at: float | None = None  # when the decision was committed
    reason: str = ""  # a rejection's reason
    parts: list[PartView] = field(default_factory=list)  # media the tool returned

    @property
    def dom_id(self) -> str:
        return f"tool-{self.call_id}"


@dataclass
class NoteNode:
    """Something else worth seeing in a run: the user's message, warnings, errors, guardrails."""

    kind: str
    text: str
    timestamp: float
    sequence: int
    run_id: str
    parts: list[PartView] = field(default_factory=list)  # the user message's media

    @property
    def dom_id(self) -> str:
        return f"note-{self.run_id}-{self.sequence}"


@dataclass
class MemberNode:
    """One member run of a crew run: the member, its path in the crew, its child session."""

    run_id: str
    key: str
    path: str
    member: str
    child_session_id: str
    child_run_id: str
    started: float
    depth: int = 1  # how deep in the crew's tree (1: a member of the crew itself)
    done: bool = False
    stop_reason: str | None = None
    output: str = ""
    error: str | None = None
    reused: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None

    @property
    def dom_id(self) -> str:
        digest = hashlib.sha1(self.key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return f"member-{self.run_id}-{digest}"

    @property
    def status(self) -> str:
        return self.stop_reason or "running"


@dataclass
class LlmNode:
    """One model call (an iteration of the loop) and the tool calls it asked for."""

    run_id: str
    iteration: int
    started: float
    done: bool = False
    duration_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    model: str | None = None
    answer: str = ""
    finish_reason: str | None = None
    tools: list[ToolNode] = field(default_factory=list)
    parts: list[PartView] = field(default_factory=list)  # the answer's reasoning and media

    @property
    def dom_id(self) -> str:
        return f"llm-{self.run_id}-{self.iteration}"


@dataclass
class RunNode:
    """One run (a turn) of the session, from AGENT_START to AGENT_FINISH."""

    run_id: str
    agent: str
    started: float
    resume: bool = False
    items: list[LlmNode | NoteNode | MemberNode] = field(default_factory=list)
    done: bool = False
    stop_reason: str | None = None
    duration_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    error: str | None = None

    @property
    def dom_id(self) -> str:
        return f"run-{self.run_id}"

    @property
    def status(self) -> str:
        return self.stop_reason or "running"


Node = RunNode | LlmNode | ToolNode | NoteNode | MemberNode


@dataclass(frozen=True, slots=True)
class Change:
    """What one event did to the tree: ``new`` (append ``node`` to ``parent``) or ``update``
    (``node`` changed in place)."""

    kind: Literal["new", "update"]
    node: Node
    parent: RunNode | LlmNode | None = None


class Timeline:
    """The tree of one session's runs, built event by event (``session_id``: whose media the
    nodes link to)."""

    def __init__(self, session_id: str = "") -> None:
        self.session_id = session_id
        self.runs: list[RunNode] = []
        self._runs: dict[str, RunNode] = {}
        self._llm: dict[tuple[str, int], LlmNode] = {}
        self._tools: dict[str, ToolNode] = {}
        self._members: dict[tuple[str, str], MemberNode] = {}
        self._roots: dict[str, str] = {}  # crew run -> its root path (the crew's name)
        self.last_event_id: str | None = None

    def extend(self, events: list[AgentEvent]) -> Timeline:
        for ev in events:
            self.add(ev)
        return self

    def _run(self, ev: AgentEvent, changes: list[Change]) -> RunNode:
        run = self._runs.get(ev.run_id)
        if run is None:  # a run whose start we did not see (a stream joined mid-run)
            run = self._runs[ev.run_id] = RunNode(ev.run_id, "", ev.timestamp)
            self.runs.append(run)
            changes.append(Change("new", run))
        return run

    def _llm_node(self, ev: AgentEvent, changes: list[Change]) -> LlmNode:
        key = (ev.run_id, ev.iteration)
        node = self._llm.get(key)
        if node is None:
            run = self._run(ev, changes)
            node = self._llm[key] = LlmNode(ev.run_id, ev.iteration, ev.timestamp)
            run.items.append(node)
            changes.append(Change("new", node, run))
        return node

    def _note(
        self,
        ev: AgentEvent,
        kind: str,
        text: str,
        changes: list[Change],
        parts: Sequence[Any] = (),
    ) -> None:
        run = self._run(ev, changes)
        views = part_views(parts, self.session_id) if parts else []
        note = NoteNode(kind, text, ev.timestamp, ev.sequence, ev.run_id, views)
        run.items.append(note)
        changes.append(Change("new", note, run))

    def add(self, ev: AgentEvent) -> list[Change]:
        """Put ``ev`` into the tree; what changed (empty for events the console does not show)."""
        changes: list[Change] = []
        self.last_event_id = f"{ev.run_id}:{ev.sequence}"
        if isinstance(ev, AgentStart):
            run = self._runs.get(ev.run_id)
            if run is None:
                run = self._runs[ev.run_id] = RunNode(ev.run_id, ev.agent, ev.timestamp, ev.resume)
                self.runs.append(run)
                changes.append(Change("new", run))
            else:
                run.agent, run.resume = ev.agent, ev.resume
                changes.append(Change("update", run))
            if ev.extra.get("crew"):
                self._roots[ev.run_id] = str(ev.extra.get("path") or ev.agent)
        elif isinstance(ev, CrewMemberStart | CrewMemberFinish):
            self._member(ev, changes)
        elif isinstance(ev, UserMessage):
            self._note(ev, "user", ev.content, changes, ev.parts)
        elif isinstance(ev, LlmStart):
            self._llm_node(ev, changes)
        elif isinstance(ev, LlmComplete):
            node = self._llm_node(ev, changes)
            node.done = True
            node.duration_ms = max(0.0, (ev.timestamp - node.started) * 1000)
            node.input_tokens, node.output_tokens = _tokens(ev.usage)
            node.cost = cost_of(ev.usage)
            node.model, node.answer, node.finish_reason = ev.model, ev.answer, ev.finish_reason
            node.parts = part_views(ev.parts, self.session_id) if ev.parts else []
            changes.append(Change("update", node))
        elif isinstance(ev, ToolExecutionStart | ApprovalRequired):
            call = self._tools.get(ev.tool_call_id)
            if call is None:
                parent = self._llm_node(ev, changes)
                call = ToolNode(
                    ev.tool_call_id, ev.tool_name, dict(ev.arguments), ev.run_id, ev.timestamp
                )
                self._tools[ev.tool_call_id] = call
                parent.tools.append(call)
                changes.append(Change("new", call, parent))
            else:
                changes.append(Change("update", call))
            if isinstance(ev, ApprovalRequired):
                call.approval = "required"
        elif isinstance(ev, ToolResultEvent | ToolErrorEvent):
            call = self._tools.get(ev.tool_call_id)
            if call is None:
                parent = self._llm_node(ev, changes)
                call = ToolNode(ev.tool_call_id, ev.tool_name, {}, ev.run_id, ev.timestamp)
                self._tools[ev.tool_call_id] = call
                parent.tools.append(call)
                changes.append(Change("new", call, parent))
            else:
                changes.append(Change("update", call))
            call.done, call.success, call.content = True, ev.success, ev.content
            call.error_code, call.duration_ms = ev.error_code, ev.duration_ms
            call.parts = part_views(ev.parts, self.session_id) if ev.parts else []
        elif isinstance(ev, ApprovalDecisionEvent):
            call = self._tools.get(ev.tool_call_id)
            if call is not None:
                call.approval = ev.decision
                call.decided_by = str(ev.extra.get("by") or "")
                call.decided_at = ev.timestamp
                call.reason = str(ev.extra.get("reason") or "")
                changes.append(Change("update", call))
        elif isinstance(ev, AgentFinish):
            run = self._run(ev, changes)
            run.done, run.stop_reason, run.error = True, ev.stop_reason, ev.error
            run.duration_ms = ev.duration_ms
            run.input_tokens, run.output_tokens = _tokens(ev.usage)
            run.cost = cost_of(ev.usage)
            changes.append(Change("update", run))
        elif isinstance(ev, Warning):
            self._note(ev, "warning", ev.warning, changes)
        elif isinstance(ev, ErrorEvent):
            self._note(ev, "error", ev.error, changes)
        elif isinstance(ev, GuardrailEvent) and ev.action != "pass":
            self._note(
                ev, "guardrail", f"{ev.guardrail} ({ev.kind}): {ev.action} {ev.reason}", changes
            )
        elif isinstance(ev, RunRecovered):
            self._note(
                ev, "recovered", f"recovered {ev.recovered_run_id}: {ev.stop_reason}", changes
            )
        return changes

    def _member(self, ev: CrewMemberStart | CrewMemberFinish, changes: list[Change]) -> None:
        node = self._members.get((ev.run_id, ev.key))
        if node is None:  # a start, or a finish reused from an earlier run (it has no start)
            run = self._run(ev, changes)
            root = self._roots.get(ev.run_id, "")
            inside = ev.path[len(root) :] if root and ev.path.startswith(root) else ev.path
            node = MemberNode(
                ev.run_id,
                ev.key,
                ev.path,
                ev.member,
                ev.child_session_id,
                ev.child_run_id,
                ev.timestamp,
                depth=max(1, inside.count("/")),
            )
            self._members[(ev.run_id, ev.key)] = node
            run.items.append(node)
            changes.append(Change("new", node, run))
        else:
            changes.append(Change("update", node))
        if isinstance(ev, CrewMemberFinish):
            node.done, node.stop_reason, node.output = True, ev.stop_reason, ev.output
            node.error, node.reused = ev.error, ev.reused
            node.child_run_id = ev.child_run_id or node.child_run_id
            node.input_tokens, node.output_tokens = _tokens(ev.usage)
            node.cost = cost_of(ev.usage)
