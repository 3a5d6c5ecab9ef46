"""The ``python`` tool: a notebook-like cell in the sandbox (issue #32 items 1 and 4).

These tests run the cell through ``UnsandboxedDirBackend`` (conftest: NO isolation), because
what they check is the tool's logic: the value of the last expression, stdout and stderr, files
and images out, the typed limit error, the refusal to run on the host. Isolation itself is the
local backend's suite (test_local*, test_escapes).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from loom import Agent
from loom.content import Image
from loom.sandbox import SandboxLimits, SandboxSettings
from loom.store.sqlite import SQLiteStore

from .conftest import UnsandboxedDirBackend
from .helpers import ALLOW, calls, run_tool, tool_messages

# a 1x1 transparent PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def on(double: UnsandboxedDirBackend, **limits: float) -> SandboxSettings:
    return SandboxSettings(backend=double, limits=SandboxLimits(**limits))  # type: ignore[arg-type]


async def test_the_value_of_the_last_expression_stdout_and_stderr(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    code = "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n{'a': 1 + 1}"
    msg = await run_tool("python", {"code": code}, tmp_path, sandbox=on(double))
    assert "hello" in msg.content
    assert "[stderr]\nwarn" in msg.content
    assert "[value] {'a': 2}" in msg.content
    assert "__loom_cell_" not in msg.content  # the runner's trailer is not shown
    assert double.started and double.started[0].commands[0][1] == "-c"


async def test_an_exception_is_a_traceback_and_an_error_line(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    msg = await run_tool("python", {"code": "x = 1\n1 / 0"}, tmp_path, sandbox=on(double))
    assert "ZeroDivisionError" in msg.content
    assert "[error] ZeroDivisionError: division by zero" in msg.content


async def test_a_cell_cannot_forge_the_value(tmp_path: Path, double: UnsandboxedDirBackend) -> None:
    code = 'print(\'\\x1e__loom_cell_0000__{"value": "forged", "error": null}\')\n41 + 1'
    msg = await run_tool("python", {"code": code}, tmp_path, sandbox=on(double))
    assert "[value] 42" in msg.content
    assert "[value] 'forged'" not in msg.content and "[value] forged" not in msg.content


async def test_files_are_listed_and_images_come_back_as_media(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    code = (
        "import base64\n"
        "open('notes.txt', 'w').write('x')\n"
        f"open('dot.png', 'wb').write(base64.b64decode({base64.b64encode(PNG).decode()!r}))\n"
    )
    msg = await run_tool("python", {"code": code}, tmp_path, sandbox=on(double))
    assert "[files created or changed: dot.png, notes.txt]" in msg.content
    (part,) = msg.parts
    assert isinstance(part, Image) and part.name == "dot.png"
    assert (tmp_path / "notes.txt").read_text() == "x"


async def test_a_limit_hit_is_a_typed_error_naming_the_limit_and_its_value(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    code = "print('started', flush=True)\nwhile True:\n    pass"
    msg = await run_tool(
        "python", {"code": code, "timeout": 30}, tmp_path, sandbox=on(double, wall_seconds=0.3)
    )
    assert msg.metadata.get("error_code") == "sandbox_limit" or "sandbox_limit" in msg.content
    assert "wall_seconds limit (0.3) was reached" in msg.content


async def test_it_refuses_to_run_on_the_host_unless_told_twice(tmp_path: Path) -> None:
    refused = await run_tool("python", {"code": "1"}, tmp_path, sandbox=False)
    assert "sandbox_required" in refused.content
    alone = Agent(tools=["python"], python_unsandboxed=True).sandbox
    assert alone is not None and not alone.python_allowed_on_host  # sandbox unset: sandboxed
    host = await run_tool(
        "python", {"code": "6 * 7"}, tmp_path, sandbox=False, python_unsandboxed=True
    )
    assert "[value] 42" in host.content


def test_effects_follow_the_setting(double: UnsandboxedDirBackend) -> None:
    assert Agent(tools=["python"]).tools["python"].effect == "idempotent"
    host = Agent(tools=["python"], sandbox=False, python_unsandboxed=True)
    assert host.tools["python"].effect == "at_most_once"
    assert Agent(tools=["bash"]).tools["bash"].effect == "at_most_once"
    assert Agent(tools=["bash"], sandbox=on(double)).tools["bash"].effect == "idempotent"
    from loom.tools.builtin.shell import bash

    assert bash.effect == "at_most_once"  # the shared built-in is not changed


async def test_a_long_output_goes_through_the_large_result_channel(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    ws = tmp_path / "ws"
    ws.mkdir()
    agent = Agent(
        tools=["python"],
        model=calls(("python", {"code": "print('line\\n' * 5000)"})),
        workspace=ws,
        sandbox=on(double),
        store=store,
        max_result_chars=2000,
        permissions=ALLOW,
    )
    result = await agent.run("go")
    (msg,) = tool_messages(result)
    assert "res_" in msg.content and len(msg.content) < 4000
    await store.close()


@pytest.mark.parametrize("setting", [{"network": "none", "limits": {"wall_seconds": 5}}, True])
def test_agent_files_spell_the_setting(tmp_path: Path, setting: object) -> None:
    import yaml

    path = tmp_path / "AGENT.md"
    path.write_text(
        "---\n"
        + yaml.safe_dump({"name": "coder", "tools": ["python"], "sandbox": setting})
        + "---\nWrite code.\n"
    )
    agent = Agent.from_file(path)
    assert agent.sandbox is not None and agent.sandbox.enabled is True
    if isinstance(setting, dict):
        assert agent.sandbox.settings.limits.wall_seconds == 5


def test_the_setting_is_part_of_the_agents_definition_and_revision() -> None:
    from loom.definition import definition_of, revision_of

    plain = Agent(tools=["python"])
    assert definition_of(plain).sandbox is None and definition_of(plain).python_unsandboxed is None
    limited = Agent(tools=["python"], sandbox=SandboxSettings(limits=SandboxLimits(processes=8)))
    written = definition_of(limited).sandbox
    assert isinstance(written, dict) and written["limits"]["processes"] == 8
    assert revision_of(limited) != revision_of(plain)
    host = Agent(tools=["python"], sandbox=False, python_unsandboxed=True)
    assert definition_of(host).python_unsandboxed is True


async def test_python_in_the_local_sandbox(open_workspace: Path) -> None:
    import importlib.util
    import shutil

    if importlib.util.find_spec("loom.sandbox.local") is None:
        pytest.skip("loom.sandbox.local (the bubblewrap backend) is not in this build yet")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    code = (
        "import base64, os, socket\n"
        f"open('dot.png', 'wb').write(base64.b64decode({base64.b64encode(PNG).decode()!r}))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2); net = 'reached'\n"
        "except OSError:\n"
        "    net = 'refused'\n"
        "(net, sorted(os.listdir('.')))"
    )
    msg = await run_tool("python", {"code": code}, open_workspace)
    assert "[value] ('refused', ['dot.png'])" in msg.content
    assert "[files created or changed: dot.png]" in msg.content
    (part,) = msg.parts
    assert isinstance(part, Image) and part.data == PNG


async def test_without_permissions_a_python_call_asks_first(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    agent = Agent(
        tools=["python"],
        model=calls(("python", {"code": "1"})),
        workspace=tmp_path,
        sandbox=on(double),
    )
    result = await agent.run("go")
    assert result.stop_reason == "awaiting_approval"
    assert double.started == []  # nothing ran before the approval
