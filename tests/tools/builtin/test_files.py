"""read_file, write_file, edit_file, list_dir, glob, grep: behaviour, caps and error codes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall
from loom.errors import ToolError
from loom.testing import ScriptedModel
from loom.tools.base import RunContext
from loom.tools.builtin import files, search
from loom.tools.registry import builtin_tool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("def main():\n    print('hi')\n\n\nmain()\n")
    (ws / "src" / "util.py").write_text("X = 1\nY = 2\n")
    (ws / "docs").mkdir()
    (ws / "docs" / "guide.md").write_text("# Guide\nTODO: write\n")
    (ws / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return ws


def ctx(root: Path | None) -> RunContext:
    return RunContext("s", "r", "c", workspace=root)


def run(tool: Any, root: Path | None, **kwargs: Any) -> Any:
    return tool.fn(ctx(root), **kwargs)


def test_effects_are_declared() -> None:
    effects = {
        n: builtin_tool(n).effect
        for n in ("read_file", "write_file", "edit_file", "list_dir", "glob", "grep")
    }
    assert effects == {
        "read_file": "pure",
        "write_file": "idempotent",
        "edit_file": "at_most_once",
        "list_dir": "pure",
        "glob": "pure",
        "grep": "pure",
    }


def test_read_file_whole_and_ranges(root: Path) -> None:
    assert run(files.read_file, root, path="src/util.py") == "X = 1\nY = 2\n"
    part = run(files.read_file, root, path="src/app.py", start_line=2, max_lines=1)
    assert part.startswith("    print('hi')\n")
    assert "start_line=3" in part
    with pytest.raises(ToolError) as info:
        run(files.read_file, root, path="src/util.py", start_line=10)
    assert info.value.code == "invalid_arguments"


def test_read_file_refuses_binary_and_caps_size(root: Path) -> None:
    with pytest.raises(ToolError) as info:
        run(files.read_file, root, path="blob.bin")
    assert info.value.code == "binary_file"
    big = root / "big.txt"
    big.write_text(("x" * 99 + "\n") * 5000)  # 500 KB
    text = run(files.read_file, root, path="big.txt", max_lines=100_000)
    assert len(text.encode()) <= files.MAX_READ_BYTES + 300
    assert "read cap" in text and "start_line=" in text


def test_write_file_atomic_create_and_replace(root: Path) -> None:
    assert run(files.write_file, root, path="docs/new/a.md", content="one").startswith("created")
    assert run(files.write_file, root, path="docs/new/a.md", content="two").startswith("replaced")
    assert (root / "docs/new/a.md").read_text() == "two"
    with pytest.raises(ToolError) as info:
        run(files.write_file, root, path=".git/HEAD", content="x")
    assert info.value.code == "read_only"


def test_edit_file_unique_replace_with_diff(root: Path) -> None:
    out = run(files.edit_file, root, path="src/util.py", old_string="Y = 2", new_string="Y = 3")
    assert "-Y = 2" in out and "+Y = 3" in out and "a/src/util.py" in out
    assert (root / "src/util.py").read_text() == "X = 1\nY = 3\n"


def test_edit_file_errors(root: Path) -> None:
    (root / "dup.txt").write_text("a\na\n")
    with pytest.raises(ToolError) as info:
        run(files.edit_file, root, path="dup.txt", old_string="a", new_string="b")
    assert info.value.code == "not_unique" and "2 times" in str(info.value)
    assert run(
        files.edit_file, root, path="dup.txt", old_string="a", new_string="b", replace_all=True
    ).startswith("replaced 2 occurrences")
    with pytest.raises(ToolError) as info:
        run(files.edit_file, root, path="dup.txt", old_string="zzz", new_string="y")
    assert info.value.code == "no_match"
    with pytest.raises(ToolError) as info:
        run(files.edit_file, root, path=".git/HEAD", old_string="ref", new_string="x")
    assert info.value.code == "read_only"


def test_list_dir(root: Path) -> None:
    os.symlink("src/app.py", root / "link.py")
    out = run(files.list_dir, root, path=".")
    lines = out.splitlines()
    assert "src/" in lines and "docs/" in lines and "link.py -> src/app.py" in lines
    assert any(line.startswith("blob.bin") and "bytes" in line for line in lines)


def test_glob(root: Path) -> None:
    assert run(search.glob, root, pattern="**/*.py").splitlines() == ["src/app.py", "src/util.py"]
    assert run(search.glob, root, pattern="*.py", path="src").splitlines() == [
        "src/app.py",
        "src/util.py",
    ]
    assert run(search.glob, root, pattern="*.py").startswith("no files match")
    assert ".git/HEAD" not in run(search.glob, root, pattern="**")
    capped = run(search.glob, root, pattern="**", max_results=2)
    assert "more matches not shown" in capped


def test_grep(root: Path) -> None:
    out = run(search.grep, root, pattern=r"TODO|print")
    assert out.splitlines() == ["docs/guide.md:2: TODO: write", "src/app.py:2:     print('hi')"]
    assert run(search.grep, root, pattern="todo", ignore_case=True, include="**/*.md") == (
        "docs/guide.md:2: TODO: write"
    )
    assert run(search.grep, root, pattern="X", path="src/util.py") == "src/util.py:1: X = 1"
    assert "max_matches=1" in run(search.grep, root, pattern=".", max_matches=1)
    with pytest.raises(ToolError) as info:
        run(search.grep, root, pattern="(")
    assert info.value.code == "invalid_regex"


def test_file_tools_without_a_workspace_refuse_clearly() -> None:
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(name="read_file", arguments={"path": "x"})]),
            ModelResponse(text="ok"),
        ]
    )
    agent = Agent(model=model, tools=["read_file"])
    result = agent.run_sync("read x")
    tool_msg = next(m for m in result.messages if m.role == "tool")
    assert tool_msg.metadata["error_code"] == "no_workspace"
    assert "workspace=" in tool_msg.content


def test_agent_uses_builtin_tools_by_name(root: Path) -> None:
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="grep", arguments={"pattern": "Y ="}),
                    ToolCall(
                        name="edit_file",
                        arguments={
                            "path": "src/util.py",
                            "old_string": "Y = 2",
                            "new_string": "Y = 20",
                        },
                    ),
                ]
            ),
            ModelResponse(text="done"),
        ]
    )
    agent = Agent(
        model=model,
        tools=["grep", "edit_file"],
        workspace=root,
        permissions={"allow": ["grep", "edit_file(src/**)"]},
    )
    result = agent.run_sync("bump Y")
    assert result.stop_reason == "completed"
    assert (root / "src/util.py").read_text() == "X = 1\nY = 20\n"


# -- names and contents that are not UTF-8 (issue #12 item 1) ----------------------------------
def _non_utf8_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    with open(os.path.join(os.fsencode(ws), b"\xff.txt"), "wb") as f:
        f.write(b"needle here\n")
    (ws / "sub" / "latin.txt").write_bytes(b"caf\xe9 needle\n")
    return ws


def test_non_utf8_names_are_escaped_and_said_so(tmp_path: Path) -> None:
    ws = _non_utf8_workspace(tmp_path)
    c = RunContext("s", "r", "c", workspace=ws)
    listed = files.list_dir.fn(c, path=".")
    found = search.glob.fn(c, pattern="**/*.txt")
    grepped = search.grep.fn(c, pattern="needle")
    for out in (listed, found, grepped):
        out.encode("utf-8")  # no lone surrogates left
        assert "\\xff.txt" in out
        assert "1 name is not valid UTF-8" in out
    assert "sub/latin.txt:1: caf\ufffd needle" in grepped
    assert "1 file with matches is not valid UTF-8" in grepped


def test_read_file_says_when_bytes_were_replaced(tmp_path: Path) -> None:
    ws = _non_utf8_workspace(tmp_path)
    out = files.read_file.fn(RunContext("s", "r", "c", workspace=ws), path="sub/latin.txt")
    assert out.startswith("caf\ufffd needle\n")
    assert "1 line of sub/latin.txt held bytes that are not valid UTF-8" in out


def test_edit_file_refuses_to_corrupt_a_non_utf8_file(tmp_path: Path) -> None:
    ws = _non_utf8_workspace(tmp_path)
    with pytest.raises(ToolError, match="not valid UTF-8") as info:
        files.edit_file.fn(
            RunContext("s", "r", "c", workspace=ws),
            path="sub/latin.txt",
            old_string="needle",
            new_string="pin",
        )
    assert info.value.code == "not_utf8"
    assert (ws / "sub" / "latin.txt").read_bytes() == b"caf\xe9 needle\n"


async def test_a_session_listing_a_non_utf8_name_keeps_working(tmp_path: Path) -> None:
    ws = _non_utf8_workspace(tmp_path)
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(name="list_dir", arguments={})]),
            "listed",
            "second turn",
        ]
    )
    agent = Agent(model=model, tools=["list_dir"], workspace=ws)
    first = await agent.run("list", session_id="s")
    assert first.stop_reason == "completed", first.error
    second = await agent.run("again", session_id="s")
    assert second.stop_reason == "completed", second.error
