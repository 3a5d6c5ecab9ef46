from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeRequest(_message.Message):
    __slots__ = ("session_id", "after_event_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_event_id: str
    def __init__(self, session_id: _Optional[str] = ..., after_event_id: _Optional[str] = ...) -> None: ...

class ClarificationAnswer(_message.Message):
    __slots__ = ("session_id", "call_id", "approve", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    call_id: str
    approve: bool
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., call_id: _Optional[str] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AnswerReply(_message.Message):
    __slots__ = ("status", "undecided", "reply")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UNDECIDED_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    status: str
    undecided: _containers.RepeatedScalarFieldContainer[str]
    reply: WeaveReply
    def __init__(self, status: _Optional[str] = ..., undecided: _Optional[_Iterable[str]] = ..., reply: _Optional[_Union[WeaveReply, _Mapping]] = ...) -> None: ...

class WeaveRequest(_message.Message):
    __slots__ = ("agent", "message", "session_id")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    agent: str
    message: str
    session_id: str
    def __init__(self, agent: _Optional[str] = ..., message: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "requests")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    requests: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., requests: _Optional[int] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "input_json", "finished", "success", "result", "error_code", "duration_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    input_json: str
    finished: bool
    success: bool
    result: str
    error_code: str
    duration_ms: float
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., input_json: _Optional[str] = ..., finished: _Optional[bool] = ..., success: _Optional[bool] = ..., result: _Optional[str] = ..., error_code: _Optional[str] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class PendingApproval(_message.Message):
    __slots__ = ("tool_call_id", "tool_name", "arguments_json", "reason")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    tool_name: str
    arguments_json: str
    reason: str
    def __init__(self, tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WeaveReply(_message.Message):
    __slots__ = ("session_id", "run_id", "output", "stop_reason", "usage", "iterations", "error", "tool_calls", "pending_approvals", "warnings")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PENDING_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    output: str
    stop_reason: str
    usage: Usage
    iterations: int
    error: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    pending_approvals: _containers.RepeatedCompositeFieldContainer[PendingApproval]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., output: _Optional[str] = ..., stop_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., iterations: _Optional[int] = ..., error: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., pending_approvals: _Optional[_Iterable[_Union[PendingApproval, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("agent", "resume")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    agent: str
    resume: bool
    def __init__(self, agent: _Optional[str] = ..., resume: _Optional[bool] = ...) -> None: ...

class Stage(_message.Message):
    __slots__ = ("from_stage", "to_stage")
    FROM_STAGE_FIELD_NUMBER: _ClassVar[int]
    TO_STAGE_FIELD_NUMBER: _ClassVar[int]
    from_stage: str
    to_stage: str
    def __init__(self, from_stage: _Optional[str] = ..., to_stage: _Optional[str] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("call", "total")
    CALL_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    call: Usage
    total: Usage
    def __init__(self, call: _Optional[_Union[Usage, _Mapping]] = ..., total: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("message", "source", "fatal")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    message: str
    source: str
    fatal: bool
    def __init__(self, message: _Optional[str] = ..., source: _Optional[str] = ..., fatal: _Optional[bool] = ...) -> None: ...

class WeaveEvent(_message.Message):
    __slots__ = ("session_id", "run_id", "sequence", "event_id", "type", "event_json", "replayed", "started", "stage", "delta", "tool_start", "tool_end", "tokens", "approval_required", "warning", "error", "final")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOOL_START_FIELD_NUMBER: _ClassVar[int]
    TOOL_END_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    sequence: int
    event_id: str
    type: str
    event_json: str
    replayed: bool
    started: Started
    stage: Stage
    delta: TextDelta
    tool_start: ToolCall
    tool_end: ToolCall
    tokens: Tokens
    approval_required: PendingApproval
    warning: Notice
    error: Notice
    final: WeaveReply
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., sequence: _Optional[int] = ..., event_id: _Optional[str] = ..., type: _Optional[str] = ..., event_json: _Optional[str] = ..., replayed: _Optional[bool] = ..., started: _Optional[_Union[Started, _Mapping]] = ..., stage: _Optional[_Union[Stage, _Mapping]] = ..., delta: _Optional[_Union[TextDelta, _Mapping]] = ..., tool_start: _Optional[_Union[ToolCall, _Mapping]] = ..., tool_end: _Optional[_Union[ToolCall, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., approval_required: _Optional[_Union[PendingApproval, _Mapping]] = ..., warning: _Optional[_Union[Notice, _Mapping]] = ..., error: _Optional[_Union[Notice, _Mapping]] = ..., final: _Optional[_Union[WeaveReply, _Mapping]] = ...) -> None: ...
