"""Agent definitions from AGENT.md and YAML files."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom import Agent, tool
from loom.errors import AgentDefinitionError
from loom.testing import ScriptedModel

GOOD = """---
name: helper
model: demo
tools: [add, shout]
max_iterations: 4
tool_timeout: 5
---
You help with sums.

Be brief.
"""


@tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def test_agent_md_loads(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(GOOD)
    agent = Agent.from_file(path, tools=[shout])
    assert agent.name == "helper"
    assert agent.instructions == "You help with sums.\n\nBe brief."
    assert sorted(agent.tools) == ["add", "shout"]
    assert (agent.max_iterations, agent.tool_timeout) == (4, 5)
    assert agent.model.name == "demo"


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(GOOD)
    agent = Agent.from_file(path, tools=[shout], model=ScriptedModel(["hi"]))
    assert agent.run_sync("hello").output == "hi"


def test_yaml_definition(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("name: y\ninstructions: Do it.\nmodel: demo\n")
    assert Agent.from_file(path).instructions == "Do it."


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("no front matter", None, "must start with a '---'"),
        ("---\nname: x\n", None, "not closed"),
        ("---\nname: [unclosed\n---\nbody", None, "invalid YAML"),
        ("---\n- a list\n---\nbody", None, "mapping"),
        ("---\nmodel: demo\n---\nbody", "name", "Field required"),
        ("---\nname: x\nmax_iterations: 0\n---\nbody", "max_iterations", "greater than 0"),
        ("---\nname: x\ncolour: blue\n---\nbody", "colour", "Extra inputs"),
        ("---\nname: x\ntools: [no_such_tool]\n---\nbody", "tools", "no built-in tool"),
        ("---\nname: x\ninstructions: a\n---\nbody", "instructions", "both"),
    ],
)
def test_bad_files_name_the_problem(
    tmp_path: Path, text: str, field: str | None, message: str
) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(text)
    with pytest.raises(AgentDefinitionError, match=message) as info:
        Agent.from_file(path)
    assert str(path) in str(info.value)
    if field:
        assert info.value.field == field or f"'{field}'" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AgentDefinitionError, match="file not found"):
        Agent.from_file(tmp_path / "nope.md")


@pytest.mark.parametrize("path", sorted(Path(__file__).parent.parent.glob("examples/agents/*.md")))
def test_shipped_example_agents_load(path: Path) -> None:
    agent = Agent.from_file(path)
    assert agent.name == path.stem
    assert agent.instructions


def test_model_settings_in_a_file_reach_the_agent_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(
        "---\nname: shop\nmodel: demo\ntools: [add]\n"
        "model_settings: {max_tokens: 160, tool_choice: add, temperature: 0}\n---\nSum.\n"
    )
    agent = Agent.from_file(path)
    ms = agent.model_settings
    assert ms is not None and (ms.max_tokens, ms.tool_choice, ms.temperature) == (160, "add", 0)
    assert ms.reset_tool_choice is True  # a forced choice holds for the first call only
    again = tmp_path / "again.md"
    again.write_text(agent.to_definition().to_markdown())
    back = Agent.from_file(again).model_settings
    assert back is not None and (back.max_tokens, back.tool_choice) == (160, "add")


def test_a_bad_model_setting_names_its_field(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text("---\nname: shop\nmodel: demo\nmodel_settings: {tool_choise: add}\n---\nx\n")
    with pytest.raises(AgentDefinitionError) as info:
        Agent.from_file(path)
    assert "model_settings.tool_choise" in str(info.value)


def test_a_parsed_definition_builds_the_agent_its_file_does(tmp_path: Path) -> None:
    from loom.definition import parse_definition

    (tmp_path / "ws").mkdir()
    path = tmp_path / "AGENT.md"
    path.write_text(GOOD.replace("tool_timeout: 5\n", "tool_timeout: 5\nworkspace: ws\n"))
    definition = parse_definition(path)
    built = Agent.from_definition(definition, path=path, tools=[shout], max_iterations=2)
    loaded = Agent.from_file(path, tools=[shout], max_iterations=2)
    assert built.to_definition() == loaded.to_definition()
    assert built.workspace == (tmp_path / "ws").resolve()  # resolved from the file's folder
    assert built.max_iterations == 2  # overrides win over the definition


@pytest.mark.parametrize(
    "metadata",
    [
        "[" * 5000 + "]" * 5000,  # the parser recurses once per level
        "\n" + "".join("  " * i + "a:\n" for i in range(1, 300)),  # parses; too deep to use
    ],
    ids=["flow", "block"],
)
def test_deeply_nested_yaml_is_a_definition_error(tmp_path: Path, metadata: str) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(f"---\nname: deep\nmetadata: {metadata}\n---\nYou are deep.\n")
    with pytest.raises(AgentDefinitionError, match="nested too deep"):
        Agent.from_file(path)
    from loom.server.registry import AgentRegistry

    (tmp_path / "deep.yaml").write_text(f"name: deep2\nmetadata: {metadata}\n")
    with pytest.raises(AgentDefinitionError, match="nested too deep"):
        AgentRegistry.from_dir(tmp_path)


DESCRIBED = """---
name: reviewer
description: Reviews pull requests for security problems and answers with a verdict.
---
You are a careful reviewer. You read every line of the diff, and you never approve code
that builds SQL from user input.
"""


async def test_the_description_is_what_clients_are_shown(tmp_path: Path) -> None:
    """AGENT.md ``description:`` is the agent's, and what MCP tools, A2A cards and assistants
    show (not the instructions' first line, cut mid-sentence)."""
    pytest.importorskip("mcp")
    import mcp

    from loom.engine.runtime import Runtime
    from loom.mcp_server import build_server
    from loom.server.a2a.card import describe

    path = tmp_path / "AGENT.md"
    path.write_text(DESCRIBED)
    agent = Agent.from_file(path)
    wanted = "Reviews pull requests for security problems and answers with a verdict."
    assert agent.description == wanted
    assert describe(agent) == wanted
    assert Agent.from_file(path).to_definition().description == wanted  # round trip
    server = build_server(lambda ctx: ({agent.name: agent}, Runtime()))
    async with mcp.Client(server) as client:
        tools = (await client.list_tools()).tools
    assert [t.description for t in tools] == [wanted]
    # without one, the instructions' first line still says what the agent is for
    plain = Agent(name="p", instructions="You add numbers.\nMore.", model=ScriptedModel([]))
    assert plain.description == "" and describe(plain) == "You add numbers."


def test_prompt_caching_is_set_per_agent_in_its_file(tmp_path: Path) -> None:
    path = tmp_path / "AGENT.md"
    path.write_text(
        "---\nname: shop\nmodel: demo\n"
        "model_settings: {prompt_cache: false, cache_retention: 24h}\n---\nSum.\n"
    )
    ms = Agent.from_file(path).model_settings
    assert ms is not None and (ms.prompt_cache, ms.cache_retention) == (False, "24h")
    again = tmp_path / "again.md"
    again.write_text(Agent.from_file(path).to_definition().to_markdown())
    back = Agent.from_file(again).model_settings
    assert back is not None and (back.prompt_cache, back.cache_retention) == (False, "24h")
    path.write_text("---\nname: shop\nmodel: demo\nmodel_settings: {cache_retention: 1w}\n---\nx\n")
    with pytest.raises(AgentDefinitionError, match="cache_retention"):
        Agent.from_file(path)
