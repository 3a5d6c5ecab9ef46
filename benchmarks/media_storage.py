"""Media stored once (issue #27): database bytes of a 50-turn conversation whose first turn
sends a 5 MB image that the model sees on every turn, against the same conversation without it.

    PYTHONPATH=src python benchmarks/media_storage.py [--postgres] [--turns N]

The image is a real PNG of random pixels made with Pillow (the ``media`` extra; without it,
random bytes behind a PNG signature), about 5 MB. A ``FunctionModel`` checks on every call
that the image's bytes are in its request. Figures are bytes, which the machine's load cannot
move:

- SQLite: the database file after a WAL checkpoint (page count x page size);
- PostgreSQL (``--postgres``, on a private cluster: ``benchmarks/scale.py``'s ``cluster``):
  ``pg_total_relation_size`` of every table of the schema Loom wrote to (a fresh schema per
  conversation), the bytes' TOAST table included; without ``--postgres`` the PostgreSQL
  figures of an earlier run are kept in the results file, marked ``from_an_earlier_run``.

``added_bytes`` is what the image costs the database (with minus without); the target is about
the image's own size (+5 MB), not one copy per turn (+250 MB). ``blob_reads`` counts the
store reads of media bytes over the conversation (none: the process that took the image in
keeps it in its transcript); ``after_restart`` is one more turn in a new store and agent (a
new process): the model sees the image again, read from the store once. Writes
benchmarks/results/media_storage.json; prints it too.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from loom import Agent
from loom.content import Image
from loom.messages import Message
from loom.store import SQLiteStore
from loom.store.base import Store
from loom.testing import FunctionModel

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "media_storage.json"
POSTGRES = "--postgres" in sys.argv
TURNS = int(sys.argv[sys.argv.index("--turns") + 1]) if "--turns" in sys.argv else 50
IMAGE_BYTES = 5 * 1024 * 1024
IMAGE: list[bytes] = []  # the image of this run, once made


def make_png() -> tuple[bytes, str]:
    """About 5 MB of PNG: random pixels (which PNG cannot compress), or random bytes behind a
    PNG signature when Pillow is not installed."""
    try:
        from PIL import Image as PILImage
    except ImportError:
        return b"\x89PNG\r\n\x1a\n" + os.urandom(IMAGE_BYTES - 8), "random bytes, PNG signature"
    side = int((IMAGE_BYTES / 3) ** 0.5)
    img = PILImage.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    out = io.BytesIO()
    img.save(out, format="PNG", compress_level=1)
    return out.getvalue(), f"a {side}x{side} PNG of random pixels (Pillow)"


async def converse(store: Store, png: bytes | None, turns: int = TURNS) -> dict[str, int]:
    """``turns`` turns on one session; the first sends ``png`` when given (``turns=1`` and no
    ``png``: one more turn of a stored session). Returns how many model calls saw the image's
    bytes and how many store reads of media there were."""
    saw = {"calls": 0, "saw_image": 0, "blob_reads": 0}

    def model(messages: list[Message], tools: Any) -> str:
        saw["calls"] += 1
        if any(isinstance(p, Image) and p.data == IMAGE[0] for m in messages for p in m.parts):
            saw["saw_image"] += 1
        return f"answer {saw['calls']}: the picture shows noise, as before"

    load = getattr(store, "load_blobs", None)
    if load is not None:

        async def counted(refs: Any) -> dict[str, bytes]:
            saw["blob_reads"] += 1
            out: dict[str, bytes] = await load(refs)
            return out

        store.load_blobs = counted  # type: ignore[attr-defined]
    agent = Agent(model=FunctionModel(model), store=store)
    first: Any = "what is in this picture?" if turns > 1 else "after a restart: and now?"
    if png is not None:
        first = [first, Image.from_bytes(png, name="noise.png")]
    await agent.run(first, session_id="media")
    for turn in range(1, turns):
        await agent.run(
            f"turn {turn}: look at the picture again, what do you see?", session_id="media"
        )
    return saw


def sqlite_bytes(path: Path) -> int:
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


async def on_sqlite(png: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for label, image in (("without_image", None), ("with_image", png)):
            path = Path(d) / f"{label}.db"
            store = SQLiteStore(path)
            seen = await converse(store, image)
            await store.close()
            out[label] = {"db_bytes": sqlite_bytes(path), **seen}
            if image is not None:  # a new process: one more turn reads the bytes once
                store = SQLiteStore(path)
                out["after_restart"] = await converse(store, None, turns=1)
                await store.close()
            with sqlite3.connect(path) as c:
                out[label]["blob_rows"] = c.execute("SELECT count(*) FROM blobs").fetchone()[0]
    out["added_bytes"] = out["with_image"]["db_bytes"] - out["without_image"]["db_bytes"]
    return out


async def on_postgres(png: bytes) -> dict[str, Any]:
    import psycopg

    sys.path.insert(0, str(HERE))
    from scale import cluster

    from loom.store.postgres import PostgresStore

    out: dict[str, Any] = {}
    with cluster() as dsn:
        for label, image in (("without_image", None), ("with_image", png)):
            schema = f"media_{label}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            store = PostgresStore(f"{dsn} options='-c search_path={schema}'")
            seen = await converse(store, image)
            await store.close()
            if image is not None:  # a new process: one more turn reads the bytes once
                store = PostgresStore(f"{dsn} options='-c search_path={schema}'")
                out["after_restart"] = await converse(store, None, turns=1)
                await store.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
                row = conn.execute(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relkind = 'r'",
                    (schema,),
                ).fetchone()
                blobs = conn.execute(f"SELECT count(*) FROM {schema}.blobs").fetchone()
            assert row is not None and blobs is not None
            out[label] = {"db_bytes": int(row[0]), "blob_rows": int(blobs[0]), **seen}
    out["added_bytes"] = out["with_image"]["db_bytes"] - out["without_image"]["db_bytes"]
    return out


async def main() -> None:
    png, made = make_png()
    IMAGE.append(png)
    result: dict[str, Any] = {
        "command": "PYTHONPATH=src python benchmarks/media_storage.py"
        + (" --postgres" if POSTGRES else ""),
        "turns": TURNS,
        "image": {"bytes": len(png), "made": made},
        "one_copy_per_turn_bytes": len(png) * TURNS,  # what storing it with every turn costs
        "sqlite": await on_sqlite(png),
    }
    earlier: dict[str, Any] = {}
    if RESULTS.exists():
        earlier = json.loads(RESULTS.read_text())
    if POSTGRES:
        result["postgres"] = await on_postgres(png)
    elif "postgres" in earlier:
        result["postgres"] = {**earlier["postgres"], "from_an_earlier_run": True}
    for where in ("sqlite", "postgres"):
        if where in result:
            r = result[where]
            r["added_per_image_byte"] = round(r["added_bytes"] / len(png), 3)
            assert r["with_image"]["saw_image"] == TURNS, r  # the model saw it every turn
            assert r["after_restart"]["saw_image"] == 1, r
    RESULTS.parent.mkdir(exist_ok=True)
    text = json.dumps(result, indent=2)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
