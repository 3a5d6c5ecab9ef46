"""`loom budgets`: limits with their spend and what is left, read from a real SQLite file that
a runtime spent under."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from loom import Agent
from loom.cli import app
from loom.engine.runtime import Runtime
from loom.messages import ModelResponse, Usage
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
LIMITS = json.dumps(
    [
        {"scope": "owner", "window": "day", "max_tokens": 10_000},
        {"scope": "global", "window": "month", "max_cost": 5},
    ]
)


async def spend(path: Path) -> None:
    store = SQLiteStore(str(path))
    rt = Runtime(
        store, budgets=json.loads(LIMITS), prices={"scripted": {"input": 1000.0, "output": 1000.0}}
    )
    answer = ModelResponse(text="ok", usage=Usage(input_tokens=300, output_tokens=200))
    result = await rt.run(Agent(name="a", model=ScriptedModel([answer])), "hi")
    assert result.stop_reason == "completed"
    await store.close()


def test_budgets_lists_spend_and_what_is_left(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    asyncio.run(spend(db))
    r = runner.invoke(app, ["budgets", "--db", str(db), "--budgets", LIMITS, "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["scope"]: row for row in json.loads(r.output)}
    assert rows["owner"]["subject"] == "(none)"  # no API key: the anonymous owner
    assert (rows["owner"]["spent_tokens"], rows["owner"]["remaining_tokens"]) == (500, 9_500)
    assert rows["global"]["spent_cost"] == 0.5 and rows["global"]["remaining_cost"] == 4.5
    r = runner.invoke(app, ["budgets", "--db", str(db), "--budgets", LIMITS], env=WIDE)
    assert r.exit_code == 0, r.output
    assert "$4.5000" in r.output and "9,500" in r.output and "(none)" in r.output


def test_budgets_reads_loom_budgets_and_refuses_a_bad_limit(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    asyncio.run(spend(db))
    r = runner.invoke(app, ["budgets", "--db", str(db), "--json"], env={"LOOM_BUDGETS": LIMITS})
    assert r.exit_code == 0 and len(json.loads(r.output)) == 2
    bad = '[{"scope": "owner", "window": "week", "max_cost": 1}]'
    r = runner.invoke(app, ["budgets", "--db", str(db), "--budgets", bad])
    assert r.exit_code == 2 and "budgets[0].window" in r.output
