"""A queued run carries its media (issue 27): the server stores the bytes at enqueue
(``BlobStore.put_blobs``) and the job names them by reference; the worker's ``NewMessage``
has them, and its model request loads the bytes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.server.conftest import SRC, Server, start_server, stop_server
from tests.server.test_media_surfaces import MEDIA_AGENTS, PNG, PNG_B64, PNG_SHA

from loom import Agent
from loom.content import Image
from loom.server.content_blocks import keep_parts
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel
from loom.workers.tasks import new_message


async def test_the_queued_input_names_stored_bytes_and_the_worker_gets_them() -> None:
    """In one process: what ``_enqueue`` puts in the job (``keep_parts``) and what the worker
    starts the run with (``new_message``)."""
    store = MemoryStore()
    parts = await keep_parts(store, "s1", [Image.from_bytes(PNG, name="dot.png")])
    queued = json.dumps(parts)  # the job's arguments are JSON
    assert PNG_B64 not in queued and f"sha256:{PNG_SHA}" in queued
    assert await store.session_blobs("s1") == [(f"sha256:{PNG_SHA}", "image/png", len(PNG))]

    seen: list[str] = []

    def model(messages: list[Any], tools: Any) -> str:
        for p in messages[-1].parts:
            seen.append(hashlib.sha256(p.data).hexdigest())
        return "ok"

    agent = Agent(name="a", model=FunctionModel(model), store=store)
    result = await agent.run(new_message("look", json.loads(queued)), session_id="s1")
    assert result.text == "ok" and seen == [PNG_SHA]


@dataclass
class Queued:
    server: Server
    worker: subprocess.Popen[bytes]


def _postgres_keeps_media() -> bool:
    try:
        from loom.store.postgres import PostgresStore
    except ImportError:
        return False
    return hasattr(PostgresStore, "put_blobs")


@pytest.fixture(scope="module")
def queued(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queued]:
    if not _postgres_keeps_media():
        pytest.skip("PostgresStore does not keep media (BlobStore) on this branch yet")
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    import psycopg
    from tests.server.test_queue import pg_url

    schema = f"m_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = pg_url(f"{postgres_dsn} options='-c search_path={schema}'")
    root = tmp_path_factory.mktemp("media_queue")
    (root / "w").mkdir()
    (root / "w" / "media_agents.py").write_text(MEDIA_AGENTS)
    server = start_server(
        root, "--queue", app="media_agents:registry", source=MEDIA_AGENTS, store=url
    )
    log = (root / "w" / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "loom", "worker", "--store", url, "--app", "media_agents:registry"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(root / "w")])},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root / "w",
    )
    log.close()
    try:
        yield Queued(server, worker)
    finally:
        worker.terminate()
        worker.wait(15)
        stop_server(server)


async def test_a_queued_run_carries_its_image_to_the_worker(queued: Queued) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=queued.server.url)
    tid = (await client.threads.create())["thread_id"]
    content = [
        {"type": "text", "text": "look"},
        {"type": "image", "base64": base64.b64encode(PNG).decode(), "mime_type": "image/png"},
    ]
    run = await client.runs.create(
        tid, "looker", input={"messages": [{"role": "user", "content": content}]}
    )
    values = await client.runs.join(tid, run["run_id"])
    assert values["messages"][-1]["content"] == f"text='look' parts=image image/png {PNG_SHA}"
