"""AG-UI, driven by ``@ag-ui/client``'s HttpAgent (which verifies the event order as it reads
the stream) against a real ``loom serve``; bad input checked over plain HTTP."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.interop.a2a_agents import png
from tests.server.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.timeout(120)


def _node(js: Path, url: str, scenario: str) -> dict[str, Any]:
    out = subprocess.run(
        ["node", str(js / "agui_client.mjs"), url, scenario],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def test_text_answer(interop_server: Server, js: Path) -> None:
    report = _node(js, f"{interop_server.url}/agui/calc", "text")
    assert report["ok"], report
    [run] = report["runs"]
    kinds = run["types"]
    assert kinds[0] == "RUN_STARTED" and kinds[-2:] == ["STATE_SNAPSHOT", "RUN_FINISHED"]
    assert kinds[1] == "TEXT_MESSAGE_START" and "TEXT_MESSAGE_END" in kinds
    assert run["outcome"] == {"type": "success"}
    assert run["result"]["stop_reason"] == "completed"
    assert [m["content"] for m in run["newMessages"]] == ["echo: hello there"]


def test_default_agent_is_the_first(interop_server: Server, js: Path) -> None:
    report = _node(js, f"{interop_server.url}/agui", "text")
    assert report["ok"], report
    assert report["runs"][0]["newMessages"][0]["content"] == "echo: hello there"


def test_server_side_tool_calls(interop_server: Server, js: Path) -> None:
    report = _node(js, f"{interop_server.url}/agui/calc", "tools")
    assert report["ok"], report
    [run] = report["runs"]
    kinds = run["types"]
    start = kinds.index("TOOL_CALL_START")
    assert kinds[start : start + 4] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    call, result, answer = run["newMessages"]
    assert call["toolCalls"][0]["function"]["name"] == "add"
    assert json.loads(call["toolCalls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert result == {
        "id": result["id"],
        "role": "tool",
        "toolCallId": call["toolCalls"][0]["id"],
        "content": "5",
    }
    assert answer["content"] == "The sum is 5."


def test_frontend_tool_pauses_then_continues_with_the_clients_result(
    interop_server: Server, js: Path
) -> None:
    report = _node(js, f"{interop_server.url}/agui/painter", "frontend")
    assert report["ok"], report
    first, second = report["runs"]
    # the first run ends with the call for the client to run, and no result of its own
    assert first["types"][1:4] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    assert "TOOL_CALL_RESULT" not in first["types"]
    [call_id] = first["outcome"]["pendingToolCallIds"]
    assert first["newMessages"][0]["toolCalls"][0]["id"] == call_id
    # the second run carried the client's result: the model read it
    assert second["outcome"] == {"type": "success"}
    assert second["newMessages"][-1]["content"] == "You picked teal."
    # ... and it is in the journal as that call's result
    sid = first["result"]["session_id"]
    state = httpx.get(f"{interop_server.url}/threads/{sid}/state").json()
    tool_messages = [m for m in state["values"]["messages"] if m.get("type") == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [(call_id, "teal")]


def test_bad_input(interop_server: Server, js: Path) -> None:
    report = _node(js, f"{interop_server.url}/agui/calc", "bad")
    assert not report["ok"] and "HTTP 422" in report["error"]
    assert "the last message must be a user message" in report["error"]
    url = f"{interop_server.url}/agui/calc"
    r = httpx.post(url, json={"threadId": "t", "messages": []})
    assert r.status_code == 422 and "runId" in r.json()["error"]["message"]
    r = httpx.post(url, content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(
        f"{interop_server.url}/agui/nobody", json={"threadId": "t", "runId": "r", "messages": []}
    )
    assert r.status_code == 404 and "no agent named 'nobody'" in r.text


def test_server_side_approval_is_an_interrupt_and_resume_answers_it(
    interop_server: Server,
) -> None:
    url = f"{interop_server.url}/agui/ops"
    thread = "agui-approval"
    msg = {"id": "u1", "role": "user", "content": "deploy"}
    first = _events(url, {"threadId": thread, "runId": "r1", "messages": [msg]})
    finished = first[-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    [interrupt] = finished["outcome"]["interrupts"]
    second = _events(
        url,
        {
            "threadId": thread,
            "runId": "r2",
            "messages": [msg],
            "resume": [
                {
                    "interruptId": interrupt["id"],
                    "status": "resolved",
                    "payload": {"approved": True},
                }
            ],
        },
    )
    assert second[-1]["outcome"] == {"type": "success"}
    results = [e["content"] for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert results == ["deployed prod"]


def _events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]


def test_a_server_query_is_an_interrupt_and_resume_answers_it(query_server: Server) -> None:
    url = f"{query_server.url}/agui/reader"
    thread = "agui-query"
    msg = {"id": "u1", "role": "user", "content": "what does main do?"}
    first = _events(url, {"threadId": thread, "runId": "r1", "messages": [msg]})
    finished = first[-1]
    assert finished["type"] == "RUN_FINISHED", finished
    assert finished["outcome"]["type"] == "interrupt", finished["outcome"]
    [interrupt] = finished["outcome"]["interrupts"]
    assert interrupt["reason"] == "server_query"
    assert interrupt["message"] == "I need to read src/main.rs"  # the words that asked
    assert interrupt["responseSchema"]["required"] == ["answer"]
    assert interrupt["metadata"] == {"kind": "file_read", "data": {"path": "src/main.rs"}}
    resume = {"interruptId": interrupt["id"], "status": "resolved", "payload": {"answer": "x"}}
    second = _events(
        url, {"threadId": thread, "runId": "r2", "messages": [msg], "resume": [resume]}
    )
    assert second[-1]["outcome"] == {"type": "success"}, second[-1]
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.startswith("The file begins with:")
    assert second[-1]["result"]["stop_reason"] == "completed"


# -- media in a user message's content ------------------------------------------------------------
def test_media_content_parts_reach_the_model(media_server: Server, js: Path) -> None:
    """@ag-ui/client sends a content array (text, an inline PNG, an inline PDF named in its
    metadata, an image URL): the model gets the very bytes, typed and named, and the URL."""
    import base64
    import hashlib
    import os

    from tests.interop.a2a_agents import REPORT, png
    from tests.interop.conftest import MEDIA_KEY

    photo = png(5, 5)
    env = {
        "AGUI_PNG": base64.b64encode(photo).decode(),
        "AGUI_PDF": base64.b64encode(REPORT).decode(),
    }
    out = subprocess.run(
        ["node", str(js / "agui_client.mjs"), f"{media_server.url}/agui/looker", "media"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "LOOM_KEY": MEDIA_KEY},
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    [answer] = report["runs"][0]["newMessages"]
    seen = answer["content"]
    assert seen.startswith("text='what are these?'; ")
    assert f"image image/png None {len(photo)} {hashlib.sha256(photo).hexdigest()}" in seen
    assert (
        f"file application/pdf report.pdf {len(REPORT)} {hashlib.sha256(REPORT).hexdigest()}"
        in seen
    )
    assert "image image/jpeg None None url=https://example.com/cat.jpg" in seen


def test_media_content_loom_cannot_use_is_a_422_saying_why(media_server: Server) -> None:
    """Built with the protocol's own types (``ag_ui.core``): a provider's file handle, bytes
    that are not the image they claim, a document sent as an image."""
    from ag_ui.core import (
        DataSource,
        DocumentPart,
        FileSource,
        ImagePart,
        RunAgentInput,
        TextPart,
        UserMessage,
    )
    from tests.interop.conftest import MEDIA_KEY

    cases = [
        (
            ImagePart(source=FileSource(value="file-abc123", provider="openai")),
            "file handle of openai",
        ),
        (
            ImagePart(source=DataSource(value="bm90IGEgcG5n", mime_type="image/png")),
            "claims image/png",
        ),
        (
            ImagePart(source=DataSource(value="JVBERi0xLjQK", mime_type="application/pdf")),
            "not an image",
        ),
        (
            DocumentPart(source=DataSource(value="%%%", mime_type="application/pdf")),
            "not valid base64",
        ),
    ]
    for i, (part, says) in enumerate(cases):
        body = RunAgentInput(
            thread_id=f"t-bad-media-{i}",
            run_id=f"r{i}",
            state={},
            messages=[UserMessage(id=f"u{i}", content=[TextPart(text="look"), part])],
            tools=[],
            context=[],
            forwarded_props={},
        )
        r = httpx.post(
            f"{media_server.url}/agui/looker",
            content=body.model_dump_json(by_alias=True, exclude_none=True),
            headers={"content-type": "application/json", "x-api-key": MEDIA_KEY},
            timeout=30,
        )
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "content part 1" in message and says in message, message
        assert message.count("content part 1") == 1, message  # named once, not twice


# -- what an answer gives out: reasoning, media ----------------------------------------------------
OUT_KEY = "agui-out-key-0001"
SHOT = png(3, 2)  # the image the served agents' tool and answer carry
OUT_AGENTS = r'''
"""Agents whose answers carry reasoning and media (scripted models)."""

import base64

from loom import Agent, ModelResponse, ToolCall, tool
from loom.content import Image, Reasoning
from loom.server import AgentRegistry
from loom.testing import FunctionModel


SHOT = base64.b64decode("SHOT_B64")


class LiveThinker:  # streams its reasoning before its answer, as reasoning models do
    name = "live-thinker"
    reports_real_usage = False

    async def stream(self, messages, tools, settings=None):
        from loom.models.base import ReasoningDelta, TextDelta

        yield ReasoningDelta("six ")
        yield ReasoningDelta("times seven")
        yield TextDelta("42")
        yield ModelResponse(text="42", parts=[Reasoning(text="six times seven", provider="test")])


def thinker(messages, tools):  # its reasoning comes whole, with the answer (no deltas)
    return ModelResponse(text="42", parts=[Reasoning(text="six times seven", provider="test")])


@tool
def snap(subject: str) -> list:
    """Take a picture of a subject."""
    return [f"a picture of {subject}", Image.from_bytes(SHOT, name="shot.png")]


def photographer(messages, tools):
    if messages[-1].role == "tool":
        return "Here it is."
    return ModelResponse(tool_calls=[ToolCall(name="snap", arguments={"subject": "the sea"})])


def drawer(messages, tools):  # an answer that is an image
    return ModelResponse(text="here is your chart",
                         parts=[Image.from_bytes(SHOT, name="chart.png")])


def screen(messages, tools):  # asks the page (a frontend tool) for a screenshot
    last = messages[-1]
    if last.role == "tool":
        import hashlib

        seen = [f"{p.kind} {p.media_type} {p.name} {hashlib.sha256(p.data).hexdigest()}"
                for p in last.parts]
        return f"text={last.content.splitlines()[0]!r}; " + "; ".join(seen)
    return ModelResponse(tool_calls=[ToolCall(name="screenshot", arguments={})])


registry = AgentRegistry([
    Agent(name="screen", instructions="Look at the page.", model=FunctionModel(screen)),
    Agent(name="live-thinker", instructions="Think.", model=LiveThinker()),
    Agent(name="thinker", instructions="Think.", model=FunctionModel(thinker)),
    Agent(name="photographer", instructions="Take pictures.", model=FunctionModel(photographer),
          tools=[snap]),
    Agent(name="drawer", instructions="Draw.", model=FunctionModel(drawer)),
])
'''.replace("SHOT_B64", base64.b64encode(SHOT).decode())


@pytest.fixture(scope="module")
def out_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``loom serve`` (SQLite: media stored once) whose answers carry reasoning and media."""
    srv = start_server(
        tmp_path_factory.mktemp("agui-out"),
        app="agui_out_agents:registry",
        source=OUT_AGENTS,
        env={"LOOM_API_KEYS": OUT_KEY},
    )
    yield srv
    stop_server(srv)


def _protocol_events(url: str, message: str, thread: str) -> list[Any]:
    """The stream of one run, each event validated by the protocol's Python types."""
    from ag_ui.core import Event
    from pydantic import TypeAdapter

    body = {
        "threadId": thread,
        "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": message}],
    }
    with httpx.stream("POST", url, json=body, headers={"x-api-key": OUT_KEY}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        raw = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    return [adapter.validate_python(e) for e in raw]


def _kinds(events: list[Any]) -> list[str]:
    return [str(e.type.value) for e in events]


def _said(events: list[Any], kind: str) -> str:
    return "".join(e.delta for e in events if e.type.value == kind)


def test_streamed_reasoning_is_a_reasoning_message_before_the_answer(out_server: Server) -> None:
    """A model that streams its reasoning: each delta a REASONING_MESSAGE_CONTENT as it comes,
    the span closed before the answer's text starts; the step's whole reasoning (also in its
    LLM_COMPLETE) is not sent again, and none of it is in the answer's text."""
    events = _protocol_events(f"{out_server.url}/agui/live-thinker", "6 x 7?", "t-live-think")
    assert _kinds(events) == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert _said(events, "REASONING_MESSAGE_CONTENT") == "six times seven"
    assert _said(events, "TEXT_MESSAGE_CONTENT") == "42"
    start = next(e for e in events if e.type.value == "REASONING_MESSAGE_START")
    assert start.role == "reasoning"


def test_whole_reasoning_is_sent_once_when_none_streamed(out_server: Server) -> None:
    """A model that streams no reasoning deltas: the LLM_COMPLETE's Reasoning part is the
    reasoning message, whole, once."""
    events = _protocol_events(f"{out_server.url}/agui/thinker", "6 x 7?", "t-whole-think")
    kinds = _kinds(events)
    assert kinds.count("REASONING_MESSAGE_CONTENT") == 1
    assert kinds.index("REASONING_END") < kinds.index("TEXT_MESSAGE_END")
    assert _said(events, "REASONING_MESSAGE_CONTENT") == "six times seven"
    assert _said(events, "TEXT_MESSAGE_CONTENT") == "42"


def test_a_tools_image_is_an_image_part_of_its_result_at_the_thread_media_url(
    out_server: Server,
) -> None:
    """The tool result's content is its text then an ImagePart whose URL source is the
    thread's media route: the key that owns the thread reads the very bytes; no key, 401."""
    from ag_ui.core import ImagePart, TextPart, UrlSource

    thread = "t-tool-image"
    events = _protocol_events(f"{out_server.url}/agui/photographer", "snap the sea", thread)
    [result] = [e for e in events if e.type.value == "TOOL_CALL_RESULT"]
    text, image = result.content
    assert isinstance(text, TextPart) and text.text.startswith("a picture of the sea")
    assert isinstance(image, ImagePart) and isinstance(image.source, UrlSource)
    shot = SHOT
    ref = f"sha256:{hashlib.sha256(shot).hexdigest()}"
    assert image.source.value == f"{out_server.url}/threads/{thread}/media/{ref}"
    assert image.source.mime_type == "image/png"
    assert image.metadata == {"filename": "shot.png"}
    got = httpx.get(image.source.value, headers={"x-api-key": OUT_KEY})
    assert got.status_code == 200 and got.content == shot
    assert got.headers["content-type"] == "image/png"
    assert httpx.get(image.source.value).status_code == 401
    assert _said(events, "TEXT_MESSAGE_CONTENT") == "Here it is."


def test_an_answers_image_is_named_in_its_text_with_its_url(out_server: Server) -> None:
    """AG-UI's assistant message is text only: the answer's image is a Markdown link line
    after its text, to the thread's media route."""
    from loom.content import Image, describe

    thread = "t-answer-image"
    events = _protocol_events(f"{out_server.url}/agui/drawer", "draw", thread)
    text = _said(events, "TEXT_MESSAGE_CONTENT")
    shot = SHOT
    url = f"{out_server.url}/threads/{thread}/media/sha256:{hashlib.sha256(shot).hexdigest()}"
    named = describe(Image.from_bytes(shot, name="chart.png"))  # with its size if Pillow is in
    assert named.startswith("[image chart.png: image/png")
    assert text == f"here is your chart\n\n{named}({url})"
    assert httpx.get(url, headers={"x-api-key": OUT_KEY}).content == shot


def test_agui_client_reads_reasoning_and_a_tools_image(out_server: Server, js: Path) -> None:
    """@ag-ui/client's HttpAgent accepts the streams (it verifies their order) and builds the
    messages: a ``reasoning`` message before the answer; a tool message whose content is its
    text and an image part."""
    import os

    def node(agent: str, scenario: str) -> dict[str, Any]:
        out = subprocess.run(
            ["node", str(js / "agui_client.mjs"), f"{out_server.url}/agui/{agent}", scenario],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LOOM_KEY": OUT_KEY},
        )
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["ok"], report
        assert isinstance(report, dict)
        return report

    [run] = node("live-thinker", "reasoning")["runs"]
    assert [(m["role"], m["content"]) for m in run["newMessages"]] == [
        ("reasoning", "six times seven"),
        ("assistant", "42"),
    ]
    [run] = node("photographer", "toolmedia")["runs"]
    _call, result, answer = run["newMessages"]
    text, image = result["content"]
    assert result["role"] == "tool" and text["type"] == "text"
    assert image["type"] == "image" and image["source"]["type"] == "url"
    assert image["source"]["value"].startswith(f"{out_server.url}/threads/")
    assert answer["content"] == "Here it is."


def test_a_frontend_tools_result_may_carry_media(out_server: Server) -> None:
    """The client answers a frontend call with a tool message whose content is text and an
    image (AG-UI 1.0 allows media parts on tool messages): the model reads the very bytes; a
    part Loom cannot use is a 422 naming the tool message."""
    from ag_ui.core import (
        DataSource,
        ImagePart,
        RunAgentInput,
        TextPart,
        Tool,
        ToolMessage,
        UserMessage,
    )

    url, thread = f"{out_server.url}/agui/screen", "t-frontend-media"
    tools = [Tool(name="screenshot", description="Screenshot the page.", parameters={})]
    user = UserMessage(id="u1", content="what is on my page?")

    def post(run_id: str, messages: list[Any]) -> httpx.Response:
        body = RunAgentInput(
            thread_id=thread,
            run_id=run_id,
            state={},
            messages=messages,
            tools=tools,
            context=[],
            forwarded_props={},
        )
        return httpx.post(
            url,
            content=body.model_dump_json(by_alias=True, exclude_none=True),
            headers={"content-type": "application/json", "x-api-key": OUT_KEY},
            timeout=30,
        )

    first = [json.loads(ln[5:]) for ln in post("r1", [user]).text.splitlines() if ln[:5] == "data:"]
    [call_id] = first[-1]["outcome"]["pendingToolCallIds"]

    def answer(part: Any) -> ToolMessage:
        return ToolMessage(id="t1", tool_call_id=call_id, content=[TextPart(text="the page"), part])

    bad = ImagePart(source=DataSource(value="bm90IGEgcG5n", mime_type="image/png"))
    r = post("r2", [user, answer(bad)])
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert f"the tool message answering {call_id!r}: content part 1" in message, message

    shot = ImagePart(
        source=DataSource(value=base64.b64encode(SHOT).decode(), mime_type="image/png"),
        metadata={"filename": "page.png"},
    )
    r = post("r3", [user, answer(shot)])
    assert r.status_code == 200, r.text
    events = [json.loads(ln[5:]) for ln in r.text.splitlines() if ln[:5] == "data:"]
    said = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert said == (f"text='the page'; image image/png page.png {hashlib.sha256(SHOT).hexdigest()}")
    assert events[-1]["outcome"] == {"type": "success"}
