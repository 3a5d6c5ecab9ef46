"""Tools that run in the agent's sandbox when it is on (``bash``, ``python``): their effect
class follows the setting.

A sandboxed call works on a session workspace that is snapshotted after each committed step
and restored from the newest snapshot when the sandbox is made again, so running it again
after a crash starts from the same files: ``idempotent``. The same tool on the host keeps its
own effect (``bash``: ``at_most_once``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from loom.sandbox.sessions import AgentSandbox
from loom.tools.base import Effect, Tool
from loom.tools.builtin._base import BuiltinTool, SubjectKind

__all__ = ["SandboxAwareTool", "runs_sandboxed", "with_sandbox_effects"]


class SandboxAwareTool(BuiltinTool):
    """A built-in tool that runs in the sandbox when the agent's setting says so.
    ``sandbox_default``: whether it does when the agent did not set ``sandbox:``."""

    __slots__ = ("effect_on_host", "effect_sandboxed", "sandbox_default")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        sandbox_default: bool,
        effect_on_host: Effect,
        effect_sandboxed: Effect = "idempotent",
        subject: tuple[str, SubjectKind] | None,
        timeout: float | None = None,
    ) -> None:
        effect = effect_sandboxed if sandbox_default else effect_on_host
        super().__init__(fn, effect=effect, subject=subject, timeout=timeout)
        self.sandbox_default = sandbox_default
        self.effect_on_host = effect_on_host
        self.effect_sandboxed = effect_sandboxed


def runs_sandboxed(setting: AgentSandbox | None, *, default: bool) -> bool:
    """Whether a tool whose default is ``default`` runs in the sandbox under ``setting``."""
    if setting is None or setting.enabled is None:
        return default
    return setting.enabled


def with_sandbox_effects(
    tools: Mapping[str, Tool], setting: AgentSandbox
) -> tuple[dict[str, Tool], AgentSandbox]:
    """``tools`` with each sandbox-aware tool's effect set for ``setting`` (a copy of the
    tool where it changes: the built-in objects are shared by every agent), and ``setting``
    with ``in_use`` set when one of them runs sandboxed."""
    in_use: list[bool] = []
    out: dict[str, Tool] = {}
    for name, t in tools.items():
        if isinstance(t, SandboxAwareTool):
            sandboxed = runs_sandboxed(setting, default=t.sandbox_default)
            in_use.append(sandboxed)
            effect = t.effect_sandboxed if sandboxed else t.effect_on_host
            if effect != t.effect:
                t = copy.copy(t)
                t.effect = effect
        out[name] = t
    return out, replace(setting, in_use=any(in_use))
