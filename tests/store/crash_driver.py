"""A child process for the crash test: runs jobs on one session, and may SIGKILL itself.

    python crash_driver.py DB EFFECTS_DIR SESSION FIRST LAST [POINT:N]

Runs jobs FIRST..LAST ("job N" messages) in order with Agent + SQLiteStore and a deterministic
model: job N calls ``charge(N)`` (at_most_once, appends its idempotency key to charges.log) and
``square(N)`` (pure) concurrently, then ``mark(N)`` (idempotent, one file per key), then answers
``job N: <the three results>``. With POINT:N the process kills itself with SIGKILL at the Nth
time it reaches POINT: ``model`` (a model response was stored), ``tool_before`` / ``tool_after``
(inside charge, before / after its side effect), ``result`` (a tool result was stored).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from loom import Agent, RunContext, tool
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import SQLiteStore
from loom.testing import FunctionModel


class Killer:
    def __init__(self, spec: str | None) -> None:
        self.point, _, n = (spec or "none:0").partition(":")
        self.left = int(n)

    def reached(self, point: str) -> None:
        if point == self.point:
            self.left -= 1
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    async def after_llm_response(self, ctx: Any, response: Any) -> None:
        self.reached("model")

    async def after_tool_execution(self, ctx: Any, call: Any, result: Any) -> None:
        self.reached("result")


def model_fn(messages: list[Message], tools: object) -> ModelResponse | str:
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    job = int(messages[last_user].content.split()[1])
    after = messages[last_user + 1 :]
    assistants = sum(1 for m in after if m.role == "assistant")
    if assistants == 0:
        return ModelResponse(
            tool_calls=[
                ToolCall(name="charge", arguments={"job": job}),
                ToolCall(name="square", arguments={"x": job}),
            ]
        )
    if assistants == 1:
        return ModelResponse(tool_calls=[ToolCall(name="mark", arguments={"job": job})])
    # Sorted: concurrent calls finish (and are stored) in whichever order they finish.
    return f"job {job}: " + " | ".join(sorted(m.content for m in after if m.role == "tool"))


def build_agent(db: str, effects: Path, killer: Killer) -> Agent:
    @tool(effect="at_most_once")
    async def charge(ctx: RunContext, job: int) -> str:
        """Charge a card (must never happen twice)."""
        await asyncio.sleep(0.01)
        killer.reached("tool_before")
        with open(effects / "charges.log", "a") as f:  # noqa: ASYNC230 - the side effect
            f.write(ctx.idempotency_key + "\n")
        killer.reached("tool_after")
        await asyncio.sleep(0.01)
        return f"charged {job}"

    @tool(effect="pure")
    async def square(ctx: RunContext, x: int) -> int:
        """Square a number."""
        with open(effects / "pure.log", "a") as f:  # noqa: ASYNC230
            f.write(ctx.idempotency_key + "\n")
        await asyncio.sleep(0.015)
        return x * x

    @tool(effect="idempotent")
    async def mark(ctx: RunContext, job: int) -> str:
        """Mark a job done (keyed by the idempotency key, so repeating it is harmless)."""
        (effects / "marks").mkdir(exist_ok=True)
        (effects / "marks" / ctx.idempotency_key.replace(":", "_")).write_text(str(job))
        await asyncio.sleep(0.005)
        return f"marked {job}"

    return Agent(
        name="crash",
        model=FunctionModel(model_fn, record=False),
        tools=[charge, square, mark],
        store=SQLiteStore(db),
        hooks=[killer],
    )


async def main(argv: list[str]) -> None:
    db, effects, session, first, last = argv[:5]
    killer = Killer(argv[5] if len(argv) > 5 else None)
    agent = build_agent(db, Path(effects), killer)
    for job in range(int(first), int(last) + 1):
        r = await agent.run(f"job {job}", session_id=session)
        print(f"{job} {r.stop_reason} {r.output}", flush=True)
    await agent.store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
