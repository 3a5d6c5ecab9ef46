"""Crews: several agents working as one (seed 002's Crew, seed 000's agent-to-agent parts).

- ``Crew`` (crew.py): runnable like an agent: ``run``, ``run_sync``, ``stream``;
- the plan's modes (plan.py): ``Step``, ``Sequential``, ``Parallel``, ``Router``, ``Loop``,
  ``Graph`` + ``Task``, ``Manager``, ``Handoff``;
- context passing per edge (context.py): ``brief``, ``last_n:N``, ``summary``, ``full``, ``none``;
- tree-wide budgets (budget.py): ``Budget``; shared state (state.py): ``SharedState``;
- remote members (remote.py): ``RemoteAgent(url)`` / ``a2a_member(url)``, an A2A agent;
- crew files (file.py): ``Crew.from_file("crew.yaml")``, ``loom run --crew crew.yaml``.

See docs/crews.md.
"""

from loom.crew.budget import Budget, BudgetedModel, BudgetScope
from loom.crew.context import ContextPolicy
from loom.crew.crew import Crew
from loom.crew.plan import Graph, Handoff, Loop, Manager, Parallel, Router, Sequential, Step, Task
from loom.crew.remote import RemoteAgent, a2a_member
from loom.crew.result import CrewResult, MemberResult
from loom.crew.state import SharedState

__all__ = [
    "Budget",
    "BudgetScope",
    "BudgetedModel",
    "ContextPolicy",
    "Crew",
    "CrewResult",
    "Graph",
    "Handoff",
    "Loop",
    "Manager",
    "MemberResult",
    "Parallel",
    "RemoteAgent",
    "Router",
    "Sequential",
    "SharedState",
    "Step",
    "Task",
    "a2a_member",
]
