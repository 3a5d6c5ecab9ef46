"""Policy: workspace scope, permission rules, shell command analysis and human approval.

Names load lazily; see ``loom.policy.scope``, ``loom.policy.permissions``,
``loom.policy.shell`` and ``loom.policy.approval``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.policy.approval import ApprovalDecision, Approve, Edit, PendingApproval, Reject
    from loom.policy.permissions import PermissionManager, PermissionRule
    from loom.policy.scope import Workspace

_EXPORTS = {
    "Approve": "loom.policy.approval",
    "ApprovalDecision": "loom.policy.approval",
    "Edit": "loom.policy.approval",
    "PendingApproval": "loom.policy.approval",
    "Reject": "loom.policy.approval",
    "PermissionManager": "loom.policy.permissions",
    "PermissionRule": "loom.policy.permissions",
    "Workspace": "loom.policy.scope",
}

__all__ = [
    "ApprovalDecision",
    "Approve",
    "Edit",
    "PendingApproval",
    "PermissionManager",
    "PermissionRule",
    "Reject",
    "Workspace",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'loom.policy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
