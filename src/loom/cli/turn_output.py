"""How the CLI shows a turn in the terminal: its events as they stream, the summary line, the
exit code. Shared by ``loom run`` / ``chat`` / ``resume``, ``loom run --crew`` and the
``--server`` client (``loom.cli.remote``), which is why it is a module of its own.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from loom.cli._console import err, out

if TYPE_CHECKING:
    from loom.events import AgentEvent

__all__ = [
    "EXIT_INTERRUPTED",
    "Renderer",
    "enable_line_editing",
    "end_of_turn",
    "interrupted",
    "print_summary",
]

# Shell convention for "stopped by SIGINT" (128 + 2).
EXIT_INTERRUPTED = 130


class Renderer:
    """Prints one turn's events: text as it streams, tool calls as they start and end."""

    def __init__(self, as_json: bool, *, asks_here: bool = False) -> None:
        self.as_json = as_json
        # this terminal's approval prompt already said what a call waits for, and the
        # APPROVAL_REQUIRED event reaches the renderer only after the prompt: not again
        self.asks_here = asks_here
        self.in_text = False
        self.result: dict[str, Any] = {}

    def end_text(self) -> None:
        """End a line of streamed text (before other output, or when the answer is cut)."""
        if self.in_text:
            out.print()
            self.in_text = False

    def __call__(self, event: AgentEvent) -> None:
        from loom.events import EventType as E

        if self.as_json:
            sys.stdout.write(json.dumps(event.to_dict(), default=str) + "\n")
            sys.stdout.flush()
        d = event.data
        if event.type is E.AGENT_FINISH:
            self.result = d
        if self.as_json:
            return
        if event.type is E.LLM_DELTA:
            out.print(d["text"], end="", soft_wrap=True, markup=False)
            self.in_text = True
            return
        if event.type in (E.LLM_COMPLETE, E.TOOL_EXECUTION_START, E.ERROR, E.WARNING, E.GUARDRAIL):
            self.end_text()
        if event.type is E.TOOL_EXECUTION_START:
            args = escape(json.dumps(d["arguments"], ensure_ascii=False))
            err.print(f"[cyan]→ {escape(str(d['tool_name']))}[/]({args})")
        elif event.type in (E.TOOL_RESULT, E.TOOL_ERROR):
            mark = "[green]✓[/]" if d["success"] else "[red]✗[/]"
            text = escape(str(d["content"]).replace("\n", " ")[:200])
            name = escape(str(d["tool_name"]))
            err.print(f"  {mark} {name}: {text} [dim]({d['duration_ms']:.0f} ms)[/]")
        elif event.type is E.APPROVAL_REQUIRED and not self.asks_here:
            reason = escape(str(d.get("reason", "")))
            err.print(f"[yellow]approval needed[/] for {escape(str(d.get('tool_name')))}: {reason}")
        elif event.type is E.ERROR:
            err.print(f"[red]error:[/] {escape(str(d.get('error')))}")
        elif event.type is E.WARNING:
            err.print(f"[yellow]warning:[/] {escape(str(d.get('message')))}")
        elif event.type is E.GUARDRAIL and d.get("action") != "pass":  # passes: --json only
            color = {"trip": "red", "fix": "yellow"}.get(str(d.get("action")), "yellow")
            err.print(
                f"[{color}]guardrail {escape(str(d.get('guardrail')))} "
                f"({escape(str(d.get('kind')))}) {escape(str(d.get('action')))}:[/] "
                f"{escape(str(d.get('reason')))}"
            )


def end_of_turn(result: dict[str, Any], session_id: str, as_json: bool) -> None:
    """The one-line summary, and exit code 1 unless the turn completed or waits for approval."""
    if not as_json:
        print_summary(result, session_id)
    if result.get("stop_reason") not in ("completed", "awaiting_approval"):
        raise typer.Exit(code=1)


def _steps(result: dict[str, Any]) -> str:
    """What the run did: a crew's member runs (a crew run has no loop iterations of its own),
    else the turn's iterations."""
    if "member_runs" in result:
        return f"{result['member_runs']} member runs"
    return f"{result.get('iterations', 0)} iterations"


def print_summary(result: dict[str, Any], session_id: str) -> None:
    """One line on stderr: the session, how the turn stopped, tokens, iterations, time."""
    usage = result.get("usage") or {}
    reason = escape(str(result.get("stop_reason")))
    style = "green" if reason == "completed" else "yellow"
    err.print(
        f"[dim]session {escape(session_id)} · [{style}]{reason}[/{style}] · "
        f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens · "
        f"{_steps(result)} · {result.get('duration_ms', 0) / 1000:.1f} s[/]"
    )


def interrupted(what: str) -> typer.Exit:
    """Say ``what`` was interrupted; the exit (code 130) to raise."""
    err.print(f"\n[yellow]interrupted:[/] {what}")
    return typer.Exit(code=EXIT_INTERRUPTED)


def enable_line_editing() -> None:
    """Arrow keys and history for ``input()`` on a terminal."""
    # Arrow keys and history for input() on a terminal; absent on some platforms, and fine so.
    if sys.stdin is not None and sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401
