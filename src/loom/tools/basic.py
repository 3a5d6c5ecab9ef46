"""A few small built-in tools, handy for demos and for the local model."""

from __future__ import annotations

from datetime import datetime

from loom.tools.base import tool


@tool(effect="pure", blocking=False)
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    total = a + b
    return int(total) if float(total).is_integer() else total


@tool(effect="pure", blocking=False)
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    product = a * b
    return int(product) if float(product).is_integer() else product


@tool(effect="pure", blocking=False)
def current_time() -> str:
    """Return the current local date and time in ISO 8601 format."""
    return datetime.now().astimezone().isoformat(timespec="seconds")
