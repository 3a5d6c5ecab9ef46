"""Memory and context: token budgets, segmented memory, priority assembly, compression.

```python
from loom import Agent
from loom.memory import MemoryConfig

agent = Agent("helper", "You help.", model="openai:gpt-4o-mini", context_window=8000,
              reserved_output_tokens=1000, memory=MemoryConfig(tools=True), workspace=".")
```
Every agent uses ``SegmentedContextBuilder`` unless given another ``context_builder``: ROM
(instructions, matched patterns, tool schemas), MEMORY.md, Kernel (``remember``), L2 (summaries)
and L1 (recent turns) are assembled by priority inside ``context_window -
reserved_output_tokens``; at 92 % the oldest span is summarised. ``describe_session`` reports
the tiers of a stored session. Names are imported lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.memory.builder import SegmentedContextBuilder
    from loom.memory.config import Budgets, MemoryConfig, Priority, RecallConfig
    from loom.memory.describe import MemoryReport, describe_session
    from loom.memory.tokens import (
        EstimateCounter,
        MessageCounter,
        ModelTokenCounter,
        TiktokenCounter,
        TokenCounter,
        counter_for_model,
    )
    from loom.memory.tools import memory_write, remember, set_kernel

_EXPORTS = {
    "Budgets": "loom.memory.config",
    "EstimateCounter": "loom.memory.tokens",
    "MemoryConfig": "loom.memory.config",
    "MemoryReport": "loom.memory.describe",
    "MessageCounter": "loom.memory.tokens",
    "ModelTokenCounter": "loom.memory.tokens",
    "Priority": "loom.memory.config",
    "RecallConfig": "loom.memory.config",
    "SegmentedContextBuilder": "loom.memory.builder",
    "TiktokenCounter": "loom.memory.tokens",
    "TokenCounter": "loom.memory.tokens",
    "counter_for_model": "loom.memory.tokens",
    "describe_session": "loom.memory.describe",
    "memory_write": "loom.memory.tools",
    "remember": "loom.memory.tools",
    "set_kernel": "loom.memory.tools",
}

__all__ = [
    "Budgets",
    "EstimateCounter",
    "MemoryConfig",
    "MemoryReport",
    "MessageCounter",
    "ModelTokenCounter",
    "Priority",
    "RecallConfig",
    "SegmentedContextBuilder",
    "TiktokenCounter",
    "TokenCounter",
    "counter_for_model",
    "describe_session",
    "memory_write",
    "remember",
    "set_kernel",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'loom.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
