"""Evals: datasets of cases, trajectory assertions, experiments and their reports (docs/evals.md).

```python
from loom.evals import load_dataset, run_experiment

dataset = load_dataset("evals.yaml")
experiment = await run_experiment(dataset, agent, store=SQLiteStore("loom.db"))
experiment.record.score, [r.status for r in experiment.results]
```
"""

from __future__ import annotations

from loom.evals.assertions import (
    ASSERTIONS,
    Assertion,
    CheckResult,
    ToolCallRecord,
    Trajectory,
    check_all,
    parse_assertions,
    register_assertion,
    trajectory_from_events,
)
from loom.evals.capture import CaptureRefused, ReplayEnvironment, capture_case
from loom.evals.dataset import (
    Case,
    Dataset,
    DatasetError,
    DoneWhen,
    Environment,
    Expected,
    RecordedCall,
    ScriptStep,
    SessionInput,
    SimulatedUser,
    load_dataset,
    parse_dataset,
)
from loom.evals.experiment import (
    CaseResult,
    Experiment,
    ExperimentNotFound,
    ExperimentRecord,
    UnknownCaseTool,
    agent_revision,
    check_dataset,
    list_experiments,
    load_experiment,
    run_experiment,
)

__all__ = [
    "ASSERTIONS",
    "Assertion",
    "CaptureRefused",
    "Case",
    "CaseResult",
    "CheckResult",
    "Dataset",
    "DatasetError",
    "DoneWhen",
    "Environment",
    "Expected",
    "Experiment",
    "ExperimentNotFound",
    "ExperimentRecord",
    "RecordedCall",
    "ReplayEnvironment",
    "ScriptStep",
    "SessionInput",
    "SimulatedUser",
    "ToolCallRecord",
    "Trajectory",
    "UnknownCaseTool",
    "agent_revision",
    "capture_case",
    "check_all",
    "check_dataset",
    "list_experiments",
    "load_dataset",
    "load_experiment",
    "parse_assertions",
    "parse_dataset",
    "register_assertion",
    "run_experiment",
    "trajectory_from_events",
]
