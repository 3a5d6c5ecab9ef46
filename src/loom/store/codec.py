"""The one serialisation every store uses: messages, events, ledger entries and run records.

Both built-in stores keep exactly what this module produces (``SQLiteStore`` in its columns,
``MemoryStore`` in its lists) and read it back through it, so a value that cannot be stored
fails the same way on both, before anything of the step is committed (issue #12: tests on the
in-memory store passed while SQLite failed).

What a value becomes:

- JSON values (dict, list, str, int, float, bool, None) are kept as they are; NaN and
  infinities are kept (written ``NaN``, ``Infinity``, as Python's ``json`` does), also in
  pydantic models, whose own JSON form would make them ``null``.
- Other values are stored as their JSON form and read back as it: ``datetime`` / ``date`` /
  ``time`` → ISO 8601 strings, ``timedelta`` → ISO 8601 durations, tuples and sets → lists,
  ``UUID`` / ``Decimal`` / ``Path`` / enums → their text or value, pydantic models and
  dataclasses → objects, ``bytes`` → text when they are UTF-8.
- Text that is not valid Unicode (a *lone surrogate*, as ``os.fsdecode`` makes of a file
  name that is not UTF-8, or half of a broken UTF-16 pair) is escaped, not refused: each lone
  surrogate becomes the six visible characters ``\\udcXX`` (a backslash, ``u`` and its four
  hex digits), in keys and values alike; a high and low surrogate that form a pair become
  the character they encode. The escape is not undone on reading: the text stays valid
  UTF-8 everywhere it goes (SQLite, JSONL exports, a model provider's API).
- Anything else raises :class:`~loom.errors.SerializationError` naming the field: an object
  with no JSON form, a structure that refers to itself, one nested deeper than
  :data:`MAX_DEPTH` levels (it could be written but not read back), bytes that are not UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, from_json, to_json

from loom.content import MAX_MEDIA_BYTES, Blob, jsonable, media_ref
from loom.errors import ContentError, MediaTooLarge, SerializationError
from loom.events import EVENT_CLASSES, AgentEvent, EventType, make_event
from loom.messages import Effect, Message, ToolResult, Usage
from loom.store.base import LedgerEntry, LedgerStatus, RunRecord, SessionInfo, StoredError

__all__ = [
    "ERROR_COLS",
    "MAX_DEPTH",
    "MAX_FORK_DEPTH",
    "PARENT_KEY",
    "PARTS_LAST",
    "EventRow",
    "LedgerRow",
    "PackedCommit",
    "RunRow",
    "Segment",
    "check_blobs",
    "clip",
    "decode_error",
    "decode_event",
    "decode_ledger",
    "decode_messages",
    "decode_run",
    "decode_session",
    "decode_value",
    "encode_event",
    "encode_events",
    "encode_ledger",
    "encode_message",
    "encode_run",
    "encode_value",
    "message_dict",
    "pack_commit",
    "scrub_text",
    "segments",
    "unpack_ledger",
]

#: The deepest nesting a stored value may have. The JSON parser that reads values back (jiter,
#: inside pydantic) stops at 200 levels; a few are kept for the envelope (a message's fields,
#: the list a transcript is read into).
MAX_DEPTH = 190

_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
# A high surrogate followed by a low one (a UTF-16 pair left split), or a lone surrogate.
_SURROGATES = re.compile("([\ud800-\udbff][\udc00-\udfff])|[\ud800-\udfff]")


# -- text and values --------------------------------------------------------------------------
def _fix_surrogate(match: re.Match[str]) -> str:
    pair = match.group(1)
    if pair is not None:
        return pair.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    return f"\\u{ord(match.group(0)):04x}"


def scrub_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by its visible ``\\udcXX`` escape."""
    if text.isascii():  # the common case costs one C call
        return text
    return _SURROGATES.sub(_fix_surrogate, text)


def _scrub(value: Any) -> Any:
    """``value`` with every string in it scrubbed (containers and models rebuilt as JSON)."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v) for v in value]
    if isinstance(value, BaseModel):  # python mode: strings are not encoded yet
        return _scrub(value.model_dump())
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _scrub(getattr(value, f.name)) for f in fields(value)}
    return value


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, BaseModel):
        return [(f".{name}", getattr(value, name)) for name in type(value).model_fields]
    if is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name)) for f in fields(value)]
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return []


def _locate(value: Any, path: str, seen: set[int], depth: int) -> tuple[str, str] | None:
    """Where in ``value`` the first part without a JSON form is, and why (failure path only)."""
    if depth > MAX_DEPTH:
        return path, f"is nested more than {MAX_DEPTH} levels deep"
    kids = _children(value)
    if kids:
        if id(value) in seen:
            return path, "refers to itself (a circular reference)"
        seen.add(id(value))
        for step, child in kids:
            found = _locate(child, path + step, seen, depth + 1)
            if found is not None:
                return found
        seen.discard(id(value))
        return None
    try:
        to_json(value, inf_nan_mode="constants")
    except PydanticSerializationError as exc:
        return path, f"has no JSON form ({type(value).__name__}: {exc})"
    return None


def _refuse(value: Any, what: str, exc: Exception | None) -> SerializationError:
    found = _locate(value, "", set(), 0)
    if found is not None:
        where, why = found
        if len(where) > 120:  # a very deep path: its start and its end say enough
            where = f"{where[:80]}…{where[-30:]}"
        detail = f"{what}{where} {why}"
    else:
        detail = f"{what} cannot be stored as JSON ({exc})"
    return SerializationError(
        f"{detail}. Nothing of this step was saved. Store only JSON-compatible values "
        "(dict, list, str, int, float, bool, None, datetime, pydantic models); convert other "
        "objects (for example with str() or .model_dump()) before returning or storing them."
    )


def encode_value(value: Any, what: str, *what_args: object) -> str:
    """``value`` as JSON text, valid UTF-8, readable back by :func:`decode_value`.

    ``what`` names the field for error messages, formatted with ``what_args`` only when
    needed (``encode_value(data, "{} event data", kind)``: this runs ~15 times a step).

    Raises:
        SerializationError: ``value`` cannot be stored; the message names the part.
    """
    # A model's own JSON form would turn NaN and infinities into null, which a float field
    # then refuses on reading (a session that cannot be loaded); its Python form keeps them.
    plain = value
    if type(value) is not dict and isinstance(value, BaseModel):
        plain = value.model_dump()
    return _encode_plain(value, plain, what, what_args)


def _encode_plain(value: Any, plain: Any, what: str, what_args: tuple[object, ...]) -> str:
    """``plain`` (``value``'s Python form) as JSON text; errors name the part of ``value``."""
    try:
        text: str = to_json(plain, inf_nan_mode="constants").decode()
    except PydanticSerializationError as exc:
        if "surrogates not allowed" not in str(exc):
            raise _refuse(value, what.format(*what_args), exc) from None
        try:  # the rare path: scrub every string of the value, then encode that
            text = to_json(_scrub(plain), inf_nan_mode="constants").decode()
        except (ValueError, RecursionError) as exc2:  # PydanticSerializationError too
            raise _refuse(value, what.format(*what_args), exc2) from None
    except (ValueError, RecursionError) as exc:
        raise _refuse(value, what.format(*what_args), exc) from None
    # Reading stops at 200 levels. Text that deep has at least two brackets a level, so the
    # count (and, past it, a trial read) runs for big values only.
    if len(text) >= 2 * MAX_DEPTH and text.count("[") + text.count("{") >= MAX_DEPTH:
        try:
            from_json("[[[[[[[[[[" + text + "]]]]]]]]]]")
        except ValueError:
            raise SerializationError(
                f"{what.format(*what_args)} is nested more than {MAX_DEPTH} levels deep, "
                "deeper than can be read back. Nothing of this step was saved. Flatten the "
                "value (or store it as a string) before returning or storing it."
            ) from None
    return text


def decode_value(text: str) -> Any:
    """The JSON value :func:`encode_value` wrote."""
    return from_json(text)


# -- messages ---------------------------------------------------------------------------------
def message_dict(message: Message) -> dict[str, Any]:
    """A message's stored form: its fields, but ``parts`` only when it has some (each part
    without its empty fields, and never its bytes: a medium is stored by reference). Most
    messages have none, and a stored message reads an absent ``parts`` back as ``[]``: the
    stored JSON of a text conversation did not grow with parts (issue #26's disk figure)."""
    plain = message.model_dump()
    if message.parts:
        plain["parts"] = jsonable(message.parts)
    else:
        del plain["parts"]
    return plain


def encode_message(message: Message) -> str:
    """One message as JSON text (the ``data`` column of SQLite's ``messages`` table)."""
    return _encode_plain(message, message_dict(message), "{} message", (message.role,))


def decode_messages(texts: Sequence[str]) -> list[Message]:
    """The messages :func:`encode_message` wrote, in order (one parse for all of them)."""
    if not texts:
        return []
    return _MESSAGES.validate_json("[" + ",".join(texts) + "]")


# -- events -----------------------------------------------------------------------------------
class EventRow(NamedTuple):
    """An event as stored: plain columns and its ``data`` as JSON text."""

    run_id: str
    sequence: int
    type: str
    iteration: int
    timestamp: float
    data: str


#: Event classes whose last payload field is ``parts`` (media and reasoning): an empty one
#: is left out of the stored form, and read back as ``[]`` (the field's default).
PARTS_LAST: frozenset[type[AgentEvent]] = frozenset(
    cls for cls in EVENT_CLASSES.values() if cls.PAYLOAD[-1:] == ("parts",)
)

#: The key under which an event's ``parent_run_id`` (the crew run that started its run) rides
#: in the stored ``data`` JSON: every store keeps that body already, so no column (and no
#: migration) is needed. ``$`` keeps it apart from payload fields and ``extra`` keys.
PARENT_KEY = "$parent_run_id"


def encode_event(event: AgentEvent) -> EventRow:
    """An event as stored (its fields from ``AgentEvent.to_dict``; a ``parent_run_id`` rides
    in ``data`` under :data:`PARENT_KEY`)."""
    d = event.to_dict()
    data = d["data"]
    if type(event) in PARTS_LAST and not data.get("parts"):
        data.pop("parts", None)  # a fresh dict (``AgentEvent.data``)
    if event.parent_run_id is not None:
        data = {**data, PARENT_KEY: event.parent_run_id}
    return EventRow(
        scrub_text(d["run_id"]),
        d["sequence"],
        d["type"],
        d["iteration"],
        d["timestamp"],
        encode_value(data, "{} event data", d["type"]) if data else "{}",
    )


def encode_events(events: Sequence[AgentEvent]) -> list[EventRow]:
    """``[encode_event(e) for e in events]``, the same rows, built straight from each event's
    payload tuple (``AgentEvent.ROW``) instead of its ``to_dict`` form: a step encodes a dozen
    events. An event off the common path (a parent run, a non-ASCII run id, a value
    ``to_json`` refuses, deep nesting) goes through :func:`encode_event`, which scrubs or
    refuses it exactly as before."""
    rows: list[EventRow] = []
    for ev in events:
        if ev.parent_run_id is not None or not ev.run_id.isascii():
            rows.append(encode_event(ev))
            continue
        cls = type(ev)
        values = cls.ROW(ev)
        extra = values[-1]
        text = "{}"
        if cls.PAYLOAD or extra:
            keys = cls.KEYS
            data = {keys.get(n, n): v for n, v in zip(cls.PAYLOAD, values, strict=False)}
            if cls in PARTS_LAST and not values[-2]:
                del data["parts"]
            if extra:
                data.update(extra)
            try:
                raw = to_json(data, inf_nan_mode="constants")
            except (ValueError, RecursionError):  # PydanticSerializationError too
                rows.append(encode_event(ev))
                continue
            if len(raw) >= 2 * MAX_DEPTH and raw.count(b"[") + raw.count(b"{") >= MAX_DEPTH:
                rows.append(encode_event(ev))  # maybe too deep to read back: it decides
                continue
            text = raw.decode()
        rows.append(
            EventRow(ev.run_id, ev.sequence, str(ev.type), ev.iteration, ev.timestamp, text)
        )
    return rows


def decode_event(session_id: str, row: Sequence[Any]) -> AgentEvent:
    """The event of a stored :class:`EventRow` (through ``AgentEvent.from_dict``)."""
    data = from_json(row[5])
    parent = data.pop(PARENT_KEY, None) if PARENT_KEY in data else None
    return AgentEvent.from_dict(
        {
            "type": row[2],
            "run_id": row[0],
            "session_id": session_id,
            "iteration": row[3],
            "sequence": row[1],
            "timestamp": row[4],
            "data": data,
            "parent_run_id": parent,
        }
    )


class PackedEvents(NamedTuple):
    """A commit's events, encoded with one ``to_json`` call (``MemoryStore``'s form, made by
    :func:`pack_commit`).

    ``heads`` keeps each event's envelope (class, run id, sequence, iteration, timestamp,
    parent run id: immutable); ``payloads`` is the JSON of each event's payload fields and
    ``extra``, in ``PAYLOAD`` order. Reading it back builds exactly the event
    :func:`decode_event` builds from the :class:`EventRow` of the same event.
    """

    heads: list[tuple[Any, type[AgentEvent], str, int, int, float, str | None]]
    payloads: bytes
    #: None: ``payloads`` is the list of rows; an int: it is ``payloads[at]``
    #: (:class:`PackedCommit`'s blob).
    at: int | None = None


def unpack_events(session_id: str, packed: PackedEvents, run_id: str | None) -> list[AgentEvent]:
    """The events of :func:`pack_commit` (those of ``run_id`` only, unless None)."""
    out: list[AgentEvent] = []
    values = None
    for i, (kind, cls, rid, sequence, iteration, timestamp, parent) in enumerate(packed.heads):
        if run_id is not None and rid != run_id:
            continue
        if values is None:
            values = from_json(packed.payloads)
            if packed.at is not None:
                values = values[packed.at]
        fields_, keys = cls.PAYLOAD, cls.KEYS
        row = values[i]
        if len(row) == len(fields_):  # ``parts`` left out by pack_commit: it was empty
            row = [*row[:-1], [], row[-1]]
        data = {keys.get(n, n): row[j] for j, n in enumerate(fields_)}
        data.update(row[-1])
        out.append(
            make_event(
                kind,
                rid,
                session_id,
                iteration,
                sequence,
                data,
                timestamp=timestamp,
                parent_run_id=parent,
            )
        )
    return out


class PackedCommit(NamedTuple):
    """One commit's events and ledger values, encoded with one ``to_json`` call
    (``MemoryStore``'s form; SQLite keeps each row's JSON in its own column).

    ``events`` is the commit's :class:`PackedEvents` heads (payloads in ``blob[0]``);
    ``ledger`` each entry's plain columns (run id, call id, name, status, effect, timestamp),
    its arguments in ``blob[1][i][0]`` and its result in ``blob[1][i][1]``. Reading any of it
    back parses ``blob``: what is read is what SQLite's columns read back.
    """

    events: PackedEvents | None
    ledger: list[tuple[str, str, str, LedgerStatus, Effect, float]]
    blob: bytes


def pack_commit(events: Sequence[AgentEvent], ledger: Sequence[LedgerEntry]) -> PackedCommit | None:
    """``events`` and ``ledger`` encoded at once, or None when something needs the careful
    per-row path (:func:`encode_event`, :func:`encode_ledger`: text with surrogates, a value
    without a JSON form, very deep nesting), which scrubs what it can and raises the same
    ``SerializationError`` as on SQLite."""
    heads = []
    rows = []
    for ev in events:
        if not ev.run_id.isascii() or not (ev.parent_run_id or "").isascii():
            return None
        heads.append(
            (
                ev.type,
                type(ev),
                ev.run_id,
                ev.sequence,
                ev.iteration,
                ev.timestamp,
                ev.parent_run_id,
            )
        )
        row = type(ev).ROW(ev)
        if type(ev) in PARTS_LAST and not row[-2]:  # an empty ``parts`` is not stored
            row = (*row[:-2], row[-1])
        rows.append(row)
    cols = []
    values = []
    for entry in ledger:
        if not (entry.run_id + entry.tool_call_id + entry.name).isascii():
            return None
        cols.append(
            (
                entry.run_id,
                entry.tool_call_id,
                entry.name,
                entry.status,
                entry.effect,
                entry.timestamp.timestamp(),
            )
        )
        result = entry.result
        # A model's own JSON form would make NaN null (see encode_value): its Python form.
        values.append((entry.arguments, None if result is None else result.model_dump()))
    try:
        text = to_json((rows, values), inf_nan_mode="constants")
    except (ValueError, RecursionError):  # PydanticSerializationError too
        return None
    if len(text) >= 2 * MAX_DEPTH and text.count(b"[") + text.count(b"{") >= MAX_DEPTH:
        return None  # maybe too deep to read back: let the careful path decide
    packed = PackedEvents(heads, text, 0) if heads else None
    return PackedCommit(packed, cols, text)


def unpack_ledger(session_id: str, packed: PackedCommit, index: int) -> LedgerEntry:
    """The ``index``-th ledger entry of :func:`pack_commit`."""
    run_id, call_id, name, status, effect, ts = packed.ledger[index]
    arguments, result = from_json(packed.blob)[1][index]
    return LedgerEntry(
        run_id=run_id,
        session_id=session_id,
        tool_call_id=call_id,
        name=name,
        status=status,
        arguments=arguments,
        effect=effect,
        result=ToolResult.model_validate(result) if result is not None else None,
        timestamp=datetime.fromtimestamp(ts, UTC),
    )


# -- media ----------------------------------------------------------------------------------
_REF = re.compile(r"sha256:[0-9a-f]{64}")


def check_blobs(blobs: Sequence[Blob]) -> list[Blob]:
    """``blobs`` as a store keeps them: one per reference (the first), each checked again
    before anything is written, whatever path its bytes came by (``loom.content`` checked
    the parts it built; a caller of ``put_blobs`` may not have). Raises ``MediaTooLarge``
    past :data:`loom.content.MAX_MEDIA_BYTES` and ``ContentError`` for a reference that is
    not ``"sha256:"`` and the hex digest of the bytes (content addressing would otherwise
    hand one session's bytes to another's reference)."""
    out: dict[str, Blob] = {}
    for blob in blobs:
        if blob.ref in out:
            continue
        size = len(blob.data)
        if size > MAX_MEDIA_BYTES:
            raise MediaTooLarge(
                f"media {blob.ref[:19]}… ({blob.media_type}) is {size:,} bytes, over the "
                f"{MAX_MEDIA_BYTES:,}-byte limit a store keeps: send a smaller file "
                "(downscale the image, split the document) or a URL",
                size=size,
                limit=MAX_MEDIA_BYTES,
                part=blob.ref,
            )
        if not _REF.fullmatch(blob.ref) or media_ref(blob.data) != blob.ref:
            raise ContentError(
                f"media reference {blob.ref[:80]!r} is not the sha256 of its {size:,} bytes; "
                "store bytes under loom.content.media_ref(data)",
                part=blob.ref,
            )
        out[blob.ref] = blob
    return list(out.values())


# -- ledger -----------------------------------------------------------------------------------
class LedgerRow(NamedTuple):
    """A ledger entry as stored: plain columns, arguments and result as JSON text."""

    run_id: str
    tool_call_id: str
    name: str
    status: str
    effect: str
    arguments: str
    result: str | None
    timestamp: float


def encode_ledger(entry: LedgerEntry) -> LedgerRow:
    """A ``LedgerEntry`` as stored; its ``ToolResult`` goes through :func:`encode_value`."""
    return LedgerRow(
        scrub_text(entry.run_id),
        scrub_text(entry.tool_call_id),
        scrub_text(entry.name),
        entry.status,
        entry.effect,
        encode_value(entry.arguments, "arguments of tool call {!r}", entry.name),
        encode_value(entry.result, "result of tool call {!r}", entry.name)
        if entry.result is not None
        else None,
        entry.timestamp.timestamp(),
    )


def decode_ledger(session_id: str, row: Sequence[Any]) -> LedgerEntry:
    """The ``LedgerEntry`` of a stored :class:`LedgerRow`."""
    return LedgerEntry(
        run_id=row[0],
        session_id=session_id,
        tool_call_id=row[1],
        name=row[2],
        status=row[3],
        arguments=from_json(row[5]),
        effect=row[4],
        result=ToolResult.model_validate_json(row[6]) if row[6] is not None else None,
        timestamp=datetime.fromtimestamp(row[7], UTC),
    )


# -- run records ------------------------------------------------------------------------------
class RunRow(NamedTuple):
    """A run record as stored: plain columns and its ``data`` as JSON text."""

    run_id: str
    status: str
    input_tokens: int
    output_tokens: int
    requests: int
    timestamp: float
    data: str


def encode_run(run: RunRecord) -> RunRow:
    """A ``RunRecord`` as stored."""
    return RunRow(
        scrub_text(run.run_id),
        scrub_text(run.status),
        run.usage.input_tokens,
        run.usage.output_tokens,
        run.usage.requests,
        run.timestamp.timestamp(),
        encode_value(run.data, "data of run record {!r}", run.status) if run.data else "{}",
    )


def decode_run(session_id: str, row: Sequence[Any]) -> RunRecord:
    """The ``RunRecord`` of a stored :class:`RunRow`."""
    return RunRecord(
        run_id=row[0],
        session_id=session_id,
        status=row[1],
        usage=Usage(input_tokens=row[2], output_tokens=row[3], requests=row[4]),
        timestamp=datetime.fromtimestamp(row[5], UTC),
        data=from_json(row[6]),
    )


# -- rows both SQL stores read the same way (columns in these orders) ----------------------------

ERROR_COLS = "id, timestamp, session_id, run_id, tool_call_id, tool_name, raw_error, short_summary"


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def decode_session(row: Sequence[Any]) -> SessionInfo:
    """A session row: id, agent_name, created_at, updated_at, message count, input tokens,
    output tokens, requests, metadata, and (when selected) how many rewinds it had."""
    return SessionInfo(
        id=row[0],
        agent_name=row[1],
        created_at=_at(row[2]),
        updated_at=_at(row[3]),
        message_count=int(row[4]),
        usage=Usage(input_tokens=row[5], output_tokens=row[6], requests=row[7]),
        metadata=decode_value(row[8]),
        branches=int(row[9]) if len(row) > 9 else 0,
    )


def decode_error(row: Sequence[Any]) -> StoredError:
    """An error row in ``ERROR_COLS`` order."""
    return StoredError(
        id=row[0],
        timestamp=_at(row[1]),
        session_id=row[2],
        run_id=row[3],
        tool_call_id=row[4],
        tool_name=row[5],
        raw_error=decode_value(row[6]),
        short_summary=row[7],
    )


# Event types a partial index of both SQL stores covers (``events_approvals``): looked up at
# INTAKE (remembered permission decisions, parked calls) without reading the whole journal.
INDEXED_EVENT_TYPES = ("approval_required", "approval_decision")
INDEXED_CLAUSE = "type IN ('approval_required', 'approval_decision')"


def event_types_clause(types: Sequence[Any]) -> str:
    """The SQL condition for events of ``types`` (``EventType`` members or their values).

    The values are inlined, not bound: a planner uses a partial index only when the query's
    condition visibly implies the index's (SQLite needs the index's term verbatim), which a
    bound parameter never does. Each value is checked to be an ``EventType``'s, so only
    those fixed identifiers reach the SQL."""
    values = sorted({EventType(t).value for t in types})
    if not values:
        return "false"
    wanted = "type IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    if set(values) <= set(INDEXED_EVENT_TYPES):
        return f"{INDEXED_CLAUSE} AND {wanted}"
    return wanted


# -- forks: which session's rows a read takes, position by position ---------------------------
#: How many forks deep a chain of forks may go (a fork of a fork of ...): a guard against a
#: cycle in hand-edited rows, far above what a user makes.
MAX_FORK_DEPTH = 1000


class Segment(NamedTuple):
    """One session's rows a forked session's read takes: positions ``lo`` <= seq < ``hi``
    (``hi`` None: no bound) of ``session_id``'s own rows."""

    session_id: str
    lo: int
    hi: int | None


def segments(chain: Sequence[tuple[str, int]]) -> list[Segment]:
    """The segments of a session, oldest first, from its ``chain`` (the session, its parent,
    ..., the root; each with how many positions it shares with its parent, 0 for the root).

    A fork stores its own rows at their absolute positions (from its share on), so its view is
    its ancestors' rows below the share, each ancestor bounded by the smallest share of the
    sessions below it, then its own rows: no row is copied."""
    out: list[Segment] = []
    limit: int | None = None
    for session_id, shared in chain:
        out.append(Segment(session_id, shared, limit))
        limit = shared if limit is None else min(limit, shared)
    return out[::-1]


def clip(segment: Segment, start: int, stop: int | None) -> tuple[int, int | None] | None:
    """``segment``'s positions within ``start`` <= seq < ``stop``, or None when none are."""
    lo = max(segment.lo, start)
    bounds = [b for b in (segment.hi, stop) if b is not None]
    hi = min(bounds) if bounds else None
    return None if hi is not None and lo >= hi else (lo, hi)
