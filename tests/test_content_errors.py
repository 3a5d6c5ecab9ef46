"""A part's own errors reach the caller typed (pydantic would wrap them in a
``ValidationError``, losing the type and ``part`` the surfaces report)."""

from __future__ import annotations

import pytest

from loom.content import Image
from loom.errors import ContentError, MediaTypeMismatch
from loom.events import UserMessage


def test_bytes_that_are_not_the_claimed_type_raise_media_type_mismatch() -> None:
    with pytest.raises(MediaTypeMismatch) as caught:
        Image(data=b"just text", media_type="image/png", name="x.png")
    assert caught.value.part == "x.png"
    with pytest.raises(ContentError):
        Image()


def test_an_events_json_form_holds_references_not_bytes() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    ev = UserMessage(run_id="r", session_id="s", content="look", parts=[Image(data=png)])
    part = ev.to_dict()["data"]["parts"][0]
    assert part["ref"].startswith("sha256:") and "data" not in part
    assert part["media_type"] == "image/png"
