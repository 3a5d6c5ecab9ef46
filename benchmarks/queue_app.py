"""The agent ``benchmarks/scale_queue.py`` runs in real ``loom worker`` processes
(``--app queue_app:agents``): a run is one model call asking for one tool call, the tool, and
the answer (no waiting anywhere: the figure is Loom's and the queue's cost). A message starting
with ``hold`` calls an at_most_once tool that writes its pid to ``$LOOM_BENCH_DIR/hold.pid`` and
waits a minute (the failover measurement kills that process)."""

from __future__ import annotations

import asyncio
import os

from loom import Agent, tool
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.testing import FunctionModel


@tool(effect="pure")
def lookup(n: int) -> str:
    """Look something up."""
    return f"value {n}"


@tool(effect="at_most_once")
async def hold() -> str:
    """Hold on (until this worker is killed)."""
    path = os.path.join(os.environ["LOOM_BENCH_DIR"], "hold.pid")
    with open(path, "w") as f:  # noqa: ASYNC230 - one tiny write
        f.write(str(os.getpid()))
    await asyncio.sleep(60)
    return "held"


def _script(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    last = messages[-1]
    if last.role != "user":
        return "done"
    name = "hold" if last.content.startswith("hold") else "lookup"
    return ModelResponse(
        text="", tool_calls=[ToolCall(name=name, arguments=({} if name == "hold" else {"n": 1}))]
    )


agents = [Agent(name="bench", model=FunctionModel(_script), tools=[lookup, hold])]
