"""Crew files: a crew in YAML, its members inline or as agent files (AGENT.md / YAML).

```yaml
name: blog
budget: {tokens: 50000, max_spawns: 10}
members:
  researcher: researcher.md            # an agent file, relative to this file
  writer:                              # or an agent definition inline (AGENT.md's fields)
    instructions: You write short posts.
    model: local
plan:
  sequential:
    - researcher
    - {member: writer, context: "last_n:4", task: "Write a post from: {input}"}
```

Plan nodes: a member name; ``{member, task, context, name}`` (a step); ``{sequential: [...]}``;
``{parallel: [...], fail_fast}``; ``{router: {branches: {name: node}, by: member | route:
module:function, default}}``; ``{loop: {body: node, max_iterations, until: module:function,
exit_tool}}``; ``{graph: {task: {member, depends_on, task, context}}}``; ``{manager: {manager,
workers, max_delegations}}``; ``{handoff: {start, members, max_handoffs, context}}``. Every
problem is a ``CrewDefinitionError`` naming the file and the field.

``load_crew_definition`` reads a file into a ``CrewDefinition`` (agent members as
``AgentDefinition`` s, remote ones as ``RemoteAgent``); ``Crew.from_file`` /
``Crew.from_definition`` build the crew from it. This module knows definitions, not ``Agent`` or
``Crew``.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from loom.crew.budget import Budget
from loom.crew.plan import (
    Graph,
    Handoff,
    Loop,
    Manager,
    Node,
    Parallel,
    Router,
    Sequential,
    Step,
    Task,
)
from loom.errors import ConfigurationError, CrewDefinitionError
from loom.text import TOO_DEEP, nested_too_deep

if TYPE_CHECKING:
    from loom.crew.remote import RemoteAgent
    from loom.definition import AgentDefinition

__all__ = ["AgentMember", "CrewDefinition", "load_crew_definition", "parse_node"]

_TOP = {"name", "members", "plan", "budget", "shared_state", "ref_threshold", "description"}
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MODES = ("sequential", "parallel", "router", "loop", "graph", "manager", "handoff")


@dataclass(frozen=True, slots=True)
class AgentMember:
    """An agent member of a crew file: its definition, and the file whose folder its relative
    paths (``workspace``, MCP servers' ``cwd``) are resolved from."""

    definition: AgentDefinition
    path: Path


@dataclass(frozen=True, slots=True)
class CrewDefinition:
    """A crew file, parsed and checked: what ``Crew.from_definition`` builds a crew from."""

    name: str
    members: Mapping[str, AgentMember | RemoteAgent]
    plan: Node
    path: Path
    budget: Budget | None = None
    shared_state: bool = False
    ref_threshold: int | None = None


def load_crew_definition(path: Path) -> CrewDefinition:
    """Read and validate the crew file at ``path`` (``CrewDefinitionError`` naming the field)."""
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CrewDefinitionError("file not found", path=where) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CrewDefinitionError(f"cannot read the file: {exc}", path=where) from None
    except yaml.YAMLError as exc:
        raise CrewDefinitionError(f"invalid YAML: {exc}", path=where) from None
    except RecursionError:  # the parser recurses once per level
        raise CrewDefinitionError(TOO_DEEP, path=where) from None
    if nested_too_deep(data):  # what builds the crew recurses too
        raise CrewDefinitionError(TOO_DEEP, path=where)
    if not isinstance(data, dict):
        raise CrewDefinitionError("a crew file is a mapping (name, members, plan)", path=where)
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise CrewDefinitionError(
            f"unknown field; a crew file has {', '.join(sorted(_TOP))}",
            path=where,
            field=unknown[0],
        )
    for need in ("name", "members", "plan"):
        if need not in data:
            raise CrewDefinitionError("is required", path=where, field=need)
    try:
        members = _members(data["members"], path)
        plan = parse_node(data["plan"], "plan")
        budget = _budget(data.get("budget"))
        return CrewDefinition(
            name=str(data["name"]),
            members=members,
            plan=plan,
            path=path,
            budget=budget,
            shared_state=bool(data.get("shared_state", False)),
            ref_threshold=data.get("ref_threshold"),
        )
    except CrewDefinitionError as exc:
        raise type(exc)(exc.detail, path=where, field=exc.field) from None
    except ConfigurationError as exc:
        raise CrewDefinitionError(str(exc), path=where) from None


def _remote(spec: dict[str, Any], at: str) -> RemoteAgent:
    from loom.crew.remote import RemoteAgent

    _fields(spec, {"a2a", "headers", "timeout", "connect_timeout"}, at)
    url = spec["a2a"]
    if not isinstance(url, str):
        raise CrewDefinitionError(
            "the remote agent's URL (http://host/agents/<name>)", field=f"{at}.a2a"
        )
    raw_headers = spec.get("headers") or {}
    if not isinstance(raw_headers, dict):
        raise CrewDefinitionError("a mapping of header name to value", field=f"{at}.headers")
    headers = {}
    for key, value in raw_headers.items():
        # secrets stay out of the file: ${VAR} is read from the environment
        headers[str(key)] = _expand(str(value), f"{at}.headers.{key}")
    options = {k: spec[k] for k in ("timeout", "connect_timeout") if k in spec}
    for k, v in options.items():
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise CrewDefinitionError(f"must be a number of seconds, got {v!r}", field=f"{at}.{k}")
    try:
        return RemoteAgent(url, headers=headers, **options)
    except ConfigurationError as exc:
        raise CrewDefinitionError(str(exc), field=f"{at}.a2a") from None


def _expand(text: str, at: str) -> str:
    def env(match: re.Match[str]) -> str:
        value = os.environ.get(match.group(1))
        if value is None:
            raise CrewDefinitionError(
                f"the environment variable {match.group(1)} is not set", field=at
            )
        return value

    return _ENV_VAR.sub(env, text)


def _members(raw: Any, path: Path) -> dict[str, AgentMember | RemoteAgent]:
    from loom.definition import AgentDefinition, parse_definition

    if not isinstance(raw, dict) or not raw:
        raise CrewDefinitionError(
            "a mapping of member name to an agent file or definition", field="members"
        )
    out: dict[str, AgentMember | RemoteAgent] = {}
    for name, spec in raw.items():
        at = f"members.{name}"
        if isinstance(spec, dict) and "a2a" in spec:
            out[name] = _remote(spec, at)
        elif isinstance(spec, str):
            file = (path.parent / spec).resolve()
            try:
                out[name] = AgentMember(parse_definition(file), file)
            except ConfigurationError as exc:
                raise CrewDefinitionError(str(exc), field=at) from None
        elif isinstance(spec, dict):
            from pydantic import ValidationError

            try:
                d = AgentDefinition.model_validate({"name": name, **spec})
            except ValidationError as exc:
                first = exc.errors()[0]
                sub = ".".join(str(p) for p in first["loc"])
                raise CrewDefinitionError(first["msg"], field=f"{at}.{sub}") from None
            out[name] = AgentMember(d, path)  # built as an AGENT.md file's (tools, MCP, ...)
        else:
            raise CrewDefinitionError(
                "an agent file path, an inline definition or {a2a: url}", field=at
            )
    return out


def _budget(raw: Any) -> Budget | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CrewDefinitionError("a mapping of budget names to limits", field="budget")
    known = {
        "tokens",
        "cost_usd",
        "wall_seconds",
        "max_depth",
        "max_fan_out",
        "max_spawns",
        "prices",
    }
    for key in raw:
        if key not in known:
            raise CrewDefinitionError(
                f"unknown budget; use {', '.join(sorted(known))}", field=f"budget.{key}"
            )
    prices = {k: (float(v[0]), float(v[1])) for k, v in (raw.get("prices") or {}).items()}
    return Budget(**{**raw, "prices": prices})


def _function(spec: Any, at: str) -> Callable[..., Any]:
    if not isinstance(spec, str) or ":" not in spec:
        raise CrewDefinitionError("name a Python function as module:function", field=at)
    module, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CrewDefinitionError(f"cannot import {spec!r}: {exc}", field=at) from None
    if not callable(fn):
        raise CrewDefinitionError(f"{spec!r} is not callable", field=at)
    return fn  # type: ignore[no-any-return]


def _fields(raw: dict[str, Any], allowed: set[str], at: str) -> None:
    for key in raw:
        if key not in allowed:
            raise CrewDefinitionError(
                f"unknown field; expected {', '.join(sorted(allowed))}", field=f"{at}.{key}"
            )


def parse_node(raw: Any, at: str) -> Node:
    """One plan node from its YAML form (see the module docstring)."""
    if isinstance(raw, str):
        return Step(raw)
    if not isinstance(raw, dict):
        raise CrewDefinitionError("a plan node is a member name or a mapping", field=at)
    if "member" in raw:
        _fields(raw, {"member", "task", "context", "name"}, at)
        return Step(raw["member"], raw.get("task"), raw.get("context", "brief"), raw.get("name"))
    modes = [k for k in raw if k in _MODES]
    if len(modes) != 1:
        raise CrewDefinitionError(f"give exactly one of member, {', '.join(_MODES)}", field=at)
    mode = modes[0]
    body = raw[mode]
    name = raw.get("name")
    here = f"{at}.{mode}"
    if mode in ("sequential", "parallel"):
        _fields(raw, {mode, "name", "fail_fast"}, at)
        if not isinstance(body, list) or not body:
            raise CrewDefinitionError("a non-empty list of steps", field=here)
        steps = [parse_node(s, f"{here}[{i}]") for i, s in enumerate(body)]
        if mode == "sequential":
            return Sequential(*steps, name=name)
        return Parallel(*steps, fail_fast=bool(raw.get("fail_fast", False)), name=name)
    if not isinstance(body, dict):
        raise CrewDefinitionError("a mapping", field=here)
    _fields(raw, {mode, "name"}, at)
    if mode == "router":
        _fields(body, {"branches", "by", "route", "default"}, here)
        branches = body.get("branches")
        if not isinstance(branches, dict) or not branches:
            raise CrewDefinitionError(
                "a router needs branches: {name: node}", field=f"{here}.branches"
            )
        route = _function(body["route"], f"{here}.route") if "route" in body else None
        nodes = {k: parse_node(v, f"{here}.branches.{k}") for k, v in branches.items()}
        return Router(nodes, route=route, by=body.get("by"), default=body.get("default"), name=name)
    if mode == "loop":
        _fields(body, {"body", "max_iterations", "until", "exit_tool"}, here)
        if "body" not in body:
            raise CrewDefinitionError("is required", field=f"{here}.body")
        if "max_iterations" not in body:
            raise CrewDefinitionError(
                "a loop needs max_iterations (its hard stop)", field=f"{here}.max_iterations"
            )
        until = _function(body["until"], f"{here}.until") if "until" in body else None
        return Loop(
            parse_node(body["body"], f"{here}.body"),
            body["max_iterations"],
            until,
            bool(body.get("exit_tool", True)),
            name,
        )
    if mode == "graph":
        tasks = {}
        for tname, t in body.items():
            tat = f"{here}.{tname}"
            if not isinstance(t, dict) or "member" not in t:
                raise CrewDefinitionError(
                    "a task is {member, depends_on, task, context}", field=tat
                )
            _fields(t, {"member", "depends_on", "task", "context"}, tat)
            tasks[tname] = Task(
                t["member"],
                tuple(t.get("depends_on") or ()),
                t.get("task"),
                t.get("context", "brief"),
            )
        return Graph(tasks, name=name)
    if mode == "manager":
        _fields(body, {"manager", "workers", "max_delegations"}, here)
        return Manager(
            body.get("manager", ""),
            tuple(body.get("workers") or ()),
            int(body.get("max_delegations", 10)),
            name,
        )
    _fields(body, {"start", "members", "max_handoffs", "context"}, here)
    return Handoff(
        body.get("start", ""),
        tuple(body.get("members") or ()),
        int(body.get("max_handoffs", 5)),
        body.get("context", "brief"),
        name,
    )
