"""``loom serve``: Loom agents over HTTP (and gRPC), from one runtime and one journal.

``create_app(registry, runtime)`` builds the FastAPI application; ``loom serve`` runs it under
uvicorn. Each protocol is a router module of its own (see ``docs/server.md``); they all run
agents through the same ``Runtime``, so a thread started over one protocol can be read over any.
Needs the ``server`` extra.
"""

from __future__ import annotations

from loom.server.app import ServerState, create_app
from loom.server.registry import AgentRegistry

__all__ = ["AgentRegistry", "ServerState", "create_app"]
