"""The agent the worker tests run in real `loom worker` processes (``--app fleet_app:agents``).

Its scripted model answers a user message with one call of each effect class, then "done".
Every tool appends ``<effect> <begin|end> <idempotency key> <pid>`` to ``$LOOM_FLEET_DIR/
effects.log`` (O_APPEND, one write a line), so the tests count real side effects. Messages
starting with ``slow`` call a tool that waits 60 s (for aborts); ``hold`` an at_most_once tool
that waits 1 s (a worker is SIGSTOPped inside it), and ``hold, gate`` then calls ``gate``, which
waits for the test to create ``$LOOM_FLEET_DIR/gate``; ``crash`` calls an idempotent tool that
SIGKILLs its own worker (a crash loop: recovery re-runs it). ``LOOM_FLEET_FAST=1`` makes the
model and the tools answer without waiting (the soak and the queue benchmark). ``keeper`` saves
each message as a memory of the run's owner (``save_memory``).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

from loom import Agent, tool
from loom.memory import MemoryConfig
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.testing import FunctionModel
from loom.tools.base import RunContext


def _log(effect: str, phase: str, ctx: RunContext) -> None:
    path = os.path.join(os.environ["LOOM_FLEET_DIR"], "effects.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{effect} {phase} {ctx.idempotency_key} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


FAST = os.environ.get("LOOM_FLEET_FAST") == "1"


async def _work(effect: str, ctx: RunContext) -> str:
    _log(effect, "begin", ctx)
    await asyncio.sleep(random.uniform(0.0, 0.02) if FAST else random.uniform(0.05, 0.3))
    _log(effect, "end", ctx)
    return f"{effect} ok"


@tool(effect="pure")
async def lookup(ctx: RunContext, n: int) -> str:
    """Look something up."""
    return await _work("pure", ctx)


@tool(effect="idempotent")
async def upsert(ctx: RunContext, n: int) -> str:
    """Write something idempotently."""
    return await _work("idempotent", ctx)


@tool(effect="at_most_once")
async def send(ctx: RunContext, n: int) -> str:
    """Send something (must never happen twice)."""
    return await _work("at_most_once", ctx)


@tool(effect="at_most_once")
async def wait_long(ctx: RunContext) -> str:
    """Wait a minute."""
    _log("slow", "begin", ctx)
    await asyncio.sleep(60)
    _log("slow", "end", ctx)
    return "waited"


@tool(effect="at_most_once")
async def hold(ctx: RunContext) -> str:
    """Hold on a second."""
    _log("hold", "begin", ctx)
    await asyncio.sleep(1)
    _log("hold", "end", ctx)
    return "held"


@tool(effect="idempotent")
async def gate(ctx: RunContext) -> str:
    """Wait until the test opens the gate (creates ``$LOOM_FLEET_DIR/gate``)."""
    _log("gate", "begin", ctx)
    gate_file = os.path.join(os.environ["LOOM_FLEET_DIR"], "gate")
    # the gate is opened from another process: a file is the signal
    while not os.path.exists(gate_file):  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.05)
    _log("gate", "end", ctx)
    return "passed"


@tool(effect="idempotent")
def crash_worker(ctx: RunContext) -> str:
    """Kill this process."""
    _log("crash", "begin", ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


async def _script(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    await asyncio.sleep(random.uniform(0.0, 0.01) if FAST else random.uniform(0.02, 0.15))
    last = messages[-1]
    asked = next(m.content for m in reversed(messages) if m.role == "user")
    if (
        asked.startswith("hold, gate")
        and last.role == "tool"
        and "gate" not in {c.name for m in messages for c in m.tool_calls}
    ):
        return ModelResponse(text="", tool_calls=[ToolCall(name="gate", arguments={})])
    if last.role != "user":
        return "done"
    text = last.content
    if text.startswith("slow"):
        return ModelResponse(text="", tool_calls=[ToolCall(name="wait_long", arguments={})])
    if text.startswith("hold"):
        return ModelResponse(text="", tool_calls=[ToolCall(name="hold", arguments={})])
    if text.startswith("crash"):
        return ModelResponse(text="", tool_calls=[ToolCall(name="crash_worker", arguments={})])
    calls = [ToolCall(name=name, arguments={"n": 1}) for name in ("lookup", "upsert", "send")]
    return ModelResponse(text="", tool_calls=calls)


def _keep(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    """Saves the user's message as a memory (``save_memory``), then answers "kept"."""
    last = messages[-1]
    if last.role != "user":
        return "kept"
    call = ToolCall(name="save_memory", arguments={"text": last.content})
    return ModelResponse(text="", tool_calls=[call])


TOOLS = [lookup, upsert, send, wait_long, hold, gate, crash_worker]
agents = [
    Agent(name="fleet", model=FunctionModel(_script), tools=TOOLS),
    Agent(
        name="keeper",
        model=FunctionModel(_keep),
        memory=MemoryConfig(memory_file=None, store_tools=True),
    ),
]
