"""Suite-wide fixtures. No test may reach a paid API: provider variables point at a closed port."""

from __future__ import annotations

import os

import pytest

# Set at import so that every test, fixture and subprocess sees them.
for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LOOM_MODEL"):
    os.environ.pop(var, None)
os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # discard port: fails at once
os.environ["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
