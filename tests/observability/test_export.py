"""OTLP/HTTP export on the wire: ``loom.observability.configure`` sends a run's spans and metrics
to a small receiver that decodes the protobuf; an unreachable collector never fails a run."""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError
from loom.messages import Usage
from loom.observability import configure
from loom.testing import ScriptedModel


class Receiver:
    """An OTLP/HTTP collector stand-in: keeps each decoded request, signals its arrival."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.got_traces = threading.Event()
        self.got_metrics = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers["Content-Type"] == "application/x-protobuf"
                if self.path == "/v1/traces":
                    receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                    receiver.got_traces.set()
                elif self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                    receiver.got_metrics.set()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def agent() -> Agent:
    call = ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2})
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[call], usage=Usage(input_tokens=9, output_tokens=3, requests=1)
            ),
            ModelResponse(text="3", usage=Usage(input_tokens=12, output_tokens=1, requests=1)),
        ],
        name="openai:gpt-4o",
    )
    return Agent(name="adder", model=model, tools=[add])


async def test_spans_and_metrics_arrive_over_otlp_http(receiver: Receiver) -> None:
    tel = configure(receiver.url, service_name="loom-test", set_global=False)
    try:
        result = await Runtime(observers=[tel.observer]).run(agent(), "1+2", session_id="w1")
        assert result.stop_reason == "completed"
        assert tel.tracer_provider.force_flush(10_000)
        assert tel.meter_provider.force_flush(10_000)
        assert receiver.got_traces.wait(10) and receiver.got_metrics.wait(10)
    finally:
        tel.shutdown()
    spans = {}
    services = set()
    for req in receiver.traces:
        for rs in req.resource_spans:
            services.update(
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans[s.name] = s
    assert services == {"loom-test"}
    assert set(spans) == {"invoke_agent adder", "chat gpt-4o", "execute_tool add"}
    root, tool_span = spans["invoke_agent adder"], spans["execute_tool add"]
    assert tool_span.parent_span_id == root.span_id and tool_span.trace_id == root.trace_id
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["gen_ai.conversation.id"].string_value == "w1"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 21
    tool_attrs = {a.key: a.value for a in tool_span.attributes}
    assert tool_attrs["gen_ai.tool.call.id"].string_value == "call_1"
    names = {
        m.name
        for req in receiver.metrics
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= names


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_collector_never_fails_a_run(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # seconds: the flush gives up soon
    tel = configure(f"http://127.0.0.1:{closed_port()}", set_global=False)
    caplog.set_level(logging.WARNING)
    try:
        result = await Runtime(observers=[tel.observer]).run(agent(), "1+2")
        assert result.stop_reason == "completed" and result.output == "3"
        # nothing was sent while the run ran: the spans wait in the batch processor's queue
        assert not [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
        tel.tracer_provider.force_flush(5_000)
    finally:
        tel.shutdown()
    failures = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert failures, "the failed export is logged"
    assert all(r.levelno >= logging.WARNING for r in failures)


def test_a_bad_endpoint_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="http:// or https:// URL"):
        configure("localhost:4318", set_global=False)
