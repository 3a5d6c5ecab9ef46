"""loom.text.representable: every stored string can be encoded as UTF-8 (issue #12 item 1)."""

from __future__ import annotations

import os

import pytest

from loom.text import representable, whole_number


def test_valid_text_is_returned_unchanged() -> None:
    assert representable("héllo ✓") == ("héllo ✓", False)


def test_undecodable_bytes_become_hex_escapes() -> None:
    name = os.fsdecode(b"\xff.txt")  # what os.listdir gives for a non-UTF-8 name
    shown, changed = representable(name)
    assert (shown, changed) == ("\\xff.txt", True)
    shown.encode("utf-8")


def test_other_lone_surrogates_are_escaped_and_pairs_joined() -> None:
    assert representable("a\ud800b") == ("a\\ud800b", True)
    assert representable("\ud83d\ude00") == ("\U0001f600", True)


# -- whole_number: request fields read as numbers ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("007", 7),
        ("", None),
        ("-1", None),
        ("4.0", None),
        (" 4", None),
        ("²", None),
        ("٣", None),
        ("1" * 19, None),
        ("1" * 5000, None),
    ],
)
def test_whole_number_takes_only_short_ascii_digits(text: str, expected: int | None) -> None:
    assert whole_number(text) == expected


@pytest.mark.parametrize("bad", ["²", "1" * 5000])
def test_ids_with_digits_int_refuses_are_typed_errors_not_crashes(bad: str) -> None:
    """``"²".isdigit()`` is True but ``int("²")`` raises ValueError: every parser of a
    request's number answers InputError (a 4xx), never an unhandled ValueError (a 500)."""
    from loom.crew.context import parse_policy
    from loom.errors import CrewDefinitionError, InputError
    from loom.server.checkpoints import parse_checkpoint_id
    from loom.server.session_events import parse_cursor

    with pytest.raises(InputError):
        parse_checkpoint_id(f"run1.{bad}")
    with pytest.raises(InputError):
        parse_cursor(f"run1:{bad}")
    with pytest.raises(CrewDefinitionError):
        parse_policy(f"last_n:{bad}")
