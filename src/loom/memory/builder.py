"""``SegmentedContextBuilder``: the budgeted CONTEXT stage.

Each call it (1) folds the new transcript entries into the session's index, (2) measures ROM +
MEMORY.md + Kernel + L2 + L1 against the budget (window minus reserved output; media counted
by the model's rules, ``loom.memory.media``), (3) near the threshold asks the agent to flush
lasting notes to MEMORY.md (once per compaction cycle), (4) at ``compress_at`` replaces older
media by placeholders, then masks old tool outputs and, if that is not enough, summarises the
oldest span (falling back to the sliding window), and (5) assembles the components by priority
so the call never exceeds the budget. Memories the turn recalled from earlier sessions
(``ContextRequest.recalled``, ``loom.memory.recall``) go into the Kernel, whole, within their
own budget. Summaries and flush markers it creates are returned in
``AssembledContext.persist``; the loop commits them with the events, so the next context is
again a function of the transcript alone.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.context import AssembledContext, ContextRequest
from loom.errors import ConfigurationError
from loom.events import EventType
from loom.memory import assembly
from loom.memory.assembly import Plan
from loom.memory.cache import prefix_points
from loom.memory.compression import FLUSH_SYSTEM, FLUSH_USER, render_span, run_flush, summarise
from loom.memory.config import (
    DEFAULT_CONTEXT_WINDOW,
    Budgets,
    MemoryConfig,
    default_reserved_output,
)
from loom.memory.media import media_rule_for
from loom.memory.segments import SessionIndex, Summary
from loom.memory.tokens import MessageCounter, TokenCounter, counter_for_model
from loom.memory.trim import truncate_text
from loom.messages import Message, ToolSpec, Usage
from loom.models.cache import PrefixTracker
from loom.tools.base import spec_of

if TYPE_CHECKING:
    from loom.spec import AgentSpec

__all__ = ["MIN_CONVERSATION_TOKENS", "SegmentedContextBuilder"]

E = EventType
MIN_CONVERSATION_TOKENS = 128
"""Room a window must leave after ROM and the reserve, so at least a (truncated) turn fits."""
_MAX_ROUNDS = 4


@dataclass(slots=True)
class _Setup:
    budgets: Budgets
    counter: MessageCounter
    summariser: Any
    memory_path: Path | None


@dataclass(slots=True)
class _View:
    """The tiers as this build sees them: the index plus what this build adds."""

    summaries: list[Summary]
    covered: int
    persist: list[Message] = field(default_factory=list)


class SegmentedContextBuilder:
    """Segmented memory (ROM / Kernel / L1 / L2 + MEMORY.md) inside a token budget.

    Args:
        config: Budgets, thresholds, summariser, MEMORY.md; default ``MemoryConfig()``.
        context_window: The model's window in tokens; default the model's ``context_window``
            attribute, else 128 000 (seed 004).
        reserved_output_tokens: Kept free for the answer; default ``model_settings.max_tokens``
            or min(4000, window / 4).
    """

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        context_window: int | None = None,
        reserved_output_tokens: int | None = None,
        max_sessions: int = 256,
    ) -> None:
        self.config = config or MemoryConfig()
        self.context_window = context_window
        self.reserved_output_tokens = reserved_output_tokens
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[int, str], SessionIndex] = OrderedDict()
        self._plans: dict[tuple[int, str], Plan] = {}  # each session's last plan (see build)
        self._setups: dict[int, tuple[AgentSpec, _Setup]] = {}
        self._raw_of: dict[int, tuple[int, Any]] = {}
        self._file_cache: dict[Path, tuple[tuple[int, int], str]] = {}
        self.prefixes = PrefixTracker(max_sessions)
        """Each session's last request, for prompt-cache points and CACHE_BUST
        (``loom.models.cache``); ``prefixes.busts`` counts the busts seen."""

    # -- configuration ---------------------------------------------------------------------------
    def window_of(self, agent: AgentSpec, model: Any = None) -> tuple[int, int]:
        """(context window, reserved output) for ``agent``."""
        window = self.context_window or getattr(model, "context_window", None)
        if not isinstance(window, int) or window <= 0:
            window = DEFAULT_CONTEXT_WINDOW
        reserved = self.reserved_output_tokens
        if reserved is None:
            settings = agent.model_settings
            reserved = default_reserved_output(window, settings.max_tokens if settings else None)
        return window, reserved

    def check(
        self,
        agent: AgentSpec,
        model: Any = None,
        counter: TokenCounter | None = None,
        tool_specs: list[ToolSpec] | None = None,
    ) -> None:
        """Raise ``ConfigurationError`` when the window cannot hold ROM + reserve + a turn."""
        window, reserved = self.window_of(agent, model)
        budgets = self.config.budgets(window, reserved)
        mc = MessageCounter(
            counter or self.config.counter or counter_for_model(model),
            media=media_rule_for(model),
        )
        rom = mc.message(Message.system(agent.instructions)) if agent.instructions else 0
        tools = mc.tools(agent.tool_specs if tool_specs is None else tool_specs)
        need = mc.scaled(rom + tools + assembly.PRIMING) + reserved + MIN_CONVERSATION_TOKENS
        if need > window:
            raise ConfigurationError(
                f"context_window={window} is too small for agent {agent.name!r}: the system "
                f"prompt takes ~{mc.scaled(rom)} tokens and the tool schemas ~{mc.scaled(tools)}, "
                f"reserved_output_tokens={reserved}, and a turn needs at least "
                f"{MIN_CONVERSATION_TOKENS}; that is {need} > {window}. Raise context_window, "
                f"lower reserved_output_tokens, or shorten the instructions / tools."
            )
        del budgets

    def _setup(self, agent: AgentSpec, model: Any) -> _Setup:
        hit = self._setups.get(id(agent))
        if hit is not None and hit[0] is agent:
            return hit[1]
        counter = self.config.counter or counter_for_model(model)
        self.check(agent, model, counter)
        window, reserved = self.window_of(agent, model)
        summariser = self.config.summarizer
        if isinstance(summariser, str):
            from loom.models import resolve_model

            summariser = resolve_model(summariser)
        setup = _Setup(
            self.config.budgets(window, reserved),
            MessageCounter(counter, media=media_rule_for(model)),
            summariser or model,
            self.memory_path(agent),
        )
        self._setups[id(agent)] = (agent, setup)
        return setup

    def counter_for(self, agent: AgentSpec, model: Any) -> MessageCounter:
        """The message counter this builder uses for ``agent`` with ``model``."""
        return self._setup(agent, model).counter

    def budgets_for(self, agent: AgentSpec, model: Any) -> Budgets:
        return self._setup(agent, model).budgets

    def index_for(self, agent: AgentSpec, session_id: str, model: Any) -> SessionIndex:
        key = (id(agent), session_id)
        idx = self._sessions.get(key)
        if idx is None:
            idx = self._sessions[key] = SessionIndex(self._setup(agent, model).counter)
            if len(self._sessions) > self._max_sessions:
                evicted, _ = self._sessions.popitem(last=False)
                self._plans.pop(evicted, None)
        else:
            self._sessions.move_to_end(key)
        return idx

    def memory_path(self, agent: AgentSpec) -> Path | None:
        """Where this agent's MEMORY.md lives, or None when MEMORY.md is off."""
        f = self.config.memory_file
        if f is None:
            return None
        path = Path(f)
        if path.is_absolute():
            return path
        return agent.workspace / path if agent.workspace is not None else None

    def read_memory(self, agent: AgentSpec, path: Path | None = None) -> str:
        """MEMORY.md's text; a missing file is empty memory."""
        path = path or self.memory_path(agent)
        if path is None:
            return ""
        try:
            st = path.stat()
        except OSError:
            return ""
        key = (st.st_mtime_ns, st.st_size)
        hit = self._file_cache.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        self._file_cache[path] = (key, text)
        return text

    # -- the build -------------------------------------------------------------------------------
    async def build(self, request: ContextRequest) -> AssembledContext:
        agent, cfg, model = request.agent, self.config, request.model
        setup = self._setup(agent, model)
        mc, b = setup.counter, setup.budgets
        idx = self.index_for(agent, request.session_id, model)
        idx.update(request.history)
        path = setup.memory_path
        memory_text = self.read_memory(agent, path) if path else ""
        tools_raw = mc.tools(request.tool_specs)
        # Between builds usually only messages were appended: the session's previous plan
        # (caps, ROM) still holds, and remaking it costs more than checking its inputs.
        # Kept beside the index, not in it: an evicted index must not sit in a reference cycle.
        key = (id(agent), request.session_id)
        plan = self._plans.get(key)
        if (
            plan is None
            or plan.index is not idx
            or not plan.made_from(mc, b, cfg, request.extra_system, agent.instructions, tools_raw)
        ):
            plan = self._plans[key] = Plan(
                mc, b, idx, cfg, request.extra_system, agent.instructions, tools_raw, memory_text
            )
        plan.memory_text = memory_text
        plan.recall = request.recalled.memories if request.recalled is not None else ()
        notes: list[tuple[EventType, dict[str, Any]]] = []
        view = _View(list(idx.summaries), idx.covered)
        measure = plan.measure(view.summaries, view.covered)

        if (
            cfg.memory_flush
            and path is not None
            and view.covered not in idx.flushed_cycles
            and measure.total >= cfg.flush_at * plan.budget
        ):
            await self._flush(plan, view, measure, setup, path, model, notes)
            plan.memory_text = self.read_memory(agent, path)
            measure = plan.measure(view.summaries, view.covered)

        if measure.over_threshold:
            # older media go first (placeholders), then old tool outputs, then summaries
            measure = plan.measure(view.summaries, view.covered, strip=True)
            if measure.over_threshold:
                measure = plan.measure(view.summaries, view.covered, mask=True)
            if measure.over_threshold and cfg.keep_tool_outputs:
                # masking the kept outputs too is cheaper than a summary; the newest unit's
                # outputs stay verbatim either way
                all_masked = plan.measure(view.summaries, view.covered, mask=True, keep=0)
                if not all_masked.over_threshold:
                    measure = all_masked
            rounds = 0
            while measure.over_threshold and rounds < _MAX_ROUNDS:
                rounds += 1
                if not await self._compress(plan, view, measure, setup, notes):
                    break
                measure = plan.measure(view.summaries, view.covered, mask=True)

        messages, raw, decisions = plan.assemble(measure)
        if cfg.component_events:
            notes[:0] = decisions  # component decisions first, then compression progress
        else:
            notes[:0] = [d for d in decisions if d[0] is not E.CONTEXT_COMPONENT_INCLUDED]
        ctx = AssembledContext(
            messages=messages, tools=request.tool_specs, token_estimate=mc.scaled(raw), notes=notes
        )
        ctx.persist = view.persist
        if agent.model_settings is None or agent.model_settings.prompt_cache:
            # where the stable prefix's segments end; a CACHE_BUST note when the session's
            # previous prefix broke (loom.memory.cache)
            points = prefix_points(
                self.prefixes,
                (id(request.agent), request.session_id),
                plan,
                request.model,
                request.tool_specs,
                ctx.messages,
                measure,
                ctx.notes,
                decisions,
            )
            ctx.cache_points = list(points)
        if len(self._raw_of) > 1024:
            self._raw_of.clear()
        if getattr(mc.counter, "observe", None) is not None:
            self._raw_of[id(ctx)] = (raw, mc.counter)
        return ctx

    def observe_usage(self, ctx: AssembledContext, usage: Usage) -> None:
        """Correct an estimating counter with the input tokens the provider reported."""
        hit = self._raw_of.pop(id(ctx), None)
        if hit is not None and usage.input_tokens:
            hit[1].observe(hit[0], usage.input_tokens)

    # -- MEMORY_FLUSH ----------------------------------------------------------------------------
    async def _flush(
        self,
        plan: Plan,
        view: _View,
        measure: Any,
        setup: _Setup,
        path: Path,
        model: Any,
        notes: list[tuple[EventType, dict[str, Any]]],
    ) -> None:
        from loom.memory.tools import memory_file_tool

        mc = plan.counter
        extra = mc.message(Message.system(FLUSH_SYSTEM)) + mc.message(Message.user(FLUSH_USER))
        tool = spec_of(memory_file_tool(path))
        extra += mc.tools([tool]) - plan.tools_raw
        messages, _, _ = plan.assemble(
            plan.measure(view.summaries, view.covered, mask=True), reserve=max(extra, 0)
        )
        data = await run_flush(model, messages, path, tool)
        data["cycle"] = view.covered
        notes.append((E.MEMORY_FLUSH, data))
        view.persist.append(
            Message(
                role="system",
                content=f"[memory flush: {data['status']}, {data['notes']} note(s)]",
                metadata={"loom": "memory_flush", **data},
            )
        )

    # -- compression -----------------------------------------------------------------------------
    async def _compress(
        self,
        plan: Plan,
        view: _View,
        measure: Any,
        setup: _Setup,
        notes: list[tuple[EventType, dict[str, Any]]],
    ) -> bool:
        """Summarise the oldest span (or drop it). False when nothing can be evicted."""
        cfg, mc = self.config, plan.counter
        span = plan.choose_span(measure)
        if span is None:
            return False
        start, end = span
        previous = view.summaries[-1].text if view.summaries else None
        prompt_raw = 200 + (mc.text(previous) if previous else 0)
        if prompt_raw > plan.budget // 3:
            previous, prompt_raw = None, 200
        limit = max(plan.budget - prompt_raw - plan.summary_words * 2, 64)
        span_msgs = plan.span_messages(measure, start, end)
        text = render_span(span_msgs)
        raw = mc.text(text)
        for _ in range(8):  # shrink toward the summariser's window; each pass cuts ≥ 10 %
            if raw <= limit:
                break
            text = render_span(span_msgs, limit_chars=max(0, int(len(text) * limit / raw * 0.9)))
            raw = mc.text(text)
        before = mc.scaled(measure.total)
        notes.append(
            (
                E.COMPRESSION_START,
                {
                    "kind": "span",
                    "covers_from": start,
                    "covers_through": end - 1,
                    "messages": end - start,
                    "span_tokens": mc.scaled(plan.index.raw(start, end)),
                    "context_tokens": before,
                    "budget": plan.budgets.total,
                },
            )
        )
        meta = (
            f"- covers conversation messages {start}–{end - 1} ({end - start} messages, "
            f"~{mc.scaled(plan.index.raw(start, end))} tokens before compression)"
        )
        summary, attempts, error = await summarise(
            setup.summariser,
            text,
            previous=previous,
            words=plan.summary_words,
            attempts=cfg.attempts,
            delays=cfg.retry_delays,
            sleep=cfg.sleep,
            notes=notes,
            metadata=meta,
        )
        method = "summary"
        if summary is None:
            method = "sliding_window"
            summary = (
                f"[Earlier conversation messages {start}–{end - 1} were dropped to fit "
                f"the context window; the summariser failed: {error}]"
            )
            notes.append(
                (
                    E.COMPRESSION_FALLBACK,
                    {
                        "fallback_method": "sliding_window",
                        "reason": error,
                        "dropped_messages": end - start,
                        "attempts": attempts,
                    },
                )
            )
        self._add_summary(
            plan, view, Summary(start, end - 1, summary, method), {"attempts": attempts}
        )
        merged = await self._merge_if_needed(plan, view, setup, notes)
        after = plan.measure(view.summaries, view.covered, mask=True)
        notes.append(
            (
                E.COMPRESSION_COMPLETE,
                {
                    "kind": "span",
                    "method": method,
                    "covers_through": end - 1,
                    "tokens_before": before,
                    "tokens_after": mc.scaled(after.total),
                    "summary_tokens": mc.scaled(mc.text(summary)),
                    "merged": merged,
                    "attempts": attempts,
                },
            )
        )
        return True

    def _add_summary(self, plan: Plan, view: _View, s: Summary, extra: dict[str, Any]) -> None:
        s.raw_tokens = plan.counter.text(s.text)
        view.summaries = [x for x in view.summaries if x.covers_from < s.covers_from] + [s]
        view.covered = max(view.covered, s.covers_through)
        view.persist.append(
            Message(
                role="system",
                content=s.text,
                metadata={
                    "loom": "summary",
                    "covers_from": s.covers_from,
                    "covers_through": s.covers_through,
                    "method": s.method,
                    **extra,
                },
            )
        )

    async def _merge_if_needed(
        self, plan: Plan, view: _View, setup: _Setup, notes: list[tuple[EventType, dict[str, Any]]]
    ) -> bool:
        """L2 over its budget: merge every summary into one ("compressed further")."""
        if len(view.summaries) < 2 or plan.l2_raw(view.summaries) <= plan.l2_cap:
            return False
        cfg, mc = self.config, plan.counter
        joined = "\n\n".join(s.text for s in view.summaries)
        first, last = view.summaries[0].covers_from, view.covered
        notes.append(
            (
                E.COMPRESSION_START,
                {
                    "kind": "merge",
                    "covers_from": first,
                    "covers_through": last,
                    "summaries": len(view.summaries),
                    "span_tokens": mc.scaled(mc.text(joined)),
                },
            )
        )
        meta = (
            f"- merges {len(view.summaries)} summaries covering conversation messages "
            f"{first}–{last}"
        )
        text, attempts, error = await summarise(
            setup.summariser,
            joined,
            previous=None,
            words=plan.summary_words,
            attempts=cfg.attempts,
            delays=cfg.retry_delays,
            sleep=cfg.sleep,
            notes=notes,
            metadata=meta,
        )
        method = "merge"
        if text is None:
            method = "merge_fallback"
            kept = truncate_text(
                mc, "\n\n".join(s.text for s in view.summaries[::-1]), plan.l2_cap - 16
            )
            text = kept or "[earlier summaries dropped]"
            notes.append(
                (
                    E.COMPRESSION_FALLBACK,
                    {"fallback_method": "sliding_window", "reason": error, "kind": "merge"},
                )
            )
        self._add_summary(plan, view, Summary(first, last, text, method), {"attempts": attempts})
        notes.append(
            (
                E.COMPRESSION_COMPLETE,
                {
                    "kind": "merge",
                    "method": method,
                    "covers_through": last,
                    "summary_tokens": mc.scaled(mc.text(text)),
                    "attempts": attempts,
                },
            )
        )
        return True
