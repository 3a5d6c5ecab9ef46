"""The CLI's Rich consoles and the one way it prints an error.

Rich hard-wraps text at the console width, and a console that is not a terminal is 80 columns
wide: an error message piped to a file or another program came out cut into 80-column lines.
``CliConsole`` wraps only on a terminal. Text that did not come from the CLI itself (ids, tool
output, user and model text, exception messages) must reach Rich escaped (``rich.markup.escape``)
or as ``Text``: otherwise ``[y]`` or ``[bold]`` in it is read as markup and vanishes.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["CliConsole", "emit_json", "err", "escape", "fail", "jsonable", "out", "say_error"]


_PIPED_WIDTH = 10_000


class CliConsole(Console):
    """A Rich console that soft-wraps (does not insert line breaks) unless it is a terminal."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        # Decided per call: the file (sys.stdout/sys.stderr) can change after construction,
        # as it does under test runners.
        if soft_wrap is None:
            soft_wrap = not self.is_terminal
        if not self.is_terminal and any(isinstance(o, Table) for o in objects):
            # piped: a table gets the width its cells need (Rich would cut ids at 80 columns)
            saved, self.width = self.width, _PIPED_WIDTH
            try:
                super().print(*objects, soft_wrap=soft_wrap, **kwargs)
            finally:
                self.width = saved
            return
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


out = CliConsole(highlight=False)
err = CliConsole(stderr=True, highlight=False)


def say_error(exc: BaseException) -> None:
    """Print ``ErrorType: message`` in red on stderr, the message escaped."""
    err.print(f"[red]{type(exc).__name__}:[/] {escape(str(exc))}")


def fail(exc: BaseException, code: int) -> typer.Exit:
    """Print ``exc`` and return the ``typer.Exit`` to raise with ``code``."""
    say_error(exc)
    return typer.Exit(code=code)


def jsonable(value: Any) -> Any:
    """``value`` as JSON-native data: dataclasses and pydantic models as objects, times as ISO."""
    import dataclasses
    from datetime import datetime

    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def emit_json(value: Any) -> None:
    """Write ``value`` as one line of JSON on stdout (not through Rich: no markup, no wrapping)."""
    import json
    import sys

    sys.stdout.write(json.dumps(jsonable(value), ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
