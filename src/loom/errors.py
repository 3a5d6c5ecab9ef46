"""Every exception Loom raises, under one root.

Errors the *model* can fix (bad tool arguments, a failing tool, a timeout) never raise:
they go back to the model as tool results. What raises is what the *programmer* must fix,
and each message says what to do.

```
LoomError
├── ConfigurationError            bad agent definition, bad option, unknown provider
│   ├── AgentDefinitionError      an AGENT.md / YAML file that does not validate
│   ├── ToolDefinitionError       a function @tool cannot turn into a tool
│   ├── HookDefinitionError       a hook method's name is not a hook point (names the closest)
│   ├── PermissionsFileError      a permission rules file cannot be read (path, fix)
│   ├── MissingDependencyError    an optional extra is not installed
│   ├── RedactionPatternError     a redaction pattern does not compile (has .name)
│   ├── BackendConfigError        a domain backend (SQL, OpenAPI, documents) cannot be set up
│   ├── CrewDefinitionError       a crew (code or YAML) that does not validate (names the field)
│   │   └── CrewCycleError        a crew's dependency graph has a cycle (names it)
│   └── PatternError              a pattern library cannot be used as asked
│       ├── PatternFileError      one pattern file does not parse or validate (path, field)
│       ├── DuplicatePatternName  two pattern files use the same name
│       └── EmptyPatternLibrary   a directory holds no valid pattern
├── InputError                    a message or argument the caller passed is unusable
│   ├── BranchError               a session point does not exist or lies inside a step
│   │   └── BranchRefused         the agent's branch_effects="refuse" and the branch drops effects
│   ├── ContentError              an image, file, audio or reasoning part is unusable (has .part)
│   │   ├── MediaTooLarge         a part's bytes are over the size limit (has .size, .limit)
│   │   ├── MediaTypeMismatch     the bytes are not the media type they claim to be
│   │   └── UnsupportedContent    the model (or surface) cannot take this kind of part
│   └── ScheduleError             a schedule or monitor field is invalid (has .field)
│       ├── ScheduleNotFound      no schedule has that id
│       ├── MonitorNotFound       no cron monitor has that id
│       └── UnknownTarget         a schedule names an agent this process does not have
├── ModelError                    the model provider failed
│   ├── ModelAuthError            missing or rejected credentials
│   ├── ModelRateLimited          429 after all retries
│   ├── ModelUnavailable          server down, 5xx, timeouts, open circuit
│   ├── ContextTooLong            the request does not fit the model's window
│   ├── ModelRequestError         the provider rejected the request (unknown model, bad option)
│   ├── ModelResponseError        the model answered something unusable
│   └── EmbeddingError            an embedder failed (loom.embedding; defined there)
│       ├── EmbedderUnavailable   it cannot be reached: items are kept, embedded later
│       ├── EmbedderAuthError     it refused the API key (also a ModelAuthError)
│       └── EmbeddingDimensionMismatch  it answered vectors of another length
├── ToolError                     raised *by tools* to send a coded error to the model
│   ├── ScopeViolation            a file tool was asked for a path outside its workspace
│   ├── ToolArgumentsError        a call's arguments do not match the tool's schema
│   ├── BackendRefused            a backend's safety rules refused a statement or call (reason)
│   └── MCPServerError            an MCP server cannot be reached or answered unusably
├── SessionError                  session bookkeeping
│   ├── SessionNotFound
│   ├── SessionBusy               on_busy="drop" and the session is running
│   └── QueueFull / QueueTimeout  on_busy="queue" limits
├── StoreError                    persistence failed
│   ├── StoreCorrupt              the database is damaged or not a Loom database
│   ├── SchemaTooNew              the database was written by a newer Loom
│   ├── ErrorNotFound             no stored error has that id
│   ├── BlobNotFound              a media reference names bytes the store does not hold
│   ├── LeaseLost                 another holder took the session's lease over (fencing)
│   ├── SerializationError        a value cannot be stored as JSON (names the field)
│   └── TranscriptError           a JSONL transcript line is malformed (has .line)
├── HookError                     a fatal hook raised
│   └── ApprovalHandlerError      an approval handler raised (the call did not run)
├── JudgeError                    a judge failed; the panel scores it as configured, runs go on
│   ├── JudgeOutputError          a judge model's answer was not {"score": 0..1, "reason": ...}
│   └── JudgeTimeout              a judge took longer than its timeout
├── JobFailed                     a background job failed (has .retryable)
├── SandboxError                  a sandbox cannot start or be used (loom.sandbox; defined there)
│   └── SandboxUnavailable        its backend cannot run here (also a ConfigurationError)
├── ValueNotRepresentable         a value cannot become JSON (contains itself, too deep/large)
├── BudgetExceeded                a crew's tree-wide budget refused a model call or a spawn
├── RemoteMemberError             a crew's remote (A2A) member is unreachable or has a bad card
└── RunCancelled                  the caller cancelled a run
```

A permission rule that denies a tool call does not raise: the model gets a ``denied`` result.
"""

from __future__ import annotations

__all__ = [
    "AgentDefinitionError",
    "ApprovalHandlerError",
    "BackendConfigError",
    "BackendRefused",
    "BlobNotFound",
    "BranchError",
    "BranchRefused",
    "BudgetExceeded",
    "ConfigurationError",
    "ContentError",
    "ContextTooLong",
    "CrewCycleError",
    "CrewDefinitionError",
    "DuplicatePatternName",
    "EmptyPatternLibrary",
    "ErrorNotFound",
    "HookDefinitionError",
    "HookError",
    "InputError",
    "JobFailed",
    "JudgeError",
    "JudgeOutputError",
    "JudgeTimeout",
    "LeaseLost",
    "LoomError",
    "MCPServerError",
    "MediaTooLarge",
    "MediaTypeMismatch",
    "MissingDependencyError",
    "ModelAuthError",
    "ModelError",
    "ModelRateLimited",
    "ModelRequestError",
    "ModelResponseError",
    "ModelUnavailable",
    "MonitorNotFound",
    "PatternError",
    "PatternFileError",
    "PermissionsFileError",
    "QueueFull",
    "QueueTimeout",
    "RedactionPatternError",
    "RemoteMemberError",
    "RunCancelled",
    "ScheduleError",
    "ScheduleNotFound",
    "SchemaTooNew",
    "ScopeViolation",
    "SerializationError",
    "SessionBusy",
    "SessionError",
    "SessionNotFound",
    "StoreCorrupt",
    "StoreError",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolError",
    "TranscriptError",
    "UnknownTarget",
    "UnsupportedContent",
    "ValueNotRepresentable",
]


class LoomError(Exception):
    """Root of every exception Loom raises."""


class ConfigurationError(LoomError):
    """The agent, a tool or an option is configured wrongly; fix the code or the file."""


class AgentDefinitionError(ConfigurationError):
    """An agent definition (AGENT.md, YAML or keyword arguments) does not validate."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None):
        self.path = path
        self.field = field
        where = f"{path}: " if path else ""
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}{what}{message}")


class BackendConfigError(ConfigurationError):
    """A domain backend (``loom.backends``) cannot be set up: a bad URL, an OpenAPI document
    that does not parse, an allow-list naming a table that does not exist; the message says
    which and how to fix it."""


class CrewDefinitionError(ConfigurationError):
    """A crew (built in code or read from a YAML file) does not validate; ``field`` names the
    offending entry (``plan.sequential[1].member``); ``detail`` is the message without them."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None):
        self.path = path
        self.field = field
        self.detail = message
        where = f"{path}: " if path else ""
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}{what}{message}")


class CrewCycleError(CrewDefinitionError):
    """A crew's dependency graph has a cycle, so no task could ever start."""


class ToolDefinitionError(ConfigurationError):
    """A function cannot be turned into a tool (unsupported signature, bad name, ...)."""


class HookDefinitionError(ConfigurationError):
    """A hook object has a public method that looks like a hook point but is not one.

    Such a method would never be called; the message names the closest hook point. Helper
    methods whose names start with ``_`` are not checked.
    """


class PermissionsFileError(ConfigurationError):
    """A permission rules file (``.loom/permissions.yaml``) cannot be read; ``path`` names it."""

    def __init__(self, message: str, *, path: str):
        self.path = path
        super().__init__(f"{path}: {message}")


class MissingDependencyError(ConfigurationError):
    """An optional dependency is missing; the message names the install command."""

    def __init__(self, package: str, extra: str, purpose: str):
        self.package = package
        self.extra = extra
        super().__init__(
            f"{purpose} needs the {package!r} package, which is not installed. "
            f"Install it with: pip install 'loom-agents[{extra}]'"
        )


class RedactionPatternError(ConfigurationError):
    """A redaction pattern (``loom.guardrails.Redactor``) is unusable; ``.name`` names it."""

    def __init__(self, message: str, *, name: str):
        self.name = name
        super().__init__(message)


class PatternError(ConfigurationError):
    """A pattern library cannot be loaded or used as asked (missing directory, strict mode)."""


class PatternFileError(PatternError):
    """A pattern file does not parse or validate; ``path`` and ``field`` say where."""

    def __init__(self, message: str, *, path: str, field: str | None = None):
        self.path = path
        self.field = field
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{path}: {what}{message}")


class DuplicatePatternName(PatternError):
    """Two pattern files use the same ``name``; the first file (in path order) wins."""

    def __init__(self, name: str, *, path: str, first_path: str):
        self.name = name
        self.path = path
        self.first_path = first_path
        super().__init__(
            f"{path}: pattern name {name!r} is already used by {first_path}; rename one of them "
            "(names must be unique in a library)"
        )


class EmptyPatternLibrary(PatternError):
    """A pattern directory holds no valid pattern (no YAML files, or every file is invalid)."""


class InputError(LoomError, ValueError):
    """An argument passed to a public entry point is unusable."""


class BranchError(InputError):
    """A rewind, regenerate, edit or fork cannot be done as asked: the point does not exist,
    lies inside a step (between a tool call and its result), or the message to edit is not a
    user's. Nothing was changed."""


class BranchRefused(BranchError):
    """The branch would drop turns whose tool calls had effects in the world, and the agent's
    ``branch_effects`` is ``"refuse"``; ``calls`` names them (tool, arguments). Nothing was
    changed."""

    def __init__(self, message: str, *, calls: list[dict[str, object]]):
        self.calls = calls
        super().__init__(message)


class ContentError(InputError):
    """An image, file, audio or reasoning part cannot be used; ``part`` names it (its name,
    media type or index), and the message says what to do. Raised before the model is
    called: nothing already committed is lost."""

    def __init__(self, message: str, *, part: str | None = None):
        self.part = part
        super().__init__(message)


class MediaTooLarge(ContentError):
    """A part's bytes are over the size limit (``size`` and ``limit`` in bytes)."""

    def __init__(self, message: str, *, size: int, limit: int, part: str | None = None):
        self.size, self.limit = size, limit
        super().__init__(message, part=part)


class MediaTypeMismatch(ContentError):
    """A part's bytes are not the media type it claims (a text file sent as ``image/png``)."""


class UnsupportedContent(ContentError):
    """The model or surface asked cannot take this kind of part (an image sent to a
    text-only model, a media type no provider reads, a reasoning block of another
    provider); the message names one that can."""


class ScheduleError(InputError):
    """A schedule, cron monitor or check-in is invalid; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class ScheduleNotFound(ScheduleError):
    """No schedule has that id (``loom schedule list`` shows them)."""


class MonitorNotFound(ScheduleError):
    """No cron monitor has that id (``loom monitors list`` shows them)."""


class UnknownTarget(ScheduleError):
    """A schedule names an agent or crew the process firing it does not have (the scheduler
    pauses such a schedule instead of failing every tick)."""


class JobFailed(LoomError):
    """Raised by a background job: ``retryable=True`` asks for another attempt (with backoff),
    ``False`` gives up at once (a fatal error: retrying cannot help)."""

    def __init__(self, message: str, *, retryable: bool = True):
        self.retryable = retryable
        super().__init__(message)


class ModelError(LoomError):
    """The model provider failed."""


class ModelAuthError(ModelError):
    """Credentials are missing or were rejected."""


class ModelRateLimited(ModelError):
    """The provider kept answering 429 after every retry."""


class ModelUnavailable(ModelError):
    """The provider cannot be reached, timed out, answered 5xx, or its circuit is open."""


class ContextTooLong(ModelError):
    """The request does not fit in the model's context window."""


class ModelRequestError(ModelError):
    """The provider refused the request as sent (a 4xx that retrying cannot fix)."""


class ModelResponseError(ModelError):
    """The model's answer could not be used (empty, cut off, malformed)."""


class ToolError(LoomError):
    """Raise inside a tool to send a coded error back to the model.

    The loop catches it like any other exception, but keeps ``code`` so the model (and the
    error channel) see ``Code X: message`` instead of a Python exception name.
    """

    def __init__(self, message: str, *, code: str = "tool_error"):
        self.code = code
        super().__init__(message)


class ScopeViolation(ToolError):
    """A path leaves the workspace, goes through a link that does, or targets a read-only area.

    Codes: ``scope_violation`` (outside the workspace), ``read_only`` (``.git/``, ``.loom/``),
    ``no_workspace`` (the agent has no workspace). The model reads the message and can retry
    with a path inside the workspace.
    """

    def __init__(self, message: str, *, code: str = "scope_violation"):
        super().__init__(message, code=code)


class ToolArgumentsError(ToolError):
    """A call's arguments failed validation; ``str()`` is a message written for the model.

    The executor turns it into an ``invalid_arguments`` result; a tool may raise it too.
    """

    def __init__(self, message: str, *, code: str = "invalid_arguments"):
        super().__init__(message, code=code)


class BackendRefused(ToolError):
    """A backend's safety rules refused what the model asked (a write in read-only mode, a
    table outside the allow-list, a host change, ...). Code ``refused``; nothing ran."""

    def __init__(self, message: str, *, code: str = "refused"):
        super().__init__(message, code=code)


class MCPServerError(ToolError):
    """An MCP server could not be reached or answered something unusable.

    Code ``mcp_unavailable`` by default: whether a call in flight took effect is unknown.
    """

    def __init__(self, message: str, *, code: str = "mcp_unavailable"):
        super().__init__(message, code=code)


class SessionError(LoomError):
    """Session bookkeeping failed."""


class SessionNotFound(SessionError, KeyError):
    """No session with that id exists in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "session not found"


class SessionBusy(SessionError):
    """The session is running another turn and ``on_busy="drop"`` was asked for."""


class QueueFull(SessionError):
    """Too many turns are already waiting for this session."""


class QueueTimeout(SessionError):
    """A queued turn waited longer than the queue timeout for the session lock."""


class StoreError(LoomError):
    """The store could not read or write."""


class StoreCorrupt(StoreError):
    """The database file is damaged or is not a Loom database."""


class SchemaTooNew(StoreError):
    """The database was written by a newer version of Loom."""


class LeaseLost(StoreError):
    """The session's lease changed hands: this holder's token is stale and may not write.

    Raised by ``Store.renew_lease`` and by ``Store.append(..., lease=...)``; nothing of the
    refused write was committed. The run must stop: another process now owns the session.
    """


class SerializationError(StoreError):
    """A value cannot be stored (no JSON form, nested too deeply, or refers to itself).

    The message names the field (for example ``tool result data['when']``); it is raised
    before anything of the step is committed.
    """


class ErrorNotFound(StoreError, KeyError):
    """No error with that id is stored (``loom errors show``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "error not found"


class BlobNotFound(StoreError, KeyError):
    """A media reference (``sha256:...``) names bytes the store does not hold (deleted with
    its session, or never stored there)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "media not found"


class TranscriptError(StoreError):
    """A JSONL transcript cannot be read; ``line`` is the 1-based number of the bad line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        super().__init__(message)


class HookError(LoomError):
    """A lifecycle hook raised and was not marked non-fatal."""


class ApprovalHandlerError(HookError):
    """An approval handler raised; the call it was deciding did not run."""


class JudgeError(LoomError):
    """A judge failed: it raised, returned a score outside 0..1, or answered unusably.

    The panel never lets this escape a run: the judge counts as failing (score 0, the default)
    or passing (``fail_open=True``), and the reason is recorded in the verdict.
    """


class JudgeOutputError(JudgeError):
    """A judge model's answer was not a JSON object ``{"score": 0..1, "reason": "..."}``."""


class JudgeTimeout(JudgeError):
    """A judge took longer than its timeout."""


class ValueNotRepresentable(LoomError, ValueError):
    """A value cannot be turned into JSON-native data (``loom.text.json_native``).

    It contains itself, is nested too deeply, holds too many items, or its ``str()`` raises.
    A tool result like that becomes a ``tool_exception`` result whose message says why.
    """


class RemoteMemberError(LoomError):
    """A crew's remote (A2A) member cannot be reached, or its agent card is unusable.
    ``member`` names the member and ``url`` where it was looked for; inside a crew run it is
    recorded as that member's failed result."""

    def __init__(self, member: str, url: str, detail: str):
        self.member, self.url = member, url
        super().__init__(
            f"crew member {member!r} (A2A agent at {url}): {detail}; check that the "
            "URL is the agent's (http://host/agents/<name>), that it is up, and its "
            "headers (Authorization)"
        )


class RunCancelled(LoomError):
    """The caller cancelled the run."""


class BudgetExceeded(LoomError):
    """A crew's tree-wide budget refused a model call or a spawn. ``budget`` names which one
    (``tokens``, ``cost_usd``, ``wall_seconds``, ``depth``, ``fan_out``, ``spawns``); the run
    stops with ``stop_reason="budget"``."""

    def __init__(self, budget: str, message: str):
        self.budget = budget
        super().__init__(message)
