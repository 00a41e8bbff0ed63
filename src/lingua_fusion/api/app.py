"""The FastAPI application: wiring only. ``create_app`` builds the settings, the FileTranslator, the stores,
the metrics and the StreamService, and installs the lifespan, the error map and the routers:

- ``health.py``: /healthz, /readyz, /metrics, /v1/models
- ``translate.py``: POST /v1/translate
- ``glossaries.py``: /v1/glossaries
- ``admin.py``: /v1/admin/faults, /v1/keys
- ``ws.py``: /v1/streams over the StreamService (built by ``_install_streams``)
- ``rooms.py``: /v1/rooms (owner routes) and its listeners over WebSocket and server-sent events
- ``web.py``: the live-captions page (/), the operations page (/ops), stream tickets, /v1/ops/metrics
- ``headers.py``: the security headers on every response (Content-Security-Policy, nosniff, no framing)
- ``openai_audio.py``, ``openai_realtime.py``: OpenAI's audio API (/v1/audio/*) and realtime transcription
  (WS /v1/realtime) over the same FileTranslator and StreamService (docs/openai.md)

Routes reach the translator, store, settings and metrics through ``request.app.state.ctx``
(``deps.AppContext``), and the rest of what ``create_app`` builds (the streams, rooms, tickets...) through
``deps.app_state(app)``, the app's typed ``state``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import glossary as glossary_mod
from ..asgi import StatusOf
from ..config import Settings
from ..errors import LinguaFusionError
from ..files import FileTranslator
from ..models.registry import Registry
from ..observability import Metrics
from ..serving.engine import Engine
from ..serving.executor import Executor
from ..serving.gpu.server import build_executor, warm_engine
from ..serving.ports import StageObserver
from ..state.offload import Offload
from ..state.stores import open_store, open_users
from ..state.users import UserStore
from ..stream.capacity import open_quota
from ..stream.front import StreamFront
from ..stream.journal import StreamLog
from ..stream.service import Principal, StreamService
from ..stream.supervisor import BreakerSupervisor
from ..tracing import Tracer, from_settings
from ..tracing import http as tracing_http
from ..vision.stream_signs import StreamVocabularies
from . import admin, docs, glossaries, headers, health, openai_audio, openai_realtime, translate, web
from . import errors as error_map
from . import rooms as rooms_api
from . import vocab as vocab_api
from . import ws as ws_routes
from .admission import Admission
from .deps import ANONYMOUS, AppContext, AppState, app_state, route_path
from .guard import Guard
from .revocation import RevocationWatch
from .takeover import TakeoverWatch

if TYPE_CHECKING:
    from ..metrics_publish import Publisher

log = logging.getLogger("lingua_fusion.api")

# what runs while the server serves and is closed after it: entered by the lifespan around its ``yield``
StreamsLifetime = Callable[[], contextlib.AbstractAsyncContextManager[None]]


class ExecutorFactory(Protocol):
    """Builds the live streams' engine (the ModelPort) from the registry, settings and metrics, with ``observer``
    (the streams' SLO breaker supervisor, made first: stream/supervisor.py) given to its constructor."""

    def __call__(self, registry: Registry, settings: Settings, metrics: Metrics, /, *,
                 observer: StageObserver) -> Engine: ...


def create_app(settings: Settings | None = None, engine: FileTranslator | None = None, *,
               warm: bool = True, executor: ExecutorFactory | None = None, tracer: Tracer | None = None) -> FastAPI:
    """``executor`` builds the streams' ModelPort (default: an in-process ``Executor``; a cluster gateway passes
    one that calls model replicas, cluster/port.py). ``tracer``: OpenTelemetry spans go there (default: from
    ``settings.otel``, None when off; lingua_fusion/tracing)."""
    settings = settings or Settings()
    translator = engine or FileTranslator(settings)
    store = open_users(settings.resolved_state_dir(), settings.state.redis_url)  # state/users.py
    offload = Offload()
    metrics = Metrics()
    metrics.workers.watch(translator.registry.workers)
    translator.observer = metrics
    ready = threading.Event()
    streams: StreamsLifetime | None = None  # set below, once the app exists

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert streams is not None
        warm_task = asyncio.create_task(asyncio.to_thread(_warm, translator, ready)) if warm else None
        if not warm:
            ready.set()
        publishing = asyncio.create_task(publisher.run(), name="metrics-publisher") if publisher else None
        try:
            async with streams():
                yield
        finally:
            if publishing is not None and publisher is not None:  # this replica leaves the cluster view
                publishing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await publishing
                await publisher.close()
            if warm_task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(warm_task, timeout=120)
            admission.close()
            translator.close()
            store.close()
            offload.close()
            vocab_api.close(app)
            await tracing_http.shutdown(app)

    app = FastAPI(title="LinguaFusion", version="0.1.0", lifespan=lifespan,
                  description="Real-time multimodal translation: speech, images, text -> text, speech, "
                              "braille.")
    admission = Admission(settings.server.max_concurrent_requests, settings.server.max_waiting_requests,
                          metrics, nice=settings.server.file_nice)
    ctx = AppContext(settings=settings, translator=translator, store=store, metrics=metrics,
                     admission=admission, ready=ready, offload=offload)
    publisher = _publisher(ctx)
    state = app.state = AppState(ctx, publisher)  # what the routes read (deps.app_state); the rest set below
    error_map.install(app)
    app.add_middleware(CountRequests)
    app.add_middleware(Guard, settings=settings)  # outermost: Host, Origin, body bytes (api/guard.py)
    headers.install(app)  # around all of it, errors included: CSP, nosniff, no framing (api/headers.py)
    for module in (health, translate, glossaries, admin, openai_audio):
        app.include_router(module.router)
    vocab_api.install(app, settings)  # /v1/vocabularies: taught signs and lip words (api/vocab.py)
    docs.install(app)  # /docs offline, bearer auth in the OpenAPI document (api/docs.py)
    web.install(app)  # /, /ops, /static, stream tickets, /v1/ops/metrics (api/web.py)
    streams = _install_streams(app, settings, translator, metrics, store, offload, executor or build_executor)
    tracing_http.install(app, tracer if tracer is not None else from_settings(settings))
    state.started = time.time()
    return app


def _warm(translator: FileTranslator, ready: threading.Event) -> None:
    try:
        translator.registry.asr("en")
        translator.registry.vad()
        translator.registry.warm_apertium("en", "es")
    except LinguaFusionError as exc:
        log.error("warm-up failed: %s", exc.message)
    finally:
        ready.set()


class CountRequests:
    """Requests by route and status on /metrics. Plain ASGI (no BaseHTTPMiddleware): an error raised while the
    route reads its body (api/guard.py's byte count) reaches the error map as itself, not in an exception group."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = StatusOf(send)
        try:
            await self.app(scope, receive, sent)
        finally:
            path = route_path(scope.get("route"))
            app_state(scope["app"]).metrics.requests.labels(route="unmatched" if path is None else path,
                                                            status=str(sent.status)).inc()


def _publisher(ctx: AppContext) -> Publisher | None:
    """With a shared Redis, this replica's labelled page published there for the cluster view (metrics_view.py)."""
    settings = ctx.settings
    if not settings.state.redis_url:
        return None
    from ..metrics_publish import Publisher  # redis-py imports the OpenTelemetry SDK: only when Redis is set
    from ..metrics_view import labelled, replica_labels

    server = settings.server
    # whichever worker of `serve --workers` wrote last is right (each renders the sum), and a worker that stops
    # leaves the page to the others (it expires, it is not deleted)
    labels = replica_labels(server.replica, server.role, server.port)
    return Publisher(settings.state.redis_url, labels["replica"], lambda: labelled(ctx.metrics.render(), labels),
                     interval_s=server.metrics_publish_interval_s)


def _owner_revoked(store: UserStore, offload: Offload) -> Callable[[str], Awaitable[bool]]:
    async def revoked(key_id: str) -> bool:
        return key_id in await offload(store.revoked_among, [key_id])  # one read, as each request's authentication

    return revoked


def _install_streams(app: FastAPI, settings: Settings, translator: FileTranslator, metrics: Metrics,
                     store: UserStore, offload: Offload, executor: ExecutorFactory) -> StreamsLifetime:
    """Build the StreamService and, beside it, the per-stream baseline admin keys may open benchmark streams on
    (stream/front.py), set ``app.state.streams`` (the batched service), ``app.state.stream_front`` and
    ``app.state.drain``, install /v1/streams; return the streams' lifetime (the
    compaction loop and the revoked-key watch while serving; the services and the stream log closed after)."""
    log_store = open_store(settings.resolved_state_dir(), settings.state.redis_url,
                           max_log=settings.state.max_log_finals, retention_s=settings.state.retention_s)
    quota = open_quota(settings.state.redis_url, settings.server.max_streams_per_key)  # stream/quota.py
    # each service's SLO breakers are made first and given to its engine (the StageObserver) and to the service;
    # the per-stream baseline's engine reports nothing to its own (serving/engine.py)
    baseline_breakers = BreakerSupervisor(settings)
    baseline = StreamService(Executor(translator.registry, settings, mode="per-stream", observer=baseline_breakers),
                             settings, supervisor=baseline_breakers, quota=quota)

    async def glossary_for(who: Principal, gid: str) -> list[glossary_mod.Term]:
        return (await offload(store.get_glossary, who.key_id, gid))[1]

    service_log = StreamLog(log_store, metrics)
    breakers = BreakerSupervisor(settings, metrics)
    service = StreamService(executor(translator.registry, settings, metrics, observer=breakers), settings,
                            supervisor=breakers, log=service_log, metrics=metrics, glossary_for=glossary_for,
                            quota=quota)
    front = StreamFront(service, baseline)

    async def _compact_loop() -> None:
        while True:
            await asyncio.sleep(settings.state.compact_interval_s)
            try:
                done = await service.compact()
                if any(done.values()):
                    log.info("stream log compacted: %s", done)
            except LinguaFusionError as exc:
                log.warning("stream log compaction failed: %s", exc.message)

    def live_keys() -> set[str]:
        return front.key_ids() | rooms.listened_owners()

    async def close_key(key_id: str) -> int:
        return await front.revoke(key_id) + await rooms.revoke_key(key_id)

    # streams of a key revoked on another worker (or server, or by the CLI) end here too (api/revocation.py), and
    # so do the listeners of its rooms
    watch = RevocationWatch(live_keys, store.revoked_among, close_key, settings.server.key_check_interval_s)
    # streams resumed on another worker or server end here within the same interval (api/takeover.py)
    takeover = TakeoverWatch(service.live_epochs, log_store.epochs, service.taken_over,
                             settings.server.key_check_interval_s)

    @contextlib.asynccontextmanager
    async def lifetime() -> AsyncIterator[None]:
        # the engine's warm languages start building now (threads of their own); /readyz waits for them
        probe = warm_engine(service.executor, settings)
        if probe is not None:  # (a worker's is its model process's, set by api/workers.py)
            app_state(app).engine_state = probe
        tasks = [asyncio.create_task(_compact_loop(), name="compact"),
                 asyncio.create_task(takeover.run(), name="takeover-watch")]
        if settings.server.auth:
            tasks.append(asyncio.create_task(watch.run(), name="revocation-watch"))
        tasks.append(asyncio.create_task(quota.run(), name="stream-quota"))  # on Redis: leases renewed, releases sent
        # file requests run their model work on the streams' engine: one scheduler, shared batches, fair keys
        translator.use_engine(service.executor, asyncio.get_running_loop())
        try:
            yield
        finally:
            translator.use_engine(None)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            # each closed by its maker, users first: the streams, then the rooms they publish to, then the engines
            # their model work ran on, then the stream log they wrote
            await front.close()
            await rooms.close()
            await service.executor.close()
            await baseline.executor.close()
            await service_log.close()
            await quota.close()

    state = app_state(app)
    state.streams = service
    # streams with a vocabulary_id read signs and lips (api/vocab.py, vision/)
    service.vocabularies = StreamVocabularies(state.vision)
    # rooms: api/rooms.py, rooms/; a room's listener tokens are dead once its owner's key is revoked
    revoked = _owner_revoked(store, offload) if settings.server.auth else None
    rooms = service.rooms = rooms_api.install(app, settings, metrics, translator.registry, owner_revoked=revoked)
    tm = translator.registry.translation_memory()
    if tm is not None:  # its hits, misses and evictions on /metrics
        from ..tm.metrics import TmCollector

        metrics.registry.register(TmCollector(tm))
    state.stream_front = front
    state.drain = front.drain

    async def authenticate(secret: str | None) -> Principal:
        key = ANONYMOUS if not settings.server.auth else await offload(store.authenticate, secret)
        return Principal(key.key_id, "admin" in key.scopes)

    ws_routes.install(app, front, web.ticketed(app, authenticate))  # ?ticket= once (api/tickets.py)
    openai_realtime.install(app, service, authenticate)  # WS /v1/realtime: OpenAI's clients send the header
    return lifetime
