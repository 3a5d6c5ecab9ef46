"""What starts a run: a typed input, a target, per-run options (the front door's vocabulary).

Every run, of an agent or of a crew, from every surface, starts through one call,
``Runtime.start(target, input, session_id=..., options=...)``:

- ``input`` says what the run is for: ``NewMessage(text)`` (a plain ``str`` means the same),
  ``Resume(decisions)`` for calls parked on a human's approval, ``Answer(text, query_id)`` for
  a server query the run stopped on (``loom.queries``), ``CarryOn()``: recover what a dead
  run of the session left open and go on from the committed transcript, with no new message,
  or a branch (``loom.engine.branching``): ``Rewind(to)`` moves the session back to a point,
  ``Regenerate()`` answers the last user message again, ``Edit(turn, text)`` replaces a user
  message and answers it.
- ``target`` is anything ``loom.engine.runtime.Runnable``: an ``Agent`` or a ``Crew``.
- ``options`` (``RunOptions``) varies this one run without building a changed ``Agent``:
  another model, extra tools, an output type, a cost budget, tighter limits, the tools'
  ``deps``, what to do when the session is busy, the parent run and the run's id.

``start`` answers a ``Drivable``: the run, checked and named but not started; ``await
run.run(emit)`` runs it (``loom.engine.driving.drive`` streams it), ``run.cancel(reason)`` stops it
and ``run.result`` holds its ``RunResult`` afterwards.

This module imports nothing of the engine at load time, so any layer may name these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from loom.content import Part, UserContent
    from loom.engine.gates import OnBusy
    from loom.events import AgentEvent
    from loom.messages import RunResult
    from loom.models.base import Model

__all__ = [
    "SESSION_OWNER_NAMESPACE",
    "Answer",
    "AtEvent",
    "AtTurn",
    "BranchInput",
    "CarryOn",
    "Drivable",
    "Edit",
    "Input",
    "NewMessage",
    "Point",
    "Regenerate",
    "Resume",
    "Rewind",
    "RunInput",
    "RunOptions",
    "as_run_input",
    "with_overrides",
]


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A new user message: the usual run. ``Runtime.start(agent, "hi")`` means
    ``NewMessage("hi")``; ``parts`` are its images, files and audio (``loom.content``), and a
    list mixing text and parts means ``NewMessage(text, parts)``."""

    text: str
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True, slots=True)
class Resume:
    """Continue a run parked with ``stop_reason="awaiting_approval"``.

    ``decisions`` maps each pending ``tool_call_id`` to ``Approve()``, ``Reject(reason)`` or
    ``Edit(arguments)`` (or True/False, "approve"/"reject"); a single decision applies to every
    pending call. For a crew, a mapping may also be keyed by member path (``"blog/writer"``).
    """

    decisions: Any = True


@dataclass(frozen=True, slots=True)
class Answer:
    """The client's answer to the server query a run stopped on
    (``stop_reason="awaiting_input"``); ``query_id`` (optional) must name the pending query."""

    text: str
    query_id: str | None = None


@dataclass(frozen=True, slots=True)
class CarryOn:
    """No new message: recover what a dead run of the session left open and let the run go on
    from the committed transcript (a worker's retry of a run whose message was committed)."""


@dataclass(frozen=True, slots=True)
class AtTurn:
    """A point in a session: after its first ``turns`` turns (a turn is a user message and
    everything that answered it). ``AtTurn(0)`` is the empty session."""

    turns: int


@dataclass(frozen=True, slots=True)
class AtEvent:
    """A point in a session: just after the stored event ``sequence`` of run ``run_id`` (the
    ids a stream gives each event; on the LangGraph API a checkpoint id ``"<run_id>.<seq>"``).
    An event of an abandoned branch is a valid point too: its branch's state comes back."""

    run_id: str
    sequence: int


Point = AtTurn | AtEvent | int
"""Where a session continues from (``loom.engine.branching``); an ``int`` means ``AtTurn``."""


@dataclass(frozen=True, slots=True)
class Rewind:
    """Move the session back to ``to``: its later turns leave the transcript (they stay in
    the journal, as an abandoned branch). The run ends with ``stop_reason="rewound"``; no
    model is called."""

    to: Point


@dataclass(frozen=True, slots=True)
class Regenerate:
    """The last answer again: the session goes back to just after its last user message and
    the agent answers it anew."""


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace the user message of turn ``turn`` (0-based) with ``text`` (and ``parts``): the
    session goes back to just before it, and the agent answers the new message."""

    turn: int
    text: str
    parts: tuple[Part, ...] = ()


BranchInput = Rewind | Regenerate | Edit
"""The inputs that move a session to another point before (or instead of) a new answer."""

RunInput = NewMessage | Resume | Answer | CarryOn | Rewind | Regenerate | Edit
"""What a run is started for (see the module docstring)."""

Input = RunInput | str | Sequence["UserContent"]
"""What the public run methods take: a ``RunInput``, or what ``as_run_input`` turns into a
``NewMessage`` (a ``str``, or a list of text and media parts)."""

SESSION_OWNER_NAMESPACE = "loom.server.thread_owner"
"""Key-value namespace of each session's owner (key: the session id; value: the owner's name,
an API key's principal): written by the server when a key makes a session
(``loom.server.ownership.Owners``) and by a run with an owner on a new session; read by the
front door for a run that names no owner of its own."""

_INPUT_KINDS = (NewMessage, Resume, Answer, CarryOn, Rewind, Regenerate, Edit)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Per-run overrides: they change this run only; the ``Agent`` stays as it was built.

    Args:
        model: Another model for this run: a ``Model`` or a model string (resolved by the
            runtime, once per process for a string).
        extra_tools: Tools added to this run's tool table (``@tool`` functions, ``Tool``
            objects, names of built-in tools). A name the agent already has is an
            ``InputError``.
        output_type: The type of this run's final answer (``loom.output``; ``str``: text).
        max_cost: US dollars; the run stops with ``stop_reason="cost_limit"`` once its model
            calls cost more (needs the model's price, ``loom.pricing``).
        max_iterations: Model calls for this run (default the agent's).
        max_tool_calls: Tool executions for this run (default the agent's).
        timeout: Wall-clock seconds for this run (default the agent's).
        tool_choice: This run's ``ModelSettings.tool_choice`` over the agent's: ``"required"``,
            ``"none"``, ``"auto"`` or a tool name (a forced choice holds for the run's first
            call, as in ``ModelSettings``).
        queue_timeout: Seconds this run waits for its busy session (``on_busy="queue"``;
            default the agent's).
        deps: Handed to tools as ``RunContext.deps`` (default the agent's ``deps``).
        on_busy: When the session runs another turn: wait (``"queue"``), fail with
            ``SessionBusy`` (``"drop"``) or cancel the other (``"interrupt"``).
        parent_run_id: The run this one runs for (a crew run for its members).
        run_id: The run's id (default a new one): for callers that name the run before.
        owner: Whom the run acts for: the name of the API key's principal (a served run), a
            schedule's ``principal``, or any name code gives. The run's memory tools and recall
            read and write that owner's items (``loom.memory.item_tools``). ``None``: the
            session's recorded owner (``SESSION_OWNER_NAMESPACE``), else nobody (shared). The
            front door decides it once; tools read it as ``RunContext.owner``.
        progress: Whether the run builds its progress notices (``loom.engine.journal.
            PROGRESS_TYPES``: state, iteration and context notices, deltas). ``None`` (the
            default): when someone watches it live (a stream or an observer). ``True``: always,
            journaled, for a run others follow through the store (a queued worker's run, whose
            frames the server reads back from the journal). ``False``: never, for a watcher
            that reads only steps (a blocking server run whose stream modes show no notice):
            they cost a step more than the step's own work.
    """

    model: str | Model | None = None
    extra_tools: Sequence[Any] = ()
    output_type: Any = None
    max_cost: float | None = None
    max_iterations: int | None = None
    max_tool_calls: int | None = None
    timeout: float | None = None
    tool_choice: str | None = None
    queue_timeout: float | None = None
    deps: Any = None
    on_busy: OnBusy = "queue"
    parent_run_id: str | None = None
    run_id: str | None = None
    progress: bool | None = None
    owner: str | None = None

    def __post_init__(self) -> None:
        tools = self.extra_tools
        if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
            from loom.errors import InputError

            raise InputError(f"extra_tools must be a list of tools, got {type(tools).__name__}")
        object.__setattr__(self, "extra_tools", tuple(tools))  # frozen: a list could change


class Drivable(Protocol):
    """A run started and not yet run (what ``Runtime.start`` answers): ``loom.engine.loop.Turn``
    for an agent, ``loom.crew.CrewTurn`` for a crew. Whatever drives a turn
    (``loom.engine.driving.drive``, a server's run manager, graceful shutdown) drives either."""

    run_id: str
    session_id: str
    result: RunResult | None

    async def run(self, emit: Callable[[AgentEvent], None]) -> None:
        """Run to the end in the current task, handing each event to ``emit``."""
        ...

    def cancel(self, reason: str = ...) -> None:
        """Stop at the next await; the run records its end (``stop_reason="cancelled"``)."""
        ...


def with_overrides(options: RunOptions | None, **given: Any) -> RunOptions:
    """``options`` (default ``RunOptions()``) with the keyword arguments a caller gave over it:
    what ``Agent.run(..., model=...)`` and ``Runtime.run(..., deps=...)`` build. A keyword at
    its default (None, no extra tools, ``on_busy="queue"``) leaves ``options``' value."""
    from dataclasses import replace

    base = RunOptions() if options is None else options
    unset: dict[str, Any] = {"extra_tools": (), "on_busy": "queue"}  # defaults that are not None
    changes = {
        k: v for k, v in given.items() if v is not None and (k not in unset or v != unset[k])
    }
    return replace(base, **changes) if changes else base


def as_run_input(input: object) -> RunInput:
    """``input`` as a ``RunInput`` (a ``str`` is a ``NewMessage``; so is a media part, or a
    list of text and parts), else ``InputError``."""
    if isinstance(input, str):
        return NewMessage(input)
    if isinstance(input, _INPUT_KINDS):
        return input
    from loom.content import Media, split_content

    if isinstance(input, Media | list | tuple):
        text, parts = split_content(input)
        return NewMessage(text, tuple(parts))
    from loom.errors import InputError

    raise InputError(
        f"a run's input must be a str (a new message), a list of text and media parts "
        f"(loom.content), NewMessage(text), Resume(decisions), Answer(text, query_id) or "
        f"CarryOn() from loom.engine.run_inputs; got {type(input).__name__}"
    )
