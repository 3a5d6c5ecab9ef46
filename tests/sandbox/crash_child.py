"""The process ``test_crash.py`` kills: an agent whose ``python`` calls write files in a
sandbox. ``crash`` mode says READY on stdout once the second call has written its files but
before its step is committed, then waits to be killed; ``resume`` mode runs the next turn on
the same store and sandbox directory (recovery re-runs the lost call).

Usage: crash_child.py MODE DB SANDBOX_DIR WORKSPACE BACKEND (double | local)
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from loom import Agent, ModelResponse, ToolCall
from loom.engine.runtime import Runtime
from loom.sandbox import SandboxSettings
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel

STEP1 = "open('step1.txt', 'w').write('1')"
STEP2 = (
    "import json, os\n"
    "json.dump(sorted(os.listdir('.')), open('seen.json', 'w'))\n"
    "open('step2.txt', 'w').write('2')"
)


REPO = str(Path(__file__).resolve().parents[2])


async def main() -> None:
    mode, db, boxes, ws, backend_name = sys.argv[1:6]
    backend: Any = backend_name
    if backend_name == "double":
        sys.path.insert(0, REPO)
        from tests.sandbox.conftest import UnsandboxedDirBackend

        backend = UnsandboxedDirBackend()

    async def model(messages: list[Any], tools: list[Any]) -> ModelResponse | str:
        last = messages[-1]
        if last.role == "user" and last.content == "go":
            call = ToolCall(id="c1", name="python", arguments={"code": STEP1})
            return ModelResponse(tool_calls=[call])
        if last.role == "tool" and last.tool_call_id == "c1":
            call = ToolCall(id="c2", name="python", arguments={"code": STEP2})
            return ModelResponse(tool_calls=[call])
        if last.role == "tool" and last.tool_call_id == "c2" and mode == "crash":
            print("READY", flush=True)  # step 2 ran; its result is not committed yet
            await asyncio.Event().wait()
        return "done"

    store = SQLiteStore(db)
    rt = Runtime(store, sandbox_dir=boxes)
    agent = Agent(
        tools=["python"],
        model=FunctionModel(model),
        workspace=ws,
        sandbox=SandboxSettings(backend=backend),
        permissions={"allow": ["python"]},
    )
    result = await rt.run(agent, "go" if mode == "crash" else "again", session_id="crashy")
    print(result.stop_reason, flush=True)
    await rt.aclose()
    await store.close()


asyncio.run(main())
