"""An event's JSON form (``to_dict``: SSE frames, ``loom run --json``, webhooks) holds its
content parts as JSON: references, never bytes."""

from __future__ import annotations

from loom.content import Image
from loom.events import UserMessage


def test_an_events_json_form_holds_references_not_bytes() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    ev = UserMessage(run_id="r", session_id="s", content="look", parts=[Image(data=png)])
    part = ev.to_dict()["data"]["parts"][0]
    assert part["ref"].startswith("sha256:") and "data" not in part
    assert part["media_type"] == "image/png"
