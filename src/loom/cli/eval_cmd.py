"""`loom eval`: run a dataset of cases on an agent, list and show stored experiments, compare
two of them (docs/evals.md).

``loom eval run DATASET --agent FILE`` exits 0 when the experiment ran (and, with
``--fail-under SCORE``, scored at least that), 1 when it scored below ``--fail-under``, 2 when
what was given is wrong (a dataset that does not parse, a case naming a tool the agent lacks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.markup import escape

from loom.cli._console import emit_json, err, out, say_error

if TYPE_CHECKING:
    from loom.evals.experiment import CaseResult, Experiment
    from loom.store.base import Store

__all__ = ["app"]

T = TypeVar("T")

app = typer.Typer(
    help="Run datasets of eval cases on an agent; list, show and compare experiments.",
    no_args_is_help=True,
)

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", "--db", help="Session database (default .loom/loom.db)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.command("run")
def run(
    dataset: Annotated[
        Path, typer.Argument(help="A dataset file: YAML, or JSONL (one case a line).")
    ],
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            "-a",
            help="An AGENT.md or YAML agent definition, or a Python agent (module:attr, file.py).",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Run every case on this model (a model string, or test)."
        ),
    ] = None,
    judge_model: Annotated[
        str | None, typer.Option("--judge-model", help="The model of rubric judges.")
    ] = None,
    user_model: Annotated[
        str | None,
        typer.Option("--user-model", help="The model of simulated users whose case names none."),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1)] = 4,
    max_cost: Annotated[
        float | None,
        typer.Option("--max-cost", help="US dollars: start no case once the runs cost this much."),
    ] = None,
    fail_under: Annotated[
        float | None,
        typer.Option("--fail-under", help="Exit 1 when the experiment's score (0..1) is lower."),
    ] = None,
    report: Annotated[
        tuple[str, Path] | None,
        typer.Option("--report", metavar="json|junit PATH", help="Also write a report file."),
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Finish this interrupted experiment.")
    ] = None,
    new: Annotated[
        bool,
        typer.Option(
            "--new",
            help="Start a new experiment even when an unfinished one of this dataset and agent "
            "revision exists (by default it is resumed).",
        ),
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Run every case of DATASET on the agent, score it, store the experiment, print a table."""
    from loom.cli.run_cmd import build_agent, open_store
    from loom.errors import LoomError
    from loom.evals import load_dataset, run_experiment

    if report is not None and report[0] not in ("json", "junit"):
        say_error(ValueError(f"--report takes json or junit and a path, got {report[0]!r}"))
        raise typer.Exit(2)
    if fail_under is not None and not 0 <= fail_under <= 1:
        say_error(ValueError(f"--fail-under is a score from 0 to 1, got {fail_under:g}"))
        raise typer.Exit(2)

    async def go() -> Experiment:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        data = load_dataset(dataset)
        db = open_store(store)
        try:
            built = build_agent(agent, None, db, None)
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[last]}"),
                console=err,
            ) as progress:
                task = progress.add_task(escape(data.name), total=len(data.cases), last="")

                def on_case(result: CaseResult) -> None:
                    progress.update(task, advance=1, last=f"{result.case_id}: {result.status}")

                experiment = await run_experiment(
                    data,
                    built,
                    store=db,
                    dataset_path=str(dataset),
                    model=model,
                    judge_model=judge_model,
                    user_model=user_model,
                    concurrency=concurrency,
                    max_cost=max_cost,
                    resume=resume,
                    auto_resume=not new,
                    on_case=on_case,
                )
                progress.update(task, completed=len(experiment.results))
            return experiment
        finally:
            await db.close()

    try:
        experiment = asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(2) from None
    from loom.evals.report import results_table, write_report

    out.print(results_table(experiment))
    record = experiment.record
    err.print(
        f"experiment {record.id}: {experiment.ran} case(s) run now, "
        f"{len(experiment.results) - experiment.ran} kept from before; status {record.status}"
    )
    if report is not None:
        write_report(experiment, "json" if report[0] == "json" else "junit", report[1])
    if fail_under is not None and record.score < fail_under:
        err.print(f"[red]score {record.score:.2f} is under --fail-under {fail_under:.2f}[/]")
        raise typer.Exit(1)


def _with_store(path: str | None, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the existing store, run ``fn``, close it; a LoomError is a red message and exit
    code 2 (what you gave is wrong or missing)."""
    from loom.cli.sessions_cmd import open_existing
    from loom.errors import LoomError

    async def go() -> T:
        db = open_existing(path)
        try:
            return await fn(db)
        finally:
            await db.close()

    try:
        return asyncio.run(go())
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(2) from None


@app.command("list")
def list_(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """The stored experiments, newest first."""
    from loom.evals import list_experiments
    from loom.evals.report import experiments_table

    records = _with_store(store, list_experiments)
    if as_json:
        emit_json([r.to_dict() for r in records])
        return
    out.print(experiments_table(records))


@app.command("show")
def show(
    experiment_id: Annotated[str, typer.Argument(help="An experiment id (see loom eval list).")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One experiment: its header and every case's result."""
    from loom.evals import load_experiment
    from loom.evals.report import results_table

    experiment = _with_store(store, lambda db: load_experiment(db, experiment_id))
    if as_json:
        emit_json(experiment.to_dict())
        return
    out.print(results_table(experiment))


@app.command("compare")
def compare(
    a: Annotated[str, typer.Argument(help="The experiment to compare from (the baseline).")],
    b: Annotated[str, typer.Argument(help="The experiment to compare to.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
    fail_on_worse: Annotated[
        bool, typer.Option("--fail-on-worse", help="Exit 1 when any case got worse.")
    ] = False,
) -> None:
    """Per case: better, worse or the same from A to B, with the score deltas."""
    from loom.evals import load_experiment
    from loom.evals.report import compare as compare_experiments
    from loom.evals.report import comparison_table

    async def both(db: Store) -> tuple[Experiment, Experiment]:
        return await load_experiment(db, a), await load_experiment(db, b)

    first, second = _with_store(store, both)
    rows = compare_experiments(first, second)
    if as_json:
        emit_json(
            {
                "a": first.record.to_dict(),
                "b": second.record.to_dict(),
                "score_delta": round(second.record.score - first.record.score, 6),
                "cases": [r.to_dict() for r in rows],
            }
        )
    else:
        out.print(comparison_table(first, second, rows))
    if fail_on_worse and any(r.change == "worse" for r in rows):
        raise typer.Exit(1)


@app.command("capture")
def capture(
    session: Annotated[str, typer.Argument(help="A stored session id (see loom sessions).")],
    run_id: Annotated[
        str | None, typer.Option("--run", help="The run to capture (default the last turn).")
    ] = None,
    turn: Annotated[
        int | None, typer.Option("--turn", min=1, help="The turn to capture, 1-based.")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write to this YAML dataset (default: print it)."),
    ] = None,
    append: Annotated[
        bool, typer.Option("--append", help="Add the case to the dataset file -o names.")
    ] = False,
    case_id: Annotated[str | None, typer.Option("--id", help="The case's id.")] = None,
    expect: Annotated[
        str,
        typer.Option(
            "--expect",
            help="The recorded answer as the reference: text (exact), contains, rubric, none.",
        ),
    ] = "text",
    replay_model: Annotated[
        bool,
        typer.Option(
            "--replay-model",
            help="Replay the recorded model answers too (the case runs on them, offline).",
        ),
    ] = False,
    unmatched: Annotated[
        str,
        typer.Option(
            "--unmatched", help="A tool call with no recording: fail the case, or run_real."
        ),
    ] = "fail",
    as_owner: Annotated[
        str | None,
        typer.Option("--as", help="Your API key's name: capture a session the server owns."),
    ] = None,
    any_owner: Annotated[
        bool,
        typer.Option("--any-owner", help="Capture a session whoever owns it (an operator)."),
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Turn a stored run into an eval case: its input, the recorded answer as the reference,
    its tool calls as assertions, the tools' recorded results as a simulated environment."""
    from loom.evals.capture import append_case, capture_case, dataset_yaml
    from loom.evals.dataset import Dataset

    if expect not in ("text", "contains", "rubric", "none"):
        say_error(ValueError(f"--expect takes text, contains, rubric or none, got {expect!r}"))
        raise typer.Exit(2)
    if unmatched not in ("fail", "run_real"):
        say_error(ValueError(f"--unmatched takes fail or run_real, got {unmatched!r}"))
        raise typer.Exit(2)
    if append and output is None:
        say_error(ValueError("--append adds to the file -o names; give -o"))
        raise typer.Exit(2)

    async def go(db: Store) -> str:
        case = await capture_case(
            db,
            session,
            run_id=run_id,
            turn=turn,
            case_id=case_id,
            expect=expect,  # type: ignore[arg-type]  # checked above
            replay_model=replay_model,
            unmatched=unmatched,  # type: ignore[arg-type]  # checked above
            owner=as_owner,
            any_owner=any_owner,
        )
        if output is None:
            return dataset_yaml(Dataset(name=session, cases=[case]))
        dataset = append_case(output, case, append=append)
        return f"case {case.id!r} written to {output} ({len(dataset.cases)} case(s))"

    said = _with_store(store, go)
    if output is None:
        typer.echo(said, nl=False)  # plain: YAML a console would wrap or colour
    else:
        err.print(escape(said))
