"""Loop detection: a run that repeats itself stops (``stop_reason="loop"``) in seconds.

Two rules, checked before every model call of a run, on the committed transcript of the
*exchange* (everything after the last message a user sent; a judge's or an output check's
correction, a server query's answer and this module's own warning do not start a new one):

- **repeated call**: one tool, called with the same canonical arguments (JSON with sorted keys
  and normalised numbers: ``1.0`` is ``1``, key order does not matter) ``max_repeats`` times
  among the exchange's last ``window`` tool calls;
- **repeated answer**: the model gave the same answer (its text and its tool calls, canonical,
  call ids aside) ``same_answer`` times in a row.

The run then ends with ``stop_reason="loop"`` and an error naming the tool and its arguments
(or the answer) and the count; the answer that made the count was committed and its calls ran,
but the model is not asked again. One step short of a stop, the model is warned once per
repeated call or answer: a system note committed to the transcript (a ``MEMORY_RECORD`` whose
message has ``metadata["loop_warning"]``) tells it what it repeats and to change approach.

The detector is rebuilt from the transcript whenever the transcript is not the one it folded
(a new run, a resumed or carried-on one, a branch): its counts are the journal's, so a run
resumed in the middle of a loop (after a crash, an approval or a cut) does not get
``max_repeats`` more calls. Defaults (``LoopDetection()``): 6 identical calls in the last 20, 6
identical answers in a row; ``docs/agents.md`` ("Loop detection") says why.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import AgentDefinitionError
from loom.messages import Message, ToolCall

__all__ = [
    "LOOP_WARNING",
    "Loop",
    "LoopDetection",
    "LoopDetector",
    "LoopWarning",
    "canonical_arguments",
    "loop_detection_of",
]

LOOP_WARNING = "loop_warning"
"""The metadata key of a loop warning's message (its value names what was repeated)."""

# user-role messages that carry on the exchange rather than start a new one
_CARRY_ON = ("judge_correction", "output_correction", "server_query", LOOP_WARNING)
_SHOWN = 200  # characters of arguments or answer quoted in a warning or a stop


def _positive_count(name: str, value: Any, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise AgentDefinitionError(
            f"must be an integer >= {least} (or null to turn the rule off), got {value!r}",
            field=f"loop_detection.{name}",
        )
    return value


@dataclass(frozen=True, slots=True)
class LoopDetection:
    """An agent's loop detection (``Agent(loop_detection=...)``; see the module docstring).

    Args:
        max_repeats: Identical calls (tool + canonical arguments) among the last ``window``
            calls of the exchange that stop the run; None turns the rule off. At least 2.
        window: How many of the exchange's latest tool calls ``max_repeats`` looks at; at least
            ``max_repeats``.
        same_answer: Identical answers in a row (text + tool calls) that stop the run; None
            turns the rule off. At least 2.
        warn: Warn the model once, one step before a stop, with a system note.
    """

    max_repeats: int | None = 6
    window: int = 20
    same_answer: int | None = 6
    warn: bool = True

    def __post_init__(self) -> None:
        _positive_count("max_repeats", self.max_repeats, 2)
        _positive_count("same_answer", self.same_answer, 2)
        window = _positive_count("window", self.window, 1)
        if window is None:
            raise AgentDefinitionError(
                "must be an integer, got None", field="loop_detection.window"
            )
        if self.max_repeats is not None and window < self.max_repeats:
            raise AgentDefinitionError(
                f"must be at least max_repeats={self.max_repeats} (a window of {window} calls "
                f"can never hold that many repeats), got {window}",
                field="loop_detection.window",
            )
        if not isinstance(self.warn, bool):
            raise AgentDefinitionError(
                f"must be true or false, got {self.warn!r}", field="loop_detection.warn"
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings as a mapping (what an agent file's ``loop_detection:`` holds)."""
        return {
            "max_repeats": self.max_repeats,
            "window": self.window,
            "same_answer": self.same_answer,
            "warn": self.warn,
        }


def loop_detection_of(value: Any) -> LoopDetection | None:
    """``Agent(loop_detection=...)`` checked: ``True`` (the default) means ``LoopDetection()``,
    ``False`` or None turn detection off, a mapping gives some settings (the rest default)."""
    if value is True:
        return LoopDetection()
    if value is False or value is None:
        return None
    if isinstance(value, LoopDetection):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in LoopDetection.__dataclass_fields__)
        if unknown:
            raise AgentDefinitionError(
                f"unknown setting {unknown[0]!r}; the settings are max_repeats, window, "
                "same_answer and warn",
                field="loop_detection",
            )
        return LoopDetection(**{str(k): v for k, v in value.items()})
    raise AgentDefinitionError(
        "must be true, false, a loom.loop_detection.LoopDetection or a mapping of "
        f"max_repeats / window / same_answer / warn, got {type(value).__name__}",
        field="loop_detection",
    )


# one encoder: ``json.dumps`` with options builds a new one on every call
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# ``_CANONICAL.encode`` builds a C encoder on every call too (about half its cost on a small
# mapping): this is the same one, built once. It keeps no circular-reference markers (a
# shared markers dict is left dirty by a failed encoding); a circular value recurses until
# RecursionError, and the fallback below then raises what ``_CANONICAL.encode`` raises.
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_FAST_CANONICAL: Any = (
    _make_encoder(
        None,
        _CANONICAL.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        True,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    if _make_encoder is not None
    else None
)


def _encode(value: Any) -> str:
    """``_CANONICAL.encode(value)`` for a mapping, through the encoder built once."""
    if _FAST_CANONICAL is None:
        return _CANONICAL.encode(value)
    try:
        return "".join(_FAST_CANONICAL(value, 0))
    except RecursionError:  # circular (or nested too deep): what the full encoder says
        return _CANONICAL.encode(value)


def _normal(value: Any) -> Any:
    """``value`` with numbers normalised (an integral float is an int) and mappings' keys as
    strings, so that equal arguments have one JSON text."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return str(value)


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """Canonical JSON of a call's arguments: sorted keys, no spaces, normalised numbers."""
    try:
        text = _encode(arguments)  # sorts nested keys too
    except TypeError:  # a key that is not a string, or a value JSON has no form for
        return _CANONICAL.encode(_normal(arguments))
    # an integral float is written "1.0" or "1e+16": only then (or when a string merely
    # looks like one) is there anything to normalise
    if ".0" in text or "e+" in text:
        return _CANONICAL.encode(_normal(arguments))
    return text


def _call_key(call: ToolCall) -> tuple[str, str]:
    args: str | None = None
    if _FAST_CANONICAL is not None:  # canonical_arguments' usual case, inline (every call)
        try:
            args = "".join(_FAST_CANONICAL(call.arguments, 0))
        except (TypeError, RecursionError):
            args = None
    if args is None or ".0" in args or "e+" in args:
        args = canonical_arguments(call.arguments)
    if args == "{}" and call.raw_arguments:  # arguments that did not parse: their text
        args = call.raw_arguments.strip()
    return call.name, args


def _answer_key(m: Message, calls: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
    return (m.content.strip(), calls)


def _digest(text: str) -> str:
    """A short stable name for a repeated call or answer (a warning's metadata holds it)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shorten(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


@dataclass(frozen=True, slots=True)
class Loop:
    """The run repeats itself: it stops with ``stop_reason="loop"`` and ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class LoopWarning:
    """One step short of a stop: ``note`` goes to the model, once per ``key``."""

    key: str
    note: str


@dataclass(slots=True)
class LoopDetector:
    """The two rules' counts for one run, folded from its session's transcript.

    ``check(history)`` folds the messages added since the last check (or rebuilds from the
    exchange when ``history`` is not the transcript it folded) and says whether the run must
    stop, may go on after a warning, or may just go on (None)."""

    config: LoopDetection
    _history: Sequence[Message] | None = None
    _seen: int = 0
    _calls: deque[tuple[str, str]] = field(default_factory=deque)
    _counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _last_answer: tuple[Any, ...] | None = None
    _last_message: Message | None = None
    _run: int = 0
    _tail: Message | None = None  # the last message folded: a rewritten transcript differs
    _warned: set[str] = field(default_factory=set)
    # the calls folded since the last check: only their counts can have grown
    _fresh: list[tuple[str, str]] = field(default_factory=list)

    def check(self, history: Sequence[Message]) -> Loop | LoopWarning | None:
        """Stop, warn or go on, given the session's committed transcript."""
        self._fold(history)
        c = self.config
        top: tuple[str, str] | None = None
        count = 0
        if self._fresh:
            counts = self._counts
            for fresh in self._fresh:
                n = counts.get(fresh, 0)
                if n > count:
                    top, count = fresh, n
            self._fresh.clear()
        if c.max_repeats is not None and top is not None:
            name, args = top
            if count >= c.max_repeats:
                return Loop(
                    f"the model called {name} with the same arguments {_shorten(args)} "
                    f"{count} times in its last {len(self._calls)} tool calls "
                    f"(loop_detection.max_repeats={c.max_repeats}, window={c.window})"
                )
        if c.same_answer is not None and self._run >= c.same_answer:
            assert self._last_message is not None
            return Loop(
                f"the model gave the same answer {self._run} times in a row "
                f"(loop_detection.same_answer={c.same_answer}): {self._describe()}"
            )
        if not c.warn:
            return None
        if c.max_repeats is not None and top is not None:
            name, args = top
            key = f"call:{name}:{_digest(args)}" if count == c.max_repeats - 1 else ""
            if key and key not in self._warned:
                return LoopWarning(
                    key,
                    f"Loop warning: you have called {name} with the same arguments "
                    f"{_shorten(args)} {count} times. Calling it again the same way will stop "
                    "this run; change your approach (other arguments, another tool, or an "
                    "answer with what you have).",
                )
        if c.same_answer is not None and self._run == c.same_answer - 1 and self._run > 1:
            key = f"answer:{_digest(repr(self._last_answer))}"
            if key not in self._warned:
                return LoopWarning(
                    key,
                    f"Loop warning: you have given the same answer {self._run} times in a row "
                    f"({self._describe()}). Giving it again will stop this run; change your "
                    "approach.",
                )
        return None

    def _describe(self) -> str:
        m = self._last_message
        assert m is not None
        if m.tool_calls:
            calls = ", ".join(f"{n}({a})" for n, a in map(_call_key, m.tool_calls))
            text = f"{m.content.strip()!r} with " if m.content.strip() else ""
            return _shorten(f"{text}calls {calls}")
        return _shorten(repr(m.content.strip()))

    def _fold(self, history: Sequence[Message]) -> None:
        seen = self._seen
        if (
            history is not self._history
            or len(history) < seen
            or (seen and history[seen - 1] is not self._tail)
        ):  # another transcript, or this one rewritten: count it again
            self._reset(history)
        for m in history[self._seen :]:
            self._add(m)
        self._seen = len(history)
        self._tail = history[-1] if history else None

    def _reset(self, history: Sequence[Message]) -> None:
        self._history, self._seen = history, len(history)
        self._calls.clear()
        self._counts.clear()
        self._last_answer, self._last_message, self._run = None, None, 0
        self._warned.clear()
        self._fresh.clear()
        start = 0
        for i in range(len(history) - 1, -1, -1):
            m = history[i]
            if m.role == "user" and not any(k in m.metadata for k in _CARRY_ON):
                start = i + 1
                break
        for m in history[start:]:
            self._add(m)

    def _add(self, m: Message) -> None:
        role = m.role
        if role != "assistant":
            if role == "user" and not any(k in m.metadata for k in _CARRY_ON):
                self._reset_counts()  # a new exchange (a message sent while the detector ran)
            elif role == "system" and isinstance(warned := m.metadata.get(LOOP_WARNING), str):
                self._warned.add(warned)
            return
        calls = m.tool_calls
        keys: tuple[tuple[str, str], ...] = ()
        if calls:
            window = self.config.window
            keys = tuple([_call_key(c) for c in calls])
            counts, recent = self._counts, self._calls
            for key in keys:
                self._fresh.append(key)
                recent.append(key)
                counts[key] = counts.get(key, 0) + 1
                if len(recent) > window:
                    old = recent.popleft()
                    left = counts[old] - 1
                    if left:
                        counts[old] = left
                    else:
                        del counts[old]
        answer = _answer_key(m, keys)
        self._run = self._run + 1 if answer == self._last_answer else 1
        self._last_answer, self._last_message = answer, m

    def _reset_counts(self) -> None:
        self._fresh.clear()
        self._calls.clear()
        self._counts.clear()
        self._last_answer, self._last_message, self._run = None, None, 0
        self._warned.clear()
