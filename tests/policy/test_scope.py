"""Workspace scope: resolution through dir fds, links inside vs outside, read-only areas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loom.errors import ConfigurationError, ScopeViolation, ToolError
from loom.policy.scope import Workspace, workspace_of


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "README.md").write_text("hello\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return Workspace(root)


def read(ws: Workspace, path: str) -> bytes:
    with ws.open_read(path) as f:
        return f.read()


def test_plain_relative_and_absolute_paths_inside(ws: Workspace) -> None:
    assert read(ws, "README.md") == b"hello\n"
    assert read(ws, "./src/pkg/../pkg/mod.py") == b"x = 1\n"
    assert read(ws, str(ws.root / "src" / "pkg" / "mod.py")) == b"x = 1\n"
    assert ws.relative("src//pkg/./mod.py") == "src/pkg/mod.py"


def test_links_inside_the_workspace_are_followed_and_reported_resolved(ws: Workspace) -> None:
    os.symlink("src/pkg", ws.root / "alias")
    os.symlink("../README.md", ws.root / "src" / "readme-link")
    assert read(ws, "alias/mod.py") == b"x = 1\n"
    assert ws.relative("alias/mod.py") == "src/pkg/mod.py"
    assert read(ws, "src/readme-link") == b"hello\n"
    os.symlink(str(ws.root / "README.md"), ws.root / "abs-link")
    assert read(ws, "abs-link") == b"hello\n"


def test_write_atomic_creates_parents_and_replaces(ws: Workspace) -> None:
    assert ws.write_atomic("new/dir/file.txt", b"one") == "new/dir/file.txt"
    assert (ws.root / "new/dir/file.txt").read_bytes() == b"one"
    ws.write_atomic("new/dir/file.txt", b"two")
    assert (ws.root / "new/dir/file.txt").read_bytes() == b"two"
    assert not [p for p in (ws.root / "new/dir").iterdir() if "loom-tmp" in p.name]


def test_write_keeps_the_file_mode(ws: Workspace) -> None:
    script = ws.root / "run.sh"
    script.write_text("echo\n")
    script.chmod(0o755)
    ws.write_atomic("run.sh", b"echo hi\n")
    assert script.stat().st_mode & 0o777 == 0o755


def test_git_and_loom_are_readable_but_read_only(ws: Workspace) -> None:
    assert read(ws, ".git/config") == b"[core]\n"
    with pytest.raises(ScopeViolation) as info:
        ws.write_atomic(".git/config", b"x")
    assert info.value.code == "read_only"
    with pytest.raises(ScopeViolation):
        ws.write_atomic(".loom/permissions.yaml", b"default: allow")
    assert not (ws.root / ".loom").exists()


def test_missing_things_are_tool_errors_with_codes(ws: Workspace) -> None:
    with pytest.raises(ToolError) as info:
        read(ws, "nope.txt")
    assert info.value.code == "not_found"
    with pytest.raises(ToolError) as info:
        read(ws, "src")
    assert info.value.code == "is_directory"
    with pytest.raises(ToolError) as info:
        read(ws, "README.md/x")
    assert info.value.code == "not_a_directory"


def test_no_workspace_and_bad_root(tmp_path: Path) -> None:
    with pytest.raises(ScopeViolation) as info:
        workspace_of(None, tool="read_file")
    assert info.value.code == "no_workspace" and "workspace=" in str(info.value)
    with pytest.raises(ConfigurationError):
        Workspace(tmp_path / "missing")


def test_walk_does_not_follow_links_or_enter_git(ws: Workspace, tmp_path: Path) -> None:
    os.symlink(tmp_path, ws.root / "escape-dir")
    seen = [rel for rel, *_ in ws.walk(".")]
    assert "src/pkg/mod.py" in seen and "escape-dir" in seen
    assert not any(p.startswith("escape-dir/") for p in seen)
    assert not any(p.startswith(".git/") for p in seen)
