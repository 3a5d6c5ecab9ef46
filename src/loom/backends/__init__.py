"""Domain backends (seed 000's ``ExecutionBackend``): a database, an HTTP API or a document
collection offered to an agent as tools, with its schema in the ROM, safely.

```python
from loom import Agent
from loom.backends import SQLBackend

agent = Agent("analyst", backends=[SQLBackend("sqlite:///shop.db", tables=["orders"])])
```

``SQLBackend`` (SQLAlchemy 2 + sqlglot), ``OpenAPIBackend`` (httpx), ``DocumentBackend``
(SQLite FTS5, pypdf, watchfiles); ``backend_from_config`` builds one from an AGENT.md entry.
Heavy libraries load when a backend is made, not on ``import loom.backends``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loom.backends.base import Backend

if TYPE_CHECKING:
    from loom.backends.config import backend_from_config
    from loom.backends.documents import DocumentBackend
    from loom.backends.openapi import OpenAPIBackend
    from loom.backends.sql import SQLBackend

__all__ = ["Backend", "DocumentBackend", "OpenAPIBackend", "SQLBackend", "backend_from_config"]

_LAZY = {
    "SQLBackend": "loom.backends.sql",
    "OpenAPIBackend": "loom.backends.openapi",
    "DocumentBackend": "loom.backends.documents",
    "backend_from_config": "loom.backends.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loom.backends' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
