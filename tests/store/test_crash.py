"""Crash test: SIGKILL real processes at random points of many runs, restart, and check.

Kills land after a model response is stored, inside an at_most_once tool before and after its
side effect, after a tool result is stored, and at random times chosen by the parent. After
restarting (recovery runs at the next turn's INTAKE) it asserts: every tool call has a result or
an ``interrupted`` marker; no at_most_once side effect happened twice; pure / idempotent calls
re-ran with their original idempotency key; ``PRAGMA integrity_check`` is ``ok``; and every run
that was not killed ended exactly as the same run does in a process that is never killed.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

DRIVER = str(Path(__file__).with_name("crash_driver.py"))
SRC = str(Path(__file__).resolve().parents[2] / "src")
JOBS = 100
POINTS = ["model", "tool_before", "tool_after", "result"]

pytestmark = pytest.mark.slow


def _driver(
    db: Path,
    effects: Path,
    first: int,
    last: int,
    kill: str | None = None,
    kill_after: float | None = None,
) -> int:
    args = [sys.executable, DRIVER, str(db), str(effects), "s", str(first), str(last)]
    proc = subprocess.Popen(
        args + ([kill] if kill else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    if kill_after is not None:
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL from outside, at a random instant
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -9), err.decode()
    return proc.returncode


def _canonical(turn: list[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
    # Results of concurrent calls are stored in the order they finish: compare them as a set.
    return sorted(turn)


def _turns(db: Path) -> list[list[tuple[str, str, str | None]]]:
    """(role, content, error_code) per message, grouped by turn."""
    import json

    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT data FROM messages WHERE session_id='s' ORDER BY seq").fetchall()
    turns: list[list[tuple[str, str, str | None]]] = []
    for (data,) in rows:
        m = json.loads(data)
        if m["role"] == "user":
            turns.append([])
        turns[-1].append((m["role"], m["content"], m.get("metadata", {}).get("error_code")))
    return turns


def test_sigkill_at_random_points(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("LOOM_CRASH_SEED", "20260131")))
    ref_db, ref_fx = tmp_path / "ref.db", tmp_path / "ref"
    ref_fx.mkdir()
    assert _driver(ref_db, ref_fx, 1, JOBS) == 0  # the run nobody kills
    reference = {t[0][1]: t for t in _turns(ref_db)}

    db, fx = tmp_path / "crash.db", tmp_path / "fx"
    fx.mkdir()
    kills: Counter[str] = Counter()
    nxt, started = 1, time.monotonic()
    while nxt <= JOBS:
        if rng.random() < 0.25:
            spec, after = None, rng.uniform(0.3, 1.2)
        else:
            spec, after = f"{rng.choice(POINTS)}:{rng.randint(1, 8)}", None
        code = _driver(db, fx, nxt, JOBS, spec, after)
        if code == -9:
            kills[spec.split(":")[0] if spec else "timed"] += 1
        nxt = len(_turns(db)) + 1
        assert time.monotonic() - started < 120
    assert _driver(db, fx, JOBS + 1, JOBS + 1) == 0  # a last turn recovers a last crash

    print(f"kills: {dict(kills)}; runs crashed: ", end="")
    assert set(kills) >= set(POINTS), kills
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("SELECT count(*) FROM open_calls").fetchone()[0] == 0
        assert raw.execute("SELECT count(*) FROM open_runs").fetchone()[0] == 0
        ends = dict(raw.execute("SELECT run_id, status FROM runs WHERE status != 'running'"))
        starts = [
            r
            for (r,) in raw.execute("SELECT run_id FROM runs WHERE status = 'running' ORDER BY id")
        ]
        turn_runs = {
            r
            for (r,) in raw.execute(
                "SELECT DISTINCT run_id FROM events WHERE type = 'user_message'"
            )
        }
        ledger = raw.execute(
            "SELECT run_id || ':' || tool_call_id, name, status FROM ledger "
            "WHERE status != 'started'"
        ).fetchall()
    statuses = [ends[r] for r in starts]
    # a run killed in INTAKE, before its user message was committed, is not a turn: it is
    # closed as crashed and the driver submits its job again
    assert len([r for r in starts if r in turn_runs]) == JOBS + 1
    assert all(ends[r] == "crashed" for r in starts if r not in turn_runs)
    crashed = statuses.count("crashed")
    print(crashed)
    assert crashed >= sum(kills.values()) - kills["timed"]  # each self-kill was mid-run

    # No at_most_once side effect twice; each charge key belongs to a started ledger call.
    charges = (fx / "charges.log").read_text().split()
    assert len(charges) == len(set(charges))
    closed = {key: (name, status) for key, name, status in ledger}
    assert all(closed[k][0] == "charge" for k in charges)
    # Some charges happened and then their process died: they are "interrupted", not repeated.
    assert any(closed[k][1] == "interrupted" for k in charges)
    # Pure calls re-ran (if at all) with the very same idempotency key as the first attempt.
    pure = Counter((fx / "pure.log").read_text().split())
    assert all(closed[k][0] == "square" for k in pure)
    assert any(n == 2 for n in pure.values()), "no pure call was ever re-run"

    turn_statuses = [ends[r] for r in starts if r in turn_runs]
    for turn, status in zip(_turns(db), turn_statuses, strict=True):
        calls = sum(1 for role, _, _ in turn if role == "assistant")
        results = [(c, code) for role, c, code in turn if role == "tool"]
        assert calls == 0 or results, turn
        if status == "completed":  # not interrupted: exactly as without a crash
            if turn[0][1] != f"job {JOBS + 1}":
                assert _canonical(turn) == _canonical(reference[turn[0][1]])
        else:
            assert status == "crashed", status
            for content, code in results:
                assert code in (None, "interrupted"), (content, code)
    # Every call of every turn has exactly one result message.
    with sqlite3.connect(db) as raw:
        import json

        msgs = [
            json.loads(d)
            for (d,) in raw.execute("SELECT data FROM messages WHERE session_id='s' ORDER BY seq")
        ]
    asked = [c["id"] for m in msgs if m["role"] == "assistant" for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    assert sorted(asked) == sorted(answered) and len(answered) == len(set(answered))
