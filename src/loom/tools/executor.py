"""Runs one tool call to a ``ToolResult``: never raises for anything the model can fix.

Every failure the model caused or can react to becomes an error result with a stable code:

| code                  | cause                                                        |
| --------------------- | ------------------------------------------------------------ |
| ``unknown_tool``        | the model named a tool the agent does not have              |
| ``invalid_json``        | the arguments were not a JSON object                        |
| ``invalid_arguments``   | the arguments did not match the tool's schema               |
| ``timeout``             | the call ran past its timeout (async: cancelled; sync:      |
|                       | abandoned, its thread may still run)                         |
| ``capacity_exhausted``  | every tool thread is busy (see ``loom.tools.threads``)      |
| ``tool_exception``      | the tool raised, or returned a value that cannot be stored  |
| ``denied``              | a hook or the permission policy refused the call            |
| ``interrupted``         | the run stopped (cancel, crash) before the call finished    |
| ``limit``               | the turn's ``max_tool_calls`` was reached                   |
| any ToolError code      | the tool raised ``loom.ToolError(code=...)``                |

A successful result's ``data`` is converted here, once, to JSON-native data
(``loom.text.json_native``): every store, export and provider can then take it as it is.
Images, files and audio it returned are taken out first (``loom.tools.media``): they become
``ToolResult.parts``, and the data names them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import traceback
import types
from collections.abc import Coroutine, Generator, Mapping
from typing import Any

from loom.errors import ToolArgumentsError, ToolError, ValueNotRepresentable
from loom.messages import ToolCall, ToolResult
from loom.text import json_native, representable
from loom.tools.base import RunContext, Tool
from loom.tools.media import MediaPart, split_media
from loom.tools.threads import configure_tool_threads

# Python 3.11 has no eager tasks; these (documented in asyncio.tasks, used by 3.12's eager
# start) make a step run as a given task.
_enter_task: Any = asyncio.tasks._enter_task
_leave_task: Any = asyncio.tasks._leave_task

__all__ = ["configure_tool_threads", "error_result", "execute_call"]

log = logging.getLogger("loom.tools")

# Tasks of timed-out tools that did not stop when cancelled: kept referenced until they end.
_detached: set[asyncio.Task[Any]] = set()


def error_result(call: ToolCall, code: str, message: str, duration_ms: float = 0.0) -> ToolResult:
    """A failed result for ``call``; the message is made storable (see ``loom.text``)."""
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        success=False,
        error_code=code,
        error_message=representable(message)[0],
        duration_ms=duration_ms,
    )


class _TimedOut(Exception):
    pass


async def execute_call(
    call: ToolCall,
    tools: Mapping[str, Tool],
    ctx: RunContext,
    default_timeout: float,
) -> ToolResult:
    """Validate and run one call under its timeout; convert its value to JSON-native data."""
    started = time.perf_counter()
    t = tools.get(call.name)
    if t is None:
        available = ", ".join(sorted(tools)) or "(none)"
        return error_result(
            call, "unknown_tool", f"there is no tool named {call.name!r}; available: {available}"
        )
    if call.raw_arguments is not None:
        return error_result(
            call,
            "invalid_json",
            f"arguments for {call.name} must be a JSON object, got: {call.raw_arguments[:200]!r}",
        )
    try:
        arguments = t.validate(call.arguments)
    except ToolArgumentsError as exc:
        return error_result(call, "invalid_arguments", str(exc))
    timeout = t.timeout if t.timeout is not None else default_timeout
    try:
        if getattr(t, "runs_inline", False):
            # It never awaits, so a timer could not fire before it returns: skip arming one.
            data = await t.run(ctx, arguments)
        elif getattr(t, "runs_in_thread", False):
            # Loom's own thread wrapper ends at once when cancelled (the thread is abandoned),
            # so no separate task is needed to keep the timeout.
            try:
                async with asyncio.timeout(timeout):
                    data = await t.run(ctx, arguments)
            except TimeoutError:
                ctx.cancel_event.set()
                raise _TimedOut from None
        else:
            data = await _run_limited(t, ctx, arguments, limit=timeout)
    except _TimedOut:
        if getattr(t, "runs_in_thread", False):
            what = (
                "It is a sync tool, and Python cannot stop a thread: the call was abandoned and "
                "may still be running in the background, so its effects may still happen"
            )
        else:
            what = "It was cancelled; whatever it returns later is discarded"
        return error_result(
            call,
            "timeout",
            f"{call.name} did not finish within {timeout:g} s. {what}.",
            (time.perf_counter() - started) * 1000,
        )
    except ToolError as exc:
        return error_result(call, exc.code, str(exc), (time.perf_counter() - started) * 1000)
    except asyncio.CancelledError:
        ctx.cancel_event.set()
        raise
    except Exception as exc:
        failed = error_result(
            call,
            "tool_exception",
            f"{type(exc).__name__}: {exc}",
            (time.perf_counter() - started) * 1000,
        )
        # Kept for the error channel (get_error_detail); the model never reads metadata.
        failed.metadata["traceback"] = traceback.format_exc()
        return failed
    duration_ms = (time.perf_counter() - started) * 1000
    # The one serialisation of a result, decided before anything is committed: a value no
    # store could hold becomes an error now instead of failing (and being lost) at the commit.
    # Media the tool returned become the result's parts; its data names them (tools/media.py)
    media: list[MediaPart] = []
    if not isinstance(data, str):
        data, media = split_media(data)
    try:
        data, escaped = json_native(data)
    except ValueNotRepresentable as exc:
        return error_result(
            call,
            "tool_exception",
            f"{call.name} ran, but its return value cannot be stored: {exc}",
            duration_ms,
        )
    result = ToolResult.trusted(  # every field the engine's own, JSON-native data
        tool_call_id=call.id,
        name=call.name,
        success=True,
        data=data,
        error_code=None,
        error_message=None,
        duration_ms=duration_ms,
        metadata={},
        parts=media,
    )
    if escaped:
        result.metadata["escaped_strings"] = escaped
    return result


async def _run_limited(t: Tool, ctx: RunContext, arguments: dict[str, Any], *, limit: float) -> Any:
    """``t.run`` in its own task, waited for at most ``limit`` seconds.

    Its own task so that the timeout does not depend on the tool: a tool that swallows its
    cancellation is left running (detached, logged) and the caller gets the timeout at once.

    The task's first step runs at once, here, as that task (current task and context are its
    own, as with Python 3.12's eager tasks): a tool that returns without suspending (most of
    them) is done before any timer or waiter is armed, and costs the caller no trip through
    the event loop. A tool that suspends goes on in its task as before.
    """
    loop = asyncio.get_running_loop()
    coro = t.run(ctx, arguments)
    started = _EagerStart(coro)
    body = started.rest()
    next(body)  # to its first line: a cancel before the task's first step reaches the tool
    task = loop.create_task(body, context=started.context)
    done, value = started.first_step(loop, task)
    if done:
        return value
    waiter = loop.create_future()

    def wake(_: asyncio.Task[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    try:
        async with asyncio.timeout(limit):
            await waiter
    except TimeoutError:
        ctx.cancel_event.set()
        task.remove_done_callback(wake)
        task.cancel()
        _detach(task, t.name, limit)
        raise _TimedOut from None
    except asyncio.CancelledError:
        # The run is being cancelled: cancel the tool too and give it a moment to clean up
        # (kill its processes, close files), without letting a stubborn tool hold the run.
        ctx.cancel_event.set()
        task.remove_done_callback(wake)
        task.cancel()
        await asyncio.wait((task,), timeout=_CANCEL_GRACE)
        if not task.done():
            _detach(task, t.name, limit)
        raise
    return task.result()


class _EagerStart:
    """A coroutine whose first step runs when its task is created (see ``_run_limited``)."""

    __slots__ = ("context", "coro", "finished", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.context = contextvars.copy_context()
        self.finished = False
        self.waiting_on: Any = None

    def first_step(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> Any:
        """Run the first step as ``task``: (True, value) when it returned, (False, None) when
        it suspended. An exception of the tool propagates (the task then ends at once)."""
        caller = asyncio.current_task(loop)
        if caller is not None:
            _leave_task(loop, caller)
        _enter_task(loop, task)
        try:
            self.waiting_on = self.context.run(self.coro.send, None)
        except StopIteration as stop:
            self.finished = True
            return True, stop.value
        except BaseException:
            self.finished = True
            raise
        finally:
            _leave_task(loop, task)
            if caller is not None:
                _enter_task(loop, caller)
        return False, None

    @types.coroutine
    def rest(self) -> Generator[Any, Any, Any]:
        """The task's body: the steps after the first (nothing when it already finished).

        Advanced to its first ``yield`` before the task exists, so that a cancellation thrown
        in before the task's first step is passed to the tool, not lost at the body's start.
        """
        to_throw: BaseException | None = None
        try:
            yield None
        except GeneratorExit:
            if not self.finished:
                self.coro.close()
            raise
        except BaseException as exc:  # cancelled before its first step
            to_throw = exc
        if self.finished:  # the caller has the outcome; the task just ends
            return None
        coro, waiting_on = self.coro, self.waiting_on
        while True:
            try:
                if to_throw is not None:
                    thrown, to_throw = to_throw, None
                    waiting_on = coro.throw(thrown)
                    continue
                try:
                    sent = yield waiting_on
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as exc:  # CancelledError too: the tool gets it
                    to_throw = exc
                    continue
                waiting_on = coro.send(sent)
            except StopIteration as stop:
                return stop.value


_CANCEL_GRACE = 1.0


def _detach(task: asyncio.Task[Any], name: str, timeout: float) -> None:
    _detached.add(task)
    since = time.perf_counter()

    def ended(done: asyncio.Task[Any]) -> None:
        _detached.discard(done)
        if done.cancelled():
            return  # it stopped when asked: nothing to report
        late = time.perf_counter() - since
        exc = done.exception()
        outcome = f"raised {type(exc).__name__}" if exc is not None else "returned a value"
        log.warning(
            "tool %s ignored its cancellation after its %g s timeout and %s %.1f s later; "
            "that outcome was discarded (the model was told it timed out)",
            name,
            timeout,
            outcome,
            late,
        )

    task.add_done_callback(ended)
