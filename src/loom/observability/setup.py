"""Set up the OpenTelemetry SDK to send Loom's traces and metrics over OTLP/HTTP.

``configure(endpoint)`` installs a tracer provider with a ``BatchSpanProcessor`` (export runs on
its own thread: an unreachable collector never slows or fails a run; the exporter logs a
warning and the batch is dropped) and a meter provider with a periodic OTLP metric reader, and
returns an ``OtelObserver`` on them. The standard variables apply: ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` (used when ``endpoint`` is not
given), ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_EXPORTER_OTLP_TIMEOUT``, ``OTEL_BSP_*`` and
``OTEL_METRIC_EXPORT_INTERVAL``. Needs the ``otel`` extra (``pip install loom-agents[otel]``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from loom.errors import ConfigurationError, MissingDependencyError

__all__ = ["Telemetry", "configure"]


@dataclass(slots=True)
class Telemetry:
    """What ``configure`` set up: the observer to give a ``Runtime`` and the providers."""

    observer: Any  # loom.observability.otel.OtelObserver
    tracer_provider: Any
    meter_provider: Any

    def shutdown(self) -> None:
        """Flush what is batched and stop exporting (bounded by the exporters' timeouts)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def _url(base: str, path: str) -> str:
    if not base.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"an OTLP endpoint is an http:// or https:// URL such as http://localhost:4318, "
            f"got {base!r}"
        )
    base = base.rstrip("/")
    return base if base.endswith(path) else f"{base}{path}"


def configure(
    endpoint: str | None = None,
    *,
    service_name: str | None = None,
    capture_content: bool | None = None,
    set_global: bool = True,
) -> Telemetry:
    """Export traces and metrics over OTLP/HTTP to ``endpoint`` (the collector's base URL,
    e.g. ``http://localhost:4318``; ``/v1/traces`` and ``/v1/metrics`` are added), or to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``. ``set_global`` also makes the providers OpenTelemetry's
    global ones (so other instrumentation in the process joins the same traces)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise MissingDependencyError(
            "opentelemetry-sdk", "otel", "exporting traces (--otlp-endpoint)"
        ) from None
    from opentelemetry import metrics, trace

    from loom.observability.otel import OtelObserver

    base = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    attrs = {"service.name": service_name} if service_name else {}
    resource = Resource.create(attrs)  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES merge in
    if not service_name and not os.environ.get("OTEL_SERVICE_NAME"):
        resource = resource.merge(Resource({"service.name": "loom"}))
    spans = OTLPSpanExporter(endpoint=_url(base, "/v1/traces")) if base else OTLPSpanExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    metric_exporter = (
        OTLPMetricExporter(endpoint=_url(base, "/v1/metrics")) if base else OTLPMetricExporter()
    )
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)]
    )
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    observer = OtelObserver(tracer_provider, meter_provider, capture_content=capture_content)
    return Telemetry(observer, tracer_provider, meter_provider)
