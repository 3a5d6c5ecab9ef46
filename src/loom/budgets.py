"""Budgets beyond one run: limits on tokens and cost per run, session, owner, tenant or for
everyone, per hour, day or month (or for ever), shared by every process on one store.

A ``BudgetLimit`` is one limit: ``{scope, window, max_cost, max_tokens, warn_at}``. The
``Runtime`` takes a list of them (``Runtime(budgets=[...])``, or ``LOOM_BUDGETS``: a JSON list
or the path of a JSON/YAML file with one, read by ``loom serve`` and ``loom worker`` alike).

Before each model call the runtime *reserves* the call's worst case in every bucket the run
falls in (a bucket is one limit's scope, its subject and its window: ``owner:alice:day`` for
2026-11-27). The worst case is the context's token estimate plus the most the model may answer
(``ModelSettings.max_tokens``, else the agent's ``reserved_output_tokens``, else 4,096),
priced at the model's price. The reservation is one conditional ``UPDATE ... WHERE spent +
reserved + x <= limit`` per bucket, atomic on SQLite and PostgreSQL, so concurrent runs on any
number of processes cannot together pass a limit with their reserved worst cases: a call whose
worst case does not fit is refused and the run stops with ``stop_reason="budget"``
(``BudgetLimitReached`` names the scope, window, limit and spend). After the call the
reservation is released and the real usage added (reconciled). A call whose real usage is
above its worst case (an estimate that was low) is added in full: that is the only way to pass
a limit, by at most that one call's excess per run in flight.

A reservation carries an expiry (``reservation_ttl``, 10 minutes by default): one left by a
process that died between reserving and reconciling is swept by the first reservation in its
bucket that it stands in the way of, so it does not hold budget for ever. A store that cannot
be reached while reserving fails closed: the call is not made and the run stops with
``stop_reason="error"`` (the ``StoreError``), never unmetered.

Windows are calendar-aligned in UTC: ``hour`` (``2026-11-27T13``), ``day`` (``2026-11-27``),
``month`` (``2026-11``); ``none`` never rolls over. The clock is injectable (``clock=``).

A money limit needs the model's price (``loom.pricing``): a model without one is refused
(``BudgetUnpriced``) unless the limit says ``allow_unpriced: true``, in which case its calls
count their tokens and no money. ``warn_at`` (a fraction of the limit) sends one
``budget_warning`` event (and a ``budget.warning`` webhook) per bucket and window.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from loom.errors import BudgetExceeded, ConfigurationError
from loom.messages import new_id
from loom.store.base import ScheduleTables, Store

if TYPE_CHECKING:
    from loom.pricing import PriceTable

__all__ = [
    "Bucket",
    "BucketSpend",
    "BudgetConfigError",
    "BudgetGuard",
    "BudgetLedger",
    "BudgetLimit",
    "BudgetLimitReached",
    "BudgetStatus",
    "BudgetUnpriced",
    "MemoryBudgetLedger",
    "Reservation",
    "SQLBudgetLedger",
    "WarningCrossed",
    "budget_report",
    "current_tenant",
    "ledger_for",
    "load_budgets",
    "parse_budgets",
    "reserve_call",
    "run_owner_of",
    "tenant",
    "window_start",
]

Scope = Literal["run", "session", "owner", "tenant", "global"]
Window = Literal["none", "hour", "day", "month"]
SCOPES: tuple[str, ...] = ("run", "session", "owner", "tenant", "global")
WINDOWS: tuple[str, ...] = ("none", "hour", "day", "month")
NANOS = 1_000_000_000  # integer nano-dollars: conditional sums in SQL stay exact
MAX_COST = 1_000_000.0  # US dollars: a limit above this is a typo, not a budget
MAX_TOKENS = 10**12
DEFAULT_OUTPUT_TOKENS = 4096
NO_SUBJECT = "(none)"  # an owner or tenant scope on a run without one: they share a bucket

current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "loom_budget_tenant", default=None
)
"""The tenant label of the runs started in this context (``tenant("acme")`` sets it)."""


@contextlib.contextmanager
def tenant(label: str) -> Iterator[None]:
    """Label the runs started inside the block with tenant ``label`` (``scope: tenant``)."""
    if not isinstance(label, str) or not label:
        raise BudgetConfigError("must be a non-empty string", field="tenant")
    token = current_tenant.set(label)
    try:
        yield
    finally:
        current_tenant.reset(token)


class BudgetConfigError(ConfigurationError):
    """A budget limit does not validate; ``field`` names the field (``budgets[1].window``)."""

    def __init__(self, message: str, *, field: str):
        self.field = field
        super().__init__(f"budget field {field!r}: {message}")


class BudgetLimitReached(BudgetExceeded):
    """A budget beyond the run refused a model call: the run stops with
    ``stop_reason="budget"``. ``scope``, ``window``, ``subject``, ``window_start``, ``limit``,
    ``spent``, ``reserved`` and ``kind`` (``"cost"`` in US dollars or ``"tokens"``) say which."""

    def __init__(
        self,
        *,
        scope: str,
        window: str,
        subject: str,
        start: str,
        kind: str,
        limit: float,
        spent: float,
        reserved: float,
        wanted: float,
    ):
        self.scope, self.window, self.subject, self.window_start = scope, window, subject, start
        self.kind, self.limit, self.spent, self.reserved = kind, limit, spent, reserved

        def unit(v: float) -> str:
            return f"${v:.6f}" if kind == "cost" else f"{int(v)} tokens"

        period = "" if window == "none" else f" for the {window} starting {start} (UTC)"
        super().__init__(
            f"budget_{kind}",
            f"the {scope} budget of {subject!r}{period} is {unit(limit)}: {unit(spent)} spent "
            f"and {unit(reserved)} reserved by calls in flight leave no room for this call's "
            f"worst case of {unit(wanted)}; the run stops (raise the limit or wait for the "
            "window to roll over)",
        )

    def details(self) -> dict[str, Any]:
        """The limit as JSON (the run's ``ERROR`` event carries it as ``extra["budget"]``)."""
        return {
            "scope": self.scope,
            "window": self.window,
            "subject": self.subject,
            "window_start": self.window_start,
            "kind": self.kind,
            "limit": self.limit,
            "spent": self.spent,
            "reserved": self.reserved,
        }


class BudgetUnpriced(BudgetExceeded):
    """A money budget applies and the model has no price: the call is refused (fail closed)."""

    def __init__(self, model: str, scope: str, window: str):
        self.model, self.scope, self.window = model, scope, window
        super().__init__(
            "budget_cost",
            f"no price is known for model {model!r}, so a {scope}/{window} budget in money "
            "cannot meter it; add its price (Runtime(prices=...), LOOM_PRICES) or set "
            "allow_unpriced: true on the limit to count its tokens only",
        )


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """One limit (module docstring). At least one of ``max_cost`` (US dollars) and
    ``max_tokens`` (input + output) is set; ``warn_at`` is a fraction in (0, 1]."""

    scope: Scope
    window: Window = "none"
    max_cost: float | None = None
    max_tokens: int | None = None
    warn_at: float | None = None
    allow_unpriced: bool = False
    where: str = field(default="budgets[0]", compare=False)

    def __post_init__(self) -> None:
        w = self.where
        if self.scope not in SCOPES:
            raise BudgetConfigError(
                f"unknown scope {self.scope!r}; one of {', '.join(SCOPES)}", field=f"{w}.scope"
            )
        if self.window not in WINDOWS:
            raise BudgetConfigError(
                f"unknown window {self.window!r}; one of {', '.join(WINDOWS)}",
                field=f"{w}.window",
            )
        if self.max_cost is None and self.max_tokens is None:
            raise BudgetConfigError("a limit sets max_cost or max_tokens", field=w)
        cost = self.max_cost
        if cost is not None and (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or not 0 < cost <= MAX_COST
        ):
            raise BudgetConfigError(
                f"must be US dollars above 0 and at most {MAX_COST:g}, got {cost!r}",
                field=f"{w}.max_cost",
            )
        tokens = self.max_tokens
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= MAX_TOKENS
        ):
            raise BudgetConfigError(
                f"must be an integer above 0 and at most {MAX_TOKENS}, got {tokens!r}",
                field=f"{w}.max_tokens",
            )
        warn = self.warn_at
        if warn is not None and (
            isinstance(warn, bool) or not isinstance(warn, int | float) or not 0 < warn <= 1
        ):
            raise BudgetConfigError(
                f"must be a fraction above 0 and at most 1, got {warn!r}", field=f"{w}.warn_at"
            )
        if not isinstance(self.allow_unpriced, bool):
            raise BudgetConfigError("must be true or false", field=f"{w}.allow_unpriced")

    @property
    def limit_nanos(self) -> int | None:
        """``max_cost`` in integer nano-dollars (what the ledger compares), or None."""
        return None if self.max_cost is None else round(self.max_cost * NANOS)

    def to_dict(self) -> dict[str, Any]:
        """The limit as config (what ``parse_budgets`` reads back)."""
        out: dict[str, Any] = {"scope": self.scope, "window": self.window}
        for name in ("max_cost", "max_tokens", "warn_at"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.allow_unpriced:
            out["allow_unpriced"] = True
        return out


_FIELDS = {"scope", "window", "max_cost", "max_tokens", "warn_at", "allow_unpriced"}


def parse_budgets(raw: Any, *, where: str = "budgets") -> tuple[BudgetLimit, ...]:
    """``BudgetLimit``s from config (a list of mappings); ``BudgetConfigError`` names the field."""
    if raw is None:
        return ()
    if isinstance(raw, BudgetLimit):
        return (raw,)
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise BudgetConfigError("must be a list of limits", field=where)
    out: list[BudgetLimit] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if isinstance(item, BudgetLimit):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise BudgetConfigError(
                "must be a mapping {scope, window, max_cost, max_tokens, warn_at}", field=at
            )
        unknown = sorted(set(item) - _FIELDS)
        if unknown:
            raise BudgetConfigError(
                f"unknown field {unknown[0]!r}; known: {', '.join(sorted(_FIELDS))}",
                field=f"{at}.{unknown[0]}",
            )
        if "scope" not in item:
            raise BudgetConfigError("is required", field=f"{at}.scope")
        out.append(BudgetLimit(**{str(k): v for k, v in item.items()}, where=at))
    return tuple(out)


def load_budgets(value: str | None = None) -> tuple[BudgetLimit, ...]:
    """The limits in ``value`` (default ``$LOOM_BUDGETS``): a JSON list, or the path of a JSON
    or YAML file holding one (or a mapping with a ``budgets:`` list)."""
    text = os.environ.get("LOOM_BUDGETS") if value is None else value
    if not text or not text.strip():
        return ()
    where = "LOOM_BUDGETS"
    if text.lstrip().startswith("["):
        try:
            data: Any = json.loads(text)
        except ValueError as exc:
            raise BudgetConfigError(f"is not valid JSON: {exc}", field=where) from None
    else:
        try:
            with open(text, encoding="utf-8") as f:
                content = f.read()
        except OSError as exc:
            raise BudgetConfigError(
                f"is neither a JSON list nor a readable file: {exc}", field=where
            ) from None
        import yaml

        try:
            data = yaml.safe_load(content)
        except yaml.YAMLError as exc:
            raise BudgetConfigError(f"{text}: not valid YAML/JSON: {exc}", field=where) from None
        if isinstance(data, Mapping):
            data = data.get("budgets")
    return parse_budgets(data, where="budgets")


def window_start(window: str, now: float) -> str:
    """The calendar-aligned UTC start of ``window`` holding ``now`` (epoch seconds)."""
    if window == "none":
        return ""
    t = datetime.fromtimestamp(now, UTC)
    if window == "hour":
        return t.strftime("%Y-%m-%dT%H")
    if window == "day":
        return t.strftime("%Y-%m-%d")
    return t.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limit's bucket for one run: ``key`` is ``scope:subject:window``."""

    limit: BudgetLimit
    subject: str
    start: str

    @property
    def key(self) -> str:
        """``scope:subject:window``: the row's name (with ``start``, the window it counts)."""
        return f"{self.limit.scope}:{self.subject}:{self.limit.window}"


@dataclass(frozen=True, slots=True)
class BucketSpend:
    """What a bucket spent and holds reserved (``loom budgets`` lists these)."""

    bucket: str
    window_start: str
    scope: str
    subject: str
    window: str
    spent_cost: float
    spent_tokens: int
    reserved_cost: float
    reserved_tokens: int


@dataclass(slots=True)
class Reservation:
    """One model call's hold on its buckets, released by ``BudgetGuard.settle``."""

    reservation_id: str
    buckets: list[Bucket]
    nanos: int
    tokens: int
    priced: bool


class BudgetLedger(Protocol):
    """Where spend lives: ``SQLBudgetLedger`` on a store's tables, or in memory."""

    async def reserve(
        self, rid: str, bucket: Bucket, nanos: int, tokens: int, now: float, expires: float
    ) -> tuple[int, int, int, int] | None:
        """Hold ``nanos``/``tokens`` in ``bucket`` if they fit its limit (first sweeping its
        expired reservations): None when held, else the bucket's (spent nanos, spent tokens,
        reserved nanos, reserved tokens) for the refusal."""
        ...

    async def settle(
        self, rid: str, bucket: Bucket, held: tuple[int, int], nanos: int, tokens: int, now: float
    ) -> None:
        """Release reservation ``rid`` (which held ``held``: nanos, tokens) and add the real
        ``nanos``/``tokens``."""
        ...

    async def claim_warning(self, bucket: Bucket) -> bool:
        """True once per bucket and window: the caller sends its warning."""
        ...

    async def read(self, bucket: Bucket) -> tuple[int, int, int, int]:
        """The bucket's (spent nanos, spent tokens, reserved nanos, reserved tokens)."""
        ...

    async def spend(self) -> list[BucketSpend]:
        """Every bucket's spend."""
        ...


def _from_nanos(n: int) -> float:
    return n / NANOS


class SQLBudgetLedger:
    """The ledger on a store's ``budget_spend`` / ``budget_reservations`` tables, through its
    ``ScheduleTables`` SQL channel (SQLite: one writer per file; PostgreSQL: one database for
    the fleet)."""

    def __init__(self, tables: ScheduleTables) -> None:
        self.tables = tables

    async def _sweep(self, bucket: Bucket, now: float) -> int:
        """Release the bucket's expired reservations (their processes died); how many."""
        t = self.tables
        rows = await t.schedule_rows(
            "reading expired budget reservations",
            "SELECT reservation_id, nanos, tokens FROM budget_reservations "
            "WHERE bucket = ? AND window_start = ? AND expires_at < ?",
            (bucket.key, bucket.start, now),
        )
        released = 0
        for rid, nanos, tokens in rows:  # each released once: the DELETE is the gate
            released += await t.schedule_gated(
                "releasing an expired budget reservation",
                (
                    "DELETE FROM budget_reservations WHERE reservation_id = ? AND bucket = ? "
                    "AND window_start = ?",
                    (rid, bucket.key, bucket.start),
                ),
                [
                    (
                        "UPDATE budget_spend SET reserved_nanos = reserved_nanos - ?, "
                        "reserved_tokens = reserved_tokens - ? WHERE bucket = ? AND "
                        "window_start = ?",
                        (nanos, tokens, bucket.key, bucket.start),
                    )
                ],
            )
        return released

    async def reserve(
        self, rid: str, bucket: Bucket, nanos: int, tokens: int, now: float, expires: float
    ) -> tuple[int, int, int, int] | None:
        # The common case is one write transaction: the conditional UPDATE and the
        # reservation's row. Only a refusal looks further (below).
        t, lim = self.tables, bucket.limit
        where = "bucket = ? AND window_start = ?"
        params: list[Any] = [bucket.key, bucket.start]
        if lim.limit_nanos is not None:
            where += " AND spent_nanos + reserved_nanos + ? <= ?"
            params += [nanos, lim.limit_nanos]
        if lim.max_tokens is not None:
            where += " AND spent_tokens + reserved_tokens + ? <= ?"
            params += [tokens, lim.max_tokens]
        gate = (
            "UPDATE budget_spend SET reserved_nanos = reserved_nanos + ?, "
            f"reserved_tokens = reserved_tokens + ?, updated_at = ? WHERE {where}",
            (nanos, tokens, now, *params),
        )
        record = [
            (
                "INSERT INTO budget_reservations (reservation_id, bucket, window_start, "
                "nanos, tokens, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                (rid, bucket.key, bucket.start, nanos, tokens, expires),
            )
        ]
        if await t.schedule_gated("reserving budget", gate, record):
            return None
        # refused: the bucket may not exist yet (this call or a racing one opens it) or hold
        # dead processes' reservations; open it, sweep them, and try once more
        await t.schedule_execute(
            "opening a budget bucket",
            "INSERT INTO budget_spend (bucket, window_start, scope, subject, period, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (bucket, window_start) DO NOTHING",
            (bucket.key, bucket.start, lim.scope, bucket.subject, lim.window, now),
        )
        await self._sweep(bucket, now)
        if await t.schedule_gated("reserving budget", gate, record):
            return None
        return await self.read(bucket)

    async def settle(
        self, rid: str, bucket: Bucket, held: tuple[int, int], nanos: int, tokens: int, now: float
    ) -> None:
        t = self.tables
        add = (
            "UPDATE budget_spend SET spent_nanos = spent_nanos + ?, "
            "spent_tokens = spent_tokens + ?, updated_at = ?"
        )
        done = await t.schedule_gated(
            "reconciling a budget reservation",
            (
                "DELETE FROM budget_reservations WHERE reservation_id = ? AND bucket = ? "
                "AND window_start = ?",
                (rid, bucket.key, bucket.start),
            ),
            [
                (
                    f"{add}, reserved_nanos = reserved_nanos - ?, "
                    "reserved_tokens = reserved_tokens - ? WHERE bucket = ? AND window_start = ?",
                    (nanos, tokens, now, held[0], held[1], bucket.key, bucket.start),
                )
            ],
        )
        if not done:  # swept as expired meanwhile: its hold is gone, the real spend still counts
            await t.schedule_execute(
                "adding budget spend",
                f"{add} WHERE bucket = ? AND window_start = ?",
                (nanos, tokens, now, bucket.key, bucket.start),
            )

    async def read(self, bucket: Bucket) -> tuple[int, int, int, int]:
        rows = await self.tables.schedule_rows(
            "reading a budget bucket",
            "SELECT spent_nanos, spent_tokens, reserved_nanos, reserved_tokens FROM "
            "budget_spend WHERE bucket = ? AND window_start = ?",
            (bucket.key, bucket.start),
        )
        a, b, c, d = rows[0] if rows else (0, 0, 0, 0)
        return int(a), int(b), int(c), int(d)

    async def claim_warning(self, bucket: Bucket) -> bool:
        return await self.tables.schedule_gated(
            "claiming a budget warning",
            (
                "UPDATE budget_spend SET warned = 1 WHERE bucket = ? AND window_start = ? "
                "AND warned = 0",
                (bucket.key, bucket.start),
            ),
            [],
        )

    async def spend(self) -> list[BucketSpend]:
        rows = await self.tables.schedule_rows(
            "listing budget spend",
            "SELECT bucket, window_start, scope, subject, period, spent_nanos, spent_tokens, "
            "reserved_nanos, reserved_tokens FROM budget_spend ORDER BY bucket, window_start",
        )
        return [
            BucketSpend(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                str(r[3]),
                str(r[4]),
                _from_nanos(int(r[5])),
                int(r[6]),
                _from_nanos(int(r[7])),
                int(r[8]),
            )
            for r in rows
        ]


@dataclass(slots=True)
class _Row:
    spent_nanos: int = 0
    spent_tokens: int = 0
    reserved_nanos: int = 0
    reserved_tokens: int = 0
    warned: bool = False
    holds: dict[str, tuple[int, int, float]] = field(default_factory=dict)


class MemoryBudgetLedger:
    """The ledger of one process (a store without SQL tables, e.g. ``MemoryStore``): the same
    rules, shared by the runs of this process only. Each method runs without awaiting, so it
    is atomic on its event loop."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], _Row] = {}
        self.meta: dict[tuple[str, str], Bucket] = {}

    def _row(self, bucket: Bucket) -> _Row:
        key = (bucket.key, bucket.start)
        self.meta.setdefault(key, bucket)
        return self.rows.setdefault(key, _Row())

    async def reserve(
        self, rid: str, bucket: Bucket, nanos: int, tokens: int, now: float, expires: float
    ) -> tuple[int, int, int, int] | None:
        row, lim = self._row(bucket), bucket.limit
        for old, (n, k, until) in list(row.holds.items()):
            if until < now:
                del row.holds[old]
                row.reserved_nanos -= n
                row.reserved_tokens -= k
        over_cost = (
            lim.limit_nanos is not None
            and row.spent_nanos + row.reserved_nanos + nanos > lim.limit_nanos
        )
        over_tokens = (
            lim.max_tokens is not None
            and row.spent_tokens + row.reserved_tokens + tokens > lim.max_tokens
        )
        if over_cost or over_tokens:
            return row.spent_nanos, row.spent_tokens, row.reserved_nanos, row.reserved_tokens
        row.reserved_nanos += nanos
        row.reserved_tokens += tokens
        row.holds[rid] = (nanos, tokens, expires)
        return None

    async def settle(
        self, rid: str, bucket: Bucket, held: tuple[int, int], nanos: int, tokens: int, now: float
    ) -> None:
        row = self._row(bucket)
        if row.holds.pop(rid, None) is not None:
            row.reserved_nanos -= held[0]
            row.reserved_tokens -= held[1]
        row.spent_nanos += nanos
        row.spent_tokens += tokens

    async def read(self, bucket: Bucket) -> tuple[int, int, int, int]:
        row = self._row(bucket)
        return row.spent_nanos, row.spent_tokens, row.reserved_nanos, row.reserved_tokens

    async def claim_warning(self, bucket: Bucket) -> bool:
        row = self._row(bucket)
        if row.warned:
            return False
        row.warned = True
        return True

    async def spend(self) -> list[BucketSpend]:
        out = []
        for (key, start), row in sorted(self.rows.items()):
            b = self.meta[key, start]
            out.append(
                BucketSpend(
                    key,
                    start,
                    b.limit.scope,
                    b.subject,
                    b.limit.window,
                    _from_nanos(row.spent_nanos),
                    row.spent_tokens,
                    _from_nanos(row.reserved_nanos),
                    row.reserved_tokens,
                )
            )
        return out


def ledger_for(store: Store) -> BudgetLedger:
    """The ledger on ``store``: its SQL tables when it has them, else one in memory (kept on
    the store, so every runtime on one ``MemoryStore`` shares it)."""
    from loom.store.base import capabilities_of

    tables = capabilities_of(store).schedules
    if tables is not None:
        return SQLBudgetLedger(tables)
    ledger: BudgetLedger | None = getattr(store, "_loom_budget_ledger", None)
    if ledger is None:
        ledger = MemoryBudgetLedger()
        with contextlib.suppress(AttributeError):
            setattr(store, "_loom_budget_ledger", ledger)  # noqa: B010 - any store type
    return ledger


@dataclass(frozen=True, slots=True)
class WarningCrossed:
    """A bucket crossed its ``warn_at`` (the first time in its window)."""

    bucket: Bucket
    kind: str  # "cost" or "tokens"
    limit: float
    spent: float

    def payload(self) -> dict[str, Any]:
        """The ``BudgetWarning`` event's fields (and the webhook's)."""
        lim = self.bucket.limit
        return {
            "scope": lim.scope,
            "window": lim.window,
            "subject": self.bucket.subject,
            "window_start": self.bucket.start,
            "kind": self.kind,
            "limit": self.limit,
            "spent": self.spent,
            "warn_at": lim.warn_at,
        }


class BudgetGuard:
    """The runtime's budgets: ``reserve`` before a model call, ``settle`` after it.

    Args:
        limits: The limits.
        ledger: Where spend lives (``ledger_for(store)``).
        clock: Epoch seconds (injectable: a test moves a window over).
        reservation_ttl: Seconds a reservation holds if its process never reconciles it.
        prices: Model prices for the worst cases (default ``loom.pricing``'s table).
    """

    def __init__(
        self,
        limits: Sequence[BudgetLimit],
        ledger: BudgetLedger,
        *,
        clock: Callable[[], float] = time.time,
        reservation_ttl: float = 600.0,
        prices: PriceTable | None = None,
    ) -> None:
        if prices is None:
            from loom.pricing import default_prices

            prices = default_prices()
        self.prices = prices
        self.limits = tuple(limits)
        self.ledger = ledger
        self.clock = clock
        self.reservation_ttl = reservation_ttl

    def buckets(
        self, *, run_id: str, session_id: str, owner: str | None, tenant: str | None, now: float
    ) -> list[Bucket]:
        subjects = {
            "run": run_id,
            "session": session_id,
            "owner": owner or NO_SUBJECT,
            "tenant": tenant or NO_SUBJECT,
            "global": "*",
        }
        return [
            Bucket(lim, subjects[lim.scope], window_start(lim.window, now)) for lim in self.limits
        ]

    async def check(
        self, *, run_id: str, session_id: str, owner: str | None, tenant: str | None
    ) -> None:
        """Before a crew spawn: raise ``BudgetLimitReached`` when a bucket of these subjects
        has nothing left (spent and reserved reach its limit). Holds nothing: the member's
        model calls reserve their own worst case."""
        now = self.clock()
        for b in self.buckets(
            run_id=run_id, session_id=session_id, owner=owner, tenant=tenant, now=now
        ):
            row = await self.ledger.read(b)
            lim = b.limit
            spent_n, spent_t, res_n, res_t = row
            full_cost = lim.limit_nanos is not None and spent_n + res_n >= lim.limit_nanos
            full_tokens = lim.max_tokens is not None and spent_t + res_t >= lim.max_tokens
            if full_cost or full_tokens:
                raise _refusal(b, row, 1 if full_cost else 0, 1)

    async def reserve(
        self,
        *,
        run_id: str,
        session_id: str,
        owner: str | None,
        tenant: str | None,
        model: str,
        price: tuple[float, float] | None,
        input_tokens: int,
        max_output_tokens: int,
    ) -> Reservation:
        """Hold the call's worst case in every bucket, or raise ``BudgetLimitReached`` /
        ``BudgetUnpriced`` (nothing held then). ``price``: USD per million (input, output)."""
        now = self.clock()
        buckets = self.buckets(
            run_id=run_id, session_id=session_id, owner=owner, tenant=tenant, now=now
        )
        if price is None:
            for b in buckets:
                if b.limit.max_cost is not None and not b.limit.allow_unpriced:
                    raise BudgetUnpriced(model, b.limit.scope, b.limit.window)
        tokens = max(0, input_tokens) + max(0, max_output_tokens)
        nanos = 0 if price is None else cost_nanos(price, input_tokens, max_output_tokens)
        rid = new_id("bres")
        held: list[Bucket] = []
        try:
            for b in buckets:
                refused = await self.ledger.reserve(
                    rid, b, nanos, tokens, now, now + self.reservation_ttl
                )
                if refused is not None:
                    raise _refusal(b, refused, nanos, tokens)
                held.append(b)
        except BaseException:
            for b in held:  # what this call held already goes back
                await self.ledger.settle(rid, b, (nanos, tokens), 0, 0, now)
            raise
        return Reservation(rid, held, nanos, tokens, price is not None)

    async def settle(
        self, reservation: Reservation, input_tokens: int, output_tokens: int, cost: float | None
    ) -> list[WarningCrossed]:
        """Release ``reservation`` and add the real usage; the warnings this call crossed."""
        now = self.clock()
        nanos = 0 if cost is None else math.ceil(cost * NANOS)
        tokens = input_tokens + output_tokens
        warnings: list[WarningCrossed] = []
        for b in reservation.buckets:
            await self.ledger.settle(
                reservation.reservation_id,
                b,
                (reservation.nanos, reservation.tokens),
                nanos,
                tokens,
                now,
            )
            lim = b.limit
            if lim.warn_at is None:  # only a limit that warns reads its spend back
                continue
            spent_nanos, spent_tokens, _, _ = await self.ledger.read(b)
            crossed: WarningCrossed | None = None
            if lim.limit_nanos is not None and spent_nanos >= lim.warn_at * lim.limit_nanos:
                crossed = WarningCrossed(
                    b, "cost", float(lim.max_cost or 0), _from_nanos(spent_nanos)
                )
            elif lim.max_tokens is not None and spent_tokens >= lim.warn_at * lim.max_tokens:
                crossed = WarningCrossed(b, "tokens", float(lim.max_tokens), float(spent_tokens))
            if crossed is not None and await self.ledger.claim_warning(b):
                warnings.append(crossed)
        return warnings

    async def settle_response(
        self, reservation: Reservation, response: Any
    ) -> list[WarningCrossed]:
        """``settle`` with a priced ``ModelResponse`` (or None): a call that reported no usage
        is charged its reserved worst case, never nothing (fail closed)."""
        usage = getattr(response, "usage", None)
        if usage is None:
            cost = _from_nanos(reservation.nanos) if reservation.priced else None
            return await self.settle(reservation, reservation.tokens, 0, cost)
        return await self.settle(reservation, usage.input_tokens, usage.output_tokens, usage.cost)

    async def release(self, reservation: Reservation) -> None:
        """Give a reservation back unspent (the call failed before it was sent)."""
        await self.settle(reservation, 0, 0, 0.0)


def cost_nanos(price: tuple[float, float], input_tokens: int, output_tokens: int) -> int:
    """The nano-dollars of ``input_tokens`` and ``output_tokens`` at ``price`` (USD/million),
    rounded up: a reservation never holds less than the worst case."""
    return math.ceil((input_tokens * price[0] + output_tokens * price[1]) * 1000)


def _refusal(
    b: Bucket, row: tuple[int, int, int, int], nanos: int, tokens: int
) -> BudgetLimitReached:
    lim = b.limit
    spent_n, spent_t, res_n, res_t = row
    common = {
        "scope": lim.scope,
        "window": lim.window,
        "subject": b.subject,
        "start": b.start,
    }
    if lim.limit_nanos is not None and spent_n + res_n + nanos > lim.limit_nanos:
        return BudgetLimitReached(
            **common,
            kind="cost",
            limit=float(lim.max_cost or 0),
            spent=_from_nanos(spent_n),
            reserved=_from_nanos(res_n),
            wanted=_from_nanos(nanos),
        )
    return BudgetLimitReached(
        **common,
        kind="tokens",
        limit=float(lim.max_tokens or 0),
        spent=float(spent_t),
        reserved=float(res_t),
        wanted=float(tokens),
    )


def run_owner_of(deps: object = None) -> str | None:
    """The owner a run's budget buckets count under: ``deps.owner`` where the runtime decided
    one for the run (a ``RunDeps`` with an ``owner``), else the principal of the API key
    serving the current request, else None (``(none)``).

    The server module is read only when it was imported (no request can have set a principal
    otherwise): importing it here would load the whole HTTP stack."""
    owner = getattr(deps, "owner", None)
    if isinstance(owner, str):
        return owner
    ownership = sys.modules.get("loom.server.ownership")
    if ownership is None:
        return None
    principal = ownership.current_principal.get()
    return None if principal is None else str(principal.name)


async def reserve_call(
    guard: BudgetGuard,
    model: object,
    *,
    run_id: str,
    session_id: str,
    owner: str | None,
    input_tokens: int,
    max_output_tokens: int | None,
) -> Reservation:
    """Hold one model call's worst case (the engine's hook before each call): the context's
    token estimate ``input_tokens`` plus ``max_output_tokens`` (None: 4,096), at ``model``'s
    price in ``guard.prices``; the tenant is the current context's label."""
    name = getattr(model, "name", None)
    price = guard.prices.lookup(name) if isinstance(name, str) else None
    pair = None if price is None else (max(price.input, price.cache_write or 0.0), price.output)
    return await guard.reserve(
        run_id=run_id,
        session_id=session_id,
        owner=owner,
        tenant=current_tenant.get(),
        model=str(name),
        price=pair,
        input_tokens=input_tokens,
        max_output_tokens=max_output_tokens or DEFAULT_OUTPUT_TOKENS,
    )


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """One limit's bucket in its current window: spend against the limit (``loom budgets``,
    the console's budgets page). ``subject`` is ``"-"`` for a limit nothing spent under yet."""

    scope: str
    window: str
    window_start: str
    subject: str
    max_cost: float | None
    max_tokens: int | None
    spent_cost: float
    spent_tokens: int
    reserved_cost: float
    reserved_tokens: int

    @property
    def remaining_cost(self) -> float | None:
        """US dollars left (limit - spent - reserved, not below 0); None without a money limit."""
        if self.max_cost is None:
            return None
        return max(self.max_cost - self.spent_cost - self.reserved_cost, 0.0)

    @property
    def remaining_tokens(self) -> int | None:
        """Tokens left (limit - spent - reserved, not below 0); None without a token limit."""
        if self.max_tokens is None:
            return None
        return max(self.max_tokens - self.spent_tokens - self.reserved_tokens, 0)

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON (``loom budgets --json``)."""
        return {
            "scope": self.scope,
            "window": self.window,
            "window_start": self.window_start,
            "subject": self.subject,
            "max_cost": self.max_cost,
            "max_tokens": self.max_tokens,
            "spent_cost": self.spent_cost,
            "spent_tokens": self.spent_tokens,
            "reserved_cost": self.reserved_cost,
            "reserved_tokens": self.reserved_tokens,
            "remaining_cost": self.remaining_cost,
            "remaining_tokens": self.remaining_tokens,
        }


async def budget_report(
    limits: Sequence[BudgetLimit], ledger: BudgetLedger, now: float | None = None
) -> list[BudgetStatus]:
    """Each limit's buckets in their current window, with spend and what is left."""
    at = time.time() if now is None else now
    spend = await ledger.spend()
    out: list[BudgetStatus] = []
    for lim in limits:
        start = window_start(lim.window, at)
        rows = [
            r
            for r in spend
            if r.scope == lim.scope and r.window == lim.window and r.window_start == start
        ]
        if not rows:
            out.append(
                BudgetStatus(
                    lim.scope, lim.window, start, "-", lim.max_cost, lim.max_tokens, 0.0, 0, 0.0, 0
                )
            )
        for r in rows:
            out.append(
                BudgetStatus(
                    lim.scope,
                    lim.window,
                    start,
                    r.subject,
                    lim.max_cost,
                    lim.max_tokens,
                    r.spent_cost,
                    r.spent_tokens,
                    r.reserved_cost,
                    r.reserved_tokens,
                )
            )
    return out
