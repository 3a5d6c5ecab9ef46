"""@tool: schemas from signatures and docstrings, validation, RunContext, sync and async."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from loom import RunContext, tool
from loom.errors import ToolDefinitionError
from loom.tools.base import FunctionTool, ToolArgumentsError


def ctx() -> RunContext:
    return RunContext(session_id="s", run_id="r", tool_call_id="c")


def test_schema_and_descriptions_come_from_signature_and_docstring() -> None:
    @tool
    def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast") -> list[str]:
        """Search the notes.

        Args:
            query: Words to look for.
            limit: At most this many hits.
            mode: How hard to look.
        """
        return []

    assert search.name == "search"
    assert search.description == "Search the notes."
    props = search.parameters["properties"]
    assert props["query"] == {"type": "string", "description": "Words to look for."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["mode"]["enum"] == ["fast", "deep"]
    assert search.parameters["required"] == ["query"]
    assert search.parameters["additionalProperties"] is False


def test_run_context_parameter_is_hidden_from_the_schema() -> None:
    @tool
    def whoami(ctx: RunContext, loud: bool = False) -> str:
        """Say the session."""
        return ctx.session_id

    assert list(whoami.parameters["properties"]) == ["loud"]
    assert asyncio.run(whoami.run(ctx(), {"loud": True})) == "s"


def test_validation_coerces_and_reports_problems_for_the_model() -> None:
    @tool
    def area(width: float, height: float) -> float:
        """Area."""
        return width * height

    assert area.validate({"width": "2", "height": 3}) == {"width": 2.0, "height": 3.0}
    with pytest.raises(ToolArgumentsError, match="height: Field required"):
        area.validate({"width": 2})


async def test_sync_tools_run_in_a_worker_thread_async_on_the_loop() -> None:
    main = threading.get_ident()

    @tool
    def where() -> int:
        """Thread id."""
        return threading.get_ident()

    @tool(blocking=False)
    def inline() -> int:
        """Thread id."""
        return threading.get_ident()

    assert await where.run(ctx(), {}) != main
    assert await inline.run(ctx(), {}) == main


def test_options_are_validated() -> None:
    def f() -> None:
        """F."""

    with pytest.raises(ToolDefinitionError, match="timeout must be > 0"):
        tool(timeout=0)(f)
    with pytest.raises(ToolDefinitionError, match="effect must be"):
        tool(effect="sometimes")(f)  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="name"):
        tool(name="has space")(f)

    def star(*args: int) -> None:
        """Star."""

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        tool(star)
    with pytest.raises(ToolDefinitionError, match="needs a function"):
        FunctionTool(42)  # type: ignore[arg-type]


def test_idempotency_key_is_stable() -> None:
    assert ctx().idempotency_key == "r:c"


def test_tool_errors_belong_to_the_loom_error_tree() -> None:
    import loom.errors as errors
    from loom.tools.mcp import MCPServerError

    assert issubclass(ToolArgumentsError, errors.ToolError)
    assert issubclass(MCPServerError, errors.ToolError)
    assert ToolArgumentsError is errors.ToolArgumentsError
    assert MCPServerError is errors.MCPServerError
    assert ToolArgumentsError("x").code == "invalid_arguments"
    assert MCPServerError("x").code == "mcp_unavailable"
    # never raised anywhere (a denied call is a ``denied`` result), so it is gone
    assert not hasattr(errors, "PermissionDenied")
    for name in ("ToolArgumentsError", "MCPServerError", "ValueNotRepresentable"):
        assert name in (errors.__doc__ or "")
