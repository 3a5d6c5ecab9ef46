"""The tools a crew gives its members: built per member run, never shared, never seen by
anyone they are not for (workers never see ``delegate``; only a loop's members see
``exit_loop``).

``CrewTool`` takes an explicit JSON schema, so a choice among members or branches is an
``enum`` the model is told about (and that constrained decoders such as the embedded model's
enforce), and ``validate`` checks it again on our side: a name outside the enum is a tool
error the model reads, never a run of something that does not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loom.errors import ToolArgumentsError
from loom.messages import Effect, ToolSpec
from loom.tools.base import RunContext

__all__ = ["CrewTool", "choice_tool"]


class CrewTool:
    """A tool with a hand-written JSON schema (string and integer properties, enums)."""

    def __init__(
        self,
        name: str,
        description: str,
        properties: dict[str, dict[str, Any]],
        run: Callable[[RunContext, dict[str, Any]], Awaitable[Any]],
        *,
        required: Sequence[str] | None = None,
        effect: Effect = "at_most_once",
        timeout: float | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.required = list(properties if required is None else required)
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": self.required,
            "additionalProperties": False,
        }
        self._run = run
        self.effect: Effect = effect
        self.timeout = timeout

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        props = self.parameters["properties"]
        for key in arguments:
            if key not in props:
                raise ToolArgumentsError(
                    f"{self.name}: unknown argument {key!r}; expected {', '.join(props) or 'none'}"
                )
        for key in self.required:
            if key not in arguments:
                raise ToolArgumentsError(f"{self.name}: missing argument {key!r}")
        for key, value in arguments.items():
            schema = props[key]
            kind = schema.get("type")
            if kind == "string" and not isinstance(value, str):
                raise ToolArgumentsError(f"{self.name}: {key} must be a string")
            if kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ToolArgumentsError(f"{self.name}: {key} must be an integer")
            if "enum" in schema and value not in schema["enum"]:
                raise ToolArgumentsError(
                    f"{self.name}: {key}={value!r} is not one of "
                    f"{', '.join(map(str, schema['enum']))}"
                )
        return arguments

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        return await self._run(ctx, arguments)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def __repr__(self) -> str:
        return f"CrewTool({self.name!r})"


def choice_tool(
    name: str,
    description: str,
    key: str,
    choices: Sequence[str],
    run: Callable[[RunContext, dict[str, Any]], Awaitable[Any]],
    extra: dict[str, dict[str, Any]] | None = None,
) -> CrewTool:
    """A tool whose ``key`` argument is an enum of ``choices`` (plus ``extra`` properties)."""
    props: dict[str, dict[str, Any]] = {key: {"type": "string", "enum": list(choices)}}
    props.update(extra or {})
    return CrewTool(name, description, props, run)
