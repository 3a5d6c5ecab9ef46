"""`loom patterns list / match / validate`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from loom.cli import app

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "patterns")
runner = CliRunner()


def test_list_shows_every_pattern() -> None:
    result = runner.invoke(app, ["patterns", "list", EXAMPLES], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "15 patterns in" in result.output
    assert "sql-slow-query" in result.output and "kubernetes-crashloop" in result.output


def test_match_ranks_patterns() -> None:
    result = runner.invoke(
        app, ["patterns", "match", EXAMPLES, "pod in CrashLoopBackOff", "--json"]
    )
    assert result.exit_code == 0, result.output
    ranked = json.loads(result.output)
    assert ranked[0]["name"] == "kubernetes-crashloop" and 0 < ranked[0]["score"] <= 1
    table = runner.invoke(
        app,
        ["patterns", "match", EXAMPLES, "pod in CrashLoopBackOff", "-k", "1"],
        env={"COLUMNS": "200"},
    )
    assert table.exit_code == 0 and "kubernetes-crashloop" in table.output
    none = runner.invoke(app, ["patterns", "match", EXAMPLES, "tell me a joke"])
    assert none.exit_code == 0 and "no pattern scored 0.1 or more" in none.output


def test_validate_passes_on_the_examples() -> None:
    result = runner.invoke(app, ["patterns", "validate", EXAMPLES])
    assert result.exit_code == 0, result.output
    assert "15 patterns valid" in result.output


def test_validate_reports_path_and_field_and_fails(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(
        "name: ok\ntitle: T\ndescription: D\nkeywords: [k]\ninstructions: I\n"
    )
    (tmp_path / "bad.yaml").write_text(
        "name: bad\ntitle: T\ndescription: D\nkeywords: []\ninstructions: I\n"
    )
    (tmp_path / "z-dup.yaml").write_text(
        "name: ok\ntitle: T\ndescription: D\nkeywords: [k]\ninstructions: I\n"
    )
    result = runner.invoke(app, ["patterns", "validate", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "2 problem(s)" in result.output
    assert "bad.yaml: keywords:" in result.output
    assert "z-dup.yaml: name: pattern name 'ok' is already used by" in result.output
    listing = runner.invoke(app, ["patterns", "list", str(tmp_path)])
    assert listing.exit_code == 1 and "ok" in listing.output


def test_an_empty_or_missing_directory_is_reported(tmp_path: Path) -> None:
    empty = runner.invoke(app, ["patterns", "validate", str(tmp_path)], env={"COLUMNS": "300"})
    assert empty.exit_code == 1 and "no pattern files" not in empty.output
    assert "the library is empty" in empty.output
    missing = runner.invoke(
        app, ["patterns", "list", str(tmp_path / "nope")], env={"COLUMNS": "300"}
    )
    assert missing.exit_code == 2 and "does not exist" in missing.output
