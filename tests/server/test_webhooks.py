"""Webhooks against a real HTTP receiver that checks the HMAC signature: run ends, pending
approvals, a target that times out (retried, recorded), 5xx retries with a bound, 4xx final."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError
from loom.messages import Usage
from loom.server.webhooks import NAMESPACE, Webhook, Webhooks, sign, verify_signature
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

SECRET = "s3cret"


class Receiver:
    """Records each POST (body, headers, whether the signature verified); ``respond`` decides
    each reply from the attempt number (1-based): a status, or ``None`` to hang until released."""

    def __init__(self) -> None:
        self.hits: list[dict[str, Any]] = []
        self.respond: Callable[[int], int | None] = lambda n: 200
        self.release = threading.Event()
        self.otlp: dict[str, list[bytes]] = {}
        self.got_otlp, self.got_hit = threading.Event(), threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path.startswith("/v1/"):  # OTLP/HTTP from `loom serve --otlp-endpoint`
                    receiver.otlp.setdefault(self.path, []).append(body)
                    receiver.got_otlp.set()
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                receiver.hits.append(
                    {
                        "body": json.loads(body),
                        "event": self.headers["X-Loom-Event"],
                        "verified": verify_signature(
                            SECRET, body, self.headers["X-Loom-Signature"]
                        ),
                    }
                )
                receiver.got_hit.set()
                status = receiver.respond(len(receiver.hits))
                if status is None:  # a target that does not answer in time
                    receiver.release.wait(10)
                    status = 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up on this attempt

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.release.set()
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "loom.db")
    yield s
    await s.close()


@tool
def deploy(target: str) -> str:
    """Deploy to a target."""
    return f"deployed {target}"


def hooks_for(store: SQLiteStore, url: str, **kw: Any) -> tuple[Webhooks, Runtime]:
    hooks = Webhooks([Webhook(url, SECRET, **kw)])
    rt = Runtime(store, observers=[hooks])
    hooks.kv = rt.capabilities.kv
    return hooks, rt


async def test_a_finished_run_is_posted_signed_and_recorded(
    receiver: Receiver, store: SQLiteStore
) -> None:
    hooks, rt = hooks_for(store, receiver.url)
    model = ScriptedModel(
        [
            ModelResponse(
                text="hi there", usage=Usage(input_tokens=1_000, output_tokens=10, requests=1)
            )
        ],
        name="openai:gpt-4o",
    )
    result = await rt.run(Agent(name="greeter", model=model), "hello", session_id="s1")
    await hooks.drain(10)
    (hit,) = receiver.hits
    assert hit["verified"] and hit["event"] == "run.finished"
    body = hit["body"]
    assert (body["type"], body["run_id"], body["session_id"]) == (
        "run.finished",
        result.run_id,
        "s1",
    )
    assert body["stop_reason"] == "completed" and body["output"] == "hi there"
    assert body["usage"]["cost"] == pytest.approx(result.usage.cost)
    record = await store.get_value(NAMESPACE, body["id"])
    assert record["delivered"] is True and [a["status"] for a in record["attempts"]] == [200]


async def test_a_run_waiting_for_approval_is_posted_with_its_calls(
    receiver: Receiver, store: SQLiteStore
) -> None:
    hooks, rt = hooks_for(store, receiver.url)
    call = ToolCall(id="call_d", name="deploy", arguments={"target": "prod"})
    agent = Agent(
        name="deployer",
        model=ScriptedModel([ModelResponse(tool_calls=[call])]),
        tools=[deploy],
        permissions={"ask": ["deploy"]},
    )
    result = await rt.run(agent, "deploy prod")
    assert result.stop_reason == "awaiting_approval"
    await hooks.drain(10)
    (hit,) = receiver.hits
    assert hit["verified"] and hit["event"] == "approval.pending"
    assert [p["tool_call_id"] for p in hit["body"]["pending_approvals"]] == ["call_d"]


async def test_a_target_that_times_out_is_retried_and_recorded(
    receiver: Receiver, store: SQLiteStore
) -> None:
    receiver.respond = lambda n: None if n == 1 else 200
    hooks, _ = hooks_for(store, receiver.url, timeout=0.3, backoff=0.01)
    record = await hooks.deliver(
        hooks.targets[0], {"type": "run.finished", "run_id": "r", "session_id": "s"}
    )
    receiver.release.set()
    assert [a.get("error") or a.get("status") for a in record["attempts"]] == ["timeout", 200]
    assert record["delivered"] is True
    assert [h["body"]["id"] for h in receiver.hits] == [record["id"]] * 2  # same delivery id
    assert all(h["verified"] for h in receiver.hits)
    assert await store.get_value(NAMESPACE, record["id"]) == record


async def test_5xx_is_retried_up_to_the_bound_and_4xx_is_final(
    receiver: Receiver, store: SQLiteStore
) -> None:
    receiver.respond = lambda n: 503
    hooks, _ = hooks_for(store, receiver.url, max_attempts=3, backoff=0.01)
    record = await hooks.deliver(
        hooks.targets[0], {"type": "run.finished", "run_id": "r", "session_id": "s"}
    )
    assert [a["status"] for a in record["attempts"]] == [503, 503, 503]
    assert record["delivered"] is False
    assert (await store.get_value(NAMESPACE, record["id"]))["delivered"] is False
    receiver.hits.clear()
    receiver.respond = lambda n: 400
    record = await hooks.deliver(
        hooks.targets[0], {"type": "run.finished", "run_id": "r", "session_id": "s"}
    )
    assert [a["status"] for a in record["attempts"]] == [400] and len(receiver.hits) == 1


async def test_an_unreachable_target_is_recorded_as_failed(store: SQLiteStore) -> None:
    hooks, _ = hooks_for(store, "http://127.0.0.1:9/hook", max_attempts=2, backoff=0.01)
    record = await hooks.deliver(
        hooks.targets[0], {"type": "run.finished", "run_id": "r", "session_id": "s"}
    )
    assert record["delivered"] is False and len(record["attempts"]) == 2
    assert "Connect" in record["attempts"][0]["error"]


def test_signatures() -> None:
    body = b'{"a": 1}'
    assert verify_signature(SECRET, body, sign(SECRET, body))
    assert not verify_signature("other", body, sign(SECRET, body))
    assert not verify_signature(SECRET, b'{"a": 2}', sign(SECRET, body))
    assert not verify_signature(SECRET, body, None)


def test_bad_targets_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        Webhook("ftp://x")
    with pytest.raises(ConfigurationError, match="max_attempts"):
        Webhook("http://x", max_attempts=0)


def test_loom_serve_sends_webhooks_and_traces(receiver: Receiver, tmp_path: Path) -> None:
    import httpx
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from tests.server.conftest import start_server, stop_server

    server = start_server(
        tmp_path,
        "--otlp-endpoint",
        receiver.base,
        "--webhook",
        receiver.url,
        "--webhook-secret",
        SECRET,
        env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    try:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            timeout=30,
            json={"model": "calc", "messages": [{"role": "user", "content": "add 2 and 3"}]},
        )
        assert r.status_code == 200, r.text
        assert receiver.got_hit.wait(15) and receiver.got_otlp.wait(15)
    finally:
        stop_server(server)
    (hit,) = receiver.hits
    assert hit["verified"] and hit["body"]["stop_reason"] == "completed"
    names = {
        s.name
        for body in receiver.otlp["/v1/traces"]
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    assert {"invoke_agent calc", "chat function", "execute_tool add"} <= names


async def test_a_budget_warning_is_posted_once_per_window(
    receiver: Receiver, store: SQLiteStore
) -> None:
    """loom.budgets: crossing ``warn_at`` posts ``budget.warning`` once for the window."""
    hooks = Webhooks([Webhook(receiver.url, SECRET)])
    rt = Runtime(
        store,
        observers=[hooks],
        budgets=[{"scope": "global", "window": "day", "max_tokens": 100_000, "warn_at": 0.5}],
    )
    answer = ModelResponse(text="ok", usage=Usage(input_tokens=20_000, output_tokens=0))
    for i in range(4):  # 20k, 40k, 60k (crossed: 50k), 80k
        await rt.run(Agent(name="a", model=ScriptedModel([answer])), "hi", session_id=f"w{i}")
    await hooks.drain(10)
    kinds = [h["event"] for h in receiver.hits]
    assert kinds.count("budget.warning") == 1 and kinds.count("run.finished") == 4
    (hit,) = [h for h in receiver.hits if h["event"] == "budget.warning"]
    body = hit["body"]
    assert hit["verified"]
    assert (body["scope"], body["window"], body["kind"], body["limit"], body["spent"]) == (
        "global",
        "day",
        "tokens",
        100_000,
        60_000,
    )
