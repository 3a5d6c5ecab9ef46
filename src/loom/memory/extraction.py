"""Extraction off the turn path: a background job that turns finished turns into memories.

The job (``builtin_jobs``' ``extract``, or ``loom memory extract`` once) reads the sessions
updated since its cursor, finds their finished turns (a run that ended ``completed``: the
user's messages since the previous such run and the run's final answer, read from the
journal), sends each turn it has not done yet to its own model with :data:`EXTRACTION_PROMPT`,
and writes what the model answers (JSON ``{"memories": [{"text": ..., "key"?: ...}]}``) as
items ``{"text": ..., "source": {"session": ..., "turn": ...}}`` into the namespace
``ExtractionSettings.namespace`` names for the session's owner (the API key that owns the
thread, KV ``loom.server.thread_owner``; ``{owner}`` is ``"shared"`` without one), owned by
that owner.

It never runs inside a turn, and nothing it does is charged to the sessions it reads: it only
reads them, and writes items and its own bookkeeping (KV namespaces ``loom.memory.*``).

Exactly once per turn, across crashes and retries:

1. the item key is a hash of (session, turn, index): a retry overwrites, never duplicates;
2. before the items, a *pending* record lists the keys about to be written (a retry whose
   answer is shorter deletes the keys it no longer writes);
3. after the items, a *done* marker per (session, turn): a finished turn is never sent to the
   model again.

A crash between 1 and 3 costs one more model call for that turn and leaves the same items.

A malformed answer is recorded as the turn's error and retried on the next runs, up to
``attempts`` answers; then the turn is skipped (done, with a warning). A model that is down
(it raises, or times out) stops the run with ``stopped="model_error"`` and nothing of that
turn written; the scheduler's job retries later. Each run has its own budget: at most
``max_turns`` turns, ``max_tokens`` tokens and ``max_cost`` dollars (the runtime's prices,
``loom.pricing``), checked before each call; the run then stops cleanly with
``stopped="budget"`` and the next one carries on where it stopped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE
from loom.errors import ConfigurationError, InputError, JobFailed, SessionNotFound
from loom.events import AgentFinish, EventType, SessionBranch, UserMessage
from loom.messages import Message, Usage
from loom.store.base import capabilities_of
from loom.store.items import check_namespace

if TYPE_CHECKING:
    from loom.memory.tokens import TokenCounter
    from loom.models.base import Model
    from loom.pricing import PriceTable
    from loom.store.base import ItemStore, KVStore, SessionInfo, Store

__all__ = [
    "DONE_NS",
    "EXTRACTION_PROMPT",
    "PENDING_NS",
    "STATE_NS",
    "THREAD_OWNER_NS",
    "ExtractedMemory",
    "Extraction",
    "ExtractionReport",
    "ExtractionSettings",
    "Extractor",
    "FinishedTurn",
    "ProgressFn",
    "extract_memories",
    "finished_turns",
    "job_run",
    "memory_key",
    "settings_from_env",
]

log = logging.getLogger("loom.memory.extraction")

THREAD_OWNER_NS = SESSION_OWNER_NAMESPACE
"""Where the front door records a session's owner (the API key's name; read here as the
namespace owner of the memories a session's turns become)."""
DONE_NS = "loom.memory.extracted"
"""KV: one marker per (session, turn) extracted or skipped."""
PENDING_NS = "loom.memory.extracting"
"""KV: a turn in progress: the keys about to be written, the malformed answers so far."""
STATE_NS = "loom.memory.extraction"
"""KV: the job's cursor (key ``cursor``)."""

_SEP = "\x1f"  # between session and turn in a KV key: no session id holds it
SETTLE_SECONDS = 60.0
"""Sessions updated up to this long before the cursor are read again: a commit whose
timestamp was taken before the cursor moved but landed after is not missed (the done markers
make a second reading cost no model call)."""

EXTRACTION_PROMPT = """\
You read one exchange between a user and an assistant and pick out what is worth remembering \
in later, separate conversations with the same user: facts about the user and their situation, \
preferences, names, decisions and commitments. Each memory is one short, self-contained \
sentence that makes sense without the exchange ("The user's dog is called Rex."). Leave out \
small talk, the assistant's own statements, and anything that only matters for this exchange. \
Add a short "key" (such as "dog_name") only when the memory is about a stable topic.

Answer with JSON only, in exactly this shape:
{"memories": [{"text": "...", "key": "..."}]}
Answer {"memories": []} when nothing is worth keeping."""


class ExtractedMemory(BaseModel):
    """One memory in the extraction model's answer."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field(min_length=1, max_length=2000)
    key: str | None = Field(default=None, max_length=128)


class Extraction(BaseModel):
    """The extraction model's whole answer: ``{"memories": [...]}``."""

    model_config = ConfigDict(extra="ignore")

    memories: list[ExtractedMemory]


@dataclass(frozen=True, slots=True)
class ExtractionSettings:
    """How the extraction job runs (``MaintenanceSettings.extraction``, ``loom memory
    extract``; ``LOOM_MEMORY_EXTRACT*`` for ``loom serve`` and ``loom worker``).

    Args:
        model: The extraction model: a model string (``"openai:gpt-4o-mini"``, ``"local"``) or
            a ``Model``; None: ``$LOOM_MODEL``, then the embedded local model.
        namespace: Where memories go; ``{owner}`` is the session owner's key name
            (``"shared"`` without one), ``{agent}`` the session's agent. The default is
            ``MemoryConfig.store_namespace``'s, so ``recall_memories`` finds them.
        every: Seconds between the scheduler's runs.
        max_turns / max_tokens / max_cost: One run's budget (None: no limit): turns sent to the
            model, tokens (reported by the provider, else estimated), dollars (priced with the
            runtime's prices; a limit needs the model's price).
        attempts: Malformed answers a turn may get before it is skipped.
        max_memories: Memories kept from one turn (the rest are dropped).
        max_turn_chars: The user's and the assistant's text are each cut to this many
            characters before they are sent.
        call_timeout: Seconds one model call may take before the model counts as down.
        prompt: The extraction instructions (a system message).
    """

    model: str | Model | None = None
    namespace: tuple[str, ...] = ("memories", "{owner}")
    every: float = 300.0
    max_turns: int | None = 50
    max_tokens: int | None = 100_000
    max_cost: float | None = None
    attempts: int = 3
    max_memories: int = 10
    max_turn_chars: int = 8000
    call_timeout: float = 120.0
    prompt: str = EXTRACTION_PROMPT

    def __post_init__(self) -> None:
        if isinstance(self.namespace, str) or not self.namespace:
            raise ConfigurationError(
                "ExtractionSettings.namespace is a non-empty tuple of strings such as "
                f"('memories', '{{owner}}'), got {self.namespace!r}"
            )
        for part in self.namespace:
            try:
                filled = part.format(owner="x", agent="x") if isinstance(part, str) else ""
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigurationError(
                    f"ExtractionSettings.namespace part {part!r} may only use {{owner}} and "
                    f"{{agent}}: {exc!r}"
                ) from None
            if not filled or "." in filled:
                raise ConfigurationError(
                    f"ExtractionSettings.namespace part {part!r} must be a non-empty string "
                    "without '.'"
                )
        for name in ("max_turns", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigurationError(
                    f"ExtractionSettings.{name} must be an integer >= 1 or None, got {value!r}"
                )
        if self.max_cost is not None and (
            isinstance(self.max_cost, bool)
            or not isinstance(self.max_cost, int | float)
            or self.max_cost < 0
        ):
            raise ConfigurationError(
                f"ExtractionSettings.max_cost must be dollars >= 0 or None, got {self.max_cost!r}"
            )
        for name in ("attempts", "max_memories", "max_turn_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"ExtractionSettings.{name} must be an integer >= 1, got {value!r}"
                )
        for name in ("every", "call_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(
                    f"ExtractionSettings.{name} must be a number of seconds > 0, got {value!r}"
                )


def settings_from_env(env: dict[str, str] | None = None) -> ExtractionSettings | None:
    """The settings ``LOOM_MEMORY_EXTRACT`` (the model: ``openai:gpt-4o-mini``, ``local``)
    turns on, with ``LOOM_MEMORY_EXTRACT_EVERY``, ``_MAX_TURNS``, ``_MAX_TOKENS``,
    ``_MAX_COST`` and ``_NAMESPACE`` (dotted: ``memories.{owner}``); None when it is unset.
    A bad value is a ``ConfigurationError`` naming the variable."""
    e = os.environ if env is None else env
    model = e.get("LOOM_MEMORY_EXTRACT", "").strip()
    if not model:
        return None
    values: dict[str, Any] = {"model": model}

    def number(name: str, field_name: str, kind: type[int] | type[float]) -> None:
        raw = e.get(name, "").strip()
        if not raw:
            return
        if raw.lower() in ("none", "off"):
            values[field_name] = None
            return
        try:
            values[field_name] = kind(raw)
        except ValueError:
            raise ConfigurationError(
                f"{name}={raw!r} is not a number; write e.g. {name}=100"
            ) from None

    number("LOOM_MEMORY_EXTRACT_EVERY", "every", float)
    number("LOOM_MEMORY_EXTRACT_MAX_TURNS", "max_turns", int)
    number("LOOM_MEMORY_EXTRACT_MAX_TOKENS", "max_tokens", int)
    number("LOOM_MEMORY_EXTRACT_MAX_COST", "max_cost", float)
    dotted = e.get("LOOM_MEMORY_EXTRACT_NAMESPACE", "").strip()
    if dotted:
        values["namespace"] = tuple(dotted.split("."))
    try:
        return ExtractionSettings(**values)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOOM_MEMORY_EXTRACT*: {exc}") from None


@dataclass(slots=True)
class ExtractionReport:
    """What one run did: ``turns`` sent to the model, ``memories`` written, turns ``skipped``
    (malformed too often, a namespace the owner cannot have, a session deleted meanwhile),
    why it ``stopped`` early (``"budget"``, ``"model_error"``; None: it did everything),
    the errors met, and the run's own ``usage``."""

    turns: int = 0
    memories: int = 0
    skipped: int = 0
    stopped: Literal["budget", "model_error"] | None = None
    errors: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    def to_dict(self) -> dict[str, Any]:
        """``{"turns", "memories", "skipped", "stopped"}`` plus ``errors``, ``tokens``, ``cost``."""
        return {
            "turns": self.turns,
            "memories": self.memories,
            "skipped": self.skipped,
            "stopped": self.stopped,
            "errors": list(self.errors),
            "tokens": self.usage.total_tokens,
            "cost": self.usage.cost,
        }


@dataclass(frozen=True, slots=True)
class FinishedTurn:
    """A turn that ended with an answer: its run id, the user's text, the final answer."""

    session_id: str
    turn: str
    user: str
    assistant: str


def memory_key(session_id: str, turn: str, index: int) -> str:
    """The item key of the ``index``-th memory extracted from ``turn`` of ``session_id``: the
    same on every retry, so a retry overwrites instead of adding."""
    digest = hashlib.sha256(f"{session_id}{_SEP}{turn}{_SEP}{index}".encode()).hexdigest()
    return "x_" + digest[:32]


def _turn_key(session_id: str, turn: str) -> str:
    return f"{session_id}{_SEP}{turn}"


async def finished_turns(store: Store, session_id: str) -> list[FinishedTurn]:
    """The session's turns that ended ``completed``, oldest first, read from its journal
    (``USER_MESSAGE``, ``AGENT_FINISH`` and ``SESSION_BRANCH`` events, through the store's
    index of event types when it has one). The user's text is every message since the
    previous completed turn (a turn resumed after an approval is one turn). A fork's shared
    turns keep the session they were made in (its ``SESSION_BRANCH`` names the source), so
    they are not extracted twice."""
    wanted = (EventType.USER_MESSAGE, EventType.AGENT_FINISH, EventType.SESSION_BRANCH)
    typed = capabilities_of(store).typed_events
    if typed is not None:
        events = await typed.load_events_of_type(session_id, wanted)
    else:
        events = [e for e in await store.load_events(session_id) if e.type in wanted]
    # a fork's own SESSION_BRANCH is its last "fork" one: what precedes it is its source's
    forked_at, source = 0, None
    for i, event in enumerate(events):
        if isinstance(event, SessionBranch) and event.reason == "fork":
            forked_at, source = i, event.point.get("session_id")
    origin: dict[str, str] = {}
    if isinstance(source, str) and source != session_id:
        origin = {t.turn: t.session_id for t in await finished_turns(store, source)}
    out: list[FinishedTurn] = []
    said: list[str] = []
    for i, event in enumerate(events):
        if isinstance(event, UserMessage):
            if not event.metadata.get("judge_correction") and event.content.strip():
                said.append(event.content)
        elif isinstance(event, AgentFinish) and event.stop_reason == "completed":
            if said or event.output.strip():
                made_in = origin.get(event.run_id, session_id) if i < forked_at else session_id
                out.append(FinishedTurn(made_in, event.run_id, "\n\n".join(said), event.output))
            said = []
    return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " […]"


def _parse(text: str) -> Extraction:
    """The answer as an ``Extraction`` (a Markdown code fence around it is tolerated)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    return Extraction.model_validate_json(body)


ProgressFn = Callable[[int, int, "ExtractionReport"], None]
"""``progress(sessions_done, sessions_total, report_so_far)``, after each session."""


class Extractor:
    """One extraction job over ``store``: its model (resolved at the first run), prices and
    settings. ``run()`` is one run; call it as often as you like."""

    def __init__(
        self,
        store: Store,
        settings: ExtractionSettings | None = None,
        *,
        prices: PriceTable | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        caps = capabilities_of(store)
        if caps.items is None or caps.kv is None:
            missing = " and ".join(
                n for n, c in (("items", caps.items), ("key-values", caps.kv)) if c is None
            )
            raise ConfigurationError(
                f"memory extraction needs a store with {missing} ({type(store).__name__} has "
                "not); use SQLiteStore or PostgresStore"
            )
        self.store = store
        self.items: ItemStore = caps.items
        self.kv: KVStore = caps.kv
        self.settings = settings or ExtractionSettings()
        self.clock = clock
        self._prices = prices
        self._model: Model | None = None
        self._counter: TokenCounter | None = None

    @property
    def model(self) -> Model:
        """The extraction model (resolved once)."""
        if self._model is None:
            from loom.models import resolve_model

            self._model = resolve_model(self.settings.model)
        return self._model

    @property
    def counter(self) -> TokenCounter:
        """How prompts are counted against ``max_tokens`` (the model's own counter)."""
        if self._counter is None:
            from loom.memory.tokens import counter_for_model

            self._counter = counter_for_model(self.model)
        return self._counter

    @property
    def prices(self) -> PriceTable:
        """The prices the run's usage is priced with (default: the shipped table)."""
        if self._prices is None:
            from loom.pricing import default_prices

            self._prices = default_prices()
        return self._prices

    def _check_cost_budget(self) -> None:
        if self.settings.max_cost is None:
            return
        name = getattr(self.model, "name", None)
        if not isinstance(name, str) or self.prices.lookup(name) is None:
            raise ConfigurationError(
                f"ExtractionSettings.max_cost needs the price of the extraction model {name!r}, "
                "which the price table does not know; add it with Runtime(prices={...}) or "
                "LOOM_PRICES, or set max_cost=None"
            )

    # -- one run ---------------------------------------------------------------------------
    async def run(self, *, progress: ProgressFn | None = None) -> ExtractionReport:
        """Extract the finished turns not done yet, within this run's budget."""
        self._check_cost_budget()
        report = ExtractionReport()
        cursor = await self._cursor()
        sessions = await self._sessions_since(cursor)
        total = len(sessions)
        advance_to: datetime | None = None
        blocked = False  # a session before this one still has work: the cursor stays
        for n, info in enumerate(sessions, start=1):
            complete = await self._session(info, report)
            if not complete:
                blocked = True
            elif not blocked:
                advance_to = info.updated_at
            if progress is not None:
                progress(n, total, report)
            if report.stopped is not None:
                break
        if advance_to is not None and (cursor is None or advance_to > cursor):
            await self.kv.put_value(STATE_NS, "cursor", {"updated_at": advance_to.isoformat()})
        return report

    async def _cursor(self) -> datetime | None:
        value = await self.kv.get_value(STATE_NS, "cursor")
        if isinstance(value, dict) and isinstance(value.get("updated_at"), str):
            try:
                return datetime.fromisoformat(value["updated_at"])
            except ValueError:
                log.warning("extraction cursor %r is not a time; reading every session", value)
        return None

    async def _sessions_since(self, cursor: datetime | None) -> list[SessionInfo]:
        every = await self.store.list_sessions(limit=0)
        if cursor is not None:
            since = cursor - timedelta(seconds=SETTLE_SECONDS)
            every = [s for s in every if s.updated_at >= since]
        every.sort(key=lambda s: (s.updated_at, s.id))  # oldest first: the cursor moves up
        return every

    async def _session(self, info: SessionInfo, report: ExtractionReport) -> bool:
        """Extract the session's new turns; True when none is left to do."""
        try:
            turns = await finished_turns(self.store, info.id)
        except (InputError, SessionNotFound) as exc:  # it went away while being read
            log.warning("extraction: session %r could not be read: %s", info.id, exc)
            return True
        if not turns:
            return True
        done: set[str] = set()
        for made_in in {t.session_id for t in turns}:
            done.update(await self.kv.list_keys(DONE_NS, prefix=made_in + _SEP))
        todo = [t for t in turns if _turn_key(t.session_id, t.turn) not in done]
        if not todo:
            return True
        owner = await self._owner_of(info.id)
        complete = True
        for turn in todo:
            if not await self._turn(turn, info, owner, report):
                complete = False
            if report.stopped is not None:
                return False
        return complete

    async def _owner_of(self, session_id: str) -> str | None:
        value = await self.kv.get_value(THREAD_OWNER_NS, session_id)
        return value if isinstance(value, str) else None

    def _namespace(self, owner: str | None, agent: str) -> tuple[str, ...]:
        from loom.memory.item_tools import namespace_for

        return check_namespace(namespace_for(self.settings.namespace, owner=owner, agent=agent))

    def _over_budget(self, report: ExtractionReport, prompt_tokens: int) -> bool:
        s = self.settings
        if s.max_turns is not None and report.turns >= s.max_turns:
            return True
        if s.max_tokens is not None and report.usage.total_tokens + prompt_tokens > s.max_tokens:
            return True
        return s.max_cost is not None and (report.usage.cost or 0.0) >= s.max_cost

    async def _turn(
        self, turn: FinishedTurn, info: SessionInfo, owner: str | None, report: ExtractionReport
    ) -> bool:
        """Extract one turn; True when it is done (or skipped for good)."""
        s = self.settings
        where = f"session {turn.session_id!r} turn {turn.turn!r}"
        marker = _turn_key(turn.session_id, turn.turn)
        try:
            namespace = self._namespace(owner, info.agent_name)
        except InputError as exc:
            await self._skip(marker, report, f"{where}: no namespace for owner {owner!r}: {exc}")
            return True
        messages = [
            Message.system(s.prompt),
            Message.user(
                f"User:\n{_clip(turn.user, s.max_turn_chars)}\n\n"
                f"Assistant:\n{_clip(turn.assistant, s.max_turn_chars)}"
            ),
        ]
        counter = self.counter
        prompt_tokens = sum(counter.count(m.content) for m in messages)
        if s.max_tokens is not None and prompt_tokens > s.max_tokens:  # no run could afford it
            problem = f"{where}: {prompt_tokens} tokens to send, over max_tokens={s.max_tokens}"
            await self._skip(marker, report, problem)
            return True
        if self._over_budget(report, prompt_tokens):
            report.stopped = "budget"
            return False
        answer, usage = await self._ask(messages, counter, prompt_tokens, where, report)
        if answer is None:
            return False
        report.turns += 1
        report.usage = report.usage + usage
        pending = await self.kv.get_value(PENDING_NS, marker)
        pending = pending if isinstance(pending, dict) else {}
        try:
            extraction = _parse(answer)
        except ValidationError as exc:
            attempts = int(pending.get("attempts", 0)) + 1
            first = exc.errors()[0]
            place = ".".join(str(p) for p in first["loc"]) or "(answer)"
            problem = f"{where}: malformed answer ({place}: {first['msg']})"
            report.errors.append(problem)
            if attempts >= s.attempts:
                await self._skip(marker, report, f"{problem}; skipped after {attempts} answers")
                return True
            await self.kv.put_value(
                PENDING_NS, marker, {**pending, "attempts": attempts, "error": problem}
            )
            log.warning("extraction: %s (answer %d of %d)", problem, attempts, s.attempts)
            return False
        memories = [m for m in extraction.memories if m.text.strip()][: s.max_memories]
        keys = [memory_key(turn.session_id, turn.turn, i) for i in range(len(memories))]
        # a session deleted while the model answered: its owner asked to forget it
        if await self.store.get_session(info.id) is None:
            await self.kv.delete_value(PENDING_NS, marker)
            report.skipped += 1
            log.warning("extraction: %s: the session was deleted; nothing written", where)
            return True
        stale = [k for k in pending.get("keys", ()) if isinstance(k, str) and k not in keys]
        await self.kv.put_value(PENDING_NS, marker, {**pending, "keys": keys})
        for key in stale:  # an earlier attempt wrote more memories than this one
            await self.items.delete_item(namespace, key, owner=owner)
        source = {"session": turn.session_id, "turn": turn.turn}
        try:
            for key, memory in zip(keys, memories, strict=True):
                value: dict[str, Any] = {"text": memory.text.strip(), "source": source}
                if memory.key:
                    value["key"] = memory.key
                await self.items.put_item(namespace, key, value, owner=owner)
        except InputError as exc:  # another owner holds the key: nothing sensible to retry
            await self._skip(marker, report, f"{where}: {exc}")
            return True
        await self.kv.put_value(
            DONE_NS,
            marker,
            {"memories": len(keys), "at": self.clock(), "namespace": list(namespace)},
        )
        await self.kv.delete_value(PENDING_NS, marker)
        report.memories += len(keys)
        return True

    async def _ask(
        self,
        messages: Sequence[Message],
        counter: TokenCounter,
        prompt_tokens: int,
        where: str,
        report: ExtractionReport,
    ) -> tuple[str | None, Usage]:
        """The model's answer and its priced usage; (None, empty) when the model is down (the
        run stops with ``model_error``)."""
        from loom.models.base import ModelSettings, OutputSchema, complete, reports_real_usage

        settings = ModelSettings(
            output=OutputSchema(
                name="memories",
                schema=Extraction.model_json_schema(),
                description="Memories worth keeping from the exchange.",
            )
        )
        try:
            async with asyncio.timeout(self.settings.call_timeout):
                response = await complete(self.model, messages, (), settings)
        except Exception as exc:  # a provider down, a network error, a timeout
            problem = f"{where}: the extraction model failed: {type(exc).__name__}: {exc}"
            report.errors.append(problem)
            report.stopped = "model_error"
            log.warning("extraction: %s; stopping, the next run retries", problem)
            return None, Usage()
        usage = response.usage or Usage(requests=1)
        if not reports_real_usage(self.model) or usage.total_tokens == 0:
            usage = usage.model_copy(
                update={
                    "input_tokens": usage.input_tokens or prompt_tokens,
                    "output_tokens": usage.output_tokens or counter.count(response.text),
                }
            )
        name = getattr(self.model, "name", None)
        if isinstance(name, str):
            usage = self.prices.priced(usage, name, response.model)
        return response.text, usage

    async def _skip(self, marker: str, report: ExtractionReport, problem: str) -> None:
        log.warning("extraction: %s", problem)
        report.skipped += 1
        if problem not in report.errors:
            report.errors.append(problem)
        await self.kv.put_value(
            DONE_NS, marker, {"memories": 0, "at": self.clock(), "skipped": problem}
        )
        await self.kv.delete_value(PENDING_NS, marker)


async def extract_memories(
    store: Store,
    settings: ExtractionSettings | None = None,
    *,
    prices: PriceTable | None = None,
    progress: ProgressFn | None = None,
) -> ExtractionReport:
    """One extraction run over ``store`` (see the module docstring): what ``loom memory
    extract`` does."""
    return await Extractor(store, settings, prices=prices).run(progress=progress)


def job_run(extractor: Extractor) -> Callable[[], Any]:
    """The scheduler's job body: one run; a model that is down is a retryable ``JobFailed``
    (the ``JobRunner`` tries again with backoff, then the next tick does)."""

    async def run() -> dict[str, Any]:
        report = await extractor.run()
        if report.stopped == "model_error":
            raise JobFailed(report.errors[-1] if report.errors else "the extraction model failed")
        return report.to_dict()

    return run
