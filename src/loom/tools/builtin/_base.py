"""``BuiltinTool``: a ``FunctionTool`` that also says which argument permission rules match."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from loom.text import representable
from loom.tools.base import Effect, FunctionTool

__all__ = ["BuiltinTool", "NameEscapes", "SubjectKind", "builtin", "decode_counting"]

SubjectKind = Literal["path", "command", "url", "text"]


class BuiltinTool(FunctionTool):
    """A function tool with a permission subject: ``("path", "path")`` means rules such as
    ``write_file(docs/**)`` match the ``path`` argument as a workspace path."""

    __slots__ = ("permission_subject",)

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        effect: Effect,
        subject: tuple[str, SubjectKind] | None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(fn, effect=effect, timeout=timeout)
        self.permission_subject = subject


def builtin(
    *, effect: Effect, subject: tuple[str, SubjectKind] | None = None, timeout: float | None = None
) -> Callable[[Callable[..., Any]], BuiltinTool]:
    def wrap(fn: Callable[..., Any]) -> BuiltinTool:
        return BuiltinTool(fn, effect=effect, subject=subject, timeout=timeout)

    return wrap


class NameEscapes:
    """Makes file names storable and counts those that had to be escaped.

    A name that is not UTF-8 comes from ``os.listdir`` with lone surrogates; it is shown with
    ``\\xNN`` escapes for its undecodable bytes (``loom.text.representable``), and ``note()``
    says so in the tool's output.
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, name: str) -> str:
        shown, changed = representable(name)
        self.count += changed
        return shown

    def note(self) -> str | None:
        """A closing line for the output, or None when every name was valid UTF-8."""
        if not self.count:
            return None
        n = self.count
        return (
            f"[{n} name{'s are' if n > 1 else ' is'} not valid UTF-8: undecodable bytes are "
            "shown as \\xNN escapes, and file tools cannot open such a path by the escaped name]"
        )


def decode_counting(raw: bytes) -> tuple[str, bool]:
    """UTF-8 text of ``raw``, undecodable bytes replaced by U+FFFD; whether any were."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True
