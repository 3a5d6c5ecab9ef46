"""`loom sessions` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="Inspect sessions.", no_args_is_help=True)
