"""``bash`` in the sandbox when the agent's ``sandbox:`` setting is on (issue #32 item 1).

The logic tests use ``UnsandboxedDirBackend`` (conftest: NO isolation); the last test runs a
real command through the bubblewrap backend and is skipped, with the reason, where it cannot.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from loom.sandbox import SandboxLimits, SandboxSettings

from .conftest import UnsandboxedDirBackend
from .helpers import run_tool


async def test_bash_runs_in_the_sandbox_when_the_setting_is_on(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    msg = await run_tool(
        "bash",
        {"command": "echo out; echo err >&2; touch made.txt; exit 3"},
        tmp_path,
        sandbox=SandboxSettings(backend=double),
    )
    (box,) = double.started
    assert box.commands == [["/bin/bash", "-c", "echo out; echo err >&2; touch made.txt; exit 3"]]
    assert msg.content.startswith("out\n[stderr]\nerr")
    assert "[exit code 3]" in msg.content
    assert "[files created or changed: made.txt]" in msg.content


@pytest.mark.parametrize("setting", [None, False])
async def test_bash_stays_on_the_host_unless_the_setting_is_on(
    tmp_path: Path, setting: bool | None
) -> None:
    msg = await run_tool("bash", {"command": "echo hi; exit 2"}, tmp_path, sandbox=setting)
    assert msg.content == "hi\n\n[exit code 2]"  # today's host format: output, then the code


async def test_the_timeout_argument_bounds_the_sandbox_wall_limit(
    tmp_path: Path, double: UnsandboxedDirBackend
) -> None:
    msg = await run_tool(
        "bash",
        {"command": "sleep 30", "timeout": 0.2},
        tmp_path,
        sandbox=SandboxSettings(backend=double, limits=SandboxLimits(wall_seconds=60)),
    )
    assert "sandbox_limit" in msg.content
    assert "wall_seconds limit (0.2) was reached" in msg.content


def _local_backend_or_skip() -> None:
    if importlib.util.find_spec("loom.sandbox.local") is None:
        pytest.skip("loom.sandbox.local (the bubblewrap backend) is not in this build yet")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")


async def test_bash_in_the_local_sandbox_sees_the_workspace_and_not_the_host(
    tmp_path: Path, open_workspace: Path
) -> None:
    _local_backend_or_skip()
    ws = open_workspace
    (ws / "inside.txt").write_text("in")
    secret = tmp_path / "secret.txt"  # on the host, outside the workspace
    secret.write_text("host secret")
    msg = await run_tool(
        "bash",
        {"command": f"cat inside.txt; cat {secret}; echo new | tee out.txt"},
        ws,
        sandbox=True,
    )
    assert msg.content.startswith("in")
    assert "host secret" not in msg.content
    assert "[files created or changed: out.txt]" in msg.content
    assert (ws / "out.txt").read_text() == "new\n"
