"""The agent of the shared-budget test (``--app budget_app:agents``): one model call a run that
reports 100 + 100 tokens after a short wait, with ``max_tokens=200`` (so the worst case each
call reserves is its context estimate + 200 tokens, never below what it uses)."""

from __future__ import annotations

import asyncio
import random

from loom import Agent
from loom.messages import Message, ModelResponse, ToolSpec, Usage
from loom.models.base import ModelSettings
from loom.testing import FunctionModel


async def _answer(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
    await asyncio.sleep(random.uniform(0.02, 0.1))  # calls overlap across the fleet
    return ModelResponse(text="done", usage=Usage(input_tokens=100, output_tokens=100, requests=1))


agents = [
    Agent(
        name="spender",
        model=FunctionModel(_answer),
        model_settings=ModelSettings(max_tokens=200),
    )
]
