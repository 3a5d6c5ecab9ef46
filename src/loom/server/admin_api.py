"""Admin-only routes of ``loom serve`` (``/admin/...``).

``DELETE /admin/principals/{name}`` forgets the API key named ``name``: everything it has in
the server's store is deleted and the bytes scrubbed (``loom.server.forget.forget_owner``: its
sessions with their media, its memory items, its schedules and monitors, its ownership
records). The answer is ``Forgotten.to_dict()``: the counts deleted, what was kept (sessions a
run is using, sources of another key's forks, media another key's session names) and whether
the store's files were scrubbed. A name with nothing stored answers 200 with every count 0.

Only an admin key may call it (another key: 403 ``Forbidden``); a server without keys serves
it too, as it serves everything to its loopback callers. An admin key's own name, or any admin
key's, is refused (422): what an admin key writes is the server's shared data.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from loom.errors import InputError
from loom.server.app import error_body
from loom.server.forget import check_owner_name, forget_owner
from loom.server.ownership import Owners, Principal, current_principal

__all__ = ["router"]

router: APIRouter = APIRouter(tags=["admin"])


def _forbidden(principal: Principal) -> JSONResponse:
    return JSONResponse(
        error_body(
            "Forbidden",
            f"the key {principal.name!r} is not an admin key; /admin routes need one "
            "(admin: true in the key file)",
        ),
        status_code=403,
    )


@router.delete(
    "/admin/principals/{name}",
    summary="Forget an API key: delete everything it has",
    response_model=None,
)
async def forget_principal(name: str, request: Request) -> JSONResponse:
    principal = current_principal.get()
    if principal is not None and not principal.admin:
        return _forbidden(principal)
    check_owner_name(name)
    state = request.app.state.loom
    security = state.extra.get("security")
    ring = security.keys.principals if security is not None else []
    if principal is not None and name == principal.name:
        raise InputError(
            f"{name!r} is the key making this request (an admin key): an admin key's records "
            "are the server's shared data; it cannot forget itself"
        )
    if any(p.name == name and p.admin for p in ring):
        raise InputError(
            f"{name!r} is an admin key: what it writes is the server's shared data, not one "
            "owner's; take its admin flag away (and restart the server) to forget it"
        )
    owners = state.extra.get("owners")
    done = await forget_owner(
        state.runtime.store,
        name,
        owners=owners if isinstance(owners, Owners) else None,
        sandbox_dir=state.runtime.sandbox_dir,
    )
    return JSONResponse(done.to_dict())
