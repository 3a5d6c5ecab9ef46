"""The console's experiment pages (``loom.evals``): the stored experiments, one experiment's
cases, one case's trajectory beside its reference, and two experiments compared case by case.

Experiments live in the store's key-values (``loom.evals.experiments``); the server's store is
the one ``loom eval run --db`` wrote when both name the same database. Ownership: an
experiment carries the API key that ran it (``ExperimentRecord.owner``); a key sees its own
and the shared ones (``owner`` None: what a local ``loom eval run`` stores, since the CLI has
no key), an admin key and a server without keys see every experiment. Another key's
experiment does not exist for a key: its pages are the 404 page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response

from loom.evals.experiment import (
    CaseResult,
    Experiment,
    ExperimentNotFound,
    ExperimentRecord,
    list_experiments,
    load_experiment,
)
from loom.evals.report import compare
from loom.server.app import state_of
from loom.server.console.routes import page, problem, router
from loom.server.ownership import current_principal, owner_filter

if TYPE_CHECKING:
    from loom.evals.dataset import Case
    from loom.store.base import Store

__all__ = ["EXPERIMENTS_SHOWN", "TrajectoryStep", "visible_to"]

EXPERIMENTS_SHOWN = 500
"""Experiments listed (newest first); an older one still opens by its address."""
RESULT_CHARS = 2000
"""Characters of a tool's result shown on the case page."""


def visible_to(record: ExperimentRecord, owner: str | None) -> bool:
    """Whether a key whose listing filter is ``owner`` (``owner_filter``: None for an admin key
    or a server without keys) sees ``record``: its own, and shared ones."""
    return owner is None or record.owner is None or record.owner == owner


def _store(request: Request) -> Store:
    return state_of(request).runtime.store


async def _visible(request: Request, experiment_id: str) -> Experiment | None:
    try:
        experiment = await load_experiment(_store(request), experiment_id)
    except ExperimentNotFound:
        return None
    if not visible_to(experiment.record, owner_filter(current_principal.get())):
        return None
    return experiment


def _missing(request: Request, experiment_id: str) -> Response:
    return problem(
        request,
        404,
        "Not found",
        f"no experiment {experiment_id!r} for this key (see the experiments page; "
        "`loom eval list` lists a database's experiments)",
    )


@router.get("/experiments")
async def experiments_page(request: Request) -> Response:
    """Every experiment the key sees, newest first."""
    owner = owner_filter(current_principal.get())
    records = [r for r in await list_experiments(_store(request)) if visible_to(r, owner)]
    return page(
        request,
        "experiments.html",
        nav="experiments",
        records=records[:EXPERIMENTS_SHOWN],
        more=len(records) > EXPERIMENTS_SHOWN,
        show_owner=owner is None,
    )


@router.get("/experiments/compare")
async def compare_page(request: Request, a: str = "", b: str = "") -> Response:
    """Experiments ``a`` (before) and ``b`` (after), case by case: better, worse, same."""
    if not a or not b:
        owner = owner_filter(current_principal.get())
        records = [r for r in await list_experiments(_store(request)) if visible_to(r, owner)]
        return page(
            request,
            "experiment_compare.html",
            nav="experiments",
            pick=True,
            records=records[:EXPERIMENTS_SHOWN],
            a=a,
            b=b,
        )
    left, right = await _visible(request, a), await _visible(request, b)
    if left is None:
        return _missing(request, a)
    if right is None:
        return _missing(request, b)
    rows = compare(left, right)
    counts = {k: sum(1 for r in rows if r.change == k) for k in ("better", "worse", "same")}
    counts["other"] = len(rows) - sum(counts.values())
    return page(
        request,
        "experiment_compare.html",
        nav="experiments",
        pick=False,
        left=left.record,
        right=right.record,
        rows=rows,
        counts=counts,
        score_delta=round(right.record.score - left.record.score, 6),
        cost_delta=round(right.record.cost - left.record.cost, 6),
    )


@router.get("/experiments/{experiment_id}")
async def experiment_page(request: Request, experiment_id: str) -> Response:
    """One experiment: its header and a row per case."""
    experiment = await _visible(request, experiment_id)
    if experiment is None:
        return _missing(request, experiment_id)
    others = [
        r
        for r in await list_experiments(_store(request))
        if r.id != experiment_id
        and r.dataset == experiment.record.dataset
        and visible_to(r, owner_filter(current_principal.get()))
    ]
    return page(
        request,
        "experiment.html",
        nav="experiments",
        record=experiment.record,
        results=experiment.results,
        others=others[:20],
        first_failures={r.case_id: _first_failure(r) for r in experiment.results},
    )


def _first_failure(result: CaseResult) -> str:
    if result.error:
        return result.error
    for check in result.checks:
        if not check.get("passed"):
            return str(check.get("message", ""))
    return ""


@dataclass(frozen=True, slots=True)
class TrajectoryStep:
    """One tool call of a case's run as the case page shows it: what was called with which
    arguments and what came back (read from the run's journal when the server's store holds
    it)."""

    name: str
    arguments: dict[str, Any]
    result: str | None = None
    failed: bool = False
    cut: bool = False


async def _steps(store: Store, result: CaseResult) -> tuple[list[TrajectoryStep], bool]:
    """The case's tool calls with their results (True: read from the journal), or from the
    stored trajectory without results when this store does not hold the run."""
    from loom.events import ToolErrorEvent, ToolExecutionStart, ToolResultEvent

    events = []
    if result.session_id and result.run_id:
        try:
            events = await store.load_events(result.session_id, result.run_id)
        except Exception:  # another database's run, or a session deleted since
            events = []
    starts = [e for e in events if isinstance(e, ToolExecutionStart)]
    if not starts:
        calls = result.trajectory.get("tool_calls") or []
        recorded = [
            TrajectoryStep(str(c.get("name")), dict(c.get("arguments") or {})) for c in calls
        ]
        return recorded, False
    ends = {e.tool_call_id: e for e in events if isinstance(e, ToolResultEvent | ToolErrorEvent)}
    steps = []
    for start in starts:
        end = ends.get(start.tool_call_id)
        text = None if end is None else end.content
        cut = text is not None and len(text) > RESULT_CHARS
        steps.append(
            TrajectoryStep(
                start.tool_name,
                dict(start.arguments),
                text[:RESULT_CHARS] if text is not None and cut else text,
                end is not None and not end.success,
                cut,
            )
        )
    return steps, True


def _dataset_case(record: ExperimentRecord, case_id: str) -> tuple[Case | None, str]:
    """The case as its dataset file says now (None, and why, when it cannot be read)."""
    from loom.evals.dataset import DatasetError, load_dataset

    if not record.dataset_path:
        return None, "the experiment did not record its dataset's file"
    if not Path(record.dataset_path).is_file():
        return None, f"the dataset file {record.dataset_path} is not on this server"
    try:
        dataset = load_dataset(record.dataset_path)
    except DatasetError as exc:
        return None, str(exc)
    changed = dataset.fingerprint() != record.dataset_fingerprint
    for case in dataset.cases:
        if case.id == case_id:
            why = "the dataset file changed since the experiment ran" if changed else ""
            return case, why
    return None, f"the dataset file no longer has a case {case_id!r}"


@router.get("/experiments/{experiment_id}/cases/{case_id:path}")
async def case_page(request: Request, experiment_id: str, case_id: str) -> Response:
    """One case: its run's trajectory (tool calls, arguments, results, the answer) beside its
    reference (the expected answer, the assertions, a recorded answer)."""
    experiment = await _visible(request, experiment_id)
    if experiment is None:
        return _missing(request, experiment_id)
    result = next((r for r in experiment.results if r.case_id == case_id), None)
    if result is None:
        return problem(
            request,
            404,
            "Not found",
            f"experiment {experiment_id!r} has no result for case {case_id!r} (not run yet, "
            "or another dataset's)",
        )
    from loom.server.ownership import OwnedStore

    store = _store(request)
    # the case's run is the experiment's, which this key may see (checked above): its session
    # is nobody's (a local run's) or the experiment owner's, so read it past the session check
    raw = store.inner if isinstance(store, OwnedStore) else store
    steps, from_journal = await _steps(raw, result)
    case, case_note = _dataset_case(experiment.record, case_id)
    expected = None
    recorded: Any = None
    recorded_calls: list[TrajectoryStep] = []
    captured_from: Any = None
    if case is not None:
        if case.expected is not None:
            expected = case.expected.model_dump(exclude_defaults=True)
        recorded = case.metadata.get("reference") or case.metadata.get("recorded")
        captured_from = case.metadata.get("captured_from")
        # a captured case's recorded environment (``loom eval capture``: ``Case.environment``)
        environment = getattr(case, "environment", None)
        for call in getattr(environment, "calls", None) or []:
            content = str(getattr(call, "content", ""))
            recorded_calls.append(
                TrajectoryStep(
                    str(getattr(call, "name", "")),
                    dict(getattr(call, "arguments", None) or {}),
                    content[:RESULT_CHARS],
                    not getattr(call, "success", True),
                    len(content) > RESULT_CHARS,
                )
            )
    return page(
        request,
        "experiment_case.html",
        nav="experiments",
        record=experiment.record,
        result=result,
        steps=steps,
        from_journal=from_journal,
        # the run's session page is session-scoped: an admin's (or an open server's) to open
        session_link=from_journal and owner_filter(current_principal.get()) is None,
        case=case,
        case_note=case_note,
        expected=expected,
        recorded=recorded,
        recorded_calls=recorded_calls,
        captured_from=captured_from,
    )
