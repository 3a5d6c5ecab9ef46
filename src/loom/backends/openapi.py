"""``OpenAPIBackend``: an HTTP API, described by its OpenAPI 3.x document, offered as one tool
per allowed operation.

Safety: the base URL is fixed by configuration and every request is checked to stay on its
scheme, host, port and path prefix (path arguments are percent-encoded as one segment, and
``.``/``..`` are refused); only the allowed methods are offered (GET by default); auth comes
from configuration (``headers``, ``auth_env``), never from the model, and the model cannot set
auth or host headers; every call has a timeout and the response is streamed and cut at
``max_response_bytes``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from loom.backends.base import trim_to_tokens
from loom.backends.openapi_spec import Operation, load_document, select_operations
from loom.errors import BackendConfigError, BackendRefused, ToolArgumentsError, ToolError
from loom.messages import Effect
from loom.tools.base import RunContext, Tool

__all__ = ["OpenAPIBackend", "OperationTool"]


class OperationTool:
    """One API operation as a Loom tool (arguments validated against its JSON schema)."""

    def __init__(self, backend: OpenAPIBackend, op: Operation, name: str) -> None:
        self.backend, self.op, self.name = backend, op, name
        self.description = f"{op.method} {op.path}" + (f": {op.summary}" if op.summary else "")
        self.parameters = op.schema
        self.timeout: float | None = backend.timeout + 5  # the HTTP deadline fires first
        self.effect: Effect = "pure" if op.method in ("GET", "HEAD") else "at_most_once"
        self._validator: Any = None

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        import jsonschema  # type: ignore[import-untyped]

        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.parameters)
            self._validator = cls(self.parameters)
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            problems = "; ".join(
                f"{'.'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in errors[:5]
            )
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: {problems}. Expected: {self.parameters}"
            )
        return arguments

    async def run(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        return await self.backend.call(self.op, arguments)

    def __repr__(self) -> str:
        return f"OperationTool({self.name!r}, {self.op.method} {self.op.path})"


class OpenAPIBackend:
    """An HTTP API as an agent's domain.

    Args:
        source: The OpenAPI 3.x document: a file path or an http(s) URL (fetched once).
        base_url: Where requests go (default: the document's first absolute ``servers`` URL).
            The model can never change it.
        operations, tags, paths: Offer only these operation ids / operations with one of these
            tags / paths matching one of these ``fnmatch`` patterns (all given filters apply).
        methods: HTTP methods allowed (default GET only).
        headers: Headers sent with every request (API keys from your configuration).
        auth_env: Name of an environment variable holding a bearer token, read at call time.
        timeout: Seconds per request (connect, each read, and the whole call).
        max_response_bytes: Responses are streamed and cut here (the model is told).
        name, prefix: The backend's name; a prefix for its tool names.
    """

    def __init__(
        self,
        source: str,
        *,
        base_url: str | None = None,
        operations: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
        paths: Sequence[str] | None = None,
        methods: Sequence[str] = ("GET",),
        headers: Mapping[str, str] | None = None,
        auth_env: str | None = None,
        timeout: float = 10.0,
        max_response_bytes: int = 200_000,
        name: str = "api",
        prefix: str = "",
    ) -> None:
        try:
            import httpx
            import jsonschema  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from loom.errors import MissingDependencyError

            raise MissingDependencyError(exc.name or "httpx", "backends", "OpenAPIBackend") from exc
        if timeout <= 0 or max_response_bytes <= 0:
            raise BackendConfigError("timeout and max_response_bytes must be positive")
        self.name, self.prefix, self.source = name, prefix, source
        self.timeout, self.max_response_bytes = timeout, max_response_bytes
        self.headers = dict(headers or {})
        self.auth_env = auth_env
        self.config: dict[str, Any] | None = None
        self.problems: list[str] = []
        self.document = load_document(source, timeout=timeout)
        base = base_url or next(
            (
                str(s.get("url"))
                for s in self.document.get("servers") or []
                if isinstance(s, dict) and "://" in str(s.get("url", ""))
            ),
            None,
        )
        if not base:
            raise BackendConfigError(
                "the API's base URL is unknown: give base_url= (the document has no absolute "
                "servers URL)"
            )
        self.base = httpx.URL(base.rstrip("/") + "/")
        if self.base.scheme not in ("http", "https") or not self.base.host:
            raise BackendConfigError(f"base_url {base!r} must be an absolute http(s) URL")
        self.operations = select_operations(
            self.document, operations=operations, tags=tags, paths=paths, methods=methods
        )
        if not self.operations:
            raise BackendConfigError(
                f"no operation of {source} is allowed by the filters (methods={list(methods)}, "
                f"operations={operations}, tags={tags}, paths={paths})"
            )
        self._tools: list[Tool] = [
            OperationTool(self, op, f"{prefix}{op.name}") for op in self.operations
        ]

    def tools(self) -> list[Tool]:
        return list(self._tools)

    # -- one call -----------------------------------------------------------------------------
    def url_for(self, op: Operation, arguments: Mapping[str, Any]) -> Any:
        """The request URL: path arguments encoded as single segments, checked to stay under
        the base URL (raises ``BackendRefused`` otherwise)."""
        import httpx

        path = op.path
        for pname in op.path_params:
            value = str(arguments.get(pname, ""))
            if value in ("", ".", "..") or "\x00" in value:
                raise BackendRefused(f"path argument {pname!r} may not be {value!r}")
            path = path.replace("{" + pname + "}", quote(value, safe=""))
        url = httpx.URL(str(self.base).rstrip("/") + "/" + path.lstrip("/"))
        base = self.base
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port) or not (
            url.path.startswith(base.path)
        ):
            raise BackendRefused(f"the request would leave {base} ({url}); the host is fixed")
        return url

    def _auth_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.auth_env:
            token = os.environ.get(self.auth_env)
            if not token:
                raise ToolError(
                    f"the API token variable {self.auth_env} is not set on the server",
                    code="configuration",
                )
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def call(self, op: Operation, arguments: Mapping[str, Any]) -> str:
        """Make the request and return ``HTTP <status>`` and the (possibly cut) body."""
        import httpx

        url = self.url_for(op, arguments)
        params = {k: arguments[k] for k in op.query_params if k in arguments}
        headers = {k: str(arguments[k]) for k in op.header_params if k in arguments}
        headers.update(self._auth_headers())  # configuration wins over any argument
        body = arguments.get("body") if op.has_body else None
        limit = self.max_response_bytes
        try:
            async with (
                asyncio.timeout(self.timeout),
                httpx.AsyncClient(
                    timeout=self.timeout, follow_redirects=False, trust_env=False
                ) as client,
                client.stream(
                    op.method, url, params=params, headers=headers, json=body
                ) as response,
            ):
                chunks: list[bytes] = []
                size, cut = 0, False
                async for chunk in response.aiter_bytes():  # stop reading at the limit
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        cut = True
                        break
        except TimeoutError:
            raise ToolError(
                f"{op.method} {op.path} did not answer within {self.timeout:g}s", code="timeout"
            ) from None
        except httpx.HTTPError as exc:
            raise ToolError(f"{op.method} {op.path} failed: {exc}", code="http_error") from None
        data = b"".join(chunks)[:limit]
        text = data.decode(response.encoding or "utf-8", errors="replace")
        note = (
            f"\n[response cut at {limit:,} bytes of a larger body; ask for less (filters, "
            "paging parameters)]"
            if cut
            else ""
        )
        if response.status_code >= 400:
            raise ToolError(
                f"HTTP {response.status_code} from {op.method} {op.path}: {text[:2000]}{note}",
                code="http_error",
            )
        return f"HTTP {response.status_code}\n{text}{note}"

    # -- schema text --------------------------------------------------------------------------
    def schema_text(self, budget: int) -> str:
        methods = sorted({op.method for op in self.operations})
        lines = [
            f"HTTP API {self.name!r} at {self.base} ({', '.join(methods)}); one tool per operation:"
        ]
        for tool, op in zip(self._tools, self.operations, strict=True):
            args = ", ".join(op.schema["properties"])
            summary = f" -- {op.summary}" if op.summary else ""
            lines.append(f"- {tool.name}({args}): {op.method} {op.path}{summary}")
        return trim_to_tokens(lines, budget)

    def close(self) -> None:
        """Nothing to release: each call opens and closes its own client."""

    def __repr__(self) -> str:
        return f"OpenAPIBackend({self.source!r}, base_url={str(self.base)!r})"
