"""Benchmarks for tools and policy: permission check cost, MCP stdio round trip vs in-process.

    PYTHONPATH=src python benchmarks/tools_policy.py [--quick]

Prints JSON: median microseconds per permission check for typical calls, and the median round
trip of mcp-server-time's get_current_time over stdio (through Loom's MCP tool) next to the same
function called in-process (as a Loom @tool through the same executor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def per_call_us(fn: Callable[[], Any], n: int, repeat: int = 5) -> float:
    """Median over ``repeat`` batches of the mean µs per call in a batch of ``n``."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return round(statistics.median(samples), 2)


def permission_figures(n: int) -> dict[str, Any]:
    from loom.messages import ToolCall
    from loom.policy.permissions import PermissionManager, build_permissions
    from loom.policy.shell import analyze
    from loom.tools.registry import builtin_tool

    ws = Path(tempfile.mkdtemp())
    (ws / "docs").mkdir()
    pm = PermissionManager(
        {
            "allow": [
                "read_file",
                "grep",
                "write_file(docs/**)",
                "bash(git status*)",
                "bash(ls*)",
                "my_tool",
            ],
            "deny": ["bash(rm *)", "write_file(.env)"],
            "ask": ["bash(git push*)"],
        }
    )
    default = build_permissions(None, None)
    read, write, bash = (builtin_tool(n) for n in ("read_file", "write_file", "bash"))
    cases = {
        "custom_tool_allow": (pm, ToolCall(name="my_tool", arguments={"x": 1}), None),
        "read_file_allow": (pm, ToolCall(name="read_file", arguments={"path": "src/a.py"}), read),
        "write_file_path_rule_in_workspace": (
            pm,
            ToolCall(name="write_file", arguments={"path": "docs/a.md", "content": "x"}),
            write,
        ),
        "bash_compound_cached_parse": (
            pm,
            ToolCall(name="bash", arguments={"command": "git status && ls -la | ls"}),
            bash,
        ),
        "default_policy_custom_tool": (default, ToolCall(name="my_tool", arguments={"a": 1}), None),
    }
    out: dict[str, Any] = {}
    for label, (manager, call, tool) in cases.items():
        out[label] = per_call_us(lambda m=manager, c=call, t=tool: m.check(c, t, workspace=ws), n)
    commands = [f"git status && ls dir{i} | grep x{i} > /dev/null" for i in range(n)]
    it = iter(commands * 5)
    out["bash_parse_uncached_bashlex"] = per_call_us(lambda: analyze.__wrapped__(next(it)), n)
    return out


async def mcp_figures(n: int) -> dict[str, Any]:
    from mcp_server_time.server import TimeServer

    from loom.messages import ToolCall
    from loom.tools.base import RunContext, tool
    from loom.tools.executor import execute_call
    from loom.tools.mcp import mcp_server

    server = mcp_server("time", command=sys.executable, args=["-m", "mcp_server_time"])
    started = time.perf_counter()
    tools = {t.name: t for t in await server.load_tools()}
    connect_ms = (time.perf_counter() - started) * 1000
    ts = TimeServer()

    @tool(effect="pure", blocking=False)
    def get_current_time(timezone: str) -> str:
        """The same function, in-process."""
        return ts.get_current_time(timezone).model_dump_json(indent=2)

    ctx = RunContext("s", "r", "c")
    call = ToolCall(name="get_current_time", arguments={"timezone": "Europe/Paris"})

    async def timed(registry: dict[str, Any], count: int) -> float:
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            result = await execute_call(call, registry, ctx, 30.0)
            samples.append((time.perf_counter() - t0) * 1e6)
            assert result.success, result.error_message
        return round(statistics.median(samples), 1)

    await timed(tools, 20)  # warm up
    stdio = await timed(tools, n)
    local = await timed({"get_current_time": get_current_time}, n)
    await server.aclose()
    return {
        "connect_and_list_ms": round(connect_ms, 1),
        "stdio_round_trip_us_median": stdio,
        "in_process_us_median": local,
        "ratio_stdio_over_in_process": round(stdio / local, 1),
        "calls": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    n_check = 2000 if args.quick else 20000
    n_mcp = 100 if args.quick else 1000
    result = {
        "permission_check_us_per_call": permission_figures(n_check),
        "mcp_get_current_time": asyncio.run(mcp_figures(n_mcp)),
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
