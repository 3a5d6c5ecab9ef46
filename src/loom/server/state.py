"""``ServerState``: what every request handler of ``loom serve`` shares (the agents, the
runtime, readiness). Its own module so that the middleware (``loom.server.security``) and the
console's login can name it without importing the app that holds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.engine.runtime import Runtime
    from loom.server.registry import AgentRegistry
    from loom.server.session_events import SessionHub

__all__ = ["ServerState"]


def _hub() -> SessionHub:
    from loom.server.session_events import SessionHub

    return SessionHub()


@dataclass
class ServerState:
    """What every request handler shares: the agents, the runtime, and whether it is ready."""

    registry: AgentRegistry
    runtime: Runtime
    ready: bool = False
    draining: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    hub: SessionHub = field(default_factory=_hub)  # live events by session (SubscribeToSession)
