"""What the engine (runtime, turn, call runner) reads of an agent: ``TurnSpec``.

``AgentSpec`` (``loom.spec``) is what the seams read; a turn also reads the agent's hooks,
policies, judges, patterns, guardrails, its context builder and its runtime defaults. This is a
module of its own because those are seams themselves: the context builder reads an
``AgentSpec``, so ``loom.spec`` cannot name ``ContextBuilder`` without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from loom.spec import AgentSpec

if TYPE_CHECKING:
    from loom.context import ContextBuilder
    from loom.engine.branching import BranchPolicy
    from loom.guardrails.engine import Guardrails
    from loom.judge.panel import JudgePanel
    from loom.patterns.library import PatternLibrary
    from loom.store.base import Store

__all__ = ["TurnSpec"]


class TurnSpec(AgentSpec, Protocol):
    """An ``AgentSpec`` plus what a turn runs with. ``loom.Agent`` satisfies it."""

    @property
    def hooks(self) -> tuple[object, ...]:
        """The user's lifecycle hooks, in order."""
        ...

    @property
    def compiled_hooks(self) -> dict[str, list[Any]]:
        """Hook methods by lifecycle point: the permission check first, then ``hooks``."""
        ...

    @property
    def permissions(self) -> Any:
        """The ``PermissionManager`` built from the definition's rules."""
        ...

    @property
    def approval_handler(self) -> Any:
        """Decides calls that need approval in process (None: such a call parks the run)."""
        ...

    @property
    def guardrails(self) -> Guardrails | None:
        """Checks on the message, the answer, each call and each result."""
        ...

    @property
    def judges(self) -> JudgePanel | None:
        """Scores each final answer; a failing one is retried with a correction."""
        ...

    @property
    def patterns(self) -> PatternLibrary | None:
        """Patterns matched against each user message into ROM."""
        ...

    @property
    def query_detector(self) -> Any:
        """Stops a final answer that is a server query (``loom.queries``)."""
        ...

    @property
    def context_builder(self) -> ContextBuilder | None:
        """The definition's own context builder (None: the runtime's default one)."""
        ...

    @property
    def default_store(self) -> Store | None:
        """Where the agent's default runtime keeps sessions (None: in memory)."""
        ...

    @property
    def deps(self) -> Any:
        """The object handed to tools as ``RunContext.deps`` unless a run passes its own."""
        ...

    @property
    def output_type(self) -> Any:
        """The type of the final answer as given (``output_spec`` is its compiled form)."""
        ...

    @property
    def max_result_chars(self) -> int | None:
        """Longest tool result sent whole (with a store that keeps large results)."""
        ...

    @property
    def max_message_chars(self) -> int:
        """Longest user message accepted."""
        ...

    @property
    def branch_effects(self) -> BranchPolicy:
        """What a branch does about dropped turns' effects (``loom.engine.branching``)."""
        ...

    @property
    def queue_timeout(self) -> float:
        """Seconds a turn waits for its busy session."""
        ...

    @property
    def max_queue_depth(self) -> int:
        """Turns that may wait for one session."""
        ...

    @property
    def lock_ttl(self) -> float:
        """Kept for compatibility (leases are renewed while a turn runs)."""
        ...

    def check_message(self, message: Any) -> str:
        """The user's message as text, or ``InputError`` saying what is wrong with it."""
        ...
