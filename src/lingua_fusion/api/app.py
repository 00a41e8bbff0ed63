"""The FastAPI application: REST routes over the engine, auth, limits, metrics."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from .. import glossary as glossary_mod
from .. import langs
from ..config import Settings
from ..files import FileTranslator, FileRequest
from ..files.captions import to_srt, to_vtt
from ..errors import (EmptyInput, InvalidParameter, LinguaFusionError, MediaTypeMismatch, Overloaded,
                      PermissionDenied, TooLarge)
from ..media import sniff
from ..observability import Metrics
from ..state.sqlite import ApiKey, SQLiteStore
from ..state.streams import open_store
from ..engine.hub import StreamHub
from . import errors as error_map
from . import spec
from . import ws as ws_routes

log = logging.getLogger("lingua_fusion.api")
OUTPUT_FORMATS = {"json", "srt", "vtt", "text", "wav"}
ANONYMOUS = ApiKey("anonymous", "no-auth", ("translate", "admin"), 0.0, False)


class Admission:
    """Bounded concurrency: at most ``running`` translations at once and ``waiting`` queued; beyond that, 429."""

    def __init__(self, running: int, waiting: int, metrics: Metrics) -> None:
        self.limiter = anyio.CapacityLimiter(running)
        self.max_waiting = waiting
        self.waiting = 0
        self.metrics = metrics

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.limiter.available_tokens == 0 and self.waiting >= self.max_waiting:
            self.metrics.rejected.inc()
            raise Overloaded("the server is at capacity; retry later", retry_after=2.0)
        self.waiting += 1
        self.metrics.waiting.set(self.waiting)
        try:
            await self.limiter.acquire()
        finally:
            self.waiting -= 1
            self.metrics.waiting.set(self.waiting)
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self.metrics.in_flight.dec()
            self.limiter.release()


def _bearer(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    if h.lower().startswith("bearer "):
        return h[7:].strip()
    return request.headers.get("x-api-key")


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def create_app(settings: Settings | None = None, engine: FileTranslator | None = None, *, warm: bool = True) -> FastAPI:
    settings = settings or Settings()
    engine = engine or FileTranslator(settings)
    store = SQLiteStore(settings.resolved_state_dir())
    metrics = Metrics()
    engine.observer = metrics
    hub = StreamHub(engine.registry, settings, metrics)
    hub.store = open_store(settings.resolved_state_dir(), settings.state.redis_url,
                           max_log=settings.state.max_log_finals, retention_s=settings.state.retention_s)
    baseline_hub = StreamHub(engine.registry, settings, None)  # the per-stream design, for benchmarks only
    baseline_hub.mode = "per-stream"
    baseline_hub.admission = False
    ready = threading.Event()

    def _warm() -> None:
        try:
            engine.registry.asr("en")
            engine.registry.vad()
            apertium = engine.registry.mt("apertium")
            apertium.warm("en", "es")
        except LinguaFusionError as exc:
            log.error("warm-up failed: %s", exc.message)
        finally:
            ready.set()

    async def _compact_loop() -> None:
        """Log compaction: drop streams past their retention, trim long logs (state/streams.py)."""
        while True:
            await asyncio.sleep(settings.state.compact_interval_s)
            if hub.link is None:
                continue
            try:
                done = await hub.link.call("compact", settings.state.retention_s, settings.state.max_log_finals)
                if any(done.values()):
                    log.info("stream log compacted: %s", done)
            except LinguaFusionError as exc:
                log.warning("stream log compaction failed: %s", exc.message)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warm_task = asyncio.create_task(asyncio.to_thread(_warm)) if warm else None
        if not warm:
            ready.set()
        compactor = asyncio.create_task(_compact_loop(), name="compact")
        try:
            yield
        finally:
            compactor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await compactor
            if warm_task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(warm_task, timeout=120)
            await hub.close()
            await baseline_hub.close()
            hub.store.close()
            engine.close()
            store.close()

    app = FastAPI(title="LinguaFusion", version="0.1.0", lifespan=lifespan,
                  description="Real-time multimodal translation: speech, images, text -> text, speech, braille.")
    app.state.metrics = metrics
    app.state.engine = engine
    app.state.store = store
    app.state.settings = settings
    admission = Admission(settings.server.max_concurrent_requests, settings.server.max_waiting_requests, metrics)
    app.state.hub = hub

    async def drain(deadline_s: float = 10.0) -> None:
        await hub.drain(deadline_s)
        await baseline_hub.drain(deadline_s)

    app.state.drain = drain
    error_map.install(app)

    def auth(request: Request, scope: str = "translate") -> ApiKey:
        if not settings.server.auth:
            return ANONYMOUS
        return store.authenticate(_bearer(request), scope)

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        route = request.scope.get("route")
        metrics.requests.labels(route=getattr(route, "path", "unmatched"), status=str(response.status_code)).inc()
        return response

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        body = {"ready": ready.is_set(), "loaded": engine.registry.loaded()}
        return JSONResponse(body, status_code=200 if ready.is_set() else 503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return {"models": engine.registry.capabilities(), "pairs": engine.registry.served_pairs()}

    async def read_form(request: Request) -> Any:
        limit = settings.limits.max_upload_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit + 64 * 1024:
            raise TooLarge(f"request body is {length} bytes; the limit is {limit}",
                           details={"limit": "max_upload_bytes"})
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
            raise InvalidParameter("send multipart/form-data (a 'file' or a 'text' field plus parameters)")
        try:
            return await request.form(max_files=2, max_fields=32, max_part_size=settings.limits.max_text_chars * 4)
        except (MultiPartException, StarletteHTTPException, ValueError) as exc:  # malformed multipart bodies
            raise InvalidParameter(f"malformed form body: {exc}") from exc

    @app.post("/v1/translate", response_model=None, openapi_extra=spec.body(spec.TRANSLATE))
    async def translate(request: Request) -> Response:
        key = auth(request)
        form = await read_form(request)
        upload = form.get("file")
        data: bytes | None = None
        filename = ""
        if upload is not None and not isinstance(upload, str):
            data = await upload.read(settings.limits.max_upload_bytes + 1)
            filename = upload.filename or ""
            if len(data) > settings.limits.max_upload_bytes:
                raise TooLarge("file exceeds the upload limit", details={"limit": "max_upload_bytes"})
        text = form.get("text")
        if data is None and text is None:
            raise EmptyInput("send a 'file' or a 'text' field")
        source_modality = str(form.get("source_modality") or ("text" if text is not None else "audio"))
        target_lang = form.get("target_lang")
        if not target_lang:
            raise InvalidParameter("target_lang is required", details={"field": "target_lang"})
        fmt = str(form.get("output_format") or "json").lower()
        if fmt not in OUTPUT_FORMATS:
            raise InvalidParameter(f"output_format must be one of {sorted(OUTPUT_FORMATS)}")
        terms: list[glossary_mod.Term] = []
        if _flag(form.get("enable_glossary", "false")):
            gid = form.get("glossary_id") or store.latest_glossary(key.key_id)
            if gid:
                _meta, terms = store.get_glossary(key.key_id, str(gid))
        req = FileRequest(source_modality=source_modality, target_lang=str(target_lang),
                          target_modality=str(form.get("target_modality") or "text"),
                          source_lang=str(form.get("source_lang")) if form.get("source_lang") else None,
                          data=data, text=str(text) if text is not None else None, glossary=terms,
                          filename=filename)
        if data is not None and text is None and source_modality.strip().lower() == "text" \
                and sniff(data).family == "text":
            try:  # sniff reads the first 4 KiB only; a bad byte after them was a 500 (UnicodeDecodeError)
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MediaTypeMismatch(f"declared text but the file is not UTF-8 (byte {exc.start})",
                                        details={"detected": "binary"}) from exc
        engine.check_pair(langs.normalize(req.source_lang) if req.source_lang else None,
                          langs.normalize(req.target_lang, field="target_lang"))
        async with admission.slot():
            with anyio.fail_after(settings.server.request_timeout_s):
                result = await anyio.to_thread.run_sync(engine.translate, req)
        if fmt == "srt":
            return PlainTextResponse(to_srt(result.segments), media_type="application/x-subrip")
        if fmt == "vtt":
            return PlainTextResponse(to_vtt(result.segments), media_type="text/vtt")
        if fmt == "text":
            return PlainTextResponse(result.braille if result.braille is not None else result.text)
        if result.audio is not None and fmt == "wav":
            return Response(result.audio, media_type="audio/wav",
                            headers={"X-LinguaFusion-Text": quote(result.text[:2000])})
        body = result.to_json_dict()
        if result.audio is not None:
            body["audio_base64"] = base64.b64encode(result.audio).decode("ascii")
        return JSONResponse(body)

    @app.post("/v1/glossaries", openapi_extra=spec.body(spec.GLOSSARY))
    async def upload_glossary(request: Request) -> JSONResponse:
        key = auth(request)
        form = await read_form(request)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raw = str(form.get("terms") or "").encode("utf-8")
            filename = ""
        else:
            raw = await upload.read(2_000_000)
            filename = upload.filename or ""
        if not raw.strip():
            raise EmptyInput("send a glossary 'file' (CSV or JSON) or a 'terms' field")
        terms = glossary_mod.parse(raw, max_terms=settings.limits.max_glossary_terms, filename=filename)
        src = form.get("source_lang")
        tgt = form.get("target_lang")
        gid = store.put_glossary(key.key_id, str(form.get("name") or filename or "glossary"), terms,
                                 langs.normalize(str(src)) if src else None,
                                 langs.normalize(str(tgt)) if tgt else None)
        return JSONResponse({"glossary_id": gid, "terms": len(terms)}, status_code=201)

    @app.get("/v1/glossaries")
    async def list_glossaries(request: Request) -> dict[str, Any]:
        key = auth(request)
        return {"glossaries": store.list_glossaries(key.key_id)}

    @app.get("/v1/glossaries/{glossary_id}")
    async def get_glossary(glossary_id: str, request: Request) -> dict[str, Any]:
        key = auth(request)
        meta, terms = store.get_glossary(key.key_id, glossary_id)
        return {**meta, "terms": [{"source": t.source, "target": t.target} for t in terms]}

    @app.get("/v1/admin/faults")
    async def list_faults(request: Request) -> dict[str, Any]:
        auth(request, "admin")
        return {"chaos": settings.server.chaos, "faults": {k: f.public() for k, f in hub.faults.items()},
                "breaker": {slo: hub.breaker.level(slo) for slo in ("interactive", "standard", "batch")}}

    @app.post("/v1/admin/faults", openapi_extra=spec.body(spec.FAULT))
    async def set_fault(request: Request) -> JSONResponse:
        """Chaos: inject a model backend fault (delay, error, hang, garbage; see engine/faults.py) into a fraction of
        model batches. Only with an admin key on a server started with --chaos."""
        from ..serving.faults import parse_fault

        auth(request, "admin")
        if not settings.server.chaos:
            raise PermissionDenied("fault injection is off: start the server with --chaos")
        try:
            body = await request.json()
        except ValueError as exc:
            raise InvalidParameter("send a JSON object {model, kind, delay_s, fraction, after}") from exc
        fault = parse_fault(body)
        hub.faults[f"{fault.model}/{fault.kind}"] = fault
        return JSONResponse({"faults": {k: f.public() for k, f in hub.faults.items()}}, status_code=201)

    @app.delete("/v1/admin/faults")
    async def clear_faults(request: Request) -> dict[str, Any]:
        auth(request, "admin")
        hub.faults.clear()
        return {"faults": {}}

    @app.post("/v1/keys", openapi_extra=spec.body(spec.KEY))
    async def create_key(request: Request) -> JSONResponse:
        auth(request, "admin")
        try:
            body = await request.json()
        except ValueError:
            body = {}
        raw_scopes = body.get("scopes") if isinstance(body, dict) else None
        if raw_scopes is not None and not isinstance(raw_scopes, list):  # e.g. a number: not iterable, was a 500
            raise InvalidParameter("scopes must be a list of 'translate' and/or 'admin'")
        scopes = tuple(raw_scopes or ["translate"])
        if any(s not in ("translate", "admin") for s in scopes):
            raise InvalidParameter("scopes must be 'translate' and/or 'admin'")
        secret, k = store.create_key(str(body.get("name", "")) if isinstance(body, dict) else "", scopes)
        return JSONResponse({"api_key": secret, "key_id": k.key_id, "scopes": list(k.scopes)}, status_code=201)

    @app.get("/v1/keys")
    async def list_keys(request: Request) -> dict[str, Any]:
        auth(request, "admin")
        return {"keys": [{"key_id": k.key_id, "name": k.name, "scopes": list(k.scopes), "created": k.created,
                          "revoked": k.revoked} for k in store.list_keys()]}

    @app.delete("/v1/keys/{key_id}")
    async def revoke_key(key_id: str, request: Request) -> dict[str, Any]:
        auth(request, "admin")
        store.revoke_key(key_id)
        return {"key_id": key_id, "revoked": True}

    def ws_auth(secret: str | None) -> ApiKey:
        return ANONYMOUS if not settings.server.auth else store.authenticate(secret)

    def ws_glossary(key: ApiKey, gid: str) -> list[glossary_mod.Term]:
        return store.get_glossary(key.key_id, str(gid))[1]

    ws_routes.install(app, {"batched": hub, "per-stream": baseline_hub}, ws_auth, ws_glossary)
    app.state.started = time.time()
    return app
