"""SharedState: a versioned key-value scope per crew run, with compare-and-set (seed 002), and
references to large results (seed 000).

Members never share Python objects: what they share goes through this scope. Every write names
the version it read (``expected_version``; 0 for "must not exist yet"); a write whose version
is stale is refused with the current version, so two parallel members cannot overwrite each
other's work without seeing it. Values live on the store's key-value half when it has one
(``KVStore``: they outlive the process and a resumed crew sees them), else in memory. The
compare-and-set is atomic within one process (an asyncio lock; every member of a crew runs in
the crew's process); the KV protocol has no cross-process compare-and-set.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from loom.crew.tools import CrewTool
from loom.store.base import KVStore
from loom.tools.base import RunContext

__all__ = ["SharedState", "state_tools"]


class SharedState:
    """A versioned key-value scope (``namespace``) on ``kv`` or in memory."""

    def __init__(self, namespace: str, kv: KVStore | None = None) -> None:
        self.namespace = namespace
        self.kv = kv
        self._memory: dict[str, dict[str, Any]] = {}
        self._lock = asyncio.Lock()

    async def _read(self, key: str) -> dict[str, Any] | None:
        if self.kv is None:
            return self._memory.get(key)
        got = await self.kv.get_value(self.namespace, key)
        return got if isinstance(got, dict) else None

    async def _write(self, key: str, entry: dict[str, Any]) -> None:
        if self.kv is None:
            self._memory[key] = entry
        else:
            await self.kv.put_value(self.namespace, key, entry)

    async def get(self, key: str) -> tuple[Any, int]:
        """``(value, version)``; ``(None, 0)`` when the key was never written."""
        entry = await self._read(key)
        return (None, 0) if entry is None else (entry["value"], int(entry["version"]))

    async def compare_and_set(
        self, key: str, value: Any, expected_version: int
    ) -> tuple[bool, int]:
        """Write ``value`` if the key is still at ``expected_version``; ``(done, version now)``."""
        async with self._lock:
            entry = await self._read(key)
            current = 0 if entry is None else int(entry["version"])
            if current != expected_version:
                return False, current
            await self._write(key, {"value": value, "version": current + 1})
            return True, current + 1

    async def keys(self) -> list[str]:
        if self.kv is None:
            return sorted(self._memory)
        return sorted(await self.kv.list_keys(self.namespace))

    async def put_ref(self, ref: str, text: str) -> str:
        """Store a large result under ``ref`` (written once) and return the reference text."""
        await self.compare_and_set(ref, text, 0)
        return ref


def state_tools(state: SharedState) -> list[CrewTool]:
    """``state_get``, ``state_set`` (compare-and-set) and ``state_keys`` for one member run."""

    async def get(ctx: RunContext, args: dict[str, Any]) -> str:
        value, version = await state.get(args["key"])
        return json.dumps({"key": args["key"], "value": value, "version": version})

    async def put(ctx: RunContext, args: dict[str, Any]) -> str:
        done, version = await state.compare_and_set(
            args["key"], args["value"], args["expected_version"]
        )
        if done:
            return json.dumps({"ok": True, "version": version})
        return json.dumps(
            {
                "ok": False,
                "conflict": True,
                "current_version": version,
                "hint": "someone wrote it since you read it: state_get it again, "
                "merge, and retry with the current version",
            }
        )

    async def keys(ctx: RunContext, args: dict[str, Any]) -> str:
        return json.dumps(await state.keys())

    s = {"type": "string"}
    return [
        CrewTool(
            "state_get",
            "Read a shared value and its version (version 0: not set).",
            {"key": s},
            get,
            effect="pure",
        ),
        CrewTool(
            "state_set",
            "Write a shared value if it is still at expected_version (0 for "
            "a new key); on a conflict read it again and retry.",
            {"key": s, "value": s, "expected_version": {"type": "integer"}},
            put,
        ),
        CrewTool(
            "state_keys",
            "List the shared keys (large results are stored as ref:...).",
            {},
            keys,
            effect="pure",
        ),
    ]
