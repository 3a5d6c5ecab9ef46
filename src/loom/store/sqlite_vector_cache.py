"""An in-process copy of a SQLite file's item vectors, for semantic search (issue #29).

Without it a semantic search on SQLite reads every candidate's 1 KB vector row out of the file
and hands it to Python (85% of a 100,000-item search's CPU time; this Python's ``sqlite3``
cannot load ``sqlite-vec``). With it a search is one numpy matrix-vector product over the
candidates, and SQLite is asked only for the few items it returns.

What it holds, per database file (the process's one ``sqlite_db.Database`` connection, which
every ``SQLiteStore`` of that file shares): a float32 matrix of the unit vectors of this
store's embedder, one row per embedded item, the items' rowids (ascending), and beside them
what the owner and namespace conditions read: each row's owner and namespace (as codes into
small tables of the distinct values) and expiry time. The filter condition (``filter=``) is
left to SQL: it returns the candidates' rowids.

Kept exact:

- **Built lazily**, on the first semantic search, in one read transaction with the generation
  it reflects.
- **This process's writes** (put, delete, purge, forgetting) change it after their
  transaction has committed, row by row; a bulk re-embedding (``embed_pending``,
  ``reindex_items``) drops it, to be rebuilt by the next search.
- **Another process's writes** are seen through a generation counter: every write of an item
  vector, by any process, bumps the row ``(loom.item_vectors, generation)`` of the ``kv``
  table in its own transaction. A search reads that row first (one indexed read); when it is
  not the generation the copy reflects, the copy is rebuilt. A write applied here checks that
  its bump followed the copy's generation directly, else drops the copy (someone else wrote
  in between).
- **Optional**: it needs numpy (the ``memory`` extra); without it a search reads the file.
- **Bounded**: the matrix takes rows x dimensions x 4 bytes (100,000 items at 256 dimensions:
  100 MB). ``LOOM_ITEM_VECTOR_CACHE_MB`` caps it (default :data:`DEFAULT_CAP_MB`; ``0`` turns
  the copy off): over the cap a search reads the vectors from the file as before.
"""

from __future__ import annotations

import os
import sqlite3
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

try:
    import numpy as np
except ImportError:  # numpy comes with the memory extra; without it there is no copy
    HAVE_NUMPY = False
else:
    HAVE_NUMPY = True

if TYPE_CHECKING:
    import numpy.typing as npt

from loom.errors import ConfigurationError
from loom.store.items_sql import namespace_text

__all__ = [
    "CACHE_ENV",
    "DEFAULT_CAP_MB",
    "GENERATION_KEY",
    "GENERATION_NAMESPACE",
    "HAVE_NUMPY",
    "VectorCache",
    "VectorRow",
    "bump_generation",
    "cache_cap_bytes",
    "cache_for",
    "read_generation",
]

CACHE_ENV = "LOOM_ITEM_VECTOR_CACHE_MB"
DEFAULT_CAP_MB = 512
GENERATION_NAMESPACE = "loom.item_vectors"
GENERATION_KEY = "generation"

_NO_OWNER = -1  # the owner code of an item without an owner (matched by no owner's search)


def cache_cap_bytes() -> int:
    """The matrix's cap in bytes from ``LOOM_ITEM_VECTOR_CACHE_MB`` (0: no copy)."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if not raw:
        return DEFAULT_CAP_MB * 1024 * 1024
    try:
        megabytes = float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{CACHE_ENV} is a number of megabytes (0 turns the vector copy off), got {raw!r}"
        ) from None
    if megabytes < 0:
        raise ConfigurationError(f"{CACHE_ENV} is 0 or more megabytes, got {raw!r}")
    return int(megabytes * 1024 * 1024)


def bump_generation(c: sqlite3.Connection) -> int:
    """Bump the item vectors' generation inside the caller's write transaction; the new one."""
    row = c.execute(
        "INSERT INTO kv (namespace, key, value, updated_at) VALUES (?, ?, '1', ?) "
        "ON CONFLICT (namespace, key) DO UPDATE SET "
        "value = CAST(CAST(kv.value AS INTEGER) + 1 AS TEXT), updated_at = excluded.updated_at "
        "RETURNING value",
        (GENERATION_NAMESPACE, GENERATION_KEY, time.time()),
    ).fetchone()
    return int(row[0])


def read_generation(c: sqlite3.Connection) -> int:
    """The item vectors' generation (0 before the first write)."""
    row = c.execute(
        "SELECT value FROM kv WHERE namespace = ? AND key = ?",
        (GENERATION_NAMESPACE, GENERATION_KEY),
    ).fetchone()
    return int(row[0]) if row is not None else 0


@dataclass(frozen=True, slots=True)
class VectorRow:
    """One embedded item as a write leaves it: its rowid, namespace (stored text), owner,
    expiry (epoch seconds or None) and unit vector (float32 bytes)."""

    rowid: int
    namespace: str
    owner: str | None
    expires_at: float | None
    vector: bytes


if TYPE_CHECKING:
    Cell = TypeVar("Cell", bound=np.generic)
    Floats = npt.NDArray[np.float32]
    Ints = npt.NDArray[np.int64]


@dataclass(eq=False)
class VectorCache:
    """The copy of one database's item vectors (module docstring). Its methods run under the
    database's lock (inside ``Database.read`` / after ``Database.transaction``)."""

    generation: int | None = None  # the generation it reflects; None: to be (re)built
    model: tuple[str, int] | None = None  # (embedder name, dimensions) of its vectors
    too_big_at: int | None = None  # the generation at which it was found over its cap
    size: int = 0  # rows in use (the arrays have room for more)
    matrix: Floats = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    rowids: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    present: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    owners: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    namespaces: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    expires: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    owner_codes: dict[str, int] = field(default_factory=dict)
    namespace_codes: dict[str, int] = field(default_factory=dict)
    namespace_names: list[str] = field(default_factory=list)
    rebuilds: int = 0  # how many times it was built (tests, benchmarks)

    @property
    def nbytes(self) -> int:
        """The bytes its arrays take."""
        return sum(
            a.nbytes
            for a in (
                self.matrix,
                self.rowids,
                self.present,
                self.owners,
                self.namespaces,
                self.expires,
            )
        )

    def drop(self) -> None:
        """Forget the copy (the next search rebuilds it)."""
        self.generation = None
        self.size = 0
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self.rowids = np.zeros(0, dtype=np.int64)
        self.present = np.zeros(0, dtype=np.bool_)
        self.owners = np.zeros(0, dtype=np.int64)
        self.namespaces = np.zeros(0, dtype=np.int64)
        self.expires = np.zeros(0)
        self.owner_codes.clear()
        self.namespace_codes.clear()
        self.namespace_names.clear()

    # -- building --------------------------------------------------------------------------------
    def ready(self, c: sqlite3.Connection, model: tuple[str, int], cap_bytes: int) -> bool:
        """Bring the copy up to the file's generation for ``model`` (rebuilding it when another
        process wrote, or it was dropped); False when it is off or over its cap (then search
        the file)."""
        if cap_bytes <= 0:
            return False
        generation = read_generation(c)
        if self.generation == generation and self.model == model:
            return True
        if self.too_big_at == generation and self.model == model:
            return False
        c.execute("BEGIN")  # one snapshot: the generation and the vectors it counts
        try:
            generation = read_generation(c)
            self.drop()
            self.model = model
            count = c.execute(
                "SELECT count(*) FROM item_vectors WHERE vector IS NOT NULL"
            ).fetchone()[0]
            if count * model[1] * 4 > cap_bytes:
                self.too_big_at = generation
                return False
            self.too_big_at = None
            rows = c.execute(
                "SELECT v.item_rowid, i.namespace, i.owner, i.expires_at, v.vector "
                "FROM item_vectors v JOIN items i ON i.rowid = v.item_rowid "
                "WHERE v.vector IS NOT NULL AND v.embedder = ? AND v.dims = ? "
                "ORDER BY v.item_rowid",
                model,
            ).fetchall()
        finally:
            c.execute("COMMIT")
        self._allocate(len(rows), model[1], cap_bytes)
        for slot, (rowid, namespace, owner, expires_at, vector) in enumerate(rows):
            self._fill(slot, VectorRow(rowid, namespace, owner, expires_at, vector))
        self.size = len(rows)
        self.generation = generation
        self.rebuilds += 1
        return True

    def _allocate(self, rows: int, dims: int, cap_bytes: int) -> None:
        # A quarter of headroom for this process's new items, within the cap.
        room = max(rows, min(max(16, rows + rows // 4), cap_bytes // (dims * 4)))
        self.matrix = np.zeros((room, dims), dtype=np.float32)
        self.rowids = np.zeros(room, dtype=np.int64)
        self.present = np.zeros(room, dtype=np.bool_)
        self.owners = np.zeros(room, dtype=np.int64)
        self.namespaces = np.zeros(room, dtype=np.int64)
        self.expires = np.zeros(room)

    def _grow(self, cap_bytes: int) -> bool:
        dims = self.matrix.shape[1]
        room = max(16, self.size + self.size // 2)
        if room * dims * 4 > cap_bytes:
            room = cap_bytes // (dims * 4)
            if room <= self.size:
                return False
        self.matrix = _resized(self.matrix, room)
        self.rowids = _resized(self.rowids, room)
        self.present = _resized(self.present, room)
        self.owners = _resized(self.owners, room)
        self.namespaces = _resized(self.namespaces, room)
        self.expires = _resized(self.expires, room)
        return True

    def _code(self, namespace: str, owner: str | None) -> tuple[int, int]:
        ns_code = self.namespace_codes.get(namespace)
        if ns_code is None:
            ns_code = self.namespace_codes[namespace] = len(self.namespace_names)
            self.namespace_names.append(namespace)
        if owner is None:
            return ns_code, _NO_OWNER
        owner_code = self.owner_codes.setdefault(owner, len(self.owner_codes))
        return ns_code, owner_code

    def _fill(self, slot: int, row: VectorRow) -> None:
        ns_code, owner_code = self._code(row.namespace, row.owner)
        self.matrix[slot] = np.frombuffer(row.vector, dtype="<f4")
        self.rowids[slot] = row.rowid
        self.present[slot] = True
        self.owners[slot] = owner_code
        self.namespaces[slot] = ns_code
        self.expires[slot] = np.inf if row.expires_at is None else row.expires_at

    # -- this process's writes ---------------------------------------------------------------------
    def apply(
        self,
        generation: int,
        *,
        upsert: VectorRow | None = None,
        remove: Sequence[int] = (),
        cap_bytes: int,
    ) -> None:
        """Apply a committed write that bumped the generation to ``generation``: ``upsert`` an
        embedded item's row, ``remove`` rowids (deleted, or no longer embedded). The copy is
        dropped instead when it missed a write (another process's, in between) or the row does
        not fit (another model, an older rowid, no room under the cap)."""
        if self.generation is None or generation <= self.generation:
            return  # no copy, or one rebuilt since the write (it holds it already)
        if generation != self.generation + 1:
            self.drop()
            return
        self.generation = generation
        if remove:
            slots = self._slots(np.asarray(remove, dtype=np.int64))
            self.present[slots] = False
        if upsert is None:
            return
        if self.model is None or len(upsert.vector) != self.model[1] * 4:
            self.drop()
            return
        [slot] = self._slots(np.asarray([upsert.rowid], dtype=np.int64)).tolist() or [None]
        if slot is not None:
            self._fill(slot, upsert)
            return
        if self.size and upsert.rowid <= int(self.rowids[self.size - 1]):
            self.drop()  # a reused rowid below the last: the rows would no longer be sorted
            return
        if self.size == len(self.rowids) and not self._grow(cap_bytes):
            self.too_big_at = generation
            self.drop()
            return
        self._fill(self.size, upsert)
        self.size += 1

    def _slots(self, rowids: Ints) -> Ints:
        """The slots holding ``rowids`` (those the copy has)."""
        held = self.rowids[: self.size]
        slots = np.searchsorted(held, rowids)
        inside = slots < self.size
        slots, rowids = slots[inside], rowids[inside]
        found: Ints = slots[held[slots] == rowids]
        return found

    # -- searching -------------------------------------------------------------------------------
    def candidates(
        self,
        *,
        owner: str | None,
        prefix: tuple[str, ...],
        now: float,
        rowids: Sequence[int] | None,
    ) -> Ints:
        """The slots of the live embedded items ``owner`` sees under ``prefix`` at ``now``
        (the conditions ``sqlite_items._visible`` and ``_under`` write in SQL), among
        ``rowids`` when given (the filter's candidates, from SQL)."""
        size = self.size
        keep = self.present[:size] & (self.expires[:size] > now)
        if owner is not None:
            code = self.owner_codes.get(owner)
            if code is None:
                return np.zeros(0, dtype=np.int64)
            keep &= self.owners[:size] == code
        if prefix:
            text = namespace_text(prefix)
            under = np.fromiter(
                (n == text or n.startswith(text + ".") for n in self.namespace_names),
                dtype=np.bool_,
                count=len(self.namespace_names),
            )
            keep &= under[self.namespaces[:size]]
        if rowids is not None:
            chosen = np.zeros(size, dtype=np.bool_)
            chosen[self._slots(np.asarray(rowids, dtype=np.int64))] = True
            keep &= chosen
        return np.flatnonzero(keep)

    def best(self, slots: Ints, target: Sequence[float], depth: int) -> list[tuple[int, float]]:
        """The (rowid, similarity) of the ``depth`` best of ``slots`` for the unit vector
        ``target``, and every one tied with the last of them; not yet ordered (ties are broken
        by namespace and key, which the caller reads)."""
        if not len(slots) or depth <= 0:
            return []
        query = np.asarray(target, dtype=np.float32)
        # einsum, not ``@``: a matrix-vector product through OpenBLAS wakes its thread pool,
        # which on a busy machine cost a 3,000-row product 7 ms instead of 0.05 (measured);
        # einsum's single-threaded loop does 100,000 x 256 in ~3 ms.
        if len(slots) * 4 >= self.size:  # most rows: one product over all, then pick
            product = np.einsum("ij,j->i", self.matrix[: self.size], query)[slots]
        else:
            product = np.einsum("ij,j->i", self.matrix[slots], query)
        if depth < len(product):
            floor = np.partition(product, len(product) - depth)[len(product) - depth]
            picked = np.flatnonzero(product >= floor)
        else:
            picked = np.arange(len(product))
        return list(
            zip(
                self.rowids[slots[picked]].tolist(),
                product[picked].astype(np.float64).tolist(),
                strict=True,
            )
        )


def _resized(array: npt.NDArray[Cell], room: int) -> npt.NDArray[Cell]:
    grown = np.zeros((room, *array.shape[1:]), dtype=array.dtype)
    grown[: min(room, len(array))] = array[:room]
    return grown


_caches: weakref.WeakKeyDictionary[object, VectorCache] = weakref.WeakKeyDictionary()


def cache_for(database: object) -> VectorCache | None:
    """The vector copy of ``database`` (one per shared connection, so every store of a file in
    this process keeps the same copy in step); None without numpy."""
    if not HAVE_NUMPY:
        return None
    cache = _caches.get(database)
    if cache is None:
        cache = _caches[database] = VectorCache()
    return cache
