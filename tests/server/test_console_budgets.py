"""The console's budgets page in a real Chromium against a real `loom serve` that runs with
``LOOM_BUDGETS``: spend per limit and subject after real runs over the API, a key that is not
an admin sees only the global limits and its own bucket. Screenshot:
``tests/artifacts/console/budgets.png``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

CHROMIUM = os.environ.get("LOOM_CHROMIUM", "/usr/bin/chromium")
if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
    pytest.skip(f"no chromium at {CHROMIUM}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
KEY = "budget-console-key-0123"  # the env key: principal env-1
ADMIN_KEY = "budget-admin-key-4567"

AGENTS = """
from loom import Agent, ModelResponse
from loom.messages import Usage
from loom.models.base import ModelSettings
from loom.server import AgentRegistry
from loom.testing import FunctionModel


def spend(messages, tools):
    return ModelResponse(text="spent", usage=Usage(input_tokens=1200, output_tokens=300))


registry = AgentRegistry([
    Agent(name="spender", model=FunctionModel(spend, name="house-model"),
          model_settings=ModelSettings(max_tokens=300)),
])
"""
LIMITS = [
    {"scope": "global", "window": "month", "max_cost": 1.0, "warn_at": 0.8},
    {"scope": "owner", "window": "day", "max_tokens": 5000},
    {"scope": "session", "window": "none", "max_tokens": 4000},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("budgets")
    keys = tmp / "keys.yaml"
    keys.write_text(f"- {{name: admin, key: {ADMIN_KEY}, admin: true}}\n")
    prices = tmp / "prices.json"
    prices.write_text(json.dumps({"models": {"house-model": {"input": 100, "output": 400}}}))
    srv = start_server(
        tmp,
        "--keys",
        str(keys),
        app="budget_agents:registry",
        source=AGENTS,
        env={
            "LOOM_API_KEYS": KEY,
            "LOOM_BUDGETS": json.dumps(LIMITS),
            "LOOM_PRICES": str(prices),
        },
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run"],
        )
        yield b
        b.close()


def login(browser: Any, server: Server, key: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 640})
    page = context.new_page()
    page.goto(f"{server.url}/console/budgets")
    page.fill("input[name=api_key]", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/**")
    return page


def run(server: Server, key: str, thread: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, headers={"x-api-key": key}, timeout=30) as client:
        client.post("/threads", json={"thread_id": thread}).raise_for_status()
        out = client.post(
            f"/threads/{thread}/runs/wait",
            json={
                "assistant_id": "spender",
                "input": {"messages": [{"role": "user", "content": "go"}]},
            },
        )
        out.raise_for_status()
        return dict(out.json())


def test_the_budgets_page_shows_spend_against_each_limit(browser: Any, server: Server) -> None:
    for thread in ("b-1", "b-2"):  # 1,500 tokens and $0.24 each, as env-1
        run(server, KEY, thread)
    run(server, ADMIN_KEY, "b-3")  # as admin
    page = login(browser, server, ADMIN_KEY)
    page.goto(f"{server.url}/console/budgets")
    table = page.locator("table#budgets")
    table.wait_for()
    rows = table.locator("tbody tr")
    texts = [rows.nth(i).inner_text() for i in range(rows.count())]
    global_row = next(t for t in texts if t.startswith("global"))
    assert "$1.0000" in global_row and "$0.7200" in global_row and "$0.2800" in global_row
    owners = [t for t in texts if t.startswith("owner")]
    assert any("env-1" in t and "3,000" in t and "2,000" in t for t in owners), owners
    assert any("admin" in t and "1,500" in t for t in owners), owners
    sessions = [t for t in texts if t.startswith("session")]
    assert len(sessions) == 3, sessions
    page.locator("nav a.here", has_text="Budgets").wait_for()
    page.screenshot(path=str(ARTIFACTS / "budgets.png"), full_page=True)
    page.context.close()

    mine = login(browser, server, KEY)
    mine.goto(f"{server.url}/console/budgets")
    rows = mine.locator("table#budgets tbody tr")
    rows.first.wait_for()
    texts = [rows.nth(i).inner_text() for i in range(rows.count())]
    assert [t.split()[0] for t in texts] == ["global", "owner"], texts
    assert "env-1" in texts[1] and "admin" not in " ".join(texts)
    mine.context.close()


def test_a_run_past_the_limit_stops_with_budget_over_the_api(server: Server) -> None:
    assert "budget" not in json.dumps(run(server, KEY, "b-4"))  # $0.96 of the month's $1
    text = json.dumps(run(server, KEY, "b-5"))  # no room for a fifth call's worst case
    assert "budget" in text, text
