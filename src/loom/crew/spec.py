"""What a crew run reads of its crew: ``CrewSpec``, which ``Crew`` satisfies.

The runner (``loom.crew.runner``) and the driver's handle (``loom.crew.turn``) take a crew as a
``CrewSpec``: ``loom.crew.crew`` imports them, so they do not import it back
(tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.crew.budget import Budget, BudgetScope
    from loom.crew.remote import RemoteAgent
    from loom.crew.result import CrewResult
    from loom.engine.runtime import Runtime
    from loom.events import AgentEvent

__all__ = ["CrewSpec"]


class CrewSpec(Protocol):
    """A crew as its runs read it: its name, members, limits, and how to run it."""

    @property
    def name(self) -> str:
        """The root of every member path."""
        ...

    @property
    def members(self) -> Mapping[str, Agent | CrewSpec | RemoteAgent]:
        """Member name -> agent, nested crew or remote agent."""
        ...

    @property
    def budget(self) -> Budget:
        """Tree-wide limits."""
        ...

    @property
    def summarizer(self) -> Agent | None:
        """The agent that writes ``summary`` context (None: one on the sender's model)."""
        ...

    @property
    def ref_threshold(self) -> int | None:
        """Context longer than this is handed over by reference (with shared state)."""
        ...

    async def execute(
        self,
        runtime: Runtime,
        task: str,
        *,
        session_id: str | None = None,
        scope: BudgetScope | None = None,
        depth: int = 0,
        root: str | None = None,
        emit: Callable[[AgentEvent], None] | None = None,
        deps: Any = None,
        parent_run_id: str | None = None,
        approvals: Any = None,
        run_id: str | None = None,
        owner: str | None = None,
    ) -> CrewResult:
        """Run the crew on ``task`` on ``runtime`` to its end, its member runs acting for
        ``owner`` (``RunOptions.owner``)."""
        ...
