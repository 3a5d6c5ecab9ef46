"""A crew's plan: the modes as configuration (never as prompts), checked when the crew is built.

A plan is a tree of nodes. ``Step`` runs one member; the others arrange steps:

- ``Sequential(a, b, c)``: each output feeds the next, through the receiving step's context
  policy;
- ``Parallel(a, b, c)``: fan-out, results in declared order, a failure reported and the rest
  run on (``fail_fast=True`` cancels the rest instead);
- ``Router(branches, route=fn | by=member)``: a Python predicate, or a member that must choose
  one of the declared branch names through a tool whose argument is an enum of them;
- ``Loop(body, until=fn, max_iterations=n)``: repeats until ``until(output)`` or a member of the
  body calls ``exit_loop`` (which stops only the nearest loop);
- ``Graph({"t": Task("member", depends_on=[...])})``: seed 002's OrchestrationPlan; what is
  ready runs in parallel; a cycle is a ``CrewCycleError`` at build time;
- ``Manager("lead", workers=[...])``: hierarchical; the manager gets a ``delegate`` tool whose
  ``member`` is an enum of the workers; workers never see it;
- ``Handoff("triage", members=[...])``: a member hands the conversation to another through a
  ``transfer`` tool, with a brief.

``validate(plan, members)`` raises ``CrewDefinitionError`` naming the field of the first
problem (``plan.steps[1].member``).
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loom.crew.context import ContextPolicy, parse_policy
from loom.errors import CrewCycleError, CrewDefinitionError

__all__ = [
    "Graph",
    "Handoff",
    "Loop",
    "Manager",
    "Node",
    "Parallel",
    "Router",
    "Sequential",
    "Step",
    "Task",
    "validate",
]


@dataclass(frozen=True, slots=True)
class Step:
    """Run ``member`` once. ``task`` is a template for its message: ``{input}`` is the context
    handed over (per ``context``), ``{task}`` the crew's task; default ``"{input}"``."""

    member: str
    task: str | None = None
    context: ContextPolicy | str = "brief"
    name: str | None = None


@dataclass(frozen=True, slots=True, init=False)
class Sequential:
    """Run ``steps`` in order; each output is handed to the next."""

    steps: tuple[Node, ...]
    name: str | None

    def __init__(self, *steps: Node | str, name: str | None = None) -> None:
        object.__setattr__(self, "steps", tuple(_node(s) for s in steps))
        object.__setattr__(self, "name", name)


@dataclass(frozen=True, slots=True, init=False)
class Parallel:
    """Run ``steps`` at once on the same input; outputs gathered in declared order."""

    steps: tuple[Node, ...]
    fail_fast: bool
    name: str | None

    def __init__(
        self, *steps: Node | str, fail_fast: bool = False, name: str | None = None
    ) -> None:
        object.__setattr__(self, "steps", tuple(_node(s) for s in steps))
        object.__setattr__(self, "fail_fast", fail_fast)
        object.__setattr__(self, "name", name)


@dataclass(frozen=True, slots=True)
class Router:
    """Run one of ``branches``: the one ``route(input_text)`` names, or the one member ``by``
    chooses (it gets a ``choose_branch`` tool whose ``branch`` is an enum of the names).
    ``default`` runs when the choice names no branch; without it that is a recorded failure."""

    branches: Mapping[str, Node | str]
    route: Callable[[str], str] | None = None
    by: str | None = None
    default: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Loop:
    """Repeat ``body`` until ``until(output)`` is true or a body member calls ``exit_loop``
    (``exit_tool=True``), at most ``max_iterations`` times."""

    body: Node | str
    max_iterations: int = 5
    until: Callable[[str], bool] | None = None
    exit_tool: bool = True
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """A task of a ``Graph``: ``member`` runs once every task in ``depends_on`` has finished,
    and receives their outputs through ``context``."""

    member: str
    depends_on: Sequence[str] = ()
    task: str | None = None
    context: ContextPolicy | str = "brief"


@dataclass(frozen=True, slots=True)
class Graph:
    """A dependency graph of tasks: everything ready runs in parallel."""

    tasks: Mapping[str, Task]
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Manager:
    """``manager`` leads and delegates to ``workers`` with a ``delegate`` tool (``member`` is
    an enum of the workers; ``task`` is the brief it writes). ``max_delegations`` caps it."""

    manager: str
    workers: Sequence[str]
    max_delegations: int = 10
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Handoff:
    """``start`` answers first; any of ``members`` may hand the conversation to another with
    ``transfer(to, brief)``; the last member to answer without transferring gives the output."""

    start: str
    members: Sequence[str]
    max_handoffs: int = 5
    context: ContextPolicy | str = "brief"
    name: str | None = None


Node = Step | Sequential | Parallel | Router | Loop | Graph | Manager | Handoff
NODE_TYPES = (Step, Sequential, Parallel, Router, Loop, Graph, Manager, Handoff)


def _node(value: Any) -> Node:
    if isinstance(value, str):
        return Step(value)
    return value  # type: ignore[no-any-return]


def node_of(value: Any) -> Node:
    """A node from a node or a member name."""
    return _node(value)


def validate(plan: Any, members: Mapping[str, Any], where: str = "plan") -> None:
    """Raise ``CrewDefinitionError`` (naming the field) for the first problem in ``plan``."""
    node = _node(plan)
    if not isinstance(node, NODE_TYPES):
        raise CrewDefinitionError(
            f"is a {type(plan).__name__}, not a plan node (Step, "
            "Sequential, Parallel, Router, Loop, Graph, Manager, Handoff) "
            "or a member name",
            field=where,
        )
    if node.name is not None and (not node.name or "/" in node.name):
        raise CrewDefinitionError(
            "a node name must be non-empty and hold no '/'", field=f"{where}.name"
        )

    def member(name: Any, at: str) -> None:
        if name not in members:
            known = ", ".join(sorted(members)) or "(none)"
            raise CrewDefinitionError(
                f"names no member: {name!r}; the crew's members are {known}", field=at
            )

    def policy(value: Any, at: str) -> None:
        try:
            parse_policy(value)
        except CrewDefinitionError as exc:
            raise CrewDefinitionError(str(exc), field=at) from None

    if isinstance(node, Step):
        member(node.member, f"{where}.member")
        policy(node.context, f"{where}.context")
    elif isinstance(node, Sequential | Parallel):
        mode = type(node).__name__.lower()
        if not node.steps:
            raise CrewDefinitionError("has no steps", field=f"{where}.{mode}")
        for i, s in enumerate(node.steps):
            validate(s, members, f"{where}.{mode}[{i}]")
    elif isinstance(node, Router):
        if not node.branches:
            raise CrewDefinitionError(
                "a router needs at least one branch", field=f"{where}.router.branches"
            )
        if (node.route is None) == (node.by is None):
            raise CrewDefinitionError(
                "give exactly one of route (a Python predicate) or by (a member that chooses)",
                field=f"{where}.router.route",
            )
        if node.route is not None and not callable(node.route):
            raise CrewDefinitionError("must be callable", field=f"{where}.router.route")
        if node.by is not None:
            member(node.by, f"{where}.router.by")
        if node.default is not None and node.default not in node.branches:
            raise CrewDefinitionError(
                f"names no branch: {node.default!r}; branches are {', '.join(node.branches)}",
                field=f"{where}.router.default",
            )
        for name, b in node.branches.items():
            validate(b, members, f"{where}.router.branches.{name}")
    elif isinstance(node, Loop):
        if (
            not isinstance(node.max_iterations, int)
            or isinstance(node.max_iterations, bool)
            or node.max_iterations < 1
        ):
            raise CrewDefinitionError(
                f"must be an integer >= 1, got {node.max_iterations!r}",
                field=f"{where}.loop.max_iterations",
            )
        if node.until is None and not node.exit_tool:
            raise CrewDefinitionError(
                "the loop has no exit: give until (a predicate on the "
                "output) or keep exit_tool=True",
                field=f"{where}.loop.until",
            )
        validate(node.body, members, f"{where}.loop.body")
    elif isinstance(node, Graph):
        if not node.tasks:
            raise CrewDefinitionError("a graph needs at least one task", field=f"{where}.graph")
        for name, t in node.tasks.items():
            at = f"{where}.graph.{name}"
            if not isinstance(t, Task):
                raise CrewDefinitionError(f"is a {type(t).__name__}, not a Task", field=at)
            member(t.member, f"{at}.member")
            policy(t.context, f"{at}.context")
            for dep in t.depends_on:
                if dep not in node.tasks:
                    raise CrewDefinitionError(f"names no task: {dep!r}", field=f"{at}.depends_on")
        sorter = graphlib.TopologicalSorter({n: list(t.depends_on) for n, t in node.tasks.items()})
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            cycle = " -> ".join(exc.args[1])
            raise CrewCycleError(
                f"the dependency graph has a cycle: {cycle}; no task on it could ever start",
                field=f"{where}.graph",
            ) from None
    elif isinstance(node, Manager):
        member(node.manager, f"{where}.manager.manager")
        if not node.workers:
            raise CrewDefinitionError("a manager needs workers", field=f"{where}.manager.workers")
        for i, w in enumerate(node.workers):
            member(w, f"{where}.manager.workers[{i}]")
            if w == node.manager:
                raise CrewDefinitionError(
                    "the manager cannot be its own worker", field=f"{where}.manager.workers[{i}]"
                )
        if node.max_delegations < 1:
            raise CrewDefinitionError("must be >= 1", field=f"{where}.manager.max_delegations")
    elif isinstance(node, Handoff):
        member(node.start, f"{where}.handoff.start")
        if node.start not in node.members:
            raise CrewDefinitionError(
                "the start member must be one of members", field=f"{where}.handoff.start"
            )
        for i, m in enumerate(node.members):
            member(m, f"{where}.handoff.members[{i}]")
        if len(node.members) < 2:
            raise CrewDefinitionError(
                "a handoff needs at least two members", field=f"{where}.handoff.members"
            )
        if node.max_handoffs < 1:
            raise CrewDefinitionError("must be >= 1", field=f"{where}.handoff.max_handoffs")
        policy(node.context, f"{where}.handoff.context")
