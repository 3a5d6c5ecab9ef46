"""schemathesis against the OpenAPI schema a real ``loom serve`` process serves: every
operation, generated inputs (a few per operation), no 5xx, and every response matches its
documented schema and content type.

Driven through Hypothesis directly (``APIOperation.as_strategy``): schemathesis's pytest plugin
does not run under pytest 9.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.server.conftest import start_server, stop_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)

CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


def test_every_operation_conforms(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        failures: list[str] = []
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) > 40
        for op in operations:

            @given(case=op.as_strategy())
            @settings(
                max_examples=8,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(checks=CHECKS, timeout=20)

            try:
                check()
            except Exception as exc:
                failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:1500]}")
        assert not failures, "\n\n".join(failures)
    finally:
        stop_server(server)
