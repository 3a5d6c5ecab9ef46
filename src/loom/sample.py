"""Values built from JSON schemas: tool arguments and typed answers for ``loom.testing.TestModel``.

``sample(schema)`` returns a small value the schema accepts, for the schemas pydantic and tool
definitions produce: objects (every property, required or not), arrays (``minItems`` items, at
least one), strings (``enum``, ``const``, ``minLength`` / ``maxLength``, common ``format``\\ s),
numbers within ``minimum`` / ``maximum`` / ``exclusive*`` / ``multipleOf``, booleans, null,
``$ref`` into ``$defs``, ``anyOf`` / ``oneOf`` (the first branch that is not null) and
``allOf`` (merged). What it cannot satisfy (a ``pattern``, ``not``) it approximates; the caller
validates.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["sample"]

_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "duration": "P1D",
}


def sample(schema: dict[str, Any] | bool, root: dict[str, Any] | None = None) -> Any:
    """A value ``schema`` accepts (``root`` holds the ``$defs`` that ``$ref`` points into)."""
    return _value(schema, schema if root is None and isinstance(schema, dict) else root, 0)


def _resolve(ref: str, root: dict[str, Any] | None) -> Any:
    node: Any = root or {}
    for part in ref.lstrip("#/").split("/"):
        if not part:
            continue
        node = (
            node.get(part.replace("~1", "/").replace("~0", "~"), {})
            if isinstance(node, dict)
            else {}
        )
    return node


def _value(schema: Any, root: dict[str, Any] | None, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > 20:  # True / {} / a cycle: anything goes
        return "a" if depth <= 20 else None
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        branches = [b for b in schema.get(key) or () if isinstance(b, dict)]
        if branches:
            usable = [b for b in branches if b.get("type") != "null"] or branches
            return _value(usable[0], root, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                part = _resolve(part["$ref"], root) if "$ref" in part else part
                merged = {**merged, **part}
        return _value(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        return {
            name: _value(sub, root, depth + 1)
            for name, sub in (schema.get("properties") or {}).items()
        }
    if kind == "array":
        items = schema.get("items", {})
        prefix = schema.get("prefixItems") or []
        count = max(int(schema.get("minItems", 1)), len(prefix))
        if "maxItems" in schema:
            count = min(count, int(schema["maxItems"]))
        out = [_value(p, root, depth + 1) for p in prefix[:count]]
        out += [_value(items, root, depth + 1) for _ in range(count - len(out))]
        return out
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema)


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_x, high_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(low_x, int | float) and not isinstance(low_x, bool):
        low = low_x + 1 if integer else low_x  # open bound: nudged inward below
    if isinstance(high_x, int | float) and not isinstance(high_x, bool):
        high = high_x - 1 if integer else high_x
    open_low = not integer and low is not None and low == low_x
    open_high = not integer and high is not None and high == high_x
    if low is not None and high is not None:
        value: float = (low + high) / 2 if open_low else low
    elif low is not None:
        value = low + 1 if open_low else low
    elif high is not None:
        value = high - 1 if open_high else min(high, 1)
    else:
        value = 1
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step - 1e-9) * step
    return math.ceil(value) if integer else float(value)


def _string(schema: dict[str, Any]) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    low = int(schema.get("minLength", 1))
    high = schema.get("maxLength")
    length = max(low, 1) if high is None else min(max(low, 1), int(high))
    return ("a" * length)[:length]
