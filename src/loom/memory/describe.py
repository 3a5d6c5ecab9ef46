"""``describe_session``: a stored session's memory tiers with their token counts.

For ``loom sessions show`` and for debugging. It reads the transcript through any ``Store`` and
computes the tiers exactly as the next context build would see them (without compressing and
without loading the model: the counter comes from the model string when the model is not
loaded yet).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from loom.errors import SessionNotFound
from loom.memory.assembly import Plan
from loom.memory.builder import SegmentedContextBuilder
from loom.memory.media import media_rule_for
from loom.memory.segments import SessionIndex
from loom.memory.tokens import MessageCounter, counter_for_model

if TYPE_CHECKING:
    from loom.engine.turn_spec import TurnSpec

__all__ = ["MemoryReport", "Tier", "describe_session"]


@dataclass(slots=True)
class Tier:
    """One tier: its name, tokens now, its budget, how many items it holds, and details."""

    name: str
    tokens: int
    budget: int | None
    items: int
    detail: str = ""


@dataclass(slots=True)
class MemoryReport:
    """What ``describe_session`` returns. ``tiers`` are in context order."""

    session_id: str
    context_window: int
    reserved_output: int
    budget: int
    tiers: list[Tier]
    next_call_tokens: int
    compress_at_tokens: int
    transcript_messages: int
    transcript_tokens: int
    summaries_written: int
    counter: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(tier, tokens, budget, items, detail) strings, for a table."""
        return [
            (
                t.name,
                f"{t.tokens:,}",
                "-" if t.budget is None else f"{t.budget:,}",
                str(t.items),
                t.detail,
            )
            for t in self.tiers
        ]


async def describe_session(
    store: Any, session_id: str, agent: TurnSpec, *, builder: SegmentedContextBuilder | None = None
) -> MemoryReport:
    """The memory tiers of ``session_id`` as ``agent`` would assemble them for its next call.

    Raises ``SessionNotFound`` when the store has no such session.
    """
    info = await store.get_session(session_id)
    if info is None:
        raise SessionNotFound(f"no session {session_id!r} in this store")
    # the window the session actually ran with (recorded at its first turn), unless the agent
    # sets one
    recorded = info.metadata.get("context_window")
    if builder is None:
        own = agent.context_builder
        builder = (
            own
            if isinstance(own, SegmentedContextBuilder)
            else SegmentedContextBuilder(
                agent.memory,
                context_window=agent.context_window
                or (recorded if isinstance(recorded, int) else None),
                reserved_output_tokens=agent.reserved_output_tokens,
            )
        )
    model = agent.model_spec
    counter = builder.config.counter or counter_for_model(model)
    mc = MessageCounter(counter, media=media_rule_for(model))
    window, reserved = builder.window_of(agent, model)
    budgets = builder.config.budgets(window, reserved)
    history = await store.load_messages(session_id)
    idx = SessionIndex(mc)
    idx.update(history)
    plan = Plan(
        mc,
        budgets,
        idx,
        builder.config,
        [],
        agent.instructions,
        mc.tools(agent.tool_specs),
        builder.read_memory(agent),
    )
    m = plan.measure(idx.summaries, idx.covered)
    s = mc.scaled
    rom_raw = (plan.rom.raw if plan.rom else 0) + plan.tools_raw
    pending = sum(e - b for b, e in m.units)
    mem_path = builder.memory_path(agent)
    tiers = [
        Tier(
            "ROM",
            s(rom_raw),
            budgets.rom,
            len(agent.tool_specs),
            f"instructions + {len(agent.tool_specs)} tool schemas",
        ),
        Tier(
            "MEMORY.md",
            s(m.memory_file),
            budgets.memory_file,
            len(plan.memory_text.splitlines()) if plan.memory_text else 0,
            str(mem_path) if mem_path else "off (no workspace)",
        ),
        Tier(
            "Kernel",
            s(m.kernel),
            budgets.kernel,
            len(idx.kernel),
            ", ".join(sorted(idx.kernel))[:80],
        ),
        Tier(
            "L2",
            s(m.l2),
            budgets.l2,
            len(idx.summaries),
            f"covers messages 0–{idx.covered}" if idx.covered >= 0 else "no summaries yet",
        ),
        Tier(
            "L1",
            s(m.l1),
            budgets.l1 if builder.config.l1_tokens is not None else None,
            pending,
            f"{len(m.units)} units since message {idx.covered + 1}",
        ),
    ]
    summaries = sum(
        1 for x in history if x.role == "system" and x.metadata.get("loom") == "summary"
    )
    return MemoryReport(
        session_id=session_id,
        context_window=window,
        reserved_output=reserved,
        budget=budgets.total,
        tiers=tiers,
        next_call_tokens=s(m.total),
        compress_at_tokens=int(builder.config.compress_at * budgets.total),
        transcript_messages=len(history),
        transcript_tokens=s(idx.prefix[-1]),
        summaries_written=summaries,
        counter=type(counter).__name__,
    )
