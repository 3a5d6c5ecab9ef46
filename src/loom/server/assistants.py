"""Assistants with versions (LangGraph's model): named configurations over a served agent.

Every agent (and crew) the server serves is an assistant of its own: ``assistant_id`` = its
name, read-only, one version. ``POST /assistants`` makes another: a ``graph_id`` (the name of a
served agent), a ``name``, ``metadata`` and settings in ``config.configurable`` and/or
``context`` (``context`` wins where both name a key). ``PATCH`` makes a new version (the latest
one with the given fields replaced, metadata merged) and points the assistant at it; ``POST
/assistants/{id}/latest`` points it at an older one (a rollback); ``DELETE`` removes it and its
versions. A run on an assistant runs its latest version at the run's start, or the version a
raw client names with ``assistant_version`` in the run body; the run's record keeps that
version and its agent's revision.

**The settings** an assistant may vary, and how each reaches the run: ``model`` (a model
string), ``max_iterations``, ``max_tool_calls``, ``timeout``, ``max_cost`` and ``tool_choice``
go to the run's ``RunOptions``; ``instructions`` and ``model_settings`` (``temperature``,
``max_tokens``, ``timeout``, ``tool_choice``, ``reasoning_effort``, ``thinking_budget``) are
the agent's own, so a version with them runs an ``Agent.replace`` of the served agent, built
once per (assistant, version) in a process and reused by every run, never per run. Any other
key is an ``InputError`` (422) naming the keys that are.

**Storage**: the store's key-value data (``KVStore``: SQLite and PostgreSQL), namespace
:data:`ASSISTANTS_NS` (key = the assistant id: its owner, latest and highest version, times)
and :data:`VERSIONS_NS` (key = ``<id>/<version, 8 digits>``: what that version says). A store
without key-value data (``MemoryStore``) keeps them in this process only. Writes are
serialized in a process; two servers updating one assistant at the same instant may give both
updates the same version number (the later write wins it).

**Ownership**: an assistant belongs to the API key that made it (``loom.server.ownership``):
another key gets the 404 of an assistant that does not exist, for reads, runs and writes alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException

from loom.agent import Agent
from loom.crew import Crew
from loom.errors import InputError
from loom.models.base import ModelSettings
from loom.server.ownership import check_client_id, owner_filter, owner_name, require, sees
from loom.server.registry import assistant_uuid
from loom.server.security import current_principal
from loom.server.state import ServerState
from loom.store.base import KVStore

__all__ = [
    "AGENT_SETTINGS",
    "ASSISTANTS_NS",
    "MODEL_SETTINGS",
    "RUN_SETTINGS",
    "VERSIONS_NS",
    "Chosen",
    "create",
    "delete",
    "get",
    "list_versions",
    "patch",
    "resolve",
    "search",
    "set_latest",
]

ASSISTANTS_NS = "loom.server.assistants"
VERSIONS_NS = "loom.server.assistant_versions"

RUN_SETTINGS: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "max_iterations": (int,),
    "max_tool_calls": (int,),
    "timeout": (int, float),
    "max_cost": (int, float),
    "tool_choice": (str,),
}
"""Settings that reach a run through its ``RunOptions`` (key: the types it takes)."""

AGENT_SETTINGS = ("instructions", "model_settings")
"""Settings that are the agent's own: a version with them runs a variant of the agent."""

MODEL_SETTINGS: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "max_tokens": (int,),
    "timeout": (int, float),
    "tool_choice": (str,),
    "reasoning_effort": (str,),
    "thinking_budget": (int,),
}
"""The ``model_settings`` keys an assistant may set (``loom.models.ModelSettings`` fields)."""

_VARIANTS_MAX = 256  # (assistant, version) variants of agents a process keeps built


@dataclass(frozen=True, slots=True)
class Chosen:
    """What a run on an assistant runs: the ``target`` (the served agent or crew, or a variant
    of the agent), the ``options`` its ``RunOptions`` get, the assistant's id (None: a served
    agent by its name) and version, and the agent's revision."""

    target: Agent | Crew
    options: dict[str, Any]
    assistant_id: str | None
    version: int | None
    revision: str | None


# -- storage ----------------------------------------------------------------------------------
class _Book:
    """The assistants' key-value rows: in the store, or (no ``KVStore``) in this process."""

    def __init__(self, state: ServerState) -> None:
        self.kv: KVStore | None = state.runtime.capabilities.kv
        self.local: dict[tuple[str, str], Any] = state.extra.setdefault("assistants_local", {})

    async def get(self, ns: str, key: str) -> Any | None:
        if self.kv is not None:
            return await self.kv.get_value(ns, key)
        return self.local.get((ns, key))

    async def put(self, ns: str, key: str, value: Any) -> None:
        if self.kv is not None:
            await self.kv.put_value(ns, key, value)
        else:
            self.local[(ns, key)] = value

    async def delete(self, ns: str, key: str) -> None:
        if self.kv is not None:
            await self.kv.delete_value(ns, key)
        else:
            self.local.pop((ns, key), None)

    async def keys(self, ns: str, prefix: str = "") -> list[str]:
        if self.kv is not None:
            return await self.kv.list_keys(ns, prefix)
        return sorted(k for n, k in self.local if n == ns and k.startswith(prefix))


def _lock(state: ServerState) -> asyncio.Lock:
    lock = state.extra.get("assistants_lock")
    if not isinstance(lock, asyncio.Lock):
        lock = state.extra["assistants_lock"] = asyncio.Lock()
    return lock


def _version_key(assistant_id: str, version: int) -> str:
    return f"{assistant_id}/{version:08d}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


# -- checking what a client sends -------------------------------------------------------------
def _settings(config: dict[str, Any] | None, context: dict[str, Any] | None) -> dict[str, Any]:
    """The settings of ``config.configurable`` and ``context`` (``context`` wins), checked."""
    if config is not None and not isinstance(config, dict):
        raise InputError(f"config is an object, got {type(config).__name__}")
    configurable = (config or {}).get("configurable") or {}
    if not isinstance(configurable, dict):
        raise InputError("config.configurable is an object of settings")
    if context is not None and not isinstance(context, dict):
        raise InputError(f"context is an object of settings, got {type(context).__name__}")
    merged = {**configurable, **(context or {})}
    known = [*RUN_SETTINGS, *AGENT_SETTINGS]
    for key, value in merged.items():
        where = f"context.{key}" if context and key in context else f"config.configurable.{key}"
        if key not in known:
            raise InputError(
                f"{where}: an assistant cannot set {key!r}; it may set {', '.join(known)}"
            )
        if key == "instructions":
            if not isinstance(value, str):
                raise InputError(f"{where} is text, got {type(value).__name__}")
        elif key == "model_settings":
            _check_model_settings(value, where)
        else:
            _check_value(value, RUN_SETTINGS[key], where)
    return merged


def _check_value(value: Any, types: tuple[type, ...], where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join("number" if t is float else t.__name__ for t in types)
        raise InputError(f"{where} is a {names}, got {value!r}")
    if isinstance(value, int | float) and value <= 0:
        raise InputError(f"{where} must be greater than 0, got {value!r}")
    if isinstance(value, str) and not value.strip():
        raise InputError(f"{where} cannot be empty")


def _check_model_settings(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise InputError(f"{where} is an object, got {type(value).__name__}")
    for key, given in value.items():
        if key not in MODEL_SETTINGS:
            raise InputError(
                f"{where}.{key}: unknown model setting; use {', '.join(MODEL_SETTINGS)}"
            )
        if key == "temperature":  # 0 is a temperature
            if isinstance(given, bool) or not isinstance(given, int | float) or given < 0:
                raise InputError(f"{where}.temperature is a number >= 0, got {given!r}")
            continue
        _check_value(given, MODEL_SETTINGS[key], f"{where}.{key}")


def _graph(state: ServerState, graph_id: Any) -> Agent:
    """The served agent ``graph_id`` names; ``InputError`` (422) for anything else."""
    if not isinstance(graph_id, str) or not graph_id:
        raise InputError("graph_id names the served agent the assistant configures")
    found = state.registry.served(graph_id)
    if isinstance(found, Crew):
        raise InputError(f"graph_id {graph_id!r} is a crew; an assistant configures an agent")
    if found is None:
        raise InputError(
            f"graph_id {graph_id!r} is not an agent this server serves; use one of "
            f"{', '.join(state.registry) or '(none)'}"
        )
    return found


def _served_view(state: ServerState, target: Agent | Crew) -> dict[str, Any]:
    """A served agent or crew as an assistant (read-only, version 1)."""
    created = state.registry.created_at(target.name).isoformat()
    meta: dict[str, Any] = {"loom_uuid": assistant_uuid(target.name)}
    if isinstance(target, Crew):  # a crew: its members where an agent lists its tools
        meta |= {"crew": True, "members": list(target.members)}
    else:
        meta["tools"] = list(target.tools)
    revision = state.registry.revision(target.name)
    if revision is not None:
        meta["revision"] = revision
    return {
        "assistant_id": target.name,
        "graph_id": target.name,
        "name": target.name,
        "description": getattr(target, "description", None) or None,
        "config": {},
        "context": {},
        "metadata": meta,
        "version": 1,
        "created_at": created,
        "updated_at": created,
    }


def _view(assistant_id: str, head: dict[str, Any], version: dict[str, Any]) -> dict[str, Any]:
    """A stored assistant as LangGraph's ``Assistant`` (its latest version's fields)."""
    return {
        **_version_view(assistant_id, version),
        "created_at": head["created_at"],
        "updated_at": head["updated_at"],
    }


def _version_view(assistant_id: str, version: dict[str, Any]) -> dict[str, Any]:
    return {
        "assistant_id": assistant_id,
        "graph_id": version["graph_id"],
        "name": version["name"],
        "description": version.get("description"),
        "config": version.get("config") or {},
        "context": version.get("context") or {},
        "metadata": version.get("metadata") or {},
        "version": version["version"],
        "created_at": version["created_at"],
    }


def _is_served(state: ServerState, assistant_id: str) -> Agent | Crew | None:
    return state.registry.find(assistant_id)


def _not_found(what: str) -> HTTPException:
    """A 404 that says what was not found (``loom.server.runs.not_found``'s answer)."""
    return HTTPException(404, what)


def _read_only(assistant_id: str) -> HTTPException:
    return HTTPException(
        409,
        f"assistant {assistant_id!r} is an agent this server serves: it is read-only; make a "
        f'configurable one with POST /assistants {{"graph_id": "{assistant_id}", ...}}',
    )


async def _head(state: ServerState, assistant_id: str) -> dict[str, Any]:
    """The stored assistant's row, checked against the request's key (404 for another key's,
    exactly like one that does not exist)."""
    head = await _Book(state).get(ASSISTANTS_NS, assistant_id)
    if not isinstance(head, dict):
        raise _not_found(f"no assistant {assistant_id!r} for this API key")
    require(current_principal.get(), "assistant", assistant_id, head.get("owner"))
    return head


async def _version(state: ServerState, assistant_id: str, version: int) -> dict[str, Any]:
    row = await _Book(state).get(VERSIONS_NS, _version_key(assistant_id, version))
    if not isinstance(row, dict):
        raise _not_found(f"assistant {assistant_id!r} has no version {version}")
    return row


# -- the operations ---------------------------------------------------------------------------
async def create(
    state: ServerState,
    *,
    graph_id: Any,
    config: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    assistant_id: str | None = None,
    if_exists: str = "raise",
    name: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """Make an assistant (version 1) over the served agent ``graph_id``."""
    _graph(state, graph_id)
    _settings(config, context)
    if metadata is not None and not isinstance(metadata, dict):
        raise InputError("metadata is an object")
    assistant_id = (
        str(uuid.uuid4()) if assistant_id is None else check_client_id(assistant_id, "assistant id")
    )
    if _is_served(state, assistant_id) is not None:
        raise HTTPException(409, f"assistant {assistant_id!r} is an agent this server serves")
    book = _Book(state)
    async with _lock(state):
        existing = await book.get(ASSISTANTS_NS, assistant_id)
        if isinstance(existing, dict):
            if if_exists == "do_nothing" and sees(current_principal.get(), existing.get("owner")):
                return await get(state, assistant_id)
            # another key's id is taken too (409 either way): that tells nothing of what it holds
            raise HTTPException(409, f"assistant {assistant_id!r} exists")
        now = _now()
        version = {
            "version": 1,
            "graph_id": graph_id,
            "name": name or "Untitled",
            "description": description,
            "config": config or {},
            "context": context or {},
            "metadata": metadata or {},
            "created_at": now,
        }
        head = {
            "owner": owner_name(current_principal.get()),
            "latest": 1,
            "highest": 1,
            "created_at": now,
            "updated_at": now,
        }
        await book.put(VERSIONS_NS, _version_key(assistant_id, 1), version)
        await book.put(ASSISTANTS_NS, assistant_id, head)
    return _view(assistant_id, head, version)


async def get(state: ServerState, assistant_id: str) -> dict[str, Any]:
    """An assistant: a served agent or crew, or a stored assistant's latest version."""
    target = _is_served(state, assistant_id)
    if target is not None:
        return _served_view(state, target)
    head = await _head(state, assistant_id)
    row = await _version(state, assistant_id, int(head["latest"]))
    if state.registry.served(row["graph_id"]) is None:  # its agent is not served (to this key)
        raise _not_found(f"no assistant {assistant_id!r} for this API key")
    return _view(assistant_id, head, row)


async def patch(
    state: ServerState,
    assistant_id: str,
    *,
    graph_id: Any = None,
    config: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    name: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """A new version: the latest one with the given fields replaced (``metadata`` merged),
    made the latest."""
    if _is_served(state, assistant_id) is not None:
        raise _read_only(assistant_id)
    if graph_id is not None:
        _graph(state, graph_id)
    if metadata is not None and not isinstance(metadata, dict):
        raise InputError("metadata is an object")
    book = _Book(state)
    async with _lock(state):
        head = await _head(state, assistant_id)
        latest = await _version(state, assistant_id, int(head["latest"]))
        new_config = latest.get("config") or {} if config is None else config
        new_context = latest.get("context") or {} if context is None else context
        _settings(new_config, new_context)
        number = int(head["highest"]) + 1
        now = _now()
        version = {
            "version": number,
            "graph_id": graph_id or latest["graph_id"],
            "name": name or latest["name"],
            "description": latest.get("description") if description is None else description,
            "config": new_config,
            "context": new_context,
            "metadata": {**(latest.get("metadata") or {}), **(metadata or {})},
            "created_at": now,
        }
        head = {**head, "latest": number, "highest": number, "updated_at": now}
        await book.put(VERSIONS_NS, _version_key(assistant_id, number), version)
        await book.put(ASSISTANTS_NS, assistant_id, head)
    return _view(assistant_id, head, version)


async def set_latest(state: ServerState, assistant_id: str, version: Any) -> dict[str, Any]:
    """Point the assistant at one of its versions (a rollback); runs from now on run it."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise InputError(f"version is an integer, got {version!r}")
    target = _is_served(state, assistant_id)
    if target is not None:
        if version != 1:
            raise _not_found(f"assistant {assistant_id!r} has one version, 1, not {version}")
        return _served_view(state, target)
    async with _lock(state):
        head = await _head(state, assistant_id)
        row = await _version(state, assistant_id, version)
        head = {**head, "latest": version, "updated_at": _now()}
        await _Book(state).put(ASSISTANTS_NS, assistant_id, head)
    return _view(assistant_id, head, row)


async def delete(state: ServerState, assistant_id: str) -> None:
    """Remove the assistant and every version of it (threads it ran on stay)."""
    if _is_served(state, assistant_id) is not None:
        raise _read_only(assistant_id)
    book = _Book(state)
    async with _lock(state):
        await _head(state, assistant_id)
        # the row first: a deletion cut short leaves versions nobody can name, never an
        # assistant whose versions are gone
        await book.delete(ASSISTANTS_NS, assistant_id)
        for key in await book.keys(VERSIONS_NS, f"{assistant_id}/"):
            await book.delete(VERSIONS_NS, key)


async def list_versions(
    state: ServerState,
    assistant_id: str,
    metadata: dict[str, Any] | None = None,
    limit: int = 10,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """The assistant's versions, newest first (``metadata``: only versions whose metadata has
    these values)."""
    target = _is_served(state, assistant_id)
    if target is not None:
        views = [_served_view(state, target)]
        for view in views:
            view.pop("updated_at")
    else:
        await _head(state, assistant_id)
        book = _Book(state)
        views = []
        for key in sorted(await book.keys(VERSIONS_NS, f"{assistant_id}/"), reverse=True):
            row = await book.get(VERSIONS_NS, key)
            if isinstance(row, dict):
                views.append(_version_view(assistant_id, row))
    if metadata:
        views = [v for v in views if all(v["metadata"].get(k) == x for k, x in metadata.items())]
    return views[offset : offset + limit]


async def search(
    state: ServerState, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The served agents and crews, then the request's key's stored assistants (oldest first),
    filtered like LangGraph's ``/assistants/search``."""
    targets: list[Agent | Crew] = [*state.registry.values(), *state.registry.crews.values()]
    found = [_served_view(state, a) for a in targets]
    book = _Book(state)
    only = owner_filter(current_principal.get())
    stored = []
    for assistant_id in await book.keys(ASSISTANTS_NS):
        head = await book.get(ASSISTANTS_NS, assistant_id)
        if not isinstance(head, dict) or (only is not None and head.get("owner") != only):
            continue
        row = await book.get(VERSIONS_NS, _version_key(assistant_id, int(head["latest"])))
        if isinstance(row, dict) and state.registry.served(row["graph_id"]) is not None:
            stored.append(_view(assistant_id, head, row))
    found += sorted(stored, key=lambda a: str(a["created_at"]))
    return [
        a
        for a in found
        if (graph_id is None or a["graph_id"] == graph_id)
        and (name is None or name.lower() in str(a["name"]).lower())
        and all(a["metadata"].get(k) == v for k, v in (metadata or {}).items())
    ]


# -- runs -------------------------------------------------------------------------------------
async def resolve(
    state: ServerState, assistant_id: str, version: Any = None, *, check_owner: bool = True
) -> Chosen:
    """What a run on ``assistant_id`` runs: a served agent or crew as it is, or a stored
    assistant's ``version`` (default its latest) over its agent. 404 for an assistant the
    request's key cannot see (``check_owner=False``: a start-up carrying a run on)."""
    target = _is_served(state, assistant_id)
    if target is not None:
        if version not in (None, 1):
            raise _not_found(f"assistant {assistant_id!r} has one version, 1, not {version}")
        return Chosen(target, {}, None, None, state.registry.revision(target.name))
    head = await _Book(state).get(ASSISTANTS_NS, assistant_id)
    if not isinstance(head, dict):
        raise _not_found(
            f"no assistant {assistant_id!r}; this server's agents: "
            f"{', '.join(state.registry.names())}, and the assistants made with POST /assistants"
        )
    if check_owner:
        require(current_principal.get(), "assistant", assistant_id, head.get("owner"))
    if version is None:
        version = int(head["latest"])
    elif isinstance(version, bool) or not isinstance(version, int):
        raise InputError(f"assistant_version is an integer, got {version!r}")
    row = await _version(state, assistant_id, version)
    agent = state.registry.get(row["graph_id"])
    if agent is None:  # its agent is no longer served (or not to this key)
        raise _not_found(
            f"assistant {assistant_id!r} runs agent {row['graph_id']!r}, which this server "
            "does not serve"
        )
    settings = {**((row.get("config") or {}).get("configurable") or {}), **row.get("context", {})}
    options = {k: v for k, v in settings.items() if k in RUN_SETTINGS}
    own = {k: v for k, v in settings.items() if k in AGENT_SETTINGS}
    if own:
        agent = _variant(state, assistant_id, version, agent, own)
    return Chosen(agent, options, assistant_id, version, state.registry.revision(row["graph_id"]))


def _variant(
    state: ServerState, assistant_id: str, version: int, agent: Agent, own: dict[str, Any]
) -> Agent:
    """The served agent with a version's own settings: built once per (assistant, version,
    agent object) in this process, then shared by every run of that version."""
    variants: dict[tuple[str, int, int], Agent] = state.extra.setdefault("assistant_agents", {})
    key = (assistant_id, version, id(agent))
    hit = variants.get(key)
    if hit is not None:
        return hit
    changes: dict[str, Any] = {}
    if "instructions" in own:
        changes["instructions"] = own["instructions"]
    if "model_settings" in own:
        base = agent.model_settings or ModelSettings()
        changes["model_settings"] = dataclasses.replace(base, **own["model_settings"])
    variant = agent.replace(**changes)
    if len(variants) >= _VARIANTS_MAX:
        variants.clear()
    variants[key] = variant
    return variant
