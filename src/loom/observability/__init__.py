"""Seeing what agents do from outside: OpenTelemetry traces and metrics with the GenAI semantic
conventions (``otel.OtelObserver``), SDK and exporter set-up (``setup.configure``).

Nothing here is imported by ``import loom``: a runtime traces only when it is given an
``OtelObserver`` (``Runtime(observers=[OtelObserver()])``, or ``loom serve --otlp-endpoint``).
Without the OpenTelemetry SDK installed (the ``otel`` extra) the observer uses the API's
no-op tracer and costs next to nothing. See docs/observability.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.observability.otel import OtelObserver
    from loom.observability.setup import configure

__all__ = ["OtelObserver", "configure"]


def __getattr__(name: str) -> Any:
    if name == "OtelObserver":
        from loom.observability.otel import OtelObserver

        return OtelObserver
    if name == "configure":
        from loom.observability.setup import configure

        return configure
    raise AttributeError(name)
