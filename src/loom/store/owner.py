"""``Owner``: which process holds something (a SQLite session lock, a schedule run), and whether
it certainly died.

A process is its host, pid and start time (Linux clock ticks), so a pid the kernel reused for
another process is told apart. On another host nothing can be judged: such an owner counts as
alive, and what it holds is freed by a lease that runs out instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

__all__ = ["Owner", "proc_stat"]


def proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: ``state`` first, then
    ``ppid``, ... (field N of proc(5) is index N - 3). The name is in parentheses and may hold
    spaces or ``)``, so the fields are split after the last ``)``. Raises ``OSError``
    (``FileNotFoundError`` when there is no such process)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().decode(errors="replace")
    return stat[stat.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (Linux), to tell a live pid from a reused one."""
    try:
        fields = proc_stat(pid)
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return 0


@dataclass(frozen=True, slots=True)
class Owner:
    """A process: ``host``, ``pid`` and ``start_ticks`` (0: unknown)."""

    host: str
    pid: int
    start_ticks: int

    @classmethod
    def me(cls) -> Owner:
        """This process."""
        return cls(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()) or 0)

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        """The owner written by ``str(owner)`` (``host:pid:start_ticks``), or None."""
        host, _, rest = text.partition(":")
        pid, _, ticks = rest.partition(":")
        try:
            return cls(host, int(pid), int(ticks or 0))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.start_ticks}"

    def alive(self) -> bool:
        """False only when the owner certainly died: same host and its pid is gone or reused."""
        if self.host != socket.gethostname():
            return True
        ticks = _start_ticks(self.pid)
        if ticks is None:
            if os.path.isdir("/proc/self"):
                return False
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return not (ticks and self.start_ticks and ticks != self.start_ticks)
