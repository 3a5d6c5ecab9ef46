"""Shared helpers of the sandbox tests: run one tool call through a real agent turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loom import Agent
from loom.messages import Message, ModelResponse, RunResult, ToolCall
from loom.testing import ScriptedModel

ALLOW = {"allow": ["bash", "python"]}
"""Permission rules that let the sandboxed tools run without asking (bash asks by default)."""


def calls(*pairs: tuple[str, dict[str, Any]]) -> ScriptedModel:
    """A model that asks for each (tool, arguments) in turn, one per step, then says done."""
    steps: list[ModelResponse | str] = [
        ModelResponse(tool_calls=[ToolCall(id=f"call_{i}", name=name, arguments=args)])
        for i, (name, args) in enumerate(pairs)
    ]
    return ScriptedModel([*steps, "done"])


def tool_messages(result: RunResult) -> list[Message]:
    return [m for m in result.messages if m.role == "tool"]


async def run_tool(tool: str, arguments: dict[str, Any], workspace: Path, **agent: Any) -> Message:
    """The tool message of one call of ``tool`` in an agent turn over ``workspace``."""
    agent.setdefault("permissions", ALLOW)
    a = Agent(tools=[tool], model=calls((tool, arguments)), workspace=workspace, **agent)
    result = await a.run("go")
    assert result.stop_reason == "completed", result.error
    (message,) = tool_messages(result)
    return message
