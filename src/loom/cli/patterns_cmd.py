"""`loom patterns` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="Inspect patterns.", no_args_is_help=True)
