"""Datasets: YAML and JSONL files of cases; a file that does not parse is a ``DatasetError``
naming the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.errors import InputError
from loom.evals import Dataset, DatasetError, SessionInput, load_dataset, parse_dataset

GOOD = """\
name: calc
model: demo
cases:
  - id: add
    input: what is 2 + 3?
    expected: {contains: "5"}
    assertions:
      - called: {name: add, arguments: {a: 2}}
  - id: later
    input: {session: s1, checkpoint: 1, message: "and now?"}
    expected:
      rubric: [correct, polite]
      strategy: min
"""


def test_a_yaml_dataset_loads_every_kind_of_input_and_expected(tmp_path: Path) -> None:
    path = tmp_path / "calc.yaml"
    path.write_text(GOOD)
    data = load_dataset(path)
    assert isinstance(data, Dataset) and data.name == "calc" and data.model == "demo"
    assert [c.id for c in data.cases] == ["add", "later"]
    assert data.cases[0].message == "what is 2 + 3?"
    later = data.cases[1]
    assert isinstance(later.input, SessionInput) and later.input.checkpoint == 1
    assert later.expected is not None and later.expected.strategy == "min"
    assert later.expected.criteria() == ["correct", "polite"]
    assert data.cases[0].tool_names() == {"add"}


def test_a_jsonl_dataset_is_one_case_a_line(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text('{"id": "a", "input": "hi"}\n\n{"id": "b", "input": "yo"}\n')
    data = load_dataset(path)
    assert data.name == "cases" and [c.id for c in data.cases] == ["a", "b"]


def test_a_yaml_field_error_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace('expected: {contains: "5"}', "expected: {contains: 5}"))
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    error = caught.value
    assert isinstance(error, InputError)
    assert (
        error.path == str(path) and error.line == 6 and error.field == "cases.0.expected.contains"
    )
    assert f"{path}:6" in str(error) and "cases.0.expected.contains" in str(error)


def test_an_unknown_assertion_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("- called: {name: add", "- calld: {name: add"))
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    assert caught.value.line == 8 and caught.value.field == "cases.0.assertions.0"
    assert "unknown kind 'calld'" in str(caught.value)


def test_a_missing_field_names_the_case(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("cases:\n  - id: a\n    input: hi\n  - id: b\n")
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    assert caught.value.line == 4 and caught.value.field == "cases.1.input"


def test_yaml_that_does_not_parse_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("cases:\n  - id: a\n    input: [unclosed\n")
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    assert caught.value.path == str(path) and caught.value.line is not None
    assert "not YAML" in str(caught.value)


def test_a_jsonl_error_names_the_line_number(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text('{"id": "a", "input": "hi"}\n\n{"id": "b", "input": "yo", "tools": "add"}\n')
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    assert caught.value.line == 3 and caught.value.field == "cases.1.tools"
    path.write_text('{"id": "a", "input": "hi"}\n{"id": "b",\n')
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    assert caught.value.line == 2 and "not JSON" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("cases:\n  - {id: a, input: x}\n  - {id: a, input: y}\n", "unique"),
        ("cases:\n  - {id: a, input: x, expected: {text: a, contains: b}}\n", "exactly one"),
        ("", "empty"),
        ("- 1\n", "cases.0"),
    ],
)
def test_other_mistakes_are_dataset_errors(text: str, words: str) -> None:
    with pytest.raises(DatasetError, match=words):
        parse_dataset(text, "d.yaml")


def test_a_file_that_cannot_be_read_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset(tmp_path / "absent.yaml")
