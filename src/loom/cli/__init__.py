"""The ``loom`` command (Typer + Rich).

Each command group lives in its own module and is registered here; modules import their heavy
dependencies inside the command functions so ``loom --help`` stays fast.

Exit codes, the same for every command: 0 done; 1 the command ran and its outcome is a failure
(a run that ended in error, ``patterns validate`` found problems, ``db status`` not migrated, a
deletion you declined); 2 what you gave is wrong or missing (bad input or option, an id that is
not found, no database, a server or database that cannot be reached); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

from typing import Annotated

import typer

from loom.cli import (
    budgets_cmd,
    db_cmd,
    errors_cmd,
    eval_cmd,
    keys_cmd,
    mcp_cmd,
    memory_cmd,
    patterns_cmd,
    run_cmd,
    schedule_cmd,
    serve_cmd,
    sessions_cmd,
    worker_cmd,
)

app = typer.Typer(
    name="loom",
    help="Run, chat with and inspect Loom agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from loom import __version__

        typer.echo(f"loom {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print Loom's version and exit.",
        ),
    ] = False,
) -> None:
    """Run, chat with and inspect Loom agents."""


app.command("run")(run_cmd.run)
app.command("chat")(run_cmd.chat)
app.command("resume")(run_cmd.resume)
app.command("serve")(serve_cmd.serve)
app.command("worker")(worker_cmd.worker)
app.command("mcp")(mcp_cmd.mcp)
app.add_typer(sessions_cmd.app, name="sessions")
app.add_typer(memory_cmd.app, name="memory")
app.add_typer(keys_cmd.app, name="keys")
app.add_typer(errors_cmd.app, name="errors")
app.add_typer(patterns_cmd.app, name="patterns")
app.add_typer(db_cmd.app, name="db")
app.add_typer(schedule_cmd.app, name="schedule")
app.add_typer(schedule_cmd.monitors_app, name="monitors")
app.add_typer(eval_cmd.app, name="eval")
app.command("budgets")(budgets_cmd.budgets)


def main() -> None:
    app()
