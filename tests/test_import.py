"""``import loom`` stays lazy: no pydantic, no SDKs until a name is used."""

from __future__ import annotations

import subprocess
import sys


def printed(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (imports measured from nothing loaded)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_loom_loads_nothing_heavy() -> None:
    code = (
        "import sys, loom; heavy = [m for m in ('pydantic', 'openai', 'anthropic', 'llama_cpp', "
        "'sklearn', 'typer', 'rich') if m in sys.modules]; print(heavy)"
    )
    assert printed(code) == "[]"


def test_public_names_resolve() -> None:
    import loom

    for name in loom.__all__:
        assert getattr(loom, name) is not None


def test_agent_and_tool_load_no_events_no_stores() -> None:
    # `from loom import Agent, tool` is what every script starts with (import time target
    # ≤ 150 ms, issue 11): the event classes and the stores load with the first run.
    code = (
        "import sys; from loom import Agent, tool; print(sorted(m for m in sys.modules if m in "
        "('loom.events', 'loom.store', 'loom.store.base', 'loom.store.codec', "
        "'loom.engine.runtime', 'loom.engine.loop')))"
    )
    assert printed(code) == "[]"


def test_agent_and_tool_build_no_schema_and_start_no_event_loop() -> None:
    # Issue 26's import target (≤ 100 ms, benchmarks/core.py): the message models build their
    # pydantic schemas on first use (which also keeps pydantic's plugin scan, importlib.metadata,
    # out of the import), and asyncio with its thread pools loads with the first run.
    code = (
        "import sys; from loom import Agent, tool; from loom.messages import Message; "
        "print(Message.__pydantic_complete__, sorted(m for m in sys.modules if m in "
        "('asyncio', 'concurrent.futures', 'importlib.metadata', 'loom.tools.threads')))"
    )
    assert printed(code) == "False []"


def test_a_deferred_message_schema_still_validates_on_first_use() -> None:
    code = (
        "from loom.messages import Message; "
        "m = Message.model_validate({'role': 'user', 'content': 'hi'}); print(m.content)"
    )
    assert printed(code) == "hi"
