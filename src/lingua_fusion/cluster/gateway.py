"""A cluster gateway: our FastAPI app (REST, WebSocket streams, their sessions) as a Serve ingress replica.

The app is the one ``linguafusion serve`` runs (``api.create_app``), built on the replica (Serve's late-bound
``__serve_build_asgi_app__``) with a ``ClusterExecutor``: streams' model work goes to the model replicas. A gateway
keeps no state another gateway needs: finals and snapshots are in the Redis stream log (a client resumes on any
gateway), rooms in the rooms' Redis bus, and its heartbeat (heartbeat.py) says which streams it holds. Serve's
proxy routes each HTTP request and each WebSocket to one gateway replica; when that replica dies, the client's
reconnection is routed to a live one (or to the replica Serve starts in its place) and resumes there.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..config import Settings
from ..models.registry import Registry
from ..observability import Metrics
from ..serving.ports import StageObserver
from .heartbeat import Beat, Heartbeat, cluster_name
from .node import place_on_node
from .port import ClusterExecutor

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ..rooms.service import RoomService

MODELS_APP = "lf-models"  # the Serve application of the model replicas
MODEL_DEPLOYMENT = "ModelReplica"


class Gateway:
    def __init__(self, settings: Mapping[str, object], models_app: str = MODELS_APP) -> None:
        self.settings = Settings.model_validate(settings)
        if not self.settings.state.redis_url:
            raise ValueError("a cluster gateway needs state.redis_url: the stream log must be shared")
        self.models_app = models_app
        self.node = place_on_node(self.settings)  # its own files in <state-dir>/nodes/<node> (node.py)
        self.gateway_id = f"{socket.gethostname()}-{os.getpid()}"
        # its /metrics and its page in the cluster view are labelled with who it is (metrics_view.py)
        self.settings.server.replica, self.settings.server.role = self.gateway_id, "gateway"
        self._fastapi: FastAPI | None = None  # (``app`` is the Serve wrapper's property)
        self.executor: ClusterExecutor | None = None
        self.heartbeat: Heartbeat | None = None

    async def __serve_build_asgi_app__(self) -> FastAPI:
        from ray import serve

        from ..api import create_app

        handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=self.models_app)

        def executor(registry: Registry, settings: Settings, metrics: Metrics, /, *,
                     observer: StageObserver) -> ClusterExecutor:
            self.executor = ClusterExecutor(registry, settings, metrics, handle=handle, observer=observer)
            return self.executor

        app = self._fastapi = create_app(self.settings, warm=False, executor=executor)
        assert self.executor is not None
        server = self.settings.server
        self.heartbeat = Heartbeat(self.settings.state.redis_url or "", cluster_name(server.host, server.port),
                                   self._beat, on_drain=lambda: app.state.drain(server.drain_timeout_s))
        self.executor.others = lambda: self.heartbeat.others_admitted if self.heartbeat is not None else 0
        self.heartbeat.start()
        return app

    def _beat(self) -> Beat:
        app, executor = self._fastapi, self.executor
        assert app is not None and executor is not None  # built with the app
        state = app.state
        service = state.streams
        rooms: RoomService = state.rooms  # the rooms' service: api/rooms.py installs it on every app
        listeners = sum(len(f.listeners) for f in rooms.feeds.values())
        draining = self.heartbeat is not None and self.heartbeat.draining
        return Beat(self.gateway_id, os.getpid(), tuple(service.sessions), executor.admitted,
                    listeners, executor.hop_retries, draining, self.node, str(self.settings.resolved_state_dir()))

    async def __del__(self) -> None:
        if self.heartbeat is not None:
            await self.heartbeat.close()
