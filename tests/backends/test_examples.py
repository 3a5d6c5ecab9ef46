"""The examples: the shop agent file on the sample database (scripted model for the loop), and
the embedded model asked a question about it (slow)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from loom import Agent, EventType, ModelResponse, ToolCall
from loom.models.base import ModelSettings
from loom.testing import ScriptedModel

EXAMPLES = Path(__file__).parents[2] / "examples" / "backends"
sys.path.insert(0, str(EXAMPLES))
from make_shop_db import make  # noqa: E402


@pytest.fixture(scope="module")
def shop_agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shop")
    make(folder / "shop.db")
    (folder / "shop_agent.md").write_text((EXAMPLES / "shop_agent.md").read_text())
    return folder / "shop_agent.md"


async def test_the_shop_agent_file_answers_from_its_database(shop_agent_file: Path) -> None:
    """Loop logic only (scripted model): the example file's backend is wired and guarded."""
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="query", arguments={"sql": "SELECT count(*) AS n FROM orders"}),
                    ToolCall(name="query", arguments={"sql": "SELECT * FROM staff_salaries"}),
                ]
            ),
            "4 orders",
        ]
    )
    agent = Agent.from_file(shop_agent_file, model=model)
    assert set(agent.to_definition().backends[0]["tables"]) == {"customers", "orders"}
    await agent.run("How many orders are there?")
    results = [m.content for m in model.calls[1].messages if m.role == "tool"]
    assert results[0].splitlines()[:2] == ["n", "4"]
    assert "staff_salaries" in results[1] and "refused" in results[1]
    assert "90000" not in " ".join(results)


@pytest.mark.slow
@pytest.mark.parametrize(
    "question",
    ["What is the largest order total?", "What is the total of the most expensive order?"],
)
async def test_the_embedded_model_answers_from_the_sample_database(
    shop_agent_file: Path, question: str
) -> None:
    """The default embedded model (SmolLM2-135M), its first call forced to ``query``: the guard
    accepts its SELECT and the answer carries the real figure. Without the forced call it
    answered without querying (measured while building the backend). Greedy decoding, so the
    run repeats exactly; these questions passed 5 of 5 runs each (other phrasings did not: a
    count of customers came out as ``... WHERE customer_id = 100000``)."""
    from loom.models.local import LocalModel  # the weights are loaded once per process

    db = sqlite3.connect(shop_agent_file.parent / "shop.db")
    (largest,) = db.execute("SELECT max(total) FROM orders").fetchone()
    db.close()
    # the file itself forces the first call (model_settings: {tool_choice: query, ...})
    agent = Agent.from_file(shop_agent_file, model=LocalModel())
    assert agent.model_settings == ModelSettings(tool_choice="query", max_tokens=160)
    events = [e async for e in agent.stream(question)]
    calls = [e.data for e in events if e.type is EventType.TOOL_EXECUTION_START]
    results = [e.data["content"] for e in events if e.type is EventType.TOOL_RESULT]
    errors = [e.data for e in events if e.type is EventType.TOOL_ERROR]
    finish = events[-1].data
    assert [c["tool_name"] for c in calls] == ["query"]
    assert calls[0]["arguments"]["sql"].lstrip().upper().startswith("SELECT")
    assert not errors, errors  # the guard accepted it and the database ran it
    assert f"{largest:g}" in results[0]  # the row came from the real database
    assert finish["stop_reason"] == "completed", finish
    assert f"{largest:g}" in finish["output"]


@pytest.mark.slow
def test_the_readme_backend_command_answers_on_the_embedded_model(shop_agent_file: Path) -> None:
    """examples/backends/README.md's `loom run --backend sqlite:///…/shop.db "What is the
    largest order total?"`, as a user types it, on the default model."""
    import os
    import subprocess

    db = shop_agent_file.parent / "shop.db"
    src = str(Path(__file__).parents[2] / "src")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "run",
            "--backend",
            f"sqlite:///{db}",
            "What is the largest order total?",
            "--store",
            ":memory:",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=src),
        cwd=shop_agent_file.parent,
    )
    assert done.returncode == 0, done.stderr
    assert "310" in done.stdout and "→ query" in done.stderr
