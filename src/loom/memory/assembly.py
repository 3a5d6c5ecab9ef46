"""Priority context assembly (seed 002) over the memory tiers.

Components, in seed 002's order of admission (non-truncatable first, then truncatable ones by
priority), and where they land in the message list:

| component        | priority     | truncatable                | sent as                        |
| ---------------- | ------------ | -------------------------- | ------------------------------ |
| ``system``       | CRITICAL 100 | no (a configuration error) | first system message (ROM)     |
| ``tools``        | CRITICAL 100 | no                         | the tool schemas (ROM)         |
| ``current_turn`` | CRITICAL 100 | content only, with marker  | latest user message + newest unit |
| ``patterns``     | HIGH 90      | yes, to the ROM budget     | inside the ROM system message  |
| ``kernel``       | HIGH 90      | yes                        | system message after MEMORY.md |
| ``memory_file``  | MEDIUM 70    | yes                        | system message after ROM       |
| ``summaries``    | MEDIUM 70    | yes                        | system message before history  |
| ``history``      | LOW 50       | by whole units, oldest first | the conversation             |
| masked outputs   | OPTIONAL 30  | replaced by a placeholder  | inside ``history``             |
| older media      | OPTIONAL 30  | replaced by a placeholder  | inside ``history``             |

When the context must shrink, older media (images, files and audio before the current turn)
are replaced by a placeholder line first (``loom.memory.trim.without_media``), before tool
outputs are masked and before any text is summarised or dropped; the latest user message's
media always stay. A part is never cut: it is sent whole or replaced whole. When the current
turn itself does not fit, its tool results' media are replaced before its text is cut.

Every decision becomes a CONTEXT_COMPONENT_INCLUDED / TRUNCATED / EXCLUDED note. All arithmetic
is in the counter's raw tokens against ``budget = floor(total / scale)``, so the scaled total of
what is sent never exceeds the budget.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loom.errors import ContextTooLong
from loom.events import EventType
from loom.memory.config import Budgets, MemoryConfig, Priority
from loom.memory.segments import SessionIndex, Summary
from loom.memory.tokens import MessageCounter
from loom.memory.trim import (
    has_media,
    mask_placeholder,
    shrink_message,
    truncate_text,
    without_media,
)
from loom.messages import Message

if TYPE_CHECKING:
    from loom.memory.recall import RecalledMemory

__all__ = ["PRIMING", "RECALL_HEADER", "KernelPick", "Measure", "Part", "Plan", "truncate_text"]

E = EventType
PRIMING = 3  # tokens every request spends priming the reply
ComponentNote = tuple[EventType, dict[str, Any]]
_MIN_PART = 16


@dataclass(slots=True)
class Part:
    message: Message
    raw: int


RECALL_HEADER = "Recalled from earlier sessions (saved memories; they may be out of date):"


@dataclass(frozen=True, slots=True)
class KernelPick:
    """The Kernel message with the recalled memories that fit: ``keys`` (in rank order),
    taking ``tokens``; ``wanted``: the raw tokens all of them would take."""

    part: Part | None
    keys: tuple[str, ...] = ()
    tokens: int = 0
    wanted: int = 0

    @property
    def kept(self) -> int:
        """How many recalled memories the Kernel holds."""
        return len(self.keys)


@dataclass(slots=True)
class Measure:
    """The size of the context if everything pending were sent (tiers capped)."""

    index: SessionIndex
    first: int  # first pending unit
    start: int  # its conversation position
    tail_start: int  # conversation position of the newest unit
    pinned: int | None  # the latest user message when it is older than the newest unit
    masks: dict[int, Part]
    l1: int  # pending conversation, masks applied (pinned included when L2 covers it)
    memory_file: int
    kernel: int
    l2: int
    summaries: list[Summary]
    total: int
    over_threshold: bool
    masked: bool = False
    stripped: bool = False  # older media replaced by placeholders
    savings: dict[int, int] = field(default_factory=dict)
    _units: list[tuple[int, int]] | None = None

    @property
    def units(self) -> list[tuple[int, int]]:
        """Pending units as conversation ranges (built only when a slow path needs them)."""
        if self._units is None:
            self._units = self.index.units(self.first)
        return self._units


class Plan:
    """One build's view of the tiers, budgets and caches."""

    # slots: the builder keeps one plan per session between builds (see SegmentedContextBuilder)
    __slots__ = (
        "budget",
        "budgets",
        "cfg",
        "counter",
        "extra_system",
        "fixed",
        "index",
        "instructions",
        "kernel_cap",
        "l1_cap",
        "l2_cap",
        "memory_cap",
        "memory_text",
        "recall",
        "recall_cap",
        "rom",
        "rom_cap",
        "rom_decisions",
        "scale",
        "summary_words",
        "tools_raw",
    )

    def __init__(
        self,
        counter: MessageCounter,
        budgets: Budgets,
        index: SessionIndex,
        config: MemoryConfig,
        extra_system: Sequence[str],
        instructions: str,
        tools_raw: int,
        memory_text: str,
    ) -> None:
        self.counter, self.budgets, self.index, self.cfg = counter, budgets, index, config
        self.scale = scale = counter.scale
        self.instructions, self.extra_system = instructions, tuple(extra_system)
        self.budget = math.floor(budgets.total / scale)

        def cap(tokens: int) -> int:
            return math.floor(tokens / scale)

        self.rom_cap, self.kernel_cap = cap(budgets.rom), cap(budgets.kernel)
        self.l2_cap, self.memory_cap = cap(budgets.l2), cap(budgets.memory_file)
        self.l1_cap = cap(budgets.l1) if config.l1_tokens is not None else None
        self.summary_words = max(40, int(self.l2_cap * 0.35))
        recall = config.recall
        own = recall.max_tokens if recall is not None else None
        self.recall_cap = cap(own) if own is not None else self.kernel_cap // 2
        self.recall: tuple[RecalledMemory, ...] = ()  # this turn's, set by every build
        self.tools_raw = tools_raw
        self.memory_text = memory_text
        self.rom_decisions: list[ComponentNote] = []
        self.rom = self._rom(instructions, [s for s in extra_system if s])
        self.fixed = (self.rom.raw if self.rom else 0) + tools_raw + PRIMING

    def made_from(
        self,
        counter: MessageCounter,
        budgets: Budgets,
        config: MemoryConfig,
        extra_system: Sequence[str],
        instructions: str,
        tools_raw: int,
    ) -> bool:
        """True when this plan was built from these inputs, so a later build may reuse it
        (only ``memory_text`` is read at use time; the rest is fixed at construction)."""
        return (
            counter is self.counter
            and counter.scale == self.scale
            and budgets is self.budgets
            and config is self.cfg
            and tools_raw == self.tools_raw
            and instructions == self.instructions
            and tuple(extra_system) == self.extra_system
        )

    # -- cached parts ----------------------------------------------------------------------------
    def _cached(self, key: Any, make: Any) -> Any:
        d = self.index.derived
        hit = d.get(key)
        if hit is None:
            hit = d[key] = make()
            if len(d) > 4096:  # old masks of long sessions; cheap to remake
                d.clear()
                d[key] = hit
        return hit

    def _part(self, text: str) -> Part:
        msg = Message.system(text)
        return Part(msg, self.counter.message(msg))

    def _rom(self, instructions: str, patterns: list[str]) -> Part | None:
        key = ("rom", instructions, tuple(patterns), self.rom_cap)
        hit: tuple[Part | None, list[ComponentNote]] = self._cached(
            key, lambda: self._make_rom(instructions, patterns)
        )
        self.rom_decisions = hit[1]
        return hit[0]

    def _make_rom(
        self, instructions: str, patterns: list[str]
    ) -> tuple[Part | None, list[ComponentNote]]:
        decisions: list[ComponentNote] = []
        text = instructions
        if patterns:
            joined = "\n\n".join(patterns)
            base = self.counter.text(instructions) + 2 if instructions else 0
            full = self.counter.text(joined)
            room = self.rom_cap - base
            kept = truncate_text(self.counter, joined, room) if room >= _MIN_PART else None
            if kept is None:
                decisions.append(
                    _note(
                        E.CONTEXT_COMPONENT_EXCLUDED,
                        "patterns",
                        Priority.HIGH,
                        full,
                        reason="over the ROM budget",
                    )
                )
            else:
                kind = (
                    E.CONTEXT_COMPONENT_INCLUDED
                    if kept == joined
                    else (E.CONTEXT_COMPONENT_TRUNCATED)
                )
                decisions.append(
                    _note(
                        kind,
                        "patterns",
                        Priority.HIGH,
                        self.counter.text(kept),
                        original_tokens=full,
                    )
                )
                text = f"{instructions}\n\n{kept}" if instructions else kept
        return (self._part(text) if text else None), decisions

    def memory_part(self) -> Part | None:
        if not self.memory_text:
            return None
        part: Part = self._cached(
            ("memory", self.memory_text),
            lambda: self._part(f"Lasting notes from MEMORY.md:\n{self.memory_text}"),
        )
        return part

    def kernel_part(self, room: int | None = None) -> Part | None:
        """The Kernel's system message: the session's facts, then the recalled memories that
        fit whole in the recall budget and in ``room`` (default the Kernel's budget)."""
        if not self.recall:  # the usual case: no pick to make
            return self.facts_part()
        return self.kernel_pick(room).part

    def kernel_pick(self, room: int | None = None) -> KernelPick:
        """The Kernel with as many recalled memories as fit whole (best first; one that does
        not fit is left out, a smaller later one may still go in), within the recall budget
        and ``room``; the facts are placed first and never make room for memories."""
        facts = self.facts_part()
        if not self.recall:
            return KernelPick(facts)
        room = self.kernel_cap if room is None else min(room, self.kernel_cap)
        hit: KernelPick = self._cached(
            ("kernel_recall", self.index.kernel_version, self.recall, room),
            lambda: self._pick(facts, room),
        )
        return hit

    def _pick(self, facts: Part | None, room: int) -> KernelPick:
        mc = self.counter
        base = facts.raw if facts is not None else mc.message(Message.system(""))
        allowance = min(self.recall_cap, room - base)
        header = mc.text(RECALL_HEADER) + 1
        lines = [f"- {m.text}" for m in self.recall]
        sizes = [mc.text(line) + 1 for line in lines]
        chosen: list[int] = []
        used = header
        for i, size in enumerate(sizes):
            if used + size <= allowance:
                chosen.append(i)
                used += size
        while chosen:  # the tokenizer may join across lines: check the whole message
            text = RECALL_HEADER + "\n" + "\n".join(lines[i] for i in chosen)
            if facts is not None:
                text = facts.message.content + "\n\n" + text
            part = self._part(text)
            memories = part.raw - (facts.raw if facts is not None else 0)
            if part.raw <= room and memories <= self.recall_cap:
                keys = tuple(self.recall[i].key for i in chosen)
                return KernelPick(part, keys, mc.scaled(memories), sum(sizes) + header)
            chosen.pop()
        return KernelPick(facts, (), 0, sum(sizes) + header)

    def facts_part(self) -> Part | None:
        """The session's Kernel facts (set with ``remember`` / ``set_kernel``) as a message."""
        kernel = self.index.kernel
        if not kernel:
            return None
        part: Part = self._cached(
            ("kernel", self.index.kernel_version),
            lambda: self._part(
                "Session context (Kernel):\n" + "\n".join(f"- {k}: {v}" for k, v in kernel.items())
            ),
        )
        return part

    def l2_part(self, summaries: list[Summary]) -> Part | None:
        if not summaries:
            return None
        texts = tuple(s.text for s in summaries)
        part: Part = self._cached(
            ("l2", texts),
            lambda: self._part(
                "Summary of the earlier conversation:\n\n" + "\n\n---\n\n".join(texts)
            ),
        )
        return part

    def l2_raw(self, summaries: list[Summary]) -> int:
        part = self.l2_part(summaries)
        return part.raw if part else 0

    def mask(self, pos: int) -> Part | None:
        def make() -> Part | bool:
            msg = self.index.conv[pos]
            raw = self.index.message_raw(pos)
            content = mask_placeholder(msg, self.counter.scaled(raw))
            # a masked output's media go with its text: placeholders name them
            masked = (
                without_media(msg, content)
                if has_media(msg)
                else msg.model_copy(update={"content": content})
            )
            part = Part(masked, self.counter.message(masked))
            return part if part.raw < raw else False

        hit = self._cached(("mask", pos), make)
        return hit if hit else None

    def strip(self, pos: int) -> Part | None:
        """Conversation message ``pos`` with its media replaced by placeholders (None when
        that saves nothing)."""

        def make() -> Part | bool:
            msg = self.index.conv[pos]
            part = Part(without_media(msg), 0)
            part.raw = self.counter.message(part.message)
            return part if part.raw < self.index.message_raw(pos) else False

        hit = self._cached(("strip", pos), make)
        return hit if hit else None

    # -- measuring -------------------------------------------------------------------------------
    def measure(
        self,
        summaries: list[Summary],
        covered: int,
        *,
        mask: bool = False,
        keep: int | None = None,
        strip: bool = False,
    ) -> Measure:
        """Sizes of the tiers; ``strip`` replaces the media before the current turn by
        placeholders, ``mask`` does that too and masks old tool outputs (keeping ``keep``
        newest ones, default ``keep_tool_outputs``)."""
        idx, cfg = self.index, self.cfg
        starts, n = idx.unit_starts, len(idx.conv)
        first = bisect_right(starts, covered)
        start = starts[first] if first < len(starts) else n
        tail_start = starts[-1] if first < len(starts) else n
        users = idx.user_positions
        # the latest user message is always sent, even when a summary already covers it
        pinned = users[-1] if users and users[-1] < tail_start else None
        l1 = idx.raw(start, n)
        if pinned is not None and pinned < start:
            l1 += idx.message_raw(pinned)
        masks: dict[int, Part] = {}
        savings: dict[int, int] = {}
        masked = cfg.mask_tool_outputs == "always" or (mask and cfg.mask_tool_outputs != "never")
        if masked:
            tp = idx.tool_positions  # the newest unit's outputs always stay verbatim
            tools = tp[bisect_left(tp, start) : bisect_left(tp, tail_start)]
            keep = cfg.keep_tool_outputs if keep is None else keep
            for pos in tools[: len(tools) - keep] if keep else tools:
                part = self.mask(pos)
                if part is not None:
                    masks[pos] = part
                    savings[pos] = idx.message_raw(pos) - part.raw
                    l1 -= savings[pos]
        stripped = strip or mask
        if stripped and idx.media_positions:
            mp = idx.media_positions  # the current turn's media (and the pinned ones) stay
            for pos in mp[bisect_left(mp, start) : bisect_left(mp, tail_start)]:
                if pos == pinned or pos in masks or pos in idx.orphans:
                    continue
                part = self.strip(pos)
                if part is not None:
                    masks[pos] = part
                    savings[pos] = idx.message_raw(pos) - part.raw
                    l1 -= savings[pos]
        mem, ker, l2 = self.memory_part(), self.kernel_part(), self.l2_part(summaries)
        mem_raw = min(mem.raw, self.memory_cap) if mem else 0
        ker_raw = min(ker.raw, self.kernel_cap) if ker else 0
        l2_raw = min(l2.raw, self.l2_cap) if l2 else 0
        total = self.fixed + mem_raw + ker_raw + l2_raw + l1
        over = total >= cfg.compress_at * self.budget or (
            self.l1_cap is not None and l1 >= cfg.compress_at * self.l1_cap
        )
        return Measure(
            idx,
            first,
            start,
            tail_start,
            pinned,
            masks,
            l1,
            mem_raw,
            ker_raw,
            l2_raw,
            summaries,
            total,
            over,
            masked,
            stripped,
            savings,
        )

    def unit_raw(self, m: Measure, unit: tuple[int, int]) -> int:
        s, e = unit
        raw = self.index.raw(s, e)
        if m.savings:
            raw -= sum(v for p, v in m.savings.items() if s <= p < e)
        return raw

    def choose_span(self, m: Measure) -> tuple[int, int] | None:
        """The oldest units to summarise: all but the newest ones that fit ``keep_ratio``."""
        units = m.units
        if len(units) < 2:
            return None
        l1_room = self.budget - self.fixed - m.memory_file - m.kernel - self.l2_cap
        if self.l1_cap is not None:
            l1_room = min(l1_room, self.l1_cap)
        target = self.cfg.keep_ratio * max(l1_room, 0)
        kept = self.unit_raw(m, units[-1])
        keep_from = len(units) - 1
        for j in range(len(units) - 2, 0, -1):
            r = self.unit_raw(m, units[j])
            if kept + r > target:
                break
            kept += r
            keep_from = j
        return units[0][0], units[keep_from - 1][1]

    def span_messages(self, m: Measure, start: int, end: int) -> list[Message]:
        idx = self.index
        return [
            m.masks[p].message if p in m.masks else idx.conv[p]
            for p in range(start, end)
            if p not in idx.orphans
        ]

    # -- assembling ------------------------------------------------------------------------------
    def assemble(
        self, m: Measure, *, reserve: int = 0
    ) -> tuple[list[Message], int, list[ComponentNote]]:
        """Messages for the call, their raw total (with tools and priming), and the decisions."""
        idx, mc = self.index, self.counter
        budget = self.budget - reserve
        decisions = list(self.rom_decisions)
        out: list[Message] = [self.rom.message] if self.rom else []
        if self.rom:
            decisions.insert(
                0,
                _note(
                    E.CONTEXT_COMPONENT_INCLUDED,
                    "system",
                    Priority.CRITICAL,
                    mc.scaled(self.rom.raw),
                ),
            )
        if self.tools_raw:
            decisions.append(
                _note(
                    E.CONTEXT_COMPONENT_INCLUDED,
                    "tools",
                    Priority.CRITICAL,
                    mc.scaled(self.tools_raw),
                )
            )
        pinned, conv = m.pinned, idx.conv

        def msgs(s: int, e: int) -> list[Message]:
            return [
                m.masks[p].message if p in m.masks else conv[p]
                for p in range(s, e)
                if p not in idx.orphans
            ]

        remaining = budget - self.fixed
        fast = m.total <= budget
        if fast:  # everything pending fits: one slice, no per-unit work
            crit, crit_raw = [], 0
        else:
            crit = ([conv[pinned]] if pinned is not None else []) + msgs(m.tail_start, len(conv))
            crit_raw = sum(mc.message(x) for x in crit)
            room = remaining
            if crit_raw > remaining:
                # The turn is cut anyway: cut it a little more (never below half the room) so
                # MEMORY.md and the Kernel stay whole, and with them the prefix the provider
                # has cached (loom.models.cache).
                if m.kernel + m.memory_file <= remaining // 2:
                    room = remaining - m.kernel - m.memory_file
                crit, crit_raw = self._strip_current(crit, room, decisions)
            if crit_raw > room:
                crit, shrunk = self._shrink(crit, room)
                decisions.append(
                    _note(
                        E.CONTEXT_COMPONENT_TRUNCATED,
                        "current_turn",
                        Priority.CRITICAL,
                        mc.scaled(shrunk),
                        original_tokens=mc.scaled(crit_raw),
                    )
                )
                crit_raw = shrunk
            remaining -= crit_raw

        placed: dict[str, Message | None] = {}
        system_raw = 0
        kernel = self.facts_part()
        if self.recall:  # recalled memories whole, within what is left
            pick = self.kernel_pick(remaining)
            decisions.append(self._recall_note(pick, remaining))
            kernel = pick.part
        for name, prio, part, cap in (  # admitted by priority, sent in tier order below
            ("kernel", Priority.HIGH, kernel, self.kernel_cap),
            ("memory_file", Priority.MEDIUM, self.memory_part(), self.memory_cap),
            ("summaries", Priority.MEDIUM, self.l2_part(m.summaries), self.l2_cap),
        ):
            if part is None:
                continue
            msg, used, note = self._fit(name, prio, part, min(cap, remaining))
            decisions.append(note)
            remaining -= used
            system_raw += used
            placed[name] = msg
        out.extend(
            x
            for x in (placed.get("memory_file"), placed.get("kernel"), placed.get("summaries"))
            if x is not None
        )

        if fast:
            pending = conv[m.start :]
            if m.masks or (idx.orphans and max(idx.orphans) >= m.start):
                pending = msgs(m.start, len(conv))
            if pinned is not None and pinned < m.start:
                out.append(conv[pinned])
            out.extend(pending)
            hist_raw = m.l1
            decisions.append(
                _note(
                    E.CONTEXT_COMPONENT_INCLUDED,
                    "history",
                    Priority.LOW,
                    mc.scaled(hist_raw),
                    masked_tool_outputs=len(m.masks),
                )
            )
        else:
            hist_raw = self._history(m, out, crit, remaining, decisions)
        total = self.fixed + system_raw + hist_raw + crit_raw
        if total > budget:  # only when even the truncated turn cannot fit
            media = [
                f"{p.label} (~{mc.scaled(mc.parts([p]))} tokens)"
                for x in (crit if not fast else [])
                for p in x.parts
                if p.kind in ("image", "file", "audio")
            ]
            what = (
                f"; the current turn's media alone take {', '.join(media)}: send smaller "
                "or fewer files, or use a model with a larger window"
                if media
                else ""
            )
            raise ContextTooLong(
                f"the context needs {mc.scaled(total)} tokens but the budget is "
                f"{mc.scaled(budget)} even after compaction and truncation; raise "
                f"context_window or shorten the instructions and tool schemas{what}"
            )
        return out, total, decisions

    def _history(
        self,
        m: Measure,
        out: list[Message],
        crit: list[Message],
        remaining: int,
        decisions: list[ComponentNote],
    ) -> int:
        """Slow path: keep the newest whole units that fit; place the pinned message; append
        the current turn. Returns the raw tokens of the kept history units."""
        mc, pinned = self.counter, m.pinned
        units = m.units

        def msgs(s: int, e: int) -> list[Message]:
            return [
                m.masks[p].message if p in m.masks else self.index.conv[p]
                for p in range(s, e)
                if p not in self.index.orphans
            ]

        hist = [x for x in units[:-1] if pinned is None or not x[0] <= pinned < x[1]]
        sizes = [self.unit_raw(m, x) for x in hist]
        hist_raw = sum(sizes)
        keep = len(hist)
        if hist_raw > remaining:
            used, keep = 0, 0
            for r in reversed(sizes):
                if used + r > remaining:
                    break
                used += r
                keep += 1
            kind = E.CONTEXT_COMPONENT_TRUNCATED if keep else E.CONTEXT_COMPONENT_EXCLUDED
            decisions.append(
                _note(
                    kind,
                    "history",
                    Priority.LOW,
                    mc.scaled(used),
                    original_tokens=mc.scaled(hist_raw),
                    units=len(hist),
                    units_kept=keep,
                )
            )
            hist_raw = used
        else:
            decisions.append(
                _note(
                    E.CONTEXT_COMPONENT_INCLUDED,
                    "history",
                    Priority.LOW,
                    mc.scaled(hist_raw),
                    units=len(hist),
                    masked_tool_outputs=len(m.masks),
                )
            )
        kept_units = hist[len(hist) - keep :]
        for x in kept_units:
            if pinned is None or x[0] < pinned:
                out.extend(msgs(*x))
        if pinned is not None:
            out.append(crit[0])
            crit = crit[1:]
        for x in kept_units:
            if pinned is not None and x[0] > pinned:
                out.extend(msgs(*x))
        out.extend(crit)
        return hist_raw

    def _recall_note(self, pick: KernelPick, remaining: int) -> ComponentNote:
        mc, found = self.counter, len(self.recall)
        counts = {"memories": found, "keys": list(pick.keys)}
        if pick.kept == found:
            return _note(
                E.CONTEXT_COMPONENT_INCLUDED, "recall", Priority.HIGH, pick.tokens, **counts
            )
        if pick.kept:
            return _note(
                E.CONTEXT_COMPONENT_TRUNCATED,
                "recall",
                Priority.HIGH,
                pick.tokens,
                original_tokens=mc.scaled(pick.wanted),
                memories_kept=pick.kept,
                **counts,
            )
        why = "no room left" if remaining < self.kernel_cap else "over the recall budget"
        return _note(
            E.CONTEXT_COMPONENT_EXCLUDED,
            "recall",
            Priority.HIGH,
            0,
            original_tokens=mc.scaled(pick.wanted),
            reason=why,
            **counts,
        )

    def _fit(
        self, name: str, prio: Priority, part: Part, room: int
    ) -> tuple[Message | None, int, ComponentNote]:
        mc = self.counter
        if part.raw <= room:
            return (
                part.message,
                part.raw,
                _note(E.CONTEXT_COMPONENT_INCLUDED, name, prio, mc.scaled(part.raw)),
            )
        overhead = mc.message(Message.system(""))
        text = (
            truncate_text(mc, part.message.content, room - overhead)
            if (room - overhead >= _MIN_PART)
            else None
        )
        if text is None:
            return (
                None,
                0,
                _note(
                    E.CONTEXT_COMPONENT_EXCLUDED,
                    name,
                    prio,
                    0,
                    original_tokens=mc.scaled(part.raw),
                    reason="no room left",
                ),
            )
        msg = Message.system(text)
        used = mc.message(msg)
        return (
            msg,
            used,
            _note(
                E.CONTEXT_COMPONENT_TRUNCATED,
                name,
                prio,
                mc.scaled(used),
                original_tokens=mc.scaled(part.raw),
            ),
        )

    def _strip_current(
        self, crit: list[Message], room: int, decisions: list[ComponentNote]
    ) -> tuple[list[Message], int]:
        """The current turn over its room: its media other than the latest user message's
        are replaced by placeholders, oldest first, until it fits (before any text is cut)."""
        mc, out = self.counter, list(crit)
        users = self.index.user_positions
        latest_user = self.index.conv[users[-1]] if users else None
        used = sum(mc.message(x) for x in out)
        replaced = 0
        for i, x in enumerate(out):
            if used <= room:
                break
            if x is latest_user or not has_media(x):
                continue
            stripped = without_media(x)
            used += mc.message(stripped) - mc.message(x)
            out[i] = stripped
            replaced += 1
        if replaced:
            decisions.append(
                _note(
                    E.CONTEXT_COMPONENT_TRUNCATED,
                    "current_turn_media",
                    Priority.CRITICAL,
                    mc.scaled(used),
                    messages_with_media_replaced=replaced,
                )
            )
        return out, used

    def _shrink(self, items: list[Message], room: int) -> tuple[list[Message], int]:
        """Cut the largest messages of the current turn to fit ``room`` (water-filling over
        their text; their parts are never cut, so their tokens are set aside first)."""
        mc = self.counter
        if any(x.parts for x in items):
            fixed = sum(mc.parts(x.parts) for x in items)
            bare = [x.model_copy(update={"parts": []}) if x.parts else x for x in items]
            cut, _ = self._shrink(bare, room - fixed)
            out = [
                c.model_copy(update={"parts": x.parts}) if x.parts else c
                for c, x in zip(cut, items, strict=True)
            ]
            return out, sum(mc.message(x) for x in out)
        sizes = [mc.message(x) for x in items]
        order = sorted(range(len(items)), key=lambda i: sizes[i])
        left, out = room, list(items)
        for rank, i in enumerate(order):
            share = left // (len(items) - rank)
            if sizes[i] > share:
                out[i] = shrink_message(mc, items[i], share)
            left -= mc.message(out[i])
        return out, sum(mc.message(x) for x in out)


def _note(kind: EventType, name: str, prio: Priority, tokens: int, **extra: Any) -> ComponentNote:
    return kind, {"component": name, "priority": int(prio), "tokens": tokens, **extra}
