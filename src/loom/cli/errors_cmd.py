"""`loom errors` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="Inspect errors.", no_args_is_help=True)
