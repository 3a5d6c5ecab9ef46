"""Media bytes between messages and the store: what a step must store first, what a model
request must load back (``loom.content`` says what the parts are; ``BlobStore`` keeps them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loom.content import Blob, Media
from loom.errors import BlobNotFound
from loom.messages import Message
from loom.store.base import Store, capabilities_of

__all__ = ["blobs_of", "hydrate"]


def blobs_of(messages: Iterable[Message]) -> list[Blob]:
    """The bytes ``messages``' media hold, one per reference (what must be stored before the
    messages are)."""
    out: dict[str, Blob] = {}
    for m in messages:
        for p in m.parts:
            if isinstance(p, Media) and p.data is not None and p.ref is not None:
                out.setdefault(p.ref, Blob(p.ref, p.media_type, p.data))
    return list(out.values())


async def hydrate(messages: Sequence[Message], store: Store) -> list[Message]:
    """``messages`` with every stored media part's bytes loaded (one store read for all of
    them; parts with bytes or a URL are left as they are). The parts are filled in place, so
    a transcript that stays in memory loads each image once. ``BlobNotFound`` names a part
    whose bytes the store no longer holds."""
    wanted = {
        p.ref
        for m in messages
        for p in m.parts
        if isinstance(p, Media) and p.data is None and p.url is None and p.ref is not None
    }
    if not wanted:
        return list(messages)
    blobs = capabilities_of(store).blobs
    found: dict[str, bytes] = await blobs.load_blobs(sorted(wanted)) if blobs is not None else {}
    for m in messages:
        for p in m.parts:
            if isinstance(p, Media) and p.data is None and p.ref in wanted:
                data = found.get(p.ref)
                if data is None:
                    raise BlobNotFound(
                        f"the bytes of {p.label} ({p.ref}) are not in the store: the session's "
                        "media were deleted, or it was copied without them"
                    )
                p.data = data
    return list(messages)
