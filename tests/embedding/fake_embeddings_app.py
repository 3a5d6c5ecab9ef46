"""A small OpenAI-compatible ``/v1/embeddings`` server whose answer the model name chooses,
for the error paths of ``OpenAIEmbedder`` (run by uvicorn in a subprocess; see conftest.py).

- ``echo``: vectors ``[batch size, index, 1.0, ...]``, ``dimensions`` long if the request asks
  (else 3); ``echo-shuffled`` answers the rows in reverse order (their ``index`` says where);
  ``echo-fixed`` ignores ``dimensions`` (always 3).
- ``short``: the first answer has 3 numbers per vector, every later one 2.
- ``per-token``: one vector per token (a server that does not pool).
- ``fail500`` / ``bad400`` / ``unknown404``: those statuses, with an OpenAI-shaped error body.
- ``needs-key``: 401 unless the key is ``sekret``.
- ``stall``: answers after 30 s (the client's timeout is shorter).
- ``not-json``: a 200 whose body is not JSON.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

SHORT_CALLS = {"count": 0}


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status)


def _answer(rows: list[Any]) -> JSONResponse:
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return JSONResponse({"object": "list", "data": data, "model": "fake", "usage": {}})


async def embeddings(request: Request) -> Response:
    body = await request.json()
    model, texts = body["model"], body["input"]
    if model in ("echo", "echo-shuffled", "echo-fixed"):
        size = 3 if model == "echo-fixed" else int(body.get("dimensions") or 3)
        rows = [[float(len(texts)), float(i)] + [1.0] * (size - 2) for i in range(len(texts))]
        answer = _answer(rows)
        if model == "echo-shuffled":
            import json

            payload = json.loads(answer.body)
            payload["data"].reverse()
            return JSONResponse(payload)
        return answer
    if model == "short":
        SHORT_CALLS["count"] += 1
        size = 3 if SHORT_CALLS["count"] == 1 else 2
        return _answer([[0.5] * size for _ in texts])
    if model == "per-token":
        return _answer([[[0.1, 0.2], [0.3, 0.4]] for _ in texts])
    if model == "fail500":
        return _error(500, "the GPU caught fire", "server_error")
    if model == "bad400":
        return _error(400, "input must not contain the word banana", "invalid_request_error")
    if model == "unknown404":
        return _error(404, "model 'unknown404' not found", "invalid_request_error")
    if model == "needs-key":
        if request.headers.get("authorization") != "Bearer sekret":
            return _error(401, "Incorrect API key provided", "invalid_request_error")
        return _answer([[1.0, 0.0] for _ in texts])
    if model == "stall":
        await asyncio.sleep(30)
        return _answer([[1.0] for _ in texts])
    if model == "not-json":
        return PlainTextResponse("<html>proxy error</html>", 200)
    return _error(404, f"no model {model!r}", "invalid_request_error")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "echo", "object": "model"}]})


app = Starlette(
    routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
)
