"""What model calls cost: a price table per model and the cost of a ``Usage``.

Loom ships the list prices of the common OpenAI and Anthropic models (``loom/prices.json``,
US dollars per million tokens, with the date they were checked in ``as_of``). A run's model
calls are priced as they finish, so ``Usage.cost`` is on every ``LLM_COMPLETE`` event's usage,
on ``AGENT_FINISH`` and on ``RunResult.usage``.

The rule is *never a wrong number*: a model the table does not know, or tokens of a kind its
entry has no price for (cache writes of a model without a ``cache_write`` price), leave
``cost`` as ``None``. The embedded ``local`` model costs 0: it runs on your hardware and Loom
does not price electricity. Test doubles (``loom.testing``) are unknown, so ``None``.

Override or add prices with ``Runtime(prices={...})`` or a JSON / TOML file named by
``LOOM_PRICES`` (same shape as the shipped file: ``{"models": {"openai:gpt-4o": {"input": 2.5,
"output": 10, "cached_input": 1.25}}}``); an override replaces that model's whole entry.

How a model is found: the provider-qualified name (``openai:gpt-4o``), first with the model the
provider says answered (``gpt-4o-2024-08-06``) and then the one asked for; a dated snapshot
(``-2024-08-06``, ``-20250514``) or ``-latest`` falls back to its base name. Nothing else is
guessed: ``gpt-4o-audio-preview`` is not ``gpt-4o``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from loom.errors import ConfigurationError
from loom.messages import Usage

__all__ = ["Price", "PriceTable", "default_prices", "load_prices"]

_PER = 1_000_000
# a dated snapshot or alias of a base model: gpt-4o-2024-08-06, claude-sonnet-4-20250514, -latest
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices in dollars per million tokens. ``cached_input`` is for prompt tokens
    read from the provider's cache, ``cache_write`` for tokens written to it (Anthropic);
    ``None`` means the price is not known, so usage of that kind cannot be priced."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float | None:
        """The dollars ``usage`` cost at these prices, or None when a kind is unpriced."""
        read, write = usage.cache_read_tokens, usage.cache_write_tokens
        if (read and self.cached_input is None) or (write and self.cache_write is None):
            return None
        plain = max(usage.input_tokens - read - write, 0)  # cache tokens are part of input
        total = (
            plain * self.input
            + read * (self.cached_input or 0.0)
            + write * (self.cache_write or 0.0)
            + usage.output_tokens * self.output
        )
        return round(total / _PER, 10)  # no float dust such as 0.30000000000000004


def _price(model: str, raw: Any) -> Price:
    if isinstance(raw, Price):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigurationError(
            f"the price of {model!r} must be a mapping such as {{'input': 2.5, 'output': 10}}, "
            f"got {type(raw).__name__}"
        )
    unknown = set(raw) - {"input", "output", "cached_input", "cache_write"}
    if unknown:
        raise ConfigurationError(
            f"the price of {model!r} has unknown keys {sorted(unknown)}; use input, output, "
            "cached_input and cache_write (dollars per million tokens)"
        )
    values: dict[str, float | None] = {}
    for key in ("input", "output", "cached_input", "cache_write"):
        value = raw.get(key)
        if value is None:
            if key in ("input", "output"):
                raise ConfigurationError(
                    f"the price of {model!r} needs {key!r} (dollars per million tokens)"
                )
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigurationError(
                f"the {key} price of {model!r} must be a number >= 0 (dollars per million "
                f"tokens), got {value!r}"
            )
        values[key] = float(value)
    return Price(**values)  # type: ignore[arg-type]


class PriceTable:
    """Prices per model name (``provider:model``, or a bare name for any provider)."""

    def __init__(
        self, prices: Mapping[str, Price | Mapping[str, Any]], *, as_of: str | None = None
    ) -> None:
        self.prices = {str(name): _price(str(name), p) for name, p in prices.items()}
        self.as_of = as_of

    def __repr__(self) -> str:
        return f"PriceTable({len(self.prices)} models, as_of={self.as_of!r})"

    def with_overrides(self, overrides: Mapping[str, Any] | PriceTable | None) -> PriceTable:
        """A copy where each model in ``overrides`` has the given (whole) entry."""
        if not overrides:
            return self
        extra = overrides.prices if isinstance(overrides, PriceTable) else overrides
        table = PriceTable(self.prices, as_of=self.as_of)
        table.prices.update(PriceTable(extra).prices)
        return table

    def lookup(self, model: str, response_model: str | None = None) -> Price | None:
        """The price for a call to ``model`` (``Model.name``, e.g. ``openai:gpt-4o``) that the
        provider answered as ``response_model``; None when unknown."""
        provider, _, asked = model.partition(":") if ":" in model else ("", "", model)
        if provider == "local":
            return self.prices.get("local")
        names = [n for n in (response_model, asked) if n]
        for name in names:
            for candidate in (name, _SNAPSHOT.sub("", name)):
                for key in (f"{provider}:{candidate}" if provider else None, candidate):
                    if key is not None and key in self.prices:
                        return self.prices[key]
        return None

    def cost(self, usage: Usage, model: str, response_model: str | None = None) -> float | None:
        """The dollars ``usage`` of ``model`` cost, or None when the table cannot say."""
        price = self.lookup(model, response_model)
        return None if price is None else price.cost(usage)

    def priced(self, usage: Usage, model: str, response_model: str | None = None) -> Usage:
        """``usage`` with its ``cost`` set (None when unknown)."""
        cost = self.cost(usage, model, response_model)
        if cost is None and usage.cost is None:  # nothing to change (a model without a price)
            return usage
        return usage.model_copy(update={"cost": cost})


def load_prices(path: str | Path) -> PriceTable:
    """A price table from a JSON or TOML file shaped like ``loom/prices.json``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the price file {str(p)!r}: {exc}") from exc
    try:
        if p.suffix == ".toml":
            import tomllib

            data: Any = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"the price file {str(p)!r} does not parse: {exc}") from exc
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ConfigurationError(
            f"the price file {str(p)!r} needs a 'models' table of model name -> "
            "{input, output, cached_input, cache_write}"
        )
    as_of = data.get("as_of")
    return PriceTable(models, as_of=str(as_of) if as_of is not None else None)


@cache
def _shipped() -> PriceTable:
    raw = json.loads(resources.files("loom").joinpath("prices.json").read_text("utf-8"))
    return PriceTable(raw["models"], as_of=raw.get("as_of"))


def default_prices() -> PriceTable:
    """The shipped table, with the entries of the ``LOOM_PRICES`` file (if set) over it."""
    path = os.environ.get("LOOM_PRICES")
    if not path:
        return _shipped()
    return _with_file(path)


@cache
def _with_file(path: str) -> PriceTable:
    return _shipped().with_overrides(load_prices(path))
