"""Server queries (seed 003): the model asks the *client* for something, and the run waits.

A ``QueryDetector`` looks at each final answer of the model. When it matches ("I need to read
src/main.rs"), the loop commits a ``SERVER_QUERY`` event and stops the run with
``stop_reason="awaiting_input"`` instead of ending the turn; the client (a server's caller, a
program) fetches the file or value the model asked for and answers with
``runtime.answer_query(agent, session_id, answer)`` (``POST /threads/{id}/answer`` on
``loom serve``). The answer enters the transcript as a ``QUERY_ANSWER`` event, formatted as a
message the model reads, and the same turn goes on: the model continues with the result in
context. A new user message instead of an answer simply moves on (the query is dropped).

```python
agent = Agent(model=..., query_detector={
    "file_read": r"I need to read (?P<path>\\S+)",
    "env": r"What's in the environment\\?",
})
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from loom.errors import AgentDefinitionError

__all__ = [
    "PatternQueryDetector",
    "QueryDetector",
    "ServerQuery",
    "format_answer",
    "query_detector",
]


@dataclass(frozen=True, slots=True)
class ServerQuery:
    """What the model asked the client for: a kind, the words that asked, named parts."""

    kind: str
    question: str
    data: dict[str, Any] = field(default_factory=dict)
    query_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class QueryDetector(Protocol):
    """Decides whether a final answer is a query for the client (seed 003's strategy)."""

    def detect(self, answer: str) -> ServerQuery | None: ...


class PatternQueryDetector:
    """Regular expressions by query kind; the first that matches an answer makes the query,
    its named groups the query's ``data``."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for kind, pattern in patterns.items():
            try:
                self.patterns.append((str(kind), re.compile(pattern)))
            except re.error as exc:
                raise AgentDefinitionError(
                    f"pattern for query kind {kind!r} is not a regular expression: {exc}",
                    field="query_detector",
                ) from None

    def detect(self, answer: str) -> ServerQuery | None:
        for kind, pattern in self.patterns:
            m = pattern.search(answer)
            if m is not None:
                data = {k: v for k, v in m.groupdict().items() if v is not None}
                return ServerQuery(kind, m.group(0), data)
        return None

    def __repr__(self) -> str:
        return f"PatternQueryDetector({[k for k, _ in self.patterns]})"


def query_detector(value: Any) -> QueryDetector | None:
    """The detector an ``Agent(query_detector=...)`` value means (a mapping means patterns)."""
    if value is None or isinstance(value, QueryDetector):
        return value
    if isinstance(value, Mapping):
        return PatternQueryDetector(value)
    raise AgentDefinitionError(
        f"must be a QueryDetector or a mapping of kind to regular expression, got "
        f"{type(value).__name__}",
        field="query_detector",
    )


def format_answer(kind: str, question: str, answer: str | Sequence[str]) -> str:
    """The message the model reads for the client's answer (seed 003's ResultFormatter)."""
    text = answer if isinstance(answer, str) else "\n".join(answer)
    return f"[answer to your {kind} query: {question}]\n{text}"


async def pending_query(store: Any, session_id: str) -> ServerQuery | None:
    """The session's server query still waiting for an answer, if any (read from its journal:
    a ``SERVER_QUERY`` with no ``QUERY_ANSWER`` and no new user message after it)."""
    from loom.events import EventType
    from loom.store.transcript import since_last_request

    waiting: ServerQuery | None = None
    kinds = [EventType.SERVER_QUERY, EventType.QUERY_ANSWER]
    for ev in await since_last_request(store, session_id, kinds):
        if ev.type is EventType.SERVER_QUERY:
            d = ev.data
            waiting = ServerQuery(
                d["kind"], d["question"], dict(d.get("data") or {}), d["query_id"]
            )
        elif ev.type in (EventType.QUERY_ANSWER, EventType.USER_MESSAGE):
            waiting = None
    return waiting
