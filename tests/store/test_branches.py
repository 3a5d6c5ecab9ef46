"""The SQL stores' BranchStore: forks share rows instead of copying them, a source with forks
is not deleted, a rewound source gives its forks their own copy first, and a SIGKILL in the
middle of a rewind leaves the old state or the new one (issue #28). The behaviour every store
shares is in ``loom.store.conformance``."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.engine.journal import transcript
from loom.errors import InputError
from loom.events import AgentEvent, EventType, SessionBranch, make_event
from loom.messages import Message
from loom.store import MemoryStore, SQLiteStore
from loom.store.base import LedgerEntry, capabilities_of

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _turns(session_id: str, run: str, texts: list[str]) -> tuple[list[Message], list[AgentEvent]]:
    """User messages and the journal events that derive them."""
    events = [
        make_event(EventType.USER_MESSAGE, run, session_id, 0, i, {"content": t})
        for i, t in enumerate(texts)
    ]
    return [m for e in events if (m := e.message()) is not None], events


def _rows(path: Path, table: str, session_id: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute(
                f"SELECT count(*) FROM {table} WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
        )


async def test_sqlite_store_is_a_branch_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    assert capabilities_of(store).branches is store
    await store.close()


async def test_forks_add_rows_for_their_branch_only(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    store = SQLiteStore(path)
    messages, events = _turns("s", "r0", [f"m{i}" for i in range(50)])
    await store.append("s", messages=messages, events=events)
    for k in range(10):
        own, own_events = _turns(f"f{k}", f"rf{k}", [f"fork {k}"])
        await store.fork("s", f"f{k}", 5 * k, 5 * k, messages=own, events=own_events)
        assert await store.load_messages(f"f{k}") == messages[: 5 * k] + own
        assert _rows(path, "messages", f"f{k}") == 1  # its own message, nothing copied
        assert _rows(path, "events", f"f{k}") == 1
    assert _rows(path, "messages", "s") == 50
    await store.close()


async def test_a_source_with_forks_is_not_deleted(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    messages, events = _turns("s", "r0", ["a", "b"])
    await store.append("s", messages=messages, events=events)
    await store.fork("s", "f", 1, 1, messages=[], events=[])
    with pytest.raises(InputError, match=r"forks that share its history \(f\)"):
        await store.delete_session("s")
    assert await store.load_messages("s") == messages  # nothing deleted
    assert await store.forks("s") == ["f"]
    assert await store.delete_session("f") and await store.delete_session("s")
    await store.close()


async def test_a_rewound_source_gives_its_forks_their_own_copy(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    store = SQLiteStore(path)
    messages, events = _turns("s", "r0", [f"m{i}" for i in range(10)])
    await store.append("s", messages=messages, events=events)
    await store.fork("s", "f", 8, 10, messages=[], events=[])
    await store.fork("s", "g", 2, 2, messages=[], events=[])
    branch = make_event(EventType.SESSION_BRANCH, "r1", "s", 0, 0, {"at": 3})
    await store.rewind("s", 3, messages=[], events=[branch])
    assert await store.load_messages("s") == messages[:3]
    assert await store.load_messages("f") == messages[:8]  # unchanged
    assert _rows(path, "messages", "f") == 5  # positions 3..7, which changed under it
    assert _rows(path, "messages", "g") == 0  # below the rewind: still shared
    await store.close()


# -- SIGKILL in the middle of rewinds -------------------------------------------------------------
_REWINDER = """
import asyncio, os, random, signal, sys
from loom.events import EventType, make_event
from loom.store import SQLiteStore

def die_at_a_statement(store, rng):
    # SIGKILL at a random SQL statement: inside a transaction, between two, at a COMMIT
    left = [rng.randint(1, 600)]
    def trace(statement):
        left[0] -= 1
        if left[0] == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    store.db.conn.set_trace_callback(trace)

async def main(path, seed):
    rng = random.Random(seed)
    store = SQLiteStore(path)
    die_at_a_statement(store, rng)
    n = 0
    while True:
        count = await store.message_count("s")
        at = rng.randint(0, count)
        run = f"r{n}"
        branch = make_event(EventType.SESSION_BRANCH, run, "s", 0, 0, {"at": at})
        users = [
            make_event(EventType.USER_MESSAGE, run, "s", 0, i + 1, {"content": f"{run}.{i}"})
            for i in range(rng.randint(0, 30))
        ]
        await store.rewind("s", at, messages=[e.message() for e in users],
                           events=[branch, *users])
        n += 1
        print(n, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


_FORKER = """
import asyncio, os, random, signal, sys
from loom.events import EventType, make_event
from loom.store import SQLiteStore

def die_at_a_statement(store, rng):
    # SIGKILL at a random SQL statement: inside a transaction, between two, at a COMMIT
    left = [rng.randint(1, 600)]
    def trace(statement):
        left[0] -= 1
        if left[0] == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    store.db.conn.set_trace_callback(trace)

async def main(path, seed):
    rng = random.Random(seed)
    store = SQLiteStore(path)
    n = 0
    at, upto = await store.message_count("s"), len(await store.load_events("s"))
    die_at_a_statement(store, rng)
    while True:  # the source does not change: each turn of the loop is a fork
        new = f"f{seed}.{n}"
        branch = make_event(EventType.SESSION_BRANCH, new, new, 0, 0, {"at": at})
        users = [
            make_event(EventType.USER_MESSAGE, new, new, 0, i + 1, {"content": f"{new}.{i}"})
            for i in range(rng.randint(0, 30))
        ]
        await store.fork("s", new, at, upto, messages=[e.message() for e in users],
                         events=[branch, *users])
        n += 1
        print(n, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _kill_midway(path: Path, seed: int, script: str = _REWINDER) -> int:
    """Run ``script`` (rewinds or forks in a loop) until it SIGKILLs itself at a random SQL
    statement (``die_at_a_statement``: in the middle of an operation's transaction, between
    two, or at a COMMIT); how many operations it said returned."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(seed)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert proc.stdout is not None
    finished = 0
    for line in proc.stdout:
        finished = int(line)
    assert proc.wait() == -signal.SIGKILL
    proc.stdout.close()
    return finished


def _states(events: list[AgentEvent]) -> list[list[Message]]:
    """The transcript after each rewind the journal holds (the state a crash may leave)."""
    cuts = [i for i, e in enumerate(events) if type(e) is SessionBranch]
    return [transcript(events[:c]) for c in cuts] + [transcript(events)]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_sigkill_during_rewinds_leaves_the_old_state_or_the_new(
    tmp_path: Path, seed: int
) -> None:
    path = tmp_path / "loom.db"
    store = SQLiteStore(path)
    messages, events = _turns("s", "r", [f"m{i}" for i in range(40)])
    await store.append("s", messages=messages, events=events)
    await store.close()
    rng = random.Random(seed)
    done = 0
    for _ in range(4):
        finished = _kill_midway(path, rng.randint(0, 10**6))
        store = SQLiteStore(path)
        journal = await store.load_events("s")
        stored = await store.load_messages("s")
        assert await store.integrity_check() == "ok"
        # the derived transcript is exactly the journal's: no half of a rewind survived
        assert stored == transcript(journal)
        rewinds = sum(type(e) is SessionBranch for e in journal)
        assert rewinds >= done + finished  # every rewind the child saw return is there
        done = rewinds
        assert stored in _states(journal)
        assert await store.message_count("s") == len(stored)
        await store.close()
    assert done >= 4


# -- random histories: the SQL store reads what MemoryStore (which copies) reads ------------------
_OPS = ("append", "rewind", "fork")
_OP = st.tuples(
    st.sampled_from(_OPS),
    st.integers(0, 5),  # which session
    st.integers(0, 1_000),  # a position, scaled to what the session holds
    st.integers(0, 3),  # how many messages
)


async def _plan(
    store: Any, op: tuple[str, int, int, int], step: int, names: list[str]
) -> Callable[[Any], Awaitable[None]]:
    """The operation ``op`` as ``store`` is now, built once: both stores get the same
    messages and events (timestamps included)."""
    kind, which, where, many = op
    sid = names[which % len(names)]
    count = await store.message_count(sid)
    run = f"r{step}"
    texts = [f"{run}.{i}" for i in range(many)]
    if kind == "append":
        messages, events = _turns(sid, run, texts)
        ledger: list[LedgerEntry] = []
        if many:  # a tool call answered, with its ledger entries
            call = f"c{step}"
            messages.append(Message(role="tool", content="done", tool_call_id=call, name="t"))
            started = LedgerEntry(run, sid, call, "t", "started", {"n": step}, "idempotent")
            ledger = [started, started.ended("completed", None)]
        return lambda s: s.append(sid, messages=messages, events=events, ledger=ledger)
    if kind == "rewind":
        at = where % (count + 1)
        branch = make_event(EventType.SESSION_BRANCH, run, sid, 0, 0, {"at": at})
        messages, events = _turns(sid, run, texts)
        return lambda s: s.rewind(sid, at, messages=messages, events=[branch, *events])
    journal = len(await store.load_events(sid))
    new = f"f{step}"
    names.append(new)
    messages, events = _turns(new, run, texts)
    at, upto = where % (count + 1), (where * 7) % (journal + 1)
    return lambda s: s.fork(sid, new, at, upto, messages=messages, events=events)


async def _reads(store: Any, sid: str) -> tuple[Any, ...]:
    events = await store.load_events(sid)
    count = await store.message_count(sid)
    info = await store.get_session(sid)
    return (
        await store.load_messages(sid),
        await store.load_messages(sid, count // 2),
        await store.load_message_range(sid, count // 3, count // 3 + 2),
        count,
        info.message_count if info is not None else None,
        await store.load_system_messages(sid),
        [(e.session_id, e.run_id, e.sequence, str(e.type)) for e in events],
        [(e.run_id, e.sequence) for e in await store.load_events(sid, events[0].run_id)]
        if events
        else [],
        [(e.run_id, e.sequence) for e in await store.load_latest_events(sid, _KINDS, 3)],
        [(e.tool_call_id, e.status) for e in await store.ledger(sid)],
        [(e.tool_call_id, e.status) for e in await store.open_tool_calls(sid)],
    )


_KINDS = [EventType.USER_MESSAGE, EventType.SESSION_BRANCH]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OP, min_size=1, max_size=25))
def test_random_branches_read_as_in_a_store_that_copies(ops: list[Any]) -> None:
    """After any mix of appends, rewinds and forks (of forks, below their shares, of
    sources below what their forks share), every read of every session of the SQLite store
    equals MemoryStore's, which copies what a fork shares."""

    async def run() -> None:
        memory, sqlite = MemoryStore(), SQLiteStore(":memory:")
        names = ["s0"]
        memo = [Message.system("memo")]
        for store in (memory, sqlite):
            await store.append("s0", messages=memo)
        for step, op in enumerate(ops):
            apply = await _plan(memory, op, step, names)
            for store in (memory, sqlite):
                await apply(store)
            for sid in names:
                assert await _reads(sqlite, sid) == await _reads(memory, sid), (step, op, sid)
        await sqlite.close()

    asyncio.run(run())


async def test_sigkill_during_forks_leaves_each_fork_whole_or_absent(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    store = SQLiteStore(path)
    messages, events = _turns("s", "r", [f"m{i}" for i in range(40)])
    await store.append("s", messages=messages, events=events)
    await store.close()
    rng = random.Random(28)
    made = 0
    for _ in range(6):
        finished = _kill_midway(path, rng.randint(0, 10**6), _FORKER)
        store = SQLiteStore(path)
        assert await store.integrity_check() == "ok"
        forks = await store.forks("s")
        assert len(forks) >= made + finished  # every fork the child saw return is there
        made = len(forks)
        for fork_id in forks:  # each whole: its row, its messages and its events together
            journal = await store.load_events(fork_id)
            assert type(journal[40]) is SessionBranch and journal[40].session_id == fork_id
            stored = await store.load_messages(fork_id)
            assert stored == transcript(journal) and stored[:40] == messages
            assert len(stored) == 40 + len(journal) - 41
        assert await store.load_messages("s") == messages  # the source never changed
        with sqlite3.connect(path) as conn:  # no rows of a fork that was not created
            orphans = conn.execute(
                "SELECT count(*) FROM messages m WHERE NOT EXISTS "
                "(SELECT 1 FROM sessions s WHERE s.id = m.session_id)"
            ).fetchone()[0]
        assert orphans == 0
        await store.close()
