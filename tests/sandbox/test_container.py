"""The container backend (issue #32 item 2). The command line it builds is checked without a
daemon; running containers needs one, and those tests skip, saying why, when ``docker info``
(or ``podman info``) fails, as it does on the machine this was written on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from loom.sandbox import SandboxLimits, SandboxSettings, SandboxUnavailable
from loom.sandbox.container import ContainerBackend, container_command


def test_the_command_line_enforces_the_settings(tmp_path: Path) -> None:
    limits = SandboxLimits(memory_bytes=1 << 28, processes=32, cpu_seconds=5)
    argv = container_command(
        "docker",
        "img",
        "loom-x",
        tmp_path,
        SandboxSettings(env={"A": "1"}),
        limits,
        ["python3", "-c", "1"],
        cwd="sub",
    )
    joined = " ".join(argv)
    for expected in (
        "run --rm -i --name loom-x",
        "--network none",
        f"--memory {1 << 28}",
        "--pids-limit 32",
        "--ulimit cpu=5:5",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--read-only",
        f"--user {os.getuid()}:{os.getgid()}",
        f"-v {tmp_path}:/workspace:rw",
        "-w /workspace/sub",
        "-e A=1",
    ):
        assert expected in joined
    assert argv[-4:] == ["img", "python3", "-c", "1"]
    allowed = container_command(
        "podman", "img", "n", tmp_path, SandboxSettings(network="all"), limits, ["true"]
    )
    assert "--network" not in allowed and allowed[0] == "podman"


async def test_a_host_list_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="listed hosts"):
        await ContainerBackend().start(SandboxSettings(network=("pypi.org",)), tmp_path)


def _daemon_or_skip() -> ContainerBackend:
    reasons = []
    for program in ("docker", "podman"):
        backend = ContainerBackend(program)
        why = asyncio.run(backend.available())
        if why is None:
            return backend
        reasons.append(why)
    pytest.skip(f"no container daemon answers here ({'; '.join(reasons)}): untested here")


def test_no_daemon_is_a_typed_error_that_says_what_to_do(tmp_path: Path) -> None:
    backend = ContainerBackend("docker")
    why = asyncio.run(backend.available())
    if why is None:
        pytest.skip("a docker daemon answers here: nothing to refuse")
    with pytest.raises(SandboxUnavailable, match="cannot run"):
        asyncio.run(backend.start(SandboxSettings(), tmp_path))


def test_a_command_runs_in_a_container_over_the_workspace(tmp_path: Path) -> None:
    backend = _daemon_or_skip()

    async def go() -> None:
        box = await backend.start(SandboxSettings(), tmp_path)
        result = await box.run(["sh", "-c", "echo hi > f.txt; cat f.txt"])
        assert result.stdout == "hi\n" and result.files == ("f.txt",)
        await box.close()

    asyncio.run(go())


def test_the_wall_limit_kills_the_container(tmp_path: Path) -> None:
    backend = _daemon_or_skip()

    async def go() -> None:
        box = await backend.start(SandboxSettings(), tmp_path)
        result = await box.run(["sleep", "30"], limits=SandboxLimits(wall_seconds=1))
        assert result.limit is not None and result.limit.limit == "wall_seconds"
        await box.close()

    asyncio.run(go())
