"""Agent definitions in files: ``AGENT.md`` (YAML front matter + instructions) or YAML.

```markdown
---
name: researcher
model: local
tools: [add, current_time]
max_iterations: 8
workspace: .                     # file tools work here (relative to this file)
permissions:                     # see loom.policy.permissions
  allow: [read_file, "bash(git status*)"]
  deny: ["bash(rm *)"]
mcp_servers:                     # MCP servers whose tools the agent gets (loom.tools.mcp)
  time:
    command: python
    args: [-m, mcp_server_time]
    prefix: time_
backends:                        # domain backends (loom.backends; docs/backends.md)
  - sql: sqlite:///data.db       # relative SQLite paths are resolved from this file's folder
    tables: [orders, customers]
model_settings:                  # per-call options (loom.models.ModelSettings)
  max_tokens: 400
  tool_choice: auto              # or required, none, or a tool's name (forced on the first call)
output_schema:                   # the answer's JSON schema (the agent's output_type)
  type: object
  properties: {summary: {type: string}, sources: {type: array, items: {type: string}}}
  required: [summary, sources]
---
You are a careful researcher. ...
```
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loom.errors import AgentDefinitionError, ConfigurationError
from loom.tools.base import Tool

if TYPE_CHECKING:
    from loom.spec import AgentSpec

Built = TypeVar("Built")

__all__ = [
    "AgentDefinition",
    "LoopDetectionConfig",
    "MCPServerConfig",
    "definition_of",
    "load_definition",
    "parse_definition",
    "revision_of",
]

# Each agent's revision (``revision_of``): its file's content hash when it came from one.
_REVISIONS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


class MCPServerConfig(BaseModel):
    """One entry of ``mcp_servers:``: a stdio ``command`` or a streamable-HTTP ``url``."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    prefix: str = ""
    tools: list[str] | None = None
    connect_timeout: float = Field(default=30.0, gt=0)
    call_timeout: float = Field(default=60.0, gt=0)


class ModelSettingsConfig(BaseModel):
    """``model_settings:`` in an agent file: the per-call options of ``ModelSettings``."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)
    timeout: float | None = Field(default=None, gt=0)
    tool_choice: str | None = None
    """``auto``, ``none``, ``required`` or a tool's name (forced on the turn's first call)."""
    reset_tool_choice: bool = True
    prompt_cache: bool = True
    """Let providers cache the context's stable prefix (docs/observability.md)."""
    cache_retention: Literal["in_memory", "24h"] | None = None
    """OpenAI's ``prompt_cache_retention``."""


class LoopDetectionConfig(BaseModel):
    """``loop_detection:`` in an agent file (``loom.loop_detection.LoopDetection``); a null
    ``max_repeats`` or ``same_answer`` turns that rule off, ``loop_detection: false`` both."""

    model_config = ConfigDict(extra="forbid")

    max_repeats: int | None = Field(default=6, ge=2)
    """Identical calls (tool + canonical arguments) among the last ``window`` that stop a run."""
    window: int = Field(default=20, ge=1)
    """How many of the exchange's latest tool calls ``max_repeats`` looks at."""
    same_answer: int | None = Field(default=6, ge=2)
    """Identical answers in a row (text + tool calls) that stop a run."""
    warn: bool = True
    """Warn the model once, one step before the stop."""


class AgentDefinition(BaseModel):
    """The fields an agent file may set; anything else is an error that names the field."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    instructions: str = ""
    model: str | None = None
    tools: list[str] = Field(default_factory=list)
    max_iterations: int = Field(default=10, gt=0)
    max_tool_calls: int = Field(default=50, gt=0)
    loop_detection: LoopDetectionConfig | bool | None = None
    """A run that repeats a call or an answer stops (``stop_reason="loop"``): ``false`` turns
    it off, a mapping changes its limits; absent (or ``true``) keeps the defaults."""
    timeout: float = Field(default=600.0, gt=0)
    tool_timeout: float = Field(default=30.0, gt=0)
    workspace: str | None = None
    sandbox: bool | dict[str, Any] | None = None
    """Where ``bash`` and ``python`` run: ``true`` (a sandbox with the default settings), a
    mapping of ``loom.sandbox.SandboxSettings`` fields, ``false`` (the host); absent:
    ``bash`` on the host, ``python`` sandboxed (docs/tools.md)."""
    python_unsandboxed: bool | None = None
    """With ``sandbox: false``, let the ``python`` tool run on the host."""
    permissions: dict[str, Any] | None = None
    mcp_servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    """The final answer's JSON schema: the agent's ``output_type`` (``loom.output``)."""
    output_retries: int = Field(default=2, ge=0)
    model_settings: ModelSettingsConfig | None = None
    """Per-call options (``loom.models.ModelSettings``): temperature, max_tokens, timeout,
    tool_choice (e.g. ``query`` to make the first call of each turn a ``query`` call)."""
    online: dict[str, Any] | None = None
    """Online evaluation of a sample of this agent's runs (``loom.evals.online``):
    ``{sample, evaluators: [...]}``, read by the scheduler's ``evaluate`` job."""
    backends: list[dict[str, Any] | str] = Field(default_factory=list)
    """Domain backends (``loom.backends.backend_from_config``): ``{sql: URL, tables: [...]}``,
    ``{openapi: FILE_OR_URL, base_url: ...}``, ``{documents: FOLDER}`` or a database URL."""

    def to_markdown(self) -> str:
        """The definition as an ``AGENT.md`` file (YAML front matter + instructions)."""
        data = self.model_dump(exclude={"instructions"}, exclude_defaults=True)
        data["name"] = self.name
        if "mcp_servers" in data:
            data["mcp_servers"] = {
                k: v.model_dump(exclude_defaults=True) for k, v in self.mcp_servers.items()
            }
        front = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        return f"---\n{front}---\n{self.instructions}\n"


def _split_front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    if not text.startswith("---"):
        raise AgentDefinitionError(
            "an AGENT.md file must start with a '---' line opening its YAML front matter "
            "(name, model, tools, limits), closed by another '---' line",
            path=str(path),
        )
    parts = text.split("\n---", 1)
    if len(parts) != 2:
        raise AgentDefinitionError(
            "the YAML front matter is not closed by a '---' line", path=str(path)
        )
    header = parts[0][3:]
    body = parts[1].split("\n", 1)[1] if "\n" in parts[1] else ""
    return _load_yaml(header, path), body.strip()


def _load_yaml(text: str, path: Path) -> dict[str, Any]:
    from loom.text import TOO_DEEP, nested_too_deep

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise AgentDefinitionError(f"invalid YAML: {exc}", path=str(path)) from None
    except RecursionError:  # the parser recurses once per level
        raise AgentDefinitionError(TOO_DEEP, path=str(path)) from None
    if nested_too_deep(data):  # what validates it recurses too
        raise AgentDefinitionError(TOO_DEEP, path=str(path))
    if not isinstance(data, dict):
        raise AgentDefinitionError("the YAML must be a mapping of field: value", path=str(path))
    return data


def parse_definition(path: Path) -> AgentDefinition:
    """Read and validate an agent file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AgentDefinitionError("file not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentDefinitionError(f"cannot read the file: {exc}", path=str(path)) from None
    if path.suffix.lower() in (".yaml", ".yml"):
        data = _load_yaml(text, path)
    else:
        data, body = _split_front_matter(text, path)
        if body:
            if data.get("instructions"):
                raise AgentDefinitionError(
                    "instructions are given both in the front matter and in the body; keep one",
                    path=str(path),
                    field="instructions",
                )
            data["instructions"] = body
    try:
        return AgentDefinition.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise AgentDefinitionError(f"{first['msg']}{more}", path=str(path), field=field) from None


def load_definition(
    make: Callable[..., Built], path: Path, tools: Sequence[Tool], overrides: dict[str, Any]
) -> Built:
    """``build_agent`` of the definition in the file at ``path``; the built object's revision
    (``revision_of``) is the file's content hash."""
    built = build_agent(make, parse_definition(path), path, tools, overrides)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # read a moment ago: gone now, so the definition's own hash stands
        return built
    with contextlib.suppress(TypeError):  # not weakly referenceable: no file revision kept
        _REVISIONS[built] = f"sha256:{digest}"
    return built


def revision_of(agent: AgentSpec) -> str:
    """The agent's revision: ``sha256:<hex>`` of the file it was loaded from (``Agent.from_file``,
    a served directory's AGENT.md / YAML files), else of its definition's stable fields
    (``definition_of``: name, instructions, model string, tool names, limits, permissions, ...;
    a model object counts by its class). The same definition gives the same revision in every
    process; a run records the revision it ran with (the server's run records)."""
    known = _REVISIONS.get(agent)
    if known is not None:
        return known
    try:
        text = definition_of(agent).model_dump_json(exclude_none=True)
    except (ValidationError, ValueError, TypeError):  # what no file can say (a value only
        # Python can give): the fields every agent has, so that a run never fails for it
        text = "\n".join(
            map(str, (agent.name, agent.description, agent.instructions, sorted(agent.tools)))
        )
    model = agent.model_spec
    if not isinstance(model, str) and model is not None:
        text += f"\nmodel:{type(model).__module__}.{type(model).__qualname__}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    with contextlib.suppress(TypeError):  # an agent is immutable: hash it once
        _REVISIONS[agent] = f"sha256:{digest}"
    return f"sha256:{digest}"


def _sandbox_config(value: object) -> bool | dict[str, Any] | None:
    """``Agent(sandbox=...)`` as a file writes it: a bool or mapping as given, a
    ``SandboxSettings`` as its fields (None when its backend is an object no file can name)."""
    if value is None or isinstance(value, bool | dict):
        return value
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        if not isinstance(getattr(value, "backend", "local"), str):
            return None
        fields = asdict(value)
        fields["env"] = dict(fields["env"])
        if isinstance(fields["network"], tuple):
            fields["network"] = list(fields["network"])
        return fields
    return dict(value) if isinstance(value, Mapping) else None


def _loop_config(agent: AgentSpec) -> LoopDetectionConfig | bool | None:
    """The agent's loop detection as a file writes it: None for the defaults (so that an agent
    that keeps them has the revision it had before the setting existed), ``False`` when off."""
    loops = agent.loop_detection
    if loops is None:
        return False
    settings = loops.to_dict()
    if settings == LoopDetectionConfig().model_dump():
        return None
    return LoopDetectionConfig(**settings)


def build_agent(
    make: Callable[..., Built],
    definition: AgentDefinition,
    path: Path,
    tools: Sequence[Tool] = (),
    overrides: dict[str, Any] | None = None,
) -> Built:
    """``make(**arguments)`` with the constructor arguments a parsed definition describes
    (``Agent.from_definition`` passes ``Agent``: this module knows definitions, not agents);
    ``path`` is the file it came from (relative paths in it, such as ``workspace`` and MCP
    servers' ``cwd``, are resolved from its folder)."""
    own = {t.name: t for t in tools}
    resolved: list[Tool | str] = [own.get(name, name) for name in definition.tools]
    kwargs: dict[str, Any] = definition.model_dump(
        exclude={
            "online",
            "tools",
            "workspace",
            "mcp_servers",
            "output_schema",
            "backends",
            "model_settings",
            "loop_detection",
        }
    )
    if definition.model_settings is not None:
        from loom.models.base import ModelSettings

        kwargs["model_settings"] = ModelSettings(
            **definition.model_settings.model_dump(exclude_defaults=True)
        )
    if definition.backends:
        from loom.backends.config import backend_from_config

        try:
            kwargs["backends"] = [
                backend_from_config(b, base=path.parent) for b in definition.backends
            ]
        except ConfigurationError as exc:
            raise AgentDefinitionError(str(exc), path=str(path), field="backends") from None
    loops = definition.loop_detection
    if loops is not None:  # absent: the agent's default
        kwargs["loop_detection"] = loops if isinstance(loops, bool) else loops.model_dump()
    if definition.output_schema is not None:
        kwargs["output_type"] = definition.output_schema
    if definition.workspace is not None:
        kwargs["workspace"] = (path.parent / definition.workspace).resolve()
    if kwargs.get("python_unsandboxed") is None:
        kwargs.pop("python_unsandboxed", None)
    kwargs["tools"] = resolved
    kwargs.update(overrides or {})
    if definition.mcp_servers:
        from loom.tools.mcp import mcp_server

        servers = []
        for name, cfg in definition.mcp_servers.items():
            options = cfg.model_dump()
            if cfg.cwd is not None:
                options["cwd"] = str((path.parent / cfg.cwd).resolve())
            try:
                servers.append(mcp_server(name, **options))
            except ConfigurationError as exc:
                raise AgentDefinitionError(str(exc), path=str(path), field="mcp_servers") from None
        kwargs["tools"] = [*kwargs["tools"], *servers]
    online = None
    if definition.online is not None:
        from loom.evals.online import OnlineSettings

        try:
            online = OnlineSettings.from_mapping(definition.online)
        except ConfigurationError as exc:
            raise AgentDefinitionError(str(exc), path=str(path), field="online") from None
    try:
        built = make(**kwargs)
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(str(exc), path=str(path)) from None
    except ConfigurationError as exc:  # e.g. a bad permission rule
        raise AgentDefinitionError(str(exc), path=str(path)) from None
    if online is not None:
        from loom.evals.online import set_online_settings

        set_online_settings(built, online)
    return built


def definition_of(agent: AgentSpec) -> AgentDefinition:
    """The ``AgentDefinition`` that rebuilds ``agent`` (its tools by name)."""
    given = agent.given
    servers: dict[str, MCPServerConfig] = {}
    for ts in agent.toolsets:
        if all(hasattr(ts, a) for a in ("command", "args", "url", "prefix")):
            servers[ts.name] = MCPServerConfig(
                command=ts.command,
                args=list(ts.args),
                env=dict(ts.env),
                cwd=ts.cwd,
                url=ts.url,
                headers=dict(ts.headers),
                prefix=ts.prefix,
                tools=sorted(ts.only) if ts.only is not None else None,
                connect_timeout=ts.connect_timeout,
                call_timeout=ts.call_timeout,
            )
    from loom.memory.item_tools import HISTORY_TOOL_NAMES, ITEM_TOOL_NAMES

    memory_tools = {"remember", "memory_write", *ITEM_TOOL_NAMES, *HISTORY_TOOL_NAMES}
    names = [n for n in agent.tools if not (agent.memory is not None and n in memory_tools)]
    permissions = given.get("permissions")
    spec = agent.output_spec  # a Python output type is written as its JSON schema
    ms = agent.model_settings
    settings = None
    if ms is not None:
        settings = ModelSettingsConfig(
            temperature=ms.temperature,
            max_tokens=ms.max_tokens,
            timeout=ms.timeout,
            tool_choice=ms.tool_choice,
            reset_tool_choice=ms.reset_tool_choice,
            prompt_cache=ms.prompt_cache,
            cache_retention=ms.cache_retention,
        )
    return AgentDefinition(
        model_settings=settings,
        output_schema=spec.schema if spec is not None else None,
        output_retries=agent.output_retries,
        name=agent.name,
        description=agent.description,
        instructions=agent.instructions,
        model=agent.model_spec if isinstance(agent.model_spec, str) else None,
        tools=names,
        max_iterations=agent.max_iterations,
        max_tool_calls=agent.max_tool_calls,
        loop_detection=_loop_config(agent),
        timeout=agent.timeout,
        tool_timeout=agent.tool_timeout,
        workspace=str(agent.workspace) if agent.workspace is not None else None,
        sandbox=_sandbox_config(given.get("sandbox")),
        python_unsandboxed=given.get("python_unsandboxed") or None,
        permissions=dict(permissions) if isinstance(permissions, dict) else None,
        mcp_servers=servers,
        backends=[
            dict(b.config) for b in agent.backends if isinstance(getattr(b, "config", None), dict)
        ],
    )
