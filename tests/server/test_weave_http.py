"""Weave over HTTP (unary and SSE), with plain httpx against the real server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
from tests.server.conftest import Server


def sse_events(r: httpx.Response) -> list[tuple[str, dict]]:
    out, kind = [], ""
    for line in r.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[6:])))
    return out


def test_weave_answers_with_output_usage_and_tool_calls(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/weave", json={"agent": "calc", "message": "add 2 and 40"})
    assert r.status_code == 200
    body = r.json()
    assert body["output"] == "The sum is 42." and body["stop_reason"] == "completed"
    assert body["usage"]["requests"] == 2
    [call] = body["tool_calls"]
    assert call["name"] == "add" and call["input"] == {"a": 2, "b": 40}
    assert call["success"] is True and call["result"] == "42"
    assert r.headers["X-Loom-Session"] == body["session_id"]
    again = httpx.post(
        f"{server.url}/v1/weave",
        json={"agent": "calc", "message": "hi", "session_id": body["session_id"]},
    ).json()
    assert again["session_id"] == body["session_id"] and again["output"] == "echo: hi"


def test_weave_stream_reports_progress_then_final(server: Server) -> None:
    body = {"agent": "calc", "message": "add 1 and 1", "session_id": "weave-stream-1"}
    with httpx.stream("POST", f"{server.url}/v1/weave:stream", json=body) as r:
        assert r.status_code == 200 and r.headers["X-Loom-Session"] == "weave-stream-1"
        events = sse_events(r)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "final"
    assert "stage" in kinds and kinds.count("tokens") == 2
    start = next(d for k, d in events if k == "tool_start")
    end = next(d for k, d in events if k == "tool_end")
    assert start["name"] == "add" and start["input"] == {"a": 1, "b": 1}
    assert end["id"] == start["id"] and end["result"] == "2" and end["success"] is True
    assert kinds.index("tool_start") < kinds.index("tool_end")
    text = "".join(d["text"] for k, d in events if k == "delta")
    final = events[-1][1]
    assert text == final["output"] == "The sum is 2."
    assert final["tool_calls"][0]["result"] == "2"
    assert final["usage"]["requests"] == 2
    assert all(d["session_id"] == "weave-stream-1" for _, d in events)


def test_weave_stream_reports_an_approval_request(server: Server) -> None:
    body = {"agent": "ops", "message": "ship it"}
    with httpx.stream("POST", f"{server.url}/v1/weave:stream", json=body) as r:
        events = sse_events(r)
    ask = next(d for k, d in events if k == "approval_required")
    assert ask["tool_name"] == "deploy" and ask["arguments"] == {"target": "prod"}
    final = events[-1][1]
    assert final["stop_reason"] == "awaiting_approval"
    assert final["pending_approvals"][0]["tool_call_id"] == ask["tool_call_id"]


def test_weave_errors_are_json(server: Server) -> None:
    url = f"{server.url}/v1/weave"
    unknown = httpx.post(url, json={"agent": "nope", "message": "hi"})
    assert unknown.status_code == 404 and "calc" in unknown.json()["error"]["message"]
    empty = httpx.post(f"{url}:stream", json={"agent": "calc", "message": " "})
    assert empty.status_code == 422 and empty.json()["error"]["type"] == "InputError"
    missing = httpx.post(url, json={"agent": "calc"})
    assert missing.status_code == 422 and "message" in missing.json()["error"]["message"]


def test_a_session_is_shared_across_protocols(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/weave", json={"agent": "calc", "message": "first"})
    session = r.json()["session_id"]
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "calc", "messages": [{"role": "user", "content": "second"}]},
        headers={"X-Loom-Session": session},
    )
    assert chat.headers["X-Loom-Session"] == session
    assert chat.json()["choices"][0]["message"]["content"] == "echo: second"


def test_a_client_that_drops_mid_stream_leaves_the_server_serving(server: Server) -> None:
    body = {"agent": "calc", "message": "add 7 and 8", "session_id": "weave-drop-1"}
    with httpx.stream("POST", f"{server.url}/v1/weave:stream", json=body) as r:
        next(r.iter_lines())  # read one line, then hang up
    again = httpx.post(
        f"{server.url}/v1/weave",
        json={"agent": "calc", "message": "add 1 and 2", "session_id": "weave-drop-1"},
        timeout=20,
    )
    assert again.status_code == 200 and again.json()["output"] == "The sum is 3."


def sse_with_ids(lines: Iterator[str], stop_run: str) -> list[tuple[str, str, dict]]:
    """(kind, id, data) of each event until the ``final`` of run ``stop_run``."""
    out, kind, eid = [], "", ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            out.append((kind, eid, data))
            if kind == "final" and data["run_id"] == stop_run:
                return out
    return out


def test_weave_stream_events_have_ids(server: Server) -> None:
    body = {"agent": "calc", "message": "add 3 and 3", "session_id": "weave-ids-1"}
    ids = []
    with httpx.stream("POST", f"{server.url}/v1/weave:stream", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("id: "):
                ids.append(line[4:])
    run_id = ids[0].split(":")[0]
    assert all(i.startswith(f"{run_id}:") for i in ids) and len(ids) == len(set(ids))


def test_session_events_replay_then_resume_with_last_event_id(server: Server) -> None:
    session = "weave-sub-1"
    one = httpx.post(
        f"{server.url}/v1/weave",
        json={"agent": "calc", "message": "add 1 and 5", "session_id": session},
    )
    run1 = one.json()["run_id"]
    url = f"{server.url}/v1/sessions/{session}/events"
    with httpx.stream("GET", url, timeout=20) as r:
        assert r.status_code == 200
        first = sse_with_ids(r.iter_lines(), run1)
    assert first[0][0] == "started" and first[-1][2]["output"] == "The sum is 6."
    assert all(d["replayed"] for _, _, d in first)
    assert first[0][2]["event"]["type"] == "agent_start"
    two = httpx.post(
        f"{server.url}/v1/weave", json={"agent": "calc", "message": "again", "session_id": session}
    )
    run2 = two.json()["run_id"]
    last = first[-1][1]
    with httpx.stream("GET", url, headers={"Last-Event-ID": last}, timeout=20) as r:
        rest = sse_with_ids(r.iter_lines(), run2)
    assert rest and all(d["run_id"] == run2 for _, _, d in rest)
    assert rest[-1][2]["output"] == "echo: again"
    with httpx.stream("GET", url, params={"after": last}, timeout=20) as r:
        assert [i for _, i, _ in sse_with_ids(r.iter_lines(), run2)] == [i for _, i, _ in rest]


def test_session_events_errors(server: Server) -> None:
    missing = httpx.get(f"{server.url}/v1/sessions/no-such-session/events")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFound"
    httpx.post(
        f"{server.url}/v1/weave",
        json={"agent": "calc", "message": "hi", "session_id": "weave-sub-2"},
    )
    bad = httpx.get(
        f"{server.url}/v1/sessions/weave-sub-2/events", headers={"Last-Event-ID": "garbage"}
    )
    assert bad.status_code == 422 and "run_id" in bad.json()["error"]["message"]


def test_weave_answer_resumes_a_parked_run(server: Server) -> None:
    parked = httpx.post(
        f"{server.url}/v1/weave",
        json={"agent": "ops", "message": "go", "session_id": "weave-ans-1"},
    ).json()
    call_id = parked["pending_approvals"][0]["tool_call_id"]
    wrong = httpx.post(
        f"{server.url}/v1/weave:answer",
        json={"session_id": "weave-ans-1", "call_id": "call_x", "decision": "approve"},
    )
    assert wrong.status_code == 404 and call_id in wrong.json()["error"]["message"]
    r = httpx.post(
        f"{server.url}/v1/weave:answer",
        json={"session_id": "weave-ans-1", "call_id": call_id, "decision": "approve"},
        timeout=20,
    )
    assert r.status_code == 200 and r.json()["status"] == "resumed"
    assert r.json()["reply"]["output"] == "done: deployed prod"
