"""Map errors to HTTP: every LinguaFusionError -> its status + {"error": {code, message, details}}."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import BackendError, Draining, LinguaFusionError, Overloaded
from .deps import app_state

log = logging.getLogger("lingua_fusion.api")
DRAINING_RETRY_AFTER = "2"  # seconds: a restarted server is back, or another one takes it


def error_response(err: LinguaFusionError) -> JSONResponse:
    return JSONResponse({"error": err.to_dict()}, status_code=err.status, headers=retry_headers(err))


def retry_headers(err: LinguaFusionError) -> dict[str, str]:
    """Retry-After for an error a retry may cure: overloaded (its own wait), draining (another server takes it),
    a backend away for now (a worker restarting: BackendFailed says when); none for the rest."""
    if isinstance(err, Draining):
        return {"Retry-After": DRAINING_RETRY_AFTER}
    if isinstance(err, Overloaded | BackendError) and err.retry_after is not None:
        return {"Retry-After": str(max(1, int(round(err.retry_after))))}
    return {}


def install(app: FastAPI) -> None:
    @app.exception_handler(LinguaFusionError)
    async def _lf(request: Request, exc: LinguaFusionError) -> JSONResponse:
        app_state(request.app).metrics.errors.labels(code=exc.code).inc()
        if exc.status >= 500:
            log.error("request failed: %s", exc.message)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        app_state(request.app).metrics.errors.labels(code="invalid_parameter").inc()
        details = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", "")} for e in exc.errors()][:10]
        return JSONResponse({"error": {"code": "invalid_parameter", "message": "request parameters are invalid",
                                       "details": {"errors": details}}}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "bad_request")
        app_state(request.app).metrics.errors.labels(code=code).inc()
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        app_state(request.app).metrics.errors.labels(code="internal").inc()
        return JSONResponse({"error": {"code": "internal", "message": "internal error; see the server log"}},
                            status_code=500)
