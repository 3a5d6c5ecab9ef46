"""What the seams read of an agent, and what a schedule or a worker needs of something runnable.

The seams (the context builder, hooks, the memory builder, permissions and approval, backends,
definition files) and the engine take an agent as an ``AgentSpec``: a read-only view of its
definition. ``Agent`` satisfies it by its attributes, so nothing below ``agent.py`` imports
``Agent`` and the package stays layered (tests/test_layers.py): data (``messages``,
``events``, ``errors``) → ``spec`` → seams → engine → ``Agent`` / ``Crew`` → surfaces.

This module imports only data modules (and, for annotations, the data-like modules the spec's
attributes are made of), never a seam, the engine, ``Agent`` or ``Crew``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from loom.loop_detection import LoopDetection
    from loom.memory.config import MemoryConfig
    from loom.messages import Effect, ToolSpec
    from loom.models.base import Model, ModelSettings
    from loom.output import OutputSpec
    from loom.tools.base import Tool

__all__ = ["AgentSpec", "CrewTarget", "Named", "RunEnd"]


class AgentSpec(Protocol):
    """An agent's definition, read-only: what a seam may read of the agent it serves.

    ``loom.Agent`` satisfies it; so does any object with these attributes (a test double, a
    definition built some other way).
    """

    @property
    def name(self) -> str:
        """Identifies the agent in sessions, events and logs."""
        ...

    @property
    def description(self) -> str:
        """What clients are shown (an MCP tool's, an A2A card's description); may be empty."""
        ...

    @property
    def instructions(self) -> str:
        """The system prompt."""
        ...

    @property
    def model_spec(self) -> str | Model | None:
        """A model string (resolved by the runtime), a ``Model``, or None (``$LOOM_MODEL``)."""
        ...

    @property
    def model_settings(self) -> ModelSettings | None:
        """Temperature, max tokens, ... for every model call."""
        ...

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's own tools by name (toolsets load theirs per turn)."""
        ...

    @property
    def tool_specs(self) -> list[ToolSpec]:
        """The specs of ``tools``, in order."""
        ...

    @property
    def toolsets(self) -> tuple[Any, ...]:
        """MCP servers and other tool sources each runtime loads per turn (``load_tools``)."""
        ...

    @property
    def backends(self) -> tuple[Any, ...]:
        """Domain backends: their operations become tools, their schema text goes into ROM."""
        ...

    @property
    def workspace(self) -> Path | None:
        """Root directory of the file tools, if any."""
        ...

    @property
    def memory(self) -> MemoryConfig | None:
        """Segment budgets, compression, MEMORY.md (``loom.memory.MemoryConfig``)."""
        ...

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens, when the definition fixes it."""
        ...

    @property
    def reserved_output_tokens(self) -> int | None:
        """Tokens kept free for the answer, when the definition fixes it."""
        ...

    @property
    def max_iterations(self) -> int:
        """Model calls per turn."""
        ...

    @property
    def max_tool_calls(self) -> int:
        """Tool executions per turn."""
        ...

    @property
    def timeout(self) -> float:
        """Wall-clock seconds per turn."""
        ...

    @property
    def loop_detection(self) -> LoopDetection | None:
        """When a run that repeats a call or an answer stops (None: never)."""
        ...

    @property
    def tool_timeout(self) -> float:
        """Default seconds per tool call."""
        ...

    @property
    def output_spec(self) -> OutputSpec | None:
        """The compiled ``output_type`` (None: text)."""
        ...

    @property
    def output_retries(self) -> int:
        """How many times an answer that does not fit ``output_type`` is sent back."""
        ...

    @property
    def given(self) -> Mapping[str, Any]:
        """The arguments the definition was built with (read-only)."""
        ...

    def effect_of(self, tool_name: str) -> Effect:
        """The side-effect class of one of the agent's tools (``"pure"`` for an unknown one)."""
        ...


class Named(Protocol):
    """Something a schedule or a worker runs by name: an ``Agent`` or a ``Crew``."""

    @property
    def name(self) -> str:
        """The name schedules and queued jobs use for it."""
        ...


class RunEnd(Protocol):
    """How a run ended, as a launcher reads it (``RunResult``, ``CrewResult``)."""

    @property
    def stop_reason(self) -> str:
        """Why it stopped (``"completed"``, ``"error"``, ``"cancelled"``, ...)."""
        ...

    @property
    def error(self) -> str | None:
        """What went wrong, when something did."""
        ...


@runtime_checkable
class CrewTarget(Named, Protocol):
    """Something that runs itself, its members on a given runtime: a ``Crew``, as a schedule
    or a worker sees it (an agent's turn is run by the runtime instead)."""

    @property
    def members(self) -> Mapping[str, Any]:
        """Member name -> member."""
        ...

    async def run(
        self, task: str, *, session_id: str | None = None, runtime: Any = None, deps: Any = None
    ) -> RunEnd:
        """Run to the end on ``runtime`` (a ``loom.engine.runtime.Runtime``; typed ``Any`` because
        this module sits below the runtime and may not name it), default the target's own."""
        ...
