"""The executor: every stream's and file's model work through one scheduler and the model threads (the ModelPort).

There is no worker task. A step runs where work arrives and where work ends: a submit asks for one at the end of
its turn of the loop (so the items submitted in one turn batch together), and a batch's or an item's settling
starts the next. A step reads: next batch from the scheduler -> started on the model's thread (serving/threads.py:
a future, settled on the loop) -> when it is done, each item's future resolved -> observed (cost model, metrics,
stage latency to the StageObserver). Shed items resolve to ``None``. A model key runs one batch at a time unless
it has more lanes: Whisper through CTranslate2 runs ``models.asr_parallel`` batches at once (CTranslate2 decodes
them in parallel); a batch that ran while another lane's did is an "overlapped" cost sample, and admission counts
the lanes at that cost once it has seen some (scheduler.capacity). A continuous runner (serving/gpu) is handed
what it has room for and settles item by item. VAD needs no scheduling (it is cheap and every caption waits on
it): every stream's pending windows run in one call on the VAD thread. Admission (gate.py) refuses a stream whose
load would break admitted streams' SLOs."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from ..config import Settings
from ..errors import BackendError, BackendFailed, LinguaFusionError, ModelTimeout, Overloaded
from ..models.registry import Registry
from ..tracing import TraceRef, record_batch
from .demand import first_measures, model_scheduler, stream_demand, vad_seconds, work_units
from .fair import round_robin
from .faults import Fault
from .gate import Gate
from .keys import ModelKey
from .ports import FILE_CLASS, CallContext, MtInput, StageObserver, TypedPort, stage_deadline
from .scheduler import Demand, WorkItem
from .service_curve import InFlight
from .threads import (
    ContinuousRunner,
    Flight,
    ModelThreads,
    Pending,
    Runner,
    batch_timeout,
    build_runner,
    busy_seconds,
    check_outputs,
    fail,
    failure_of,
    lanes_of,
    on_loop,
    pending_of,
    resolve,
    step_profile,
)

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.serving")

MODES = ("batched", "unbatched", "per-stream")
VAD_BATCH = 256  # streams' windows per VAD call
VAD_BATCH_S = 120.0  # seconds of audio per VAD call (a 4 MiB PCM message is 131 s: it goes alone)
VAD_KEY = ModelKey.vad()
SERVICE_WARMUP = 3  # a continuous runner's first items settled: not admission's measure of it (warm-up)


class Executor(TypedPort):
    """Implements ``ModelPort``. ``mode``: "batched" = cross-stream batches on trimmed windows (the default);
    "unbatched" = one item per call, trimmed windows; "per-stream" = one item per call through faster-whisper's own
    30 s-window decode and no admission control (the baseline the benchmarks compare against)."""

    def __init__(self, registry: Registry, settings: Settings, metrics: Metrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic, alpha: float = 0.65, max_batch: int = 8,
                 max_queue: int = 256, mode: str = "batched", observer: StageObserver | None = None,
                 backends: Mapping[str, Callable[[ModelKey], Runner | ContinuousRunner]] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.mode = mode
        self.observer = observer
        self.scheduler = model_scheduler(alpha, max_batch if mode == "batched" else 1, max_queue)
        self.threads = ModelThreads(self._timeout, metrics, self.lanes)
        self.backends = dict(backends or {})  # task -> factory of its runner (the GPU engine); default: threads.py
        self.retries = 2  # committed work retried after a backend failure (tentative work is not)
        self._runners: dict[ModelKey, Runner | ContinuousRunner] = {}
        # the continuous ones again, told once when each is made: a Protocol's isinstance costs microseconds, and the
        # calls below ask per item (a worker's loop spent 9 % of its time there on its streams' VAD calls)
        self._continuous: dict[ModelKey, ContinuousRunner] = {}
        self._busy: dict[ModelKey, int] = {}  # batches running per key (at most its lanes)
        self._ticks: dict[ModelKey, asyncio.TimerHandle] = {}  # a key's next look while its work waits
        self._kicking: set[ModelKey] = set()  # keys whose step runs at the end of this turn of the loop
        self._lanes: dict[ModelKey, int] = {}
        self._flights: dict[ModelKey, list[Flight]] = {}  # batches in flight per key (one per busy lane)
        self._in_flight: dict[ModelKey, InFlight] = {}  # a continuous runner's items handed over, not yet settled
        self._served: dict[ModelKey, int] = {}  # ... and settled
        self._warm: dict[ModelKey, float] = {}  # when its first item settled: items handed before waited on its build
        self.gate = Gate(self.scheduler, settings, metrics, clock, control=mode != "per-stream")  # admission
        self.owed, self.meter = self.gate.owed, self.gate.meter  # what it is told (late.py, rates.py)
        self._vad: list[Pending] = []
        self._closing = False

    @property
    def faults(self) -> dict[str, Fault]:
        """Chaos faults (server started with --chaos): "model/kind" -> fault."""
        return self.threads.faults

    # ---- ModelPort --------------------------------------------------------------------------------------------
    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        if isinstance(payload, MtInput) and not payload.scope and ctx.key_id:
            payload = replace(payload, scope=ctx.key_id)  # the translation memory is per key (tm/key.py)
        if not ctx.tentative and ctx.slo != FILE_CLASS and key.task != "vad":  # a caption: admission counts it
            self.gate.submitted(key, ctx.stream_id)  # once, not per retry (rates.py)
        attempt = 0
        while True:
            try:
                if key.task == "vad" and not self._is_continuous(key):
                    return await self._submit_vad(payload, ctx.key_id, ctx.trace)
                return await self._submit(key, payload, ctx)
            except BackendError as exc:
                # a file's item whose model process crashed is not sent again: one input that crashes it would
                # crash it again, into a crash loop for every key (the request gets 503 backend_failed to retry)
                crashed = ctx.slo == FILE_CLASS and isinstance(exc, BackendFailed)
                if ctx.tentative or attempt >= self.retries or self._closing or crashed:
                    raise
                attempt += 1
                if self.metrics is not None:
                    self.metrics.model_retries.labels(model=str(key)).inc()
                await asyncio.sleep(0.25 * attempt)

    def depth(self, key: ModelKey) -> int:
        return self.scheduler.depth(key)

    async def _submit(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        self._runner(key)
        now = self.clock()
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        item = WorkItem(stream_id=ctx.stream_id, model=key, stage=key.stage, enqueued=now,
                        deadline=stage_deadline(ctx.slo, key.stage, now if ctx.start is None else ctx.start),
                        importance=ctx.importance, tentative=ctx.tentative,
                        payload=Pending(payload, fut, now, trace=ctx.trace), slo=ctx.slo, key_id=ctx.key_id,
                        units=work_units(payload))
        queued, shed = self.scheduler.submit_or_shed(item)
        if shed is not None:  # a partial dropped to make room: its caller hears so now, not at its timeout
            resolve(pending_of(shed).future, None)
        if not queued:
            if ctx.tentative:
                return None
            raise Overloaded(f"the {key} queue is full", retry_after=1.0)
        if not ctx.tentative and ctx.slo != FILE_CLASS and key in self._warm:  # a continuous runner's caption:
            self.owed.add(key, item.seq, stage_deadline(ctx.slo, key.stage, now))  # late past its stage's budget
        self._soon(key)
        if self.metrics is not None:
            self.metrics.depth(str(key), self.scheduler.depth(key))
        return await self._result(key, fut, item)

    async def _result(self, key: ModelKey, fut: asyncio.Future[object],
                      item: WorkItem[ModelKey] | None = None) -> object:
        # committed work has no deadline to give up on, but a wedged backend must not hang the stream forever
        wait_s = self.settings.server.request_timeout_s
        try:
            return await asyncio.wait_for(fut, timeout=wait_s)
        except TimeoutError:
            if item is not None:  # still queued (a runner still starting, say): a retry must not run it twice
                self.scheduler.withdraw(item)
            raise ModelTimeout(f"{key} gave no result in {wait_s:.0f} s") from None
        except asyncio.CancelledError:  # the caller is gone (its stream ended, was taken over or shed): nobody
            if item is not None:  # reads this result, so it leaves the queue instead of taking a batch's room
                self.scheduler.withdraw(item)
                if self.metrics is not None:
                    self.metrics.depth(str(key), self.scheduler.depth(key))
            raise
        finally:
            if item is not None:
                self.owed.settle(key, item.seq)

    async def _submit_vad(self, audio: object, key_id: str = "", trace: TraceRef | None = None) -> object:
        if len(self._vad) >= self.scheduler.max_queue * 4:
            raise Overloaded("the VAD queue is full", retry_after=1.0)
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._vad.append(Pending(audio, fut, key_id=key_id, trace=trace))
        self._runner(VAD_KEY)
        self._soon(VAD_KEY)
        return await self._result(VAD_KEY, fut)

    # ---- steps ----------------------------------------------------------------------------------------------
    def _runner(self, key: ModelKey) -> Runner | ContinuousRunner:
        runner = self._runners.get(key)
        if runner is None:
            factory = self.backends.get(key.task)
            runner = factory(key) if factory is not None else build_runner(key, self.registry,
                                                                           per_stream=self.mode == "per-stream")
            self._runners[key] = runner
            if isinstance(runner, ContinuousRunner):
                self._continuous[key] = runner
            continuous = key in self._continuous
            first_measures(self.scheduler, key, continuous)  # and admission counts a key's capacity per lane:
            self._lanes[key] = self.scheduler.lanes[key] = 1 if continuous else lanes_of(key, self.settings)
        return runner

    def _is_continuous(self, key: ModelKey) -> bool:
        """Whether ``key``'s runner (made now if it was not yet) is a continuous one."""
        self._runner(key)
        return key in self._continuous

    def _batch_runner(self, key: ModelKey) -> Runner:
        """``key``'s runner, which its worker runs one batch at a time (not a continuous runner)."""
        assert key not in self._continuous  # (told when it was made: serving/threads.py's Protocols)
        return cast(Runner, self._runners[key])

    def build_now(self, key: ModelKey) -> Runner | ContinuousRunner:
        """``key``'s runner made now, not at its first call (a GPU runner builds on its own: ``engine_warm``)."""
        return self._runner(key)

    def stuck(self) -> dict[str, int]:
        """Model calls still running past their timeout, by model key (serving/threads.py)."""
        return self.threads.stuck()

    def lanes(self, key: ModelKey) -> int:
        """Batches of ``key`` that run at once (its workers and model threads)."""
        return self._lanes.get(key, 1)

    def _timeout(self, key: ModelKey, payloads: list[object], warm: bool) -> float:
        return batch_timeout(self.settings, self.scheduler.cost(key).predict(len(payloads)), payloads, warm)

    def _soon(self, key: ModelKey) -> None:
        """``_kick`` at the end of this turn of the loop (a callback, once per key): the items submitted in the
        same turn (a gather over a caption's targets, every stream woken by one VAD call) go in one batch."""
        if key not in self._kicking:
            self._kicking.add(key)
            asyncio.get_running_loop().call_soon(self._kicked, key)

    def _kicked(self, key: ModelKey) -> None:
        self._kicking.discard(key)
        self._kick(key)

    def _kick(self, key: ModelKey) -> None:
        """Start what ``key`` can run now, in the caller's own turn of the loop: there is no worker task, a step
        runs where work arrives (a submit) and where work ends (a batch's or an item's settling). A batch runner
        starts batches while it has a free lane; a continuous runner is handed what it has room for."""
        if self._closing:
            return
        if key in self._continuous:
            while self._hand_over(key):
                pass
        else:
            lanes, step = (1, self._vad_step) if key == VAD_KEY else (self.lanes(key), self._step)
            while self._busy.get(key, 0) < lanes and step(key):
                pass
        waiting = bool(self._vad) if key == VAD_KEY else self.scheduler.depth(key) > 0
        if waiting and key not in self._ticks:  # work left waiting (a continuous runner still starting, or full):
            # looked at again within 0.5 s, when nothing else wakes it first (partials past their deadline shed)
            self._ticks[key] = asyncio.get_running_loop().call_later(0.5, self._tick, key)

    def _tick(self, key: ModelKey) -> None:
        self._ticks.pop(key, None)
        self._kick(key)

    def _step(self, key: ModelKey) -> bool:
        """Start one batch of ``key`` on its thread. False when its queue is empty."""
        batch, shed = self.scheduler.next_batch(key, self.clock())
        for w in shed:
            resolve(pending_of(w).future, None)
        if self.metrics is not None and shed:
            self.metrics.shed.labels(model=str(key)).inc(len(shed))
        if not batch:
            return False
        t0 = self.clock()
        cold = key not in self.threads.warm  # a first batch includes loading the model: not a cost sample
        flights = self._flights.setdefault(key, [])
        flight = Flight(overlapped=bool(flights))
        for other in flights:  # they ran alongside this one too
            other.overlapped = True
        flights.append(flight)
        self._busy[key] = self._busy.get(key, 0) + 1
        running = self.threads.start(key, self._batch_runner(key), [pending_of(w).payload for w in batch])
        running.add_done_callback(functools.partial(self._stepped, key, batch, t0, cold, flight))
        return True

    def _stepped(self, key: ModelKey, batch: list[WorkItem[ModelKey]], t0: float, cold: bool, flight: Flight,
                 running: asyncio.Future[list[object]]) -> None:
        """On the loop: a batch of ``key`` is done: its items' futures resolved (a failure fails its items, not the
        model), observed; then the key's next step."""
        self._busy[key] -= 1
        self._flights[key].remove(flight)
        failure = failure_of(key, running)
        if failure is not None:
            self._failed(key, [pending_of(w) for w in batch], failure, t0)
        else:
            done = self.clock()
            for w, r in zip(batch, running.result(), strict=True):
                resolve(pending_of(w).future, r)
            self._observe(key, batch, t0, done, cold, flight.overlapped)
        self._kick(key)

    def _hand_over(self, key: ModelKey) -> bool:
        """A continuous runner's step: hand it as much scheduled work as it has room for, without waiting."""
        runner = self._continuous[key]
        room = runner.room()
        window = self.scheduler.service_window(key)
        if window is not None:  # no more in flight than admission counts the runner at
            room = min(room, window - self._flying(key).count)
        if room <= 0:  # looked at again when one of its items settles (or, for a runner still starting, in 0.5 s)
            for w in self.scheduler.shed(key, self.clock()):  # meanwhile partials past their deadline go
                resolve(pending_of(w).future, None)
            return False
        batch, shed = self.scheduler.next_batch(key, self.clock(), limit=room, committed_first=True)
        for w in shed:
            resolve(pending_of(w).future, None)
        if not batch:
            return False
        loop = asyncio.get_running_loop()
        futures = runner.submit([pending_of(w).payload for w in batch], [w.tentative for w in batch])
        handed = self.clock()
        self._flying(key).hand(len(batch), handed)
        for w, fut in zip(batch, futures, strict=True):
            fut.add_done_callback(on_loop(loop, functools.partial(self._settle, key, w, handed)))
        return True

    def _flying(self, key: ModelKey) -> InFlight:
        return self._in_flight.setdefault(key, InFlight())

    def _settle(self, key: ModelKey, w: WorkItem[ModelKey], handed: float, done: Future[object]) -> None:
        """On the loop: one item of a continuous runner finished, handed over at ``handed``. A stream's item that
        succeeded is admission's measure of the runner, in windows of its items in flight (service_curve.InFlight);
        not its first SERVICE_WARMUP items (they pay for its first calls: kernels chosen, buffers grown), nor those
        handed over before its first item settled (they all waited on its build: a GPU engine's MT runner is built
        at its first call, and those items taught admission a runner twenty times slower than it is)."""
        now = self.clock()
        served = self._served[key] = self._served.get(key, 0) + 1
        warm = self._warm.setdefault(key, now)
        failure = failure_of(key, done)
        # settled in the count first, whatever the output check says (an answer checked bad was still served)
        measured = failure is None and served > SERVICE_WARMUP and handed >= warm and w.slo != FILE_CLASS
        flight, busy = self._flying(key), functools.partial(busy_seconds, self._runners[key])  # read once a window
        if (sample := flight.settle(now - handed if measured else None, now, busy, served=failure is None)):
            self.scheduler.observe_service(key, *sample, now, flight.busy_sample, step_profile(self._runners[key]))
        try:
            result = None if failure else check_outputs(key, [pending_of(w).payload], [done.result()])[0]
        except LinguaFusionError as bad:
            failure = bad
        if failure is not None:
            self._failed(key, [pending_of(w)], failure)
        else:
            resolve(pending_of(w).future, result)
            self._observe(key, [w], w.enqueued, now, cold=True)
        self._soon(key)  # once per turn of the loop, however many of its items settled in it

    def _vad_step(self, key: ModelKey) -> bool:
        """Start one VAD call: keys in turn, at most VAD_BATCH_S of audio (another key's windows wait for one
        bounded call). False when no windows wait."""
        batch, self._vad = round_robin(self._vad, lambda p: p.key_id, lambda p: vad_seconds(p.payload),
                                       max_items=VAD_BATCH, max_units=VAD_BATCH_S)
        if not batch:
            return False
        self._busy[key] = self._busy.get(key, 0) + 1
        running = self.threads.start(key, self._batch_runner(key), [p.payload for p in batch])
        running.add_done_callback(functools.partial(self._vad_done, key, batch, self.clock()))
        return True

    def _vad_done(self, key: ModelKey, batch: list[Pending], t0: float, running: asyncio.Future[list[object]]
                  ) -> None:
        self._busy[key] -= 1
        failure = failure_of(key, running)
        if failure is not None:
            self._failed(key, batch, failure, t0)
        else:
            for p, r in zip(batch, running.result(), strict=True):
                resolve(p.future, r)
            record_batch(key, key.stage, [(p.trace, p.enqueued, False) for p in batch], t0, self.clock())
        self._kick(key)

    def _failed(self, key: ModelKey, items: list[Pending], exc: LinguaFusionError, t0: float | None = None) -> None:
        fail(key, items, exc, t0, self.clock(), self.metrics)

    def _observe(self, key: ModelKey, batch: list[WorkItem[ModelKey]], t0: float, done: float, cold: bool,
                 overlapped: bool = False) -> None:
        files = any(w.slo == FILE_CLASS for w in batch)
        if not cold and not files:  # a file's piece is not a stream's item: admission's cost model learns neither
            self.scheduler.observe(key, len(batch), done - t0, overlapped)
        record_batch(key, key.stage, [(pending_of(w).trace, w.enqueued, w.tentative) for w in batch], t0, done)
        if self.metrics is not None:
            self.metrics.batch_size.labels(model=str(key)).observe(len(batch))
            self.metrics.stage("model:" + key.task, done - t0)
            for w in batch:
                self.metrics.queue_wait.labels(model=str(key)).observe(max(0.0, t0 - w.enqueued))
            self.metrics.depth(str(key), self.scheduler.depth(key))
        if self.observer is not None and self.mode == "batched":
            for w in batch:
                if not w.tentative and w.slo != FILE_CLASS:  # files feed no stream's SLO breaker
                    self.observer.stage_done(w.slo, w.stage, done - w.enqueued, w.key_id)

    # ---- admission -------------------------------------------------------------------------------------------
    def demand(self, stream_id: str, slo: str, source: str, targets: list[str], partials: bool, step_s: float,
               inputs: list[str], detect: Sequence[str] = (), diarize: bool = False) -> Demand[ModelKey]:
        demand = stream_demand(stream_id, slo, source, targets, partials, step_s, inputs, detect, diarize)
        self.prepare(demand)
        return demand

    def prepare(self, demand: Demand[ModelKey]) -> None:
        """The runners of the models ``demand`` names (no model is loaded): admission reads their cost models."""
        for model in demand.rate:
            self._runner(model)

    async def reserve(self, demand: Demand[ModelKey], key_id: str = "") -> None:
        """``admit`` as the StreamService awaits it: a ModelPort in another process (serving/shard) answers it over
        IPC, and counts ``key_id``'s streams across every worker there; here the service's own quota does."""
        self.admit(demand)

    def admit(self, demand: Demand[ModelKey]) -> None:
        """Reserve capacity for a stream, or raise Overloaded (429) (serving/gate.py)."""
        self.gate.admit(demand)

    def readmit(self, demand: Demand[ModelKey]) -> None:
        """A stream admitted before this process started (its worker re-registers it)."""
        self.gate.readmit(demand)

    def release(self, stream_id: str) -> None:
        """A stream ended: its queued work resolves to None and its reservation is freed."""
        self.gate.released(stream_id)
        for w in self.scheduler.drop_stream(stream_id):
            resolve(pending_of(w).future, None)
        if self.metrics is not None:
            self.metrics.active_streams.set(len(self.scheduler.admitted))

    async def close(self) -> None:
        self._closing = True
        for tick in self._ticks.values():
            tick.cancel()
        self._ticks.clear()
        for p in self._vad:
            p.future.cancel()
        for runner in self._continuous.values():  # a continuous runner's own thread (serving/gpu)
            await asyncio.to_thread(runner.close)
        self.threads.close()
