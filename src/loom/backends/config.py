"""Backends from configuration: an ``AGENT.md`` ``backends:`` entry or a CLI ``--backend``.

```yaml
backends:
  - sql: sqlite:///data.db          # any SQLAlchemy URL; SQLite paths relative to the file
    tables: [orders, customers]     # + schema, read_only, allow_execute, max_rows, timeout
  - openapi: api.json               # file or URL (fetched once)
    base_url: http://127.0.0.1:8000 # + operations, tags, paths, methods, auth_env, timeout
  - documents: docs/                # + patterns, chunk_chars
```

A plain string is a database URL (``sqlite:///data.db``), an ``openapi:`` document or a
``docs:`` folder. Secrets never appear here: an API's token is read from the environment
variable that ``auth_env`` names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loom.errors import BackendConfigError

__all__ = ["backend_from_config"]

_KINDS = ("sql", "openapi", "documents")


def _sqlite_relative(url: str, base: Path) -> str:
    """``sqlite:///data.db`` (three slashes: a relative path) resolved from ``base``."""
    prefix, sep, rest = url.partition(":///")
    if sep and prefix.startswith("sqlite") and rest and not rest.startswith("/"):
        return f"{prefix}:///{(base / rest).resolve().as_posix()}"
    return url


def backend_from_config(entry: dict[str, Any] | str, *, base: Path | None = None) -> Any:
    """The backend an entry describes; relative paths resolve from ``base`` (the agent file's
    folder, else the working directory). Raises ``BackendConfigError`` naming the problem."""
    base = base or Path.cwd()
    if isinstance(entry, str):
        if entry.startswith("openapi:"):
            entry = {"openapi": entry.removeprefix("openapi:")}
        elif entry.startswith(("docs:", "documents:")):
            entry = {"documents": entry.partition(":")[2]}
        else:
            entry = {"sql": entry}
    if not isinstance(entry, dict):
        raise BackendConfigError(f"a backend entry must be a mapping or a string, got {entry!r}")
    kinds = [k for k in _KINDS if k in entry]
    if len(kinds) != 1:
        raise BackendConfigError(
            f"a backend entry needs exactly one of {', '.join(_KINDS)} (got keys "
            f"{sorted(entry)}); e.g. {{sql: 'sqlite:///data.db', tables: [orders]}}"
        )
    kind = kinds[0]
    options = {k: v for k, v in entry.items() if k != kind}
    try:
        if kind == "sql":
            from loom.backends.sql import SQLBackend

            made: Any = SQLBackend(_sqlite_relative(str(entry[kind]), base), **options)
        elif kind == "openapi":
            from loom.backends.openapi import OpenAPIBackend

            source = str(entry[kind])
            if "://" not in source:
                source = str((base / source).resolve())
            made = OpenAPIBackend(source, **options)
        else:
            from loom.backends.documents import DocumentBackend

            made = DocumentBackend((base / str(entry[kind])).resolve(), **options)
    except TypeError as exc:  # an option the backend does not take
        raise BackendConfigError(f"{kind} backend: {exc}") from None
    made.config = dict(entry)  # written back by agent.to_definition()
    return made
