"""``python``: run a cell of Python code in the session's sandbox, like a notebook cell.

The code goes to a small runner script on stdin (nothing is written into the workspace for
it); the runner executes it in a fresh namespace and, when the last statement is an
expression, evaluates it and keeps its ``repr`` (the cell's value). What comes back: stdout,
stderr (a traceback when the code raised), the value, the workspace files the code created or
changed, images among them as media, and a typed ``sandbox_limit`` error for a limit it hit.
The runner reports the value on the last line of stdout after a marker that holds a random
nonce made per call, so output of the code cannot forge it.

The tool runs only in a sandbox (``loom.sandbox``): by default, and unless the agent both
turns the sandbox off (``sandbox=False``) and says ``python_unsandboxed=True``, in which case
it runs on the host in the workspace with a scrubbed environment. Without either it refuses
(``sandbox_required``). Sandboxed, the call is ``idempotent``; on the host ``at_most_once``.
Each call is a new interpreter: variables do not survive between calls, files do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import time
from dataclasses import replace
from typing import Any

from loom.errors import ToolError
from loom.policy.scope import workspace_of
from loom.sandbox.base import ExecResult
from loom.sandbox.results import exec_text, result_for_model
from loom.sandbox.tools import SandboxAwareTool, runs_sandboxed
from loom.tools.base import RunContext

__all__ = ["RUNNER", "make_python", "python"]

MAX_TIMEOUT = 600.0
MAX_VALUE_CHARS = 10_000

RUNNER = r"""
import ast, json, sys, traceback
nonce, _, code = sys.stdin.read().partition("\n")
value = error = None
try:
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<cell>", "exec"), scope)
    if last is not None:
        result = eval(compile(last, "<cell>", "eval"), scope)
        if result is not None:
            value = repr(result)[:LIMIT]
except BaseException as exc:
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        pass
    else:
        traceback.print_exc()
        error = (type(exc).__name__ + ": " + str(exc))[:LIMIT]
sys.stdout.flush()
sys.stderr.flush()
sys.stdout.write("\n" + nonce + json.dumps({"value": value, "error": error}) + "\n")
sys.stdout.flush()
sys.exit(1 if error else 0)
""".replace("LIMIT", str(MAX_VALUE_CHARS))
"""The script the interpreter runs (``python3 -c RUNNER``); the cell comes on stdin."""


def _split_trailer(stdout: str, nonce: str) -> tuple[str, dict[str, Any] | None]:
    """(the code's own stdout, the runner's report) from the interpreter's stdout."""
    at = stdout.rfind(nonce)
    if at < 0:
        return stdout, None
    try:
        report = json.loads(stdout[at + len(nonce) :].strip())
    except ValueError:
        return stdout, None
    own = stdout[:at]
    return own.removesuffix("\n"), report if isinstance(report, dict) else None


def _cell_text(result: ExecResult, nonce: str) -> str:
    own, report = _split_trailer(result.stdout, nonce)
    text = exec_text(replace(result, stdout=own), trailer=False)
    notes = []
    if report is not None and report.get("value") is not None:
        notes.append(f"[value] {report['value']}")
    if report is not None and report.get("error"):
        notes.append(f"[error] {report['error']}")
    elif report is None and result.limit is None:
        notes.append(
            f"[the interpreter ended without finishing the cell: exit code {result.exit_code}]"
        )
    if result.truncated_bytes:
        notes.append(f"[{result.truncated_bytes:,} bytes of output dropped at the output limit]")
    if result.files:
        notes.append(f"[files created or changed: {', '.join(result.files[:50])}]")
    if notes:
        text += ("\n" if text and not text.endswith("\n") else "") + "\n".join(notes)
    return text or "[no output]"


async def _run_on_host(
    interpreter: str, stdin: bytes, cwd: str, seconds: float, env: dict[str, str]
) -> ExecResult:
    """The cell on the host (only with ``sandbox: false`` and ``python_unsandboxed: true``)."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        interpreter,
        "-c",
        RUNNER,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(seconds):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        raise ToolError(
            f"the cell ran past its {seconds:g} s timeout and was killed", code="timeout"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return ExecResult(
        proc.returncode if proc.returncode is not None else -1,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
        time.monotonic() - started,
    )


def make_python(*, interpreter: str = "python3", name: str = "python") -> SandboxAwareTool:
    """A ``python`` tool with its own settings.

    Args:
        interpreter: The Python interpreter inside the sandbox (its ``PATH`` is searched).
        name: Tool name.
    """

    async def python(ctx: RunContext, code: str, timeout: float = 60.0) -> Any:  # noqa: ASYNC109
        """Run Python code like a notebook cell and return its output.

        Returns stdout, stderr (with the traceback if the code raised), the value of the
        last line when it is an expression, and the files the code wrote in the working
        directory (images you save, e.g. with matplotlib's savefig, are shown to you). Each
        call starts a new interpreter: keep state in files, not variables. No network.

        Args:
            code: The Python source to run.
            timeout: Seconds before the code and everything it started are killed (max 600).
        """
        if not code.strip():
            raise ToolError("the code is empty", code="invalid_arguments")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(
                f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds", code="invalid_arguments"
            )
        nonce = f"\x1e__loom_cell_{secrets.token_hex(16)}__"
        stdin = f"{nonce}\n{code}".encode()
        access = ctx.sandbox
        if access is not None and runs_sandboxed(access.setting, default=True):
            limits = access.setting.settings.limits
            wall = min(timeout, limits.wall_seconds or timeout)
            async with access.use() as box:
                result = await box.run(
                    [interpreter, "-c", RUNNER],
                    stdin=stdin,
                    env=dict(access.setting.settings.env),
                    limits=replace(limits, wall_seconds=wall),
                )
                return await result_for_model(result, box, text=_cell_text(result, nonce))
        if access is None or not access.setting.python_allowed_on_host:
            raise ToolError(
                "the python tool runs only in a sandbox, and this agent's sandbox is off "
                "(or this call has no runtime). Turn it on (sandbox: true), or, to run code "
                "on the host knowingly, set both sandbox: false and python_unsandboxed: true",
                code="sandbox_required",
            )
        from loom.tools.builtin.shell import scrubbed_env

        cwd = workspace_of(ctx.workspace, tool="python").root
        result = await _run_on_host(interpreter, stdin, str(cwd), timeout, scrubbed_env())
        return _cell_text(result, nonce)

    python.__name__ = name
    return SandboxAwareTool(
        python,
        sandbox_default=True,
        effect_on_host="at_most_once",
        subject=None,
        timeout=MAX_TIMEOUT + 10,
    )


python = make_python()
