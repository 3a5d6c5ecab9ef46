"""`loom patterns` commands: list, match and validate a directory of pattern YAML files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from loom.patterns import PatternLibrary

app = typer.Typer(help="List, match and validate pattern libraries.", no_args_is_help=True)

DirArg = Annotated[Path, typer.Argument(help="Directory of pattern *.yaml files.")]


def _consoles() -> tuple[Console, Console]:
    from loom.cli._console import err, out

    return out, err


def _load(directory: Path, err: Console) -> PatternLibrary:
    from loom.errors import PatternError
    from loom.patterns import PatternLibrary

    try:
        return PatternLibrary.from_dir(directory, allow_empty=True)
    except PatternError as exc:
        from rich.markup import escape

        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


def _report_problems(library: PatternLibrary, err: Console) -> int:
    """Print the library's problems; return the exit code (1 when there are any)."""
    from rich.markup import escape

    if not library.problems:
        return 0
    err.print(f"[red]{len(library.problems)} problem(s):[/]")
    for p in library.problems:
        where = f" [bold]{escape(p.field)}[/]:" if p.field else ""
        err.print(f"  [red]✗[/] {escape(p.path)}:{where} {escape(p.message)}")
    return 1


@app.command("list")
def list_patterns(
    directory: DirArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show every valid pattern in DIR; report invalid files (exit 1 if any)."""
    from rich.markup import escape
    from rich.table import Table

    out, err = _consoles()
    library = _load(directory, err)
    if as_json:
        print(
            json.dumps(
                [
                    {"name": p.name, "title": p.title, "keywords": p.keywords, "tools": p.tools}
                    for p in library
                ],
                ensure_ascii=False,
            )
        )
        raise typer.Exit(_report_problems(library, err))
    table = Table(title=f"{len(library)} patterns in {escape(str(directory))}")
    for column in ("name", "title", "keywords", "tools"):
        table.add_column(column, overflow="fold")
    for p in library:
        keywords = ", ".join(p.keywords[:5]) + (", ..." if len(p.keywords) > 5 else "")
        table.add_row(escape(p.name), escape(p.title), escape(keywords), escape(", ".join(p.tools)))
    out.print(table)
    raise typer.Exit(_report_problems(library, err))


@app.command("match")
def match_patterns(
    directory: DirArg,
    message: Annotated[str, typer.Argument(help="The user message to match.")],
    k: Annotated[int, typer.Option("-k", "--top", min=1, help="How many patterns.")] = 3,
    min_score: Annotated[
        float, typer.Option("--min-score", min=0.0, max=1.0, help="Lowest similarity kept.")
    ] = 0.1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Rank the patterns of DIR against MESSAGE (TF-IDF cosine similarity)."""
    import time

    from rich.markup import escape
    from rich.table import Table

    out, err = _consoles()
    library = _load(directory, err)
    started = time.perf_counter()
    matches = library.match(message, k=k, min_score=min_score)
    ms = (time.perf_counter() - started) * 1000
    if as_json:
        print(json.dumps([{"name": p.name, "title": p.title, "score": s} for p, s in matches]))
    elif not matches:
        out.print(
            f"[yellow]no pattern scored {min_score:g} or more[/] ({len(library)} patterns, "
            f"{ms:.2f} ms)"
        )
    else:
        table = Table(title=f"top {len(matches)} of {len(library)} patterns ({ms:.2f} ms)")
        for column in ("#", "score", "name", "title"):
            table.add_column(column)
        for i, (p, s) in enumerate(matches, 1):
            table.add_row(str(i), f"{s:.3f}", escape(p.name), escape(p.title))
        out.print(table)
    raise typer.Exit(_report_problems(library, err))


@app.command("validate")
def validate_patterns(directory: DirArg) -> None:
    """Check every pattern file in DIR; exit 1 on any problem (use in CI)."""
    out, err = _consoles()
    library = _load(directory, err)
    code = _report_problems(library, err)
    if code == 0:
        from rich.markup import escape

        out.print(f"[green]✓[/] {len(library)} patterns valid in {escape(str(directory))}")
    raise typer.Exit(code)
