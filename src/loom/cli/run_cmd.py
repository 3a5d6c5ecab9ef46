"""``loom run``, ``loom chat`` and ``loom resume``: stream an agent's answer live in the terminal.

Ctrl-C: stops the run (exit code 130) wherever it comes, model load included; in ``loom chat`` it
stops the answer and returns to the prompt, and at the prompt it clears the line.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from loom.cli._console import err, fail, out, say_error
from loom.cli.attach import attach_command, content_blocks, with_attachments
from loom.cli.chat_branch import HELP, branch_input, is_branch_command
from loom.cli.turn_output import (
    Renderer,
    enable_line_editing,
    end_of_turn,
    interrupted,
    print_summary,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from loom.agent import Agent
    from loom.content import Audio, File, Image
    from loom.embedding.base import Embedder
    from loom.engine.run_inputs import Input
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

AgentOpt = Annotated[
    str | None,
    typer.Option(
        "--agent",
        "-a",
        help="An AGENT.md or YAML agent definition, or an agent built in Python: "
        "module:attr or file.py[:attr] (an Agent, or a function returning one).",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model string, e.g. local, openai:gpt-4o-mini, demo."),
]
SessionOpt = Annotated[
    str | None,
    typer.Option("--session", "-s", help="Continue this existing session (with --new: create it)."),
]
NewOpt = Annotated[
    bool,
    typer.Option("--new", "--create", help="Start a new session named by --session."),
]
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Session database (default .loom/loom.db); ':memory:' for none."),
]
WorkspaceOpt = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help="Root directory for file tools (default: here)."),
]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="Run on a `loom serve` at this URL (e.g. http://127.0.0.1:8000); --agent then "
        "names one of its agents and --session one of its threads.",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="LOOM_API_KEY",
        help="The key to present to a `loom serve` that has keys (with --server; or set "
        "LOOM_API_KEY); sent as Authorization: Bearer.",
        show_envvar=True,
    ),
]
AttachOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--attach",
        metavar="FILE",
        help="Attach a file to the message (repeatable): an image (PNG, JPEG, GIF, WebP), a PDF "
        "or other document, audio (WAV, MP3, FLAC, OGG).",
    ),
]
ToolsOpt = Annotated[
    str | None,
    typer.Option(
        "--tools", help="Comma-separated built-in tool names; '' for none (default: a small set)."
    ),
]


def open_store(path: str | None, embedder: Embedder | None = None) -> Any:
    """The CLI's store: a SQLite file under .loom/ unless told otherwise (a postgres:// URL
    for PostgreSQL). Its items are embedded for semantic search by ``embedder``, else by the
    one ``LOOM_EMBEDDER`` names (``loom.store.items_vectors.embedder_from_env``; unset:
    keyword search only)."""
    from loom.store.items_vectors import embedder_from_env
    from loom.store.memory import MemoryStore

    embedder = embedder if embedder is not None else embedder_from_env()
    if path == ":memory:":
        return MemoryStore(embedder=embedder)
    if path is not None and path.startswith(("postgres://", "postgresql://")):
        from loom.store.postgres import PostgresStore

        return PostgresStore(path, embedder=embedder)
    from loom.store.sqlite import SQLiteStore

    if path is None:  # the default folder is Loom's own: make it
        target = Path(".loom") / "loom.db"
        target.parent.mkdir(parents=True, exist_ok=True)
        return SQLiteStore(target, embedder=embedder)
    target = Path(path)
    if not target.parent.is_dir():
        from loom.errors import ConfigurationError

        raise ConfigurationError(
            f"--store {path}: the folder {target.parent} does not exist; create it first or "
            "name a file in an existing folder (Loom makes only its default .loom/ folder)"
        )
    return SQLiteStore(target, embedder=embedder)


_DEFINITION_SUFFIXES = (".md", ".yaml", ".yml")
# module:attr (a dotted module name) or path/to/file.py[:attr].
_PYTHON_SPEC = re.compile(r"^(?P<target>[\w.]+|.+\.py)(?::(?P<attr>[A-Za-z_]\w*))?$")


def is_python_agent(spec: str) -> bool:
    """Whether ``--agent`` names a Python agent (module:attr, file.py[:attr]), not a file."""
    if spec.lower().endswith(_DEFINITION_SUFFIXES):
        return False
    m = _PYTHON_SPEC.match(spec)
    return m is not None and (m["attr"] is not None or m["target"].endswith(".py"))


def _import_target(target: str) -> Any:
    from loom.errors import ConfigurationError

    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ConfigurationError(f"--agent {target}: no such Python file")
        # A script's siblings import as they would under `python file.py`.
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(f"_loom_agent_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ConfigurationError(f"--agent {target}: Python cannot load this file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: modules in the current directory
    return importlib.import_module(target)


def load_python_agent(spec: str, settings: dict[str, Any]) -> Agent:
    """The Agent named by ``module:attr`` or ``file.py[:attr]`` (attr defaults to ``agent``).

    ``attr`` is an ``Agent`` (used as it is built: its own model, tools and store) or a function
    called with the command line's settings as keywords (``store``, ``workspace``,
    ``approval_handler``, and ``model`` / ``tools`` when given) that returns an Agent.
    """
    from loom.agent import Agent
    from loom.errors import ConfigurationError, LoomError

    m = _PYTHON_SPEC.match(spec)
    assert m is not None  # is_python_agent() said so
    target, attr = m["target"], m["attr"] or "agent"
    try:
        module = _import_target(target)
    except LoomError:
        raise
    except Exception as exc:  # the user's module failed to import: say which and why
        raise ConfigurationError(
            f"--agent {spec}: importing {target!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigurationError(
            f"--agent {spec}: {target!r} has no attribute {attr!r}; name the Agent (or the "
            "function that builds it) after a colon, e.g. my_agents:support"
        )
    if isinstance(obj, Agent):
        given = [f"--{k}" for k in ("model", "tools") if k in settings]
        if given:
            raise ConfigurationError(
                f"--agent {spec} is an Agent already built, so {' and '.join(given)} cannot "
                "change it; make it a function that takes the settings as keywords instead"
            )
        if obj.approval_handler is None and settings.get("approval_handler") is not None:
            # an Agent is frozen (shared by every session): ask on this terminal through a
            # copy, the user's object stays as they built it
            return obj.replace(approval_handler=settings["approval_handler"])
        return obj
    if not callable(obj):
        raise ConfigurationError(
            f"--agent {spec}: {attr!r} is a {type(obj).__name__}; it must be an Agent or a "
            "function returning one"
        )
    try:
        built = obj(**settings)
    except LoomError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"--agent {spec}: {attr}(**settings) failed: {type(exc).__name__}: {exc}. It is "
            f"called with the keywords {', '.join(sorted(settings))}"
        ) from exc
    if not isinstance(built, Agent):
        raise ConfigurationError(
            f"--agent {spec}: {attr}() returned a {type(built).__name__}, not an Agent"
        )
    return built


def parse_tools(tools: str | None) -> list[str] | None:
    """``--tools``: None when not given (the default set); ``''`` means no tools at all."""
    if tools is None:
        return None
    return [t.strip() for t in tools.split(",") if t.strip()]


def build_agent(
    agent_file: str | None,
    model: str | None,
    store: Any,
    tools: str | None,
    workspace: Path | None = None,
    approval_handler: Any = None,
) -> Agent:
    """The agent a command runs: from ``--agent`` (a definition file or Python) or the default."""
    from loom.agent import Agent
    from loom.definition import parse_definition

    overrides: dict[str, Any] = {"store": store}
    if approval_handler is not None:
        overrides["approval_handler"] = approval_handler
    tool_names = parse_tools(tools)
    if agent_file is not None and is_python_agent(agent_file):
        overrides["workspace"] = (workspace or Path.cwd()).resolve()
        if model:
            overrides["model"] = model
        if tool_names is not None:
            overrides["tools"] = tool_names
        return load_python_agent(agent_file, overrides)
    path = Path(agent_file) if agent_file is not None else None
    if workspace is not None:
        overrides["workspace"] = workspace.resolve()
    elif path is None or parse_definition(path).workspace is None:
        overrides["workspace"] = Path.cwd()
    if model:
        overrides["model"] = model
    if path is not None:
        if tool_names is not None:
            overrides["tools"] = tool_names
        return Agent.from_file(path, **overrides)
    if tool_names is None:
        spec = model or os.environ.get("LOOM_MODEL") or "local"
        tool_names = LOCAL_DEFAULT_TOOLS if spec.split(":", 1)[0] == "local" else DEFAULT_TOOLS
    overrides.setdefault("tools", tool_names)
    return Agent(name="loom", instructions=DEFAULT_INSTRUCTIONS, **overrides)


def with_backends(agent: Agent, specs: list[str], *, only: bool) -> Agent:
    """``agent`` with the ``--backend`` backends added (``only``: without its default tools,
    so a small model sees just the backend's operations)."""
    from loom.backends.config import backend_from_config

    made = [backend_from_config(spec) for spec in specs]
    changes: dict[str, Any] = {"backends": [*agent.backends, *made]}
    if only:
        changes["tools"] = []
    return agent.replace(**changes)


def choose_session(store: Any, session: str | None, new: bool) -> str:
    """The session a turn runs in: ``--session`` must exist unless ``--new`` asks to create it.

    A misspelt id used to start a fresh, empty session without a word.
    """
    from loom.errors import InputError, SessionNotFound
    from loom.messages import new_id

    if session is None:
        return new_id("session")
    exists = asyncio.run(store.get_session(session)) is not None
    if new and exists:
        raise InputError(
            f"session {session!r} already exists; drop --new to continue it, or pick another id"
        )
    if not new and not exists:
        raise SessionNotFound(
            f"no session {session!r} in this store; see `loom sessions list`, or add --new to "
            "start a session with that id"
        )
    return session


def _load_model(agent: Agent) -> None:
    """Resolve (for the local model: load) the agent's model, showing that it is happening.

    The load runs in a worker thread. In the main thread, llama.cpp's load let Ctrl-C land in a
    Python callback it makes, where the KeyboardInterrupt was swallowed and the run went on.
    While it loads, Ctrl-C only sets a flag (a KeyboardInterrupt raised inside Rich's spinner
    could leave the console holding back later output); the main thread sees the flag within
    50 ms, stops the spinner cleanly and raises KeyboardInterrupt. The abandoned load cannot be
    stopped (it is C code in a thread); the process ends once it is out of llama.cpp.
    """
    done = threading.Event()
    failed: list[BaseException] = []
    interrupted: list[bool] = []

    def load() -> None:
        try:
            _ = agent.model
        except BaseException as exc:  # handed to the main thread, which raises it
            failed.append(exc)
        finally:
            done.set()

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.append(True)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
    private = _private_stderr()
    try:
        with err.status("Loading the model…", spinner="dots"):
            threading.Thread(target=load, name="loom-model-load", daemon=True).start()
            while not done.wait(0.05) and not interrupted:
                pass
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
        if private is not None and not interrupted:
            err.file = None  # type: ignore[assignment]  # back to following sys.stderr
            private.close()
    if interrupted:
        raise KeyboardInterrupt
    if failed:
        raise failed[0]


def _private_stderr() -> IO[str] | None:
    """Point ``err`` at a copy of the stderr descriptor while a model loads, and return it.

    llama-cpp-python silences a load by pointing descriptors 1 and 2 (and sys.stdout/stderr)
    at /dev/null until it returns: the spinner and, after Ctrl-C, the message saying the run
    was stopped went there while the abandoned load went on. The copy stays in place after an
    interrupt, for the process's last words. None when stderr has no descriptor (tests).
    """
    try:
        fd = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    private = os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1)
    err.file = private
    return private


async def read_line(prompt: str) -> str:
    """Print ``prompt`` (Rich markup) on stderr and read one line of stdin; EOFError at its end.

    On a terminal the line is read by the event loop (``add_reader``), not by a thread: Ctrl-C
    cancels the wait and nothing is left blocked on the terminal to eat the next line typed.
    """
    err.print(prompt, end="")
    stdin = sys.stdin
    if stdin is None:
        raise EOFError
    try:
        fd = stdin.fileno()
        terminal = os.isatty(fd)
    except (OSError, ValueError):  # replaced by something without a file descriptor
        fd, terminal = -1, False
    if not terminal:
        line: str = await asyncio.to_thread(stdin.readline)
        if not line:
            raise EOFError
        return line.rstrip("\n")
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bytes] = loop.create_future()
    buffer = bytearray()

    def readable() -> None:
        chunk = os.read(fd, 4096)
        buffer.extend(chunk)
        if not ready.done() and (not chunk or b"\n" in chunk):
            ready.set_result(bytes(buffer))

    loop.add_reader(fd, readable)
    try:
        data = await ready
    finally:
        loop.remove_reader(fd)
    if not data:  # Ctrl-D on an empty line
        raise EOFError
    return data.decode(errors="replace").rstrip("\n")


_CHOICES = escape("[y]es, [n]o, [a]lways in this session, [e]dit arguments [y/n/a/e] (n): ")


async def ask_approval(pending: PendingApproval) -> Any:
    """The CLI's approval handler: asks on the terminal. Ctrl-C raises (nothing is decided)."""
    from loom.policy.approval import Approve, Edit, Reject

    raw = json.dumps(pending.arguments, ensure_ascii=False)
    why = f" [dim]({escape(pending.reason)})[/]" if pending.reason else ""
    err.print(f"[bold yellow]Allow[/] [cyan]{escape(pending.tool_name)}[/]({escape(raw)})?{why}")
    try:
        while True:
            answer = (await read_line("  " + _CHOICES)).strip().lower() or "n"
            if answer in ("y", "n", "a", "e", "yes", "no", "always", "edit"):
                break
            err.print("  [red]answer y, n, a or e[/]")
        if answer[0] == "y":
            return Approve()
        if answer[0] == "a":
            return Approve(remember=True)
        if answer[0] == "e":
            while True:
                text = await read_line(
                    f"  new arguments (JSON object; empty keeps {escape(raw)}): "
                )
                if not text.strip():
                    return Edit(dict(pending.arguments))
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    err.print(f"  [red]not JSON:[/] {escape(str(exc))}")
                    continue
                if isinstance(value, dict):
                    return Edit(value)
                err.print("  [red]give a JSON object[/]")
        reason = await read_line("  reason for the model (optional): ")
        return Reject(reason.strip() or "the user said no")
    except EOFError:
        err.print()
        return Reject("no answer: the terminal's input is closed")


async def _render(
    events: AsyncIterator[AgentEvent], as_json: bool, *, asks_here: bool = False
) -> dict[str, Any]:
    """Print a turn's events; return the AGENT_FINISH data."""
    render = Renderer(as_json, asks_here=asks_here)
    try:
        async for event in events:
            render(event)
    except BaseException:
        render.end_text()  # a cut answer still ends its line
        raise
    finally:
        # Closed here, not left to garbage collection: a stream abandoned by Ctrl-C would
        # keep the session's lock until it was collected.
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    return render.result


async def _turn(agent: Agent, message: Input, session: str | None, as_json: bool) -> dict[str, Any]:
    asks = agent.approval_handler is ask_approval
    return await _render(agent.stream(message, session_id=session), as_json, asks_here=asks)


async def _render_and_close(
    agent: Agent, events: AsyncIterator[AgentEvent], as_json: bool
) -> dict[str, Any]:
    try:
        asks = agent.approval_handler is ask_approval
        return await _render(events, as_json, asks_here=asks)
    finally:
        await agent.aclose()  # stop MCP servers before the event loop ends


def run(
    message: Annotated[str, typer.Argument(help="What to ask the agent.")],
    agent_file: AgentOpt = None,
    model: ModelOpt = None,
    session: SessionOpt = None,
    new: NewOpt = False,
    store: StoreOpt = None,
    tools: ToolsOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every event as JSON.")] = False,
    server: ServerOpt = None,
    api_key: ApiKeyOpt = None,
    attach: AttachOpt = None,
    crew: Annotated[
        Path | None,
        typer.Option("--crew", help="Run a crew file (YAML) instead of one agent."),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            help="A domain backend (repeatable): a database URL "
            "(sqlite:///shop.db), openapi:FILE_OR_URL or docs:FOLDER; see "
            "docs/backends.md. Without --agent/--tools only its tools are offered.",
        ),
    ] = None,
) -> None:
    """Run one turn and stream the answer. Ctrl-C stops it (exit code 130)."""
    from loom.errors import LoomError

    if crew is not None:
        from loom.cli.crew_cmd import run_crew
        from loom.errors import InputError

        try:
            clash = {
                "--agent": agent_file,
                "--model": model,
                "--tools": tools,
                "--workspace": workspace,
                "--server": server,
            }
            bad = [k for k, v in clash.items() if v is not None]
            if attach:
                bad.append("--attach")
            if bad:
                raise InputError(
                    f"{', '.join(bad)} cannot be used with --crew: the crew file "
                    "defines its members' models and tools"
                )
            the_store = open_store(store)
            session_id = choose_session(the_store, session, new)
            result = run_crew(crew, message, the_store, session_id, as_json)
        except LoomError as exc:
            raise fail(exc, 2) from None
        except KeyboardInterrupt:
            raise interrupted("the crew was stopped") from None
        return end_of_turn(result, session_id, as_json)
    if server is not None:
        from loom.cli.remote import run_remote

        _local_only(model=model, store=store, tools=tools, workspace=workspace)
        try:
            content = content_blocks(with_attachments(message, attach))
        except LoomError as exc:
            raise fail(exc, 2) from None
        return run_remote(
            server, message, agent_file, session, new, as_json, api_key=api_key, content=content
        )

    try:
        given = with_attachments(message, attach)  # a bad file stops here, before any work
        the_store = open_store(store)
        agent = build_agent(agent_file, model, the_store, tools, workspace, ask_approval)
        if backend:
            agent = with_backends(agent, backend, only=agent_file is None and tools is None)
        session_id = choose_session(the_store, session, new)
        _load_model(agent)
        events = agent.stream(given, session_id=session_id)
        result = asyncio.run(_render_and_close(agent, events, as_json))
    except LoomError as exc:
        raise fail(exc, 2) from None
    except KeyboardInterrupt:
        raise interrupted("the run was stopped") from None
    end_of_turn(result, session_id, as_json)


def _local_only(**given: Any) -> None:
    """``--server`` runs the server's agent: options that build a local one cannot apply."""
    from loom.errors import InputError

    bad = [f"--{k}" for k, v in given.items() if v is not None]
    if bad:
        what = ", ".join(bad)
        problem = InputError(
            f"{what} cannot be used with --server (the server's agent runs there, on its own "
            "model, tools and store)"
        )
        raise fail(problem, 2)


def chat(
    agent_file: AgentOpt = None,
    model: ModelOpt = None,
    session: SessionOpt = None,
    new: NewOpt = False,
    store: StoreOpt = None,
    tools: ToolsOpt = None,
    workspace: WorkspaceOpt = None,
    server: ServerOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Chat in one session. Ctrl-C stops an answer or clears the line; Ctrl-D quits."""
    from loom.errors import LoomError

    if server is not None:
        from loom.cli.remote import chat_remote

        _local_only(model=model, store=store, tools=tools, workspace=workspace)
        return chat_remote(server, agent_file, session, new, api_key=api_key)

    try:
        the_store = open_store(store)
        agent = build_agent(agent_file, model, the_store, tools, workspace, ask_approval)
        session_id = choose_session(the_store, session, new)
        _load_model(agent)
    except LoomError as exc:
        raise fail(exc, 2) from None
    except KeyboardInterrupt:
        raise interrupted("stopped while starting") from None
    err.print(
        f"[dim]session {escape(session_id)}; Ctrl-C stops an answer or clears the line, "
        "Ctrl-D quits; /attach FILE attaches a file to your next message; "
        f"{escape(HELP)}[/]"
    )
    attached: list[Image | File | Audio] = []  # what /attach gave, for the next message
    enable_line_editing()
    # One event loop for the whole chat, and input() read outside it: between turns Ctrl-C is
    # an ordinary KeyboardInterrupt at the prompt; during a turn the Runner turns it into a
    # cancellation of that turn alone.
    with asyncio.Runner() as runner:
        try:
            while True:
                try:
                    line = input("you> ")
                except KeyboardInterrupt:
                    out.print()  # the typed line is dropped: a fresh prompt
                    continue
                except EOFError:
                    out.print()
                    return
                if not line.strip():
                    continue
                if line.startswith("/attach"):
                    attach_command(line, attached)
                    continue
                given: Input = line
                if is_branch_command(line):  # /undo, /retry, /edit TEXT (loom.cli.chat_branch)
                    try:
                        given = branch_input(line, runner.run(the_store.load_messages(session_id)))
                    except LoomError as exc:
                        say_error(exc)
                        continue
                elif attached:
                    from loom.engine.run_inputs import NewMessage

                    given, attached = NewMessage(line, tuple(attached)), []
                try:
                    result = runner.run(_turn(agent, given, session_id, False))
                except KeyboardInterrupt:
                    err.print("[yellow]stopped[/]")
                    continue
                except LoomError as exc:
                    say_error(exc)
                    continue
                print_summary(result, session_id)
        finally:
            runner.run(agent.aclose())


async def _known_tools(agent: Agent) -> set[str]:
    """Every tool name the agent can call, including those its tool servers (MCP) provide."""
    names = set(agent.tools)
    for spec in agent.toolsets:
        try:  # the runtime's own connection, closed with it (agent.aclose())
            names.update(t.name for t in await agent.runtime.toolset(spec).load_tools())
        except Exception:  # the server is down: its calls cannot run now, so they count unknown
            continue
    return names


async def _check_resumable(agent: Agent, session: str) -> list[PendingApproval]:
    """The pending calls, after making sure this agent can run every one of them.

    Deciding a call the agent does not have would use up the approval and fail the call with
    ``unknown_tool``, leaving the program that paused the session nothing to resume.
    """
    from loom.errors import InputError

    pending = await agent.pending_approvals(session)
    if not pending:
        raise InputError(
            f"session {session!r} has no tool call waiting for approval; "
            "see `loom sessions show` for its state"
        )
    missing = sorted({p.tool_name for p in pending} - await _known_tools(agent))
    if missing:
        await agent.aclose()
        have = ", ".join(sorted(agent.tools)) or "none"
        raise InputError(
            f"session {session!r} waits on {', '.join(repr(n) for n in missing)}, a tool this "
            f"agent does not have (its tools: {have}); nothing was decided. Pass the agent "
            "that paused the session with --agent: an AGENT.md, or module:attr / file.py:attr "
            "for an agent built in Python"
        )
    return pending


async def _ask_each(pending: list[PendingApproval]) -> dict[str, Any]:
    return {p.tool_call_id: await ask_approval(p) for p in pending}


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
    """Decide the tool calls a paused session waits on, and continue its turn.

    Ctrl-C while asking decides nothing: the calls keep waiting (exit code 130).
    """
    from loom.errors import InputError, LoomError
    from loom.policy.approval import Reject

    if approve and reject is not None:
        raise fail(InputError("give --approve or --reject, not both"), 2)
    decided = False
    try:
        agent = build_agent(agent_file, model, open_store(store), tools, workspace, ask_approval)
        pending = asyncio.run(_check_resumable(agent, session))
        if approve:
            decisions: Any = True
        elif reject is not None:
            decisions = Reject(reject or "the user said no")
        else:  # ask about each call, as `loom run` would have
            decisions = asyncio.run(_ask_each(pending))
        _load_model(agent)
        decided = True
        events = agent.resume_stream(session, decisions)
        result = asyncio.run(_render_and_close(agent, events, as_json))
    except LoomError as exc:
        raise fail(exc, 2) from None
    except KeyboardInterrupt:
        if decided:
            raise interrupted("the resumed run was stopped") from None
        raise interrupted(
            f"nothing was decided; the calls still wait (loom resume {session})"
        ) from None
    end_of_turn(result, session, as_json)
