"""The OpenAI-compatible front, driven by the official ``openai`` SDK against a real server."""

from __future__ import annotations

import httpx
import pytest
from tests.server.conftest import Server

from loom.store.sqlite import SQLiteStore

openai = pytest.importorskip("openai")


def client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


async def test_models_are_the_agents(server: Server) -> None:
    models = await client(server).models.list()
    assert [m.id for m in models.data] == ["calc", "ops"]
    assert (await client(server).models.retrieve("calc")).id == "calc"
    with pytest.raises(openai.NotFoundError):
        await client(server).models.retrieve("nope")


async def test_chat_completion_runs_the_agent_and_its_tools(server: Server) -> None:
    raw = await client(server).chat.completions.with_raw_response.create(
        model="calc", messages=[{"role": "user", "content": "add 2 and 3"}]
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "The sum is 5."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "calc" and reply.object == "chat.completion"
    usage = reply.usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    session = raw.headers["X-Loom-Session"]
    assert session.startswith("session_")
    assert reply.model_extra is not None and reply.model_extra["loom"]["session_id"] == session


async def test_the_user_field_continues_a_session(server: Server) -> None:
    c = client(server)
    first = await c.chat.completions.with_raw_response.create(
        model="calc", messages=[{"role": "user", "content": "hello"}], user="oai-user-1"
    )
    assert first.headers["X-Loom-Session"] == "oai-user-1"
    assert first.parse().choices[0].message.content == "echo: hello"
    # Only the last user message is the turn's input: the session holds the history.
    second = await c.chat.completions.create(
        model="calc",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "echo: hello"},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ],
        user="oai-user-1",
    )
    assert second.choices[0].message.content == "echo: again"
    async with httpx.AsyncClient() as h:
        thread = await h.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "calc", "messages": [{"role": "user", "content": "third"}]},
            headers={"X-Loom-Session": "oai-user-1"},
        )
    assert thread.headers["X-Loom-Session"] == "oai-user-1"
    store = SQLiteStore(server.db)  # the server's own journal, read beside it
    try:
        users = [m.content for m in await store.load_messages("oai-user-1") if m.role == "user"]
    finally:
        await store.close()
    assert users == ["hello", "again", "third"]


async def test_chat_completion_streams_chunks_then_done(server: Server) -> None:
    stream = await client(server).chat.completions.create(
        model="calc",
        messages=[{"role": "user", "content": "add 20 and 22"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The sum is 42."
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # deltas
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_a_raw_stream_ends_with_done(server: Server) -> None:
    body = {"model": "calc", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["X-Loom-Session"].startswith("session_")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"


async def test_unknown_model_is_not_found(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client(server).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    assert "calc" in str(info.value)
    async with httpx.AsyncClient() as h:
        r = await h.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound"


async def test_bad_input_is_a_json_error(server: Server) -> None:
    url = f"{server.url}/v1/chat/completions"
    h = httpx.AsyncClient()
    no_user = await h.post(
        url, json={"model": "calc", "messages": [{"role": "system", "content": "x"}]}
    )
    assert no_user.status_code == 422 and "user message" in no_user.json()["error"]["message"]
    malformed = await h.post(
        url, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 422 and malformed.json()["error"]["type"] == "InvalidRequest"
    await h.aclose()
    with pytest.raises(openai.UnprocessableEntityError):
        await client(server).chat.completions.create(
            model="calc", messages=[{"role": "user", "content": "   "}], stream=True
        )


async def test_responses_continue_with_previous_response_id(server: Server) -> None:
    c = client(server)
    first = await c.responses.create(model="calc", input="add 1 and 2")
    assert first.output_text == "The sum is 3." and first.status == "completed"
    assert first.usage is not None
    second = await c.responses.create(model="calc", input="and now?", previous_response_id=first.id)
    assert second.output_text == "echo: and now?"
    assert second.previous_response_id == first.id
    assert second.model_extra is not None and first.model_extra is not None
    assert second.model_extra["loom"]["session_id"] == first.model_extra["loom"]["session_id"]
    with pytest.raises(openai.NotFoundError):
        await c.responses.create(model="calc", input="x", previous_response_id="resp_zz_run_1")


async def test_responses_stream_semantic_events(server: Server) -> None:
    stream = await client(server).responses.create(
        model="calc", input=[{"role": "user", "content": "add 4 and 5"}], stream=True
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "The sum is 9."
    assert events[-1].response.output_text == "The sum is 9."  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
