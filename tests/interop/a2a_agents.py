"""Agents served over A2A in tests/interop (scripted models: no LLM needed).

``calc`` adds two numbers with a tool, ``ops`` deploys after a human approves, ``waiter``
waits for a file the test creates (so a test holds a task in ``working`` as long as it likes),
``looker`` says what media it was given (their bytes' digests) and answers with a chart when
asked to draw (with a chart, a PDF and a sound when asked for everything), and ``boss`` (on
a second server) asks a remote agent through ``a2a_agent``.
"""

import asyncio
import hashlib
import io
import os
import struct
import wave
import zlib
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall, tool
from loom.content import Audio, File, Image
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    return f"deployed {target}"


@tool
async def wait_for(name: str) -> str:
    """Wait until the file NAME exists in the server's directory; return its text."""
    path = Path(name)
    # the test (another process) creates the file when it wants the call to end
    while not path.exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.02)
    return path.read_text()  # noqa: ASYNC240


def calc(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"The sum is {last.content}."
    numbers = [int(w) for w in last.content.split() if w.lstrip("-").isdigit()]
    if len(numbers) >= 2:
        return ModelResponse(
            tool_calls=[ToolCall(name="add", arguments={"a": numbers[0], "b": numbers[1]})]
        )
    return f"echo: {last.content}"


def ops(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    return ModelResponse(tool_calls=[ToolCall(name="deploy", arguments={"target": "prod"})])


def waiter(messages, tools):
    last = messages[-1]
    if last.role == "tool":
        return f"released: {last.content}"
    return ModelResponse(
        tool_calls=[ToolCall(name="wait_for", arguments={"name": last.content.split()[-1]})]
    )


def png(width: int, height: int) -> bytes:
    """A real PNG of a red rectangle (no Pillow needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff\x30\x30" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


CHART = png(24, 16)
REPORT = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


def wav() -> bytes:
    """A tenth of a second of silence as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * 800)
    return out.getvalue()


BEEP = wav()


def looker(messages, tools):
    """Report each medium of the last message (kind, type, name, size, sha256 of its bytes or
    its URL): what the test checks the model was given; answer with CHART when asked to draw."""
    last = messages[-1]
    seen = []
    for p in last.parts:
        what = hashlib.sha256(p.data).hexdigest() if p.data is not None else f"url={p.url}"
        seen.append(f"{p.kind} {p.media_type} {p.name} {p.size} {what}")
    text = f"text={last.content!r}; " + "; ".join(seen)
    if "everything" in last.content:  # an image, a document and a sound
        return ModelResponse(
            text="all of it",
            parts=[
                Image.from_bytes(CHART, name="chart.png"),
                File.from_bytes(REPORT, name="report.pdf"),
                Audio.from_bytes(BEEP, name="beep.wav"),
            ],
        )
    if "draw" in last.content:
        chart = Image.from_bytes(CHART, name="chart.png")
        return ModelResponse(text="here is your chart", parts=[chart])
    return text


CALC = Agent(name="calc", instructions="You add numbers.", model=FunctionModel(calc), tools=[add])
OPS = Agent(
    name="ops",
    instructions="You deploy.",
    model=FunctionModel(ops),
    tools=[deploy],
    permissions={"ask": ["deploy"]},
)
WAITER = Agent(
    name="waiter", instructions="You wait for files.", model=FunctionModel(waiter), tools=[wait_for]
)
LOOKER = Agent(name="looker", instructions="You look at files.", model=FunctionModel(looker))
registry = AgentRegistry([CALC, OPS, WAITER, LOOKER])


def boss_registry():
    """The second server: ``boss`` forwards the user's words to a remote agent and reports."""
    from loom.tools import a2a_agent

    headers = {"Authorization": f"Bearer {os.environ['REMOTE_KEY']}"}
    calc_remote = a2a_agent(os.environ["REMOTE_CALC"], headers=headers)
    waiter_remote = a2a_agent(os.environ["REMOTE_WAITER"], headers=headers, timeout=1.5)

    def boss(messages, tools):
        last = messages[-1]
        if last.role == "tool":
            return f"remote says: {last.content}"
        target = "waiter" if last.content.startswith("wait") else "calc"
        return ModelResponse(
            tool_calls=[ToolCall(name=target, arguments={"message": last.content})]
        )

    return AgentRegistry(
        [
            Agent(
                name="boss",
                instructions="You delegate.",
                model=FunctionModel(boss),
                tools=[calc_remote, waiter_remote],
            )
        ]
    )
