"""What a parked run says to a client that has no native way to show it.

A run stops ``awaiting_approval`` (tool calls wait for a human decision) or ``awaiting_input``
(the model asked the client something: a server query). Protocols with their own vocabulary
for this (LangGraph interrupts, AG-UI interrupt outcomes, A2A ``input-required``, MCP
elicitation) use it; the ones without (an OpenAI chat completion, an MCP client without
elicitation) get a plain-text message from here: which calls wait, or what was asked, and
exactly how to decide or answer them, so that a human reading the reply knows what to do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

__all__ = ["describe_parked", "describe_pending_calls", "describe_query"]


def _path_segment(value: str) -> str:
    return quote(value, safe="")


def describe_pending_calls(
    session_id: str, pending: Sequence[Mapping[str, Any]], *, over_http: bool = True
) -> str:
    """The calls waiting for approval and how to decide them.

    ``over_http`` names the server's endpoints; without it (``loom mcp`` over stdio, where no
    HTTP server exists) the command line's ``loom resume``."""
    lines = [
        f"- {p.get('tool_name', '?')}({json.dumps(p.get('arguments', {}))}), call id "
        f"{p.get('tool_call_id', '?')}: {p.get('reason') or 'it needs approval'}"
        for p in pending
    ]
    calls = "call" if len(pending) == 1 else "calls"
    head = f"The run is waiting for approval of {len(pending)} tool {calls} (session {session_id}):"
    if over_http:
        how = (
            f"Decide each call with POST /threads/{_path_segment(session_id)}/approvals/<call id> "
            'and the body {"decision": "approve"} or {"decision": "reject", "reason": "..."} '
            '(or POST /v1/weave:answer with {"session_id", "call_id", "decision"}); the run '
            "resumes once every call is decided. A new message on this session rejects them."
        )
    else:
        how = (
            f"Decide them from a terminal: `loom resume {session_id} --agent <this agent> "
            "--store <this server's store>` asks about each call (or add --approve, or "
            '--reject "reason"); the run then goes on. A new message on this session rejects '
            "them."
        )
    return "\n".join([head, *lines, how])


def describe_query(session_id: str, query: Mapping[str, Any], *, over_http: bool = True) -> str:
    """The server query a run waits on and how to answer it (``over_http`` as above)."""
    kind = query.get("kind") or "input"
    head = (
        f"The agent asks the client for {kind} (session {session_id}): {query.get('question', '')}"
    )
    answer = f'POST /threads/{_path_segment(session_id)}/commands and the body {{"answer": "..."}}'
    if over_http:
        how = (
            f"Answer with {answer}; the run goes on with the answer. A new message on this "
            "session drops the question."
        )
    else:
        how = (
            "This stdio server takes no answer to it: a new message on this session drops the "
            f"question. To answer it, serve the same store (`loom serve`) and send {answer}."
        )
    return f"{head}\n{how}"


def describe_parked(
    stop_reason: str,
    session_id: str,
    pending: Sequence[Mapping[str, Any]] | None,
    query: Mapping[str, Any] | None,
) -> str | None:
    """The text for a run that stopped on ``stop_reason``; None when it is not parked."""
    if stop_reason == "awaiting_approval" and pending:
        return describe_pending_calls(session_id, pending)
    if stop_reason == "awaiting_input" and query:
        return describe_query(session_id, query)
    return None
