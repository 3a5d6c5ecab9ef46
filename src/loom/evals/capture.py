"""From a stored session to an eval case, and the recorded environment that replays it.

``capture_case(store, session_id)`` reads one run of a stored session (its journal) and makes a
``Case`` of it: the user's message as the input (a later turn continues the stored session at
the turn before it), the recorded answer as the reference (``expected``), the recorded tool
calls as a ``called_in_order`` assertion with their arguments, and the tools' recorded results
as the case's ``Environment``. With ``replay_model=True`` the case also gets a ``script``: the
recorded model answers (``LLM_COMPLETE`` events), so the whole run replays offline.

During a case's run, ``ReplayEnvironment.agent(agent)`` stands each of the agent's tools in for
a ``ReplayTool`` that answers from the recording (matched by tool name and canonical
arguments, in order: a repeated identical call takes the next recording). A call with no
recording fails the case, naming the call and the closest recorded one, or, when the case's
environment says ``unmatched: run_real``, runs the real tool.

Owners: a session the server recorded for an API key (KV ``loom.server.thread_owner``) is
captured only by that owner (``owner=``) or by someone who says they may see every owner's
sessions (``any_owner=True``); otherwise ``CaptureRefused``.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import InputError, SessionNotFound, ToolError
from loom.evals.assertions import CheckResult
from loom.evals.dataset import (
    Case,
    Dataset,
    DatasetError,
    Environment,
    Expected,
    RecordedCall,
    ScriptStep,
    SessionInput,
    load_dataset,
)

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.events import AgentEvent
    from loom.messages import Effect
    from loom.store.base import Store
    from loom.tools.base import RunContext, Tool

__all__ = [
    "OWNER_NAMESPACE",
    "CaptureRefused",
    "ExpectKind",
    "ReplayEnvironment",
    "ReplayTool",
    "append_case",
    "canonical_arguments",
    "capture_case",
    "dataset_yaml",
]

OWNER_NAMESPACE = "loom.server.thread_owner"
"""Where the server records which API key owns a session (``loom.server.ownership.OWNER_NS``;
named here too so that evals do not import the server)."""

ExpectKind = Literal["text", "contains", "rubric", "none"]


class CaptureRefused(InputError):
    """The session belongs to another owner (an API key of the server that recorded it)."""


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """Arguments as one comparable string: JSON with sorted keys (a recorded call matches a new
    one when the tool and this string are equal)."""
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


def _call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}({canonical_arguments(arguments)})"


@dataclass(slots=True)
class ReplayEnvironment:
    """One case run's view of a recorded environment: the recordings not yet used and every
    call that had none (``unmatched``). Build one per run."""

    environment: Environment
    pending: dict[tuple[str, str], deque[RecordedCall]] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    replayed: int = 0
    ran_real: int = 0
    _canonical: dict[str, Tool] = field(default_factory=dict)

    def agent(self, agent: Agent) -> Agent:
        """``agent`` with each of its tools answering from the recording (its toolsets, loaded
        per run, are left as they are)."""
        self._canonical = dict(agent.tools)
        for call in self.environment.calls:
            key = (call.name, self._canonical_of(call.name, call.arguments))
            self.pending.setdefault(key, deque()).append(call)
        tools: list[Any] = [ReplayTool(t, self) for t in agent.tools.values()]
        # memory keeps working: its tools are among those replayed, and it adds none twice
        return agent.replace(tools=[*tools, *agent.toolsets])

    def _canonical_of(self, name: str, arguments: dict[str, Any]) -> str:
        # a recording holds the arguments as the model sent them; a run's tool sees them
        # validated (defaults filled in): compare both validated when the tool can say how
        real = self._canonical.get(name)
        if real is not None:
            # arguments the tool refuses are compared as recorded
            with contextlib.suppress(Exception):
                arguments = real.validate(dict(arguments))
        return canonical_arguments(arguments)

    def take(self, name: str, arguments: dict[str, Any]) -> RecordedCall | None:
        """The next recording of this call, or None (the call is then noted as unmatched)."""
        queue = self.pending.get((name, canonical_arguments(arguments)))
        if queue:
            self.replayed += 1
            return queue.popleft()
        return None

    def closest(self, name: str, arguments: dict[str, Any]) -> str:
        """The recorded call most like this one (for the unmatched call's message)."""
        recorded = [_call_text(c.name, c.arguments) for c in self.environment.calls]
        if not recorded:
            return "none (the recording has no tool call)"
        wanted = _call_text(name, arguments)
        same_tool = [r for r in recorded if r.startswith(name + "(")] or recorded
        best = difflib.get_close_matches(wanted, same_tool, n=1, cutoff=0.0)
        return best[0] if best else same_tool[0]

    def checks(self) -> list[CheckResult]:
        """The environment's check: every call was answered from the recording (or ran the
        real tool, when the case allows it)."""
        if not self.unmatched:
            return [
                CheckResult(
                    "environment",
                    True,
                    f"{self.replayed} tool call(s) answered from the recording"
                    + (f", {self.ran_real} run for real" if self.ran_real else ""),
                )
            ]
        return [CheckResult("environment", False, "; ".join(self.unmatched))]


class ReplayTool:
    """A tool answering from a recording: the real tool's name, schema, timeout and effect (the
    model sees the same tool), its validation, and a ``run`` that replays."""

    def __init__(self, real: Tool, environment: ReplayEnvironment) -> None:
        self.real = real
        self.environment = environment
        self.name = real.name
        self.description = real.description
        self.parameters = real.parameters
        self.timeout = real.timeout
        self.effect: Effect = real.effect

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.real.validate(arguments)

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        env = self.environment
        recorded = env.take(self.name, arguments)
        if recorded is not None:
            if not recorded.success:
                raise ToolError(recorded.content, code=recorded.error_code or "tool_error")
            return recorded.content
        if env.environment.unmatched == "run_real":
            env.ran_real += 1
            return await self.real.run(ctx, arguments)
        message = (
            f"the call {_call_text(self.name, arguments)} has no recorded result "
            f"(closest recorded call: {env.closest(self.name, arguments)})"
        )
        env.unmatched.append(message)
        raise ToolError(message, code="unrecorded_call")


# -- capture -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    run_id: str
    events: list[AgentEvent]


def _runs(events: list[AgentEvent]) -> list[_Run]:
    """The session's turns in order: the runs that started with a user message."""
    from loom.events import EventType

    runs: dict[str, _Run] = {}
    for event in events:
        run = runs.get(event.run_id)
        if run is None:
            run = runs[event.run_id] = _Run(event.run_id, [])
        run.events.append(event)
    return [
        r
        for r in runs.values()
        if any(e.type == EventType.USER_MESSAGE for e in r.events)
        and any(e.type == EventType.AGENT_START for e in r.events)
    ]


async def _check_owner(store: Store, session_id: str, owner: str | None, any_owner: bool) -> None:
    from loom.store.base import capabilities_of

    kv = capabilities_of(store).kv
    recorded = await kv.get_value(OWNER_NAMESPACE, session_id) if kv is not None else None
    if not isinstance(recorded, str) or any_owner or recorded == owner:
        return
    who = f"you ({owner!r})" if owner is not None else "a caller who names no owner"
    raise CaptureRefused(
        f"session {session_id!r} belongs to {recorded!r}, and {who} may not capture it; "
        f"capture it as its owner (--as {recorded}) or, if you may read every owner's "
        "sessions, with --any-owner"
    )


_ERROR_PREFIX = re.compile(r"^Error \([^)]*\): ")
_ERROR_ID_TAIL = re.compile(r"\n\[Error ID: [^\]]*\]\n.*$", re.DOTALL)


def _error_message(content: str, tool_name: str) -> str:
    """A failed result's own message: what the model read, without the ``Error (code):``
    prefix and the error store's wrapping (``Tool 'x' failed: ... [Error ID: ...]``), which a
    replay adds again (with a new error id)."""
    message = _ERROR_PREFIX.sub("", content, count=1)
    wrapped = f"Tool '{tool_name}' failed: "
    if message.startswith(wrapped) and _ERROR_ID_TAIL.search(message):
        message = _ERROR_ID_TAIL.sub("", message.removeprefix(wrapped))
    return message


def _expected(kind: ExpectKind, answer: str) -> Expected | None:
    if kind == "none" or not answer.strip():
        return None
    if kind == "text":
        return Expected(text=answer)
    if kind == "contains":
        return Expected(contains=answer.strip())
    return Expected(
        rubric="The answer gives the same information and does the same as this reference "
        f"answer:\n{answer}"
    )


async def capture_case(
    store: Store,
    session_id: str,
    *,
    run_id: str | None = None,
    turn: int | None = None,
    case_id: str | None = None,
    expect: ExpectKind = "text",
    replay_model: bool = False,
    unmatched: Literal["fail", "run_real"] = "fail",
    owner: str | None = None,
    any_owner: bool = False,
) -> Case:
    """A case from one run of a stored session (see the module docstring).

    ``run_id`` or ``turn`` (1-based) picks the run, default the session's last; ``expect`` makes
    the recorded answer the case's ``expected`` text (``text``), a substring (``contains``), a
    judge's rubric (``rubric``) or nothing (``none``); ``replay_model`` adds the recorded model
    answers as the case's script. ``owner`` names the caller (an API key's name);
    ``CaptureRefused`` when the session is another owner's and ``any_owner`` is not set.
    """
    from loom.events import EventType

    if run_id is not None and turn is not None:
        raise InputError("give a run id or a turn, not both")
    if await store.get_session(session_id) is None:
        raise SessionNotFound(f"no session {session_id!r} in this store; see `loom sessions`")
    await _check_owner(store, session_id, owner, any_owner)
    runs = _runs(await store.load_events(session_id))
    if not runs:
        raise InputError(f"session {session_id!r} has no recorded turn to capture")
    if run_id is not None:
        index = next((i for i, r in enumerate(runs) if r.run_id == run_id), None)
        if index is None:
            raise InputError(
                f"session {session_id!r} has no turn run {run_id!r}; its runs are "
                f"{', '.join(r.run_id for r in runs)}"
            )
    elif turn is not None:
        if not 1 <= turn <= len(runs):
            raise InputError(f"session {session_id!r} has turns 1 to {len(runs)}, not {turn}")
        index = turn - 1
    else:
        index = len(runs) - 1
    run = runs[index]
    message = ""
    answer = ""
    model_name = ""
    steps: list[str | ScriptStep] = []
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    recorded: list[RecordedCall] = []
    order: list[tuple[str, dict[str, Any]]] = []
    for event in run.events:
        data = event.data
        if event.type == EventType.AGENT_START:
            model_name = str(data.get("model") or "")
        elif event.type == EventType.USER_MESSAGE and not message:
            message = str(data.get("content") or "")
        elif event.type == EventType.LLM_COMPLETE:
            tools = [
                {"name": str(c.get("name", "")), "arguments": dict(c.get("arguments") or {})}
                for c in data.get("tool_calls") or []
            ]
            text = str(data.get("text") or "")
            steps.append(ScriptStep(text=text, tools=tools) if tools else text)
        elif event.type == EventType.TOOL_EXECUTION_START:
            name = str(data.get("tool_name", ""))
            arguments = dict(data.get("arguments") or {})
            calls[str(data.get("tool_call_id", ""))] = (name, arguments)
            order.append((name, arguments))
        elif event.type in (EventType.TOOL_RESULT, EventType.TOOL_ERROR):
            started = calls.get(str(data.get("tool_call_id", "")))
            if started is None:  # a result with no start (a denied call): not the tool's
                continue
            success = bool(data.get("success", True))
            content = str(data.get("content") or "")
            recorded.append(
                RecordedCall(
                    name=started[0],
                    arguments=started[1],
                    content=content if success else _error_message(content, started[0]),
                    success=success,
                    error_code=None if success else str(data.get("error_code") or "tool_error"),
                )
            )
        elif event.type == EventType.AGENT_FINISH:
            answer = str(data.get("output") or "")
    assertions: list[dict[str, Any]] = []
    if order:
        assertions.append(
            {"called_in_order": [{"name": n, "arguments": a} for n, a in order]},
        )
    source: str | SessionInput = (
        message
        if index == 0
        else SessionInput(session=session_id, checkpoint=index, message=message)
    )
    return Case(
        id=case_id or f"{session_id}-turn{index + 1}",
        input=source,
        expected=_expected(expect, answer),
        assertions=assertions,
        script=steps if replay_model else None,
        environment=Environment(calls=recorded, unmatched=unmatched),
        metadata={
            "captured_from": {
                "session": session_id,
                "run_id": run.run_id,
                "turn": index + 1,
                "model": model_name,
            }
        },
    )


# -- writing datasets ----------------------------------------------------------------------------


def dataset_yaml(dataset: Dataset) -> str:
    """A dataset as YAML that ``load_dataset`` reads back to the same dataset."""
    import yaml

    data = dataset.model_dump(mode="json", exclude_defaults=True)
    data.setdefault("cases", [])
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def append_case(path: str | Path, case: Case, *, append: bool) -> Dataset:
    """Write ``case`` to the dataset file ``path``: added to the cases already there
    (``append``; a case with the same id is a ``DatasetError``), or as a new dataset (a file
    already there is refused: give ``append``). Comments of the file are not kept."""
    file = Path(path)
    if file.suffix.lower() == ".jsonl":
        raise DatasetError("capture writes YAML datasets; name a .yaml file", path=str(path))
    if file.exists() and not append:
        raise DatasetError(
            "the file exists; give --append to add the case to it, or name another file",
            path=str(path),
        )
    if file.exists():
        dataset = load_dataset(file)
        if any(c.id == case.id for c in dataset.cases):
            raise DatasetError(
                f"the dataset has a case {case.id!r} already; give the new one another --id",
                path=str(path),
            )
        dataset = dataset.model_copy(update={"cases": [*dataset.cases, case]})
    else:
        dataset = Dataset(name=file.stem, cases=[case])
    file.write_text(dataset_yaml(dataset), encoding="utf-8")
    return dataset
