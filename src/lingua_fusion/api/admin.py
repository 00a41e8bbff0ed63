"""Admin routes (an admin key): fault injection (/v1/admin/faults, with --chaos), the SLO breakers' reset
(/v1/admin/breaker) and API keys (/v1/keys)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import InvalidParameter, PermissionDenied
from . import spec
from .deps import AdminKey, JsonBody, app_state, context

router = APIRouter()


# ---- faults: on the live streams' model executor (app_state(request.app).streams) -------------------------------
@router.get("/v1/admin/faults")
async def list_faults(request: Request, _key: AdminKey) -> dict[str, object]:
    streams = app_state(request.app).streams
    return {"chaos": context(request).settings.server.chaos,
            "faults": {k: f.public() for k, f in streams.executor.faults.items()},
            "stuck_calls": streams.executor.stuck(),
            "breaker": streams.supervisor.levels_by_class()}


@router.post("/v1/admin/faults", openapi_extra=spec.body(spec.FAULT), dependencies=[JsonBody])
async def set_fault(request: Request, _key: AdminKey) -> JSONResponse:
    """Chaos: inject a model backend fault (delay, error, hang, garbage; see serving/faults.py) into a
    fraction of model batches. Only with an admin key on a server started with --chaos."""
    from ..serving.faults import parse_fault

    if not context(request).settings.server.chaos:
        raise PermissionDenied("fault injection is off: start the server with --chaos")
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidParameter("send a JSON object {model, kind, delay_s, fraction, after}") from exc
    fault = parse_fault(body)
    faults = app_state(request.app).streams.executor.faults
    faults[f"{fault.model}/{fault.kind}"] = fault
    return JSONResponse({"faults": {k: f.public() for k, f in faults.items()}}, status_code=201)


@router.delete("/v1/admin/faults")
async def clear_faults(request: Request, _key: AdminKey) -> dict[str, object]:
    app_state(request.app).streams.executor.faults.clear()
    return {"faults": {}}


# ---- the SLO breakers ----------------------------------------------------------------------------------------
@router.get("/v1/admin/breaker")
async def breaker_levels(request: Request, _key: AdminKey) -> dict[str, object]:
    return {"breaker": app_state(request.app).streams.supervisor.levels_by_class()}


@router.delete("/v1/admin/breaker")
async def restore_breaker(request: Request, _key: AdminKey) -> dict[str, object]:
    """Every class's and key's SLO breaker back to level 0 at once, instead of after its quiet period: an operator
    who has removed the cause, or a benchmark sweep starting its next row. Degraded streams are told ``restored``;
    the breaker trips again if the cause is still there. Every worker of ``serve --workers N`` restores within a
    second (stream/supervisor.py ``announce_restore``)."""
    supervisor = app_state(request.app).streams.supervisor
    await context(request).offload(supervisor.announce_restore)
    return {"breaker": supervisor.restore()}


# ---- API keys ----------------------------------------------------------------------------------------------
@router.post("/v1/keys", openapi_extra=spec.body(spec.KEY), dependencies=[JsonBody])
async def create_key(request: Request, _key: AdminKey) -> JSONResponse:
    try:  # a body that is not a JSON object mints nothing (it used to be read as {}: a translate key)
        body = await request.json()
    except ValueError as exc:
        raise InvalidParameter('send a JSON object {"name": ..., "scopes": [...]}') from exc
    if not isinstance(body, dict):
        raise InvalidParameter('send a JSON object {"name": ..., "scopes": [...]}')
    raw_scopes = body.get("scopes")
    if raw_scopes is not None and not isinstance(raw_scopes, list):  # e.g. a number: not iterable, was a 500
        raise InvalidParameter("scopes must be a list of 'translate' and/or 'admin'")
    scopes = tuple(raw_scopes or ["translate"])
    if any(s not in ("translate", "admin") for s in scopes):
        raise InvalidParameter("scopes must be 'translate' and/or 'admin'")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise InvalidParameter("name must be a string")
    ctx = context(request)
    secret, k = await ctx.offload(ctx.store.create_key, name, scopes)
    return JSONResponse({"api_key": secret, "key_id": k.key_id, "scopes": list(k.scopes)}, status_code=201)


@router.get("/v1/keys")
async def list_keys(request: Request, _key: AdminKey) -> dict[str, object]:
    return {"keys": [{"key_id": k.key_id, "name": k.name, "scopes": list(k.scopes), "created": k.created,
                      "revoked": k.revoked} for k in await context(request).offload(context(request).store.list_keys)]}


@router.delete("/v1/keys/{key_id}")
async def revoke_key(key_id: str, request: Request, _key: AdminKey) -> dict[str, object]:
    ctx = context(request)
    await ctx.offload(ctx.store.revoke_key, key_id)
    # its live streams end (4401), the per-stream baseline's too; resumes are refused
    closed = await app_state(request.app).stream_front.revoke(key_id)
    await ctx.offload(app_state(request.app).tickets.revoke, key_id)  # its unused stream tickets too (api/tickets.py)
    # its rooms' listeners are closed (4401) on every gateway and the rooms forgotten (rooms/service.py)
    listeners = await app_state(request.app).rooms.revoke_key(key_id)
    return {"key_id": key_id, "revoked": True, "streams_closed": closed, "room_listeners_closed": listeners}
