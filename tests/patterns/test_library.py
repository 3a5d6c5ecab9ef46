"""Loading a library from a directory, and matching quality on the example library."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loom.errors import (
    DuplicatePatternName,
    EmptyPatternLibrary,
    InputError,
    PatternError,
    PatternFileError,
)
from loom.patterns import Pattern, PatternLibrary

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "patterns"

# Held-in messages: written for the example library; each must rank its pattern first.
HELD_IN = [
    ("sql-slow-query", "My report query on the orders table has become really slow and times out"),
    ("sql-slow-query", "EXPLAIN ANALYZE shows a sequential scan, should I add an index?"),
    (
        "sql-schema-explore",
        "Which table stores customer shipping addresses and how does it join to orders?",
    ),
    ("sql-data-quality", "Find duplicate rows and null emails in the customers table"),
    (
        "sql-migration-review",
        "Is this ALTER TABLE migration adding a column safe to run without downtime?",
    ),
    (
        "log-error-triage",
        "The service logs are full of exceptions with a long stack trace since this morning",
    ),
    (
        "incident-postmortem",
        "We had an outage yesterday, help me write the incident report with a timeline",
    ),
    ("api-rate-limit", "The Stripe API returns 429 Too Many Requests when we sync invoices"),
    (
        "python-dependency-conflict",
        "pip install fails with a version conflict between pandas and numpy",
    ),
    (
        "git-merge-conflict",
        "git rebase stopped with a merge conflict in settings.py, what do I do?",
    ),
    ("docker-image-size", "Our Docker image is huge and the build takes forever"),
    ("kubernetes-crashloop", "The pod is in CrashLoopBackOff and kubectl shows OOMKilled"),
    ("code-review", "Please review my pull request, here is the diff"),
    ("write-unit-tests", "Write pytest unit tests covering the edge cases of this function"),
    (
        "csv-data-cleanup",
        "Importing this CSV export fails because of the encoding and a semicolon delimiter",
    ),
    ("secret-leak-response", "I committed an API key to our public repo by mistake"),
]

WritePattern = Callable[..., Path]


@pytest.fixture(scope="module")
def examples() -> PatternLibrary:
    return PatternLibrary.from_dir(EXAMPLES)


def test_the_example_library_is_valid(examples: PatternLibrary) -> None:
    assert examples.problems == ()
    assert 10 <= len(examples) <= 15
    assert {name for name, _ in HELD_IN} == {p.name for p in examples}  # every pattern is exercised


@pytest.mark.parametrize(("expected", "message"), HELD_IN)
def test_the_right_pattern_ranks_first(
    examples: PatternLibrary, message: str, expected: str
) -> None:
    matches = examples.match(message)
    assert matches, f"nothing matched {message!r}"
    assert matches[0][0].name == expected, [(p.name, s) for p, s in matches]


@pytest.mark.parametrize(
    "message",
    ["hello, how are you?", "tell me a joke about cats", "what's the weather like in Paris"],
)
def test_unrelated_messages_match_nothing(examples: PatternLibrary, message: str) -> None:
    assert examples.match(message) == []


def test_matches_are_best_first_within_k_and_above_min_score(examples: PatternLibrary) -> None:
    message = "slow query on the orders table, which table holds the index?"
    all_ = examples.match(message, k=15, min_score=0.0)
    scores = [s for _, s in all_]
    assert scores == sorted(scores, reverse=True) and all(0 < s <= 1 for s in scores)
    assert examples.match(message, k=1) == all_[:1]
    cut = scores[1]
    assert [s for _, s in examples.match(message, k=15, min_score=cut)] == [
        s for s in scores if s >= cut
    ]
    assert examples.match(message, k=0) == []
    assert examples.match("   ") == []


def test_match_rejects_bad_arguments(examples: PatternLibrary) -> None:
    with pytest.raises(InputError, match="k must be a non-negative integer"):
        examples.match("x", k=-1)
    with pytest.raises(InputError, match="min_score must be a number from 0 to 1"):
        examples.match("x", min_score=2)
    with pytest.raises(InputError, match="needs a string"):
        examples.match(None)  # type: ignore[arg-type]


def test_a_bad_file_is_skipped_and_the_rest_load(
    tmp_path: Path, write_pattern: WritePattern
) -> None:
    write_pattern("good-one", keywords=["alpha beta"])
    (tmp_path / "bad.yaml").write_text("name: bad\ntitle: [\n")
    lib = PatternLibrary.from_dir(tmp_path)
    assert [p.name for p in lib] == ["good-one"]
    (problem,) = lib.problems
    assert problem.path == str(tmp_path / "bad.yaml") and "malformed YAML" in problem.message
    assert lib.match("alpha beta")[0][0].name == "good-one"


def test_strict_mode_raises_the_first_problem(tmp_path: Path, write_pattern: WritePattern) -> None:
    write_pattern("a")
    write_pattern("b", file="b.yaml", keywords=[])
    write_pattern("c", file="c.yaml", title="")
    with pytest.raises(PatternFileError, match=r"b\.yaml: field 'keywords'") as info:
        PatternLibrary.from_dir(tmp_path, strict=True)
    assert info.value.path == str(tmp_path / "b.yaml")
    assert any("1 more problem" in note for note in info.value.__notes__)


def test_strict_mode_raises_on_duplicate_names(tmp_path: Path, write_pattern: WritePattern) -> None:
    write_pattern("same", file="a.yaml")
    write_pattern("same", file="b.yaml")
    lib = PatternLibrary.from_dir(tmp_path)  # lenient: first wins, problem listed
    assert len(lib) == 1 and lib.problems[0].kind == "duplicate"
    with pytest.raises(DuplicatePatternName, match="'same' is already used by"):
        PatternLibrary.from_dir(tmp_path, strict=True)


def test_an_empty_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(EmptyPatternLibrary, match=r"no pattern files \(\*.yaml, \*.yml\) in"):
        PatternLibrary.from_dir(tmp_path)
    lib = PatternLibrary.from_dir(tmp_path, allow_empty=True)
    assert len(lib) == 0 and lib.match("anything") == []
    assert [p.kind for p in lib.problems] == ["empty"]


def test_a_directory_of_only_bad_files_lists_them(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("name: [\n")
    (tmp_path / "two.yaml").write_text("- a list\n")
    with pytest.raises(EmptyPatternLibrary) as info:
        PatternLibrary.from_dir(tmp_path)
    text = str(info.value)
    assert "all 2 file(s) were skipped" in text
    assert "one.yaml: malformed YAML" in text and "two.yaml: expected a mapping" in text


def test_a_missing_directory_is_a_pattern_error(tmp_path: Path) -> None:
    with pytest.raises(PatternError, match="does not exist or is not a directory"):
        PatternLibrary.from_dir(tmp_path / "nope")


def test_a_library_of_stop_words_is_reported_not_crashed(
    tmp_path: Path, write_pattern: WritePattern
) -> None:
    write_pattern("x", title="the", description="and the", keywords=["of"], instructions="be kind")
    lib = PatternLibrary.from_dir(tmp_path)
    assert lib.match("the and of") == []
    assert any("cannot build the index" in p.message for p in lib.problems)


def test_in_memory_libraries(write_pattern: WritePattern) -> None:
    a = Pattern(
        name="a",
        title="Alpha",
        description="alpha things",
        keywords=["alpha"],
        instructions="do alpha",
    )
    lib = PatternLibrary([a])
    assert lib.match("alpha please")[0][0] is a
    with pytest.raises(DuplicatePatternName):
        PatternLibrary([a, a])
    with pytest.raises(PatternError, match="only a library made with from_dir"):
        lib.reload()


def test_ties_keep_library_order(tmp_path: Path, write_pattern: WritePattern) -> None:
    for name in ("b-twin", "a-twin", "c-twin"):
        write_pattern(name, title="same", description="same words here", keywords=["shared"])
    lib = PatternLibrary.from_dir(tmp_path)
    ranked = [p.name for p, _ in lib.match("shared words", k=3)]
    assert ranked == [p.name for p in lib][:3]  # library order is path order
