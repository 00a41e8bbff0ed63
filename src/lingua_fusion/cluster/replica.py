"""A model replica: our ``Executor`` (the SLO scheduler, its steps per model key, the model threads) serving
every gateway's streams. Serve routes each gateway's ``run`` calls here; the replica's own event loop takes many
at once (``max_ongoing_requests`` is high), so the executor's scheduler batches across all gateways' streams exactly
as it does across one server's streams. Serve's ``@serve.batch`` is not used: it batches calls of one method by
arrival, while a batch here must hold one model key's items in SLO-deadline order, which the scheduler does.

The deployment options (replicas, autoscaling, health checks) are applied in ``deploy.py``; this class is plain
so that a test can build one without Serve.

Traces: the replica sets up its own tracer from the settings it is deployed with (``otel``, as the gateways'), and
records each traced call's batch span under the gateway's client span (``Call.traceparent``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import LinguaFusionError
from ..models.registry import Registry
from ..serving.executor import Executor
from ..serving.keys import ModelKey
from ..serving.ports import SLO_CLASSES, stage_deadline
from ..tracing import from_settings
from .autoscale import PressureWindow
from .node import place_on_node
from .wire import Call, Reply

if TYPE_CHECKING:
    from ..tracing import Tracer

log = logging.getLogger("lingua_fusion.cluster")


class _Pressure:
    """The StageObserver of a replica: each committed stage's latency as a share of its budget."""

    def __init__(self, window: PressureWindow) -> None:
        self.window = window

    def stage_done(self, slo: str, stage: str, seconds: float, key_id: str = "") -> None:
        if slo in SLO_CLASSES:
            self.window.record(time.monotonic(), seconds / stage_deadline(slo, stage, 0.0))


class ModelReplica:
    tracer: Tracer | None = None  # None: tracing off (and until __init__ sets it: __del__ runs after a failed one)

    def __init__(self, settings: Mapping[str, object], warm: tuple[str, ...] = ("asr:tiny.en", "mt:en-es")) -> None:
        self.settings = Settings.model_validate(settings)
        self.node = place_on_node(self.settings)  # its own files in <state-dir>/nodes/<node> (node.py)
        self.registry = Registry(self.settings)
        self.pressure = PressureWindow()
        self.executor = Executor(self.registry, self.settings, observer=_Pressure(self.pressure))
        self.tracer = from_settings(self.settings)  # None: tracing off
        self._warm(warm)

    def _warm(self, keys: tuple[str, ...]) -> None:
        """Load the usual models before Serve routes here (the constructor runs before the replica is ready)."""
        for text in keys:
            key = ModelKey.parse(text)
            try:
                if key.task == "asr":
                    self.registry.asr(key.source)
                elif key.task == "mt":  # the default pairs are Apertium's
                    self.registry.warm_apertium(key.source, key.target)
            except LinguaFusionError as exc:
                log.warning("warm-up of %s failed: %s", key, exc.message)

    async def run(self, call: Call) -> Reply:
        """One item of model work (wire.py: the call's clock is rebuilt here, errors go back as codes)."""
        key = call.model_key()
        try:
            trace = self.tracer.remote(call.traceparent) if self.tracer is not None else None
            value = await self.executor.run(key, call.payload, call.context(time.monotonic(), trace))
        except LinguaFusionError as exc:
            return Reply.failed(exc, self.executor.depth(key))
        return Reply.ok(value, self.executor.depth(key))

    def queue_depth(self) -> int:
        return sum(len(q) for q in self.executor.scheduler.queues.values())

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom-metrics hook, read by ``autoscale.slo_policy``."""
        return {"queue_depth": float(self.queue_depth()), "slo_pressure": self.pressure.p90(time.monotonic())}

    async def close(self) -> None:
        await self.executor.close()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)

    def __del__(self) -> None:
        # Serve calls this when it stops the replica, and the process ends right after; the model threads are let
        # go here (an ``async def __del__`` would also be called, never awaited, by the garbage collector)
        self.executor.threads.close()
        tracer = self.tracer
        if tracer is not None:  # the spans still queued, sent (bounded by otel.timeout_s)
            tracer.shutdown()
