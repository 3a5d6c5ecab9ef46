"""loom.text.representable: every stored string can be encoded as UTF-8 (issue #12 item 1)."""

from __future__ import annotations

import os

from loom.text import representable


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
