"""Independent clients against a real ``loom serve``: the ``openai-agents`` SDK using a Loom
agent as its model, and the npm ``@langchain/langgraph-sdk`` client (through ``node``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from tests.server.conftest import Server

JS_DIR = Path(__file__).parent / "js"


async def test_openai_agents_sdk_runs_a_loom_agent_as_its_model(server: Server) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed")
    model = OpenAIChatCompletionsModel(model="calc", openai_client=client)
    agent = Agent(name="front", instructions="Answer briefly.", model=model)

    result = await Runner.run(agent, "add 2 3")
    # The Loom agent ran its own `add` tool server-side; the SDK sees only its answer.
    assert result.final_output == "The sum is 5."

    streamed = Runner.run_streamed(agent, "add 40 2")
    kinds = {event.type async for event in streamed.stream_events()}
    assert streamed.final_output == "The sum is 42."
    assert "raw_response_event" in kinds
    await client.close()


def test_langgraph_js_sdk_streams_a_run(server: Server) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("`node` is not installed: the npm @langchain/langgraph-sdk test needs Node.js")
    if not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        pytest.fail(f"the npm client is not installed: run `npm ci --prefix {JS_DIR}`")
    done = subprocess.run(
        [node, str(JS_DIR / "stream_run.mjs"), server.url, "calc", "add 2 3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=JS_DIR,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["assistants"] == ["calc", "ops"]
    assert out["run_status"] == "success"
    assert out["events"][0] == "metadata" and out["events"][-1] == "end"
    assert {"values", "messages", "updates"} <= set(out["events"])
    assert out["answer"] == "The sum is 5."
    assert out["message_types"] == ["human", "ai", "tool", "ai"]
    assert out["deltas"] == "The sum is 5."  # token deltas, joined
    assert out["state_messages"] == 4
    # The thread the JS client made is an ordinary Loom thread: read it over plain HTTP.
    thread = httpx.get(f"{server.url}/threads/{out['thread_id']}").json()
    assert thread["metadata"]["client"] == "langgraph-sdk-js"
    assert thread["values"]["messages"][-1]["content"] == "The sum is 5."
