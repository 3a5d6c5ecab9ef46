"""The console in a real browser: headless Chromium (the system's, driven by playwright)
against a real ``loom serve`` with API keys.

What it proves: logging in with a key sets an HttpOnly, SameSite=Strict cookie; a run streams
into the open page live (the timeline grows while the run is going, without a reload); a
pending call is approved from the page and the run finishes; an error's full text is shown;
model and tool output is escaped (no element or script from it exists, no flag it sets is set);
a form without its CSRF token is a 403 page; unknown ids are 404 pages. Screenshots go to
``tests/artifacts/console/``.
"""

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
    pytest.skip(
        f"no chromium at {CHROMIUM} (./scripts/test installs the Debian package `chromium`)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
KEY = "console-test-key-0123"
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'

AGENTS = r'''
"""Agents for the console's browser tests."""

import asyncio
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel

XSS = XSS_TEXT


@tool(effect="pure")
async def wait_for_file(path: str) -> str:
    """Wait until the test creates ``path``; answer its text."""
    while not Path(path).exists():  # the test creates it once the page shows the run
        await asyncio.sleep(0.02)
    return Path(path).read_text()


@tool(effect="pure")
def echo_html() -> str:
    """Answer markup the console must show as text."""
    return XSS


@tool(effect="pure")
def explode(what: str) -> str:
    """Fail with a long message."""
    raise RuntimeError("the reactor exploded: " + what * 20)


@tool
def deploy(target: str) -> str:
    """Deploy (needs approval)."""
    return f"deployed {target}"


def caller(name, args):
    def model(messages, tools):
        last = messages[-1]
        if last.role == "tool":
            return f"finished: {last.content[:40]}"
        call_args = args(last.content) if callable(args) else args
        return ModelResponse(tool_calls=[ToolCall(name=name, arguments=call_args)])
    return FunctionModel(model)


registry = AgentRegistry([
    Agent(name="waiter", model=caller("wait_for_file", lambda text: {"path": text}),
          tools=[wait_for_file]),
    Agent(name="xss", model=caller("echo_html", {}), tools=[echo_html]),
    Agent(name="breaker", model=caller("explode", {"what": "core "}), tools=[explode]),
    Agent(name="ops", model=caller("deploy", {"target": "prod"}), tools=[deploy],
          permissions={"ask": ["deploy"]}),
])
'''.replace("XSS_TEXT", repr(XSS))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console")
    srv = start_server(tmp, app="console_agents:registry", source=AGENTS,
                       env={"LOOM_API_KEYS": KEY})  # fmt: skip
    yield srv
    stop_server(srv)


# Module, not session: while sync_playwright is open it keeps an event loop running in the main
# thread, and every asyncio test that ran after this module failed ("another loop is running").
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--headless", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        yield b
        b.close()


def login(browser: Any, server: Server, **options: Any) -> Any:
    """A fresh browser context logged in through the form; its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, **options)
    page = context.new_page()
    page.goto(f"{server.url}/console/sessions")
    assert "/console/login" in page.url  # sent to the form first
    page.fill("input[name=api_key]", KEY)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/sessions")
    return page


@pytest.fixture(scope="module")
def page(browser: Any, server: Server) -> Iterator[Any]:
    p = login(browser, server)
    yield p
    p.context.close()


def api(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=30)


def wait_live(page: Any) -> None:
    """Until the page's SSE stream is open."""
    page.locator("#live-state").filter(has_text=re.compile("^live$")).wait_for()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_login_sets_a_strict_httponly_cookie_and_refuses_a_wrong_key(
    browser: Any, server: Server
) -> None:
    context = browser.new_context()
    p = context.new_page()
    p.goto(f"{server.url}/console/sessions")
    p.fill("input[name=api_key]", "not-the-key-at-all")
    p.click("button[type=submit]")
    assert p.locator("#login-failed").is_visible()
    assert not [c for c in context.cookies() if c["name"] == "loom_console"]
    p.fill("input[name=api_key]", KEY)
    p.click("button[type=submit]")
    p.wait_for_url("**/console/sessions")
    (cookie,) = [c for c in context.cookies() if c["name"] == "loom_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert KEY not in cookie["value"]
    # the API itself still wants the key: the cookie is the console's only
    assert httpx.get(f"{server.url}/threads/x", cookies={"loom_console": cookie["value"]}
                     ).status_code == 401  # fmt: skip
    context.close()


def test_a_run_streams_into_the_open_page(page: Any, server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate.txt"
    with api(server) as client:
        client.post("/threads", json={"thread_id": "live-1"}).raise_for_status()
        page.goto(f"{server.url}/console/sessions/live-1")
        wait_live(page)
        page.evaluate("window.__same_page = true")  # gone if the page reloads
        run = client.post("/threads/live-1/runs",
                          json={"assistant_id": "waiter", "input": {"messages": [
                              {"role": "user", "content": str(gate)}]}}).json()  # fmt: skip
    run_node = page.locator(f"#run-{run['run_id']}")
    tool = run_node.locator("li.tool[data-name=wait_for_file]")
    # the first entries arrive while the tool still waits for the file
    tool.locator(".s-running").wait_for()
    assert run_node.get_attribute("data-status") == "running"
    assert page.locator("#session-status").text_content() == "running"
    assert run_node.locator("li.note.n-user").text_content().strip().endswith(str(gate))
    assert not gate.exists()
    shot(page, "live-running")
    gate.write_text("the gate opened")
    page.wait_for_selector(f"#run-{run['run_id']}[data-status=completed]")
    assert page.evaluate("window.__same_page") is True  # live updates, not a reload
    run_node = page.locator(f"#run-{run['run_id']}")
    # ordered as the events: the user's message, model call 1 with the tool, model call 2
    kinds = run_node.locator(":scope > ol > li").evaluate_all("els => els.map(e => e.id)")
    assert kinds == [kinds[0], f"llm-{run['run_id']}-1", f"llm-{run['run_id']}-2"]
    assert kinds[0].startswith("note-")
    assert "the gate opened" in run_node.locator(".tool-output").text_content()
    assert page.locator("#transcript li.m-assistant").last.text_content().count("finished")
    assert page.locator("#session-status").text_content() == "completed"
    shot(page, "live-finished")


def test_approve_a_pending_call_from_the_page(page: Any, server: Server) -> None:
    with api(server) as client:
        client.post("/threads", json={"thread_id": "ops-1"}).raise_for_status()
        out = client.post("/threads/ops-1/runs/wait", json={"assistant_id": "ops", "input": {
            "messages": [{"role": "user", "content": "ship it"}]}}).json()  # fmt: skip
        assert out["__interrupt__"]
    page.goto(f"{server.url}/console/sessions/ops-1")
    pending = page.locator("#approvals li.pending")
    assert pending.count() == 1 and "deploy" in pending.text_content()
    shot(page, "approval-pending")
    # without its CSRF token the same form is refused
    page.evaluate("document.querySelector('#approvals input[name=csrf_token]').remove()")
    with page.expect_navigation() as nav:
        page.click("#approvals button.approve")
    assert nav.value.status == 403
    assert "CSRF" in page.locator("#problem-message").text_content()
    with api(server) as client:  # nothing was decided
        assert client.get("/threads/ops-1/approvals").json()[0]["decided"] is None
    page.goto(f"{server.url}/console/sessions/ops-1")
    page.click("#approvals button.approve")
    page.wait_for_url("**/console/sessions/ops-1")
    page.locator("li.run[data-status=completed]").wait_for()  # the resumed run
    # the parked call (in the run that asked) shows the decision and then its result
    call = page.locator("li.tool[data-name=deploy]")
    assert call.count() == 1
    assert "deployed prod" in call.locator(".tool-output").text_content()
    assert call.locator(".approval").text_content() == "approve"
    assert page.locator("li.run").count() == 2
    assert page.locator("#approvals li.pending").count() == 0
    shot(page, "approval-done")


def test_an_error_in_full(page: Any, server: Server) -> None:
    with api(server) as client:
        client.post(
            "/runs/wait",
            json={
                "assistant_id": "breaker",
                "input": {"messages": [{"role": "user", "content": "go"}]},
                "on_completion": "keep",
            },
        ).raise_for_status()
    page.goto(f"{server.url}/console/errors")
    page.locator("#errors a[href^='/console/errors/']").first.click()
    page.wait_for_url("**/console/errors/err_*")
    full = page.locator("#raw-error").text_content() + page.locator("#traceback").text_content()
    assert "the reactor exploded: " + "core " * 20 in full  # whole, not the 100-char summary
    assert "RuntimeError" in full
    shot(page, "error")


def test_tool_output_is_escaped_on_the_page_and_live(browser: Any, server: Server) -> None:
    # without the console's Content-Security-Policy, so escaping alone must stop the script
    page = login(browser, server, bypass_csp=True)
    with api(server) as client:
        client.post("/threads", json={"thread_id": "xss-1"}).raise_for_status()
        page.goto(f"{server.url}/console/sessions/xss-1")
        wait_live(page)
        client.post(
            "/threads/xss-1/runs/wait",
            json={
                "assistant_id": "xss",
                "input": {"messages": [{"role": "user", "content": "html please"}]},
            },
        ).raise_for_status()
    page.wait_for_selector("li.run[data-status=completed]")  # arrived over SSE
    for where in ("live", "loaded"):
        output = page.locator("li.tool[data-name=echo_html] .tool-output")
        assert output.text_content() == XSS  # shown as text
        assert page.locator(".tool-output script, .tool-output img, #transcript img, "
                            "#transcript pre script").count() == 0  # fmt: skip
        page.locator("li.tool[data-name=echo_html] summary").click()
        assert page.evaluate("window.__pwned") is None, where
        page.reload()
    shot(page, "xss-escaped")
    page.context.close()


def test_unknown_ids_are_404_pages(page: Any, server: Server) -> None:
    for path in ("/console/sessions/no-such-session", "/console/errors/err_20200101_000000_000000"):
        response = page.goto(f"{server.url}{path}")
        assert response.status == 404
        assert page.locator("h1").text_content() == "Not found"


def test_readme_screenshot(page: Any, server: Server) -> None:
    """The README's picture of the console (written when LOOM_SCREENSHOT is set)."""
    page.goto(f"{server.url}/console/sessions/live-1")
    page.locator("li.tool details").first.evaluate("d => d.open = true")
    shot(page, "readme")
    target = os.environ.get("LOOM_SCREENSHOT")
    if target:
        page.screenshot(path=target, full_page=False)
