"""A real crash of the extraction job: a process SIGKILLed after the model answered and the
items were written, before the turn's done marker. The rerun writes the same items as a clean
run (no duplicate) and calls the model again only for the turn that was not finished."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.memory.test_extraction import Rig, user_text

from loom.memory.extraction import DONE_NS, PENDING_NS, ExtractionSettings, extract_memories
from loom.store import SQLiteStore
from loom.testing import FunctionModel

SRC = Path(__file__).resolve().parents[2] / "src"

CHILD = textwrap.dedent(
    """
    import asyncio, json, re, sys
    from loom.memory.extraction import DONE_NS, ExtractionSettings, extract_memories
    from loom.store import SQLiteStore
    from loom.testing import FunctionModel

    class StallsBeforeTheThirdMarker(SQLiteStore):
        markers = 0

        async def put_value(self, namespace, key, value):
            if namespace == DONE_NS:
                self.markers += 1
                if self.markers == 3:  # the third turn's items are written; its marker is not
                    print("STALLED", key.split("\\x1f")[0], flush=True)
                    await asyncio.Event().wait()  # until the parent kills us
            await super().put_value(namespace, key, value)

    def answer(messages, tools):
        said = re.search(r"User:\\n(.*?)\\n\\nAssistant:", messages[-1].content, re.S).group(1)
        print("CALL", said, flush=True)
        return json.dumps({"memories": [{"text": "a: " + said}, {"text": "b: " + said}]})

    async def main():
        store = StallsBeforeTheThirdMarker(sys.argv[1])
        await extract_memories(store, ExtractionSettings(model=FunctionModel(answer)))

    asyncio.run(main())
    """
)


def two_per_turn(messages: list[Any], tools: Any) -> str:
    said = user_text(messages)
    return json.dumps({"memories": [{"text": "a: " + said}, {"text": "b: " + said}]})


async def items_of(path: Path) -> tuple[set[tuple[str, str]], int, int]:
    store = SQLiteStore(path)
    try:
        found = await store.search_items(("memories",), limit=1000)
        done = len(await store.list_keys(DONE_NS))
        pending = len(await store.list_keys(PENDING_NS))
        assert len(found) == len({i.key for i in found})
        return {(i.key, i.value["text"]) for i in found}, done, pending
    finally:
        await store.close()


async def test_sigkill_between_items_and_marker_then_rerun(tmp_path: Path) -> None:
    db, clean_db = tmp_path / "loom.db", tmp_path / "clean.db"
    store = SQLiteStore(db)
    rig = Rig(store)
    await rig.seed()
    await rig.runtime.aclose()
    await store.close()
    shutil.copy(db, clean_db)

    # a clean run, for comparison
    clean = SQLiteStore(clean_db)
    report = await extract_memories(clean, ExtractionSettings(model=FunctionModel(two_per_turn)))
    await clean.close()
    assert (report.turns, report.memories) == (3, 6)
    clean_items, _, _ = await items_of(clean_db)

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(db), stdout=asyncio.subprocess.PIPE, env=env
    )
    assert child.stdout is not None
    lines = []
    try:
        while not (line := (await child.stdout.readline()).decode()).startswith("STALLED"):
            assert line, f"the child ended early: {lines}"  # the handshake, not a sleep
            lines.append(line.strip())
        child.send_signal(signal.SIGKILL)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    assert [line.split(" ", 1)[1] for line in lines] == [
        "my dog is called Rex",
        "I live in Oslo",
        "I prefer green tea",
    ]
    crashed, done, pending = await items_of(db)
    assert (len(crashed), done, pending) == (6, 2, 1)  # items of turn 3 in, its marker not

    store = SQLiteStore(db)
    model = FunctionModel(two_per_turn)
    rerun = await extract_memories(store, ExtractionSettings(model=model))
    await store.close()
    assert [user_text(c.messages) for c in model.calls] == ["I prefer green tea"]
    assert (rerun.turns, rerun.memories) == (1, 2)
    after, done, pending = await items_of(db)
    assert after == clean_items  # same keys, same texts: nothing twice
    assert (done, pending) == (3, 0)
