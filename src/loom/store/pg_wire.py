"""Array parameters of ``PostgresStore``'s appends, encoded once in PostgreSQL's binary format.

Why: an append sends about twenty arrays (``loom_append``'s columns); psycopg's generic list
dumper inspects every list to guess its element type and dumps element by element, which the
profile showed costing more client CPU than the rest of the append. Here each member of a
commit encodes its elements once, when ``append`` is called (so a value PostgreSQL's wire
format cannot carry fails that caller alone, before anything is queued), and a batch of members
concatenates those bytes under one array header. :class:`BinaryArray` carries the finished
bytes; its dumper hands them to psycopg as they are.

The format (``array_send``): ndim, has-null flag, element type oid, then per dimension its
length and lower bound, then each element as a 4-byte length (-1 for NULL) and its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import adapters
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = [
    "EMPTY_FLOAT8",
    "EMPTY_INT8",
    "EMPTY_TEXT",
    "BinaryArray",
    "Column",
    "Float8Array",
    "Int8Array",
    "TextArray",
    "float_column",
    "int_column",
    "text_column",
]

TEXT, INT8, FLOAT8 = 25, 20, 701
_ARRAY_OID = {TEXT: 1009, INT8: 1016, FLOAT8: 1022}
_NULL = b"\xff\xff\xff\xff"
_INT8_ITEM = struct.Struct("!iq")
_FLOAT8_ITEM = struct.Struct("!id")
_HEADER = struct.Struct("!iiIii")
_EMPTY_HEADER = struct.Struct("!iiI")


@dataclass(frozen=True, slots=True)
class Column:
    """Elements of one array, already encoded: their bytes, how many, whether one is NULL."""

    oid: int
    body: bytes
    count: int
    nulls: bool

    @staticmethod
    def join(columns: Sequence[Column]) -> Column:
        """The columns of several members as one column (their elements in order)."""
        if len(columns) == 1:
            return columns[0]
        return Column(
            columns[0].oid,
            b"".join(c.body for c in columns),
            sum(c.count for c in columns),
            any(c.nulls for c in columns),
        )

    def array(self) -> BinaryArray:
        """The array parameter of these elements."""
        if self.count == 0:
            return _EMPTY_ARRAY[self.oid]
        header = _HEADER.pack(1, 1 if self.nulls else 0, self.oid, self.count, 1)
        return _ARRAY_TYPE[self.oid](header + self.body)


def text_column(values: Sequence[str | None]) -> Column:
    """Text elements (None: NULL). Raises ``UnicodeEncodeError`` on a lone surrogate."""
    if not values:
        return EMPTY_TEXT
    parts: list[bytes] = []
    nulls = False
    count = 0
    for value in values:
        count += 1
        if value is None:
            parts.append(_NULL)
            nulls = True
        else:
            data = value.encode("utf-8")
            parts.append(len(data).to_bytes(4, "big"))
            parts.append(data)
    return Column(TEXT, b"".join(parts), count, nulls)


def _fixed_column(
    values: Sequence[float | None], item: struct.Struct, oid: int, empty: Column
) -> Column:
    """Elements of one fixed-size binary type, each its length (``item`` packs it after) and
    its bytes (None: NULL)."""
    if not values:
        return empty
    parts: list[bytes] = []
    nulls = False
    for value in values:
        if value is None:
            parts.append(_NULL)
            nulls = True
        else:
            parts.append(item.pack(8, value))
    return Column(oid, b"".join(parts), len(parts), nulls)


def int_column(values: Sequence[int | None]) -> Column:
    """``bigint`` elements (None: NULL)."""
    return _fixed_column(values, _INT8_ITEM, INT8, EMPTY_INT8)


def float_column(values: Sequence[float | None]) -> Column:
    """``double precision`` elements (None: NULL)."""
    return _fixed_column(values, _FLOAT8_ITEM, FLOAT8, EMPTY_FLOAT8)


@dataclass(frozen=True, slots=True)
class BinaryArray:
    """A query parameter: an array already in PostgreSQL's binary format."""

    data: bytes


class TextArray(BinaryArray):
    """A ``text[]`` parameter."""

    __slots__ = ()


class Int8Array(BinaryArray):
    """A ``bigint[]`` parameter."""

    __slots__ = ()


class Float8Array(BinaryArray):
    """A ``double precision[]`` parameter."""

    __slots__ = ()


_ARRAY_TYPE: dict[int, type[BinaryArray]] = {TEXT: TextArray, INT8: Int8Array, FLOAT8: Float8Array}


def _dumper(array_oid: int) -> type[Dumper]:
    class ArrayDumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: object) -> bytes:
            assert isinstance(obj, BinaryArray)
            return obj.data

    return ArrayDumper


for _element, _cls in _ARRAY_TYPE.items():
    adapters.register_dumper(_cls, _dumper(_ARRAY_OID[_element]))

# Most appends leave most columns empty (no ledger row, no run record): built once.
_EMPTY_ARRAY = {oid: cls(_EMPTY_HEADER.pack(0, 0, oid)) for oid, cls in _ARRAY_TYPE.items()}
EMPTY_TEXT = Column(TEXT, b"", 0, False)
EMPTY_INT8 = Column(INT8, b"", 0, False)
EMPTY_FLOAT8 = Column(FLOAT8, b"", 0, False)
