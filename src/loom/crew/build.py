"""A crew built from a ``CrewDefinition`` (``loom.crew.file``): its agent members become
``Agent`` s (``Agent.from_definition``), then the crew is made with ``make`` (``Crew``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from loom.agent import Agent
from loom.crew.file import AgentMember, CrewDefinition
from loom.crew.remote import RemoteAgent
from loom.errors import ConfigurationError, CrewDefinitionError

__all__ = ["build_crew"]

Built = TypeVar("Built")


def build_crew(
    make: Callable[..., Built], definition: CrewDefinition, overrides: Mapping[str, Any]
) -> Built:
    """``make(name, members=..., plan=..., ...)`` for ``definition``; ``overrides`` win over the
    file. A member or a crew the file describes wrongly is a ``CrewDefinitionError`` naming the
    file and the field."""
    where = str(definition.path)
    members: dict[str, Agent | RemoteAgent] = {}
    for name, member in definition.members.items():
        if isinstance(member, AgentMember):
            try:
                members[name] = Agent.from_definition(member.definition, path=member.path)
            except ConfigurationError as exc:
                raise CrewDefinitionError(str(exc), path=where, field=f"members.{name}") from None
        else:
            members[name] = member
    arguments: dict[str, Any] = {
        "members": members,
        "plan": definition.plan,
        "budget": definition.budget,
        "shared_state": definition.shared_state,
        "ref_threshold": definition.ref_threshold,
        **overrides,
    }
    try:
        return make(definition.name, **arguments)
    except CrewDefinitionError as exc:
        raise type(exc)(exc.detail, path=where, field=exc.field) from None
    except ConfigurationError as exc:
        raise CrewDefinitionError(str(exc), path=where) from None
