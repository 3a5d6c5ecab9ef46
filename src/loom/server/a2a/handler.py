"""The SDK's request handler with Loom's checks in front, and the JSON-RPC dispatcher with
error messages that say what was wrong.

Versions (A2A 1.0, section 3.6): a request names its protocol version with the ``A2A-Version``
header or, as the specification allows, an ``A2A-Version`` query parameter; none means 0.3.
The 1.0 methods answer a request without one with ``VersionNotSupportedError`` saying which
header to send (the 0.3 method names still work without it)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import JSONParseError, MethodNotFoundError
from a2a.server.request_handlers.default_request_handler_v2 import DefaultRequestHandlerV2
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import VERSION_HEADER
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotFoundError,
    VersionNotSupportedError,
)
from starlette.requests import Request
from starlette.responses import Response

from loom.errors import InputError, UnsupportedContent
from loom.server.a2a.executor import CANCEL_WAIT, decision_of, text_of
from loom.server.a2a.parts import content_of

__all__ = [
    "PROTOCOL_VERSION",
    "ContextBuilder",
    "Dispatcher",
    "LoomRequestHandler",
    "missing_version_message",
    "requested_version",
]

PROTOCOL_VERSION = "1.0"


def requested_version(request: Request) -> str | None:
    """The A2A version a request names: its ``A2A-Version`` header, else the query parameter
    of that name (A2A 1.0 section 3.6.1 allows either); None when it names none."""
    return request.headers.get(VERSION_HEADER) or request.query_params.get(VERSION_HEADER) or None


def missing_version_message(what: str) -> str:
    """What a request without ``A2A-Version`` is told (the protocol reads it as 0.3)."""
    return (
        f"{what} is A2A {PROTOCOL_VERSION}, and this request names no protocol version, which "
        f"A2A reads as 0.3: send the header '{VERSION_HEADER}: {PROTOCOL_VERSION}' (or the query "
        f"parameter ?{VERSION_HEADER}={PROTOCOL_VERSION})"
    )


class ContextBuilder(DefaultServerCallContextBuilder):
    """Carries the request's API key (set by the server's guard) into the call context, and a
    version given as a query parameter as if it were the header (the SDK reads headers)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["loom.principal"] = request.scope.get("loom.principal")
        version = requested_version(request)
        headers = context.state.get("headers")
        if version is not None and isinstance(headers, dict):
            headers[VERSION_HEADER.lower()] = version
        return context


def _part_kind(part: Any) -> str:
    for kind in ("raw", "url", "data"):
        if part.HasField(kind):
            return {"raw": "file bytes", "url": "file url", "data": "data"}[kind]
    return "of no kind this server knows (a part is text, raw, url or data)"


class LoomRequestHandler(DefaultRequestHandlerV2):
    """Checks a message before the SDK makes a task of it: parts Loom can use
    (``loom.server.a2a.parts``; text only for an answer, text or data for an approval
    decision), a message the agent and its model accept, a context this key may use; and names
    the task in not-found errors."""

    def __init__(self, *args: Any, loom_state: Any, agent_name: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.loom_state, self.agent_name = loom_state, agent_name

    async def _screen(self, params: SendMessageRequest, context: ServerCallContext) -> None:
        message = params.message
        task: Task | None = None
        if message.task_id:
            stored = await self._versioned_store.get(message.task_id, context)
            task = stored.task if stored is not None else None
            if task is None:
                raise TaskNotFoundError(
                    f"no task {message.task_id!r} on agent {self.agent_name!r} for this API key"
                )
            # A2A 1.0 section 3.4.3: the context is inferred from the task, and must match it
            if not message.context_id:
                message.context_id = task.context_id
            elif message.context_id != task.context_id:
                raise InvalidParamsError(
                    f"contextId {message.context_id!r} is not the context of task "
                    f"{task.id!r} ({task.context_id!r}); send the task's contextId or none"
                )
        deciding = (
            task is not None
            and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            and bool(await self.loom_state.runtime.pending_approvals(task.context_id))
        )
        answering = (
            task is not None
            and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            and not deciding
            and await self.loom_state.runtime.pending_query(task.context_id) is not None
        )
        if deciding or answering:  # a decision or an answer: text (a decision: data too)
            for i, part in enumerate(message.parts):
                if part.HasField("text") or (deciding and part.HasField("data")):
                    continue
                what = "an approval decision" if deciding else "the answer to the agent's question"
                raise ContentTypeNotSupportedError(
                    f"message part {i} is {_part_kind(part)}; this task waits for {what}, "
                    "which is text" + (" or a data part" if deciding else "")
                )
        try:
            if deciding:
                decision_of(message)
            elif answering:
                self.loom_state.registry[self.agent_name].check_message(text_of(message))
            else:
                self._check_content(message)
        except UnsupportedContent as exc:
            raise ContentTypeNotSupportedError(str(exc)) from None
        except InputError as exc:
            raise InvalidParamsError(str(exc)) from None
        owners = self.loom_state.extra.get("owners")
        if task is None and message.context_id:
            from loom.server.ownership import client_session_id, current_owners, current_principal

            token = current_principal.set(context.state.get("loom.principal"))
            owners_token = current_owners.set(owners)
            try:  # a new task's contextId is a session id: checked, and the key's own
                message.context_id = client_session_id(message.context_id, "contextId")
                allowed = owners is None or await owners.allowed(message.context_id)
            except InputError as exc:
                raise InvalidParamsError(str(exc)) from None
            finally:
                current_owners.reset(owners_token)
                current_principal.reset(token)
            if not allowed:
                raise InvalidParamsError(
                    f"no context {message.context_id!r} for this API key; leave contextId out "
                    "to start a new one"
                )

    async def _setup_active_task(
        self, params: SendMessageRequest, call_context: ServerCallContext
    ) -> Any:
        await self._screen(params, call_context)
        return await super()._setup_active_task(params, call_context)

    def _check_content(self, message: Message) -> None:
        """The message as the agent takes it (``loom.server.a2a.parts``): its media usable and
        readable by the agent's model, its text within the agent's limits."""
        from loom.content import check_parts

        text, parts = content_of(message)
        agent = self.loom_state.registry[self.agent_name]
        if parts:
            check_parts(self.loom_state.runtime.model_for(agent), parts)
        if text or not parts:  # media alone are a message; an empty message is not
            agent.check_message(text)

    def _missing(self, task_id: str) -> TaskNotFoundError:
        return TaskNotFoundError(
            f"no task {task_id!r} on agent {self.agent_name!r} for this API key"
        )

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        try:
            task: Task | None = await super().on_get_task(params, context)
            return task
        except TaskNotFoundError:
            raise self._missing(params.id) from None

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        carried = await self._cancel_carried_on(params.id, context)
        if carried is not None:
            return carried
        try:
            task: Task | None = await super().on_cancel_task(params, context)
            return task
        except TaskNotFoundError:
            raise self._missing(params.id) from None

    async def _cancel_carried_on(self, task_id: str, context: ServerCallContext) -> Task | None:
        """Cancel a task whose run this process carried on at start-up (no request of this
        process runs it, so the SDK would only mark it canceled while the run went on): stop
        the run, wait for it to record its end, answer the task as it then is. None for any
        other task."""
        running = self.loom_state.extra.get("a2a_running", {}).get(self.agent_name, {})
        held = running.get(task_id)
        if held is None or await self._active_task_registry.get(task_id) is not None:
            return None
        stored = await self._versioned_store.get(task_id, context)
        if stored is None:  # another key's task: not found, like any other
            raise self._missing(task_id)
        cancel, done = held
        cancel.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), CANCEL_WAIT)
        stored = await self._versioned_store.get(task_id, context)
        return stored.task if stored is not None else None

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> Any:
        try:
            async for event in super().on_subscribe_to_task(params, context):
                yield event
        except TaskNotFoundError:
            raise self._missing(params.id) from None


class Dispatcher(JsonRpcDispatcher):
    """JSON-RPC with messages that name the problem: a body that is not JSON, an unknown
    method (and the methods there are)."""

    async def handle_requests(self, request: Request) -> Response:
        try:
            body = await request.json()  # cached: the SDK's own parse reads the same value
        except ValueError as exc:
            return self._generate_error_response(
                None,
                JSONParseError(
                    message=f"the request body is not valid JSON ({exc}); send one JSON-RPC 2.0 "
                    "request object"
                ),
            )
        if isinstance(body, dict) and isinstance(method := body.get("method"), str):
            known = method in self.METHOD_TO_MODEL or (
                self._v03_adapter is not None and self._v03_adapter.supports_method(method)
            )
            rid = body.get("id")
            rid = rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None
            if method in self.METHOD_TO_MODEL and requested_version(request) is None:
                return self._generate_error_response(
                    rid,
                    VersionNotSupportedError(
                        message=missing_version_message(f"the method {method!r}")
                        + "; the 0.3 method names (message/send, tasks/get, ...) need none"
                    ),
                )
            if not known:
                return self._generate_error_response(
                    rid,
                    MethodNotFoundError(
                        message=f"unknown method {method!r}; this A2A 1.0 endpoint takes "
                        + ", ".join(self.METHOD_TO_MODEL)
                    ),
                )
        return await super().handle_requests(request)
