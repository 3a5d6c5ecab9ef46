"""The console's memories page in a real browser: headless Chromium (the system's, driven by
playwright) against a real ``loom serve`` with three API keys and its default SQLite store.

What it proves: after logging in, the Memories link in the navigation opens the page; it lists
the key's namespaces and items (not the other key's), a huge value cut with its size and an
item's expiry; the search box finds an item with its score; a namespace link narrows the list;
**Delete** asks first (a dismissed dialog deletes nothing), and once accepted the item is gone
from the page and from the Store API. A key without items is told how they are made; a bad
namespace in the address is a message on the page. The screenshot is
``tests/artifacts/console/memories.png``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server
from tests.server.test_console_browser import ARTIFACTS, CHROMIUM, KEY, login, shot

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")

OTHER_KEY = "console-memories-other-5678"
EMPTY_KEY = "console-memories-empty-9012"  # writes nothing

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console-memories")
    srv = start_server(tmp, env={"LOOM_API_KEYS": f"{KEY},{OTHER_KEY},{EMPTY_KEY}"})
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


def put(
    server: Server, key: str, namespace: list[str], item_key: str, value: Any, **kw: Any
) -> None:
    body = {"namespace": namespace, "key": item_key, "value": value, **kw}
    r = httpx.put(f"{server.url}/store/items", json=body, headers={"x-api-key": key}, timeout=30)
    assert r.status_code == 204, r.text


def stored(server: Server, namespace: list[str], item_key: str) -> Any:
    params = {"namespace": ".".join(namespace), "key": item_key}
    r = httpx.get(
        f"{server.url}/store/items", params=params, headers={"x-api-key": KEY}, timeout=30
    )
    r.raise_for_status()
    return r.json()


def keys_on(page: Any) -> list[str]:
    keys: list[str] = page.locator("#memories tr.memory").evaluate_all(
        "rows => rows.map(r => r.dataset.key)"
    )
    return keys


def test_browse_search_and_delete_memories(browser: Any, server: Server) -> None:
    prefs, work = ["memories", "console", "prefs"], ["memories", "console", "work"]
    put(server, KEY, prefs, "food", {"text": "Likes spicy ramen, no coriander."})
    put(server, KEY, prefs, "drink", {"text": "Green tea, no sugar.", "kind": "drink"})
    put(server, KEY, prefs, "trip", {"text": "Flying to Lisbon next week."}, ttl=60 * 24 * 7)
    put(server, KEY, work, "stack", {"languages": ["Rust", "Python"], "editor": "helix"})
    put(server, KEY, work, "notes", {"text": "Meeting notes. " * 400})
    put(server, OTHER_KEY, ["memories", "other"], "secret", {"text": "the other key's ramen"})

    page = login(browser, server)
    page.locator("header.top nav a", has_text="Memories").click()
    page.wait_for_url("**/console/memories")
    assert page.locator("#namespaces a.ns").all_text_contents() == [
        "memories.console.prefs",
        "memories.console.work",
    ]
    assert sorted(keys_on(page)) == ["drink", "food", "notes", "stack", "trip"]
    assert "other key" not in page.content()
    notes = page.locator("#memories tr.memory[data-key=notes]")
    assert "cut: the value is" in notes.locator(".cut").text_content()
    trip = page.locator("#memories tr.memory[data-key=trip]")
    assert trip.locator("td.expires").text_content().strip()[:2] == "20"  # a date, not "never"
    assert page.locator("#memories tr.memory[data-key=food] td.expires").text_content() == "never"
    shot(page, "memories-all")

    # the search box: keyword search, best first, each hit with its score
    page.fill("#memory-search input[name=q]", "ramen")
    page.locator("#memory-search button").click()
    page.wait_for_url("**/console/memories?q=ramen")
    assert keys_on(page) == ["food"]
    assert float(page.locator("#memories tr.memory td.score").text_content()) > 0
    shot(page, "memories-search")

    # a namespace narrows the list (the search is kept)
    page.locator("#namespaces a.ns", has_text="memories.console.prefs").click()
    page.wait_for_url("**/console/memories?ns=memories.console.prefs&q=ramen")
    assert keys_on(page) == ["food"]
    page.locator("#memory-search a", has_text="clear").click()
    page.wait_for_url("**/console/memories?ns=memories.console.prefs")
    assert sorted(keys_on(page)) == ["drink", "food", "trip"]

    # delete asks first: dismissed, nothing is deleted
    food = page.locator("#memories tr.memory[data-key=food] form.delete-memory button")
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    food.click()
    assert asked == ["Delete memory food in memories.console.prefs?"]
    assert stored(server, prefs, "food") is not None
    assert "food" in keys_on(page)
    # accepted: the item is gone from the page and from the store
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        food.click()
    page.wait_for_url("**/console/memories?ns=memories.console.prefs")
    assert sorted(keys_on(page)) == ["drink", "trip"]
    assert stored(server, prefs, "food") is None
    page.goto(f"{server.url}/console/memories")
    shot(page, "memories")
    page.context.close()


def test_the_empty_page_and_a_bad_namespace(browser: Any, server: Server) -> None:
    page = login(browser, server, key=EMPTY_KEY)
    page.goto(f"{server.url}/console/memories")
    empty = page.locator("#no-memories").text_content()
    assert empty.startswith("No memories yet:") and "save_memory" in empty
    assert page.locator("#namespaces a.ns").count() == 0
    shot(page, "memories-empty")
    answer = page.goto(f"{server.url}/console/memories?ns=notes..alice")
    assert answer is not None and answer.status == 422
    error = page.locator("#memories-error").text_content()
    assert "namespace part 1 must be a non-empty string" in error
    assert page.locator("#memory-search input[name=ns]").count() == 0  # searches everywhere
    shot(page, "memories-bad-namespace")
    page.context.close()
