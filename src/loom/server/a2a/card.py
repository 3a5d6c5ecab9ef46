"""An agent's A2A agent card: who it is, where its JSON-RPC and REST bindings are, its skills
(the agent itself and each of its tools) and, on a server with API keys, how to authenticate."""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    APIKeySecurityScheme,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

from loom.agent import Agent

__all__ = ["JSONRPC_PATH", "MEDIA_MODES", "REST_PATH", "agent_card", "describe", "input_modes"]

JSONRPC_PATH = "/agents/{name}/a2a"
REST_PATH = "/agents/{name}/a2a/rest"
TEXT_MODES = ["text/plain"]
MEDIA_MODES = {
    "image": ["image/png", "image/jpeg", "image/gif", "image/webp"],
    "file": ["application/pdf"],
    "audio": ["audio/wav", "audio/mpeg"],
}
"""The media types a card lists per kind of medium its agent's model reads (any other type is
taken as a file too, and its model's provider says whether it reads it)."""


def input_modes(agent: Agent) -> list[str]:
    """What the agent takes: text, JSON (data parts, read as text) and the media its model
    reads (its ``accepts_media``; a model string or a model that does not say: all of them)."""
    accepts = getattr(agent.model_spec, "accepts_media", None)
    kinds = MEDIA_MODES if accepts is None else [k for k in MEDIA_MODES if k in accepts]
    return [*TEXT_MODES, "application/json", *(t for k in kinds for t in MEDIA_MODES[k])]


def describe(agent: Agent) -> str:
    """The agent's description, else the first line of its instructions."""
    described = getattr(agent, "description", None)
    if isinstance(described, str) and described.strip():
        return described.strip()
    first = next((line.strip() for line in agent.instructions.splitlines() if line.strip()), "")
    return first or f"The Loom agent {agent.name}."


def agent_card(agent: Agent, base_url: str, version: str, *, keys: bool) -> AgentCard:
    """The card of ``agent`` as served from ``base_url`` (no trailing slash)."""
    name = agent.name
    skills = [
        AgentSkill(
            id=name,
            name=name,
            description=describe(agent),
            tags=["loom", *sorted(agent.tools)],
            input_modes=input_modes(agent),
            output_modes=TEXT_MODES,
        )
    ]
    for tool in agent.tools.values():
        skills.append(
            AgentSkill(
                id=f"{name}.{tool.name}",
                name=tool.name,
                description=tool.description or f"The {tool.name} tool.",
                tags=["tool"],
            )
        )
    card = AgentCard(
        name=name,
        description=describe(agent),
        version=version,
        provider=AgentProvider(organization="Loom", url=base_url),
        supported_interfaces=[
            AgentInterface(
                url=base_url + JSONRPC_PATH.format(name=name),
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            ),
            AgentInterface(
                url=base_url + REST_PATH.format(name=name),
                protocol_binding="HTTP+JSON",
                protocol_version="1.0",
            ),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=input_modes(agent),
        default_output_modes=TEXT_MODES,
        skills=skills,
    )
    if keys:  # the server's API keys, as either header the server accepts
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="A Loom server API key (loom serve --keys)."
                )
            )
        )
        card.security_schemes["apiKey"].CopyFrom(
            SecurityScheme(
                api_key_security_scheme=APIKeySecurityScheme(
                    location="header", name="x-api-key", description="A Loom server API key."
                )
            )
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
        card.security_requirements.append(SecurityRequirement(schemes={"apiKey": StringList()}))
    return card
