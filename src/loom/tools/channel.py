"""The Error Submission Channel and large results (seed 001), and their two built-in tools.

When an agent's store can keep errors (``ErrorStore``) a failed tool call is stored in full
(message, code, arguments, traceback) under an id ``err_YYYYMMDD_HHMMSS_<6 hex>`` and the model
reads a summary of at most 100 characters plus that id; it can call ``get_error_detail`` for the
rest. If the store fails, the model gets the error truncated to 500 characters instead.

When the store can keep results (``ResultStore``) a successful result longer than
``Agent(max_result_chars=...)`` is stored whole under a ref ``res_<hex>`` and the model reads a
preview plus the ref; ``get_tool_result(ref, offset, length)`` pages through it.

Both tools are registered on the agent automatically (unless it has tools of those names) and
only ever read data of the session that calls them.
"""

from __future__ import annotations

import functools
from typing import Any

from loom.errors import StoreError, ToolError
from loom.messages import ToolCall, ToolResult, new_id
from loom.store.base import StoredError, StoredResult, new_error_id
from loom.tools.base import FunctionTool, RunContext, tool

__all__ = [
    "ERROR_DETAIL_TOOL",
    "RESULT_TOOL",
    "ResultShaper",
    "error_detail_tool",
    "first_line",
    "result_tool",
    "summarize_error",
    "truncate_error",
]

ERROR_DETAIL_TOOL = "get_error_detail"
RESULT_TOOL = "get_tool_result"
SUMMARY_CHARS = 100
FALLBACK_CHARS = 500
PREVIEW_CHARS = 1000
# Bookkeeping results, not tool failures: the model needs their whole (short) text.
_NOT_TOOL_FAILURES = frozenset({"interrupted", "denied", "limit", "guardrail"})


def first_line(text: str, max_len: int) -> str:
    """The first line of ``text`` if it fits in ``max_len``, else its first ``max_len`` chars."""
    text = text.strip()
    idx = text.find("\n")
    if 0 < idx <= max_len:
        return text[:idx].rstrip()
    if len(text) <= max_len:
        return text
    return text[: max_len - 3] + "..."


def summarize_error(message: str, code: str | None = None) -> str:
    """Seed 001's summary: ``Code X: first line`` for coded errors, else the first line; ≤ 100.

    Every Loom error result has a code; ``tool_exception`` (a plain exception, whose message
    already names its type) is the one that is not a deliberate, coded error.
    """
    if code and code != "tool_exception":
        summary = f"Code {code}: {first_line(message, 80)}"
    else:
        summary = first_line(message, SUMMARY_CHARS)
    return summary if len(summary) <= SUMMARY_CHARS else summary[: SUMMARY_CHARS - 3] + "..."


def truncate_error(message: str, limit: int = FALLBACK_CHARS) -> str:
    """The fallback when no error can be stored: the message cut to ``limit`` characters."""
    if len(message) <= limit:
        return message
    marker = "... (truncated)"
    return message[: limit - len(marker)] + marker


class ResultShaper:
    """What the loop runs for every tool result when the store has the capabilities (see
    ``loom.store.base.capabilities_of``): errors go to the error channel, large results to the
    result store."""

    def __init__(self, errors: Any, results: Any, max_result_chars: int | None) -> None:
        self.errors = errors
        self.results = results
        self.max_result_chars = max_result_chars

    @classmethod
    def for_store(cls, capabilities: Any, max_result_chars: int | None) -> ResultShaper | None:
        """A shaper for a store with these capabilities, or None when it would do nothing."""
        shaper = cls(capabilities.errors, capabilities.results, max_result_chars)
        if shaper.errors is None and (shaper.results is None or max_result_chars is None):
            return None
        return shaper

    async def __call__(
        self, session_id: str, run_id: str, call: ToolCall, result: ToolResult
    ) -> ToolResult:
        if call.name in (ERROR_DETAIL_TOOL, RESULT_TOOL):
            return result  # their output is already bounded; never re-store it
        if not result.success:
            if self.errors is None or result.error_code in _NOT_TOOL_FAILURES:
                return result
            return await self.submit_error(session_id, run_id, call, result)
        if self.results is not None and self.max_result_chars is not None:
            content = result.to_content()
            if len(content) > self.max_result_chars:
                return await self.store_large(session_id, run_id, call, result, content)
        return result

    async def submit_error(
        self, session_id: str, run_id: str, call: ToolCall, result: ToolResult
    ) -> ToolResult:
        full = result.error_message or ""
        metadata = dict(result.metadata)
        trace = metadata.pop("traceback", None)
        raw: dict[str, Any] = {
            "code": result.error_code,
            "message": full,
            "tool_name": call.name,
            "arguments": call.arguments,
            "duration_ms": result.duration_ms,
        }
        if trace:
            raw["traceback"] = trace
        summary = summarize_error(full, result.error_code)
        stored = StoredError(
            new_error_id(), session_id, call.name, raw, summary, run_id=run_id, tool_call_id=call.id
        )
        try:
            assert self.errors is not None
            error_id = await self.errors.save_error(stored)
        except Exception as exc:  # seed 001: never fail the turn for the error store
            metadata["error_store_failed"] = f"{type(exc).__name__}: {exc}"
            return result.model_copy(
                update={"error_message": truncate_error(full), "metadata": metadata}
            )
        metadata["error_id"] = error_id
        message = (
            f"Tool '{call.name}' failed: {summary}\n[Error ID: {error_id}]\n"
            f'Use get_error_detail(error_id="{error_id}") for the complete error.'
        )
        return result.model_copy(update={"error_message": message, "metadata": metadata})

    async def store_large(
        self, session_id: str, run_id: str, call: ToolCall, result: ToolResult, content: str
    ) -> ToolResult:
        assert self.results is not None and self.max_result_chars is not None
        ref = new_id("res")
        try:
            await self.results.save_result(
                StoredResult(ref, session_id, call.name, content, run_id, call.id)
            )
        except Exception as exc:  # the model gets the whole result rather than nothing
            return result.model_copy(
                update={
                    "metadata": {
                        **result.metadata,
                        "result_store_failed": f"{type(exc).__name__}: {exc}",
                    }
                }
            )
        shown = min(PREVIEW_CHARS, self.max_result_chars // 2)
        data = (
            f"[Large result from {call.name}: {len(content):,} characters, stored as {ref}. "
            f"The first {shown:,} follow; read the rest with "
            f'get_tool_result(ref="{ref}", offset={shown}).]\n{content[:shown]}'
        )
        return result.model_copy(
            update={
                "data": data,
                "metadata": {**result.metadata, "result_ref": ref, "result_chars": len(content)},
            }
        )


def builtin_tools(shaper: ResultShaper) -> list[FunctionTool]:
    """The tools that read what the shaper stored (made once per process, shared by agents)."""
    out = []
    if shaper.errors is not None:
        out.append(error_detail_tool())
    if shaper.results is not None and shaper.max_result_chars is not None:
        out.append(result_tool(shaper.max_result_chars))
    return out


@functools.cache
def error_detail_tool() -> FunctionTool:
    """The ``get_error_detail`` tool (reads ``RunContext.store``)."""

    async def get_error_detail(ctx: RunContext, error_id: str) -> dict[str, Any]:
        """Fetch the complete information of a failed tool call.

        Use this when the short error summary is not enough: it returns the full message,
        traceback and arguments of the failure. Most errors can be handled from the summary.

        Args:
            error_id: The error id from a tool failure message, e.g. "err_20241121_230334_abc123".
        """
        try:
            stored = await ctx.store.get_error(error_id.strip())
        except StoreError as exc:
            raise ToolError(f"the error store failed: {exc}", code="DATABASE_ERROR") from exc
        if stored is None or stored.session_id != ctx.session_id:
            raise ToolError(
                f"no error with id {error_id!r} in this session; use the id exactly as a failed "
                "tool's message gave it (err_YYYYMMDD_HHMMSS_xxxxxx)",
                code="ERROR_NOT_FOUND",
            )
        return {
            "error_id": stored.id,
            "timestamp": stored.timestamp.isoformat(),
            "tool_name": stored.tool_name,
            "raw_error": stored.raw_error,
            "short_summary": stored.short_summary,
        }

    return tool(name=ERROR_DETAIL_TOOL, effect="pure")(get_error_detail)


@functools.cache
def result_tool(max_result_chars: int) -> FunctionTool:
    """The ``get_tool_result`` tool; pages are at most ``max_result_chars - 300`` characters."""
    page_max = max(max_result_chars - 300, 100)
    default_page = min(4000, page_max)

    async def get_tool_result(
        ctx: RunContext, ref: str, offset: int = 0, length: int = default_page
    ) -> str:
        """Read part of a large tool result that was stored instead of sent whole.

        Args:
            ref: The reference from the large result's message, e.g. "res_3f9a0c1b2d4e".
            offset: Character position to start reading from (0 is the beginning).
            length: How many characters to read.
        """
        try:
            stored = await ctx.store.get_result(ref.strip())
        except StoreError as exc:
            raise ToolError(f"the result store failed: {exc}", code="DATABASE_ERROR") from exc
        if stored is None or stored.session_id != ctx.session_id:
            raise ToolError(
                f"no stored result {ref!r} in this session; use the ref exactly as "
                "the large result's message gave it",
                code="RESULT_NOT_FOUND",
            )
        total = len(stored.content)
        if offset < 0 or offset >= max(total, 1):
            raise ToolError(
                f"offset must be between 0 and {max(total - 1, 0)}, got {offset}",
                code="INVALID_OFFSET",
            )
        length = max(1, min(length, page_max))
        end = min(offset + length, total)
        more = (
            f'; continue with get_tool_result(ref="{stored.ref}", offset={end})'
            if end < total
            else "; this is the end"
        )
        page: str = stored.content[offset:end]
        return f"[{stored.ref}: characters {offset}-{end} of {total}{more}]\n" + page

    return tool(name=RESULT_TOOL, effect="pure")(get_tool_result)
