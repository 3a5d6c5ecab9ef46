"""Helpers for driving the ``loom`` command: in a subprocess, or in a real pseudo-terminal."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom

# Agents for `--agent agents.py:NAME`, built on loom.testing models so no LLM is needed.
AGENTS = '''
"""Test agents for the loom CLI."""

import asyncio

from loom import Agent, ModelResponse, ToolCall, tool
from loom.models.base import TextDelta
from loom.testing import FunctionModel


@tool
def deploy(target: str) -> str:
    """Deploy to a target."""
    return f"deployed {target}"


def answer(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    if last.content.startswith("deploy "):
        call = ToolCall(name="deploy", arguments={"target": last.content.split()[1]})
        return ModelResponse(tool_calls=[call])
    return f"echo: {last.content}"


def deployer(**settings):
    """A factory: the CLI passes store, workspace, approval_handler (and model/tools if given)."""
    return Agent(name="deployer", model=FunctionModel(answer), tools=[deploy],
                 permissions={"ask": ["deploy"]}, **settings)


class Hanging:
    """Streams part of an answer to "hang", then never finishes it (a model mid-answer).

    FunctionModel yields only once its function returns, so it cannot stop half-way.
    """

    name = "hanging"

    async def stream(self, messages, tools, settings=None):
        text = messages[-1].content
        if text == "hang":
            yield TextDelta("partial answer ")
            await asyncio.Event().wait()
        yield TextDelta("echo: " + text)
        yield ModelResponse(text="echo: " + text)


def chatty(**settings):
    return Agent(name="chatty", model=Hanging(), **settings)


# an Agent already built (not a factory): the CLI must not try to change it
built = Agent(name="built", model=FunctionModel(answer), tools=[deploy],
              permissions={"ask": ["deploy"]})
'''


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    """``agents.py`` in the test's directory (also its working directory for `loom`)."""
    path = tmp_path / "agents.py"
    path.write_text(AGENTS)
    return path


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Any]]:
    """``terminal(*args, cwd=...)``: ``python -m loom ARGS`` in a real pseudo-terminal."""
    pexpect = pytest.importorskip("pexpect")
    children: list[Any] = []

    def spawn(*args: str, cwd: Path, timeout: float = 60, term: str = "dumb") -> Any:
        # TERM=dumb: Rich prints plain text, no colour codes between the words tests look for
        # (and no animated spinner: pass term="xterm" to see one).
        child = pexpect.spawn(
            sys.executable,
            ["-m", "loom", *args],
            cwd=str(cwd),
            env=dict(os.environ, PYTHONPATH=SRC, TERM=term),
            encoding="utf-8",
            timeout=timeout,
            dimensions=(24, 200),
            # A terminal's program starts with Ctrl-C's default action, whatever this process
            # inherited: a suite started as a background job of a non-interactive shell runs
            # with SIGINT ignored, and a child would inherit that and never see Ctrl-C.
            preexec_fn=_default_sigint,
        )
        children.append(child)
        return child

    yield spawn
    for child in children:
        child.close(force=True)
