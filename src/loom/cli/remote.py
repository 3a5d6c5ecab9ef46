"""``loom run --server URL`` and ``loom chat --server URL``: a turn on a running ``loom serve``.

The turn runs on the server (``POST /threads/{id}/runs/stream``, stream mode ``events``); each
``events`` payload is a Loom event in its stable JSON form, turned back into an ``AgentEvent``
and printed by the same renderer as a local run, so the output and the exit codes are the same.
``--agent`` names one of the server's agents (optional when it serves one). ``--session`` is the
thread: it must exist unless ``--new`` asks to create it. Ctrl-C closes the stream, which
cancels the run on the server (``on_disconnect: "cancel"``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.markup import escape

from loom.cli._console import err, fail, out, say_error
from loom.errors import InputError, LoomError, SessionBusy, SessionNotFound

__all__ = ["ServerError", "chat_remote", "run_remote"]


class ServerError(LoomError):
    """The server refused a request or could not be reached."""


def _refusal(status: int, body: bytes) -> LoomError:
    try:
        error = json.loads(body)["error"]
        message = f"{error['type']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace")[:500] or f"HTTP {status}"
    if status == 404:
        return SessionNotFound(message) if "thread" in message else InputError(message)
    if status == 409:
        return SessionBusy(message)
    if status in (400, 422):
        return InputError(message)
    if status in (401, 403):
        return ServerError(
            f"the server answered {status}: {message} (give its key with --api-key KEY or "
            "the LOOM_API_KEY environment variable)"
        )
    return ServerError(f"the server answered {status}: {message}")


class Remote:
    """One server, one thread."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(30, read=None), headers=headers
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = await self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the server at {self.url}: {exc}") from None
        if r.status_code >= 400:
            raise _refusal(r.status_code, r.content)
        return r.json()

    async def agent(self, name: str | None) -> str:
        agents = [
            a["assistant_id"]
            for a in await self._request("POST", "/assistants/search", json={"limit": 1000})
        ]
        if name is None:
            if len(agents) == 1:
                return str(agents[0])
            raise InputError(
                f"the server serves {len(agents)} agents; pick one with --agent: "
                + ", ".join(agents)
            )
        if name not in agents:
            raise InputError(f"the server has no agent {name!r}; its agents: {', '.join(agents)}")
        return name

    async def session(self, session: str | None, new: bool) -> str:
        from loom.messages import new_id

        if session is None:
            return new_id("session")
        import httpx

        try:
            r = await self.http.get(f"/threads/{session}")
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the server at {self.url}: {exc}") from None
        exists = r.status_code == 200
        if r.status_code not in (200, 404):
            raise _refusal(r.status_code, r.content)
        if new and exists:
            raise InputError(
                f"session {session!r} already exists; drop --new to continue it, or pick another id"
            )
        if not new and not exists:
            raise SessionNotFound(
                f"no session {session!r} on {self.url}; add --new to start a session with that id"
            )
        return session

    async def turn(
        self, agent: str, thread_id: str, message: str | list[dict[str, Any]], as_json: bool
    ) -> dict[str, Any]:
        """Run one turn on the server and print its events; the AGENT_FINISH data.
        ``message``: text, or LangChain content blocks (text and attached files)."""
        import httpx

        from loom.cli.turn_output import Renderer
        from loom.events import AgentEvent

        body = {
            "assistant_id": agent,
            "input": {"messages": [{"role": "user", "content": message}]},
            "stream_mode": ["events"],
            "on_disconnect": "cancel",
            "if_not_exists": "create",
        }
        render = Renderer(as_json)
        try:
            async with self.http.stream(
                "POST", f"/threads/{thread_id}/runs/stream", json=body
            ) as r:
                if r.status_code >= 400:
                    raise _refusal(r.status_code, await r.aread())
                kind = ""
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "events":
                        render(AgentEvent.from_dict(json.loads(line[6:])))
                    elif line.startswith("data: ") and kind == "error":
                        error = json.loads(line[6:])
                        raise ServerError(f"{error.get('error')}: {error.get('message')}")
        except httpx.HTTPError as exc:
            raise ServerError(f"lost the server at {self.url}: {exc}") from None
        finally:
            render.end_text()
        if not render.result:
            raise ServerError("the server's stream ended before the run finished")
        return render.result


def run_remote(
    url: str,
    message: str,
    agent: str | None,
    session: str | None,
    new: bool,
    as_json: bool,
    *,
    api_key: str | None = None,
    content: list[dict[str, Any]] | None = None,
) -> None:
    """``loom run --server URL`` (``content``: the message as content blocks, with the files
    ``--attach`` gave)."""
    from loom.cli.turn_output import end_of_turn, interrupted

    async def main() -> tuple[dict[str, Any], str]:
        remote = Remote(url, api_key)
        try:
            name = await remote.agent(agent)
            thread_id = await remote.session(session, new)
            return await remote.turn(name, thread_id, content or message, as_json), thread_id
        finally:
            await remote.aclose()

    try:
        result, thread_id = asyncio.run(main())
    except LoomError as exc:
        raise fail(exc, 2) from None
    except KeyboardInterrupt:
        raise interrupted("the run was stopped") from None
    end_of_turn(result, thread_id, as_json)


def chat_remote(
    url: str, agent: str | None, session: str | None, new: bool, *, api_key: str | None = None
) -> None:
    """``loom chat --server URL``."""
    from loom.cli.attach import attach_command, content_blocks
    from loom.cli.chat_branch import is_branch_command
    from loom.cli.turn_output import enable_line_editing, interrupted, print_summary
    from loom.content import Audio, File, Image
    from loom.engine.run_inputs import NewMessage

    attached: list[Image | File | Audio] = []  # what /attach gave, for the next message

    with asyncio.Runner() as runner:
        remote = Remote(url, api_key)
        try:
            try:
                name = runner.run(remote.agent(agent))
                thread_id = runner.run(remote.session(session, new))
            except LoomError as exc:
                raise fail(exc, 2) from None
            except KeyboardInterrupt:
                raise interrupted("stopped while starting") from None
            err.print(
                f"[dim]session {escape(thread_id)} on {escape(remote.url)} ({escape(name)}); "
                "Ctrl-C stops an answer or clears the line, Ctrl-D quits; /attach FILE attaches "
                "a file to your next message[/]"
            )
            enable_line_editing()
            while True:
                try:
                    line = input("you> ")
                except KeyboardInterrupt:
                    out.print()
                    continue
                except EOFError:
                    out.print()
                    return
                if not line.strip():
                    continue
                if line.startswith("/attach"):  # for the next message, as in a local chat
                    attach_command(line, attached)
                    continue
                if is_branch_command(line):
                    err.print(
                        "[yellow]/undo, /retry and /edit work in a local chat only for now; "
                        "over --server, use the console's regenerate and edit[/]"
                    )
                    continue
                given: str | list[dict[str, Any]] = line
                if attached:
                    given = content_blocks(NewMessage(line, tuple(attached))) or line
                    attached.clear()
                try:
                    result = runner.run(remote.turn(name, thread_id, given, False))
                except KeyboardInterrupt:
                    err.print("[yellow]stopped[/]")
                    continue
                except LoomError as exc:
                    say_error(exc)
                    continue
                print_summary(result, thread_id)
        except typer.Exit:
            raise
        finally:
            runner.run(remote.aclose())
