"""Reading an OpenAPI 3.x document into operations (no HTTP here: see ``openapi``)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import BackendConfigError

__all__ = ["Operation", "load_document", "select_operations"]

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_SAFE_NAME = re.compile(r"[^a-zA-Z0-9_-]+")
# headers the model may never set: auth and routing stay in the configuration's hands
_RESERVED_HEADERS = {"authorization", "cookie", "host", "proxy-authorization", "x-api-key"}


@dataclass(slots=True)
class Operation:
    """One HTTP operation: its tool name, method, path template and argument schema."""

    name: str
    method: str
    path: str
    summary: str
    tags: list[str]
    path_params: list[str] = field(default_factory=list)
    query_params: list[str] = field(default_factory=list)
    header_params: list[str] = field(default_factory=list)
    has_body: bool = False
    schema: dict[str, Any] = field(default_factory=dict)


def load_document(source: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """The document at ``source`` (a file path or an http(s) URL, fetched once)."""
    if source.startswith(("http://", "https://")):
        import httpx

        try:
            response = httpx.get(source, timeout=timeout, follow_redirects=False)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise BackendConfigError(f"cannot fetch the OpenAPI document {source}: {exc}") from None
        text = response.text
    else:
        from pathlib import Path

        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise BackendConfigError(f"cannot read the OpenAPI document {source}: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise BackendConfigError(
                f"the OpenAPI document {source} is neither JSON nor YAML: {exc}"
            ) from None
    if not isinstance(doc, dict) or not str(doc.get("openapi", "")).startswith("3."):
        raise BackendConfigError(
            f"{source} is not an OpenAPI 3.x document (it needs 'openapi: 3.x' and 'paths')"
        )
    if not isinstance(doc.get("paths"), dict):
        raise BackendConfigError(f"the OpenAPI document {source} has no 'paths' mapping")
    return doc


def _resolve(doc: dict[str, Any], node: Any, depth: int = 0) -> Any:
    """Inline local ``$ref``s (bounded: recursive schemas end as plain objects)."""
    if depth > 12:
        return {}
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/"):
                return {}  # remote refs are never fetched
            target: Any = doc
            for part in ref[2:].split("/"):
                target = (
                    target.get(part.replace("~1", "/").replace("~0", "~"), {})
                    if isinstance(target, dict)
                    else {}
                )
            return _resolve(doc, target, depth + 1)
        return {k: _resolve(doc, v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(doc, v, depth + 1) for v in node]
    return node


def _operation(
    doc: dict[str, Any], path: str, method: str, op: dict[str, Any], shared: list[Any]
) -> Operation:
    raw_name = op.get("operationId") or f"{method}_{path}"
    name = _SAFE_NAME.sub("_", str(raw_name)).strip("_")[:64] or method
    props: dict[str, Any] = {}
    required: list[str] = []
    summary = str(op.get("summary") or op.get("description") or "")
    out = Operation(name, method.upper(), path, summary, [str(t) for t in op.get("tags") or []])
    for param in [*shared, *(op.get("parameters") or [])]:
        param = _resolve(doc, param)
        pname, where = str(param.get("name", "")), param.get("in")
        if not pname or where not in ("path", "query", "header"):
            continue
        if where == "header" and pname.lower() in _RESERVED_HEADERS:
            continue
        schema = dict(param.get("schema") or {"type": "string"})
        if param.get("description"):
            schema["description"] = str(param["description"])
        props[pname] = schema
        if param.get("required") or where == "path":
            required.append(pname)
        getattr(out, f"{where}_params").append(pname)
    body = op.get("requestBody")
    if isinstance(body, dict):
        body = _resolve(doc, body)
        content = body.get("content") or {}
        media = content.get("application/json")
        if isinstance(media, dict):
            props["body"] = media.get("schema") or {"type": "object"}
            out.has_body = True
            if body.get("required"):
                required.append("body")
    out.schema = {
        "type": "object",
        "properties": props,
        "required": sorted(set(required)),
        "additionalProperties": False,
    }
    return out


def select_operations(
    doc: dict[str, Any],
    *,
    operations: Sequence[str] | None,
    tags: Sequence[str] | None,
    paths: Sequence[str] | None,
    methods: Sequence[str],
) -> list[Operation]:
    """The operations allowed by the filters (all given filters must match; ``methods`` is the
    allow-list of HTTP methods). Names an unknown operation id as a configuration error."""
    allowed_methods = {m.upper() for m in methods}
    found: list[Operation] = []
    for path, item in doc["paths"].items():
        if not isinstance(item, dict):
            continue
        shared = item.get("parameters") or []
        for method in _METHODS:
            op = item.get(method)
            if isinstance(op, dict):
                found.append(_operation(doc, str(path), method, op, shared))
    if operations is not None:
        known = {o.name for o in found} | {str(o) for o in operations}
        missing = [o for o in operations if o not in {x.name for x in found}]
        if missing:
            raise BackendConfigError(
                f"the OpenAPI document has no operation {missing[0]!r}; operations: "
                f"{', '.join(sorted(n for n in known if n not in missing))}"
            )
        refused = [o for o in found if o.name in operations and o.method not in allowed_methods]
        if refused:
            raise BackendConfigError(
                f"operation {refused[0].name!r} is a {refused[0].method}, which methods= does not "
                f"allow (allowed: {', '.join(sorted(allowed_methods))}); add it to methods"
            )
    chosen = []
    for o in found:
        if o.method not in allowed_methods:
            continue
        if operations is not None and o.name not in operations:
            continue
        if tags is not None and not set(o.tags) & set(tags):
            continue
        if paths is not None and not any(fnmatch.fnmatch(o.path, p) for p in paths):
            continue
        chosen.append(o)
    return chosen
