"""Health and discovery (no key): /healthz, /readyz, /v1/models; and /metrics, which with auth on takes an admin
key or the scrape token ``server.metrics_token`` (``deps.check_scrape``): its figures name keys' load, models and
errors, which are an operator's business."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .deps import bearer, check_scrape, context

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
    body: dict[str, Any] = {"ready": ready, "loaded": registry.loaded(), "auth": ctx.settings.server.auth}
    workers = registry.workers()  # supervised worker processes: a crash loop makes its routes unavailable, not
    if workers:  # the server (the others still serve): named here, not a 503
        body["workers"] = {key: health.to_dict() for key, health in workers.items()}
        if down := registry.unavailable():
            body["unavailable"] = down
    check: Callable[[], Awaitable[str | None]] | None = getattr(request.app.state, "model_check", None)
    if check is not None:
        problem = await check()
        body["model_process"] = problem or "ok"
        body["ready"] = ready = ready and problem is None
    engine: Callable[[], Any] | None = getattr(request.app.state, "engine_state", None)
    if engine is not None and body.get("model_process", "ok") == "ok":  # models.engine_warm's runners, here or
        states = engine()  # (a worker) in its model process, once that answers
        if inspect.isawaitable(states):
            states = await states
        if states:
            body["engine"] = states
            body["ready"] = ready = ready and all(state == "ready" for state in states.values())
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics_route(request: Request) -> Response:
    await check_scrape(context(request), bearer(request))
    return Response(context(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    registry = context(request).translator.registry
    return {"models": registry.capabilities(), "pairs": registry.served_pairs(), "routes": registry.pair_routes()}
