"""The console in a real browser: headless Chromium (the system's, driven by playwright)
against a real ``loom serve`` with API keys.

What it proves: logging in with a key sets an HttpOnly, SameSite=Strict cookie; a run streams
into the open page live (the timeline grows while the run is going, without a reload); a
pending call is approved from the page and the run finishes; an error's full text is shown;
model and tool output is escaped (no element or script from it exists, no flag it sets is set);
a form without its CSRF token is a 403 page; unknown ids are 404 pages. A crew session shows
its member tree, its members' parked calls with buttons that decide them, and links to each
member's session (a missing one is a 404 page, never JSON). The live header counts messages;
tool messages carry the tool's name; who decided a call and when is shown; runs are cancelled
and sessions deleted from the page (with the CSRF token); bad query parameters are pages;
``/favicon.ico`` needs no key. The scheduler's pages:
a schedule fired by the server's poller shows with its runs (linking to their sessions) and its
monitor's check-ins; the pause button pauses it (the API says so), and not without its CSRF
token; monitors show the detector's ``missed`` and ``timeout`` check-ins, and a check-in over
the API reaches the open monitors page live. Screenshots go to ``tests/artifacts/console/``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

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
ADMIN_KEY = "console-admin-key-4567"  # sees sessions no key owns, e.g. the scheduler's
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'

AGENTS = r'''
"""Agents for the console's browser tests."""

import asyncio
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Parallel, Sequential
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


def echo(messages, tools):
    return "checked " + messages[-1].content


RELEASE = Crew("release", members={
    "checker": Agent(name="checker", model=FunctionModel(echo)),
    "shipper": Agent(name="shipper", model=caller("deploy", {"target": "prod"}), tools=[deploy],
                     permissions={"ask": ["deploy"]}),
}, plan=Sequential("checker", Parallel("shipper", name="ship")))

registry = AgentRegistry([
    Agent(name="waiter", model=caller("wait_for_file", lambda text: {"path": text}),
          tools=[wait_for_file]),
    Agent(name="xss", model=caller("echo_html", {}), tools=[echo_html]),
    Agent(name="breaker", model=caller("explode", {"what": "core "}), tools=[explode]),
    Agent(name="ops", model=caller("deploy", {"target": "prod"}), tools=[deploy],
          permissions={"ask": ["deploy"]}),
    Agent(name="ticker", model=FunctionModel(lambda messages, tools: "tick")),
    RELEASE,
])
'''.replace("XSS_TEXT", repr(XSS))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console")
    keys = tmp / "keys.yaml"
    keys.write_text(f"- {{name: admin, key: {ADMIN_KEY}, admin: true}}\n")
    srv = start_server(
        tmp,
        "--keys",
        str(keys),
        app="console_agents:registry",
        source=AGENTS,
        env={"LOOM_API_KEYS": KEY, "LOOM_SCHEDULE_POLL": "0.1"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # module, not session: playwright's sync API marks this thread's event loop as running
    # while it is open, and later modules' asyncio.run() would refuse to start
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=[
                "--no-sandbox",
                "--headless",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


def login(browser: Any, server: Server, key: str = KEY, **options: Any) -> Any:
    """A fresh browser context logged in through the form; its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, **options)
    page = context.new_page()
    page.goto(f"{server.url}/console/sessions")
    assert "/console/login" in page.url  # sent to the form first
    page.fill("input[name=api_key]", key)
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
    assert (
        httpx.get(f"{server.url}/threads/x", cookies={"loom_console": cookie["value"]}).status_code
        == 401
    )
    context.close()


def test_a_run_streams_into_the_open_page(page: Any, server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate.txt"
    with api(server) as client:
        client.post("/threads", json={"thread_id": "live-1"}).raise_for_status()
        page.goto(f"{server.url}/console/sessions/live-1")
        wait_live(page)
        page.evaluate("window.__same_page = true")  # gone if the page reloads
        run = client.post(
            "/threads/live-1/runs",
            json={
                "assistant_id": "waiter",
                "input": {"messages": [{"role": "user", "content": str(gate)}]},
            },
        ).json()
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
        out = client.post(
            "/threads/ops-1/runs/wait",
            json={
                "assistant_id": "ops",
                "input": {"messages": [{"role": "user", "content": "ship it"}]},
            },
        ).json()
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
    # who decided (the key's name, stamped by the server) and when
    assert call.locator(".decided-by").text_content() == "env-1"
    assert call.locator(".decided-at").text_content().startswith("20")
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
        assert (
            page.locator(
                ".tool-output script, .tool-output img, #transcript img, #transcript pre script"
            ).count()
            == 0
        )
        page.locator("li.tool[data-name=echo_html] summary").click()
        assert page.evaluate("window.__pwned") is None, where
        page.reload()
    shot(page, "xss-escaped")
    page.context.close()


# -- the scheduler's pages ------------------------------------------------------------------------
def on_store(server: Server, use: Callable[[Any], Awaitable[Any]]) -> Any:
    """``use`` the server's own store file through Loom's Python API, as tests/schedule does (in
    a thread: playwright's sync API owns this thread's event loop)."""
    from loom.store import SQLiteStore

    async def go() -> Any:
        store = SQLiteStore(server.db)
        try:
            return await use(store)
        finally:
            await store.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def until(check: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    """Poll the API until ``check`` answers something true (the server's poller fires on its
    own clock; this waits for the outcome, not for time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def cron_of(client: httpx.Client, cron_id: str) -> dict[str, Any]:
    found = client.post("/runs/crons/search", json={"limit": 0}).json()
    (cron,) = [c for c in found if c["cron_id"] == cron_id]
    return cron  # type: ignore[no-any-return]


def test_a_fired_schedule_shows_with_its_runs_and_monitor(
    browser: Any, page: Any, server: Server
) -> None:
    from loom.schedule import Schedule, ScheduleStore

    with api(server) as client:
        morning = client.post(
            "/runs/crons",
            json={
                "assistant_id": "ticker",
                "schedule": "0 9 * * 1-5",
                "timezone": "Europe/Berlin",
                "multitask_strategy": "enqueue",
                "input": {"messages": [{"role": "user", "content": XSS}]},
            },
        ).json()
        # the cron API takes five-field lines (a minute at least): a one-second interval goes in
        # through the Python API, paused, so its monitor exists before the first tick
        every = Schedule(  # the key's own schedule (issue #24: schedules have owners)
            agent="ticker",
            message="tick",
            interval=1,
            id="every-second",
            enabled=False,
            principal="env-1",
        )
        on_store(server, lambda store: ScheduleStore(store).add(every))
        client.post(
            "/monitors", json={"id": "every-second-mon", "schedule_id": "every-second"}
        ).raise_for_status()
        client.patch("/runs/crons/every-second", json={"enabled": True}).raise_for_status()
        runs = until(
            lambda: [
                r
                for r in client.get("/runs/crons/every-second/runs").json()
                if r["status"] == "finished"
            ],
            "a finished run",
        )
        until(
            lambda: client.get("/monitors/every-second-mon").json()["health"] == "ok",
            "the monitor's ok check-in",
        )
    page.goto(f"{server.url}/console/schedules")
    card = page.locator("#schedule-every-second")
    assert card.get_attribute("data-enabled") == "yes"
    assert card.locator("dd.when").text_content() == "every 1 s"
    assert card.locator("dd.tz").text_content() == "UTC"
    assert card.locator("dd.agent").text_content() == "ticker"
    assert card.locator("dd.misfire").text_content().startswith("run_once")
    assert card.locator("dd.overlap").text_content() == "skip"
    assert card.locator("dd.next").text_content().endswith("UTC")
    links = card.locator("tr.schedule-run[data-status=finished] a.run-link")
    assert links.count() >= 1 and runs
    shown = dict(
        zip(
            links.all_text_contents(),
            links.evaluate_all("els => els.map(e => e.getAttribute('href'))"),
            strict=True,
        )
    )
    with api(server) as client:  # the schedule fires on: read its runs again, after the page
        now = {
            r["run_id"]: r["session_id"]
            for r in client.get("/runs/crons/every-second/runs").json()
            if r["status"] == "finished"
        }
    for run_id, href in shown.items():
        assert href == f"/console/sessions/{quote(now[run_id], safe='')}#run-{run_id}"
    run_id = links.first.text_content()
    monitor = card.locator("#monitor-every-second-mon")
    assert monitor.get_attribute("data-health") == "ok"
    assert monitor.locator("li.checkin[data-status=ok][data-source=schedule]").count() >= 1
    other = page.locator(f"#schedule-{morning['cron_id']}")
    assert other.locator("dd.when").text_content() == "cron 0 9 * * 1-5"
    assert other.locator("dd.tz").text_content() == "Europe/Berlin"
    assert other.locator("dd.overlap").text_content() == "queue"
    assert other.locator("dd.message").text_content() == XSS  # the message, as text
    assert page.locator("#schedules script, #schedules img").count() == 0
    shot(page, "schedules")
    # a run's link opens its session at that run: a tick's session is its schedule's key's
    # (issue #24), and an admin key sees it too
    href = links.first.get_attribute("href")
    assert page.goto(f"{server.url}{href}").status == 200
    admin = login(browser, server, ADMIN_KEY)
    admin.goto(f"{server.url}/console/schedules/every-second")
    admin.locator(f"#schedule-every-second a.run-link[href='{href}']").click()
    admin.wait_for_url(f"**/console/sessions/*#run-{run_id}")
    admin.locator(f"#run-{run_id}[data-status=completed]").wait_for()
    admin.context.close()


def test_the_pause_button_pauses_and_needs_its_csrf_token(page: Any, server: Server) -> None:
    with api(server) as client:
        assert cron_of(client, "every-second")["enabled"] is True
        page.goto(f"{server.url}/console/schedules/every-second")
        card = page.locator("#schedule-every-second")
        card.locator("input[name=csrf_token]").evaluate("e => e.remove()")
        with page.expect_navigation() as nav:
            card.locator("button.pause").click()
        assert nav.value.status == 403
        assert "CSRF" in page.locator("#problem-message").text_content()
        assert cron_of(client, "every-second")["enabled"] is True  # nothing changed
        page.goto(f"{server.url}/console/schedules/every-second")
        page.locator("#schedule-every-second button.pause").click()
        page.wait_for_url("**/console/schedules/every-second")
        assert card.get_attribute("data-enabled") == "no"
        assert "paused" in card.locator("dd.next").text_content()
        paused = cron_of(client, "every-second")
        assert paused["enabled"] is False and paused["next_run_date"] is None
        shot(page, "schedule-paused")
        card.locator("button.resume").click()  # and back, from the page
        page.wait_for_url("**/console/schedules/every-second")
        assert cron_of(client, "every-second")["enabled"] is True
        assert card.get_attribute("data-enabled") == "yes"
        client.patch("/runs/crons/every-second", json={"enabled": False}).raise_for_status()


def test_monitors_show_missed_and_timeout_and_update_live(page: Any, server: Server) -> None:
    from loom.schedule import MonitorStore

    with api(server) as client:
        client.post(
            "/monitors", json={"id": "nightly-backup", "cron": "0 3 * * *", "margin": 600}
        ).raise_for_status()
        client.post(
            "/monitors", json={"id": "stuck-job", "interval": 3600, "max_runtime": 60}
        ).raise_for_status()
        client.post(
            "/monitors/stuck-job/checkins", json={"status": "in_progress"}
        ).raise_for_status()
        expected = client.get("/monitors/nightly-backup").json()["next_expected_at"]
        # the detector (the server's `monitors` job, every minute) run on the server's store at
        # an injected time past the expected check-in plus its margin
        written = on_store(server, lambda store: MonitorStore(store).detect(now=expected + 601))
        mine = {c.monitor_id: c.status for c in written}
        assert mine["nightly-backup"] == "missed" and mine["stuck-job"] == "timeout"
        page.goto(f"{server.url}/console/monitors")
        wait_live(page)
        row = page.locator("#monitor-nightly-backup")
        assert row.get_attribute("data-health") == "missed"
        newest = row.locator("li.checkin").first
        assert newest.get_attribute("data-status") == "missed"
        assert newest.get_attribute("data-source") == "system"
        stuck = page.locator("#monitor-stuck-job")
        assert stuck.get_attribute("data-health") == "timed_out"
        assert [
            stuck.locator("li.checkin").nth(i).get_attribute("data-status") for i in range(2)
        ] == ["timeout", "in_progress"]
        # a check-in over the API reaches the open page (the row appears; then it changes)
        page.evaluate("window.__same_page = true")
        client.post("/monitors", json={"id": "ext-job", "interval": 3600}).raise_for_status()
        client.post("/monitors/ext-job/checkins", json={"status": "ok"}).raise_for_status()
        page.locator("#monitor-ext-job[data-health=ok]").wait_for()
        client.post("/monitors/ext-job/checkins", json={"status": "error"}).raise_for_status()
        page.locator("#monitor-ext-job[data-health=failing]").wait_for()
        assert page.locator("#monitor-ext-job").count() == 1  # replaced, not appended again
        assert page.evaluate("window.__same_page") is True
        assert client.get("/monitors/ext-job").json()["health"] == "failing"
        shot(page, "monitors")


def test_unknown_ids_are_404_pages(page: Any, server: Server) -> None:
    for path in (
        "/console/sessions/no-such-session",
        "/console/errors/err_20200101_000000_000000",
        "/console/schedules/no-such-schedule",
        "/console/monitors/no-such-monitor",
    ):
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


# -- crews, and the rough edges (issue 25) -------------------------------------------------------
def test_a_crew_page_shows_its_members_and_decides_a_member_call(page: Any, server: Server) -> None:
    with api(server) as client:
        client.post("/threads", json={"thread_id": "rel-1"}).raise_for_status()
        page.goto(f"{server.url}/console/sessions/rel-1")
        wait_live(page)
        page.evaluate("window.__same_page = true")
        out = client.post(
            "/threads/rel-1/runs/wait",
            json={
                "assistant_id": "release",
                "input": {"messages": [{"role": "user", "content": "ship v2"}]},
            },
        ).json()
        assert out["__interrupt__"]
    # the members and the parked call arrive live, into the open page
    page.locator(
        "li.member[data-path='release/ship/shipper'][data-status=awaiting_approval]"
    ).wait_for()
    page.locator("#approvals li.pending").wait_for()
    assert page.evaluate("window.__same_page") is True
    page.reload()
    # the member tree, from the crew log
    checker = page.locator("li.member[data-path='release/checker']")
    shipper = page.locator("li.member[data-path='release/ship/shipper']")
    assert checker.get_attribute("data-status") == "completed"
    assert shipper.get_attribute("data-status") == "awaiting_approval"
    assert "depth-1" in (checker.get_attribute("class") or "")
    assert "depth-2" in (shipper.get_attribute("class") or "")
    # the parked member's call, with its member and buttons
    pending = page.locator("#approvals li.pending")
    assert pending.count() == 1
    assert "deploy" in pending.text_content() and "release/ship/shipper" in pending.text_content()
    shot(page, "crew-pending")
    # a member's session opens as a page, and links back to its crew
    checker.locator("a.child-link").click()
    page.wait_for_url("**/console/sessions/rel-1*release/checker*")
    assert page.locator("h1").text_content() == "Session rel-1:release/checker"
    assert page.locator("#transcript li.m-assistant").last.text_content().count("checked")
    page.locator("#crew-session-link").click()
    page.wait_for_url("**/console/sessions/rel-1")
    # approve from the crew page: the member's call runs and the crew finishes
    page.click("#approvals button.approve")
    page.wait_for_url("**/console/sessions/rel-1")
    page.locator("li.run[data-status=completed]").wait_for()
    assert page.locator("#approvals li.pending").count() == 0
    done = page.locator("li.run[data-status=completed] li.member[data-path='release/ship/shipper']")
    assert done.get_attribute("data-status") == "completed"
    assert "deployed prod" in done.text_content()
    with api(server) as client:
        assert client.get("/threads/rel-1/approvals").json() == []
        member = client.get("/threads/rel-1:release/ship/shipper/state")
        if member.status_code == 200:  # a member's session over the API (when it routes ids)
            assert "deployed prod" in str(member.json())
    shot(page, "crew-done")
    # the decision says who made it (the key's name) and when
    page.locator("li.member[data-path='release/ship/shipper'] a.child-link").last.click()
    page.wait_for_url("**/console/sessions/rel-1**shipper**")
    decided = page.locator("li.tool[data-name=deploy]").last
    assert decided.locator(".approval").text_content() == "approve"
    assert decided.locator(".decided-by").text_content() == "env-1"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", decided.locator(".decided-at").text_content()
    )
    shot(page, "crew-member-decided")


def test_missing_pages_are_html_404s_never_json(page: Any, server: Server) -> None:
    for path in (
        "/console/sessions/rel-1:release/no-such-member",
        "/console/sessions/a/b/c",
        "/console/no/such/page",
    ):
        response = page.goto(f"{server.url}{path}")
        assert response.status == 404, path
        assert response.headers["content-type"].startswith("text/html"), path
        assert page.locator("h1").text_content() == "Not found", path


def test_bad_query_parameters_are_an_html_page(page: Any, server: Server) -> None:
    for query in ("page=abc", "page=-1"):
        response = page.goto(f"{server.url}/console/sessions/live-1?{query}")
        assert response.status == 422, query
        assert response.headers["content-type"].startswith("text/html"), query
        assert page.locator("h1").text_content() == "Bad request"
        assert "page" in page.locator("#problem-message").text_content()
    shot(page, "bad-query")
    response = page.goto(f"{server.url}/console/schedules?jobs=maybe")  # FastAPI's validation
    assert response.status == 422
    assert response.headers["content-type"].startswith("text/html")
    assert page.locator("h1").text_content() == "Bad request"
    assert "jobs" in page.locator("#problem-message").text_content()


def test_the_favicon_needs_no_key(server: Server) -> None:
    response = httpx.get(f"{server.url}/favicon.ico")
    assert response.status_code == 204
    assert httpx.get(f"{server.url}/threads/x").status_code == 401  # the API still does


def test_live_message_count_and_tool_names(page: Any, server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate.txt"
    gate.write_text("open")
    with api(server) as client:
        client.post("/threads", json={"thread_id": "count-1"}).raise_for_status()
        page.goto(f"{server.url}/console/sessions/count-1")
        wait_live(page)
        assert page.locator("#message-count").text_content() == "0"
        client.post(
            "/threads/count-1/runs/wait",
            json={
                "assistant_id": "waiter",
                "input": {"messages": [{"role": "user", "content": str(gate)}]},
            },
        ).raise_for_status()
        page.wait_for_selector("li.run[data-status=completed]")
        stored = len(client.get("/threads/count-1/state").json()["values"]["messages"])
    # user, the model's call, the tool's result, the answer: counted as they arrived
    page.locator("#message-count").filter(has_text=re.compile(f"^{stored}$")).wait_for()
    assert stored == 4
    tool_message = page.locator("#transcript li.m-tool")
    assert tool_message.locator(".tool-name").text_content() == "wait_for_file"
    page.reload()
    assert page.locator("#message-count").text_content() == "4"
    assert page.locator("#transcript li.m-tool .tool-name").text_content() == "wait_for_file"
    shot(page, "message-count")


def test_cancel_a_run_and_delete_the_session_from_the_page(
    page: Any, server: Server, tmp_path: Path
) -> None:
    gate = tmp_path / "never.txt"  # never created: the run waits until it is cancelled
    with api(server) as client:
        client.post("/threads", json={"thread_id": "cancel-1"}).raise_for_status()
        run = client.post(
            "/threads/cancel-1/runs",
            json={
                "assistant_id": "waiter",
                "input": {"messages": [{"role": "user", "content": str(gate)}]},
            },
        ).json()
        page.goto(f"{server.url}/console/sessions/cancel-1")
        page.locator("li.tool[data-name=wait_for_file] .s-running").wait_for()
        page.goto(f"{server.url}/console/runs")  # the runs page offers the cancel too
        assert page.locator(f"#runs form.cancel-run[data-run='{run['run_id']}']").count() == 1
        page.goto(f"{server.url}/console/sessions/cancel-1")
        button = page.locator(f"#actions form.cancel-run[data-run='{run['run_id']}'] button")
        button.wait_for()
        shot(page, "cancel-running")
        # without its CSRF token the cancel is refused and the run goes on
        page.evaluate("document.querySelector('#actions form.cancel-run input').remove()")
        with page.expect_navigation() as nav:
            button.click()
        assert nav.value.status == 403
        assert client.get(f"/threads/cancel-1/runs/{run['run_id']}").json()["status"] in (
            "pending",
            "running",
        )
        page.goto(f"{server.url}/console/sessions/cancel-1")
        page.locator(f"#actions form.cancel-run[data-run='{run['run_id']}'] button").click()
        page.wait_for_url("**/console/sessions/cancel-1")
        page.locator(f"#run-{run['run_id']}[data-status=cancelled]").wait_for()
        assert page.locator("#actions form.cancel-run").count() == 0
        # delete, confirmed in the browser's dialog
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("#actions form.delete-session button").click()
        page.wait_for_url("**/console/sessions")
        assert client.get("/threads/cancel-1").status_code == 404
        assert page.locator("a[href='/console/sessions/cancel-1']").count() == 0
    shot(page, "deleted")
