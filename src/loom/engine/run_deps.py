"""What one turn runs with (``RunDeps``), and what it reads of the process running it
(``TurnHost``, which ``Runtime`` satisfies).

They live apart from ``loom.engine.runtime`` so that the turn (``loom.engine.loop``) and the call
runner (``loom.engine.calls``) never import the runtime that makes them: the engine's imports stay
one-way (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from loom.context import ContextBuilder
    from loom.engine.gates import SessionGate
    from loom.engine.run_inputs import RunOptions
    from loom.engine.turn_spec import TurnSpec
    from loom.events import AgentEvent
    from loom.messages import Message, ToolSpec, Usage
    from loom.models.base import Model
    from loom.policy.permissions import PermissionRule
    from loom.store.base import Store, StoreCapabilities
    from loom.tools.base import Tool
    from loom.tools.channel import ResultShaper

__all__ = ["RunDeps", "SessionView", "TurnHost"]


@dataclass(slots=True)
class RunDeps:
    """What one turn runs with, built fresh by the runtime for that turn."""

    agent: TurnSpec
    store: Store
    model: Model
    tools: dict[str, Tool]  # this turn's tool table (the agent's, toolsets', built-ins)
    tool_specs: list[ToolSpec]
    builder: ContextBuilder
    shaper: ResultShaper | None
    remembered: list[PermissionRule]  # the session's "always"/"never" decisions, from the store
    user_deps: Any = None
    warnings: list[str] = field(default_factory=list)  # found while building (toolsets, ...)
    rom: list[str] = field(default_factory=list)  # the backends' schema text, ROM first
    max_tool_calls: int = 50  # this run's (RunOptions.max_tool_calls, else the agent's)
    owner: str | None = None  # whom the run acts for (RunOptions.owner, decided by start)
    sandboxes: Any = None  # the runtime's SandboxPool (loom.sandbox.sessions)

    def effect_of(self, tool_name: str) -> Any:
        t = self.tools.get(tool_name)
        return getattr(t, "effect", "at_most_once") if t is not None else "pure"


@dataclass(slots=True)
class SessionView:
    """A session's transcript as this runtime last committed or read it (a longer stored
    transcript only adds to it, unless a branch rewrote it: ``branches``), and its remembered
    permission rules."""

    messages: list[Message]
    remembered: list[PermissionRule] | None = None
    branches: int = 0
    """The store's count of the session's rewinds when ``messages`` was read or committed
    (``SessionInfo.branches``): another count means a branch rewrote them."""


class TurnHost(Protocol):
    """What a turn reads of the process running it: ``loom.engine.runtime.Runtime`` satisfies it."""

    @property
    def store(self) -> Store:
        """Where the session lives."""
        ...

    @property
    def capabilities(self) -> StoreCapabilities:
        """The store's optional capabilities."""
        ...

    @property
    def lease_ttl(self) -> float:
        """Seconds a session lease lasts without renewal."""
        ...

    @property
    def observers(self) -> Sequence[Callable[[AgentEvent], None]]:
        """Called with every committed event."""
        ...

    @property
    def tracers(self) -> list[Any]:
        """The observers that open a run's span before its ``AGENT_START`` is committed."""
        ...

    def gate(self, session_id: str) -> SessionGate:
        """The in-process gate (lock and queue) of ``session_id``."""
        ...

    def forget_gate(self, session_id: str, gate: SessionGate) -> None:
        """Drop ``gate`` once nobody holds or waits for it."""
        ...

    async def session_view(self, session_id: str) -> SessionView:
        """The session's transcript as last committed, brought up to date with the store."""
        ...

    async def deps_for(
        self,
        agent: TurnSpec,
        session_id: str,
        view: SessionView,
        user_deps: Any,
        options: RunOptions | None = None,
    ) -> RunDeps:
        """This turn's ``RunDeps`` (``options``: the run's own overrides)."""
        ...

    def price(self, usage: Usage, model: Model, response_model: str | None = None) -> Usage:
        """``usage`` of one call to ``model`` with its cost."""
        ...
