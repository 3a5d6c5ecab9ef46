"""Query results as compact text tables (what the model reads)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_rows"]


def _cell(value: Any, width: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    text = str(value).replace("\n", "\\n").replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    more: bool,
    max_rows: int,
    max_cell_chars: int = 200,
) -> str:
    """``a | b`` header, one line per row; says when rows were cut at ``max_rows``. Large
    tables reach the model through the result channel (preview + ``get_tool_result``)."""
    if not columns:
        return "(the statement returned no columns)"
    lines = [" | ".join(columns)]
    lines.extend(" | ".join(_cell(v, max_cell_chars) for v in row) for row in rows)
    count = f"({len(rows)} row{'s' if len(rows) != 1 else ''}"
    if more:
        count += (
            f"; stopped at the row limit of {max_rows}: add a WHERE clause, aggregate, or page "
            "with LIMIT/OFFSET"
        )
    lines.append(count + ")")
    return "\n".join(lines)
