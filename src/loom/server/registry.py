"""The agents a server serves: from a directory of AGENT.md / YAML files or a Python object."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from loom.agent import Agent
from loom.errors import ConfigurationError

__all__ = ["AgentRegistry", "load_registry"]

_SUFFIXES = (".md", ".yaml", ".yml")


class AgentRegistry(Mapping[str, Agent]):
    """Agents by name (read-only once built). Names are unique."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._agents: dict[str, Agent] = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise ConfigurationError(
                    f"a registry holds Agent objects, got {type(agent).__name__}"
                )
            if agent.name in self._agents:
                raise ConfigurationError(
                    f"two agents are named {agent.name!r}; the names a server serves must be "
                    "unique (set name: in each AGENT.md)"
                )
            self._agents[agent.name] = agent

    def __getitem__(self, name: str) -> Agent:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def __repr__(self) -> str:
        return f"AgentRegistry({list(self._agents)})"

    @classmethod
    def from_dir(cls, directory: str | Path, **overrides: Any) -> AgentRegistry:
        """Every ``*.md`` / ``*.yaml`` / ``*.yml`` agent definition in ``directory``."""
        root = Path(directory)
        if not root.is_dir():
            raise ConfigurationError(f"{root} is not a directory of agent definitions")
        files = sorted(p for p in root.iterdir() if p.suffix.lower() in _SUFFIXES)
        if not files:
            raise ConfigurationError(
                f"{root} holds no agent definitions (*.md, *.yaml); add an AGENT.md or pass "
                "--app module:registry"
            )
        return cls(Agent.from_file(p, **overrides) for p in files)


def load_registry(spec: str) -> AgentRegistry:
    """``module:attr`` naming an ``AgentRegistry``, an ``Agent``, a list of agents, or a
    function (no arguments) returning one of those."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--app must be module:attr, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for --app: {exc}") from exc
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(value) and not isinstance(value, Agent | AgentRegistry):
        value = value()
    if isinstance(value, AgentRegistry):
        return value
    if isinstance(value, Agent):
        return AgentRegistry([value])
    if isinstance(value, Iterable):
        return AgentRegistry(value)
    raise ConfigurationError(
        f"{spec} is a {type(value).__name__}; give an AgentRegistry, an Agent or a list of agents"
    )
