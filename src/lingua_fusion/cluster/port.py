"""The ModelPort of a cluster gateway: model work on model replicas through a Serve deployment handle.

``ClusterExecutor`` is the engine's face (serving/engine.py ``Engine``) by composition: it holds a local
``Executor`` (admission, the VAD lane, the clock) and sends ASR, MT, OCR and TTS items to the model replicas
(``replica.ModelReplica.run``), where one scheduler per replica batches them with every other gateway's items. VAD
stays here: it is cheap, every caption waits on it, and a hop per 32 ms step would cost more than the model.

Contract kept from serving/ports.py: tentative work is never retried (a failure raises ``BackendError``); committed
work is retried when the replica dies or Serve has none running (a killed replica is restarted by Serve), with
backoff 0.25 s doubling to 2 s, until ``server.request_timeout_s`` after the call began; the replica itself already
retried backend failures twice. A retried item is model work only (no side effect), so running it twice is safe.
The stage latency the service's breaker hears includes the hop.

Traces: a traced call (``ctx.trace``) gets a client span here for the hop (retries included) and sends its
``traceparent`` in the ``Call``; the replica records the batch span under it with its own tracer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..config import Settings
from ..errors import BackendError, ModelTimeout, Overloaded
from ..models.registry import Registry
from ..serving.executor import Executor
from ..serving.faults import Fault
from ..serving.keys import ModelKey
from ..serving.ports import FILE_CLASS, CallContext, StageObserver, TypedPort
from ..serving.scheduler import Demand
from .wire import Call, Reply

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.cluster")
REMOTE_TASKS = frozenset({"asr", "mt", "ocr", "tts"})
BACKOFF_S = (0.25, 2.0)  # first retry after, longest wait between retries


def _hop_errors() -> tuple[type[BaseException], ...]:
    """What a deployment handle raises when the replica is gone or none is running (not a model failure)."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import RayServeException

    return (RayError, RayServeException)


class _RunMethod(Protocol):
    def remote(self, call: Call) -> Awaitable[Reply]: ...


class ModelHandle(Protocol):
    """What the gateway calls of the model replicas' Serve deployment handle: ``handle.run.remote(call)``."""

    @property
    def run(self) -> _RunMethod: ...


class ClusterExecutor(TypedPort):
    def __init__(self, registry: Registry, settings: Settings, metrics: Metrics | None = None, *,
                 handle: ModelHandle, remote: frozenset[str] = REMOTE_TASKS,
                 observer: StageObserver | None = None) -> None:
        # the gateway's own engine: admission, the VAD lane and whatever is not ``remote``; the SLO breakers hear
        # its items and, below, each hop's
        self.local = Executor(registry, settings, metrics, observer=observer)
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.clock = self.local.clock
        self.observer = observer
        self.handle = handle  # DeploymentHandle of ModelReplica
        self.remote = remote
        self.hops = 0  # calls sent to a replica, retries included
        self.hop_retries = 0  # calls sent again after the replica failed or none was running (the heartbeat says)
        self._depths: dict[ModelKey, int] = {}
        self._hop_errors: tuple[type[BaseException], ...] = (TimeoutError, *_hop_errors())
        self._closing = False
        self.others: Callable[[], int] = lambda: 0  # streams admitted on the other gateways (heartbeat.py)

    # ---- the engine's face: admission, status, lifetime (the local executor's) --------------------------------
    @property
    def faults(self) -> dict[str, Fault]:
        return self.local.faults

    @property
    def admitted(self) -> int:
        """Streams admitted on this gateway (its heartbeat tells the others)."""
        return len(self.local.scheduler.admitted)

    def demand(self, stream_id: str, slo: str, source: str, targets: list[str], partials: bool, step_s: float,
               inputs: list[str], detect: Sequence[str] = (), diarize: bool = False) -> Demand[ModelKey]:
        return self.local.demand(stream_id, slo, source, targets, partials, step_s, inputs, detect, diarize)

    async def reserve(self, demand: Demand[ModelKey], key_id: str = "") -> None:
        self.admit(demand)

    def admit(self, demand: Demand[ModelKey]) -> None:
        """The cluster-wide stream cap (``server.max_streams`` over every gateway, counted through the gateways'
        heartbeats in Redis), then this gateway's own admission (its cost models: a conservative estimate, since
        a model replica's capacity is the machine's it runs on)."""
        if self.others() + self.admitted >= self.settings.server.max_streams:
            if self.metrics is not None:
                self.metrics.streams_rejected.inc()
            raise Overloaded("the cluster has no capacity for another stream; retry later", retry_after=5.0,
                             details={"cluster_streams": self.others() + self.admitted})
        self.local.admit(demand)

    def release(self, stream_id: str) -> None:
        self.local.release(stream_id)

    def stuck(self) -> dict[str, int]:
        return self.local.stuck()

    async def close(self) -> None:
        self._closing = True
        await self.local.close()

    # ---- ModelPort ----------------------------------------------------------------------------------------------
    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        if key.task not in self.remote:
            return await self.local.run_untyped(key, payload, ctx)
        if ctx.trace is None:  # tracing off: nothing added to the call
            return await self._hop(key, payload, ctx, None)
        with ctx.trace.client(key.stage, model_key=str(key), tentative=ctx.tentative) as span:
            value = await self._hop(key, payload, ctx, span.traceparent())
            if value is None:
                span.set(shed=True)
            return value

    async def _hop(self, key: ModelKey, payload: object, ctx: CallContext, traceparent: str | None) -> object:
        loop = asyncio.get_running_loop()
        t0 = self.clock()
        deadline = loop.time() + self.settings.server.request_timeout_s
        delay = BACKOFF_S[0]
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise ModelTimeout(f"{key}: no model replica answered in time")
            try:
                self.hops += 1
                call = Call.make(key, payload, ctx, self.clock(), traceparent)  # the caption's age as of this send
                reply: Reply = await asyncio.wait_for(self.handle.run.remote(call), timeout=left)
            except self._hop_errors as exc:
                if deadline - loop.time() <= 0:
                    raise ModelTimeout(f"{key}: no model replica answered in time") from exc
                if ctx.tentative or self._closing:
                    raise BackendError(f"{key}: the model replica failed: {type(exc).__name__}") from exc
                self.hop_retries += 1
                if self.metrics is not None:
                    self.metrics.model_retries.labels(model=str(key)).inc()
                log.warning("%s: model replica call failed (%s); retrying in %.2f s", key, type(exc).__name__, delay)
                await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
                delay = min(BACKOFF_S[1], delay * 2)
                continue
            self._depths[key] = reply.depth
            value = reply.result()
            if not ctx.tentative and value is not None and self.observer is not None and ctx.slo != FILE_CLASS:
                self.observer.stage_done(ctx.slo, key.stage, self.clock() - t0, ctx.key_id)
            return value

    def depth(self, key: ModelKey) -> int:
        if key.task in self.remote:
            return self._depths.get(key, 0)  # the replica's queue, as its last reply said
        return self.local.depth(key)
