"""Budgets beyond one run (``loom.budgets``, issue #31): limits checked before each model call,
reserved in the store, reconciled after the call, shared by every runtime on one store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from loom import Agent
from loom.budgets import (
    BudgetConfigError,
    BudgetGuard,
    BudgetLimit,
    MemoryBudgetLedger,
    SQLBudgetLedger,
    ledger_for,
    load_budgets,
    parse_budgets,
    window_start,
)
from loom.engine.runtime import Runtime
from loom.errors import StoreError
from loom.events import AgentEvent, BudgetWarning, ErrorEvent
from loom.messages import Message, ModelResponse, ToolSpec, Usage
from loom.models.base import ModelSettings
from loom.store.base import Store
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel

PRICES = {"function": {"input": 1000.0, "output": 1000.0}}  # $0.001 a token: easy sums
DAY = 86_400.0
T0 = 1_795_000_000.0  # 2026-11-18T...Z, a fixed instant


def _answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
    # 100 tokens: $0.10 a call; the worst case reserved is the estimate + 200 ($0.20+)
    return ModelResponse(text="ok", usage=Usage(input_tokens=50, output_tokens=50, requests=1))


def _agent(fn: Callable[..., Any] = _answer, **kw: Any) -> Agent:
    return Agent(
        name="spender",
        model=FunctionModel(fn),
        model_settings=ModelSettings(max_tokens=200),
        **kw,
    )


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        from loom.store.memory import MemoryStore

        yield MemoryStore()
        return
    if request.param == "postgres":
        pytest.importorskip("psycopg", reason="the postgres extra is not installed")
        from loom.store.postgres import PostgresStore

        pg = PostgresStore(request.getfixturevalue("pg_schema_dsn"), min_size=1, max_size=4)
        yield pg
        await pg.close()
        return
    s = SQLiteStore(str(tmp_path / "loom.db"))
    yield s
    await s.close()


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([{"scope": "owner", "window": "day", "max_cost": -1}], "budgets[0].max_cost"),
        ([{"scope": "owner", "window": "day", "max_cost": 1e12}], "budgets[0].max_cost"),
        ([{"scope": "owner", "window": "day", "max_cost": float("nan")}], "budgets[0].max_cost"),
        ([{"scope": "run", "max_tokens": 0}], "budgets[0].max_tokens"),
        ([{"scope": "run", "max_tokens": 1.5}], "budgets[0].max_tokens"),
        ([{"scope": "run", "max_tokens": 10, "window": "week"}], "budgets[0].window"),
        (
            [{"scope": "run", "max_tokens": 10}, {"scope": "team", "max_tokens": 1}],
            "budgets[1].scope",
        ),
        ([{"scope": "run", "max_tokens": 10, "warn_at": 1.5}], "budgets[0].warn_at"),
        ([{"scope": "run", "max_tokens": 10, "limit": 3}], "budgets[0].limit"),
        ([{"window": "day", "max_tokens": 10}], "budgets[0].scope"),
        ([{"scope": "run"}], "budgets[0]"),
        ({"scope": "run"}, "budgets"),
    ],
)
def test_a_bad_limit_is_refused_naming_its_field(raw: Any, field: str) -> None:
    with pytest.raises(BudgetConfigError) as err:
        parse_budgets(raw)
    assert err.value.field == field
    assert field in str(err.value)


def test_a_bad_limit_stops_the_runtime_from_starting() -> None:
    with pytest.raises(BudgetConfigError, match=r"budgets\[0\]\.window"):
        Runtime(budgets=[{"scope": "global", "window": "fortnight", "max_cost": 1}])


def test_loom_budgets_reads_json_and_yaml(tmp_path: Path) -> None:
    assert load_budgets('[{"scope": "owner", "window": "day", "max_cost": 5}]') == (
        BudgetLimit("owner", "day", max_cost=5),
    )
    path = tmp_path / "budgets.yaml"
    path.write_text(
        "budgets:\n  - {scope: tenant, window: month, max_tokens: 1000, warn_at: 0.8}\n"
    )
    assert load_budgets(str(path)) == (
        BudgetLimit("tenant", "month", max_tokens=1000, warn_at=0.8),
    )
    with pytest.raises(BudgetConfigError, match="LOOM_BUDGETS"):
        load_budgets(str(tmp_path / "missing.yaml"))


def test_windows_are_calendar_aligned_utc() -> None:
    from datetime import UTC, datetime

    t = datetime(2026, 11, 18, 10, 40, tzinfo=UTC).timestamp()
    assert window_start("hour", t) == "2026-11-18T10"
    assert window_start("day", t) == "2026-11-18"
    assert window_start("month", t) == "2026-11"
    assert window_start("none", t) == ""
    end = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC).timestamp()
    assert (window_start("month", end), window_start("month", end + 1)) == ("2026-11", "2026-12")


# -- the stop ---------------------------------------------------------------------------------


async def test_a_run_stops_at_a_shared_daily_cost_limit_naming_it(store: Store) -> None:
    seen: list[AgentEvent] = []
    rt = Runtime(
        store,
        prices=PRICES,
        budgets=[{"scope": "global", "window": "day", "max_cost": 1.0}],
        budget_clock=Clock(),
        observers=[seen.append],
    )
    agent = _agent()
    results = [await rt.run(agent, f"hello {i}", session_id=f"s{i}") for i in range(12)]
    stops = [r.stop_reason for r in results]
    done = stops.count("completed")
    # $0.10 a call, a worst case above $0.20: the 8th call is the last that fits under $1
    assert stops == ["completed"] * done + ["budget"] * (12 - done), stops
    assert 7 <= done <= 9
    refused = results[done]
    assert "global budget" in (refused.error or "") and "$1.000000" in (refused.error or "")
    spent = await ledger_for(store).spend()
    assert spent[0].spent_cost == pytest.approx(0.1 * done)
    assert spent[0].spent_cost <= 1.0 and spent[0].reserved_cost == 0
    errors = [e for e in seen if isinstance(e, ErrorEvent) and e.run_id == refused.run_id]
    assert errors[0].extra["budget"] == {
        "scope": "global",
        "window": "day",
        "subject": "*",
        "window_start": window_start("day", T0),
        "kind": "cost",
        "limit": 1.0,
        "spent": pytest.approx(0.1 * done),
        "reserved": 0.0,
    }


async def test_a_window_rolls_over_on_the_clock(store: Store) -> None:
    clock = Clock()
    rt = Runtime(
        store,
        prices=PRICES,
        budgets=[{"scope": "session", "window": "day", "max_tokens": 500}],
        budget_clock=clock,
    )
    agent = _agent()
    stops = [(await rt.run(agent, "hi", session_id="s")).stop_reason for _ in range(5)]
    assert stops[-1] == "budget" and stops[0] == "completed"
    clock.now += DAY  # the next calendar day (UTC): a new bucket
    assert (await rt.run(agent, "hi", session_id="s")).stop_reason == "completed"
    other = Runtime(store, budgets=[{"scope": "session", "max_tokens": 500}], budget_clock=clock)
    assert (await other.run(agent, "hi", session_id="t")).stop_reason == "completed"


async def test_owner_and_tenant_scopes_have_a_bucket_each(store: Store) -> None:
    from loom.budgets import tenant

    rt = Runtime(store, budgets=[{"scope": "tenant", "max_tokens": 250}], budget_clock=Clock())
    agent = _agent()
    with tenant("acme"):
        assert (await rt.run(agent, "hi", session_id="a1")).stop_reason == "completed"
        assert (await rt.run(agent, "hi", session_id="a2")).stop_reason == "budget"
    with tenant("globex"):
        assert (await rt.run(agent, "hi", session_id="g1")).stop_reason == "completed"
    subjects = {b.subject for b in await ledger_for(store).spend()}
    assert subjects == {"acme", "globex"}


async def test_an_unpriced_model_is_refused_under_a_money_budget(store: Store) -> None:
    calls: list[int] = []

    def answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        calls.append(1)
        return _answer(messages, tools)

    agent = _agent(answer)  # "function" has no price in the shipped table
    rt = Runtime(store, budgets=[{"scope": "global", "max_cost": 5}])
    result = await rt.run(agent, "hi")
    assert result.stop_reason == "budget" and calls == []
    assert "no price is known for model 'function'" in (result.error or "")
    assert "allow_unpriced" in (result.error or "")
    lenient = Runtime(store, budgets=[{"scope": "global", "max_cost": 5, "allow_unpriced": True}])
    assert (await lenient.run(agent, "hi")).stop_reason == "completed"


async def test_a_warning_is_sent_once_per_window(store: Store) -> None:
    seen: list[AgentEvent] = []
    clock = Clock()
    rt = Runtime(
        store,
        prices=PRICES,
        budgets=[{"scope": "global", "window": "hour", "max_cost": 10, "warn_at": 0.25}],
        budget_clock=clock,
        observers=[seen.append],
    )
    agent = _agent()
    for _ in range(5):  # $0.10 each: the warning at $2.50 is not reached
        await rt.run(agent, "hi")
    assert not [e for e in seen if isinstance(e, BudgetWarning)]
    for _ in range(30):  # $2.50 is crossed on the 25th call, once
        await rt.run(agent, "hi")
    warnings = [e for e in seen if isinstance(e, BudgetWarning)]
    assert len(warnings) == 1
    w = warnings[0]
    assert (w.scope, w.window, w.kind, w.limit, w.warn_at) == ("global", "hour", "cost", 10, 0.25)
    assert w.spent == pytest.approx(2.5)
    clock.now += 3600
    for _ in range(26):
        await rt.run(agent, "hi")
    assert len([e for e in seen if isinstance(e, BudgetWarning)]) == 2  # a new hour, a new one


# -- reservations -----------------------------------------------------------------------------


async def test_a_high_reservation_is_reconciled_to_the_real_usage(store: Store) -> None:
    clock = Clock()
    limit = BudgetLimit("global", "day", max_cost=1.0)
    guard = BudgetGuard([limit], ledger_for(store), clock=clock)
    kw: dict[str, Any] = {"run_id": "r", "session_id": "s", "owner": None, "tenant": None}
    big = await guard.reserve(
        **kw, model="m", price=(1000.0, 1000.0), input_tokens=400, max_output_tokens=400
    )
    # $0.80 held: a second worst case of $0.80 does not fit
    with pytest.raises(Exception, match="no room"):
        await guard.reserve(
            **kw, model="m", price=(1000.0, 1000.0), input_tokens=400, max_output_tokens=400
        )
    await guard.settle(big, 50, 50, 0.1)  # the call used $0.10: $0.70 comes back
    (row,) = await guard.ledger.spend()
    assert (row.spent_cost, row.reserved_cost) == (pytest.approx(0.1), 0)
    again = await guard.reserve(
        **kw, model="m", price=(1000.0, 1000.0), input_tokens=400, max_output_tokens=400
    )
    assert again.nanos == 800_000_000


async def test_a_crashed_reservation_expires(store: Store) -> None:
    clock = Clock()
    limit = BudgetLimit("global", "day", max_tokens=1000)
    kw: dict[str, Any] = {"run_id": "r", "session_id": "s", "owner": None, "tenant": None}
    dead = BudgetGuard([limit], ledger_for(store), clock=clock, reservation_ttl=30)
    await dead.reserve(**kw, model="m", price=None, input_tokens=500, max_output_tokens=300)
    # its process died: nobody settles it. Another process cannot fit its call ...
    alive = BudgetGuard([limit], ledger_for(store), clock=clock, reservation_ttl=30)
    with pytest.raises(Exception, match="800 tokens reserved"):
        await alive.reserve(**kw, model="m", price=None, input_tokens=300, max_output_tokens=300)
    clock.now += 31  # ... until the dead reservation's lease ran out
    held = await alive.reserve(**kw, model="m", price=None, input_tokens=300, max_output_tokens=300)
    (row,) = await alive.ledger.spend()
    assert row.reserved_tokens == 600 and held.tokens == 600


async def test_a_store_that_fails_while_reserving_fails_closed(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "loom.db"))
    calls: list[int] = []

    def answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        calls.append(1)
        return _answer(messages, tools)

    rt = Runtime(store, budgets=[{"scope": "global", "max_tokens": 10_000}])
    assert rt.budget_guard is not None
    ledger = rt.budget_guard.ledger
    assert isinstance(ledger, SQLBudgetLedger)

    async def down(*args: Any, **kwargs: Any) -> bool:
        raise StoreError("the database is unreachable")

    ledger.tables = type(
        "Down", (), {"schedule_rows": down, "schedule_execute": down, "schedule_gated": down}
    )()  # type: ignore[assignment]
    with pytest.raises(StoreError, match="unreachable"):
        await rt.run(_agent(answer), "hi")
    assert calls == []  # never called unmetered
    await store.close()


async def test_concurrent_runs_never_pass_the_limit(store: Store) -> None:
    async def slow(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        await asyncio.sleep(0.01)
        return _answer(messages, tools)

    rt = Runtime(store, prices=PRICES, budgets=[{"scope": "global", "max_cost": 2.0}])
    results = await asyncio.gather(
        *(rt.run(_agent(slow), "hi", session_id=f"c{i}") for i in range(40))
    )
    done = sum(r.stop_reason == "completed" for r in results)
    assert {r.stop_reason for r in results} == {"completed", "budget"}
    (row,) = await ledger_for(store).spend()
    assert row.spent_cost == pytest.approx(0.1 * done) and row.spent_cost <= 2.0
    assert row.reserved_cost == 0


def test_memory_ledger_is_the_fallback() -> None:
    from loom.store.memory import MemoryStore

    store = MemoryStore()
    assert isinstance(ledger_for(store), MemoryBudgetLedger)
    assert ledger_for(store) is ledger_for(store)


async def test_a_crew_spawns_nothing_once_a_shared_budget_is_spent(store: Store) -> None:
    from loom.crew import Crew, Sequential

    def greedy(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        return ModelResponse(text="ok", usage=Usage(input_tokens=200, output_tokens=50))

    first, second = _agent(greedy).replace(name="first"), _agent().replace(name="second")
    rt = Runtime(store, budgets=[{"scope": "global", "max_tokens": 250}], budget_clock=Clock())
    crew = Crew("c", members={"first": first, "second": second}, plan=Sequential("first", "second"))
    res = await crew.run("go", runtime=rt)
    assert res.stop_reason == "budget", res
    assert [m.member for m in res.members] == ["first"]  # the second never started
    assert res.budget == "budget_tokens" and "250 tokens" in (res.error or "")


def test_the_owner_is_the_runs_own_else_the_requests() -> None:
    from types import SimpleNamespace

    from loom.budgets import run_owner_of

    assert run_owner_of(SimpleNamespace(owner="alice")) == "alice"  # decided by the runtime
    assert run_owner_of(SimpleNamespace()) is None  # local code, no server request
    from loom.server.ownership import Principal, current_principal

    token = current_principal.set(Principal(name="bob", digest=b"x"))
    try:
        assert run_owner_of(SimpleNamespace(owner=None)) == "bob"
        assert run_owner_of(SimpleNamespace(owner="alice")) == "alice"
    finally:
        current_principal.reset(token)


SPENDER = """
import asyncio, sys
from loom import Agent
from loom.engine.runtime import Runtime
from loom.messages import ModelResponse, Usage
from loom.models.base import ModelSettings
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel


async def answer(messages, tools):
    await asyncio.sleep(0.005)
    return ModelResponse(text="ok", usage=Usage(input_tokens=100, output_tokens=100))


async def main():
    store = SQLiteStore(sys.argv[1])
    rt = Runtime(store, budgets=[{"scope": "global", "window": "day", "max_tokens": 3000}])
    settings = ModelSettings(max_tokens=200)
    agent = Agent(name="a", model=FunctionModel(answer), model_settings=settings)
    runs = [rt.run(agent, "hi", session_id=f"{sys.argv[2]}-{i}") for i in range(10)]
    stops = [r.stop_reason for r in await asyncio.gather(*runs)]
    print(stops.count("completed"))
    await store.close()


asyncio.run(main())
"""


def test_two_processes_on_one_sqlite_file_share_a_budget(tmp_path: Path) -> None:
    """20 runs of 200 tokens from two processes (10 each) against 3,000 tokens: 15 at most
    complete. Neither process alone can spend the limit (10 x 200 < 3,000), so however the
    machine schedules them, both spend from the one budget the file holds."""
    import subprocess
    import sys

    db = str(tmp_path / "loom.db")
    asyncio.run(_migrated(db))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SPENDER, db, name], env=env, stdout=subprocess.PIPE, text=True
        )
        for name in ("p", "q")
    ]
    done = [int(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    spent = asyncio.run(_spend(db))
    assert spent == 200 * sum(done) and spent <= 3000
    assert sum(done) >= 12, done  # at the limit, give or take the calls in flight
    assert all(d > 0 for d in done), done  # both processes spent from it


async def _migrated(path: str) -> None:
    store = SQLiteStore(path)
    await store.get_session("nothing")  # opens and migrates the file once, before the race
    await store.close()


async def _spend(path: str) -> int:
    store = SQLiteStore(path)
    (row,) = await ledger_for(store).spend()
    await store.close()
    return row.spent_tokens
