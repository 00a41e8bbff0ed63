"""The browser pages and what only they need (docs/web.md):

- ``GET /``: the live-captions page; ``GET /ops``: the operations page; ``/static/...``: their scripts and styles
  (plain files from ``api/static/``: no build step, nothing from a CDN).
- ``POST /v1/stream-tickets`` (a translate key in ``Authorization`` / ``X-API-Key``) -> ``{ticket, expires_in}``:
  a single-use ticket for ``WS /v1/streams?ticket=...`` (api/tickets.py), so that a page never puts its key in a
  URL. A key that already holds its quota of open streams gets 429 here rather than at the socket.
- ``GET /v1/ops/metrics`` (an admin key): the registry behind /metrics as JSON (api/opsview.py).

``install`` returns ``ticketed``: the WebSocket's authenticate function, taught to redeem tickets.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from ..errors import AuthenticationError, Overloaded
from ..stream.service import Principal
from . import opsview
from .deps import AdminKey, TranslateKey, app_state, context
from .tickets import TicketBook, is_ticket

STATIC = Path(__file__).parent / "static"
router = APIRouter()
NO_STORE = {"Cache-Control": "no-store"}


@router.get("/", include_in_schema=False)
async def captions_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=NO_STORE)


@router.get("/ops", include_in_schema=False)
async def ops_page() -> FileResponse:
    return FileResponse(STATIC / "ops.html", media_type="text/html; charset=utf-8", headers=NO_STORE)


@router.post("/v1/stream-tickets", status_code=201)
async def stream_ticket(request: Request, key: TranslateKey) -> dict[str, object]:
    """A single-use ticket for one WebSocket stream: ``WS /v1/streams?ticket=<ticket>`` within ``expires_in``
    seconds. Browsers cannot set headers on a WebSocket; the ticket keeps the key itself out of every URL."""
    service = app_state(request.app).streams
    if service.quota.held_here(key.key_id) >= service.quota.limit:  # the cap itself: at the stream's open
        raise Overloaded("this key has too many open streams", retry_after=5.0)
    book = app_state(request.app).tickets
    ticket = await context(request).offload(book.issue, key.key_id, "admin" in key.scopes, time.monotonic())
    if ticket is None:
        raise Overloaded(f"too many unused stream tickets (at most {book.per_key} a key, {book.max_tickets} "
                         "in all): use or let expire the ones you have", retry_after=float(book.ttl_s))
    return {"ticket": ticket.token, "expires_in": book.ttl_s}


@router.get("/v1/ops/metrics")
async def ops_metrics(request: Request, _key: AdminKey,
                      scope: Literal["server", "cluster"] = "server") -> dict[str, object]:
    """What /metrics holds, as JSON, with a digest for the operations page (admin key). ``scope=cluster``: every
    replica's on the shared Redis (``GET /metrics/cluster``), summed in the digest, by replica in ``samples`` (a
    server without a shared Redis: its own)."""
    from .health import cluster_view, publisher_of

    publisher = publisher_of(request) if scope == "cluster" else None
    if publisher is not None:
        return opsview.snapshot(await cluster_view(publisher.snapshot_registry()), time.time())
    return opsview.snapshot(context(request).metrics.registry, time.time())


def install(app: FastAPI) -> None:
    url = app_state(app).settings.state.redis_url  # with Redis, one book for every server (api/redis_tickets.py)
    if url:
        from .redis_tickets import RedisTicketBook  # redis-py imports the OpenTelemetry SDK: only when Redis is set

        app_state(app).tickets = RedisTicketBook(url)
    else:
        app_state(app).tickets = TicketBook()
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="web-static")


def ticketed(app: FastAPI, authenticate: Callable[[str | None], Awaitable[Principal]]
             ) -> Callable[[str | None], Awaitable[Principal]]:
    """``authenticate`` for the WebSocket that also takes a ticket, once. The ticket's key is checked again (a key
    revoked since the ticket was issued is refused)."""

    async def check(secret: str | None) -> Principal:
        if not is_ticket(secret):
            return await authenticate(secret)
        assert secret is not None
        state = app_state(app)
        ctx = state.ctx
        ticket = await ctx.offload(state.tickets.redeem, secret, time.monotonic())
        if ctx.settings.server.auth:
            key = await ctx.offload(ctx.store.get_key, ticket.key_id)
            if key is None or key.revoked:
                raise AuthenticationError("the key this ticket was issued to has been revoked")
        return Principal(ticket.key_id, ticket.admin)

    return check
