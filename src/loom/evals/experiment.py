"""Experiments: run every case of a dataset through the front door, score it, store it.

``run_experiment(dataset, agent, store=...)`` checks the whole dataset against the agent first
(a case naming a tool the agent lacks, a rubric with no judge model, an unknown pydantic type:
typed errors before anything runs), then runs the cases concurrently (``Runtime.start`` with
``RunOptions``: the model and extra tools vary per run, the ``Agent`` stays as built), each in a
new session, and scores each with the deterministic checks (trajectory assertions read from the
run's journal events, the expected answer) and, for a rubric, a judge panel.

Each case's result is stored in the store's key-value space the moment it is scored, so an
experiment interrupted by a crash resumes (``resume=<id>``, or by itself when an unfinished
experiment of the same dataset, agent revision and model exists) without running finished
cases again. Records:

- namespace ``loom.evals.experiments``, key the experiment id: ``ExperimentRecord``
- namespace ``loom.evals.cases``, key ``<experiment id>/<case id>``: ``CaseResult``
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import ConfigurationError, InputError
from loom.evals.assertions import (
    CheckResult,
    check_all,
    parse_assertions,
    trajectory_from_events,
)
from loom.evals.dataset import Case, Dataset, DatasetError

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.engine.runtime import Runtime
    from loom.messages import RunResult
    from loom.models.base import Model
    from loom.store.base import KVStore, Store

__all__ = [
    "CASES_NAMESPACE",
    "EXPERIMENTS_NAMESPACE",
    "CaseResult",
    "CaseStatus",
    "Experiment",
    "ExperimentNotFound",
    "ExperimentRecord",
    "UnknownCaseTool",
    "agent_revision",
    "check_dataset",
    "list_experiments",
    "load_experiment",
    "run_experiment",
]

EXPERIMENTS_NAMESPACE = "loom.evals.experiments"
CASES_NAMESPACE = "loom.evals.cases"

CaseStatus = Literal["passed", "failed", "errored"]


class UnknownCaseTool(InputError):
    """A case names a tool (in an assertion or its script) that the agent does not have."""


class ExperimentNotFound(InputError, KeyError):
    """No stored experiment has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(slots=True)
class CaseResult:
    """One case's outcome. ``errored``: the case could not be judged (the run or a judge's
    model failed), which says nothing of the agent; ``failed``: a check did not pass."""

    case_id: str
    status: CaseStatus
    score: float
    checks: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""
    error: str | None = None
    trajectory: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    run_id: str = ""
    cost: float | None = None
    duration: float = 0.0
    turns: list[dict[str, Any]] = field(default_factory=list)  # a simulated user's conversation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(slots=True)
class ExperimentRecord:
    """An experiment's header: what ran, on what, and its summary once finished."""

    id: str
    dataset: str
    dataset_path: str
    dataset_fingerprint: str
    agent: str
    revision: str
    model: str | None
    started_at: str
    finished_at: str | None = None
    status: Literal["running", "finished", "budget_exhausted"] = "running"
    cases: int = 0
    passed: int = 0
    failed: int = 0
    errored: int = 0
    score: float = 0.0
    cost: float = 0.0
    owner: str | None = None  # the API key that ran it; None: shared (a local CLI run)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(slots=True)
class Experiment:
    """An experiment's record and its case results (in the dataset's order when it ran)."""

    record: ExperimentRecord
    results: list[CaseResult]
    ran: int = 0  # cases run by this call (not taken from a stored earlier attempt)

    @property
    def score(self) -> float:
        return self.record.score

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.record.to_dict(), "cases": [r.to_dict() for r in self.results]}


def agent_revision(agent: Agent) -> str:
    """A hash of the agent's definition (instructions, model, tools, limits, ...): the
    experiment records which revision of the agent it measured."""
    try:
        text = agent.to_definition().model_dump_json()
    except Exception:  # an agent a definition cannot describe: hash what can be read of it
        text = json.dumps([agent.name, agent.instructions, sorted(agent.tools)], default=str)
    model = agent.given.get("model")
    text += "|" + (
        model if isinstance(model, str) else getattr(model, "name", type(model).__name__)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _agent_tool_names(agent: Agent) -> tuple[set[str], list[str], bool]:
    """The agent's tool names, the prefixes of its toolsets, and whether a toolset without a
    prefix makes the list unknowable before a run."""
    names = set(agent.tools)
    for backend in getattr(agent, "backends", ()) or ():
        try:
            names.update(t.name for t in backend.tools())
        except Exception:  # a backend that cannot list its tools until it connects
            return names, [], True
    prefixes: list[str] = []
    open_ended = False
    for toolset in getattr(agent, "toolsets", ()) or ():
        prefix = getattr(toolset, "prefix", None) or getattr(
            getattr(toolset, "spec", None), "prefix", None
        )
        if prefix:
            prefixes.append(str(prefix))
        else:
            open_ended = True
    return names, prefixes, open_ended


def _import_type(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"write the type as module:Name, got {path!r}")
    return getattr(importlib.import_module(module), attr)


def check_dataset(
    dataset: Dataset,
    agent: Agent,
    *,
    judge_model: str | Model | None,
    user_model: str | Model | None = None,
) -> None:
    """Everything that can be wrong before a case runs: a tool the agent lacks, a rubric with
    no judge model, a ``type`` that does not import, a bad checkpoint, a simulated user with a
    goal and no model (or a ``done_when`` rubric and no judge model)."""
    names, prefixes, open_ended = _agent_tool_names(agent)
    for case in dataset.cases:
        allowed = names | set(case.tools)
        for name in sorted(case.tool_names()):
            if name in allowed or any(name.startswith(p) for p in prefixes) or open_ended:
                continue
            raise UnknownCaseTool(
                f"case {case.id!r} of dataset {dataset.name!r} names the tool {name!r}, which "
                f"agent {agent.name!r} does not have (it has: "
                f"{', '.join(sorted(names)) or 'none'}); "
                "fix the case, or add the tool to the agent (or to the case's tools)"
            )
        expected = case.expected
        if expected is not None and expected.rubric is not None and judge_model is None:
            raise ConfigurationError(
                f"case {case.id!r} has a rubric, which needs a judge model: give --judge-model "
                "or the dataset's judge_model"
            )
        if expected is not None and expected.type is not None:
            try:
                _import_type(expected.type)
            except Exception as exc:
                raise DatasetError(
                    f"case {case.id!r}: expected.type {expected.type!r} does not import: {exc}",
                    field=f"cases.{dataset.cases.index(case)}.expected.type",
                ) from None
        user = case.user
        if user is not None and user.script is None and user.model is None and user_model is None:
            raise ConfigurationError(
                f"case {case.id!r} has a simulated user with a goal, which needs a model: give "
                "its user.model or --user-model"
            )
        if user is not None and not isinstance(user.done_when, str | None) and judge_model is None:
            raise ConfigurationError(
                f"case {case.id!r}: done_when has a rubric, which needs a judge model: give "
                "--judge-model or the dataset's judge_model"
            )
        checkpoint = None if isinstance(case.input, str) else case.input.checkpoint
        if isinstance(checkpoint, str) and "." not in checkpoint:
            raise DatasetError(
                f"case {case.id!r}: checkpoint {checkpoint!r} is neither a turn count nor "
                "'<run_id>.<sequence>'",
                field=f"cases.{dataset.cases.index(case)}.input.checkpoint",
            )


def _script_model(case: Case) -> Model:
    from loom.messages import ModelResponse, ToolCall
    from loom.testing import ScriptedModel

    responses: list[ModelResponse | str] = []
    for step in case.script or []:
        if isinstance(step, str):
            responses.append(step)
            continue
        calls = [ToolCall(name=step.tool, arguments=step.arguments)] if step.tool else []
        calls += [
            ToolCall(name=str(t.get("name", "")), arguments=dict(t.get("arguments") or {}))
            for t in step.tools
        ]
        responses.append(ModelResponse(text=step.text, tool_calls=calls))
    return ScriptedModel(responses, name="scripted")


async def _expected_checks(
    case: Case, result: RunResult, judge_model: str | Model | None
) -> list[CheckResult]:
    expected = case.expected
    if expected is None:
        return []
    answer = result.text
    if expected.text is not None:
        ok = answer.strip() == expected.text.strip()
        message = (
            "answer equals the expected text"
            if ok
            else f"answer {answer.strip()[:200]!r} is not {expected.text!r}"
        )
        return [CheckResult("expected.text", ok, message)]
    if expected.contains is not None:
        ok = expected.contains in answer
        verb = "contains" if ok else "lacks"
        return [CheckResult("expected.contains", ok, f"answer {verb} {expected.contains!r}")]
    if expected.json_schema is not None:
        try:
            import jsonschema  # type: ignore[import-untyped]
        except ImportError:
            from loom.errors import MissingDependencyError

            raise MissingDependencyError("jsonschema", "all", "expected.json_schema") from None

        try:
            jsonschema.validate(json.loads(answer), expected.json_schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            return [CheckResult("expected.json_schema", False, f"answer is not valid: {message}")]
        return [CheckResult("expected.json_schema", True, "answer matches the JSON schema")]
    if expected.type is not None:
        from pydantic import TypeAdapter, ValidationError

        try:
            TypeAdapter(_import_type(expected.type)).validate_json(answer)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            return [CheckResult("expected.type", False, f"answer is not a {expected.type}: {why}")]
        return [CheckResult("expected.type", True, f"answer is a valid {expected.type}")]
    assert expected.rubric is not None and judge_model is not None
    return [await _judge(case, result, judge_model)]


async def _judge(case: Case, result: RunResult, judge_model: str | Model) -> CheckResult:
    from loom.judge import JudgeContext, JudgePanel, LLMJudge

    rubric = case.expected
    assert rubric is not None
    judges = [
        LLMJudge(judge_model, criterion, name=f"rubric{i + 1}", timeout=60.0)
        for i, criterion in enumerate(rubric.criteria())
    ]
    panel = JudgePanel(judges, rubric.strategy, rubric.threshold, max_retries=1)
    verdict = await panel.evaluate(
        case.message,
        result.text,
        JudgeContext(messages=result.messages, session_id=result.session_id, run_id=result.run_id),
    )
    broken = [j for j in verdict.judges if j.error is not None]
    if broken:
        return CheckResult(
            "rubric",
            False,
            f"the judge could not score the answer: {broken[0].error}",
            errored=True,
            details=verdict.to_dict(),
        )
    reasons = "; ".join(f"{j.name} {j.score:.2f}: {j.reason}" for j in verdict.judges)
    return CheckResult(
        "rubric",
        verdict.passed,
        f"panel ({verdict.strategy}) scored {verdict.score:.2f}, needed {verdict.threshold:.2f}: "
        f"{reasons}",
        score=verdict.score,
        details=verdict.to_dict(),
    )


# runs that ended for a reason outside the agent's control: the case says nothing of the agent
_ERRORED_STOPS = frozenset({"model_error", "error", "cancelled"})


def _score(checks: list[CheckResult]) -> float:
    if not checks:
        return 1.0
    return round(
        sum(c.score if c.score is not None else float(c.passed) for c in checks) / len(checks), 6
    )


async def _run_case(
    runtime: Runtime,
    agent: Agent,
    case: Case,
    model: str | Model | None,
    judge_model: str | Model | None,
    user_model: str | Model | None = None,
) -> CaseResult:
    from loom.engine.run_inputs import AtEvent, AtTurn, RunOptions
    from loom.evals.capture import ReplayEnvironment
    from loom.evals.simulation import Conversation, model_for_run, simulate
    from loom.messages import new_id

    session_id = new_id("eval")
    run_model = _script_model(case) if case.script is not None else model_for_run(model)
    environment = ReplayEnvironment(case.environment) if case.environment is not None else None
    if environment is not None:  # tool calls answered from the recording
        agent = environment.agent(agent)
    conversation: Conversation | None = None
    started = time.perf_counter()
    try:
        if not isinstance(case.input, str):
            point: AtTurn | AtEvent | None = None
            checkpoint = case.input.checkpoint
            if isinstance(checkpoint, int):
                point = AtTurn(checkpoint)
            elif isinstance(checkpoint, str):
                run_id, _, seq = checkpoint.rpartition(".")
                point = AtEvent(run_id, int(seq))
            await runtime.fork(agent, case.input.session, point, new_session_id=session_id)
        options = RunOptions(model=run_model, extra_tools=tuple(case.tools))
        if case.user is not None:
            conversation = await simulate(
                runtime,
                agent,
                case,
                session_id,
                options,
                user_model=user_model,
                judge_model=judge_model,
            )
            if not conversation.results:
                raise InputError(f"the simulated user ended before a turn: {conversation.reason}")
            result = conversation.results[-1]
        else:
            result = await runtime.run(agent, case.message, session_id=session_id, options=options)
    except Exception as exc:  # the run could not be made: say so, the experiment goes on
        return CaseResult(
            case.id,
            "errored",
            0.0,
            error=f"{type(exc).__name__}: {exc}",
            session_id=session_id,
            duration=time.perf_counter() - started,
        )
    duration = time.perf_counter() - started
    if conversation is not None:  # the whole conversation's trajectory
        events = [
            e
            for r in conversation.results
            for e in await runtime.store.load_events(session_id, r.run_id)
        ]
    else:
        events = await runtime.store.load_events(session_id, result.run_id)
    cost = result.usage.cost
    if conversation is not None and all(r.usage.cost is not None for r in conversation.results):
        cost = sum(r.usage.cost or 0.0 for r in conversation.results)
    trajectory = trajectory_from_events(
        events,
        effect_of=agent.effect_of,
        duration=duration,
        cost=cost,
        stop_reason=result.stop_reason,
        output=result.text,
    )
    checks = check_all(parse_assertions(case.assertions), trajectory)
    checks += await _expected_checks(case, result, judge_model)
    if environment is not None:
        checks += environment.checks()
    if conversation is not None:
        checks += conversation.checks()
    status: CaseStatus
    if result.stop_reason in _ERRORED_STOPS or any(c.errored for c in checks):
        status = "errored"
    else:
        status = "passed" if all(c.passed for c in checks) else "failed"
    return CaseResult(
        case.id,
        status,
        _score(checks),
        [c.to_dict() for c in checks],
        result.text,
        result.error,
        trajectory.to_dict(),
        session_id,
        result.run_id,
        cost,
        duration,
        conversation.turns if conversation is not None else [],
    )


class _ProcessKV:
    """Key-value space for a store without one (``MemoryStore``): experiments on it live as long
    as the store object, as everything else on it does."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], Any] = {}

    async def put_value(self, namespace: str, key: str, value: Any) -> None:
        self.data[namespace, key] = json.loads(json.dumps(value))

    async def get_value(self, namespace: str, key: str) -> Any | None:
        return self.data.get((namespace, key))

    async def list_keys(self, namespace: str, prefix: str = "") -> list[str]:
        return sorted(k for n, k in self.data if n == namespace and k.startswith(prefix))

    async def delete_value(self, namespace: str, key: str) -> bool:
        return self.data.pop((namespace, key), None) is not None


_PROCESS_KV: weakref.WeakKeyDictionary[Any, _ProcessKV] = weakref.WeakKeyDictionary()


def _kv(store: Store) -> KVStore:
    from loom.store.base import capabilities_of

    kv = capabilities_of(store).kv
    if kv is not None:
        return kv
    kept = _PROCESS_KV.get(store)
    if kept is None:
        kept = _PROCESS_KV[store] = _ProcessKV()
    return kept


async def list_experiments(store: Store) -> list[ExperimentRecord]:
    """Every stored experiment, newest first."""
    kv = _kv(store)
    records = []
    for key in await kv.list_keys(EXPERIMENTS_NAMESPACE):
        data = await kv.get_value(EXPERIMENTS_NAMESPACE, key)
        if isinstance(data, dict):
            records.append(ExperimentRecord.from_dict(data))
    return sorted(records, key=lambda r: r.started_at, reverse=True)


async def load_experiment(store: Store, experiment_id: str) -> Experiment:
    """A stored experiment and its case results; ``ExperimentNotFound`` when there is none."""
    kv = _kv(store)
    data = await kv.get_value(EXPERIMENTS_NAMESPACE, experiment_id)
    if not isinstance(data, dict):
        raise ExperimentNotFound(
            f"no experiment {experiment_id!r} in this store; see `loom eval list`"
        )
    results = []
    for key in await kv.list_keys(CASES_NAMESPACE, prefix=f"{experiment_id}/"):
        value = await kv.get_value(CASES_NAMESPACE, key)
        if isinstance(value, dict):
            results.append(CaseResult.from_dict(value))
    order = data.get("case_order") or []
    results.sort(key=lambda r: order.index(r.case_id) if r.case_id in order else len(order))
    return Experiment(ExperimentRecord.from_dict(data), results)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


async def _find_unfinished(
    store: Store, fingerprint: str, revision: str, model: str | None
) -> ExperimentRecord | None:
    for record in await list_experiments(store):
        if (
            record.status in ("running", "budget_exhausted")
            and record.dataset_fingerprint == fingerprint
            and record.revision == revision
            and record.model == model
        ):
            return record
    return None


async def run_experiment(
    dataset: Dataset,
    agent: Agent,
    *,
    store: Store,
    dataset_path: str = "",
    model: str | None = None,
    judge_model: str | Model | None = None,
    user_model: str | Model | None = None,
    concurrency: int = 4,
    max_cost: float | None = None,
    resume: str | None = None,
    auto_resume: bool = True,
    on_case: Callable[[CaseResult], None] | None = None,
    owner: str | None = None,
) -> Experiment:
    """Run ``dataset`` on ``agent`` and store the experiment (see the module docstring).

    ``model`` overrides every case's model (default the dataset's ``model``, else the
    agent's); ``max_cost`` (US dollars) stops starting cases once the experiment's runs cost
    that much (cases not run stay to run on a resume); ``resume`` names an experiment to
    finish; with ``auto_resume`` an unfinished experiment of the same dataset, agent revision
    and model is finished instead of a new one started. ``on_case`` is called with each result.
    ``user_model`` plays the simulated user of a case whose ``user`` names no model.
    ``owner``: the API key the experiment belongs to (the console shows it to that key and to
    admin keys only); None, a local run's, is shared: every key sees it.
    """
    from loom.engine.runtime import Runtime
    from loom.messages import new_id

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"concurrency must be a positive integer, got {concurrency!r}")
    if max_cost is not None and max_cost < 0:
        raise InputError(f"max_cost must be US dollars >= 0, got {max_cost!r}")
    judge = judge_model if judge_model is not None else dataset.judge_model
    model_spec = model if model is not None else dataset.model
    check_dataset(dataset, agent, judge_model=judge, user_model=user_model)
    kv = _kv(store)
    revision = agent_revision(agent)
    fingerprint = dataset.fingerprint()
    record: ExperimentRecord | None = None
    if resume is not None:
        record = (await load_experiment(store, resume)).record
        if (
            record.dataset_fingerprint != fingerprint
            or record.revision != revision
            or record.model != model_spec
        ):
            raise InputError(
                f"experiment {resume!r} measured another dataset, agent revision or model "
                f"(dataset {record.dataset_fingerprint}, agent {record.revision}, model "
                f"{record.model}; now {fingerprint}, {revision}, {model_spec}); start a new "
                "experiment instead of resuming it"
            )
    elif auto_resume:
        record = await _find_unfinished(store, fingerprint, revision, model_spec)
    if record is None:
        record = ExperimentRecord(
            new_id("exp"),
            dataset.name,
            dataset_path,
            fingerprint,
            agent.name,
            revision,
            model_spec,
            _now(),
            cases=len(dataset.cases),
            owner=owner,
        )
    record.status = "running"
    await kv.put_value(EXPERIMENTS_NAMESPACE, record.id, record.to_dict() | _case_order(dataset))
    kept = (await load_experiment(store, record.id)).results  # from an interrupted attempt
    done = {r.case_id for r in kept}
    runtime = Runtime(store)
    gate = asyncio.Semaphore(concurrency)
    spent = [sum(r.cost or 0.0 for r in kept)]  # the budget counts what was spent before
    ran = [0]
    budget_hit = [False]

    async def one(case: Case) -> None:
        async with gate:
            if max_cost is not None and spent[0] >= max_cost:
                budget_hit[0] = True
                return
            result = await _run_case(runtime, agent, case, model_spec, judge, user_model)
            spent[0] += result.cost or 0.0
            ran[0] += 1
            # stored the moment it is scored: a crash after this line does not run it again
            await kv.put_value(CASES_NAMESPACE, f"{record.id}/{case.id}", result.to_dict())
            if on_case is not None:
                on_case(result)

    try:
        await asyncio.gather(*(one(c) for c in dataset.cases if c.id not in done))
    finally:
        await runtime.aclose()
    experiment = await load_experiment(store, record.id)
    results = experiment.results
    record.passed = sum(1 for r in results if r.status == "passed")
    record.failed = sum(1 for r in results if r.status == "failed")
    record.errored = sum(1 for r in results if r.status == "errored")
    judged = [r for r in results if r.status != "errored"]
    record.score = round(sum(r.score for r in judged) / len(judged), 6) if judged else 0.0
    record.cost = round(sum(r.cost or 0.0 for r in results), 6)
    if budget_hit[0] or len(results) < len(dataset.cases):
        record.status = "budget_exhausted"
    else:
        record.status = "finished"
        record.finished_at = _now()
    await kv.put_value(EXPERIMENTS_NAMESPACE, record.id, record.to_dict() | _case_order(dataset))
    return Experiment(record, results, ran[0])


def _case_order(dataset: Dataset) -> dict[str, Any]:
    """The case order stored with an experiment's header (its results are listed in it)."""
    return {"case_order": [c.id for c in dataset.cases]}
