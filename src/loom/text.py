"""Making text and data storable: no lone surrogates, nothing that JSON cannot hold.

Python strings may carry lone surrogates (``"\\udcff"``): ``os.listdir`` returns them for file
names that are not UTF-8 (``surrogateescape``), and tools or models can produce them. Such a
string cannot be encoded as UTF-8, so it breaks JSON export, SQLite and every provider. Every
string Loom stores goes through ``representable`` first; every tool result goes through
``json_native`` (the one serialisation, decided by the executor before anything is committed).

``json_native`` turns a value into JSON-native data (``dict`` with ``str`` keys, ``list``,
``str``, ``int``, ``float``, ``bool``, ``None``):

| value                                   | becomes                                           |
| --------------------------------------- | ------------------------------------------------- |
| ``str`` with lone surrogates            | the text with ``\\xNN`` / ``\\uXXXX`` escapes       |
| ``float`` NaN / ±infinity               | ``"NaN"``, ``"Infinity"``, ``"-Infinity"``        |
| ``datetime``, ``date``, ``time``        | ISO 8601 text                                     |
| ``timedelta``                           | seconds (``float``)                               |
| ``Decimal``, ``UUID``, paths            | their text                                        |
| ``Enum``                                | its value (converted in turn)                     |
| ``bytes``, ``bytearray``, ``memoryview`` | the text if it is UTF-8, else ``{"base64": ...}`` |
| dataclass instance                      | ``{field: value}``                                |
| pydantic model                          | ``model_dump()``                                  |
| mapping                                 | ``dict``; keys become text                        |
| list, tuple, set, frozenset, other      | ``list`` (sets sorted when their items allow it)  |
| iterables (not iterators)               |                                                   |
| any other object                        | ``str(value)``                                    |

A value nested deeper than ``MAX_DEPTH`` levels, holding more than ``MAX_ITEMS`` items, that
contains itself, or whose ``str()`` raises cannot be represented: ``json_native`` raises
``ValueNotRepresentable`` saying why.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import enum
import math
import re
import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import PurePath
from typing import Any

from loom.errors import ValueNotRepresentable

__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "TOO_DEEP",
    "json_native",
    "nested_too_deep",
    "representable",
    "whole_number",
]

MAX_DEPTH = 100
"""Deepest nesting ``json_native`` accepts (the stores' JSON encoders recurse per level)."""
MAX_ITEMS = 1_000_000
"""Most containers and scalars ``json_native`` converts in one value."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that ``surrogateescape`` could not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def representable(text: str) -> tuple[str, bool]:
    """``text`` made encodable as UTF-8, and whether anything had to change.

    Surrogate pairs are joined into the character they stand for; a lone surrogate from an
    undecodable byte (``"\\udcff"``) becomes the four characters ``\\xff``, any other lone
    surrogate ``\\udXXX`` as text. Valid text is returned as it is (the fast path).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text, False
    # Join valid pairs first ("\ud83d\ude00" is one emoji written as two code points).
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return _SURROGATE.sub(_escape, joined), True


class _Converter:
    """One conversion: counts items, watches depth and cycles, notes escaped text."""

    __slots__ = ("escaped", "items", "path")

    def __init__(self) -> None:
        self.items = 0
        self.escaped = 0
        self.path: set[int] = set()  # ids of the containers being converted (cycle check)

    def text(self, s: str) -> str:
        out, changed = representable(s)
        self.escaped += changed
        return out

    def convert(self, value: Any, depth: int) -> Any:
        self.items += 1
        if self.items > MAX_ITEMS:
            raise ValueNotRepresentable(
                f"the value holds more than {MAX_ITEMS:,} items; return a summary, or store "
                "the data elsewhere and return where it is"
            )
        if value is None or value is True or value is False:
            return value
        kind = type(value)
        if kind is str:
            return self.text(value)
        if kind is int:
            return value
        if kind is float:
            return value if math.isfinite(value) else _non_finite(value)
        if depth >= MAX_DEPTH:
            raise ValueNotRepresentable(
                f"the value is nested deeper than {MAX_DEPTH} levels; return a flatter structure"
            )
        if isinstance(value, enum.Enum):
            return self.convert(value.value, depth + 1)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, str):
            return self.text(str.__str__(value))
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            f = float(value)
            return f if math.isfinite(f) else _non_finite(f)
        if isinstance(value, dt.datetime | dt.date | dt.time):
            return value.isoformat()
        if isinstance(value, dt.timedelta):
            return value.total_seconds()
        if isinstance(value, Decimal | uuid.UUID | PurePath):
            return str(value)
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            try:
                return self.text(raw.decode("utf-8"))
            except UnicodeDecodeError:
                return {"base64": base64.b64encode(raw).decode("ascii")}
        mark = id(value)
        if mark in self.path:
            raise ValueNotRepresentable(
                f"the value contains itself (a {type(value).__name__} refers back to one of "
                "its containers); return data without cycles"
            )
        self.path.add(mark)
        try:
            return self._container(value, depth)
        finally:
            self.path.discard(mark)

    def _container(self, value: Any, depth: int) -> Any:
        if isinstance(value, Mapping):
            return {self.key(k): self.convert(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.convert(v, depth + 1) for v in value]
        if isinstance(value, set | frozenset):
            items = list(value)
            with contextlib.suppress(TypeError):  # mixed types: keep iteration order
                items.sort()
            return [self.convert(v, depth + 1) for v in items]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: self.convert(getattr(value, f.name), depth + 1)
                for f in dataclasses.fields(value)
            }
        dump = getattr(value, "model_dump", None)
        if callable(dump) and not isinstance(value, type):
            try:
                dumped = dump()
            except Exception as exc:
                raise ValueNotRepresentable(
                    f"{type(value).__name__}.model_dump() raised {type(exc).__name__}: {exc}"
                ) from None
            return self.convert(dumped, depth)
        if _is_collection(value):
            return [self.convert(v, depth + 1) for v in value]
        try:
            shown = str(value)
        except Exception as exc:
            raise ValueNotRepresentable(
                f"a {type(value).__name__} cannot be shown as text: its __str__ raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(shown, str):  # pragma: no cover - str() always returns str
            raise ValueNotRepresentable(f"str() of a {type(value).__name__} is not text")
        return self.text(shown)

    def key(self, k: Any) -> str:
        if isinstance(k, str):
            return self.text(str.__str__(k))
        # Other scalar keys are written as ``json.dumps`` writes them.
        if k is None:
            return "null"
        if isinstance(k, bool):
            return "true" if k else "false"
        if isinstance(k, int):
            return str(int(k))
        if isinstance(k, float):
            return repr(float(k))
        converted = self.convert(k, 0)
        return converted if isinstance(converted, str) else str(converted)


def _is_collection(value: Any) -> bool:
    # Iterators and generators are not converted: iterating would consume them.
    if isinstance(value, Iterator):
        return False
    try:
        iter(value)
    except TypeError:
        return False
    return hasattr(value, "__len__")


def _non_finite(f: float) -> str:
    if math.isnan(f):
        return "NaN"
    return "Infinity" if f > 0 else "-Infinity"


TOO_DEEP = f"the YAML is nested too deep (over {MAX_DEPTH} levels); flatten it"
"""What a definition file nested past ``MAX_DEPTH`` is told."""


def nested_too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether plain data (dicts, lists, tuples) nests more than ``limit`` levels; checked
    without recursion, so any depth can be measured (parsed YAML, JSON)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return False


def json_native(value: Any) -> tuple[Any, int]:
    """``value`` as JSON-native data, and how many strings had to be escaped.

    Raises ``ValueNotRepresentable`` (with the reason) for a value that contains itself, is
    nested deeper than ``MAX_DEPTH``, holds more than ``MAX_ITEMS`` items, or whose ``str()``
    raises. See the module docstring for what each type becomes.
    """
    conv = _Converter()
    try:
        out = conv.convert(value, 0)
    except RecursionError:
        raise ValueNotRepresentable(
            "the value is nested too deeply to convert; return a flatter structure"
        ) from None
    return out, conv.escaped


def whole_number(text: str, *, max_digits: int = 18) -> int | None:
    """The non-negative integer ``text`` writes in ASCII digits (at most ``max_digits`` of
    them), else None. ``str.isdigit`` is not enough before ``int()``: it accepts ``"²"``, which
    ``int`` refuses, and ``int`` refuses more than 4,300 digits; a request field checked with
    it became a 500 instead of a 4xx."""
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
