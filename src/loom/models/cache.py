"""Prompt caching: where the stable prefix of a context ends, and when it broke.

Loom's context is ordered so that what changes least comes first (ROM and the tool schemas,
MEMORY.md and the Kernel, the L2 summaries, then the conversation), so consecutive requests of
a session share a long prefix that providers can cache. The context builder says where that
prefix's segments end as data, ``AssembledContext.cache_points`` (indices into its messages);
the loop copies them into ``ModelSettings.cache_points`` with a stable per-session
``cache_key`` (:func:`cache_settings`), and each provider uses what it has: Anthropic a
``cache_control`` breakpoint per point (at most :data:`MAX_BREAKPOINTS`), OpenAI the
``prompt_cache_key``; the embedded model reuses its KV cache for the common prefix on its own.

:class:`PrefixTracker` remembers, per session, the last request's messages (bounded, in
memory) and compares the next one against it: how much of the previous request it repeats,
the cache points for it (the end of the ROM, of the Kernel, of the part of the history the
previous request also sent, and the last message, which the next request will repeat), and
whether the previous prefix broke, where, and for which reason Loom knows (compaction,
masking, truncation, a memory flush, another model, other tools). A break with no such reason
is a *bust*: the builder reports it as a ``CACHE_BUST`` event with ``expected=False``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import is_
from urllib.parse import urlsplit

from loom.messages import Message, ToolSpec
from loom.models.base import ModelSettings

__all__ = [
    "MAX_BREAKPOINTS",
    "CacheCheck",
    "PrefixTracker",
    "Segments",
    "cache_settings",
    "openai_cache_fields",
    "session_cache_key",
    "tools_digest",
]

MAX_BREAKPOINTS = 4
"""Anthropic accepts at most four ``cache_control`` breakpoints per request."""

KNOWN_REASONS = (
    "compaction",
    "masking",
    "truncation",
    "memory_flush",
    "model_changed",
    "tools_changed",
)
"""Why Loom itself may change a prefix it sent before; any other change is a bust."""


@lru_cache(maxsize=1024)  # asked for on every model call of a session
def session_cache_key(agent: str, session_id: str) -> str:
    """A stable, opaque cache key for ``agent``'s requests in ``session_id`` (OpenAI's
    ``prompt_cache_key``): a digest, so no session id leaves the process."""
    digest = hashlib.sha256(f"{agent}\x00{session_id}".encode()).hexdigest()[:24]
    return f"loom-{digest}"


def cache_settings(
    settings: ModelSettings | None, points: Sequence[int], key: str
) -> ModelSettings | None:
    """``settings`` for one call with the context's cache ``points`` and the session's ``key``
    (a ``cache_key`` already set wins). Unchanged when prompt caching is off for the agent."""
    if settings is None:  # the usual case: built directly (``replace`` walks every field)
        return ModelSettings(cache_points=tuple(points), cache_key=key)
    if not settings.prompt_cache:
        return settings
    return replace(settings, cache_points=tuple(points), cache_key=settings.cache_key or key)


OPENAI_HOST = "api.openai.com"


def openai_cache_fields(body: dict[str, object], s: ModelSettings, base_url: str) -> None:
    """Add ``prompt_cache_key`` and ``prompt_cache_retention`` to an OpenAI request ``body``
    from ``s``: only for OpenAI's own API (``base_url`` on api.openai.com), as many
    OpenAI-compatible servers refuse fields they do not know (``ModelSettings.extra`` can
    send them to one that takes them)."""
    if not s.prompt_cache or urlsplit(base_url).hostname != OPENAI_HOST:
        return
    if s.cache_key:
        body["prompt_cache_key"] = s.cache_key
    if s.cache_retention:
        body["prompt_cache_retention"] = s.cache_retention


def tools_digest(tools: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    """What identifies a tool list for the cache: the specs themselves (compared, not hashed:
    they are usually the same objects from one request to the next, which compares in one
    step)."""
    return tuple(tools)


@dataclass(frozen=True, slots=True)
class Segments:
    """Where the tiers of one assembled context end (indices into its messages; ``None``
    when a tier is absent). ``history`` is the index of the first conversation message."""

    rom: int | None
    kernel: int | None
    summaries: int | None
    history: int

    def name_of(self, index: int) -> str:
        """The tier message ``index`` belongs to."""
        if self.rom is not None and index <= self.rom:
            return "system"
        if self.kernel is not None and index <= self.kernel:
            return "kernel"
        if index < self.history:
            return "summaries"
        return "history"


@dataclass(frozen=True, slots=True)
class CacheCheck:
    """What :meth:`PrefixTracker.observe` found for one request.

    ``points``: the cache points to send. ``shared``: how many leading messages it repeats
    from the previous request. ``broke_at`` / ``segment``: the first message of the previous
    request it did not repeat, and that message's tier (None when the previous request is a
    prefix of this one, or there was none). ``reason``: the known reason for the break, or
    None (a bust)."""

    points: tuple[int, ...]
    shared: int
    previous: int
    broke_at: int | None = None
    segment: str | None = None
    reason: str | None = None

    @property
    def broke(self) -> bool:
        return self.broke_at is not None

    @property
    def bust(self) -> bool:
        """The prefix broke for no reason Loom knows."""
        return self.broke_at is not None and self.reason is None


@dataclass(slots=True)
class _Last:
    model: str
    tools: tuple[ToolSpec, ...]
    messages: list[Message]
    segments: Segments
    reasons: Mapping[str, str]


def _same(a: Message, b: Message) -> bool:
    if a is b:
        return True
    return (
        a.role == b.role
        and a.content == b.content
        and a.tool_call_id == b.tool_call_id
        and a.name == b.name
        and a.tool_calls == b.tool_calls
        and a.parts == b.parts
    )


class PrefixTracker:
    """The last request per session (at most ``max_sessions``, least recent dropped), to place
    the next one's cache points and tell when its prefix broke."""

    def __init__(self, max_sessions: int = 256) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[object, _Last] = OrderedDict()
        self.busts = 0
        """Breaks with no known reason, since this tracker was made (a metric)."""
        self.breaks = 0
        """Breaks with a known reason."""
        self.shared = 0
        """How many leading messages the last observed request repeated from its previous
        one (what :meth:`points_or_break` found)."""

    def forget(self, key: object) -> None:
        """Drop what is kept for ``key`` (its next request starts a new prefix)."""
        self._last.pop(key, None)

    def observe(
        self,
        key: object,
        *,
        model: str,
        tools: tuple[ToolSpec, ...],
        messages: Sequence[Message],
        segments: Segments,
        reasons: Mapping[str, str] | None = None,
    ) -> CacheCheck:
        """Compare ``messages`` (this request) with the last request of ``key``, remember
        them, and return the cache points and what broke. ``reasons``: per tier (a
        :meth:`Segments.name_of` name), what this build did there that may change messages
        the previous request sent (see :data:`KNOWN_REASONS`); the previous request's reasons
        explain a break too (what it cut to fit is sent whole again)."""
        found = self.points_or_break(key, model, tools, messages, segments, reasons)
        if isinstance(found, CacheCheck):
            return found
        shared = self.shared
        return CacheCheck(found, shared, shared)

    def points_or_break(
        self,
        key: object,
        model: str,
        tools: tuple[ToolSpec, ...],
        messages: Sequence[Message],
        segments: Segments,
        reasons: Mapping[str, str] | None = None,
    ) -> tuple[int, ...] | CacheCheck:
        """:meth:`observe` for the usual request, which repeats the previous one whole: just
        its cache points (and :attr:`shared` set to how many messages it repeats), with no
        :class:`CacheCheck` built; a :class:`CacheCheck` when the previous prefix broke."""
        last = self._last.get(key)
        self._last[key] = _Last(model, tools, list(messages), segments, dict(reasons or {}))
        self._last.move_to_end(key)
        if len(self._last) > self.max_sessions:
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)
        n = len(messages)
        if last is None:
            self.shared = 0
            return self._points(segments, None, n)
        prev = last.messages
        whole = (
            "tools_changed"
            if last.tools != tools
            else ("model_changed" if last.model != model else None)
        )
        if whole is not None:
            shared = 0  # a cache is per model, and the tool schemas come first in it
        else:
            limit = min(len(prev), n)
            if all(map(is_, prev, messages)):  # usually the very same objects: one C pass
                shared = limit
            else:
                shared = 0
                while shared < limit:
                    a, b = prev[shared], messages[shared]
                    if a is not b and not _same(a, b):
                        break
                    shared += 1
        points = self._points(segments, shared - 1 if shared > 0 else None, n)
        if shared >= len(prev):
            self.shared = shared
            return points
        segment = segments.name_of(shared)
        # what this build did there, or what the previous one did (a tier it cut to fit
        # comes back whole when there is room again)
        reason = (
            whole
            or (reasons or {}).get(segment)
            or last.reasons.get(segment)
            or last.reasons.get(last.segments.name_of(shared))
        )
        if reason is None:
            self.busts += 1
        else:
            self.breaks += 1
        return CacheCheck(points, shared, len(prev), shared, segment, reason)

    @staticmethod
    def _points(segments: Segments, stable: int | None, n: int) -> tuple[int, ...]:
        """At most four: the ROM's end, the Kernel's end, the end of what the previous request
        also sent, the last message (the next request repeats it); the summaries' end when
        there is room."""
        rom, kernel, summaries = segments.rom, segments.kernel, segments.summaries
        memo = (rom, kernel, summaries, stable, n)
        hit = _POINTS.get(memo)
        if hit is not None:
            return hit
        chosen: list[int] = []
        for p in (rom, kernel, stable, n - 1 if n else None, summaries):
            if p is not None and 0 <= p < n and p not in chosen:
                chosen.append(p)
        points = tuple(sorted(chosen[:MAX_BREAKPOINTS]))
        if len(_POINTS) >= 4096:  # a few shapes per conversation length: bounded all the same
            _POINTS.clear()
        _POINTS[memo] = points
        return points


# the points of one layout (tier ends, the stable end, the length): a pure function, asked for
# on every request
_POINTS: dict[tuple[int | None, ...], tuple[int, ...]] = {}
