"""Agent construction: validation with messages that name the field."""

from __future__ import annotations

import pytest

from loom import Agent, tool
from loom.errors import AgentDefinitionError
from loom.testing import ScriptedModel


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        ({"timeout": 0}, "timeout"),
        ({"tool_timeout": "soon"}, "tool_timeout"),
        ({"max_iterations": True}, "max_iterations"),
        ({"model": 42}, "model"),
        ({"tools": [42]}, "tools"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(AgentDefinitionError) as info:
        Agent(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_duplicate_tool_names_are_refused() -> None:
    @tool(name="add")
    def my_add(a: int) -> int:
        """Mine."""
        return a

    with pytest.raises(AgentDefinitionError, match="unique"):
        Agent(tools=["add", my_add])


def test_plain_functions_become_tools() -> None:
    def double(x: int) -> int:
        """Double it."""
        return 2 * x

    agent = Agent(tools=[double], model=ScriptedModel(["x"]))
    assert agent.tool_specs[0].name == "double"
    assert agent.tool_specs[0].description == "Double it."


def test_unknown_model_provider_fails_at_construction() -> None:
    # the provider is checked when the agent is built (issue 12 #17), the model loaded later
    from loom.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown model provider 'nosuch'"):
        Agent(model="nosuch:thing")


def test_model_string_is_loaded_lazily() -> None:
    # a known provider is not loaded until the first run needs it
    agent = Agent(model="openai-compatible:http://127.0.0.1:9/v1#m")
    assert agent.model_spec == "openai-compatible:http://127.0.0.1:9/v1#m"
