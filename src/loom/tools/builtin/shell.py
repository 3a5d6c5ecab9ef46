"""``bash``: run a shell command in the workspace, time-limited, with a scrubbed environment.

The command runs in its own process group (a new session), so a timeout or a cancelled run
kills everything it started, background jobs included. Output (stdout and stderr together) is
capped: the start and the end are kept and the middle is replaced by a note. The environment
holds only a few harmless variables (``PATH``, ``HOME``, locale, ...): API keys and other
secrets of the parent process are not inherited unless named in ``make_bash(env_allow=...)``.

Which commands may run is decided before the tool runs, by the permission rules matched per
subcommand (``loom.policy.permissions``, ``loom.policy.shell``). On the host the tool is not a
sandbox: an allowed command can touch anything the user running Loom can. With the agent's
``sandbox:`` setting on (``Agent(sandbox=True)``, ``loom.sandbox``) the command runs in the
session's sandbox instead: its workspace, its limits, no network unless allowed; stdout and
stderr come back apart, with the files it produced (images as media) and a typed
``sandbox_limit`` error for a limit it hit; the call is then ``idempotent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from loom.errors import ToolError
from loom.policy.scope import workspace_of
from loom.sandbox.results import result_for_model
from loom.sandbox.tools import SandboxAwareTool, runs_sandboxed
from loom.tools.base import RunContext

__all__ = ["SAFE_ENV", "bash", "make_bash", "scrubbed_env"]

SAFE_ENV: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
)
"""Variables ``bash`` passes on by default; nothing else of the parent's environment is kept."""

MAX_TIMEOUT = 600.0
_GRACE = 0.5  # seconds to drain output after the shell exits before stragglers are killed


def scrubbed_env(allow: Iterable[str] = ()) -> dict[str, str]:
    """The parent's environment reduced to ``SAFE_ENV`` plus the names in ``allow``."""
    keep = set(SAFE_ENV) | set(allow)
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("PATH", os.defpath)
    return env


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _exited(proc: asyncio.subprocess.Process) -> int:
    # Process.wait() also waits for the pipes to close, which a background job holding stdout
    # delays for as long as it lives; the return code is set as soon as the shell exits.
    delay = 0.002
    while proc.returncode is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return proc.returncode


class _Capture:
    """Keeps the first and last ``cap / 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.cap // 2:
                del self.tail[: len(self.tail) - self.cap // 2]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        kept = len(self.head) + len(self.tail)
        if self.total <= kept:
            return head + self.tail.decode("utf-8", errors="replace")
        omitted = self.total - kept
        return (
            f"{head}\n[... {omitted:,} bytes of output omitted; {self.total:,} bytes in all. "
            "Narrow the command (grep, head, tail) to see the part you need ...]\n"
            + self.tail.decode("utf-8", errors="replace")
        )


def make_bash(
    *,
    env_allow: Iterable[str] = (),
    max_output: int = 32 * 1024,
    shell: str = "/bin/bash",
    name: str = "bash",
) -> SandboxAwareTool:
    """A ``bash`` tool with its own settings.

    Args:
        env_allow: Extra environment variable names the command may see (e.g. ``["GH_TOKEN"]``).
        max_output: Bytes of output returned to the model (start and end kept).
        shell: The shell binary.
        name: Tool name.
    """
    allow = tuple(env_allow)

    async def bash(ctx: RunContext, command: str, timeout: float = 120.0) -> Any:  # noqa: ASYNC109
        """Run a shell command in the workspace directory and return its output.

        stdout and stderr are returned together; a non-zero exit status is reported on the
        last line. Long outputs are shortened in the middle. No input is available (stdin is
        empty), so interactive commands fail.

        Args:
            command: The command line, run with bash -c.
            timeout: Seconds before the command and everything it started are killed (max 600).
        """
        if not command.strip():
            raise ToolError("the command is empty", code="invalid_arguments")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(
                f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds", code="invalid_arguments"
            )
        access = ctx.sandbox
        if access is not None and runs_sandboxed(access.setting, default=False):
            limits = access.setting.settings.limits
            wall = min(timeout, limits.wall_seconds or timeout)
            async with access.use() as box:
                result = await box.run(
                    [shell, "-c", command],
                    env=dict(access.setting.settings.env),
                    limits=replace(limits, wall_seconds=wall),
                )
                return await result_for_model(result, box)
        cwd = workspace_of(ctx.workspace, tool="bash").root
        proc = await asyncio.create_subprocess_exec(
            shell,
            "-c",
            command,
            cwd=cwd,
            env=scrubbed_env(allow),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        out = _Capture(max_output)

        async def pump() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                out.add(chunk)

        reader = asyncio.ensure_future(pump())
        try:
            async with asyncio.timeout(timeout):
                code = await _exited(proc)
            # Background jobs may hold the pipe open; give them a moment, then end them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), _GRACE)
        except TimeoutError:
            _kill_group(proc)
            raise ToolError(
                f"the command ran past its {timeout:g} s timeout; it and every process it "
                f"started were killed. Output so far:\n{out.text()}",
                code="timeout",
            ) from None
        finally:
            _kill_group(proc)  # on cancel too: nothing the command started outlives the call
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            if proc.returncode is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
        text = out.text()
        if code != 0:
            text += f"\n[exit code {code}]"
        return text or "[no output]"

    bash.__name__ = name
    return SandboxAwareTool(
        bash,
        sandbox_default=False,
        effect_on_host="at_most_once",
        subject=("command", "command"),
        timeout=MAX_TIMEOUT + 10,
    )


bash = make_bash()
