"""The OpenAI-compatible front, driven by the official ``openai`` SDK against a real server."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from tests.server.conftest import AGENTS, Server, start_server, stop_server

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


# -- parked runs, the published schema, retrieving a response ------------------------------------
ALICE, BOB = "alice-key-openai-1", "bob-key-openai-2"
SCHEMA = Path(__file__).parent / "fixtures" / "openai_responses_schema.json"
PARKED_AGENTS = AGENTS + (
    "\nparked_registry = AgentRegistry([CALC, OPS, Agent(name='reader', "
    "model=FunctionModel(reader), query_detector=FILE_QUERY)])\n"
)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with two API keys, serving an agent that asks for approval (``ops``) and one
    that asks the client for a file (``reader``)."""
    tmp = tmp_path_factory.mktemp("openai-keyed")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n- {{name: bob, key: {BOB}}}\n"
    )
    srv = start_server(
        tmp,
        "--keys",
        str(tmp / "keys.yaml"),
        app="server_agents:parked_registry",
        source=PARKED_AGENTS,
    )
    yield srv
    stop_server(srv)


def keyed_client(server: Server, key: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


class Schemas:
    """OpenAI's published schemas of the Responses API (the fixture says where they are from)."""

    def __init__(self) -> None:
        document = json.loads(SCHEMA.read_text())
        self.document = document
        self.registry: Registry[Any] = Registry().with_resource(
            "openai.json", Resource.from_contents(document, default_specification=DRAFT202012)
        )

    def errors(self, name: str, instance: Any, *, loom_reasons: bool = False) -> list[str]:
        """What in ``instance`` does not validate against ``#/components/schemas/<name>``.

        ``loom_reasons``: allow the two ``incomplete_details.reason`` values Loom adds for a
        parked run (documented in docs/server.md), and nothing else beyond the schema."""
        document = self.document
        if loom_reasons:
            document = copy.deepcopy(document)
            details = document["components"]["schemas"]["Response"]["allOf"][2]["properties"]
            reason = details["incomplete_details"]["anyOf"][0]["properties"]["reason"]
            reason["enum"] = [*reason["enum"], "awaiting_approval", "awaiting_input"]
        registry: Registry[Any] = Registry().with_resource(
            "openai.json", Resource.from_contents(document, default_specification=DRAFT202012)
        )
        validator = Draft202012Validator(
            {"$ref": f"openai.json#/components/schemas/{name}"}, registry=registry
        )
        return [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
            for e in validator.iter_errors(instance)
        ]


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return Schemas()


_EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
}


def raw_events(url: str, body: dict[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_responses_bodies_and_events_validate_against_openais_schema(
    server: Server, schemas: Schemas
) -> None:
    url = f"{server.url}/v1/responses"
    body = httpx.post(url, json={"model": "calc", "input": "add 1 and 2"}, timeout=30).json()
    assert schemas.errors("Response", body) == []
    assert body["output"][0]["content"][0]["logprobs"] == []
    assert body["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
    events = raw_events(url, {"model": "calc", "input": "add 3 and 4", "stream": True})
    assert events[-1]["type"] == "response.completed"
    for event in events:
        assert schemas.errors(_EVENT_SCHEMAS[event["type"]], event) == [], event["type"]
    retrieved = httpx.get(f"{url}/{body['id']}", timeout=30)
    assert retrieved.status_code == 200, retrieved.text
    assert schemas.errors("Response", retrieved.json()) == []


async def test_a_response_is_retrieved_by_its_owner_only(keyed: Server) -> None:
    alice = keyed_client(keyed)
    created = await alice.responses.create(model="calc", input="add 2 and 40")
    got = await alice.responses.retrieve(created.id)
    assert got.id == created.id and got.status == "completed"
    assert got.output_text == created.output_text == "The sum is 42."
    assert got.usage is not None and created.usage is not None
    assert got.usage.total_tokens == created.usage.total_tokens
    assert got.created_at == pytest.approx(created.created_at, abs=2)
    with pytest.raises(openai.NotFoundError):
        await keyed_client(keyed, BOB).responses.retrieve(created.id)
    for unknown in ("resp_zz_run_1", "nope", created.id[:-3] + "xyz"):
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(unknown)


async def test_a_chat_parked_for_approval_names_the_call_and_how_to_decide_it(
    keyed: Server,
) -> None:
    alice = keyed_client(keyed)
    raw = await alice.chat.completions.with_raw_response.create(
        model="ops", messages=[{"role": "user", "content": "ship it"}], user="oai-parked-1"
    )
    reply = raw.parse()
    assert reply.choices[0].finish_reason == "stop"
    text = reply.choices[0].message.content or ""
    assert reply.model_extra is not None
    [pending] = reply.model_extra["loom"]["pending_approvals"]
    assert reply.model_extra["loom"]["stop_reason"] == "awaiting_approval"
    call_id = pending["tool_call_id"]
    assert 'deploy({"target": "prod"})' in text and call_id in text
    path = f"/threads/oai-parked-1/approvals/{call_id}"
    assert f"POST {path.replace(call_id, '<call id>')}" in text
    # what the text says to do works
    async with httpx.AsyncClient(
        base_url=keyed.url, headers={"Authorization": f"Bearer {ALICE}"}
    ) as h:
        decided = await h.post(path, json={"decision": "approve"})
        assert decided.status_code == 202 and decided.json()["status"] == "resumed", decided.text

    stream = await alice.chat.completions.create(
        model="ops",
        messages=[{"role": "user", "content": "ship it"}],
        user="oai-parked-2",
        stream=True,
    )
    chunks = [c async for c in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "waiting for approval" in streamed and 'deploy({"target": "prod"})' in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_response_parked_for_approval_is_incomplete(
    keyed: Server, schemas: Schemas
) -> None:
    alice = keyed_client(keyed)
    parked = await alice.responses.create(model="ops", input="ship it")
    assert parked.status == "incomplete"
    assert parked.incomplete_details is not None
    assert parked.incomplete_details.reason == "awaiting_approval"  # type: ignore[comparison-overlap]
    assert "waiting for approval" in parked.output_text and "deploy" in parked.output_text
    # the same from the store, and the stream ends the same way
    again = await alice.responses.retrieve(parked.id)
    assert again.status == "incomplete" and again.output_text == parked.output_text
    body = parked.model_dump(mode="json", exclude_unset=True)
    assert schemas.errors("Response", body, loom_reasons=True) == []
    events = raw_events(
        f"{keyed.url}/v1/responses", {"model": "ops", "input": "ship it", "stream": True}, ALICE
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "awaiting_approval"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "waiting for approval" in deltas and deltas == events[-1]["response"]["output_text"]
    for event in events:
        problems = schemas.errors(_EVENT_SCHEMAS[event["type"]], event, loom_reasons=True)
        assert problems == [], event["type"]


async def test_a_server_query_says_what_was_asked_and_how_to_answer(keyed: Server) -> None:
    alice = keyed_client(keyed)
    reply = await alice.chat.completions.create(
        model="reader", messages=[{"role": "user", "content": "what does main do?"}], user="oai-q-1"
    )
    text = reply.choices[0].message.content or ""
    assert text.startswith("I need to read src/main.rs first.")
    assert "POST /threads/oai-q-1/commands" in text and '{"answer": "..."}' in text
    assert reply.model_extra is not None
    assert reply.model_extra["loom"]["pending_query"]["kind"] == "file_read"
    response = await alice.responses.create(model="reader", input="what does main do?")
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "awaiting_input"  # type: ignore[comparison-overlap]
    assert "/commands" in response.output_text


def test_failed_and_cut_responses_validate_too(schemas: Schemas) -> None:
    """The ends no test agent reaches over HTTP: a failed run (as ``GET /v1/responses/{id}``
    and ``response.failed`` show it) and one cut at a limit."""
    from loom.server.openai_api import RunEnd, response_object

    for stop, status, reason in (
        ("model_error", "failed", None),
        ("max_iterations", "incomplete", {"reason": "max_output_tokens"}),
        ("guardrail", "incomplete", {"reason": "content_filter"}),
    ):
        end = RunEnd("s1", "run_1", stop, "partial", {"input_tokens": 3}, [], None, "boom")
        body = response_object("calc", "resp_7331_run_1", 1.0, None, end)
        assert body["status"] == status and body["incomplete_details"] == reason
        assert schemas.errors("Response", body) == [], stop
        event = {"type": f"response.{status}", "sequence_number": 5, "response": body}
        assert schemas.errors(_EVENT_SCHEMAS[event["type"]], event) == [], stop
