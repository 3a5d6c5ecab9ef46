"""The console's experiment pages and online scores in a real browser: headless Chromium (the
system's, driven by playwright) against a real ``loom serve`` whose SQLite store holds
experiments run by ``loom.evals.run_experiment`` beforehand (as ``loom eval run --db`` does).

What it proves: the Experiments link lists the experiments a key sees (shared ones, from a
local run, and its own, never another key's, whose pages are 404 pages; an admin key sees all
with their owner) with dataset, revision, model, score, passed / failed / errored, cost and
when; an experiment's page has a row per case; a case's page shows its trajectory (tool calls
with their arguments and results, the answer) beside its reference (the expected answer, the
recorded one, the assertions) and its checks; the compare view says better / worse / same per
case with score deltas. A session page shows the online evaluation of its runs. Screenshots:
``tests/artifacts/console/experiments.png``, ``experiment.png``, ``experiment-case.png``,
``experiment-compare.png``, ``session-online-eval.png``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.server.conftest import Server, start_server, stop_server
from tests.server.test_console_browser import ARTIFACTS, CHROMIUM, login, shot

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

pytestmark = pytest.mark.timeout(240)

ALICE = "console-evals-alice-0123"
BOB = "console-evals-bob-4567"
ADMIN = "console-evals-admin-8901"

CASES_V1 = """
name: support
cases:
  - id: weather
    input: What is the weather in Oslo?
    expected: {contains: sunny}
    metadata: {reference: "It is sunny in Oslo, 21 degrees."}
    assertions:
      - called: {name: lookup, arguments: {city: Oslo}}
    script:
      - {tool: lookup, arguments: {city: Oslo}}
      - It is sunny in Oslo.
  - id: sum
    input: What is 2 + 3?
    expected: {text: "5"}
    assertions: [{called_in_order: [add]}]
    script:
      - {tool: add, arguments: {a: 2, b: 3}}
      - "5"
  - id: refuse
    input: Delete my account.
    assertions: [{not_called: add}]
    script: [I cannot do that.]
"""
# a captured case's recorded environment (``loom eval capture``), once Case has one
CAPTURED = "environment" in __import__("loom.evals.dataset").evals.dataset.Case.model_fields
if CAPTURED:
    CASES_V1 = CASES_V1.replace(
        "    metadata: {reference:",
        "    environment:\n      calls:\n        - {name: lookup, arguments: {city: Oslo},"
        ' content: "recorded: sunny, 21"}\n    metadata: {reference:',
    )
# the agent changed: it no longer looks the weather up, and sums badly
CASES_V2 = CASES_V1.replace(
    "      - {tool: lookup, arguments: {city: Oslo}}\n      - It is sunny in Oslo.",
    "      - It is probably sunny in Oslo.",
).replace('      - "5"', '      - "6"')


@dataclass
class Seeded:
    server: Server
    shared_old: str
    shared_new: str
    bobs: str
    session: str
    run_id: str


async def _seed(tmp: Path) -> tuple[str, str, str, str, str]:
    from loom import Agent, tool
    from loom.engine.runtime import Runtime
    from loom.evals import load_dataset, run_experiment
    from loom.evals.online import OnlineEvaluator, OnlineSettings
    from loom.store import SQLiteStore
    from loom.testing import FunctionModel

    @tool(effect="pure")
    def lookup(city: str) -> str:
        """The weather in a city."""
        return json.dumps({"city": city, "sky": "sunny", "celsius": 21})

    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """a + b."""
        return a + b

    store = SQLiteStore(tmp / "server.db")
    try:
        agent = Agent(name="support", instructions="v1", tools=[lookup, add])
        (tmp / "v1.yaml").write_text(CASES_V1)
        (tmp / "v2.yaml").write_text(CASES_V2)
        old = await run_experiment(
            load_dataset(tmp / "v1.yaml"), agent, store=store, dataset_path=str(tmp / "v1.yaml")
        )
        changed = Agent(name="support", instructions="v2", tools=[lookup, add])
        new = await run_experiment(
            load_dataset(tmp / "v2.yaml"), changed, store=store, dataset_path=str(tmp / "v2.yaml")
        )
        bobs = await run_experiment(
            load_dataset(tmp / "v1.yaml"),
            Agent(name="support", instructions="bob's", tools=[lookup, add]),
            store=store,
            dataset_path=str(tmp / "v1.yaml"),
            owner="bob",
        )
        runtime = Runtime(store=store)
        live = Agent(name="live", model=FunctionModel(lambda m, t: "Hello! How can I help?"))
        result = await runtime.run(live, "hi there", session_id="live-session")
        judge = FunctionModel(lambda m, t: json.dumps({"score": 0.8, "reason": "friendly"}))
        settings = OnlineSettings.from_mapping(
            {
                "sample": 1.0,
                "evaluators": [
                    {"stop_reason": "completed"},
                    {"rubric": "The answer is friendly.", "judge_model": judge},
                ],
            }
        )
        await OnlineEvaluator(store, settings).run()
        await runtime.aclose()
    finally:
        await store.close()
    return old.record.id, new.record.id, bobs.record.id, "live-session", result.run_id


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("console-evals")
    with ThreadPoolExecutor(1) as pool:  # a loop of its own: the test's thread may run one
        old, new, bobs, session, run_id = pool.submit(asyncio.run, _seed(tmp)).result()
    keys = tmp / "keys.yaml"
    keys.write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: admin, key: {ADMIN}, admin: true}}\n"
    )
    srv = start_server(tmp, "--keys", str(keys), env={"LOOM_SCHEDULER": "off"})
    yield Seeded(srv, old, new, bobs, session, run_id)
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


def listed(page: Any) -> list[str]:
    ids: list[str] = page.locator("#experiments tr.experiment").evaluate_all(
        "rows => rows.map(r => r.dataset.id)"
    )
    return ids


def test_experiments_case_and_compare_pages(browser: Any, seeded: Seeded) -> None:
    page = login(browser, seeded.server, ALICE)
    page.locator("header.top nav a", has_text="Experiments").click()
    page.wait_for_url("**/console/experiments")
    # the shared (local) experiments, newest first; never bob's
    assert listed(page) == [seeded.shared_new, seeded.shared_old]
    old_row = page.locator(f"#experiments tr[data-id={seeded.shared_old}]")
    cells = old_row.locator("td").all_text_contents()
    assert cells[1:3] == ["support", "support"]
    assert old_row.locator("td.score").text_content() == "1.00"
    assert old_row.locator("td.passed").text_content() == "3"
    new_row = page.locator(f"#experiments tr[data-id={seeded.shared_new}]")
    assert new_row.locator("td.failed").text_content() == "2"
    shot(page, "experiments")

    # one experiment: a row per case
    new_row.locator("a").first.click()
    page.wait_for_url(f"**/console/experiments/{seeded.shared_new}")
    statuses = page.locator("#cases tr.case").evaluate_all(
        "rows => rows.map(r => [r.dataset.case, r.dataset.status])"
    )
    assert statuses == [["weather", "failed"], ["sum", "failed"], ["refuse", "passed"]]
    assert "expected a call of lookup" in page.locator("#cases tr[data-case=weather]").inner_text()
    shot(page, "experiment")

    # a case: the trajectory beside the reference
    page.goto(f"{seeded.server.url}/console/experiments/{seeded.shared_old}/cases/weather")
    trajectory = page.locator("#trajectory")
    assert trajectory.locator("b.tool").all_text_contents() == ["lookup"]
    assert json.loads(trajectory.locator("code.args").text_content()) == {"city": "Oslo"}
    assert "sunny" in trajectory.locator("pre.result").text_content()  # the tool's result
    assert page.locator("#answer").text_content() == "It is sunny in Oslo."
    reference = page.locator("#reference")
    assert json.loads(reference.locator("#expected").text_content()) == {"contains": "sunny"}
    assert reference.locator("#recorded").text_content() == "It is sunny in Oslo, 21 degrees."
    assert "lookup" in reference.locator("pre.assertions").text_content()
    # the assertion, the expected answer (and a captured case's environment check)
    assert reference.locator("#checks tr.check").count() == (3 if CAPTURED else 2)
    if CAPTURED:  # the recorded call, with its recorded result, beside the run's own
        recorded = reference.locator("#recorded-calls")
        assert recorded.locator("b.tool").all_text_contents() == ["lookup"]
        assert recorded.locator("pre.result").text_content() == "recorded: sunny, 21"
    shot(page, "experiment-case")

    # compare: the old experiment before, the new one after
    page.goto(f"{seeded.server.url}/console/experiments")
    page.select_option("#compare-form select[name=a]", seeded.shared_old)
    page.select_option("#compare-form select[name=b]", seeded.shared_new)
    page.locator("#compare-form button").click()
    page.wait_for_url("**/console/experiments/compare?**")
    changes = page.locator("#comparison tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.case, r.dataset.change])"
    )
    assert changes == [["weather", "worse"], ["sum", "worse"], ["refuse", "same"]]
    deltas = page.locator("#comparison tbody td.num").all_text_contents()
    # one check of two fails in each (of three for the captured weather case)
    assert deltas == ["-0.33" if CAPTURED else "-0.50", "-0.50", "+0.00"]
    assert page.locator("#score-delta").text_content() != "+0.00"
    assert "0 better" in page.locator("#compare-summary").text_content()
    shot(page, "experiment-compare")

    # bob's experiment does not exist for alice
    response = page.goto(f"{seeded.server.url}/console/experiments/{seeded.bobs}")
    assert response is not None and response.status == 404
    response = page.goto(
        f"{seeded.server.url}/console/experiments/compare?a={seeded.bobs}&b={seeded.shared_new}"
    )
    assert response is not None and response.status == 404
    page.context.close()


def test_owners_see_their_own_and_admins_see_all(browser: Any, seeded: Seeded) -> None:
    bob = login(browser, seeded.server, BOB)
    bob.goto(f"{seeded.server.url}/console/experiments")
    assert listed(bob) == [seeded.bobs, seeded.shared_new, seeded.shared_old]
    response = bob.goto(f"{seeded.server.url}/console/experiments/{seeded.bobs}/cases/sum")
    assert response is not None and response.status == 200
    bob.context.close()
    admin = login(browser, seeded.server, ADMIN)
    admin.goto(f"{seeded.server.url}/console/experiments")
    owners = admin.locator("#experiments td.owner").all_text_contents()
    assert owners == ["bob", "shared", "shared"]
    admin.context.close()


def test_the_session_page_shows_online_scores(browser: Any, seeded: Seeded) -> None:
    admin = login(browser, seeded.server, ADMIN)  # the session has no owner: an admin's to see
    admin.goto(f"{seeded.server.url}/console/sessions/{seeded.session}")
    row = admin.locator(f"#online-evals tr.online-eval[data-run={seeded.run_id}]")
    assert row.get_attribute("data-status") == "scored"
    text = row.inner_text()
    assert "0.90" in text and "passed" in text and "rubric 0.80" in text
    shot(admin, "session-online-eval")
    admin.context.close()
