"""Sandboxes for agent-generated code (issue #32): the seam is :mod:`loom.sandbox.base`."""

from loom.sandbox.base import (
    ExecResult,
    LimitHit,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    SandboxUnavailable,
    Snapshot,
)

__all__ = [
    "ExecResult",
    "LimitHit",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxLimits",
    "SandboxSettings",
    "SandboxUnavailable",
    "Snapshot",
]
