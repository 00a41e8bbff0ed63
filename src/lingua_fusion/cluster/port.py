"""The ModelPort of a cluster gateway: model work on model replicas through a Serve deployment handle.

``ClusterExecutor`` is an ``Executor`` (the StreamService needs one: admission, the VAD lane, the clock) whose
``run`` sends ASR, MT, OCR and TTS items to the model replicas (``replica.ModelReplica.run``), where one
scheduler per replica batches them with every other gateway's items. VAD stays here: it is cheap, every caption
waits on it, and a hop per 32 ms step would cost more than the model.

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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from ..config import Settings
from ..errors import BackendError, ModelTimeout, Overloaded
from ..models.registry import Registry
from ..serving.executor import Executor
from ..serving.keys import ModelKey
from ..serving.ports import FILE_CLASS, CallContext, StageObserver
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


class ClusterExecutor(Executor):
    def __init__(self, registry: Registry, settings: Settings, metrics: Metrics | None = None, *,
                 handle: ModelHandle, remote: frozenset[str] = REMOTE_TASKS,
                 observer: StageObserver | None = None) -> None:
        super().__init__(registry, settings, metrics, observer=observer)  # the gateway's SLO breakers
        self.handle = handle  # DeploymentHandle of ModelReplica
        self.remote = remote
        self.hops = 0  # calls sent to a replica, retries included
        self.hop_retries = 0  # calls sent again after the replica failed or none was running (the heartbeat says)
        self._depths: dict[ModelKey, int] = {}
        self._hop_errors: tuple[type[BaseException], ...] = (TimeoutError, *_hop_errors())
        self.others: Callable[[], int] = lambda: 0  # streams admitted on the other gateways (heartbeat.py)

    def admit(self, demand: Demand) -> None:
        """The cluster-wide stream cap (``server.max_streams`` over every gateway, counted through the gateways'
        heartbeats in Redis), then this gateway's own admission (its cost models: a conservative estimate, since
        a model replica's capacity is the machine's it runs on)."""
        if self.others() + len(self.scheduler.admitted) >= self.settings.server.max_streams:
            if self.metrics is not None:
                self.metrics.streams_rejected.inc()
            raise Overloaded("the cluster has no capacity for another stream; retry later", retry_after=5.0,
                             details={"cluster_streams": self.others() + len(self.scheduler.admitted)})
        super().admit(demand)

    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        if key.task not in self.remote:
            return await super().run_untyped(key, payload, ctx)
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
        return super().depth(key)
