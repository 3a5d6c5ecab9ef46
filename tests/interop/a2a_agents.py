"""Agents served over A2A in tests/interop (scripted models: no LLM needed).

``calc`` adds two numbers with a tool, ``ops`` deploys after a human approves, ``waiter``
waits for a file the test creates (so a test holds a task in ``working`` as long as it likes),
and ``boss`` (on a second server) asks a remote agent through ``a2a_agent``.
"""

import asyncio
import os
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


@tool
async def wait_for(name: str) -> str:
    """Wait until the file NAME exists in the server's directory; return its text."""
    path = Path(name)
    # the test (another process) creates the file when it wants the call to end
    while not path.exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.02)
    return path.read_text()  # noqa: ASYNC240


def calc(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"The sum is {last.content}."
    numbers = [int(w) for w in last.content.split() if w.lstrip("-").isdigit()]
    if len(numbers) >= 2:
        return ModelResponse(
            tool_calls=[ToolCall(name="add", arguments={"a": numbers[0], "b": numbers[1]})]
        )
    return f"echo: {last.content}"


def ops(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


def waiter(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"released: {last.content}"
    return ModelResponse(
        tool_calls=[ToolCall(name="wait_for", arguments={"name": last.content.split()[-1]})]
    )


CALC = Agent(name="calc", instructions="You add numbers.", model=FunctionModel(calc), tools=[add])
OPS = Agent(
    name="ops",
    instructions="You deploy.",
    model=FunctionModel(ops),
    tools=[deploy],
    permissions={"ask": ["deploy"]},
)
WAITER = Agent(
    name="waiter", instructions="You wait for files.", model=FunctionModel(waiter), tools=[wait_for]
)
registry = AgentRegistry([CALC, OPS, WAITER])


def boss_registry():
    """The second server: ``boss`` forwards the user's words to a remote agent and reports."""
    from loom.tools import a2a_agent

    headers = {"Authorization": f"Bearer {os.environ['REMOTE_KEY']}"}
    calc_remote = a2a_agent(os.environ["REMOTE_CALC"], headers=headers)
    waiter_remote = a2a_agent(os.environ["REMOTE_WAITER"], headers=headers, timeout=1.5)

    def boss(messages, tools):
        last = messages[-1]
        if last.role == "tool":
            return f"remote says: {last.content}"
        target = "waiter" if last.content.startswith("wait") else "calc"
        return ModelResponse(
            tool_calls=[ToolCall(name=target, arguments={"message": last.content})]
        )

    return AgentRegistry(
        [
            Agent(
                name="boss",
                instructions="You delegate.",
                model=FunctionModel(boss),
                tools=[calc_remote, waiter_remote],
            )
        ]
    )
