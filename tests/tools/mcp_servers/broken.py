"""A deliberately broken MCP server (raw JSON-RPC over stdio) for failure tests.

Modes: hang (never answers), crash (exits at once), crash_on_call (dies during tools/call),
invalid_list (a tool whose inputSchema is not an object), invalid_one (one tool with an invalid
JSON schema next to a good one), slow_call (answers calls after 30 s).
"""

import json
import sys
import time

MODE = sys.argv[1]
GOOD = {
    "name": "echo",
    "description": "Echo the text.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


def send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if MODE == "crash":
    sys.stderr.write("broken server: cannot start (missing configuration)\n")
    sys.exit(3)

for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue  # a notification
    if MODE == "hang":
        continue
    if method == "initialize":
        send(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "result": {
                    "protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "broken", "version": "0"},
                },
            }
        )
    elif method == "tools/list":
        tools = [GOOD]
        if MODE == "invalid_list":
            tools = [GOOD, {"name": "bad", "inputSchema": "not a schema"}]
        elif MODE == "invalid_one":
            tools = [
                GOOD,
                {
                    "name": "bad",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"x": {"type": "no-such-type"}},
                    },
                },
            ]
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call":
        if MODE == "crash_on_call":
            sys.exit(1)
        if MODE == "slow_call":
            time.sleep(30)
        text = msg["params"]["arguments"].get("text", "")
        send(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "result": {"content": [{"type": "text", "text": text}], "isError": False},
            }
        )
    else:
        send(
            {
                "jsonrpc": "2.0",
                "id": mid,
                "error": {"code": -32601, "message": f"method not found: {method}"},
            }
        )
