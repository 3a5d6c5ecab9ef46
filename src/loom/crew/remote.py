"""Remote crew members: an agent served over A2A (any ``loom serve``, or another A2A server)
that a crew runs like one of its own.

```python
from loom.crew import Crew, RemoteAgent, Sequential

crew = Crew("blog", members={"researcher": researcher,
                             "writer": RemoteAgent("http://host:8000/agents/writer")},
            plan=Sequential("researcher", "writer"))
```

A member run of a remote member sends the member's message (the edge's context policy
applied, as for a local member) as one A2A message and reads the remote task to its end with
the A2A client of ``loom.tools.a2a``. The remote ``contextId`` is kept per crew child session
(``<crew session>:<member path>``), so a loop's next pass or a manager's next delegation
continues the same remote conversation, and a remote task that stopped at ``input-required``
is answered by the next message to that member.

What a remote member cannot do: it is given no crew tools (no ``delegate``, ``transfer``,
``choose_branch``, ``exit_loop``, ``state_*``), so it cannot be a manager or a router's
chooser (refused when the crew is built); in a handoff it answers and never transfers; a loop
around it ends by ``until`` or ``max_iterations``. Its tokens and cost are unknown (A2A does
not report them): they count as zero against ``tokens`` and a ``cost_usd`` budget anywhere up
the tree refuses to run it (fail closed).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from loom.crew.plan import Graph, Handoff, Loop, Manager, Node, Parallel, Router, Sequential
from loom.errors import (
    ConfigurationError,
    CrewDefinitionError,
    MissingDependencyError,
    RemoteMemberError,
)
from loom.tools.a2a import A2AAgent

__all__ = ["RemoteAgent", "a2a_member", "check_roles"]

_HTTP_MARGIN = 10.0


class RemoteAgent:
    """A crew member that is a remote A2A agent (see the module docstring).

    Args:
        url: Where its agent card lives (``<url>/.well-known/agent-card.json``); a Loom
            server's agent is ``http://host:port/agents/<name>``.
        headers: Sent with every request (``{"Authorization": "Bearer ..."}``).
        timeout: Seconds one member run may take; past it the remote task is cancelled and
            the member's result is ``timeout``.
        connect_timeout: Seconds to connect.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 300.0,
        connect_timeout: float = 30.0,
    ) -> None:
        if importlib.util.find_spec("a2a") is None:  # pragma: no cover - part of the a2a extra
            raise MissingDependencyError("a2a-sdk", "a2a", "remote (A2A) crew members")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"RemoteAgent({url!r}): timeout must be > 0")
        # validates url and connect_timeout (ConfigurationError) and holds the HTTP client and
        # card; its HTTP read timeout sits past the member's deadline, so the deadline (which
        # cancels the remote task) is what fires, never an idle stream's read timeout
        self.a2a = A2AAgent(
            url, headers=headers, timeout=timeout + _HTTP_MARGIN, connect_timeout=connect_timeout
        )
        self.url = self.a2a.url
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"RemoteAgent({self.url!r})"

    @property
    def card(self) -> Any:
        """The remote agent's card, once read (None before the first use)."""
        return self.a2a.card

    async def connect(self, member: str = "remote") -> Any:
        """The A2A client, reading the card on first use in this event loop;
        ``RemoteMemberError`` naming ``member`` when it cannot be reached or its card is not
        an agent card."""
        try:
            return await self.a2a.client()
        except MissingDependencyError:
            raise
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            why = f"cannot read its agent card: {detail}"
            raise RemoteMemberError(member, self.url, why) from exc


def a2a_member(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    connect_timeout: float = 30.0,
) -> RemoteAgent:
    """A remote A2A agent as a crew member: ``Crew(members={"writer": a2a_member(url)})``."""
    return RemoteAgent(url, headers=headers, timeout=timeout, connect_timeout=connect_timeout)


def check_roles(plan: Node | str, members: Mapping[str, Any], where: str = "plan") -> None:
    """Refuse a plan that makes a remote member a manager or a router's chooser: both need a
    crew tool, which a remote agent cannot be given (``CrewDefinitionError`` naming the field)."""
    if isinstance(plan, str):
        return

    def local(name: str, role: str, at: str) -> None:
        if isinstance(members.get(name), RemoteAgent):
            raise CrewDefinitionError(
                f"{name!r} is a remote (A2A) member and cannot be {role}: "
                "it cannot be given the crew's tool for it; use a local "
                "agent here",
                field=at,
            )

    if isinstance(plan, Sequential | Parallel):
        mode = type(plan).__name__.lower()
        for i, step in enumerate(plan.steps):
            check_roles(step, members, f"{where}.{mode}[{i}]")
    elif isinstance(plan, Router):
        if plan.by is not None:
            local(plan.by, "a router's chooser", f"{where}.router.by")
        for name, branch in plan.branches.items():
            check_roles(branch, members, f"{where}.router.branches.{name}")
    elif isinstance(plan, Loop):
        check_roles(plan.body, members, f"{where}.loop.body")
    elif isinstance(plan, Manager):
        local(plan.manager, "a manager", f"{where}.manager.manager")
    elif isinstance(plan, Graph | Handoff):
        return  # tasks name members (any kind); a remote handoff member answers, never transfers
