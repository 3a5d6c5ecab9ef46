"""Session branches in the console, in a real browser (headless Chromium driven by playwright)
against a real ``loom serve``: regenerate and edit-and-resend on the last user message, from
the page; the turns they replace show under Branches, folded and marked abandoned, with the
effects the branch noted. Screenshots go to ``tests/artifacts/console/``."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

CHROMIUM = os.environ.get("LOOM_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
    pytest.skip(f"no chromium at {CHROMIUM}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
KEY = "console-branch-key-0123"

AGENTS = r'''
"""An agent whose answers are numbered, so a regenerated answer differs from the first."""

import itertools

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel

COUNT = itertools.count(1)


@tool(effect="at_most_once")
def send(to: str) -> str:
    """Send a message to someone."""
    return f"sent to {to}"


def answer(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"answer {next(COUNT)}: {last.content}"
    said = [m.content for m in messages if m.role == "user"][-1]
    if last.role == "user" and said.startswith("mail "):
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": said.split()[1]})])
    noted = " (told of earlier effects)" if last.role == "system" else ""
    return f"answer {next(COUNT)} to {said}{noted}"


registry = AgentRegistry([Agent(name="brancher", model=FunctionModel(answer), tools=[send])])
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console-branches")
    # the default SQLite file once it can branch sessions (the SQL stores' part of issue 28),
    # else the in-memory store
    from loom.store.base import BranchStore
    from loom.store.sqlite import SQLiteStore

    store = None if issubclass(SQLiteStore, BranchStore) else ":memory:"
    srv = start_server(
        tmp, app="branch_agents:registry", source=AGENTS, env={"LOOM_API_KEYS": KEY}, store=store
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def page(server: Server) -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run"],
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        p = context.new_page()
        p.goto(f"{server.url}/console/sessions")
        p.fill("input[name=api_key]", KEY)
        p.click("button[type=submit]")
        p.wait_for_url("**/console/sessions")
        yield p
        context.close()
        browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def assistant_answers(page: Any) -> list[str]:
    texts: list[str] = page.locator("#transcript li.m-assistant pre.content").all_text_contents()
    return texts


def test_regenerate_and_edit_and_resend_from_the_page(page: Any, server: Server) -> None:
    with httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=30) as client:
        client.post("/threads", json={"thread_id": "br-1"}).raise_for_status()
        out = client.post(
            "/threads/br-1/runs/wait",
            json={
                "assistant_id": "brancher",
                "input": {"messages": [{"role": "user", "content": "mail bob"}]},
            },
        )
        out.raise_for_status()
    page.goto(f"{server.url}/console/sessions/br-1")
    assert assistant_answers(page)[-1] == "answer 1: sent to bob"
    assert page.locator("#branches").count() == 0
    # regenerate: the answer (and the call it made) leave the transcript, a new one comes
    page.click("#resend button.regenerate")
    page.wait_for_url("**/console/sessions/br-1")
    regenerated = "answer 2 to mail bob (told of earlier effects)"
    page.locator("#transcript li.m-assistant").filter(has_text=regenerated).wait_for()
    page.reload()  # the page as drawn from the store
    assert assistant_answers(page) == [regenerated]
    assert "answer 1: sent to bob" not in page.locator("#transcript").text_content()
    assert (
        "turns of this conversation were undone (regenerate)"
        in page.locator("#transcript li.m-system").text_content()
    )
    branch = page.locator("#branches li.branch")
    assert branch.count() == 1
    assert branch.locator(".branch-reason").text_content() == "regenerate"
    assert branch.locator(".abandoned-mark").text_content() == "abandoned"
    assert not branch.locator("ol.abandoned").is_visible()  # folded
    branch.locator("summary").click()
    assert "answer 1: sent to bob" in branch.locator("ol.abandoned").text_content()
    assert "send" in branch.locator(".effect").text_content()
    shot(page, "branch-regenerated")
    # edit and resend: the last user message replaced, answered anew
    assert page.locator("#resend textarea[name=text]").input_value() == "mail bob"
    page.fill("#resend textarea[name=text]", "hello instead")
    page.click("#resend button.edit")
    page.wait_for_url("**/console/sessions/br-1")
    page.locator("#transcript li.m-assistant").filter(
        has_text=re.compile(r"answer \d+ to hello instead")
    ).wait_for()
    page.reload()
    users = page.locator("#transcript li.m-user pre.content").all_text_contents()
    assert users == ["hello instead"]
    assert page.locator("#branches li.branch").count() == 2
    assert page.locator("#branches li.branch .branch-reason").all_text_contents() == [
        "regenerate",
        "edit",
    ]
    page.locator("#branches li.branch").nth(1).locator("summary").click()
    shot(page, "branch-edited")


def test_bad_forms_are_pages(page: Any, server: Server) -> None:
    page.goto(f"{server.url}/console/sessions/br-1")
    page.evaluate("document.querySelector('#resend .regenerate input[name=csrf_token]').remove()")
    with page.expect_navigation() as nav:
        page.click("#resend button.regenerate")
    assert nav.value.status == 403
    page.goto(f"{server.url}/console/sessions/br-1")
    page.fill("#resend textarea[name=text]", "   ")
    with page.expect_navigation() as nav:
        page.click("#resend button.edit")
    assert nav.value.status == 422
    assert "write some text" in page.locator("#problem-message").text_content()
