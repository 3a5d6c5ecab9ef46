"""The threads sync tools run on: a pool Loom owns, sizes and accounts for.

A sync tool (a plain ``def`` under ``@tool``, and the built-in file and search tools) runs on
one of these threads so the event loop stays free. Python cannot stop a thread: when such a
tool runs past its timeout the executor stops waiting for it, sets ``ctx.cancel_event`` and
*abandons* the thread, which goes on until the function returns. Abandoned threads still
count against the pool. When every thread is taken, a new call is refused at once with the
result code ``capacity_exhausted`` instead of waiting behind tools that may never return
(asyncio's shared default pool, used before, let six hung tools block every sync tool,
built-in ``read_file`` included, and the local model with them).

Size: ``LOOM_TOOL_THREADS`` (read when the pool is first used) or
``configure_tool_threads(n)``; default ``DEFAULT_TOOL_THREADS`` (32). The threads are daemon
threads, so an abandoned tool that never returns does not keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from loom.errors import ConfigurationError, ToolError

__all__ = [
    "DEFAULT_TOOL_THREADS",
    "ToolThreads",
    "configure_tool_threads",
    "run_in_tool_thread",
    "tool_threads",
]

DEFAULT_TOOL_THREADS = 32
"""Threads for sync tools when neither ``LOOM_TOOL_THREADS`` nor ``configure_tool_threads``
says otherwise."""

ENV_VAR = "LOOM_TOOL_THREADS"

log = logging.getLogger("loom.tools")
T = TypeVar("T")

_Work = tuple["concurrent.futures.Future[Any]", Callable[[], Any]]


class ToolThreads:
    """A fixed-size set of daemon worker threads that refuses work rather than queue it.

    ``busy`` counts calls accepted and not yet returned (abandoned ones included); a call is
    accepted only while ``busy < size``, so an accepted call always has a thread.
    """

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(
                f"the number of tool threads must be a whole number of at least 1, got {size!r}"
            )
        self.size = size
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._threads = 0
        self._busy = 0
        self._abandoned: dict[concurrent.futures.Future[Any], float] = {}

    @property
    def busy(self) -> int:
        """Calls running now, abandoned ones included."""
        return self._busy

    @property
    def abandoned(self) -> int:
        """Calls whose caller stopped waiting (timeout, cancelled run) that still run."""
        return len(self._abandoned)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on a free thread, or raise ``ToolError(code="capacity_exhausted")``."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._busy >= self.size:
                raise ToolError(self._exhausted(), code="capacity_exhausted")
            self._busy += 1
            spawn = self._threads < self._busy
            if spawn:
                self._threads += 1
        if spawn:
            threading.Thread(
                target=self._worker, name=f"loom-tool-{self._threads}", daemon=True
            ).start()
        self._queue.put((fut, fn))
        return fut

    def abandon(self, fut: concurrent.futures.Future[Any]) -> None:
        """Note that nobody waits for ``fut`` any more although its thread still runs."""
        with self._lock:
            if not fut.done():
                self._abandoned[fut] = time.monotonic()

    def _exhausted(self) -> str:
        stuck = len(self._abandoned)
        why = (
            f"{stuck} of them held by sync tools that timed out and are still running "
            "(Python cannot stop a thread)"
            if stuck
            else "all of them are running other tool calls"
        )
        message = (
            f"no tool thread is free: all {self.size} are busy, {why}. The call was not run. "
            f"Try again later; whoever runs Loom can raise the limit with {ENV_VAR}=N or "
            "loom.tools.executor.configure_tool_threads(n)"
        )
        log.warning("%s", message)
        return message

    def _worker(self) -> None:
        while True:
            fut, fn = self._queue.get()
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn()
                except BaseException as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            with self._lock:
                self._busy -= 1
                since = self._abandoned.pop(fut, None)
            if since is not None:
                log.warning(
                    "an abandoned tool thread finished %.1f s after its caller stopped waiting; "
                    "its result was discarded",
                    time.monotonic() - since,
                )
            del fut, fn  # drop the result before blocking on the queue


_pool: ToolThreads | None = None
_pool_lock = threading.Lock()


def _size_from_env() -> int:
    raw = os.environ.get(ENV_VAR)
    if raw is None or not raw.strip():
        return DEFAULT_TOOL_THREADS
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ConfigurationError(
            f"{ENV_VAR}={raw!r} is not a number of threads; set it to a whole number of at "
            f"least 1 (default {DEFAULT_TOOL_THREADS}) or unset it"
        )
    return size


def tool_threads() -> ToolThreads:
    """The process's tool thread pool (made on first use, sized by ``LOOM_TOOL_THREADS``)."""
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ToolThreads(_size_from_env())
            pool = _pool
    return pool


def configure_tool_threads(size: int) -> ToolThreads:
    """Use a pool of ``size`` threads for sync tool calls that start from now on.

    Calls already running finish on the threads they have.
    """
    global _pool
    pool = ToolThreads(size)
    with _pool_lock:
        _pool = pool
    return pool


async def run_in_tool_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a tool thread, with this task's context variables.

    If the awaiting task is cancelled (a timeout, a cancelled run) while ``fn`` still runs,
    the thread is recorded as abandoned and the cancellation goes on at once.
    """
    pool = tool_threads()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    fut = pool.submit(call)
    try:
        return await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        pool.abandon(fut)
        raise
