"""The examples: the shop agent file on the sample database (scripted model for the loop), and
the embedded model asked a question about it (slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loom import Agent, ModelResponse, ToolCall
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
    model = ScriptedModel([
        ModelResponse(tool_calls=[
            ToolCall(name="query", arguments={"sql": "SELECT count(*) AS n FROM orders"}),
            ToolCall(name="query", arguments={"sql": "SELECT * FROM staff_salaries"}),
        ]),
        "4 orders",
    ])  # fmt: skip
    agent = Agent.from_file(shop_agent_file, model=model)
    assert set(agent.to_definition().backends[0]["tables"]) == {"customers", "orders"}
    await agent.run("How many orders are there?")
    results = [m.content for m in model.calls[1].messages if m.role == "tool"]
    assert results[0].splitlines()[:2] == ["n", "4"]
    assert "staff_salaries" in results[1] and "refused" in results[1]
    assert "90000" not in " ".join(results)


@pytest.mark.slow
@pytest.mark.xfail(
    reason="the embedded 135M model answers without calling the query tool for questions about "
    "the sample database (tried several prompts while building the backend); the loop is "
    "covered with a scripted model above",
    strict=False,
)
async def test_the_embedded_model_answers_from_the_sample_database(shop_agent_file: Path) -> None:
    from loom.models.local import LocalModel

    agent = Agent.from_file(shop_agent_file, model=LocalModel())
    result = await agent.run("How many customers are there? Use the query tool.")
    calls = [m for m in result.messages if m.role == "tool"]
    assert calls, "the model did not call the query tool"
    assert "3" in (result.output or "")
