"""``loom run`` and ``loom chat``: stream an agent's answer live in the terminal."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from loom.agent import Agent
    from loom.events import AgentEvent
    from loom.policy.approval import PendingApproval

# The toolset `loom run` gives an agent that does not name its own: read-only, so nothing in
# the workspace (the current directory unless --workspace says otherwise) changes unasked.
DEFAULT_TOOLS = ["add", "multiply", "current_time", "read_file", "list_dir", "glob", "grep"]
# A 135M model picks tools reliably only from a short list: the embedded model gets this one.
LOCAL_DEFAULT_TOOLS = ["add", "multiply", "current_time"]
DEFAULT_INSTRUCTIONS = (
    "You are a helpful assistant. Use a tool when it helps; answer briefly and plainly."
)

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

AgentOpt = Annotated[
    Path | None, typer.Option("--agent", "-a", help="An AGENT.md or YAML agent definition.")
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model string, e.g. local, openai:gpt-4o-mini, demo."),
]
SessionOpt = Annotated[
    str | None, typer.Option("--session", "-s", help="Continue this session id.")
]
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Session database (default .loom/loom.db); ':memory:' for none."),
]
WorkspaceOpt = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help="Root directory for file tools (default: here)."),
]
ToolsOpt = Annotated[
    str | None,
    typer.Option("--tools", help="Comma-separated built-in tool names (default: a small set)."),
]


def open_store(path: str | None) -> Any:
    """The CLI's store: a SQLite file under .loom/ unless told otherwise."""
    from loom.store.memory import MemoryStore

    if path == ":memory:":
        return MemoryStore()
    try:
        from loom.store.sqlite import SQLiteStore
    except ImportError:  # the SQLite store is not built yet in this checkout
        return MemoryStore()
    target = Path(path) if path else Path(".loom") / "loom.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(target)


def build_agent(
    agent_file: Path | None,
    model: str | None,
    store: Any,
    tools: str | None,
    workspace: Path | None = None,
    approval_handler: Any = None,
) -> Agent:
    from loom.agent import Agent
    from loom.definition import parse_definition

    overrides: dict[str, Any] = {"store": store}
    if approval_handler is not None:
        overrides["approval_handler"] = approval_handler
    if workspace is not None:
        overrides["workspace"] = workspace.resolve()
    elif agent_file is None or parse_definition(agent_file).workspace is None:
        overrides["workspace"] = Path.cwd()
    if model:
        overrides["model"] = model
    tool_names = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    if agent_file is not None:
        if tool_names is not None:
            overrides["tools"] = tool_names
        return Agent.from_file(agent_file, **overrides)
    if tool_names is None:
        spec = model or os.environ.get("LOOM_MODEL") or "local"
        tool_names = LOCAL_DEFAULT_TOOLS if spec.split(":", 1)[0] == "local" else DEFAULT_TOOLS
    overrides.setdefault("tools", tool_names)
    return Agent(name="loom", instructions=DEFAULT_INSTRUCTIONS, **overrides)


def _load_model(agent: Agent) -> None:
    # Loading a local model takes seconds: show it instead of looking frozen.
    with err.status("Loading the model…", spinner="dots"):
        _ = agent.model


class _Renderer:
    """Prints one turn's events: text as it streams, tool calls as they start and end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.in_text = False
        self.result: dict[str, Any] = {}

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
        if self.in_text and event.type in (E.LLM_COMPLETE, E.TOOL_EXECUTION_START, E.ERROR):
            out.print()
            self.in_text = False
        if event.type is E.TOOL_EXECUTION_START:
            args = escape(json.dumps(d["arguments"], ensure_ascii=False))
            err.print(f"[cyan]→ {d['tool_name']}[/]({args})")
        elif event.type in (E.TOOL_RESULT, E.TOOL_ERROR):
            mark = "[green]✓[/]" if d["success"] else "[red]✗[/]"
            text = escape(str(d["content"]).replace("\n", " ")[:200])
            err.print(f"  {mark} {d['tool_name']}: {text} [dim]({d['duration_ms']:.0f} ms)[/]")
        elif event.type is E.APPROVAL_REQUIRED:
            reason = escape(str(d.get("reason", "")))
            err.print(f"[yellow]approval needed[/] for {d.get('tool_name')}: {reason}")
        elif event.type is E.ERROR:
            err.print(f"[red]error:[/] {escape(str(d.get('error')))}")


def _ask_approval(pending: PendingApproval) -> Any:
    """The CLI's approval handler: a Rich prompt on the terminal (blocking; run in a thread)."""
    from rich.prompt import Prompt

    from loom.policy.approval import Approve, Edit, Reject

    args = escape(json.dumps(pending.arguments, ensure_ascii=False))
    err.print(f"[bold yellow]Allow[/] [cyan]{pending.tool_name}[/]({args})?")
    try:
        answer = Prompt.ask(
            "  [y]es, [n]o, [a]lways in this session, [e]dit arguments",
            choices=["y", "n", "a", "e"],
            default="n",
            console=err,
        )
        if answer == "y":
            return Approve()
        if answer == "a":
            return Approve(remember=True)
        if answer == "e":
            while True:
                text = Prompt.ask("  new arguments (JSON object)", default=args, console=err)
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    err.print(f"  [red]not JSON:[/] {exc}")
                    continue
                if isinstance(value, dict):
                    return Edit(value)
                err.print("  [red]give a JSON object[/]")
        reason = Prompt.ask("  reason for the model (optional)", default="", console=err)
        return Reject(reason or "the user said no")
    except (EOFError, KeyboardInterrupt):
        return Reject("no answer: the terminal's input is closed")


async def ask_approval(pending: PendingApproval) -> Any:
    return await asyncio.to_thread(_ask_approval, pending)


async def _render(events: AsyncIterator[AgentEvent], as_json: bool) -> dict[str, Any]:
    """Print a turn's events; return the AGENT_FINISH data."""
    render = _Renderer(as_json)
    async for event in events:
        render(event)
    return render.result


async def _turn(agent: Agent, message: str, session: str | None, as_json: bool) -> dict[str, Any]:
    return await _render(agent.stream(message, session_id=session), as_json)


async def _render_and_close(
    agent: Agent, events: AsyncIterator[AgentEvent], as_json: bool
) -> dict[str, Any]:
    try:
        return await _render(events, as_json)
    finally:
        await agent.aclose()  # stop MCP servers before the event loop ends


def _end(result: dict[str, Any], session_id: str, as_json: bool) -> None:
    """The one-line summary, and exit code 1 unless the turn completed or waits for approval."""
    if not as_json:
        _summary(result, session_id)
    if result.get("stop_reason") not in ("completed", "awaiting_approval"):
        raise typer.Exit(code=1)


def _summary(result: dict[str, Any], session_id: str) -> None:
    usage = result.get("usage") or {}
    reason = result.get("stop_reason")
    style = "green" if reason == "completed" else "yellow"
    err.print(
        f"[dim]session {session_id} · [{style}]{reason}[/{style}] · "
        f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens · "
        f"{result.get('iterations', 0)} iterations · {result.get('duration_ms', 0) / 1000:.1f} s[/]"
    )


def _fail(exc: Exception) -> None:
    err.print(f"[red]{type(exc).__name__}:[/] {escape(str(exc))}")
    raise typer.Exit(code=2)


def run(
    message: Annotated[str, typer.Argument(help="What to ask the agent.")],
    agent_file: AgentOpt = None,
    model: ModelOpt = None,
    session: SessionOpt = None,
    store: StoreOpt = None,
    tools: ToolsOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every event as JSON.")] = False,
) -> None:
    """Run one turn and stream the answer."""
    from loom.errors import LoomError
    from loom.messages import new_id

    try:
        agent = build_agent(agent_file, model, open_store(store), tools, workspace, ask_approval)
        _load_model(agent)
        session_id = session or new_id("session")
        events = agent.stream(message, session_id=session_id)
        result = asyncio.run(_render_and_close(agent, events, as_json))
    except LoomError as exc:
        _fail(exc)
        return
    _end(result, session_id, as_json)


def chat(
    agent_file: AgentOpt = None,
    model: ModelOpt = None,
    session: SessionOpt = None,
    store: StoreOpt = None,
    tools: ToolsOpt = None,
    workspace: WorkspaceOpt = None,
) -> None:
    """Talk with an agent in one session; an empty line or Ctrl-D ends."""
    from loom.errors import LoomError
    from loom.messages import new_id

    try:
        agent = build_agent(agent_file, model, open_store(store), tools, workspace, ask_approval)
        _load_model(agent)
    except LoomError as exc:
        _fail(exc)
        return
    session_id = session or new_id("session")
    err.print(f"[dim]session {session_id}; empty line to quit[/]")

    async def loop() -> None:
        try:
            await chat_loop()
        finally:
            await agent.aclose()

    async def chat_loop() -> None:
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                return
            if not line.strip():
                return
            try:
                result = await _turn(agent, line, session_id, False)
            except LoomError as exc:
                err.print(f"[red]{type(exc).__name__}:[/] {escape(str(exc))}")
                continue
            _summary(result, session_id)

    asyncio.run(loop())


def resume(
    session: Annotated[str, typer.Argument(help="The session that waits for approval.")],
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve every pending call without asking.")
    ] = False,
    reject: Annotated[
        str | None,
        typer.Option(
            "--reject", metavar="REASON", help="Reject every pending call; the model reads REASON."
        ),
    ] = None,
    agent_file: AgentOpt = None,
    model: ModelOpt = None,
    store: StoreOpt = None,
    tools: ToolsOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every event as JSON.")] = False,
) -> None:
    """Decide the tool calls a paused session waits on, and continue its turn."""
    from loom.errors import InputError, LoomError
    from loom.policy.approval import Reject

    if approve and reject is not None:
        _fail(InputError("give --approve or --reject, not both"))
    try:
        agent = build_agent(agent_file, model, open_store(store), tools, workspace, ask_approval)
        pending = asyncio.run(agent.pending_approvals(session))
        if not pending:
            raise InputError(
                f"session {session!r} has no tool call waiting for approval; "
                "see `loom sessions show` for its state"
            )
        if approve:
            decisions: Any = True
        elif reject is not None:
            decisions = Reject(reject or "the user said no")
        else:  # ask about each call, as `loom run` would have
            decisions = {p.tool_call_id: _ask_approval(p) for p in pending}
        _load_model(agent)

        events = agent.resume_stream(session, decisions)
        result = asyncio.run(_render_and_close(agent, events, as_json))
    except LoomError as exc:
        _fail(exc)
        return
    _end(result, session, as_json)
