"""Retries, the circuit breaker and call timeouts, through the OpenAI provider, against a real
loopback HTTP server that fails on purpose."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loom import Agent
from loom.errors import ModelAuthError, ModelRateLimited, ModelRequestError, ModelUnavailable
from loom.events import EventType
from loom.messages import Message, ModelResponse
from loom.models.base import ModelSettings, RetryNotice, StreamPart, TextDelta
from loom.models.openai import OpenAIModel
from loom.models.resilience import CircuitBreaker, RetryPolicy, parse_retry_after

FAST = RetryPolicy(initial_delay=0.01, max_delay=0.02)


def sse_body(text: str, *, finish: bool = True) -> bytes:
    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        data = {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
        }
        return f"data: {json.dumps(data)}\n\n"

    words = text.split(" ")
    out = [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
    if finish:
        out += [chunk({}, "stop"), "data: [DONE]\n\n"]
    return "".join(out).encode()


class Script:
    """What the server answers, request by request; the last entry repeats."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, ...]] = [("ok", "hello there")]
        self.requests: list[float] = []
        self.lock = threading.Lock()

    def next(self) -> tuple[Any, ...]:
        with self.lock:
            self.requests.append(time.monotonic())
            return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]


class FailingServer(ThreadingHTTPServer):
    daemon_threads = True
    script: Script


class Handler(BaseHTTPRequestHandler):
    server: FailingServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        step = self.server.script.next()
        kind = step[0]
        if kind == "status":
            status, headers = step[1], step[2] if len(step) > 2 else {}
            body = json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if kind == "sleep":
            time.sleep(step[1])
            kind, step = "ok", ("ok", "late")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(sse_body(step[1], finish=kind != "cut"))
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[FailingServer]:
    srv = FailingServer(("127.0.0.1", 0), Handler)
    srv.script = Script()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def model_for(srv: FailingServer, **kw: Any) -> OpenAIModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("breaker", CircuitBreaker("test", failure_threshold=100))
    return OpenAIModel("m", api_key="k", base_url=f"http://127.0.0.1:{srv.server_port}/v1", **kw)


async def run(model: OpenAIModel, settings: ModelSettings | None = None) -> list[StreamPart]:
    parts: list[StreamPart] = []
    try:
        async for part in model.stream([Message.user("hi")], [], settings):
            parts.append(part)
    except Exception as exc:
        exc.parts = parts  # type: ignore[attr-defined]
        raise
    return parts


async def test_429_with_retry_after_then_500_then_success(server: FailingServer) -> None:
    server.script.steps = [
        ("status", 429, {"Retry-After": "1"}),
        ("status", 500),
        ("ok", "all good"),
    ]
    started = time.monotonic()
    parts = await run(model_for(server))
    notices = [p for p in parts if isinstance(p, RetryNotice)]
    assert (notices[0].attempt, notices[0].delay) == (1, 1.0)  # Retry-After honoured
    assert [n.attempt for n in notices] == [1, 2]
    assert "ModelRateLimited" in notices[0].error and "ModelUnavailable" in notices[1].error
    final = parts[-1]
    assert isinstance(final, ModelResponse) and final.text == "all good"
    reqs = server.script.requests
    assert len(reqs) == 3
    assert reqs[1] - reqs[0] >= 0.95
    assert time.monotonic() - started >= 1.0


async def test_each_retry_is_an_llm_retry_event_and_only_the_answer_is_stored(
    server: FailingServer,
) -> None:
    server.script.steps = [("status", 503), ("status", 502), ("ok", "fine")]
    agent = Agent(model=model_for(server))
    events = [e async for e in agent.stream("hi", session_id="s")]
    retries = [e.data for e in events if e.type is EventType.LLM_RETRY]
    assert [r["attempt"] for r in retries] == [1, 2]
    assert all("ModelUnavailable" in r["error"] and r["delay"] >= 0 for r in retries)
    assert events[-1].data["output"] == "fine"
    stored = await agent.store.load_messages("s")
    assert [(m.role, m.content) for m in stored] == [("user", "hi"), ("assistant", "fine")]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, ModelRequestError),
        (404, ModelRequestError),
        (401, ModelAuthError),
        (403, ModelAuthError),
        (422, ModelRequestError),
    ],
)
async def test_a_4xx_that_retrying_cannot_fix_is_not_retried(
    server: FailingServer, status: int, error: type[Exception]
) -> None:
    server.script.steps = [("status", status)]
    with pytest.raises(error, match=f"answered {status}"):
        await run(model_for(server))
    assert len(server.script.requests) == 1


async def test_retries_stop_at_the_configured_maximum(server: FailingServer) -> None:
    server.script.steps = [("status", 500)]
    model = model_for(server, retry=RetryPolicy(max_retries=2, initial_delay=0.01))
    with pytest.raises(ModelUnavailable, match="gave up after 2 retries"):
        await run(model)
    assert len(server.script.requests) == 3
    server.script.requests.clear()
    server.script.steps = [("status", 429, {"Retry-After": "0"})]
    with pytest.raises(ModelRateLimited, match="gave up after 3 retries"):
        await run(model_for(server))
    assert len(server.script.requests) == 4


async def test_a_stream_cut_midway_is_not_retried_and_nothing_partial_is_stored(
    server: FailingServer,
) -> None:
    server.script.steps = [("cut", "the answer is"), ("ok", "should not be reached")]
    agent = Agent(model=model_for(server))
    events = [e async for e in agent.stream("hi", session_id="s")]
    deltas = "".join(e.text for e in events if e.type is EventType.LLM_DELTA)
    assert deltas == "the answer is"
    finish = events[-1].data
    assert finish["stop_reason"] == "model_error"
    assert "broke after output had started" in finish["error"]
    assert len(server.script.requests) == 1
    stored = await agent.store.load_messages("s")
    assert [m.role for m in stored] == ["user"]  # no half answer passed off as complete


async def test_the_per_call_timeout(server: FailingServer) -> None:
    server.script.steps = [("sleep", 2.0)]
    model = model_for(server, retry=RetryPolicy(max_retries=0))
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match=r"0.3 s call timeout"):
        await run(model, ModelSettings(timeout=0.3))
    assert time.monotonic() - started < 1.5


async def test_a_server_that_is_down(server: FailingServer) -> None:
    port = server.server_port
    server.shutdown()
    server.server_close()
    model = OpenAIModel(
        "m",
        api_key="k",
        base_url=f"http://127.0.0.1:{port}/v1",
        retry=RetryPolicy(max_retries=1, initial_delay=0.01),
        breaker=CircuitBreaker("down"),
    )
    with pytest.raises(ModelUnavailable, match="could not be reached"):
        await run(model)


async def test_the_circuit_breaker_opens_then_probes_half_open(server: FailingServer) -> None:
    breaker = CircuitBreaker("flaky", failure_threshold=3, reset_timeout=0.3)
    model = model_for(server, retry=RetryPolicy(max_retries=0), breaker=breaker)
    server.script.steps = [("status", 500)]
    for _ in range(3):
        with pytest.raises(ModelUnavailable, match="answered 500"):
            await run(model)
    assert breaker.state == "open"
    with pytest.raises(ModelUnavailable, match="circuit breaker for flaky is open"):
        await run(model)
    assert len(server.script.requests) == 3  # the open breaker did not call the server
    await asyncio.sleep(0.35)
    with pytest.raises(ModelUnavailable, match="answered 500"):  # the half-open probe fails
        await run(model)
    assert breaker.state == "open" and len(server.script.requests) == 4
    with pytest.raises(ModelUnavailable, match="is open"):
        await run(model)
    await asyncio.sleep(0.35)
    server.script.steps = [("ok", "back again")]
    parts = await run(model)  # the probe succeeds and closes the breaker
    assert isinstance(parts[-1], ModelResponse) and parts[-1].text == "back again"
    assert breaker.state == "closed" and breaker.failures == 0
    assert any(isinstance(p, TextDelta) for p in parts)


async def test_4xx_and_429_do_not_trip_the_breaker(server: FailingServer) -> None:
    breaker = CircuitBreaker("picky", failure_threshold=2, reset_timeout=30)
    model = model_for(server, retry=RetryPolicy(max_retries=0), breaker=breaker)
    server.script.steps = [("status", 400), ("status", 429), ("status", 400), ("ok", "yes")]
    for _ in range(3):
        with pytest.raises((ModelRequestError, ModelRateLimited)):
            await run(model)
    assert breaker.state == "closed"
    assert isinstance((await run(model))[-1], ModelResponse)


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "soon"}) is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= (parse_retry_after({"retry-after": future}) or 0) <= 31
    assert parse_retry_after(None) is None


def test_backoff_grows_exponentially_with_full_jitter() -> None:
    policy = RetryPolicy(initial_delay=1.0, multiplier=2.0, max_delay=5.0, jitter=False)
    assert [policy.delay(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    jittered = RetryPolicy(initial_delay=1.0, max_delay=5.0)
    samples = [jittered.delay(2) for _ in range(200)]
    assert all(0 <= d <= 4.0 for d in samples) and len(set(samples)) > 100
    assert policy.delay(0, retry_after=120) == policy.max_retry_after
