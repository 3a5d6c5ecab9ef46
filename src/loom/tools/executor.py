"""Runs one tool call to a ``ToolResult``: never raises for anything the model can fix.

Every failure the model caused or can react to becomes an error result with a stable code:

| code                | cause                                                      |
| ------------------- | ---------------------------------------------------------- |
| ``unknown_tool``      | the model named a tool the agent does not have            |
| ``invalid_json``      | the arguments were not a JSON object                      |
| ``invalid_arguments`` | the arguments did not match the tool's schema             |
| ``timeout``           | the call ran past its timeout and was cancelled/abandoned |
| ``tool_exception``    | the tool raised; the message names the exception          |
| ``denied``            | a hook or the permission policy refused the call          |
| ``interrupted``       | the run stopped (cancel, crash) before the call finished  |
| ``limit``             | the turn's ``max_tool_calls`` was reached                 |
| any ToolError code    | the tool raised ``loom.ToolError(code=...)``              |
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Mapping

from loom.errors import ToolError
from loom.messages import ToolCall, ToolResult
from loom.tools.base import RunContext, Tool, ToolArgumentsError

__all__ = ["error_result", "execute_call"]


def error_result(call: ToolCall, code: str, message: str, duration_ms: float = 0.0) -> ToolResult:
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        success=False,
        error_code=code,
        error_message=message,
        duration_ms=duration_ms,
    )


async def execute_call(
    call: ToolCall,
    tools: Mapping[str, Tool],
    ctx: RunContext,
    default_timeout: float,
) -> ToolResult:
    """Validate and run one call under its timeout."""
    started = time.perf_counter()
    t = tools.get(call.name)
    if t is None:
        available = ", ".join(sorted(tools)) or "(none)"
        return error_result(
            call, "unknown_tool", f"there is no tool named {call.name!r}; available: {available}"
        )
    if call.raw_arguments is not None:
        return error_result(
            call,
            "invalid_json",
            f"arguments for {call.name} must be a JSON object, got: {call.raw_arguments[:200]!r}",
        )
    try:
        arguments = t.validate(call.arguments)
    except ToolArgumentsError as exc:
        return error_result(call, "invalid_arguments", str(exc))
    timeout = t.timeout if t.timeout is not None else default_timeout
    try:
        if getattr(t, "runs_inline", False):
            # It never awaits, so a timer could not fire before it returns: skip arming one.
            data = await t.run(ctx, arguments)
        else:
            async with asyncio.timeout(timeout):
                data = await t.run(ctx, arguments)
    except TimeoutError:
        # Async tools were cancelled by the timeout; a sync tool's thread cannot be killed, so it
        # is abandoned with its cancel flag set for it to notice.
        ctx.cancel_event.set()
        return error_result(
            call,
            "timeout",
            f"{call.name} did not finish within {timeout:g} s and was stopped",
            (time.perf_counter() - started) * 1000,
        )
    except ToolError as exc:
        return error_result(call, exc.code, str(exc), (time.perf_counter() - started) * 1000)
    except asyncio.CancelledError:
        ctx.cancel_event.set()
        raise
    except Exception as exc:
        failed = error_result(
            call,
            "tool_exception",
            f"{type(exc).__name__}: {exc}",
            (time.perf_counter() - started) * 1000,
        )
        # Kept for the error channel (get_error_detail); the model never reads metadata.
        failed.metadata["traceback"] = traceback.format_exc()
        return failed
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        success=True,
        data=data,
        duration_ms=(time.perf_counter() - started) * 1000,
    )
