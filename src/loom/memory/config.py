"""``MemoryConfig``: segment budgets, thresholds, the summariser, MEMORY.md."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import ConfigurationError

if TYPE_CHECKING:
    from loom.memory.tokens import TokenCounter

__all__ = ["DEFAULT_CONTEXT_WINDOW", "Budgets", "MemoryConfig", "Priority", "RecallConfig"]

DEFAULT_CONTEXT_WINDOW = 128_000
"""Seed 004's default ``contextWindow``, used when neither the agent nor the model names one."""


class Priority(IntEnum):
    """Seed 002's component priorities."""

    CRITICAL = 100
    HIGH = 90
    MEDIUM = 70
    LOW = 50
    OPTIONAL = 30


# Seed 000's 5k / 2k / 10k / 3k split, as shares of the budget (they sum to a 20k budget).
_SHARES = {"rom": 0.25, "kernel": 0.10, "l1": 0.50, "l2": 0.15}


@dataclass(frozen=True, slots=True)
class Budgets:
    """Resolved token budgets for one agent (all in the provider's tokens)."""

    window: int
    reserved_output: int
    total: int  # window - reserved_output: what one call may send
    rom: int
    kernel: int
    l1: int
    l2: int
    memory_file: int


@dataclass(frozen=True, slots=True)
class RecallConfig:
    """Memories from earlier sessions recalled into the Kernel at CONTEXT (``loom.memory.recall``).

    Once per turn the store's items under ``namespaces`` are searched with the latest user
    message (the store decides keyword or hybrid search), as the run's owner; the best hits go
    into the Kernel segment, whole, within ``max_tokens`` and the Kernel's own budget.

    Args:
        namespaces: Namespace templates searched (``{owner}``: the run's owner, ``"shared"``
            without one; ``{agent}``: the agent's name). Default the memory tools' namespace.
        limit: Memories asked of the store (1-50).
        max_tokens: Tokens the recalled memories may take inside the Kernel (default: half
            the Kernel's budget).
        timeout: Seconds the search may take; past it the turn goes on without recall (a
            ``WARNING`` event says why).
    """

    namespaces: tuple[tuple[str, ...], ...] = (("memories", "{owner}"),)
    limit: int = 5
    max_tokens: int | None = None
    timeout: float = 2.0

    def __post_init__(self) -> None:
        spaces = self.namespaces
        if isinstance(spaces, str) or not isinstance(spaces, tuple | list) or not spaces:
            raise ConfigurationError(
                "RecallConfig.namespaces is a non-empty list of namespace templates such as "
                f"[('memories', '{{owner}}')], got {spaces!r}"
            )
        object.__setattr__(self, "namespaces", tuple(tuple(t) for t in spaces))
        for template in self.namespaces:
            check_namespace_template("RecallConfig.namespaces", template)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise ConfigurationError(f"RecallConfig.limit must be an integer, got {self.limit!r}")
        if not 1 <= self.limit <= 50:
            raise ConfigurationError(f"RecallConfig.limit must be 1 to 50, got {self.limit}")
        tokens = self.max_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
            raise ConfigurationError(f"RecallConfig.max_tokens must be an integer, got {tokens!r}")
        if tokens is not None and tokens < 0:
            raise ConfigurationError(f"RecallConfig.max_tokens must be >= 0, got {tokens}")
        if not isinstance(self.timeout, int | float) or not self.timeout > 0:
            raise ConfigurationError(
                f"RecallConfig.timeout must be a positive number of seconds, got {self.timeout!r}"
            )


def check_namespace_template(where: str, template: Any) -> None:
    """``ConfigurationError`` unless ``template`` is a non-empty tuple of non-empty strings
    without ``.`` that use only ``{owner}`` and ``{agent}``."""
    if isinstance(template, str) or not isinstance(template, tuple) or not template:
        raise ConfigurationError(
            f"{where} is a non-empty tuple of strings such as ('memories', '{{owner}}'), got "
            f"{template!r}"
        )
    for part in template:
        try:
            filled = part.format(owner="x", agent="x") if isinstance(part, str) else ""
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigurationError(
                f"{where} part {part!r} may only use {{owner}} and {{agent}}: {exc!r}"
            ) from None
        if not filled or "." in filled:
            raise ConfigurationError(
                f"{where} part {part!r} must be a non-empty string without '.'"
            )


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How an agent keeps long conversations inside its window.

    Budgets left as ``None`` are derived from the budget (window minus reserved output) with seed
    000's proportions (ROM 25 %, Kernel 10 %, L1 50 %, L2 15 %; a 20k budget gives exactly the
    seed's 5k / 2k / 10k / 3k). ROM and L1 take whatever the other tiers leave unused.

    Args:
        rom_tokens: Cap for the ROM's truncatable part (matched patterns); the instructions and
            tool schemas are never cut.
        kernel_tokens: Cap for the Kernel (session facts set with ``remember``).
        l1_tokens: Cap for recent turns; default: everything the other tiers leave.
        l2_tokens: Cap for summaries; over it, summaries are merged ("compressed further").
        memory_file_tokens: Cap for MEMORY.md in the context (default 10 % of the budget).
        compress_at: Share of the budget at which the oldest span is summarised (seed: 0.92).
        flush_at: Share at which the agent is asked to write MEMORY.md notes, once per cycle.
        keep_ratio: After a compaction, recent turns use at most this share of the L1 budget.
        keep_tool_outputs: Masking keeps this many newest tool outputs verbatim.
        mask_tool_outputs: ``"pressure"`` masks older outputs only when the context reaches
            ``compress_at`` (before summarising); ``"always"`` masks them on every call;
            ``"never"`` turns masking off.
        summarizer: Model (or model string) that writes summaries; default the agent's model.
        attempts / retry_delays: Summariser attempts and the waits between them (seed: 1, 2, 4 s).
        sleep: The coroutine used to wait (tests pass a no-op).
        memory_file: MEMORY.md path; relative paths are inside the agent's workspace. ``None``
            turns MEMORY.md off. Without a workspace a relative path is not used.
        memory_flush: Ask the agent to write notes before a compaction (seed 004 MEMORY_FLUSH).
        tools: Add the ``remember`` (Kernel) and ``memory_write`` (MEMORY.md) tools to the agent.
        store_tools: Add ``save_memory``, ``recall_memories`` and ``forget_memory``: memories
            kept in the store's items (``ItemStore``), across sessions, under
            ``store_namespace`` and owned by the run's owner (``loom.memory.item_tools``).
        store_namespace: The namespace those tools use; ``{owner}`` becomes the run's owner
            (``RunOptions.owner``: the API key's principal when served, a schedule's owner;
            ``"shared"`` without one) and ``{agent}`` the agent's name.
        recall: Recall memories from earlier sessions into the Kernel at CONTEXT, once per
            turn (``RecallConfig``; ``True`` means ``RecallConfig()``). Off by default.
        history_tool: Add ``search_history``, which searches the session's own earlier
            messages by keywords, including those summarised out of the context.
        counter: The ``TokenCounter``; default: chosen from the model.
        component_events: Emit CONTEXT_COMPONENT_* for every call (False: only when a component
            is truncated or excluded).
    """

    rom_tokens: int | None = None
    kernel_tokens: int | None = None
    l1_tokens: int | None = None
    l2_tokens: int | None = None
    memory_file_tokens: int | None = None
    compress_at: float = 0.92
    flush_at: float = 0.85
    keep_ratio: float = 0.5
    keep_tool_outputs: int = 3
    mask_tool_outputs: Literal["pressure", "always", "never"] = "pressure"
    summarizer: Any = None
    attempts: int = 3
    retry_delays: tuple[float, ...] = (1.0, 2.0, 4.0)
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)
    memory_file: str | Path | None = "MEMORY.md"
    memory_flush: bool = True
    tools: bool = False
    store_tools: bool = False
    store_namespace: tuple[str, ...] = ("memories", "{owner}")
    history_tool: bool = False
    recall: RecallConfig | None = None
    counter: TokenCounter | None = None
    component_events: bool = True

    def __post_init__(self) -> None:
        for name in ("rom_tokens", "kernel_tokens", "l1_tokens", "l2_tokens", "memory_file_tokens"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigurationError(
                    f"MemoryConfig.{name} must be a non-negative integer or None, got {value!r}"
                )
        for name in ("compress_at", "flush_at", "keep_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigurationError(
                    f"MemoryConfig.{name} must be a share of the budget in (0, 1], got {value!r}"
                )
        if self.attempts < 1:
            raise ConfigurationError(f"MemoryConfig.attempts must be >= 1, got {self.attempts}")
        if self.keep_tool_outputs < 0:
            raise ConfigurationError("MemoryConfig.keep_tool_outputs must be >= 0")
        if self.mask_tool_outputs not in ("pressure", "always", "never"):
            raise ConfigurationError(
                "MemoryConfig.mask_tool_outputs must be 'pressure', 'always' or 'never', "
                f"got {self.mask_tool_outputs!r}"
            )

        check_namespace_template("MemoryConfig.store_namespace", self.store_namespace)
        given: object = self.recall  # True is accepted as RecallConfig()
        if given is True:
            object.__setattr__(self, "recall", RecallConfig())
        elif given is not None and not isinstance(given, RecallConfig):
            raise ConfigurationError(
                f"MemoryConfig.recall must be a RecallConfig, True or None, got {given!r}"
            )

    @classmethod
    def seed_defaults(cls, **overrides: Any) -> MemoryConfig:
        """Seed 000's fixed budgets: ROM 5k, Kernel 2k, L1 10k, L2 3k."""
        values: dict[str, Any] = {
            "rom_tokens": 5000,
            "kernel_tokens": 2000,
            "l1_tokens": 10_000,
            "l2_tokens": 3000,
        }
        values.update(overrides)
        return cls(**values)

    def budgets(self, window: int, reserved_output: int) -> Budgets:
        """Resolve the budgets for a window; see the class docstring for the derivation."""
        total = window - reserved_output
        if total <= 0:
            raise ConfigurationError(
                f"context_window={window} leaves nothing after reserved_output_tokens="
                f"{reserved_output}; raise the window or lower the reserve"
            )

        def pick(value: int | None, share: float) -> int:
            return min(value, total) if value is not None else int(total * share)

        return Budgets(
            window=window,
            reserved_output=reserved_output,
            total=total,
            rom=pick(self.rom_tokens, _SHARES["rom"]),
            kernel=pick(self.kernel_tokens, _SHARES["kernel"]),
            l1=self.l1_tokens if self.l1_tokens is not None else total,
            l2=pick(self.l2_tokens, _SHARES["l2"]),
            memory_file=pick(self.memory_file_tokens, 0.10),
        )


def default_reserved_output(window: int, max_tokens: int | None) -> int:
    """Seed 004's 4000-token reserve floor, but never more than a quarter of a small window;
    the agent's ``model_settings.max_tokens`` wins when set."""
    if max_tokens:
        return int(max_tokens)
    return min(4000, window // 4)
