"""Health and discovery (no key): /healthz, /readyz, /v1/models; and /metrics, which with auth on takes an admin
key or the scrape token ``server.metrics_token`` (``deps.check_scrape``): its figures name keys' load, models and
errors, which are an operator's business."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..errors import BackendError
from ..metrics_view import labelled, replica_labels
from .deps import AppContext, app_state, bearer, check_scrape, context

if TYPE_CHECKING:
    from ..metrics_publish import Publisher

VIEW_TIMEOUT_S = 5.0
T = TypeVar("T")

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready once warmed up (with the GPU engine, once ``models.engine_warm``'s runners are built: ``engine`` says
    how each stands); under ``serve --workers`` also only while this worker's model process answers
    (``app.state.model_check``: a wedged or restarting one makes the worker not ready, so a balancer moves on)."""
    ctx = context(request)
    ready = ctx.ready.is_set()
    registry = ctx.translator.registry
    # auth: whether requests need a key (the web page asks for one before its first request, not after a 401)
    body: dict[str, object] = {"ready": ready, "loaded": registry.loaded(), "auth": ctx.settings.server.auth}
    workers = registry.workers()  # supervised worker processes: a crash loop makes its routes unavailable, not
    if workers:  # the server (the others still serve): named here, not a 503
        body["workers"] = {key: health.to_dict() for key, health in workers.items()}
        if down := registry.unavailable():
            body["unavailable"] = down
    app = app_state(request.app)
    check = app.model_check
    if check is not None:
        problem = await check()
        body["model_process"] = problem or "ok"
        body["ready"] = ready = ready and problem is None
    engine = app.engine_state
    if engine is not None and body.get("model_process", "ok") == "ok":  # models.engine_warm's runners, here or
        probed = engine()  # (a worker) in its model process, once that answers
        states = probed if isinstance(probed, dict) else await probed
        if states:
            body["engine"] = states
            body["ready"] = ready = ready and all(state == "ready" for state in states.values())
    return JSONResponse(body, status_code=200 if ready else 503)


PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def page(ctx: AppContext) -> bytes:
    """This server's /metrics page: labelled with ``replica`` and ``role`` when it has a replica name (a cluster
    gateway, or ``server.replica`` set: metrics_view.py)."""
    server = ctx.settings.server
    text = ctx.metrics.render()
    return labelled(text, {"replica": server.replica, "role": server.role}) if server.replica else text


@router.get("/metrics")
async def metrics_route(request: Request) -> Response:
    await check_scrape(context(request), bearer(request))
    return Response(page(context(request)), media_type=PROMETHEUS)


def publisher_of(request: Request) -> Publisher | None:
    """The cluster view's source; None without a shared Redis: this server is then a cluster of one."""
    return app_state(request.app).metrics_publisher


def alone(ctx: AppContext) -> bytes:
    """A server without a shared Redis, as its cluster view: its own page, labelled as the publisher labels it."""
    server = ctx.settings.server
    return labelled(ctx.metrics.render(), replica_labels(server.replica, server.role, server.port))


async def cluster_view(read: Awaitable[T]) -> T:
    """``read`` (the publisher's view) within VIEW_TIMEOUT_S; Redis failing or slow is a 503."""
    from redis.exceptions import RedisError  # loaded with the publisher already (metrics_publish.py)

    try:
        return await asyncio.wait_for(read, VIEW_TIMEOUT_S)
    except (RedisError, OSError, TimeoutError) as exc:
        raise BackendError(f"reading the cluster's metrics from Redis failed: {exc!r}") from exc


@router.get("/metrics/cluster")
async def cluster_metrics_route(request: Request) -> Response:
    """Every replica's /metrics (labelled replica, role) as one page: scrape one server for the whole cluster (a
    server without a shared Redis: its own)."""
    await check_scrape(context(request), bearer(request))
    publisher = publisher_of(request)
    page_ = await cluster_view(publisher.view()) if publisher is not None else alone(context(request))
    return Response(page_, media_type=PROMETHEUS)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, object]:
    registry = context(request).translator.registry
    return {"models": registry.capabilities(), "pairs": registry.served_pairs(), "routes": registry.pair_routes()}
