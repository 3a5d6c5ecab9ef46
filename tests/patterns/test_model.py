"""Reading and validating pattern files: every bad file is reported with its path and field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loom.errors import DuplicatePatternName, PatternFileError
from loom.patterns import Pattern, PatternProblem, load_dir, load_file

WritePattern = Callable[..., Path]


def problem_of(path: Path) -> PatternProblem:
    got = load_file(path)
    assert isinstance(got, PatternProblem), got
    assert got.path == str(path)
    return got


def test_a_valid_file_loads_with_its_source(write_pattern: WritePattern) -> None:
    path = write_pattern("sql-slow", examples=["why is it slow"], tools=["run_sql"])
    p = load_file(path)
    assert isinstance(p, Pattern)
    assert (p.name, p.examples, p.tools, p.source) == (
        "sql-slow",
        ("why is it slow",),
        ("run_sql",),
        str(path),
    )
    assert "Do the sql-slow thing." in p.to_prompt() and "run_sql" in p.to_prompt()


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ntitle: [unclosed\ndescription: y\n")
    problem = problem_of(path)
    assert problem.message.startswith("malformed YAML at line ")
    assert "column" in problem.message and problem.field is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "got an empty file"),
        ("- a\n- b\n", "got a list"),
        ("just a string", "got a str"),
    ],
)
def test_a_file_that_is_not_a_mapping_is_reported(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert message in problem_of(path).message


@pytest.mark.parametrize(
    ("over", "field", "message"),
    [
        ({"instructions": None}, "instructions", "valid string"),
        ({"keywords": []}, "keywords", "at least 1"),
        ({"keywords": ["ok", {"nested": 1}]}, "keywords.1", "valid string"),
        ({"name": "Has Spaces"}, "name", "is not a pattern name: use lowercase letters"),
        ({"title": ""}, "title", "at least 1 character"),
        ({"tools": "run_sql"}, "tools", "valid tuple"),
        ({"keyword": ["typo"]}, "keyword", "Extra inputs are not permitted"),
    ],
)
def test_invalid_fields_are_reported_with_the_field(
    write_pattern: WritePattern, over: dict, field: str, message: str
) -> None:
    name = over.pop("name", "p")
    problem = problem_of(write_pattern(name, file="p.yaml", **over))
    assert problem.field == field
    assert message in problem.message
    err = problem.to_error()
    assert isinstance(err, PatternFileError) and err.field == field
    assert str(err).startswith(f"{problem.path}: field {field!r}: ")


def test_a_missing_required_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ntitle: T\ndescription: D\nkeywords: [k]\n")
    problem = problem_of(path)
    assert (problem.field, problem.message) == ("instructions", "Field required")


def test_numbers_in_word_lists_are_read_as_words(write_pattern: WritePattern) -> None:
    p = load_file(write_pattern("http", keywords=[429, 3.11, "rate limit"]))
    assert isinstance(p, Pattern) and p.keywords == ("429", "3.11", "rate limit")


def test_a_directory_loads_the_valid_files_and_reports_the_rest(
    tmp_path: Path, write_pattern: WritePattern
) -> None:
    write_pattern("a")
    write_pattern("b", file="sub/b.yml")
    write_pattern("c", file=".hidden/c.yaml")  # hidden directories are not patterns
    (tmp_path / "notes.txt").write_text("not a pattern")
    (tmp_path / "broken.yaml").write_text("name: [\n")
    result = load_dir(tmp_path)
    assert [p.name for p in result.patterns] == ["a", "b"]
    assert [Path(p.path).name for p in result.problems] == ["broken.yaml"]


def test_duplicate_names_keep_the_first_file_and_report_the_second(
    tmp_path: Path, write_pattern: WritePattern
) -> None:
    first = write_pattern("same", file="a.yaml", title="First")
    second = write_pattern("same", file="b.yaml", title="Second")
    result = load_dir(tmp_path)
    assert [p.title for p in result.patterns] == ["First"]
    (problem,) = result.problems
    assert (problem.path, problem.field, problem.kind) == (str(second), "name", "duplicate")
    assert str(first) in problem.message and "already used" in problem.message
    err = problem.to_error()
    assert isinstance(err, DuplicatePatternName)
    assert (err.name, err.path, err.first_path) == ("same", str(second), str(first))


def test_patterns_are_immutable(write_pattern: WritePattern) -> None:
    p = load_file(write_pattern("a"))
    with pytest.raises(Exception, match="frozen"):
        p.name = "b"  # type: ignore[misc, union-attr]


def test_a_cache_reparses_only_changed_files(tmp_path: Path, write_pattern: WritePattern) -> None:
    write_pattern("a")
    write_pattern("b")
    cache: dict = {}
    first = load_dir(tmp_path, cache)
    write_pattern("b", instructions="changed")
    (tmp_path / "c.yaml").write_text("name: [\n")
    second = load_dir(tmp_path, cache)
    assert second.patterns[0] is first.patterns[0]  # a.yaml unchanged: not parsed again
    assert second.patterns[1].instructions == "changed"
    assert [Path(p.path).name for p in second.problems] == ["c.yaml"]
    assert sorted(Path(k).name for k in cache) == ["a.yaml", "b.yaml", "c.yaml"]
    (tmp_path / "a.yaml").unlink()
    assert [p.name for p in load_dir(tmp_path, cache).patterns] == ["b"]
    assert sorted(Path(k).name for k in cache) == ["b.yaml", "c.yaml"]
