"""LangGraph's Store API on ``loom serve`` through ``langgraph-sdk``'s ``client.store``: items
written, read, searched, listed by namespace and deleted; two API keys never see each other's
items; an admin key writes shared items and sees all; bad input is a 422 in the error shape.
The server runs on its default durable store (SQLite: items with FTS5 keyword search)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402
from langgraph_sdk.errors import ConflictError, UnprocessableEntityError  # noqa: E402

ALICE, BOB, ROOT = "alice-key-0001", "bob-key-0002", "root-key-0004"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("store_api")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(tmp, "--keys", str(tmp / "keys.yaml"))
    yield srv
    stop_server(srv)


async def test_put_get_search_namespaces_delete(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    ns = ["memories", "alice", "prefs"]
    await alice.store.put_item(ns, "food", {"text": "likes spicy ramen"})
    await alice.store.put_item(ns, "drink", {"text": "green tea, no sugar", "kind": "drink"})
    await alice.store.put_item(["memories", "alice", "work"], "lang", {"text": "writes Rust"})

    item = await alice.store.get_item(ns, key="food")
    assert item is not None
    assert item["namespace"] == ns and item["key"] == "food"
    assert item["value"] == {"text": "likes spicy ramen"}
    assert item["created_at"] and item["updated_at"]
    async with httpx.AsyncClient(headers={"x-api-key": ALICE}) as http:  # the Agent Protocol's
        parts = await http.get(f"{keyed.url}/store/items", params={"namespace": ns, "key": "food"})
    assert parts.status_code == 200 and parts.json()["value"] == {"text": "likes spicy ramen"}

    found = await alice.store.search_items(["memories", "alice"], query="ramen")
    assert [i["key"] for i in found["items"]] == ["food"]
    assert found["items"][0]["score"] > 0
    filtered = await alice.store.search_items(["memories"], filter={"kind": "drink"})
    assert [i["key"] for i in filtered["items"]] == ["drink"]
    page = await alice.store.search_items(["memories"], limit=1, offset=1)
    assert len(page["items"]) == 1

    spaces = await alice.store.list_namespaces(prefix=["memories"])
    assert spaces["namespaces"] == [["memories", "alice", "prefs"], ["memories", "alice", "work"]]
    cut = await alice.store.list_namespaces(prefix=["memories"], max_depth=2)
    assert cut["namespaces"] == [["memories", "alice"]]

    await alice.store.delete_item(ns, key="food")
    assert await alice.store.get_item(ns, key="food") is None
    left = await alice.store.search_items(ns)
    assert [i["key"] for i in left["items"]] == ["drink"]


async def test_two_keys_never_see_each_others_items(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    bob = get_client(url=keyed.url, api_key=BOB)
    root = get_client(url=keyed.url, api_key=ROOT)
    ns = ["secrets"]
    await alice.store.put_item(ns, "alice-pin", {"text": "1234"})
    await bob.store.put_item(ns, "bob-pin", {"text": "9876"})

    assert await bob.store.get_item(ns, key="alice-pin") is None
    assert await alice.store.get_item(ns, key="bob-pin") is None
    bobs = await bob.store.search_items(ns)
    assert [i["key"] for i in bobs["items"]] == ["bob-pin"]
    assert (await bob.store.search_items([], query="1234"))["items"] == []

    with pytest.raises(ConflictError):  # alice's key: bob cannot overwrite it
        await bob.store.put_item(ns, "alice-pin", {"text": "0000"})
    await bob.store.delete_item(ns, key="alice-pin")  # invisible to bob: nothing happens
    still = await alice.store.get_item(ns, key="alice-pin")
    assert still is not None and still["value"] == {"text": "1234"}

    everyone = await root.store.search_items(ns)
    assert {i["key"] for i in everyone["items"]} == {"alice-pin", "bob-pin"}
    await root.store.put_item(["shared"], "motd", {"text": "hello all"})
    assert await alice.store.get_item(["shared"], key="motd") is None  # shared is admin's
    bob_spaces = await bob.store.list_namespaces()
    assert ["shared"] not in bob_spaces["namespaces"]
    assert ["secrets"] in bob_spaces["namespaces"]
    await root.store.delete_item(ns, key="bob-pin")  # an admin key deletes any item
    assert await bob.store.get_item(ns, key="bob-pin") is None


async def test_bad_input_is_a_422_in_the_error_shape(keyed: Server) -> None:
    alice = get_client(url=keyed.url, api_key=ALICE)
    await alice.store.put_item(["notes"], "k", {"text": "mine"}, ttl=60)
    with pytest.raises(UnprocessableEntityError):
        await alice.store.search_items(["notes"], limit=10_000_000)
    url = f"{keyed.url}/store/items"
    async with httpx.AsyncClient(headers={"x-api-key": ALICE}) as http:
        bad = await http.put(url, json={"namespace": ["notes"], "key": "k", "value": "text"})
        assert bad.status_code == 422
        assert bad.json()["error"]["type"] == "InputError"
        assert "JSON object" in bad.json()["error"]["message"]
        empty = await http.put(url, json={"namespace": [], "key": "k", "value": {}})
        assert empty.status_code == 422 and empty.json()["error"]["type"] == "InputError"
        forever = await http.put(
            url, json={"namespace": ["notes"], "key": "k", "value": {}, "ttl": 1e300}
        )
        assert forever.status_code == 422 and "ttl" in forever.json()["error"]["message"]
        no_key = await http.get(url, params={"namespace": "notes", "key": ""})
        assert no_key.status_code == 422
        owned = await http.put(
            url,
            json={"namespace": ["notes"], "key": "k", "value": {"text": "bob's"}},
            headers={"x-api-key": BOB},
        )
        assert owned.status_code == 409 and owned.json()["error"]["type"] == "ItemOwned"


# -- with an embedder: hybrid search and ``index`` -----------------------------------------------
@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose store embeds items (``LOOM_EMBEDDER=hash:64``: the test embedder, words
    hashed into buckets; it knows no synonyms, so it cannot find a meaning keywords miss)."""
    srv = start_server(tmp_path_factory.mktemp("store_api_vec"), env={"LOOM_EMBEDDER": "hash:64"})
    yield srv
    stop_server(srv)


async def test_search_is_hybrid_and_index_is_honoured_with_an_embedder(embedded: Server) -> None:
    client = get_client(url=embedded.url)
    ns = ["mem", "u"]
    await client.store.put_item(ns, "both", {"text": "green tea, green tea"})
    await client.store.put_item(ns, "some", {"text": "the tea was cold and the day long"})
    await client.store.put_item(ns, "quiet", {"text": "green tea"}, index=False)
    await client.store.put_item(
        ns, "title", {"title": "coffee", "body": "green tea"}, index=["title"]
    )

    found = (await client.store.search_items(["mem"], query="green tea"))["items"]
    keys = [i["key"] for i in found]
    # Fused ranks: first in both lists scores 2/(60+1); the others follow by their fused rank.
    assert keys[0] == "both" and found[0]["score"] == pytest.approx(2 / 61)
    assert set(keys) == {"both", "some", "quiet", "title"}  # "quiet" by its words alone
    assert [i["score"] for i in found] == sorted((i["score"] for i in found), reverse=True)
    quiet = next(i for i in found if i["key"] == "quiet")
    assert quiet["score"] < 2 / 61 - 1e-9  # one ranking (keywords) only: it has no vector

    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"{embedded.url}/store/items/search",
            json={"namespace_prefix": ["mem"], "query": "green tea", "mode": "semantic"},
        )
    assert answer.status_code == 200, answer.text
    semantic = answer.json()["items"]
    assert [i["key"] for i in semantic][:1] == ["both"]
    assert "quiet" not in {i["key"] for i in semantic}  # index=False: no vector
    title = next(i for i in semantic if i["key"] == "title")
    assert title["score"] == pytest.approx(0.0)  # only "coffee" was embedded

    with pytest.raises(UnprocessableEntityError):
        await client.store.put_item(ns, "bad", {"text": "x"}, index="text")  # type: ignore[arg-type]
