"""The server's store seen through an API key (``OwnedStore``): a session-scoped branch call
(``fork``, ``rewind``, ``ledger``) of another key's session does not reach the store, and a
fork belongs to the key that made it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from loom import Agent
from loom.engine.runtime import Runtime
from loom.errors import SessionNotFound
from loom.messages import Message, ToolSpec
from loom.server.ownership import OwnedStore, Owners, Principal, current_principal
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

ALICE = Principal("alice", b"\x01" * 32)
BOB = Principal("bob", b"\x02" * 32)


def echo(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    return "ok"


async def test_branch_calls_of_another_keys_session_are_refused() -> None:
    inner = MemoryStore()
    owned = OwnedStore(inner, Owners(inner))
    agent = Agent(name="a", model=FunctionModel(echo))
    token = current_principal.set(ALICE)
    try:
        await Runtime(store=owned).run(agent, "hi", session_id="s")
        events = len(await inner.load_events("s"))
        await owned.fork("s", "alice-fork", 2, events, messages=[], events=[])
        await owned.owners.check("alice-fork")  # the fork is the key's that made it
    finally:
        current_principal.reset(token)
    token = current_principal.set(BOB)
    try:
        with pytest.raises(SessionNotFound):
            await owned.fork("s", "bob-fork", 2, events, messages=[], events=[])
        with pytest.raises(SessionNotFound):  # the fork is alice's too
            await owned.fork("alice-fork", "bob-fork", 2, events, messages=[], events=[])
        with pytest.raises(SessionNotFound):
            await owned.rewind("s", 0, messages=[], events=[])
        with pytest.raises(SessionNotFound):
            await owned.ledger("s")
    finally:
        current_principal.reset(token)
    assert await inner.get_session("bob-fork") is None  # nothing reached the store
    assert len(await inner.load_messages("s")) == 2
