"""Cost: the price table, ``Usage.cost`` and its sums, cost on events, results, the run
record, ``loom sessions show`` and the ``max_cost`` budget."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from loom import Agent, ModelResponse, ToolCall, tool
from loom.cli import app
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError
from loom.events import AgentFinish, LlmComplete
from loom.messages import Usage
from loom.pricing import Price, PriceTable, default_prices, load_prices
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

GPT4O = Price(input=2.5, output=10.0, cached_input=1.25)


def test_a_known_model_costs_its_list_price() -> None:
    table = default_prices()
    assert table.as_of  # the shipped prices say when they were checked
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, requests=1)
    assert table.cost(usage, "openai:gpt-4o") == pytest.approx(2.5 + 1.0)
    # cached prompt tokens are part of input_tokens and cost the cached price
    cached = Usage(input_tokens=1_000_000, output_tokens=0, cache_read_tokens=400_000, requests=1)
    assert table.cost(cached, "openai:gpt-4o") == pytest.approx(0.6 * 2.5 + 0.4 * 1.25)
    # Anthropic cache writes have their own price
    wrote = Usage(input_tokens=2_000, output_tokens=1_000, cache_write_tokens=1_000, requests=1)
    assert table.cost(wrote, "anthropic:claude-sonnet-4") == pytest.approx(
        (1_000 * 3.0 + 1_000 * 3.75 + 1_000 * 15.0) / 1e6
    )


def test_a_dated_snapshot_uses_its_base_price_and_nothing_else_is_guessed() -> None:
    table = default_prices()
    usage = Usage(input_tokens=1_000, output_tokens=1_000, requests=1)
    base = table.cost(usage, "openai:gpt-4o")
    assert table.cost(usage, "openai:gpt-4o", "gpt-4o-2024-08-06") == base
    assert table.cost(usage, "anthropic:claude-sonnet-4-20250514") is not None
    assert table.cost(usage, "openai:gpt-4o-audio-preview") is None  # not gpt-4o's price
    assert table.cost(usage, "openai:gpt-4o", "gpt-4o-mini") != base  # the one that answered


def test_an_unknown_model_or_unpriced_tokens_leave_cost_none() -> None:
    table = default_prices()
    usage = Usage(input_tokens=10, output_tokens=5, requests=1)
    assert table.cost(usage, "openai:llama3") is None
    assert table.cost(usage, "scripted") is None
    assert table.cost(usage, "local") == 0.0  # the embedded model runs on your machine
    assert table.cost(usage, "local:/models/x.gguf") == 0.0
    no_cache_price = PriceTable({"openai:m": {"input": 1, "output": 2}})
    cached = Usage(input_tokens=10, cache_read_tokens=5, requests=1)
    assert no_cache_price.cost(cached, "openai:m") is None  # not priced as full input


def test_sums_keep_an_unknown_cost_unknown() -> None:
    known = Usage(input_tokens=1, requests=1, cost=0.25)
    unknown = Usage(input_tokens=1, requests=1, cost=None)
    assert (Usage() + known).cost == 0.25  # the empty start of a run adds nothing
    assert (known + known).cost == 0.5
    assert (known + unknown).cost is None
    assert (unknown + known).cost is None
    total = known + Usage(input_tokens=2, cache_read_tokens=1, requests=1, cost=0.5)
    assert (total.input_tokens, total.cache_read_tokens, total.requests) == (3, 1, 2)


def test_overrides_and_price_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = Runtime(prices={"openai:my-model": {"input": 1, "output": 2}})
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, requests=1)
    assert rt.prices.cost(usage, "openai:my-model") == 3.0
    assert rt.prices.cost(usage, "openai:gpt-4o") == 12.5  # the shipped ones stay
    toml = tmp_path / "prices.toml"
    toml.write_text('as_of = "2030-01-01"\n[models."openai:gpt-4o"]\ninput = 1\noutput = 1\n')
    assert load_prices(toml).as_of == "2030-01-01"
    monkeypatch.setenv("LOOM_PRICES", str(toml))
    assert Runtime().prices.cost(usage, "openai:gpt-4o") == 2.0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"input": 1}, "needs 'output'"),
        ({"input": -1, "output": 1}, "must be a number >= 0"),
        ({"input": "1", "output": 1}, "must be a number >= 0"),
        ({"input": 1, "output": 1, "cached": 1}, "unknown keys"),
        (3, "must be a mapping"),
    ],
)
def test_a_bad_price_entry_is_a_configuration_error(entry: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Runtime(prices={"openai:x": entry})


def test_a_bad_price_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_prices(tmp_path / "missing.json")
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"prices": {}}))
    with pytest.raises(ConfigurationError, match="needs a 'models' table"):
        load_prices(bad)


def test_openai_cached_tokens_are_read_from_the_chunk() -> None:
    from loom.models.openai import _Reading

    read = _Reading()
    details = SimpleNamespace(cached_tokens=30)
    usage = SimpleNamespace(prompt_tokens=100, completion_tokens=7, prompt_tokens_details=details)
    read.chunk(SimpleNamespace(model="gpt-4o-2024-08-06", usage=usage, choices=[]))
    assert read.usage == Usage(input_tokens=100, output_tokens=7, requests=1, cache_read_tokens=30)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _script(name: str = "openai:gpt-4o") -> ScriptedModel:
    call = ToolCall(name="add", arguments={"a": 1, "b": 2})
    return ScriptedModel(
        [
            ModelResponse(
                tool_calls=[call],
                usage=Usage(input_tokens=1_000, output_tokens=100, requests=1),
                model="gpt-4o-2024-08-06",
            ),
            ModelResponse(text="3", usage=Usage(input_tokens=2_000, output_tokens=10, requests=1)),
        ],
        name=name,
    )


async def _show(db: Path) -> Any:
    # the CLI runs its own event loop: give it a thread
    return await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["sessions", "show", "s1", "--store", str(db)],
        env={"COLUMNS": "200"},
    )


async def test_cost_is_on_each_model_call_the_finish_the_result_and_the_run_record(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "loom.db"))
    rt = Runtime(store)
    events = []
    async for e in rt.stream(Agent(model=_script(), tools=[add]), "1+2", session_id="s1"):
        events.append(e)
    first, second = (1_000 * 2.5 + 100 * 10) / 1e6, (2_000 * 2.5 + 10 * 10) / 1e6
    costs = [e.usage["cost"] for e in events if isinstance(e, LlmComplete) and e.usage]
    assert costs == [pytest.approx(first), pytest.approx(second)]
    finish = next(e for e in events if isinstance(e, AgentFinish))
    assert finish.usage["cost"] == pytest.approx(first + second)
    stored = [e for e in await store.load_events("s1") if isinstance(e, AgentFinish)]
    assert stored[0].usage["cost"] == pytest.approx(first + second)
    end = next(r for r in await store.list_runs("s1") if r.status != "running")
    assert end.data["cost"] == pytest.approx(first + second)
    await store.close()
    r = await _show(tmp_path / "loom.db")
    assert r.exit_code == 0, r.output
    assert f"cost=${first + second:.6g}" in r.output


async def test_an_unknown_model_gives_cost_none_everywhere(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "loom.db"))
    result = await Runtime(store).run(
        Agent(model=_script("scripted"), tools=[add]), "1+2", session_id="s1"
    )
    assert result.usage.cost is None and result.usage.input_tokens == 3_000
    await store.close()
    r = await _show(tmp_path / "loom.db")
    assert "cost=unknown" in r.output


async def test_max_cost_stops_the_run_once_it_is_spent() -> None:
    rt = Runtime()
    agent = Agent(model=_script(), tools=[add])
    result = await rt.run(agent, "1+2", max_cost=0.001)  # the first call costs $0.0035
    assert result.stop_reason == "cost_limit"
    assert "over its max_cost $0.001" in (result.error or "")
    assert result.usage.requests == 1
    ok = await rt.run(Agent(model=_script(), tools=[add]), "1+2", max_cost=1.0)
    assert ok.stop_reason == "completed" and ok.output == "3"


async def test_max_cost_needs_a_known_price() -> None:
    with pytest.raises(ConfigurationError, match="max_cost needs the price"):
        await Runtime().run(Agent(model=_script("scripted"), tools=[add]), "1+2", max_cost=1.0)
