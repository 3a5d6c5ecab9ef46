"""Workspace scope: file tools reach the workspace root and nothing else (seed 004 invariant 6).

Paths are resolved component by component through directory file descriptors, never by
comparing strings. Each directory is opened with ``O_NOFOLLOW`` relative to the one before, so
a component swapped for a symlink between two checks fails the open instead of being followed
(TOCTOU). Symlinks are followed only by reading them and resolving their target the same way;
a target that leaves the root, a ``..`` that climbs above it, and an absolute path elsewhere
are refused with ``ScopeViolation``. ``.git/`` and ``.loom/`` are read-only by default.

```python
ws = Workspace("/repo")
with ws.open_read("src/app.py") as f:  # a binary file object, or ScopeViolation
    data = f.read()
ws.write_atomic("docs/notes.md", b"...")  # temp file + fsync + rename, parents created
```
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from loom.errors import ConfigurationError, ScopeViolation, ToolError

__all__ = ["DEFAULT_READ_ONLY", "Target", "Workspace", "workspace_of"]

DEFAULT_READ_ONLY: tuple[str, ...] = (".git", ".loom")
_MAX_LINK_HOPS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(slots=True)
class Target:
    """A resolved path: its parent directory (open), its final name, its workspace-relative form.

    ``name`` is None when the target is the workspace root itself. ``exists`` says whether the
    final name was present during resolution. Close with ``close()`` (or use ``with``).
    """

    dir_fd: int
    name: str | None
    rel: str
    exists: bool
    _fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Workspace:
    """The root directory file tools may use, and the checks that keep them inside it.

    Args:
        root: An existing directory. Symlinks in the root's own path are resolved once, here.
        read_only: Top-level names tools may read but not write (default ``.git``, ``.loom``).
    """

    __slots__ = ("_given", "read_only", "root")

    def __init__(self, root: str | Path, *, read_only: tuple[str, ...] = DEFAULT_READ_ONLY):
        given = os.path.abspath(os.fspath(root))
        real = os.path.realpath(given)
        if not os.path.isdir(real):
            raise ConfigurationError(
                f"workspace {given!r} is not an existing directory; create it or pass another"
            )
        self.root = Path(real)
        self._given = given
        self.read_only = tuple(n.casefold() for n in read_only)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    # -- resolution ---------------------------------------------------------------------------
    def _components(self, path: str) -> list[str]:
        if not isinstance(path, str) or not path.strip():
            raise ScopeViolation("the path is empty; give a path relative to the workspace root")
        if "\x00" in path:
            raise ScopeViolation("the path contains a NUL byte")
        if path.startswith("~"):
            raise ScopeViolation(
                f"{path!r}: '~' paths are outside the workspace; use a path relative to its root"
            )
        if not path.startswith("/"):
            return path.split("/")
        return self._strip_root(path, shown=path)

    def _strip_root(self, path: str, *, shown: str) -> list[str]:
        parts = [p for p in path.split("/") if p]
        for root in (str(self.root), self._given):
            r = [p for p in root.split("/") if p]
            if parts[: len(r)] == r:
                return parts[len(r) :]
        raise ScopeViolation(
            f"{shown!r} is outside the workspace {str(self.root)!r}; "
            "use a path relative to the workspace root"
        )

    def _open_root(self) -> int:
        try:
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise ToolError(f"the workspace root cannot be opened: {exc.strerror}") from None

    def resolve(self, path: str, *, write: bool = False, create_parents: bool = False) -> Target:
        """Walk ``path`` from the root, following links only while they stay inside.

        Raises ``ScopeViolation`` for every escape and for writes into read-only areas, and
        ``ToolError(code="not_found")`` when a parent directory is missing (unless
        ``create_parents``).
        """
        todo = self._components(path)
        fds = [self._open_root()]
        stack: list[str] = []
        hops = retries = 0
        try:
            while todo:
                comp = todo.pop(0)
                if comp in ("", "."):
                    continue
                if comp == "..":
                    if not stack:
                        raise ScopeViolation(
                            f"{path!r} climbs above the workspace root with '..'; "
                            "stay inside the workspace"
                        )
                    stack.pop()
                    os.close(fds.pop())
                    continue
                if write and not stack and comp.casefold() in self.read_only:
                    raise ScopeViolation(
                        f"{path!r} is inside {comp}/, which is read-only to tools",
                        code="read_only",
                    )
                last = not any(c not in ("", ".") for c in todo)
                cur = fds[-1]
                try:
                    st = os.stat(comp, dir_fd=cur, follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return Target(cur, comp, "/".join([*stack, comp]), False, fds)
                    if not create_parents:
                        raise ToolError(
                            f"{path!r}: directory {'/'.join([*stack, comp])!r} does not exist",
                            code="not_found",
                        ) from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(comp, 0o777, dir_fd=cur)
                    retries += 1
                    if retries > 100:
                        raise ScopeViolation(
                            f"{path!r} keeps changing while it is created"
                        ) from None
                    todo.insert(0, comp)  # look again: it may be a link someone just made
                    continue
                except OSError as exc:
                    raise ToolError(f"{path!r}: {exc.strerror}", code="os_error") from None
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > _MAX_LINK_HOPS:
                        raise ScopeViolation(f"{path!r}: too many symbolic links (a loop?)")
                    try:
                        link = os.readlink(comp, dir_fd=cur)
                    except OSError:  # replaced since the stat: resolve it again
                        retries += 1
                        if retries > 100:
                            raise ScopeViolation(f"{path!r} keeps changing") from None
                        hops -= 1
                        todo.insert(0, comp)
                        continue
                    if link.startswith("/"):
                        where = "/".join([*stack, comp])
                        rest = self._strip_root(link, shown=f"{where} -> {link}")
                        for fd in fds[1:]:
                            os.close(fd)
                        del fds[1:]
                        stack.clear()
                        todo[:0] = rest
                    else:
                        todo[:0] = link.split("/")
                    continue
                if last:
                    return Target(cur, comp, "/".join([*stack, comp]), True, fds)
                try:
                    fds.append(os.open(comp, _DIR_FLAGS, dir_fd=cur))
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOENT) and retries < 100:
                        retries += 1
                        todo.insert(0, comp)  # changed since the stat: resolve it again
                        continue
                    if exc.errno == errno.ELOOP:
                        raise ScopeViolation(
                            f"{path!r} keeps changing while it is being checked; refusing it"
                        ) from None
                    if exc.errno == errno.ENOTDIR:
                        raise ToolError(
                            f"{path!r}: {'/'.join([*stack, comp])!r} is not a directory",
                            code="not_a_directory",
                        ) from None
                    raise ToolError(f"{path!r}: {exc.strerror}", code="os_error") from None
                stack.append(comp)
            return Target(fds[-1], None, "/".join(stack) or ".", True, fds)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise

    def relative(self, path: str) -> str:
        """The workspace-relative form of ``path`` after resolving links (for rules, display)."""
        with self.resolve(path) as t:
            return t.rel

    # -- operations ---------------------------------------------------------------------------
    def _open_final(self, t: Target, flags: int, path: str) -> int:
        if t.name is None:
            raise ToolError(f"{path!r} is the workspace root, a directory", code="is_directory")
        if not t.exists:
            raise ToolError(f"{path!r} does not exist", code="not_found")
        try:
            return os.open(t.name, flags, dir_fd=t.dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ScopeViolation(
                    f"{path!r} changed into a symbolic link while it was being checked; "
                    "refusing to follow it"
                ) from None
            if exc.errno == errno.ENOENT:
                raise ToolError(f"{path!r} does not exist", code="not_found") from None
            if exc.errno == errno.ENOTDIR:
                raise ToolError(f"{path!r} is not a directory", code="not_a_directory") from None
            raise ToolError(f"{path!r}: {exc.strerror}", code="os_error") from None

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[IO[bytes]]:
        """Open a regular file inside the workspace for reading (binary)."""
        with self.resolve(path) as t:
            fd = self._open_final(t, _FILE_FLAGS, path)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            code = "is_directory" if stat.S_ISDIR(st.st_mode) else "not_a_file"
            raise ToolError(f"{path!r} is {kind}", code=code)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            yield f

    def open_dir(self, path: str) -> tuple[int, str]:
        """An open directory fd inside the workspace and its relative path; close the fd."""
        with self.resolve(path) as t:
            if t.name is None:
                return os.dup(t.dir_fd), t.rel
            return self._open_final(t, _DIR_FLAGS, path), t.rel

    def write_atomic(self, path: str, data: bytes, *, create_parents: bool = True) -> str:
        """Replace (or create) a file with ``data``: temp file, fsync, rename. Returns its path.

        The file appears complete or not at all; a crash leaves the old content in place.
        """
        with self.resolve(path, write=True, create_parents=create_parents) as t:
            if t.name is None:
                raise ToolError(f"{path!r} is the workspace root", code="is_directory")
            mode = 0o644
            if t.exists:
                st = os.stat(t.name, dir_fd=t.dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{path!r} is a directory", code="is_directory")
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(f"{path!r} is not a regular file", code="not_a_file")
                mode = stat.S_IMODE(st.st_mode)
            tmp = f".{t.name[:100]}.{secrets.token_hex(4)}.loom-tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, mode, dir_fd=t.dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, t.name, src_dir_fd=t.dir_fd, dst_dir_fd=t.dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=t.dir_fd)
                raise
            with contextlib.suppress(OSError):  # make the rename itself durable
                os.fsync(t.dir_fd)
            return t.rel

    def walk(
        self, path: str = ".", *, skip: tuple[str, ...] = DEFAULT_READ_ONLY
    ) -> Iterator[tuple[str, str, int, os.stat_result]]:
        """Yield ``(relative path, name, parent dir fd, lstat)`` for everything below ``path``.

        Symlinks are reported (as links) but never followed; top-level names in ``skip`` are
        not entered. The parent fd is valid only until the next item.
        """
        fd, rel = self.open_dir(path)
        base = "" if rel == "." else rel
        yield from self._walk_fd(fd, base, skip)

    def _walk_fd(
        self, fd: int, base: str, skip: tuple[str, ...]
    ) -> Iterator[tuple[str, str, int, os.stat_result]]:
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                rel = f"{base}/{e.name}" if base else e.name
                try:
                    st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                yield rel, e.name, fd, st
                if stat.S_ISDIR(st.st_mode) and not (not base and e.name in skip):
                    try:
                        sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue  # vanished or swapped for a link: skip it
                    yield from self._walk_fd(sub, rel, skip)
        finally:
            os.close(fd)


_cache: dict[tuple[str, tuple[str, ...]], Workspace] = {}


def workspace_of(root: str | Path | None, *, tool: str = "this tool") -> Workspace:
    """The ``Workspace`` for a ``RunContext.workspace``; a clear error when there is none."""
    if root is None:
        raise ScopeViolation(
            f"{tool} works on files in the agent's workspace, and this agent has none. "
            "Create the agent with Agent(..., workspace='path/to/dir').",
            code="no_workspace",
        )
    key = (os.fspath(root), DEFAULT_READ_ONLY)
    ws = _cache.get(key)
    if ws is None:
        ws = _cache[key] = Workspace(root)
    return ws
