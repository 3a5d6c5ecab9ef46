"""A2A tasks kept in the Loom store's key-value space, each visible only to the key that made it.

The SDK's request handler reads and writes tasks through this :class:`TaskStore`. A task is
stored as its protobuf JSON under ``loom.a2a.tasks`` / ``<agent>:<task id>`` with the name of
the API key that created it: another key (or another agent's endpoint) gets ``None``, which the
SDK answers with its ``TaskNotFoundError`` (-32001). Stores without a key-value space keep tasks
in memory for the life of the process (the Loom runs themselves are in the journal either way).
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks.task_store import TaskStore
from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict, ParseDict

from loom.server.ownership import sees
from loom.store.base import KVStore
from loom.text import whole_number

__all__ = ["NAMESPACE", "LoomTaskStore", "owner_of"]

NAMESPACE = "loom.a2a.tasks"
_DEFAULT_PAGE = 50
_MAX_PAGE = 100


def owner_of(context: ServerCallContext | None) -> tuple[str | None, bool]:
    """The API key name behind a call (None without keys) and whether it is an admin key."""
    if context is None:
        return None, True
    principal = context.state.get("loom.principal")
    if principal is None:
        return None, True
    return str(principal.name), bool(principal.admin)


class LoomTaskStore(TaskStore):
    """The tasks of one agent's A2A endpoint, scoped by API key."""

    def __init__(self, kv: KVStore | None, agent: str) -> None:
        self.kv, self.agent = kv, agent
        self._memory: dict[str, dict[str, Any]] = {}

    def _key(self, task_id: str) -> str:
        return f"{self.agent}:{task_id}"

    async def _read(self, task_id: str) -> dict[str, Any] | None:
        if self.kv is None:
            return self._memory.get(self._key(task_id))
        value = await self.kv.get_value(NAMESPACE, self._key(task_id))
        return value if isinstance(value, dict) else None

    @staticmethod
    def _visible(record: dict[str, Any], context: ServerCallContext | None) -> bool:
        principal = None if context is None else context.state.get("loom.principal")
        return sees(principal, record.get("owner"))  # the one ownership rule

    async def save(self, task: Task, context: ServerCallContext) -> None:
        """Save ``task``; its owner is the key that first saved it."""
        known = await self._read(task.id)
        if known is not None and not self._visible(known, context):
            # the handler only saves tasks it read through this key; refuse rather than steal
            raise PermissionError(f"task {task.id!r} belongs to another API key")
        owner = known.get("owner") if known is not None else owner_of(context)[0]
        record = {"owner": owner, "task": MessageToDict(task)}
        if self.kv is None:
            self._memory[self._key(task.id)] = record
        else:
            await self.kv.put_value(NAMESPACE, self._key(task.id), record)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        """The task, or None when it does not exist for this key."""
        record = await self._read(task_id)
        if record is None or not self._visible(record, context):
            return None
        task: Task = ParseDict(record["task"], Task(), ignore_unknown_fields=True)
        return task

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """This key's tasks, newest status first, filtered by context and state."""
        if self.kv is None:
            records = [r for k, r in self._memory.items() if k.startswith(f"{self.agent}:")]
        else:
            keys = await self.kv.list_keys(NAMESPACE, prefix=f"{self.agent}:")
            records = [
                r for k in keys if isinstance(r := await self.kv.get_value(NAMESPACE, k), dict)
            ]
        tasks = [
            ParseDict(r["task"], Task(), ignore_unknown_fields=True)
            for r in records
            if self._visible(r, context)
        ]
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            tasks = [t for t in tasks if t.status.state == params.status]
        tasks.sort(key=lambda t: (t.status.timestamp.ToNanoseconds(), t.id), reverse=True)
        size = min(params.page_size or _DEFAULT_PAGE, _MAX_PAGE)
        start = whole_number(params.page_token) or 0
        page = tasks[start : start + size]
        more = start + size < len(tasks)
        return ListTasksResponse(
            tasks=page,
            next_page_token=str(start + size) if more else "",
            page_size=size,
            total_size=len(tasks),
        )

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        """Forget a task (its Loom session and runs stay in the journal)."""
        record = await self._read(task_id)
        if record is None or not self._visible(record, context):
            return
        if self.kv is None:
            self._memory.pop(self._key(task_id), None)
        else:
            await self.kv.delete_value(NAMESPACE, self._key(task_id))
