"""Rooms over HTTP: the owner's REST routes, and listeners over WebSocket or server-sent events.

Owner routes (an API key; a room is only ever seen by the key that created it, others get 404):
``POST /v1/rooms`` (optional JSON ``{"source_lang", "allowed_targets"}``) -> ``{room_id, listener_token, token_id,
...}``; ``GET /v1/rooms``; ``GET /v1/rooms/{id}``; ``POST /v1/rooms/{id}/tokens`` (optional JSON ``{"label"}``) ->
a new ``listener_token`` and its ``token_id``; ``GET /v1/rooms/{id}/tokens`` lists the tokens' ids;
``DELETE /v1/rooms/{id}/tokens/{token_id}`` revokes one (its open listeners are closed, 4401);
``DELETE /v1/rooms/{id}`` ends and forgets the room (listeners get ``closed``; its tokens open nothing after).

Listeners (a read-only listener token, never an API key): ``WS /v1/rooms/{id}/listen`` and
``GET /v1/rooms/{id}/events`` (text/event-stream), both with ``?targets=es,de`` and optionally ``after_seq=N``
(reconnecting: the finals after N come first, exactly once) and ``speech=true``. The token goes in
``Authorization: Bearer lt_...``, or (browsers, which cannot set headers on a WebSocket or an EventSource) in the
subprotocol list ``["linguafusion", "bearer.lt_..."]`` or as ``?token=lt_...``: accepted in a URL because it only
reads one room. SSE sends each final with ``id: <seq>``, so a browser's EventSource reconnects with
``Last-Event-ID`` and misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import QueryParams

from .. import strict_json
from ..config import Settings
from ..errors import InvalidParameter, LinguaFusionError, SlowConsumer, UnsupportedContentType
from ..json_bounds import bounds_of
from ..json_types import JSONObject
from ..models.registry import Registry
from ..observability import Metrics
from ..rooms.directory import RoomLimits
from ..rooms.feed import Listener, Outgoing
from ..rooms.metrics import RoomMetrics
from ..rooms.model import token_id_of
from ..rooms.service import RoomService, open_rooms
from ..stream.events import error_event
from ..stream.protocol import close_code
from . import spec
from .deps import TranslateKey, app_state, context, flag
from .handshake import offered_secret

log = logging.getLogger("lingua_fusion.api")
router = APIRouter()
SUBPROTOCOL = "linguafusion"
BEARER = "bearer."
SEND_TIMEOUT_S = 10.0  # a listener whose socket takes longer to take one event is closed (slow_consumer)
KEEPALIVE_S = 15.0  # SSE comment lines while the room is quiet (proxies close idle responses)


def limits(settings: Settings) -> RoomLimits:
    r = settings.rooms
    return RoomLimits(max_tokens=settings.limits.max_listener_tokens_per_room, max_open_per_key=r.max_open_per_key,
                      max_ended_per_key=r.max_ended_per_key, ttl_s=r.ttl_s, ended_ttl_s=r.ended_ttl_s)


def install(app: FastAPI, settings: Settings, metrics: Metrics, registry: Registry,
            owner_revoked: Callable[[str], Awaitable[bool]] | None = None) -> RoomService:
    """``owner_revoked``: the key store's answer, asked at each join (None: keys are never revoked, auth off)."""
    bus, directory = open_rooms(settings.state.redis_url, limits(settings))
    rooms = RoomService(bus, directory, check_pair=registry.mt_route,
                        low_confidence=lambda s, t: registry.mt_route(s, t).low_confidence,
                        metrics=RoomMetrics(metrics.registry))
    if owner_revoked is not None:
        rooms.owner_revoked = owner_revoked
    app_state(app).rooms = rooms
    app.include_router(router)
    return rooms


def _rooms(request: Request | WebSocket) -> RoomService:
    rooms = app_state(request.app).rooms
    return rooms


# ---- owner routes ------------------------------------------------------------------------------------------------
ROOM = spec.json_body({"type": "object", "properties": {
    "source_lang": {"type": "string"}, "allowed_targets": {"type": "array", "items": {"type": "string"}}}})
TOKEN = spec.json_body({"type": "object", "properties": {"label": {"type": "string", "maxLength": 80}}})


@router.post("/v1/rooms", status_code=201, openapi_extra=spec.body(ROOM))
async def create_room(request: Request, key: TranslateKey) -> JSONResponse:
    body = await _optional_json(request)
    source = body.get("source_lang")
    if "source_lang" in body and not isinstance(source, str):  # null included: leave it out for no source
        raise InvalidParameter("source_lang is a language code")
    allowed = body.get("allowed_targets")
    if "allowed_targets" in body and not isinstance(allowed, list):
        raise InvalidParameter("allowed_targets is a list of language codes listeners may ask for")
    room, token = await _rooms(request).create(key.key_id, source if isinstance(source, str) else None,
                                               allowed if isinstance(allowed, list) else None)
    return JSONResponse({**room.public(), "listener_token": token, "token_id": token_id_of(token)}, status_code=201)


@router.get("/v1/rooms")
async def list_rooms(request: Request, key: TranslateKey) -> dict[str, object]:
    return {"rooms": await _rooms(request).list(key.key_id)}


@router.get("/v1/rooms/{room_id}")
async def get_room(room_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    rooms = _rooms(request)
    return await rooms.describe(await rooms.owned(room_id, key.key_id))


@router.post("/v1/rooms/{room_id}/tokens", status_code=201, openapi_extra=spec.body(TOKEN))
async def mint_token(room_id: str, request: Request, key: TranslateKey) -> JSONResponse:
    label = (await _optional_json(request)).get("label")
    token = await _rooms(request).mint(room_id, key.key_id, label)
    return JSONResponse({"room_id": room_id, "listener_token": token, "token_id": token_id_of(token),
                         "label": label}, status_code=201)


@router.get("/v1/rooms/{room_id}/tokens")
async def list_tokens(room_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    return {"room_id": room_id, "tokens": await _rooms(request).tokens(room_id, key.key_id)}


@router.delete("/v1/rooms/{room_id}/tokens/{token_id}")
async def revoke_token(room_id: str, token_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    closed = await _rooms(request).revoke_token(room_id, key.key_id, token_id)
    return {"room_id": room_id, "token_id": token_id, "revoked": True, "listeners_closed": closed}


@router.delete("/v1/rooms/{room_id}")
async def end_room(room_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    room = await _rooms(request).end(room_id, key.key_id)
    return {"room_id": room.room_id, "state": room.state, "finals": room.finals, "deleted": True}


async def _optional_json(request: Request) -> JSONObject:
    raw = await request.body()
    if not raw.strip():
        return {}
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise UnsupportedContentType("this route takes a JSON body: send 'Content-Type: application/json'")
    try:
        # NaN / Infinity and lone surrogates are not JSON either; too deep or too many elements: 413 before parsing
        body = strict_json.loads(raw, bounds_of(context(request).settings))
    except (ValueError, RecursionError) as exc:
        raise InvalidParameter("the body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise InvalidParameter("the body is a JSON object")
    return body


# ---- listeners ---------------------------------------------------------------------------------------------------
def _listen_args(q: QueryParams, last_event_id: str | None = None) -> tuple[list[str], int, bool]:
    targets = [t.strip() for t in ",".join(q.getlist("targets") + q.getlist("to")).split(",") if t.strip()]
    raw = last_event_id or q.get("after_seq") or "0"
    try:
        after = int(raw)
    except ValueError as exc:
        raise InvalidParameter("after_seq (or Last-Event-ID) must be an integer") from exc
    return targets, after, flag(q.get("speech", "false"))


def _ws_token(ws: WebSocket) -> tuple[str | None, str | None]:
    token, chosen = offered_secret(ws, answers=(SUBPROTOCOL,), prefix=BEARER)
    return (token if token is not None else ws.query_params.get("token")), chosen


@router.websocket("/v1/rooms/{room_id}/listen")
async def listen_ws(ws: WebSocket, room_id: str) -> None:
    token, subprotocol = _ws_token(ws)
    await ws.accept(subprotocol=subprotocol)
    rooms = _rooms(ws)
    try:
        targets, after, speech = _listen_args(ws.query_params)
        listener = await rooms.join(room_id, token, targets, after_seq=after, speech=speech)
    except LinguaFusionError as exc:
        with contextlib.suppress(Exception):
            await ws.send_json(error_event(exc).to_wire())
            await ws.close(code=close_code(exc), reason=exc.code)
        return
    reason = "done"
    writer = asyncio.create_task(_write_ws(ws, listener), name="room-listener")
    reader = asyncio.create_task(_until_disconnect(ws), name="room-listener-reader")
    try:
        done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
        if reader in done:
            reason = "disconnected"
        else:
            reason = writer.result()
    except Exception:  # noqa: BLE001 - a bug or a broken socket: the listener leaves either way
        log.exception("room listener failed")
        reason = "disconnected"
    finally:
        for task in (writer, reader):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        rooms.leave(listener, reason)


async def _until_disconnect(ws: WebSocket) -> None:
    while True:  # listeners send nothing that matters; a disconnect ends the listener
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return


async def _write_ws(ws: WebSocket, listener: Listener) -> str:
    try:
        async for out in listener.outgoing():
            async with asyncio.timeout(SEND_TIMEOUT_S):  # not wait_for: no task per event per listener
                await ws.send_text(out.text)
    except TimeoutError:
        listener.close(SlowConsumer("this listener's connection took too long to take an event"))
    except (WebSocketDisconnect, RuntimeError, OSError):
        return "disconnected"
    with contextlib.suppress(Exception):
        if listener.error is not None:
            await ws.send_json(error_event(listener.error).to_wire())
            await ws.close(code=close_code(listener.error), reason=listener.error.code)
            return listener.error.code
        await ws.close(code=1000)
    return "done"


@router.get("/v1/rooms/{room_id}/events")
async def listen_sse(room_id: str, request: Request) -> StreamingResponse:
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else request.query_params.get("token")
    targets, after, speech = _listen_args(request.query_params, request.headers.get("last-event-id"))
    rooms = _rooms(request)
    listener = await rooms.join(room_id, token, targets, after_seq=after, speech=speech)  # errors: JSON 4xx
    return StreamingResponse(_sse(rooms, listener), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _sse(rooms: RoomService, listener: Listener) -> AsyncIterator[str]:
    reason = "disconnected"
    events = listener.outgoing().__aiter__()
    nxt: asyncio.Future[Outgoing] = asyncio.ensure_future(events.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=KEEPALIVE_S)  # not wait_for: it would end the generator
            if not done:
                yield ": keepalive\n\n"
                continue
            try:
                out = nxt.result()
            except StopAsyncIteration:
                break
            nxt = asyncio.ensure_future(events.__anext__())
            head = f"id: {out.seq}\n" if out.seq is not None else ""
            yield f"{head}event: {out.type}\ndata: {out.text}\n\n"
        if listener.error is not None:
            err = json.dumps(error_event(listener.error).to_wire())
            yield f"event: error\ndata: {err}\n\n"
            reason = listener.error.code
        else:
            reason = "done"
    finally:
        nxt.cancel()
        rooms.leave(listener, reason)
