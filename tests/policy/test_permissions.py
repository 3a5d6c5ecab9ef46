"""PermissionManager: rule syntax, precedence, patterns per tool kind, safe mode, project file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall
from loom.errors import ConfigurationError, PermissionsFileError
from loom.policy.permissions import PermissionManager, PermissionRule, build_permissions
from loom.testing import ScriptedModel
from loom.tools.registry import builtin_tool


def verdict(pm: PermissionManager, name: str, workspace: Path | None = None, **args: Any) -> str:
    tool = builtin_tool(name) if name in ("bash", "write_file", "read_file", "web_fetch") else None
    return pm.check(ToolCall(name=name, arguments=args), tool, workspace=workspace).action


def test_seed_form_and_default_ask() -> None:
    pm = PermissionManager({"bash": "deny", "read_file": "allow"}, default="ask")
    assert verdict(pm, "bash", command="ls") == "deny"
    assert verdict(pm, "read_file", path="a") == "allow"
    assert verdict(pm, "my_tool", x=1) == "ask"


def test_deny_beats_ask_beats_allow() -> None:
    pm = PermissionManager(
        {"allow": ["bash(git *)"], "ask": ["bash(git push*)"], "deny": ["bash(git push --force*)"]}
    )
    assert verdict(pm, "bash", command="git log") == "allow"
    assert verdict(pm, "bash", command="git push origin") == "ask"
    assert verdict(pm, "bash", command="git push --force origin") == "deny"


def test_path_patterns_use_glob_segments(tmp_path: Path) -> None:
    pm = PermissionManager({"allow": ["write_file(docs/**)", "write_file(*.md)"]})
    assert verdict(pm, "write_file", tmp_path, path="docs/a/b.md") == "allow"
    assert verdict(pm, "write_file", tmp_path, path="README.md") == "allow"
    assert verdict(pm, "write_file", tmp_path, path="src/README.md") == "ask"
    assert verdict(pm, "write_file", tmp_path, path="docs/../src/x.py") == "ask"


def test_path_rules_see_through_symlinks(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "code").symlink_to("../src")
    pm = PermissionManager({"allow": ["write_file(docs/**)"], "deny": ["write_file(src/**)"]})
    assert verdict(pm, "write_file", tmp_path, path="docs/code/x.py") == "deny"


def test_bash_rules_match_every_subcommand() -> None:
    pm = PermissionManager({"allow": ["bash(git status*)", "bash(ls*)"]})
    assert verdict(pm, "bash", command="git status --short") == "allow"
    assert verdict(pm, "bash", command="git status && ls -la") == "allow"
    assert verdict(pm, "bash", command="git status && rm -rf x") == "ask"
    assert verdict(pm, "bash", command="git status | sh") == "ask"


def test_explicitly_named_constructs_may_be_allowed() -> None:
    pm = PermissionManager(
        {"allow": ["bash(echo *)", "bash(echo * > notes.txt)", "bash(xargs grep *)", "bash(ls*)"]}
    )
    assert verdict(pm, "bash", command="echo hi > notes.txt") == "allow"
    assert verdict(pm, "bash", command="echo hi > other.txt") == "ask"
    assert verdict(pm, "bash", command="ls | xargs grep foo") == "allow"
    assert verdict(pm, "bash", command="ls | xargs rm") == "ask"


def test_an_explicitly_allowed_assignment_may_run() -> None:
    pm = PermissionManager({"allow": ["bash(git status*)", "bash(PATH=/opt/bin:* git status*)"]})
    assert verdict(pm, "bash", command="PATH=/opt/bin:/usr/bin git status") == "allow"
    assert verdict(pm, "bash", command="PATH=/tmp git status") == "ask"


def test_without_bashlex_the_reason_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from loom.policy import shell

    monkeypatch.setitem(sys.modules, "bashlex", None)  # import bashlex raises ImportError
    shell.analyze.cache_clear()
    try:
        pm = PermissionManager({"allow": ["bash"]})
        v = pm.check(ToolCall(name="bash", arguments={"command": "ls"}), builtin_tool("bash"))
    finally:
        shell.analyze.cache_clear()
    assert v.action == "ask"
    assert "pip install 'loom-agents[tools]'" in v.reason
    assert "ModuleNotFoundError" not in v.reason


def test_a_binary_project_file_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / ".loom").mkdir()
    bad = tmp_path / ".loom" / "permissions.yaml"
    bad.write_bytes(b"\xff\xfe\x00allow: [x]")
    with pytest.raises(PermissionsFileError, match="not UTF-8 text") as info:
        build_permissions(None, tmp_path)
    assert info.value.path == str(bad)
    assert str(bad) in str(info.value) and "UTF-8 YAML" in str(info.value)


def test_safe_mode_asks_for_everything_not_denied() -> None:
    pm = PermissionManager({"allow": ["read_file"], "deny": ["bash"]}, safe_mode=True)
    assert verdict(pm, "read_file", path="a") == "ask"
    assert verdict(pm, "bash", command="ls") == "deny"
    assert "safe mode" in pm.check(ToolCall(name="read_file", arguments={"path": "a"})).reason


def test_other_tools_match_their_arguments_as_json() -> None:
    pm = PermissionManager({"allow": ['send_mail(*"to":"*@example.com"*)']})
    assert verdict(pm, "send_mail", to="bob@example.com", body="hi") == "allow"
    assert verdict(pm, "send_mail", to="eve@evil.test", body="hi") == "ask"


def test_tool_name_wildcards() -> None:
    pm = PermissionManager({"allow": ["time_*"], "deny": ["*"]}, default="allow")
    assert verdict(pm, "time_now") == "deny"  # deny beats allow
    assert verdict(PermissionManager({"allow": ["time_*"]}), "time_now") == "allow"


@pytest.mark.parametrize(
    "bad",
    [
        {"allow": ["bash("]},
        {"bash": "maybe"},
        {"default": "sometimes"},
        {"safe_mode": "yes"},
        {"allow": ["white space"]},
    ],
)
def test_bad_rules_are_configuration_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        PermissionManager(bad)


def test_defaults_without_permissions_ask_for_risky_builtins() -> None:
    pm = build_permissions(None, None)
    assert verdict(pm, "bash", command="ls") == "ask"
    assert verdict(pm, "write_file", path="a", content="") == "ask"
    assert verdict(pm, "web_fetch", url="http://x") == "ask"
    assert verdict(pm, "read_file", path="a") == "allow"
    assert verdict(pm, "my_tool", a=1) == "allow"


def test_project_file_adds_rules_and_stricter_default(tmp_path: Path) -> None:
    (tmp_path / ".loom").mkdir()
    (tmp_path / ".loom" / "permissions.yaml").write_text(
        "default: deny\ndeny:\n  - bash(curl *)\nallow:\n  - read_file\n"
    )
    pm = build_permissions({"allow": ["bash(curl *)"], "default": "ask"}, tmp_path)
    assert verdict(pm, "bash", tmp_path, command="curl http://x") == "deny"
    assert verdict(pm, "read_file", tmp_path, path="a") == "allow"
    assert pm.default == "deny"
    (tmp_path / ".loom" / "permissions.yaml").write_text("allow: 3\n")
    with pytest.raises(ConfigurationError, match=r"permissions\.yaml"):
        build_permissions(None, tmp_path)


def test_rule_parse_and_str() -> None:
    r = PermissionRule.parse("bash(echo $(date))", "allow")
    assert (r.tool, r.pattern, str(r)) == ("bash", "echo $(date)", "bash(echo $(date))")


def test_denied_call_becomes_a_result_the_model_reads(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=[ToolCall(name="bash", arguments={"command": "rm -rf /"})]),
            ModelResponse(text="ok"),
        ]
    )
    agent = Agent(
        model=model, tools=["bash"], workspace=tmp_path, permissions={"deny": ["bash(rm *)"]}
    )
    result = agent.run_sync("clean up")
    assert result.stop_reason == "completed"
    tool_msg = next(m for m in result.messages if m.role == "tool")
    assert tool_msg.metadata["error_code"] == "denied" and "bash(rm *)" in tool_msg.content
    second_call = model.calls[1].messages
    assert any(m.role == "tool" and "denied" in m.content for m in second_call)
