"""Budgets for a whole crew tree: tokens, cost, wall time, depth, fan-out, spawns.

A ``Budget`` is a set of limits. At run time each crew run gets a ``BudgetScope`` and every
member run a child scope of its parent's: spending is charged to the scope *and every
ancestor*, and a check looks at the whole chain, so a child can only ever draw on what its
parent has left. Checks run before every spawn (``check_spawn``) and before every model call
(``BudgetedModel`` wraps each member's model and refuses the call), and they fail closed:
a cost limit with no price for the model refuses rather than run unmetered, and once any
scope is exhausted every later call in the tree is refused.

Between the check and the answer a model call cannot be stopped half-way, so a tree can
overshoot its token or cost limit by the calls that were already in flight when it ran out
(at most one answer per running member); nothing starts after that.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import BudgetExceeded, CrewDefinitionError
from loom.messages import Message, ModelResponse, ToolSpec, Usage
from loom.models.base import Model, ModelSettings, StreamPart

__all__ = ["Budget", "BudgetScope", "BudgetedModel"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits for a crew tree (None: no limit on that axis).

    Args:
        tokens: Input + output tokens of every model call in the tree.
        cost_usd: Dollars, priced with ``prices`` (model name -> (input, output) USD per
            million tokens). A model without a price is refused when this is set.
        wall_seconds: Wall-clock seconds from the crew's start.
        max_depth: How many levels of member runs may sit below the crew that sets it: 1 (the
            default) lets a crew run its members but no member spawn a crew of its own
            (nested spawning is off by default); a nested crew's own budget caps further.
        max_fan_out: The most member runs one step may start at once (a parallel step's
            width, a graph's ready set, the delegations in one manager answer).
        max_spawns: Member runs in the whole tree (loops and delegations count each run).
    """

    tokens: int | None = None
    cost_usd: float | None = None
    wall_seconds: float | None = None
    max_depth: int = 1
    max_fan_out: int = 16
    max_spawns: int = 100
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tokens", "cost_usd", "wall_seconds"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise CrewDefinitionError(
                    f"must be a positive number or None, got {value!r}", field=f"budget.{name}"
                )
        for name in ("max_depth", "max_fan_out", "max_spawns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CrewDefinitionError(
                    f"must be an integer >= 1, got {value!r}", field=f"budget.{name}"
                )


class BudgetScope:
    """One crew run's (or one member run's) share of the budget, chained to its parent."""

    def __init__(
        self, budget: Budget | None, parent: BudgetScope | None = None, *, depth: int = 0
    ) -> None:
        self.budget = budget or Budget()
        self.parent = parent
        self.depth = depth
        self.started = time.monotonic()
        self.usage = Usage()
        self.cost = 0.0
        self.spawns = 0
        self.exhausted: BudgetExceeded | None = None  # the first refusal, sticky

    def child(self, budget: Budget | None = None, *, depth: int | None = None) -> BudgetScope:
        """A scope that draws from this one (and its ancestors); ``budget`` caps it further."""
        return BudgetScope(budget, self, depth=self.depth if depth is None else depth)

    def chain(self) -> list[BudgetScope]:
        out: list[BudgetScope] = []
        scope: BudgetScope | None = self
        while scope is not None:
            out.append(scope)
            scope = scope.parent
        return out

    def _refuse(self, name: str, message: str) -> BudgetExceeded:
        exc = BudgetExceeded(name, message)
        for scope in self.chain():  # every ancestor stays closed too: no later call slips by
            if scope.exhausted is None:
                scope.exhausted = exc
        return exc

    def check(self) -> None:
        """Raise ``BudgetExceeded`` unless every scope up the chain has something left."""
        for scope in self.chain():
            if scope.exhausted is not None:
                raise scope.exhausted
            b = scope.budget
            if b.tokens is not None and scope.usage.total_tokens >= b.tokens:
                raise self._refuse(
                    "tokens",
                    f"token budget exhausted: {scope.usage.total_tokens} of {b.tokens} tokens used",
                )
            if b.cost_usd is not None and scope.cost >= b.cost_usd:
                raise self._refuse(
                    "cost_usd",
                    f"cost budget exhausted: ${scope.cost:.4f} of ${b.cost_usd:.4f} spent",
                )
            if b.wall_seconds is not None:
                elapsed = time.monotonic() - scope.started
                if elapsed >= b.wall_seconds:
                    raise self._refuse(
                        "wall_seconds",
                        f"wall-time budget exhausted: {elapsed:.1f} s of {b.wall_seconds:g} s",
                    )

    def check_model(self, model_name: str) -> None:
        """``check``, and refuse a model no cost limit up the chain can price (fail closed)."""
        self.check()
        for scope in self.chain():
            if scope.budget.cost_usd is not None and _price(scope.budget, model_name) is None:
                why = (
                    f"no price is known for model {model_name!r}, so its cost cannot be "
                    "metered; add it to Budget(prices=...)"
                )
                raise self._refuse("cost_usd", why)

    def check_unmetered(self, what: str) -> None:
        """Refuse ``what`` (a member whose spending cannot be reported, e.g. a remote A2A
        agent) when any cost limit up the chain would have to trust it: fail closed."""
        for scope in self.chain():
            if scope.budget.cost_usd is not None:
                raise self._refuse(
                    "cost_usd",
                    f"{what} cannot report its cost, so it cannot "
                    "run under a cost_usd budget; drop the cost limit or run "
                    "a local member",
                )

    def check_spawn(self, depth: int) -> None:
        """Before starting one member run at ``depth``: depth, spawns, and everything ``check``
        looks at. Counts the spawn when it lets it through."""
        self.check()
        chain = self.chain()
        for scope in chain:
            b = scope.budget
            if depth - scope.depth > b.max_depth:  # depth below the crew that set the limit
                raise self._refuse(
                    "depth",
                    f"depth budget: a member {depth - scope.depth} "
                    f"levels below crew depth {scope.depth} exceeds max_depth="
                    f"{b.max_depth} (nested spawning is off unless "
                    "Budget(max_depth=...) allows it)",
                )
            if scope.spawns + 1 > b.max_spawns:
                raise self._refuse(
                    "spawns",
                    f"spawn budget: member run {scope.spawns + 1} "
                    f"exceeds max_spawns={b.max_spawns}",
                )
        for scope in chain:
            scope.spawns += 1

    def check_spawn_width(self, width: int) -> None:
        """Before one step starts ``width`` member runs at once (fan-out)."""
        self.check()
        for scope in self.chain():
            if width > scope.budget.max_fan_out:
                raise self._refuse(
                    "fan_out",
                    f"fan-out budget: {width} members at once exceed "
                    f"max_fan_out={scope.budget.max_fan_out}",
                )

    def charge(self, usage: Usage, model_name: str) -> None:
        """Add a model call's usage (and its price) to this scope and every ancestor."""
        for scope in self.chain():
            scope.usage = scope.usage + usage
            price = _price(scope.budget, model_name)
            if price is not None:
                scope.cost += (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / 1e6


def _price(budget: Budget, model_name: str) -> tuple[float, float] | None:
    prices = budget.prices
    return prices.get(model_name) or prices.get("*")


class BudgetedModel:
    """A member's model behind the tree budget: each call is checked before it starts and
    charged when it ends. A refused call raises ``BudgetExceeded``, which stops the member's
    turn with ``stop_reason="budget"``."""

    def __init__(self, inner: Model, scope: BudgetScope) -> None:
        self.inner = inner
        self.scope = scope
        self.name = getattr(inner, "name", type(inner).__name__)
        self.reports_real_usage = bool(getattr(inner, "reports_real_usage", True))
        window = getattr(inner, "context_window", None)
        if window is not None:
            self.context_window = window

    def __getattr__(self, name: str) -> Any:  # count_tokens etc. of the wrapped model
        return getattr(self.inner, name)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        self.scope.check_model(self.name)
        async for part in self.inner.stream(messages, tools, settings):
            if isinstance(part, ModelResponse) and part.usage is not None:
                self.scope.charge(part.usage, self.name)
            yield part
