"""``/undo``, ``/retry`` and ``/edit TEXT`` in ``loom chat``: the session's branch operations
(``loom.engine.branching``) on its last turn.

- ``/undo`` rewinds the last turn (``Rewind``): its messages leave the transcript and stay in
  the journal (``loom sessions branches`` shows them);
- ``/retry`` answers the last message again (``Regenerate``);
- ``/edit TEXT`` replaces the last message with TEXT and answers it (``Edit``).

Calls with effects in the dropped turns follow the agent's ``branch_effects`` (noted by
default; ``refuse`` makes the command fail, naming them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loom.engine.run_inputs import BranchInput
    from loom.messages import Message

__all__ = ["BRANCH_COMMANDS", "HELP", "branch_input", "is_branch_command"]

BRANCH_COMMANDS = ("/undo", "/retry", "/edit")
HELP = (
    "/undo takes back the last turn, /retry answers it again, /edit TEXT replaces your last message"
)


def is_branch_command(line: str) -> bool:
    """Whether ``line`` is one of ``BRANCH_COMMANDS``."""
    return line.split(maxsplit=1)[0] in BRANCH_COMMANDS if line.strip() else False


def branch_input(line: str, messages: Sequence[Message]) -> BranchInput:
    """The run input a chat command asks for, given the session's transcript. ``BranchError``
    when the session has no turn to act on, ``InputError`` for ``/edit`` without text."""
    from loom.engine.run_inputs import AtTurn, Edit, Regenerate, Rewind
    from loom.errors import BranchError, InputError

    command, _, rest = line.strip().partition(" ")
    turns = sum(1 for m in messages if m.role == "user")
    if turns == 0:
        raise BranchError(f"{command}: the session has no message yet; say something first")
    if command == "/undo":
        return Rewind(AtTurn(turns - 1))
    if command == "/retry":
        return Regenerate()
    text = rest.strip()
    if not text:
        raise InputError("usage: /edit TEXT (TEXT replaces your last message and is answered)")
    return Edit(turns - 1, text)
