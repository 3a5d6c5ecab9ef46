"""``BuiltinTool``: a ``FunctionTool`` that also says which argument permission rules match."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from loom.tools.base import Effect, FunctionTool

__all__ = ["BuiltinTool", "SubjectKind", "builtin"]

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
