"""Health and discovery (no key): /healthz, /readyz, /metrics, /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .deps import context

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    ctx = context(request)
    body = {"ready": ctx.ready.is_set(), "loaded": ctx.translator.registry.loaded()}
    return JSONResponse(body, status_code=200 if ctx.ready.is_set() else 503)


@router.get("/metrics")
async def metrics_route(request: Request) -> Response:
    return Response(context(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    registry = context(request).translator.registry
    return {"models": registry.capabilities(), "pairs": registry.served_pairs(), "routes": registry.pair_routes()}
