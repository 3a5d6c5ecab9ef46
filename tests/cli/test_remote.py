"""``loom run --server`` and ``loom chat --server`` against a real ``loom serve`` process: the
same live rendering and exit codes as a local run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.conftest import SRC, Server, start_server, stop_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("remote"))
    yield srv
    stop_server(srv)


def loom(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC, NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=60,
    )


def test_run_on_a_server_renders_like_a_local_run(served: Server, tmp_path: Path) -> None:
    done = loom(tmp_path, "run", "--server", served.url, "--agent", "calc", "add 2 and 3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "The sum is 5."
    assert '→ add({"a": 2, "b": 3})' in done.stderr and "✓ add: 5" in done.stderr
    assert "completed" in done.stderr
    session = done.stderr.split("session ")[1].split()[0]
    again = loom(tmp_path, "run", "--server", served.url, "-a", "calc", "-s", session, "hi")
    assert again.returncode == 0 and again.stdout.strip() == "echo: hi"
    assert not (tmp_path / ".loom").exists()  # nothing local: the server keeps the session


def test_json_events_and_approval_over_the_server(served: Server, tmp_path: Path) -> None:
    done = loom(tmp_path, "run", "--server", served.url, "-a", "ops", "--json", "ship it")
    assert done.returncode == 0, done.stderr  # awaiting approval is not a failure
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["type"] == "agent_start" and events[-1]["type"] == "agent_finish"
    assert "approval_required" in [e["type"] for e in events]
    assert events[-1]["data"]["stop_reason"] == "awaiting_approval"


def test_bad_requests_exit_2(served: Server, tmp_path: Path) -> None:
    two = loom(tmp_path, "run", "--server", served.url, "hello")  # two agents: which?
    assert two.returncode == 2 and "calc, ops" in two.stderr
    unknown = loom(tmp_path, "run", "--server", served.url, "-a", "nobody", "hello")
    assert unknown.returncode == 2 and "no agent 'nobody'" in unknown.stderr
    missing = loom(tmp_path, "run", "--server", served.url, "-a", "calc", "-s", "nope", "hi")
    assert missing.returncode == 2 and "SessionNotFound" in missing.stderr
    created = loom(
        tmp_path, "run", "--server", served.url, "-a", "calc", "-s", "mine", "--new", "hi"
    )
    assert created.returncode == 0 and created.stdout.strip() == "echo: hi"
    local = loom(tmp_path, "run", "--server", served.url, "-a", "calc", "--model", "demo", "x")
    assert local.returncode == 2 and "--model cannot be used with --server" in local.stderr
    down = loom(tmp_path, "run", "--server", "http://127.0.0.1:9", "-a", "calc", "hi")
    assert down.returncode == 2 and "cannot reach the server" in down.stderr


def test_chat_on_a_server(served: Server, tmp_path: Path) -> None:
    done = loom(
        tmp_path,
        "chat",
        "--server",
        served.url,
        "-a",
        "calc",
        stdin="add 1 and 2\n/undo\nhello\n",
    )
    assert done.returncode == 0, done.stderr
    assert "The sum is 3." in done.stdout and "echo: hello" in done.stdout
    assert done.stderr.count("completed") == 2
    # not over a server yet: said, and nothing is sent
    assert "/undo, /retry and /edit work in a local chat only for now" in done.stderr


def test_a_server_with_keys_takes_api_key_and_loom_api_key(tmp_path: Path) -> None:
    """`--api-key` (or LOOM_API_KEY) reaches a keyed server; without it the refusal says how."""
    key = "cli-test-key-0123456789"
    (tmp_path / "keys.yaml").write_text(f"- {{name: me, key: {key}}}\n")
    srv = start_server(tmp_path, "--keys", str(tmp_path / "keys.yaml"))
    try:
        base = ("run", "--server", srv.url, "-a", "calc", "add 2 and 3")
        refused = loom(tmp_path, *base)
        assert refused.returncode == 2 and "--api-key" in refused.stderr, refused.stderr
        flag = loom(tmp_path, *base, "--api-key", key)
        assert flag.returncode == 0 and flag.stdout.strip() == "The sum is 5.", flag.stderr
        os.environ["LOOM_API_KEY"] = key
        try:
            env = loom(tmp_path, *base)
        finally:
            del os.environ["LOOM_API_KEY"]
        assert env.returncode == 0 and env.stdout.strip() == "The sum is 5.", env.stderr
        chat = loom(
            tmp_path,
            "chat",
            "--server",
            srv.url,
            "-a",
            "calc",
            "--api-key",
            key,
            stdin="add 1 and 2\n",
        )
        assert chat.returncode == 0 and "The sum is 3." in chat.stdout, chat.stderr
    finally:
        stop_server(srv)
