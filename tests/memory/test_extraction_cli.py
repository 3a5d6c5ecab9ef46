"""`loom memory extract`: one extraction run from the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.memory.test_extraction import Rig, facts
from typer.testing import CliRunner

import loom.models
from loom.cli import app
from loom.errors import ModelUnavailable
from loom.store import SQLiteStore
from loom.testing import FunctionModel

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "loom.db"

    async def seed() -> None:
        store = SQLiteStore(path)
        rig = Rig(store)
        await rig.seed()
        await rig.runtime.aclose()
        await store.close()

    asyncio.run(seed())
    return path


def use_model(monkeypatch: pytest.MonkeyPatch, fn: Any) -> list[Any]:
    asked: list[Any] = []

    def resolve(spec: Any) -> FunctionModel:
        asked.append(spec)
        return FunctionModel(fn)

    monkeypatch.setattr(loom.models, "resolve_model", resolve)
    return asked


def test_extract_once_then_nothing_left(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = use_model(monkeypatch, facts)
    r = runner.invoke(app, ["memory", "extract", "--store", str(db), "--model", "test:x"])
    assert r.exit_code == 0, r.output
    assert "3 turns, 3 memories, 0 skipped" in r.output
    assert asked == ["test:x"]
    r = runner.invoke(app, ["memory", "extract", "--db", str(db), "--model", "x", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) | {"errors": []} == {
        "turns": 0,
        "memories": 0,
        "skipped": 0,
        "stopped": None,
        "errors": [],
        "tokens": 0,
        "cost": None,
    }
    r = runner.invoke(app, ["memory", "list", "--db", str(db), "--json"])
    assert len(json.loads(r.output)) == 3


def test_budget_and_model_down_and_bad_options(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_model(monkeypatch, facts)
    args = ["memory", "extract", "--store", str(db), "--model", "x"]
    r = runner.invoke(app, [*args, "--max-turns", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert (json.loads(r.output)["turns"], json.loads(r.output)["stopped"]) == (1, "budget")
    r = runner.invoke(app, [*args, "--namespace", "mem.{who}"])
    assert r.exit_code == 2 and "{who}" in r.output

    def down(messages: Any, tools: Any) -> str:
        raise ModelUnavailable("connection refused")

    use_model(monkeypatch, down)
    r = runner.invoke(app, args)
    assert r.exit_code == 1
    assert "stopped: model_error" in r.output and "connection refused" in r.output
