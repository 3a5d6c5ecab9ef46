"""The console's memories page over HTTP, against a real ``loom serve`` with API keys (its
default SQLite store: items with FTS5 keyword search). Items are written through the Store
API as each key; the console is read with the key's header, as a browser's login cookie
would (the same principal).

What it proves: a key sees only its own namespaces and items, an admin key every item with
its owner; search shows each hit's score; deleting needs the form's CSRF token, another key's
item is a 404 page and stays, an admin deletes any item; a bad namespace, ``limit`` or
``offset`` is a 422 page saying what is wrong (never a 500); a huge value is shown cut with its
size; pages follow ``limit`` / ``offset``; a key without items is told how memories are made.
In process: without keys every item shows with its owner (``MemoryStore``), and a store without
the ``ItemStore`` capability is a page that says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

ALICE, BOB, ROOT, CAROL = "alice-key-0101", "bob-key-0202", "root-key-0303", "carol-key-0404"
DAVE = "dave-key-0505"  # writes nothing

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("console_memories")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: carol, key: {CAROL}}}\n"
        f"- {{name: dave, key: {DAVE}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(tmp, "--keys", str(tmp / "keys.yaml"))
    yield srv
    stop_server(srv)


def client(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"x-api-key": key}, timeout=30)


def put(server: Server, key: str, namespace: list[str], item_key: str, value: Any) -> None:
    with client(server, key) as c:
        r = c.put("/store/items", json={"namespace": namespace, "key": item_key, "value": value})
        assert r.status_code == 204, r.text


def get(server: Server, key: str, namespace: list[str], item_key: str) -> Any:
    with client(server, key) as c:
        r = c.get("/store/items", params={"namespace": ".".join(namespace), "key": item_key})
        r.raise_for_status()
        return r.json()


def rows(html: str) -> list[tuple[str, str]]:
    """The (namespace, key) of each item row on a memories page."""
    return re.findall(r'<tr class="memory" data-key="([^"]*)" data-ns="([^"]*)"', html)


def keys_of(html: str) -> list[str]:
    return [k for k, _ in rows(html)]


def namespaces_of(html: str) -> list[str]:
    return re.findall(r'<a class="ns[^"]*" href="[^"]*">([^<]*)</a>', html)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


@pytest.fixture(scope="module")
def planted(server: Server) -> None:
    put(server, ALICE, ["notes", "alice"], "food", {"text": "likes spicy ramen"})
    put(server, ALICE, ["notes", "alice"], "drink", {"text": "green tea", "kind": "drink"})
    put(server, BOB, ["notes", "bob"], "food", {"text": "ramen with extra garlic"})
    put(server, BOB, ["secrets"], "pin", {"text": "bob's pin is 9876"})


def test_a_key_sees_only_its_own_namespaces_and_items(server: Server, planted: None) -> None:
    with client(server, ALICE) as c:
        page = c.get("/console/memories")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert namespaces_of(page.text) == ["notes.alice"]
    assert sorted(rows(page.text)) == [("drink", "notes.alice"), ("food", "notes.alice")]
    assert "garlic" not in page.text and "9876" not in page.text
    assert "likes spicy ramen" in page.text and "&#34;kind&#34;: &#34;drink&#34;" in page.text
    assert 'href="/console/memories"' in page.text  # the navigation links the page
    # bob's namespace by its address: nothing of his is shown
    with client(server, ALICE) as c:
        theirs = c.get("/console/memories", params={"ns": "notes.bob"})
    assert theirs.status_code == 200 and rows(theirs.text) == []
    assert "garlic" not in theirs.text


def test_search_shows_each_hits_score_and_only_the_keys_own(server: Server, planted: None) -> None:
    with client(server, ALICE) as c:
        found = c.get("/console/memories", params={"q": "ramen"})
        none = c.get("/console/memories", params={"q": "garlic"})
    assert rows(found.text) == [("food", "notes.alice")]
    scores = re.findall(r'<td class="score">([-0-9.e]+)</td>', found.text)
    assert len(scores) == 1 and float(scores[0]) > 0
    assert rows(none.text) == [] and 'id="no-matches"' in none.text
    assert "no memory matches" in none.text
    # search syntax is the store's business: odd queries are answers, never a 500
    with client(server, ALICE) as c:
        for odd in ('"', "NOT", "ramen*", "ramen OR", "((", "-", "<script>"):
            answer = c.get("/console/memories", params={"q": odd})
            assert answer.status_code == 200, (odd, answer.text)
            assert "<script>" not in answer.text.split("<main>", 1)[1]


def test_an_admin_key_sees_every_item_with_its_owner(server: Server, planted: None) -> None:
    with client(server, ROOT) as c:
        page = c.get("/console/memories", params={"q": "ramen"})
    assert sorted(rows(page.text)) == [("food", "notes.alice"), ("food", "notes.bob")]
    owners = re.findall(r'<td class="owner">([^<]*)</td>', page.text)
    assert sorted(owners) == ["alice", "bob"]
    with client(server, ROOT) as c:
        spaces = namespaces_of(c.get("/console/memories").text)
    assert {"notes.alice", "notes.bob", "secrets"} <= set(spaces)


def _delete(c: httpx.Client, ns: str, key: str, *, token: bool = True) -> httpx.Response:
    form = {"ns": ns, "key": key, "next": "/console/memories"}
    if token:
        form["csrf_token"] = csrf_of(c.get("/console/memories").text)
    return c.post("/console/memories/delete", data=form)


def test_deleting_another_keys_item_is_a_404_and_deletes_nothing(server: Server) -> None:
    put(server, BOB, ["diary"], "monday", {"text": "bob wrote this"})
    with client(server, ALICE) as c:
        refused = _delete(c, "diary", "monday")
    assert refused.status_code == 404 and "text/html" in refused.headers["content-type"]
    assert "no memory" in refused.text
    assert get(server, BOB, ["diary"], "monday")["value"] == {"text": "bob wrote this"}
    # the admin key deletes it
    with client(server, ROOT) as c:
        done = _delete(c, "diary", "monday")
    assert done.status_code == 303 and done.headers["location"] == "/console/memories"
    assert get(server, BOB, ["diary"], "monday") is None


def test_a_key_deletes_its_own_item_only_with_the_csrf_token(server: Server) -> None:
    put(server, ALICE, ["todo"], "milk", {"text": "buy milk"})
    with client(server, ALICE) as c:
        forged = _delete(c, "todo", "milk", token=False)
        assert forged.status_code == 403
        assert get(server, ALICE, ["todo"], "milk") is not None
        done = _delete(c, "todo", "milk")
        assert done.status_code == 303
        assert get(server, ALICE, ["todo"], "milk") is None
        again = _delete(c, "todo", "milk")  # gone already: the 404 page
        assert again.status_code == 404


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"ns": "notes..alice"}, "namespace part 1 must be a non-empty string"),
        ({"ns": "x" * 200}, "namespace part 0 is 200 characters, over 128"),
        ({"ns": ".".join("abcdefghijkl")}, "at most 10 parts"),
        ({"limit": "abc"}, "limit must be a whole number"),
        ({"limit": "10000000"}, "limit must be an integer from 1 to 1000"),
        ({"limit": "500"}, "limit is at most 200 items a page"),
        ({"limit": "0"}, "limit must be an integer from 1 to 1000"),
        ({"offset": "-3"}, "offset must be a whole number"),
        ({"offset": "²"}, "offset must be a whole number"),
        ({"offset": "9" * 5000}, "offset must be a whole number"),
    ],
)
def test_bad_input_is_a_422_page_saying_what_is_wrong(
    server: Server, planted: None, params: dict[str, str], says: str
) -> None:
    with client(server, ALICE) as c:
        page = c.get("/console/memories", params=params)
    assert page.status_code == 422 and "text/html" in page.headers["content-type"]
    error = re.search(r'<p class="bad" id="memories-error">([^<]*)</p>', page.text)
    assert error and says in error.group(1), page.text
    assert namespaces_of(page.text) == ["notes.alice"]  # the rest of the page is there


def test_a_bad_namespace_in_a_delete_is_a_422_page(server: Server) -> None:
    with client(server, ALICE) as c:
        page = _delete(c, "a..b", "k")
    assert page.status_code == 422 and "namespace part 1" in page.text


def test_a_huge_value_is_shown_cut_with_its_size(server: Server) -> None:
    put(server, CAROL, ["big"], "essay", {"text": "word " * 60_000})
    put(server, CAROL, ["big"], "blob", {"data": ["x" * 1000] * 200})
    with client(server, CAROL) as c:
        page = c.get("/console/memories", params={"ns": "big"})
    assert page.status_code == 200
    sizes = re.findall(r"cut: the value is ([0-9,]+) bytes of JSON", page.text)
    assert sorted(int(s.replace(",", "")) for s in sizes) == [
        len('{"data":[' + ",".join(['"' + "x" * 1000 + '"'] * 200) + "]}"),
        len('{"text":"' + "word " * 60_000 + '"}'),
    ]
    assert len(page.text) < 40_000  # neither value is on the page whole


def test_pages_follow_limit_and_offset(server: Server) -> None:
    for i in range(7):
        put(server, CAROL, ["paged"], f"k{i}", {"text": f"item {i}"})
    with client(server, CAROL) as c:
        first = c.get("/console/memories", params={"ns": "paged", "limit": "3"})
        last = c.get("/console/memories", params={"ns": "paged", "limit": "3", "offset": "6"})
    assert keys_of(first.text) == ["k6", "k5", "k4"]  # newest first
    assert 'id="next-page" href="/console/memories?ns=paged&amp;limit=3&amp;offset=3"' in (
        first.text
    )
    assert 'id="prev-page"' not in first.text
    assert keys_of(last.text) == ["k0"]
    assert 'id="next-page"' not in last.text
    assert 'id="prev-page" href="/console/memories?ns=paged&amp;limit=3&amp;offset=3"' in last.text


def test_a_key_without_memories_is_told_how_they_are_made(server: Server, planted: None) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.get("/console/memories").status_code in (302, 303, 401)
    with client(server, DAVE) as c:
        page = c.get("/console/memories")
    assert page.status_code == 200 and rows(page.text) == [] and namespaces_of(page.text) == []
    empty = re.search(r'<p class="muted empty" id="no-memories">(.*?)</p>', page.text)
    assert empty and "save_memory" in empty.group(1) and "loom memory" in empty.group(1)
    with client(server, ROOT) as c:
        nothing = c.get("/console/memories", params={"ns": "nobody.here"})
    assert rows(nothing.text) == [] and "no memories under nobody.here" in nothing.text


def _in_process_app() -> tuple[Any, Any]:
    """The server's application in this process, without keys (an open console), on a
    ``MemoryStore`` (items kept in memory); the app and its store."""
    from loom import Agent
    from loom.server import AgentRegistry, create_app
    from loom.server.app import server_runtime
    from loom.store.memory import MemoryStore
    from loom.testing import FunctionModel

    store = MemoryStore()
    registry = AgentRegistry([Agent(name="echo", model=FunctionModel(lambda m, t: "hi"))])
    return create_app(registry, server_runtime(store)), store


async def test_without_keys_every_item_shows_with_its_owner_on_a_memory_store() -> None:
    app, store = _in_process_app()
    await store.put_item(("notes", "alice"), "food", {"text": "likes ramen"}, owner="alice")
    await store.put_item(("notes",), "motd", {"text": "hello all"})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://loom.test") as http:
        page = await http.get("/console/memories")
    assert page.status_code == 200
    assert sorted(rows(page.text)) == [("food", "notes.alice"), ("motd", "notes")]
    owners = re.findall(r'<td class="owner">([^<]*)</td>', page.text)
    assert sorted(owners) == ["alice", "shared"]


async def test_a_store_without_items_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.server.console import auth, memories
    from loom.store.base import StoreCapabilities

    app, _ = _in_process_app()
    monkeypatch.setattr(memories, "capabilities_of", lambda store: StoreCapabilities())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://loom.test") as http:
        page = await http.get("/console/memories")
        # the page has no form when there is nothing to delete: the token its forms would carry
        seed = http.cookies[auth.CSRF_COOKIE]
        token = auth.csrf_token(seed, None, auth.secret_of(app.state.loom))
        gone = await http.post(
            "/console/memories/delete", data={"ns": "a", "key": "k", "csrf_token": token}
        )
    assert page.status_code == 200
    assert 'id="no-items"' in page.text and "lacks the ItemStore capability" in page.text
    assert gone.status_code == 404
