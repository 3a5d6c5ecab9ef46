"""What an experiment says, for people and for CI: a Rich table, JSON, JUnit XML, and the
comparison of two experiments case by case."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from xml.etree import ElementTree

if TYPE_CHECKING:
    from rich.table import Table

    from loom.evals.experiment import CaseResult, Experiment, ExperimentRecord

__all__ = [
    "CaseComparison",
    "compare",
    "comparison_table",
    "experiments_table",
    "results_table",
    "to_json",
    "to_junit",
    "write_report",
]

_STATUS_STYLE = {"passed": "green", "failed": "red", "errored": "yellow", "missing": "dim"}


def _first_failure(result: CaseResult) -> str:
    if result.error and result.status == "errored":
        return result.error
    for check in result.checks:
        if not check.get("passed"):
            return str(check.get("message", ""))
    return ""


def results_table(experiment: Experiment) -> Table:
    """One row per case: status, score, model calls, cost, time and the first failed check."""
    from rich.markup import escape
    from rich.table import Table

    record = experiment.record
    table = Table(
        title=f"{record.id} · {record.dataset} on {record.agent} ({record.revision}) · "
        f"score {record.score:.2f} · {record.passed} passed, {record.failed} failed, "
        f"{record.errored} errored"
    )
    for name, justify in (
        ("case", "left"),
        ("status", "left"),
        ("score", "right"),
        ("model calls", "right"),
        ("cost", "right"),
        ("time", "right"),
        ("why", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in experiment.results:
        style = _STATUS_STYLE.get(r.status, "")
        table.add_row(
            escape(r.case_id),
            f"[{style}]{r.status}[/]",
            f"{r.score:.2f}",
            str(r.trajectory.get("model_calls", "")),
            "—" if r.cost is None else f"${r.cost:.4f}",
            f"{r.duration:.2f}s",
            escape(_first_failure(r)[:120]),
        )
    return table


def experiments_table(records: list[ExperimentRecord]) -> Table:
    """``loom eval list``: one row per experiment, newest first."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="experiments")
    columns = ["id", "dataset", "agent", "revision", "model", "status", "cases", "passed", "score"]
    for name in [*columns, "started"]:
        table.add_column(name)
    for r in records:
        table.add_row(
            r.id,
            escape(r.dataset),
            escape(r.agent),
            r.revision,
            escape(r.model or "—"),
            r.status,
            str(r.cases),
            str(r.passed),
            f"{r.score:.2f}",
            r.started_at,
        )
    return table


def to_json(experiment: Experiment) -> str:
    """The experiment and every case result as JSON."""
    return json.dumps(experiment.to_dict(), ensure_ascii=False, indent=2, default=str)


def to_junit(experiment: Experiment) -> str:
    """JUnit XML: one ``testsuite`` for the experiment, one ``testcase`` per case; a failed
    case has a ``failure``, an errored one an ``error``, each with the checks' messages."""
    record = experiment.record
    suite = ElementTree.Element(
        "testsuite",
        {
            "name": f"{record.dataset} ({record.agent} {record.revision})",
            "tests": str(len(experiment.results)),
            "failures": str(sum(1 for r in experiment.results if r.status == "failed")),
            "errors": str(sum(1 for r in experiment.results if r.status == "errored")),
            "time": f"{sum(r.duration for r in experiment.results):.3f}",
            "id": record.id,
        },
    )
    for r in experiment.results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            {"classname": record.dataset, "name": r.case_id, "time": f"{r.duration:.3f}"},
        )
        detail = "\n".join(
            f"{'ok ' if c.get('passed') else 'FAIL'} {c.get('name')}: {c.get('message')}"
            for c in r.checks
        )
        if r.status == "failed":
            failure = ElementTree.SubElement(case, "failure", {"message": _first_failure(r)})
            failure.text = detail
        elif r.status == "errored":
            error = ElementTree.SubElement(case, "error", {"message": _first_failure(r)})
            error.text = detail or (r.error or "")
        out = ElementTree.SubElement(case, "system-out")
        out.text = r.output
    suites = ElementTree.Element("testsuites")
    suites.append(suite)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True)


def write_report(experiment: Experiment, kind: Literal["json", "junit"], path: Path) -> None:
    """Write the experiment's ``json`` or ``junit`` report to ``path``."""
    text = to_json(experiment) if kind == "json" else to_junit(experiment)
    path.write_text(text + "\n", encoding="utf-8")


Change = Literal["better", "worse", "same", "added", "removed"]


@dataclass(frozen=True, slots=True)
class CaseComparison:
    """One case in two experiments: its status and score in each and what changed."""

    case_id: str
    change: Change
    status_a: str | None
    status_b: str | None
    score_a: float | None
    score_b: float | None

    @property
    def delta(self) -> float | None:
        if self.score_a is None or self.score_b is None:
            return None
        return round(self.score_b - self.score_a, 6)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "change": self.change,
            "status_a": self.status_a,
            "status_b": self.status_b,
            "score_a": self.score_a,
            "score_b": self.score_b,
            "delta": self.delta,
        }


_RANK = {"errored": 0, "failed": 1, "passed": 2}


def compare(a: Experiment, b: Experiment) -> list[CaseComparison]:
    """Each case of ``a`` and ``b`` (by id): better (a higher score, or failed → passed),
    worse, same; a case in one experiment only is ``added`` / ``removed``. An errored case
    compares by status only: its score says nothing of the agent."""
    left = {r.case_id: r for r in a.results}
    right = {r.case_id: r for r in b.results}
    order = [r.case_id for r in a.results] + [k for k in right if k not in left]
    rows: list[CaseComparison] = []
    for case_id in order:
        ra, rb = left.get(case_id), right.get(case_id)
        if ra is None or rb is None:
            change: Change = "added" if ra is None else "removed"
        elif "errored" in (ra.status, rb.status) or ra.score == rb.score:
            diff = _RANK[rb.status] - _RANK[ra.status]
            change = "better" if diff > 0 else "worse" if diff < 0 else "same"
        else:
            change = "better" if rb.score > ra.score else "worse"
        rows.append(
            CaseComparison(
                case_id,
                change,
                ra.status if ra else None,
                rb.status if rb else None,
                ra.score if ra else None,
                rb.score if rb else None,
            )
        )
    return rows


def comparison_table(a: Experiment, b: Experiment, rows: list[CaseComparison]) -> Table:
    """``loom eval compare``: a row per case, better in green, worse in red."""
    from rich.markup import escape
    from rich.table import Table

    ra, rb = a.record, b.record
    table = Table(
        title=f"{ra.id} ({ra.revision}, score {ra.score:.2f}) → "
        f"{rb.id} ({rb.revision}, score {rb.score:.2f})"
    )
    for name in ("case", "change", "A", "B", "Δ score"):
        table.add_column(name)
    styles = {"better": "green", "worse": "red", "same": "", "added": "cyan", "removed": "dim"}
    for row in rows:
        style = styles[row.change]
        delta = row.delta
        table.add_row(
            escape(row.case_id),
            f"[{style}]{row.change}[/]" if style else row.change,
            "—" if row.status_a is None else f"{row.status_a} {row.score_a:.2f}",
            "—" if row.status_b is None else f"{row.status_b} {row.score_b:.2f}",
            "—" if delta is None else f"{delta:+.2f}",
        )
    return table
