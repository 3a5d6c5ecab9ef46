"""The agent the scheduled-fleet test runs in real `loom worker` processes
(``--app sched_app:agents``): ``stamp`` calls one tool that appends ``<run id> <session> <pid>``
to ``$LOOM_FLEET_DIR/stamps.log`` (O_APPEND, one write a line), then answers "done"."""

from __future__ import annotations

import os

from loom import Agent, tool
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.testing import FunctionModel
from loom.tools.base import RunContext


@tool(effect="at_most_once")
def stamp(ctx: RunContext) -> str:
    """Record which process ran this run."""
    fd = os.open(
        os.path.join(os.environ["LOOM_FLEET_DIR"], "stamps.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, f"{ctx.run_id} {ctx.session_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return "stamped"


def _script(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    if messages[-1].role == "user":
        return ModelResponse(text="", tool_calls=[ToolCall(name="stamp", arguments={})])
    return "done"


agents = [Agent(name="stamp", model=FunctionModel(_script), tools=[stamp])]
