"""A small inventory API (FastAPI) for the OpenAPI backend example and tests.

``serve_in_thread()`` runs it with uvicorn on a free loopback port and returns its base URL;
the API's own document is at ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Header
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

app = FastAPI(title="Inventory", version="1.0")


class Item(BaseModel):
    id: int
    name: str
    quantity: int


ITEMS = {1: Item(id=1, name="widget", quantity=12), 2: Item(id=2, name="gadget", quantity=0)}


@app.get("/items", operation_id="list_items", tags=["items"], summary="List the items")
def list_items(in_stock: bool = False, limit: int = 10) -> list[Item]:
    items = [i for i in ITEMS.values() if i.quantity > 0 or not in_stock]
    return items[:limit]


@app.get("/items/{item_id}", operation_id="get_item", tags=["items"], summary="One item")
def get_item(item_id: int) -> Item:
    return ITEMS[item_id]


@app.post("/items", operation_id="create_item", tags=["items"], summary="Add an item")
def create_item(item: Item) -> Item:
    ITEMS[item.id] = item
    return item


@app.get("/files/{name}", operation_id="get_file", tags=["files"], summary="Echo a file name")
def get_file(name: str) -> dict[str, str]:
    return {"name": name}


@app.get("/whoami", operation_id="whoami", tags=["meta"], summary="Who the API thinks you are")
def whoami(authorization: str | None = Header(default=None)) -> dict[str, str | None]:
    return {"authorization": authorization}


@app.get("/hang", operation_id="hang", tags=["meta"], summary="Never answers")
async def hang() -> dict[str, str]:
    await asyncio.Event().wait()  # until the client goes away
    return {}


@app.get("/huge", operation_id="huge", tags=["meta"], summary="About 100 MB of text")
def huge() -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        chunk = b"x" * 65536
        for _ in range(1600):
            yield chunk

    return StreamingResponse(body(), media_type="text/plain")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_in_thread() -> Iterator[str]:
    """Run the app on loopback in a thread; yields its base URL, stops it on exit."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()

    def wait() -> None:  # uvicorn sets server.started once it listens
        while not server.started and thread.is_alive():
            started.wait(0.01)

    wait()
    if not server.started:
        raise RuntimeError("the inventory API did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
