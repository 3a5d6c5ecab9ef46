"""Loom: a runtime for LLM agents.

```python
from loom import Agent, tool

@tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b

agent = Agent(name="calc", instructions="You add numbers.", model="local", tools=[add])
print(agent.run_sync("what is 1 + 2?").output)
```

Public names are imported lazily so that ``import loom`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.content import Audio, File, Image, Reasoning
    from loom.engine.loop import AgentState
    from loom.engine.run_inputs import (
        Answer,
        AtEvent,
        AtTurn,
        CarryOn,
        Drivable,
        NewMessage,
        Regenerate,
        Resume,
        Rewind,
        RunInput,
        RunOptions,
    )
    from loom.engine.runtime import Runnable, Runtime
    from loom.errors import (
        ConfigurationError,
        InputError,
        LoomError,
        ModelError,
        ToolError,
    )
    from loom.events import AgentEvent, EventType
    from loom.hooks import Deny, HookContext, LoggingHook, MetricsHook, ReplaceArguments
    from loom.messages import Message, ModelResponse, RunResult, ToolCall, ToolResult, Usage
    from loom.models.base import Model, ModelSettings
    from loom.tools.base import RunContext, Tool, tool

_EXPORTS: dict[str, str] = {
    "Agent": "loom.agent",
    "AgentEvent": "loom.events",
    "AgentState": "loom.engine.loop",
    "Answer": "loom.engine.run_inputs",
    "AtEvent": "loom.engine.run_inputs",
    "AtTurn": "loom.engine.run_inputs",
    "Audio": "loom.content",
    "File": "loom.content",
    "Image": "loom.content",
    "Reasoning": "loom.content",
    "Regenerate": "loom.engine.run_inputs",
    "Rewind": "loom.engine.run_inputs",
    "CarryOn": "loom.engine.run_inputs",
    "ConfigurationError": "loom.errors",
    "Deny": "loom.hooks",
    "Drivable": "loom.engine.run_inputs",
    "EventType": "loom.events",
    "HookContext": "loom.hooks",
    "InputError": "loom.errors",
    "LoggingHook": "loom.hooks",
    "LoomError": "loom.errors",
    "Message": "loom.messages",
    "MetricsHook": "loom.hooks",
    "Model": "loom.models.base",
    "ModelError": "loom.errors",
    "ModelResponse": "loom.messages",
    "ModelSettings": "loom.models.base",
    "NewMessage": "loom.engine.run_inputs",
    "ReplaceArguments": "loom.hooks",
    "Resume": "loom.engine.run_inputs",
    "RunContext": "loom.tools.base",
    "RunInput": "loom.engine.run_inputs",
    "RunOptions": "loom.engine.run_inputs",
    "RunResult": "loom.messages",
    "Runnable": "loom.engine.runtime",
    "Runtime": "loom.engine.runtime",
    "Tool": "loom.tools.base",
    "ToolCall": "loom.messages",
    "ToolError": "loom.errors",
    "ToolResult": "loom.messages",
    "Usage": "loom.messages",
    "tool": "loom.tools.base",
}

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentState",
    "Answer",
    "AtEvent",
    "AtTurn",
    "Audio",
    "CarryOn",
    "ConfigurationError",
    "Deny",
    "Drivable",
    "EventType",
    "File",
    "HookContext",
    "Image",
    "InputError",
    "LoggingHook",
    "LoomError",
    "Message",
    "MetricsHook",
    "Model",
    "ModelError",
    "ModelResponse",
    "ModelSettings",
    "NewMessage",
    "Reasoning",
    "Regenerate",
    "ReplaceArguments",
    "Resume",
    "Rewind",
    "RunContext",
    "RunInput",
    "RunOptions",
    "RunResult",
    "Runnable",
    "Runtime",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "Usage",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'loom' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
