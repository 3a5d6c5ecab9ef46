"""The OpenAPI backend against a real FastAPI app on loopback, built from the app's own
/openapi.json: typed calls, refused methods and host changes, timeouts, size limits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jsonschema")

from loom.backends.openapi import OpenAPIBackend
from loom.errors import BackendConfigError, BackendRefused, ToolArgumentsError, ToolError
from loom.tools.base import RunContext

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "backends"))
from inventory_api import serve_in_thread


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    with serve_in_thread() as url:
        yield url


def _ctx() -> RunContext:
    return RunContext(session_id="s", run_id="r", tool_call_id="c")


async def _call(backend: OpenAPIBackend, name: str, args: dict[str, object]) -> str:
    tool = {t.name: t for t in backend.tools()}[name]
    out: str = await tool.run(_ctx(), tool.validate(args))
    return out


def test_operations_come_from_the_apps_own_document_get_only_by_default(api: str) -> None:
    b = OpenAPIBackend(f"{api}/openapi.json", base_url=api)
    names = {t.name for t in b.tools()}
    assert "create_item" not in names  # a POST: not offered without methods=
    assert {"list_items", "get_item", "get_file"} <= names
    tool = {t.name: t for t in b.tools()}["list_items"]
    assert tool.parameters["properties"]["limit"]["type"] == "integer"
    assert tool.effect == "pure"
    text = b.schema_text(400)
    assert "list_items(in_stock, limit): GET /items" in text


async def test_typed_calls_reach_the_api_and_bad_types_are_refused(api: str) -> None:
    b = OpenAPIBackend(f"{api}/openapi.json", base_url=api, tags=["items"])
    out = await _call(b, "list_items", {"in_stock": True})
    assert out.startswith("HTTP 200")
    assert json.loads(out.split("\n", 1)[1]) == [{"id": 1, "name": "widget", "quantity": 12}]
    assert '"gadget"' in await _call(b, "get_item", {"item_id": 2})
    with pytest.raises(ToolArgumentsError, match="item_id"):
        await _call(b, "get_item", {"item_id": "two"})
    with pytest.raises(ToolArgumentsError):
        await _call(b, "get_item", {"item_id": 1, "host": "evil.example"})  # unknown argument


async def test_a_write_method_needs_the_allow_list(api: str) -> None:
    with pytest.raises(BackendConfigError, match="POST"):
        OpenAPIBackend(f"{api}/openapi.json", base_url=api, operations=["create_item"])
    b = OpenAPIBackend(
        f"{api}/openapi.json", base_url=api, operations=["create_item"], methods=["GET", "POST"]
    )
    tool = b.tools()[0]
    assert tool.effect == "at_most_once"
    out = await _call(b, "create_item", {"body": {"id": 7, "name": "gizmo", "quantity": 3}})
    assert out.startswith("HTTP 200") and "gizmo" in out


async def test_the_model_cannot_change_the_host(api: str) -> None:
    import httpx

    b = OpenAPIBackend(f"{api}/openapi.json", base_url=api, tags=["files"])
    op = b.operations[0]
    here = httpx.URL(api)
    for value in (
        "http://evil.example/x",
        "//evil.example/x",
        "a/../../admin",
        "?x=1#frag",
        "@evil.example",
    ):
        url = b.url_for(op, {"name": value})
        assert (url.scheme, url.host, url.port) == (here.scheme, here.host, here.port)
        segment = url.raw_path.decode().removeprefix("/files/")
        assert "/" not in segment and "?" not in segment  # one encoded path segment
        try:
            out = await _call(b, "get_file", {"name": value})
        except ToolError as exc:  # Starlette decodes %2F before routing: our server's 404
            assert exc.code == "http_error" and "HTTP 404" in str(exc), exc
            continue
        assert json.loads(out.split("\n", 1)[1]) == {"name": value}
    for value in ("..", "."):
        with pytest.raises(BackendRefused):
            await _call(b, "get_file", {"name": value})


async def test_auth_comes_from_configuration_never_from_the_model(
    api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVENTORY_TOKEN", "t0ken")
    b = OpenAPIBackend(
        f"{api}/openapi.json", base_url=api, tags=["meta"], auth_env="INVENTORY_TOKEN"
    )
    whoami = {t.name: t for t in b.tools()}["whoami"]
    assert "authorization" not in whoami.parameters["properties"]
    out = await _call(b, "whoami", {})
    assert json.loads(out.split("\n", 1)[1]) == {"authorization": "Bearer t0ken"}


async def test_a_hanging_server_times_out(api: str) -> None:
    b = OpenAPIBackend(f"{api}/openapi.json", base_url=api, operations=["hang"], timeout=0.5)
    with pytest.raises(ToolError) as info:
        await _call(b, "hang", {})
    assert info.value.code == "timeout"


async def test_a_huge_response_is_cut_at_the_limit(api: str) -> None:
    b = OpenAPIBackend(
        f"{api}/openapi.json", base_url=api, operations=["huge"], max_response_bytes=100_000
    )
    out = await _call(b, "huge", {})
    body, _, note = out.partition("\n[response cut")
    assert len(body) == len("HTTP 200\n") + 100_000
    assert "100,000 bytes" in note


def test_a_document_that_does_not_parse_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "api.json"
    bad.write_text("{not json: [")
    with pytest.raises(BackendConfigError, match=r"neither JSON nor YAML|not an OpenAPI"):
        OpenAPIBackend(str(bad), base_url="http://127.0.0.1:1")
    bad.write_text(json.dumps({"swagger": "2.0", "paths": {}}))
    with pytest.raises(BackendConfigError, match="OpenAPI 3"):
        OpenAPIBackend(str(bad), base_url="http://127.0.0.1:1")
