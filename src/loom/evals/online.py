"""Online evaluation: a sample of live runs scored in a background job, never on the turn path.

```python
from loom.evals.online import OnlineSettings
from loom.schedule import MaintenanceSettings

online = OnlineSettings.from_mapping({
    "sample": 0.1,
    "evaluators": [
        {"stop_reason": "completed"},
        {"cost": {"max": 0.05}},
        {"not_called": "delete_account"},
        {"rubric": "The answer is polite and correct.", "judge_model": "openai:gpt-4o-mini"},
    ],
})
maintenance = MaintenanceSettings(online=online)   # the scheduler's ``evaluate`` job
```

``loom serve`` and ``loom worker`` read the same mapping from the YAML file
``LOOM_EVAL_ONLINE`` names (``settings_from_env``).

**Which runs.** A run is sampled when the first 8 bytes of ``sha256(run_id)`` read as a
fraction below ``sample``: every process (and every retry) agrees on the same runs without
talking to the others. Only finished runs are read (an ``AGENT_FINISH`` in the journal), of
the agents ``agents`` names (all when None); an experiment's case sessions (``eval_…``) are
scored by their experiment and left out.

**Evaluators.** The trajectory assertions of ``loom.evals.assertions`` that make sense without
a dataset (:data:`ONLINE_ASSERTIONS`: stop reason, model calls / tokens / cost / duration
bounds, tools not called, at most N calls, effects, guardrails), read from the run's journal
events, and judge panels (``{"rubric": criteria, "judge_model": ..., "strategy": ...,
"threshold": ...}``: one ``LLMJudge`` per criterion, combined by ``loom.judge.JudgePanel``).

**Where scores go.** One KV record per evaluated run (namespace :data:`ONLINE_NS`, key the run
id; ``online_score(store, run_id)`` reads it): the run's journal is append-only and its
``RunRecord`` is written by the turn, so the score sits beside it, keyed by the run id. The
record is also the run's done-marker: a run whose record is ``scored`` is never scored again,
whatever crashes or retries happen (a crash between the judge's answer and the write costs one
more judge call, never a second score). Each score is exported as a ``loom.eval`` span
(``loom.observability.emit_eval_span``) in the run's trace: the run's ``invoke_agent`` span
ended when the run did, so the eval span is a new span whose parent is the run's span (its
W3C traceparent, kept in the run's ``AGENT_START`` event) and which links to it.

**A judge whose model is down.** The run's record says ``errored`` with the error and the
attempt count; the next job runs try again, up to ``attempts`` times, then the record says
``gave_up`` and the run is left alone. The job itself succeeds (its summary counts the
errored runs): retrying it seconds later would spend the attempts on the same outage.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import ConfigurationError, InputError, SessionNotFound
from loom.evals.assertions import (
    Assertion,
    CheckResult,
    check_all,
    parse_assertions,
    trajectory_from_events,
)

if TYPE_CHECKING:
    from loom.events import AgentEvent
    from loom.models.base import Model
    from loom.store.base import KVStore, SessionInfo, Store

__all__ = [
    "EXPERIMENT_SESSION",
    "ONLINE_ASSERTIONS",
    "ONLINE_NS",
    "ONLINE_STATE_NS",
    "OnlineEvaluator",
    "OnlineReport",
    "OnlineSettings",
    "RubricEvaluator",
    "ScoreStatus",
    "evaluate_once",
    "job_run",
    "online_score",
    "online_scores",
    "online_settings_of",
    "sampled",
    "set_online_settings",
    "settings_from_env",
]

log = logging.getLogger("loom.evals.online")

ONLINE_NS = "loom.evals.online"
"""KV: one record per evaluated run, keyed by the run id (its score, or its error)."""
ONLINE_STATE_NS = "loom.evals.online_state"
"""KV: the job's cursor (key ``cursor``)."""
ONLINE_ASSERTIONS = frozenset(
    {
        "stop_reason",
        "model_calls",
        "tokens",
        "cost",
        "duration",
        "not_called",
        "calls_at_most",
        "effects",
        "guardrail",
    }
)
"""The assertion kinds an online evaluator may use: those that need no dataset's case."""
SETTLE_SECONDS = 60.0
"""Sessions updated up to this long before the cursor are read again (a commit stamped
before the cursor moved but landed after is not missed; the done-markers make it free)."""

EXPERIMENT_SESSION = "eval_"
"""The prefix of an experiment's case sessions (``run_experiment``): scored by the experiment,
never sampled online."""

ScoreStatus = Literal["scored", "errored", "gave_up"]


@dataclass(frozen=True, slots=True)
class RubricEvaluator:
    """A judge panel on the run's final answer: one ``LLMJudge`` per criterion on
    ``judge_model``, combined by ``strategy`` against ``threshold``."""

    criteria: tuple[str, ...]
    judge_model: str | Model
    strategy: Literal["mean", "median", "min", "max", "weighted", "vote"] = "mean"
    threshold: float = 0.7
    name: str = "rubric"


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """Which live runs are scored, how, and how often (``MaintenanceSettings.online``).

    Args:
        sample: The share of runs scored, 0..1 (by run id hash: :func:`sampled`).
        assertions: Trajectory assertions (mappings as in a dataset's case), of the kinds in
            :data:`ONLINE_ASSERTIONS`.
        rubrics: Judge panels on the final answer.
        agents: The agents whose runs are sampled (None: every agent).
        every: Seconds between the scheduler's job runs.
        max_runs: Runs scored by one job run at most (the next run carries on).
        attempts: Tries a run's evaluation gets when a judge's model is down, then ``gave_up``.
        judge_timeout: Seconds one judge may take before it counts as down.
    """

    sample: float
    assertions: tuple[Mapping[str, Any], ...] = ()
    rubrics: tuple[RubricEvaluator, ...] = ()
    agents: tuple[str, ...] | None = None
    every: float = 300.0
    max_runs: int = 200
    attempts: int = 3
    judge_timeout: float = 60.0
    checks: tuple[Assertion, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rate = self.sample
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ConfigurationError(
                f"online.sample is the share of runs scored, a number from 0 to 1, got {rate!r}"
            )
        for name in ("max_runs", "attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"online.{name} must be an integer >= 1, got {value!r}")
        for name in ("every", "judge_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"online.{name} must be seconds > 0, got {value!r}")
        for raw in self.assertions:
            kind = next(iter(raw), None) if isinstance(raw, Mapping) else None
            if kind is not None and kind not in ONLINE_ASSERTIONS:
                raise ConfigurationError(
                    f"online evaluator {kind!r} needs a dataset's case; online runs take "
                    f"{', '.join(sorted(ONLINE_ASSERTIONS))} and rubric"
                )
        try:
            checks = parse_assertions([dict(a) for a in self.assertions])
        except ValueError as exc:
            raise ConfigurationError(f"online.evaluators: {exc}") from None
        if not checks and not self.rubrics:
            raise ConfigurationError(
                "online evaluation needs at least one evaluator (an assertion such as "
                "{stop_reason: completed}, or a rubric with a judge_model)"
            )
        object.__setattr__(self, "checks", tuple(checks))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> OnlineSettings:
        """Settings from ``{sample, evaluators: [...], agents?, every?, max_runs?, attempts?,
        judge_timeout?}`` (an agent file's or a settings file's ``online:``); an evaluator is
        an assertion mapping or ``{rubric, judge_model, strategy?, threshold?, name?}``."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(
                f"online: write a mapping {{sample, evaluators}}, got {type(data).__name__}"
            )
        known = {"sample", "evaluators", "agents", "every", "max_runs", "attempts"}
        known.add("judge_timeout")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(
                f"online: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        if "sample" not in data:
            raise ConfigurationError("online: sample (the share of runs scored, 0..1) is missing")
        assertions: list[Mapping[str, Any]] = []
        rubrics: list[RubricEvaluator] = []
        raw_evaluators = data.get("evaluators") or []
        if not isinstance(raw_evaluators, list):
            raise ConfigurationError("online.evaluators is a list of evaluators")
        for i, raw in enumerate(raw_evaluators):
            if isinstance(raw, Mapping) and "rubric" in raw:
                rubrics.append(_rubric(i, raw))
            elif isinstance(raw, Mapping) and len(raw) == 1:
                assertions.append(dict(raw))
            else:
                raise ConfigurationError(
                    f"online.evaluators.{i}: write an assertion ({{stop_reason: completed}}) or "
                    f"a rubric ({{rubric: ..., judge_model: ...}}), got {raw!r}"
                )
        agents = data.get("agents")
        if agents is not None and (
            not isinstance(agents, list) or not all(isinstance(a, str) for a in agents)
        ):
            raise ConfigurationError("online.agents is a list of agent names")
        extra = {
            k: data[k] for k in ("every", "max_runs", "attempts", "judge_timeout") if k in data
        }
        return cls(
            data["sample"],
            tuple(assertions),
            tuple(rubrics),
            None if agents is None else tuple(agents),
            **extra,
        )

    def wants(self, agent: str) -> bool:
        """Whether runs of ``agent`` are evaluated."""
        return self.agents is None or agent in self.agents


def _rubric(i: int, raw: Mapping[str, Any]) -> RubricEvaluator:
    criteria = raw["rubric"]
    if isinstance(criteria, str):
        criteria = [criteria]
    if isinstance(criteria, list) and not criteria:
        criteria = None
    if not isinstance(criteria, list) or not all(isinstance(c, str) and c for c in criteria):
        raise ConfigurationError(f"online.evaluators.{i}.rubric: a criterion or a list of them")
    judge_model = raw.get("judge_model")
    if judge_model is None:
        raise ConfigurationError(
            f"online.evaluators.{i}: a rubric needs judge_model (e.g. openai:gpt-4o-mini)"
        )
    unknown = sorted(set(raw) - {"rubric", "judge_model", "strategy", "threshold", "name"})
    if unknown:
        raise ConfigurationError(f"online.evaluators.{i}: unknown field(s) {', '.join(unknown)}")
    from loom.judge import STRATEGIES

    strategy = raw.get("strategy", "mean")
    if strategy not in STRATEGIES:
        raise ConfigurationError(
            f"online.evaluators.{i}.strategy {strategy!r}: one of {', '.join(STRATEGIES)}"
        )
    threshold = raw.get("threshold", 0.7)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not (0 <= threshold <= 1)
    ):
        raise ConfigurationError(f"online.evaluators.{i}.threshold: a number from 0 to 1")
    return RubricEvaluator(
        tuple(criteria), judge_model, strategy, float(threshold), str(raw.get("name", "rubric"))
    )


_AGENT_SETTINGS: weakref.WeakKeyDictionary[Any, OnlineSettings] = weakref.WeakKeyDictionary()


def set_online_settings(agent: object, settings: OnlineSettings) -> None:
    """Attach online evaluation settings to ``agent`` (an agent file's ``online:`` block does,
    through ``loom.definition.build_agent``)."""
    _AGENT_SETTINGS[agent] = settings


def online_settings_of(agent: object) -> OnlineSettings | None:
    """The online evaluation settings an agent's file gave it, or None."""
    try:
        return _AGENT_SETTINGS.get(agent)
    except TypeError:  # not weakly referenceable: nothing was attached to it
        return None


def settings_from_env(env: Mapping[str, str] | None = None) -> OnlineSettings | None:
    """The settings in the YAML file ``LOOM_EVAL_ONLINE`` names (the mapping
    ``OnlineSettings.from_mapping`` takes); None when it is unset. A file that cannot be read
    or is wrong is a ``ConfigurationError`` naming the variable."""
    e = os.environ if env is None else env
    path = e.get("LOOM_EVAL_ONLINE", "").strip()
    if not path:
        return None
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"LOOM_EVAL_ONLINE={path!r}: cannot read it: {exc}") from None
    if isinstance(data, Mapping) and isinstance(data.get("online"), Mapping):
        data = data["online"]
    try:
        return OnlineSettings.from_mapping(data)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOOM_EVAL_ONLINE={path!r}: {exc}") from None


def sampled(run_id: str, rate: float) -> bool:
    """Whether ``run_id`` is in a ``rate`` sample: the first 8 bytes of its SHA-256 as a
    fraction of 2**64, below ``rate``. The same in every process, on every retry."""
    if rate >= 1:
        return True
    if rate <= 0:
        return False
    digest = hashlib.sha256(run_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass(slots=True)
class OnlineReport:
    """One job run: runs ``scored``, ``errored`` (retried later), ``gave_up`` and ``skipped``
    (not in the sample, or another agent's), with the errors met."""

    scored: int = 0
    errored: int = 0
    gave_up: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {
            "scored": self.scored,
            "errored": self.errored,
            "gave_up": self.gave_up,
            "skipped": self.skipped,
            "errors": list(self.errors),
        }


def _kv_of(store: Store) -> KVStore:
    from loom.store.base import capabilities_of

    kv = capabilities_of(store).kv
    if kv is None:
        raise ConfigurationError(
            f"online evaluation keeps its scores in key-values, which {type(store).__name__} "
            "lacks; use SQLiteStore or PostgresStore"
        )
    return kv


async def online_score(store: Store, run_id: str) -> dict[str, Any] | None:
    """The run's online evaluation record (``status``, ``score``, ``passed``, ``checks``,
    ``attempts``, ``error``, ``at``), or None when it was not evaluated (yet)."""
    from loom.store.base import capabilities_of

    kv = capabilities_of(store).kv
    if kv is None:
        return None
    value = await kv.get_value(ONLINE_NS, run_id)
    return value if isinstance(value, dict) else None


async def online_scores(store: Store, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The evaluation records of those of ``run_ids`` that have one."""
    out: dict[str, dict[str, Any]] = {}
    for run_id in run_ids:
        found = await online_score(store, run_id)
        if found is not None:
            out[run_id] = found
    return out


class OnlineEvaluator:
    """The ``evaluate`` job over ``store``: ``run()`` scores the sampled finished runs not
    scored yet (see the module docstring). ``settings`` apply to every agent they name;
    ``per_agent`` (an agent file's ``online:`` block, by agent name) to that agent instead.
    ``tracer_provider``: where ``loom.eval`` spans go (default the global one)."""

    def __init__(
        self,
        store: Store,
        settings: OnlineSettings | None,
        *,
        per_agent: Mapping[str, OnlineSettings] | None = None,
        clock: Callable[[], float] = time.time,
        tracer_provider: Any = None,
    ) -> None:
        self.store = store
        self.kv = _kv_of(store)
        self.per_agent = dict(per_agent or {})
        if settings is None and not self.per_agent:
            raise ConfigurationError("OnlineEvaluator needs settings, or an agent's")
        self.settings = settings
        every = [x for x in (settings, *self.per_agent.values()) if x is not None]
        self.max_runs = max(x.max_runs for x in every)
        self.every = min(x.every for x in every)
        self.clock = clock
        self.tracer_provider = tracer_provider

    def settings_for(self, agent: str) -> OnlineSettings | None:
        """The settings runs of ``agent`` are scored with (None: they are not)."""
        own = self.per_agent.get(agent)
        if own is not None:
            return own
        return self.settings if self.settings is not None and self.settings.wants(agent) else None

    async def run(self) -> OnlineReport:
        """One job run: read the sessions updated since the cursor, score their new runs."""
        report = OnlineReport()
        cursor = await self._cursor()
        sessions = await self.store.list_sessions(limit=0)
        if cursor is not None:
            since = cursor - timedelta(seconds=SETTLE_SECONDS)
            sessions = [s for s in sessions if s.updated_at >= since]
        sessions.sort(key=lambda s: (s.updated_at, s.id))
        advance_to: datetime | None = None
        blocked = False
        budget = [self.max_runs]
        for info in sessions:
            complete = await self._session(info, report, budget)
            if not complete:
                blocked = True
            elif not blocked:
                advance_to = info.updated_at
            if budget[0] <= 0:
                break
        if advance_to is not None and (cursor is None or advance_to > cursor):
            await self.kv.put_value(
                ONLINE_STATE_NS, "cursor", {"updated_at": advance_to.isoformat()}
            )
        return report

    async def _cursor(self) -> datetime | None:
        value = await self.kv.get_value(ONLINE_STATE_NS, "cursor")
        if isinstance(value, dict) and isinstance(value.get("updated_at"), str):
            try:
                return datetime.fromisoformat(value["updated_at"])
            except ValueError:
                log.warning("online eval cursor %r is not a time; reading every session", value)
        return None

    async def _session(self, info: SessionInfo, report: OnlineReport, budget: list[int]) -> bool:
        """Score the session's sampled runs; True when none is left to retry."""
        from loom.events import AgentFinish, EventType

        settings = self.settings_for(info.agent_name)
        if settings is None or info.id.startswith(EXPERIMENT_SESSION):
            return True
        try:
            finishes = [
                e
                for e in await self._events_of(info.id, (EventType.AGENT_FINISH,))
                if isinstance(e, AgentFinish) and e.session_id in ("", info.id)
            ]
        except (InputError, SessionNotFound):  # deleted while being read
            return True
        complete = True
        for finish in finishes:
            if not sampled(finish.run_id, settings.sample):
                report.skipped += 1
                continue
            done = await self.kv.get_value(ONLINE_NS, finish.run_id)
            if isinstance(done, dict) and done.get("status") in ("scored", "gave_up"):
                continue
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            prior = int(done.get("attempts", 0)) if isinstance(done, dict) else 0
            if not await self._score(settings, info, finish, prior, report):
                complete = False
        return complete

    async def _events_of(self, session_id: str, types: Sequence[Any]) -> list[AgentEvent]:
        from loom.store.base import capabilities_of

        typed = capabilities_of(self.store).typed_events
        if typed is not None:
            return await typed.load_events_of_type(session_id, types)
        return [e for e in await self.store.load_events(session_id) if e.type in types]

    async def _score(
        self,
        settings: OnlineSettings,
        info: SessionInfo,
        finish: Any,
        prior: int,
        report: OnlineReport,
    ) -> bool:
        """Evaluate one run and write its record; True unless it errored (to retry)."""
        from loom.events import AgentStart, UserMessage

        events = await self.store.load_events(info.id, finish.run_id)
        usage = finish.usage or {}
        cost = usage.get("cost")
        trajectory = trajectory_from_events(
            events,
            duration=float(finish.duration_ms or 0.0) / 1000,
            cost=float(cost) if isinstance(cost, int | float) else None,
            stop_reason=finish.stop_reason,
            output=finish.output,
        )
        checks = check_all(settings.checks, trajectory)
        question = ""
        traceparent: str | None = None
        for event in events:
            if isinstance(event, UserMessage) and not event.metadata.get("judge_correction"):
                question = event.content
            elif isinstance(event, AgentStart):
                question = question or event.message_text
                carried = event.extra.get("traceparent")
                traceparent = carried if isinstance(carried, str) else traceparent
        for rubric in settings.rubrics:
            checks.append(await self._judge(settings, rubric, question, finish, info.id))
        attempts = prior + 1
        errored = [c for c in checks if c.errored]
        record: dict[str, Any] = {
            "run_id": finish.run_id,
            "session_id": info.id,
            "agent": info.agent_name,
            "checks": [c.to_dict() for c in checks],
            "attempts": attempts,
            "at": self.clock(),
        }
        if errored:
            error = errored[0].message
            status: ScoreStatus = "gave_up" if attempts >= settings.attempts else "errored"
            record.update(status=status, error=error, score=None, passed=None)
            report.errors.append(f"run {finish.run_id!r}: {error}")
            if status == "gave_up":
                report.gave_up += 1
            else:
                report.errored += 1
            log.warning(
                "online eval of run %s: %s (attempt %d of %d)",
                finish.run_id,
                error,
                attempts,
                settings.attempts,
            )
        else:
            score = round(
                sum(c.score if c.score is not None else float(c.passed) for c in checks)
                / len(checks),
                6,
            )
            record.update(
                status="scored", score=score, passed=all(c.passed for c in checks), error=None
            )
            report.scored += 1
        # the done-marker: written once the evaluation is complete, so a crash before this
        # line evaluates the run again and a crash after it never does
        await self.kv.put_value(ONLINE_NS, finish.run_id, record)
        from loom.observability.otel import emit_eval_span

        emit_eval_span(record, traceparent, tracer_provider=self.tracer_provider)
        return not errored or record["status"] == "gave_up"

    async def _judge(
        self,
        settings: OnlineSettings,
        rubric: RubricEvaluator,
        question: str,
        finish: Any,
        session_id: str,
    ) -> CheckResult:
        from loom.judge import JudgeContext, JudgePanel, LLMJudge

        judges = [
            LLMJudge(
                rubric.judge_model,
                c,
                name=f"{rubric.name}{i + 1}",
                timeout=settings.judge_timeout,
            )
            for i, c in enumerate(rubric.criteria)
        ]
        panel = JudgePanel(
            judges,
            rubric.strategy,
            rubric.threshold,
            max_retries=1,
            timeout=settings.judge_timeout,
        )
        verdict = await panel.evaluate(
            question,
            finish.output,
            JudgeContext(session_id=session_id, run_id=finish.run_id),
        )
        broken = [j for j in verdict.judges if j.error is not None]
        if broken:
            return CheckResult(
                rubric.name,
                False,
                f"the judge could not score the answer: {broken[0].error}",
                errored=True,
                details=verdict.to_dict(),
            )
        return CheckResult(
            rubric.name,
            verdict.passed,
            f"panel ({verdict.strategy}) scored {verdict.score:.2f}, needed "
            f"{verdict.threshold:.2f}",
            score=verdict.score,
            details=verdict.to_dict(),
        )


def job_run(evaluator: OnlineEvaluator) -> Callable[[], Any]:
    """The scheduler's job body: one run. A run whose judge was down is not a failed job: its
    record counts its attempts and the next ticks retry it (a ``JobRunner`` retry seconds
    later would spend those attempts on the same outage)."""

    async def run() -> dict[str, Any]:
        return (await evaluator.run()).to_dict()

    return run


async def evaluate_once(store: Store, settings: OnlineSettings) -> OnlineReport:
    """One online evaluation run over ``store`` (what the job does each tick)."""
    return await OnlineEvaluator(store, settings).run()
