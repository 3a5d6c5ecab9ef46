"""The agents a server serves: from a directory of AGENT.md / YAML files or a Python object.

A registry also holds crews (``loom.crew.Crew``), served as assistants / models beside the
agents: ``registry.crews`` by name. The mapping itself stays one of agents (what every
agent-only path reads); ``served(name)`` answers either. Names are unique across both.
"""

from __future__ import annotations

import hashlib
import importlib
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from loom.agent import Agent
from loom.errors import ConfigurationError

if TYPE_CHECKING:
    from loom.crew import Crew

__all__ = ["AgentRegistry", "assistant_uuid", "load_registry"]

_SUFFIXES = (".md", ".yaml", ".yml")

# When each agent or crew object was first served (its definition file's last change when it
# came from one): what assistant lists report as created_at, the same in every key's view.
_CREATED: weakref.WeakKeyDictionary[Agent | Crew, datetime] = weakref.WeakKeyDictionary()
# A crew file's content hash: its revision (an agent's comes from ``loom.definition``).
_CREW_REVISIONS: weakref.WeakKeyDictionary[Crew, str] = weakref.WeakKeyDictionary()


def assistant_uuid(name: str) -> str:
    """The UUID form of an assistant (agent or crew) name: ``uuid5(NAMESPACE_URL,
    "loom:agent:<name>")``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"loom:agent:{name}"))


class AgentRegistry(Mapping[str, Agent]):
    """Agents by name (read-only once built), and crews by name in ``crews``. Names are unique
    across both."""

    def __init__(self, agents: Iterable[Agent | Crew] = ()) -> None:
        from loom.crew import Crew

        self._agents: dict[str, Agent] = {}
        self.crews: dict[str, Crew] = {}
        for agent in agents:
            if not isinstance(agent, Agent | Crew):
                raise ConfigurationError(
                    f"a registry holds Agent and Crew objects, got {type(agent).__name__}"
                )
            if agent.name in self._agents or agent.name in self.crews:
                raise ConfigurationError(
                    f"two agents or crews are named {agent.name!r}; the names a server serves "
                    "must be unique (set name: in each AGENT.md or crew file)"
                )
            if isinstance(agent, Crew):
                self.crews[agent.name] = agent
            else:
                self._agents[agent.name] = agent
            _CREATED.setdefault(agent, datetime.now(UTC))

    def served(self, name: str) -> Agent | Crew | None:
        """The agent or crew served as ``name`` (None: neither)."""
        return self._agents.get(name) or self.crews.get(name)

    def find(self, assistant_id: str) -> Agent | Crew | None:
        """The agent or crew served as ``assistant_id``: its name or its UUID form
        (``assistant_uuid``); None: neither."""
        found = self.served(assistant_id)
        if found is not None:
            return found
        return next(
            (self.served(n) for n in self.names() if assistant_uuid(n) == assistant_id), None
        )

    def created_at(self, name: str) -> datetime:
        """When the agent or crew ``name`` was defined: its definition file's last change, or
        when this process first served the object (a ``KeyError`` for a name not served)."""
        served = self.served(name)
        if served is None:
            raise KeyError(name)
        return _CREATED[served]

    def revision(self, name: str) -> str | None:
        """The revision of the agent or crew ``name``: ``sha256:<hex>`` of its definition file,
        or (an agent built in Python) of its definition's stable fields
        (``loom.definition.revision_of``); None for a crew built in Python or a name not
        served. Every run the server starts records it."""
        from loom.definition import revision_of

        served = self.served(name)
        if isinstance(served, Agent):
            return revision_of(served)
        return None if served is None else _CREW_REVISIONS.get(served)

    def names(self) -> list[str]:
        """Every name served: the agents', then the crews'."""
        return [*self._agents, *self.crews]

    def __getitem__(self, name: str) -> Agent:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def __repr__(self) -> str:
        return f"AgentRegistry({self.names()})"

    @classmethod
    def from_dir(cls, directory: str | Path, **overrides: Any) -> AgentRegistry:
        """Every ``*.md`` / ``*.yaml`` / ``*.yml`` agent definition in ``directory``, and every
        crew file there (``*.crew.yaml``, or a YAML file with a ``plan:`` key); ``overrides``
        go to the agents."""
        from loom.crew import Crew

        root = Path(directory)
        if not root.is_dir():
            raise ConfigurationError(f"{root} is not a directory of agent definitions")
        files = sorted(p for p in root.iterdir() if p.suffix.lower() in _SUFFIXES)
        if not files:
            raise ConfigurationError(
                f"{root} holds no agent definitions (*.md, *.yaml); add an AGENT.md or pass "
                "--app module:registry"
            )
        served: list[Agent | Crew] = []
        for p in files:
            one = Crew.from_file(p) if is_crew_file(p) else Agent.from_file(p, **overrides)
            if isinstance(one, Crew):
                _CREW_REVISIONS[one] = f"sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}"
            _CREATED[one] = datetime.fromtimestamp(p.stat().st_mtime, UTC)
            served.append(one)
        return cls(served)


def is_crew_file(path: Path) -> bool:
    """Whether ``path`` is a crew file: named ``*.crew.yaml`` / ``*.crew.yml``, or a YAML
    mapping with a ``plan:`` key (an agent definition has none)."""
    name = path.name.lower()
    if name.endswith((".crew.yaml", ".crew.yml")):
        return True
    if path.suffix.lower() not in (".yaml", ".yml"):
        return False
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False  # the agent loader reports what is wrong with it
    return isinstance(data, dict) and "plan" in data


def load_registry(spec: str) -> AgentRegistry:
    """``module:attr`` naming an ``AgentRegistry``, an ``Agent`` or a ``Crew``, a list of
    them, or a function (no arguments) returning one of those."""
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
    from loom.crew import Crew

    if callable(value) and not isinstance(value, Agent | Crew | AgentRegistry):
        value = value()
    if isinstance(value, AgentRegistry):
        return value
    if isinstance(value, Agent | Crew):
        return AgentRegistry([value])
    if isinstance(value, Iterable):
        return AgentRegistry(value)
    raise ConfigurationError(
        f"{spec} is a {type(value).__name__}; give an AgentRegistry, an Agent, a Crew or a list "
        "of them"
    )
