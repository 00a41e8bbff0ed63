"""The stream hub: every live stream's model work goes through one scheduler and one worker per model.

A worker wakes when work arrives, asks the scheduler for the next batch (items from many streams), runs it in a
thread, feeds the measured latency back into the scheduler's cost model and resolves each item's future. Shed
items resolve to ``None``. Admission refuses a stream whose load would break admitted streams' SLOs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import BackendError, LinguaFusionError, Overloaded
from ..glossary import apply_mt_batch
from ..models.registry import Registry
from ..serving.breaker import SLOBreaker, Transition
from ..stream.storelink import StoreLink
from ..serving.faults import Fault, InjectedFault, ModelTimeout, check_outputs, delay_of, garble, pick
from ..serving.scheduler import SLO_CLASSES, STAGE_BUDGET, CostModel, Demand, Scheduler, WorkItem, stage_deadline

log = logging.getLogger("lingua_fusion.hub")

# starting cost models (seconds, measured on 2 cores); refined online from every batch
PRIOR_COSTS = {"asr:tiny.en": (0.07, 0.08), "asr:base": (0.15, 0.15), "mt": (0.05, 0.01), "ocr": (0.5, 0.5),
               "tts": (0.1, 0.2)}
MAX_HUNG = 2  # threads of one model stuck past their timeout before its calls fail fast
COLD_TIMEOUT_S = 120.0  # a model's first batch may include loading it


@dataclass
class _Call:
    arg: Any
    future: asyncio.Future[Any]
    enqueued: float = field(default_factory=time.monotonic)


class StreamHub:
    def __init__(self, registry: Registry, settings: Settings, metrics: Any = None, *,
                 clock: Callable[[], float] = time.monotonic, alpha: float = 0.65, max_batch: int = 8,
                 max_queue: int = 256) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.scheduler = Scheduler(alpha=alpha, max_batch=max_batch, max_queue=max_queue)
        self.scheduler.batch_scale = {"mt": 4}  # Apertium translates a batch in one pipeline run: up to 32 items
        self._runners: dict[str, Callable[[list[Any]], list[Any]]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self.sessions: dict[str, Any] = {}
        self._store: Any = None
        self.link: StoreLink | None = None
        self.draining = False
        self.breaker = SLOBreaker(dict(SLO_CLASSES), window_s=settings.server.breaker_window_s,
                                  k=settings.server.breaker_k, stage_share=STAGE_BUDGET)
        self._ticker: asyncio.Task[None] | None = None
        self.faults: dict[str, Fault] = {}  # chaos (server started with --chaos): model prefix -> fault
        self._fault_rng = random.Random(0)
        # one thread per model key: a backend that hangs past its timeout is abandoned with its thread (which ends
        # on its own) instead of blocking the shared executor everything else uses
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._hung: dict[str, int] = {}
        self._warm: set[str] = set()
        self.retries = 2  # committed work retried after a backend failure (tentative work is not)
        # writers of finals still unlogged when their stream closed (the log was down): owned here until done
        self.backlogs: dict[str, asyncio.Task[None]] = {}
        # "batched": cross-stream batches on trimmed windows (the default); "unbatched": one item per call, trimmed
        # windows; "per-stream": one item per call through faster-whisper's own 30 s-window decode, as
        # whisper_streaming / WhisperLive do (the baseline the benchmark compares against)
        self.mode = "batched"
        self.admission = True  # the per-stream baseline has no admission control (as WhisperLive / whisper_streaming)

    @property
    def store(self) -> Any:
        """The StreamStore (write-ahead log of finals), set by the server; None: streams are not crash-safe."""
        return self._store

    @store.setter
    def store(self, store: Any) -> None:
        self._store = store
        self.link = StoreLink(store, self.metrics) if store is not None else None

    def adopt_backlog(self, stream_id: str, task: asyncio.Task[None]) -> None:
        self.backlogs[stream_id] = task
        task.add_done_callback(lambda t: self.backlogs.pop(stream_id, None) if self.backlogs.get(stream_id) is t
                               else None)

    async def wait_backlog(self, stream_id: str, timeout: float) -> None:
        """A resume reads the log only after a closed session's last finals reached it (or ``timeout`` passed)."""
        task = self.backlogs.get(stream_id)
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout)

    async def drain(self, deadline_s: float) -> None:
        """Stop admitting; let every live stream finish its queued commits, then tell its client to reconnect."""
        self.draining = True
        sessions = list(self.sessions.values())
        if sessions:
            await asyncio.gather(*(s.drain(deadline_s) for s in sessions), return_exceptions=True)

    # ---- model keys and runners ------------------------------------------------------------------------------
    def asr_key(self, lang: str) -> str:
        return "asr:tiny.en" if lang == "en" else f"asr:base:{lang}"

    def _prior(self, key: str) -> CostModel:
        for prefix, (c0, c1) in PRIOR_COSTS.items():
            if key.startswith(prefix):
                return CostModel(c0, c1)
        return CostModel()

    def _runner(self, key: str) -> Callable[[list[Any]], list[Any]]:
        if key in self._runners:
            return self._runners[key]
        kind, _, rest = key.partition(":")
        if kind == "asr":
            lang = "en" if rest == "tiny.en" else rest.split(":")[1]

            def run_asr(args: list[Any], lang: str = lang) -> list[Any]:
                asr = self.registry.asr(lang)
                if self.mode == "per-stream":
                    out = []
                    for audio, prompt in args:
                        r = asr.transcribe(audio, language=lang, initial_prompt=prompt)
                        conf = min((s.confidence for s in r.segments), default=0.0)
                        out.append((r.text, conf))
                    return out
                return asr.transcribe_batch([a for a, _ in args], language=lang, prompts=[p for _, p in args])

            fn: Callable[[list[Any]], list[Any]] = run_asr
        elif kind == "mt":
            src, tgt = rest.split("-")

            def run_mt(args: list[Any], src: str = src, tgt: str = tgt) -> list[Any]:
                route = self.registry.mt_route(src, tgt)
                legs = [(self.registry.mt(leg.backend), leg) for leg in route.legs]

                def translate(texts: list[str]) -> list[str]:
                    for backend, leg in legs:
                        texts = backend.translate(texts, leg.source, leg.target)
                    return texts

                outs, _ = apply_mt_batch([t for t, _ in args], [g for _, g in args], translate)
                return outs

            fn = run_mt
        elif kind == "ocr":
            def run_ocr(args: list[Any]) -> list[Any]:
                ocr = self.registry.ocr()
                return [ocr.recognize(img) for img in args]

            fn = run_ocr
        elif kind == "tts":
            def run_tts(args: list[Any], lang: str = rest) -> list[Any]:
                from ..models.tts import to_wav

                tts = self.registry.tts(lang)
                return [to_wav(*tts.synthesize(text, language=lang)) for text in args]

            fn = run_tts
        else:
            raise ValueError(f"unknown model key {key}")
        self._runners[key] = fn
        self.scheduler.costs.setdefault(key, self._prior(key))
        return fn

    # ---- work ------------------------------------------------------------------------------------------------
    async def call(self, key: str, arg: Any, *, stream_id: str, slo: str, stage: str, importance: float,
                   tentative: bool, start: float | None = None) -> Any:
        """Run ``arg`` on model ``key`` within the stream's SLO. Returns None if the scheduler shed it.

        A backend failure (error, timeout, malformed output) is retried for committed work (``retries`` times, with
        backoff) and raised as BackendError after that; tentative work fails at once."""
        attempt = 0
        while True:
            try:
                return await self._call_once(key, arg, stream_id=stream_id, slo=slo, stage=stage,
                                             importance=importance, tentative=tentative, start=start)
            except BackendError:
                if tentative or attempt >= self.retries or self._closing:
                    raise
                attempt += 1
                if self.metrics is not None:
                    self.metrics.model_retries.labels(model=key).inc()
                await asyncio.sleep(0.25 * attempt)

    async def _call_once(self, key: str, arg: Any, *, stream_id: str, slo: str, stage: str, importance: float,
                         tentative: bool, start: float | None) -> Any:
        self._runner(key)
        now = self.clock()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        item = WorkItem(stream_id=stream_id, model=key, stage=stage, enqueued=now,
                        deadline=stage_deadline(slo, stage, now if start is None else start),
                        importance=importance, tentative=tentative, payload=_Call(arg, fut, now), slo=slo)
        if not self.scheduler.submit(item):
            if tentative:
                return None
            raise Overloaded(f"the {key} queue is full", retry_after=1.0)
        self._ensure_worker(key)
        self._wake[key].set()
        if self.metrics is not None:
            self.metrics.depth(key, self.scheduler.depth(key))
        # committed work has no deadline to give up on, but a wedged backend must not hang the stream forever
        return await asyncio.wait_for(fut, timeout=self.settings.server.request_timeout_s)

    def _timeout(self, key: str, n: int) -> float:
        base = self.settings.server.model_timeout_s
        if key not in self._warm:
            return max(base, COLD_TIMEOUT_S)
        return max(base, self.settings.server.model_timeout_factor * self.scheduler.costs[key].predict(n))

    async def _run_batch(self, key: str, args: list[Any]) -> list[Any]:
        """One batch on the model's own thread, with the chaos fault (if any), a timeout and the output check."""
        runner = self._runners[key]
        fault = pick(self.faults, key, self._fault_rng) if self.faults else None
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(delay_of(fault, self._fault_rng))
        if fault is not None and fault.kind == "error":
            raise InjectedFault(f"chaos: injected failure of {key}")
        hung = self._hung.get(key, 0)
        if hung >= MAX_HUNG:
            raise BackendError(f"{key} is not answering ({hung} calls stuck past their timeout); failing fast")

        def work() -> list[Any]:
            if fault is not None and fault.kind == "hang":
                time.sleep(fault.delay_s)  # chaos: a wedged backend (the thread is abandoned, then ends)
            return runner(args)

        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{key}")
        running = asyncio.get_running_loop().run_in_executor(pool, work)
        timeout = self._timeout(key, len(args))
        try:
            results = await asyncio.wait_for(asyncio.shield(running), timeout)
        except TimeoutError:
            self._hung[key] = self._hung.get(key, 0) + 1  # read again: one may have returned meanwhile
            self._pools.pop(key, None)
            pool.shutdown(wait=False)

            def unstuck(f: asyncio.Future[Any]) -> None:
                self._hung[key] = max(0, self._hung.get(key, 1) - 1)
                if not f.cancelled():
                    f.exception()  # retrieved: a late failure of an abandoned call is not an unhandled error

            running.add_done_callback(unstuck)
            if self.metrics is not None:
                self.metrics.model_timeouts.labels(model=key).inc()
            raise ModelTimeout(f"{key} did not answer a batch of {len(args)} in {timeout:.0f} s") from None
        except LinguaFusionError:
            raise
        except Exception as exc:  # a library failure inside the backend
            raise BackendError(f"{key} failed: {type(exc).__name__}: {exc}") from exc
        if fault is not None and fault.kind == "garbage":
            results = garble(key, results, self._fault_rng)
        results = check_outputs(key, args, results)
        self._warm.add(key)
        return results

    # ---- SLO circuit breaker -------------------------------------------------------------------------------
    async def caption_latency(self, slo: str, seconds: float, stage: str = "caption") -> None:
        """Every committed caption's latency, and every committed item's stage latency (queue wait + run), feeds
        the breaker (and the ticker closes idle windows)."""
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick_loop(), name="breaker")
        await self._apply(self.breaker.record(slo, seconds, self.clock(), stage))

    async def _tick_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(1.0)
            await self._apply(self.breaker.tick(self.clock()))

    async def _apply(self, transitions: list[Transition]) -> None:
        for t in transitions:
            down = t.to_level > t.from_level
            log.warning("SLO breaker %s: level %d -> %d (%s, %s window p99 %s s)", t.slo, t.from_level,
                        t.to_level, t.step, t.stage, t.p99)
            if self.metrics is not None:
                self.metrics.degradation_level.labels(slo=t.slo).set(t.to_level)
                self.metrics.breaker_transitions.labels(slo=t.slo, direction="degrade" if down else "restore").inc()
            affected = [s for s in list(self.sessions.values()) if s.spec.slo == t.slo]
            for s in affected:
                await s.notify({"type": "degraded" if down else "restored", "slo": t.slo, "level": t.to_level,
                                "step": t.step, "stage": t.stage, "window_p99_s": t.p99})
            if down and t.step == "shed_low_importance" and affected:
                victim = min(affected, key=lambda s: s.spec.importance)
                await victim.shed("the server is over its SLO; the least important stream was shed")

    def _ensure_worker(self, key: str) -> None:
        if key not in self._workers or self._workers[key].done():
            self._wake.setdefault(key, asyncio.Event())
            self._workers[key] = asyncio.create_task(self._worker(key), name=f"worker:{key}")

    async def _worker(self, key: str) -> None:
        wake = self._wake[key]
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=0.5)
            wake.clear()
            while not self._closing:
                now = self.clock()
                if self.mode != "batched":
                    self.scheduler.max_batch = 1
                batch, shed = self.scheduler.next_batch(key, now)
                for w in shed:
                    if not w.payload.future.done():
                        w.payload.future.set_result(None)
                if self.metrics is not None and shed:
                    self.metrics.shed.labels(model=key).inc(len(shed))
                if not batch:
                    break
                t0 = self.clock()
                cold = key not in self._warm  # a first batch includes loading the model: not a cost sample
                try:
                    results = await self._run_batch(key, [w.payload.arg for w in batch])
                except LinguaFusionError as exc:  # a backend failure fails this batch's items, not the worker
                    log.warning("model %s failed on a batch of %d: %s", key, len(batch), exc.message)
                    if self.metrics is not None:
                        self.metrics.model_failures.labels(model=key, code=exc.code).inc()
                    for w in batch:
                        if not w.payload.future.done():
                            w.payload.future.set_exception(exc)
                    continue
                dt = self.clock() - t0
                if not cold:
                    self.scheduler.observe(key, len(batch), dt)
                if self.metrics is not None:
                    self.metrics.batch_size.labels(model=key).observe(len(batch))
                    self.metrics.stage("model:" + key.split(":")[0], dt)
                    for w in batch:
                        self.metrics.queue_wait.labels(model=key).observe(max(0.0, t0 - w.enqueued))
                    self.metrics.depth(key, self.scheduler.depth(key))
                for w, r in zip(batch, results, strict=True):
                    if not w.payload.future.done():
                        w.payload.future.set_result(r)
                done = self.clock()
                for w in batch:
                    if not w.tentative and self.mode == "batched":
                        await self.caption_latency(w.slo, done - w.enqueued, w.stage)

    # ---- admission -------------------------------------------------------------------------------------------
    def demand(self, stream_id: str, slo: str, source: str, targets: list[str], partials: bool,
               step_s: float, *, inputs: list[str] | None = None) -> Demand:
        rate: dict[str, float] = {}
        if inputs is None or "audio" in inputs:
            asr = self.asr_key(source)
            self._runner(asr)
            # admission reserves capacity for committed work (~1 utterance per 3.3 s); tentative re-decodes use
            # what is left and are shed first, so they count at a quarter of their rate
            rate[asr] = 0.3 + (0.25 / step_s if partials else 0.0)
        for t in targets:
            if t != source:
                key = f"mt:{source}-{t}"
                self._runner(key)
                rate[key] = 0.3
        return Demand(stream_id, slo, rate)

    def admit(self, demand: Demand) -> None:
        if demand.slo not in SLO_CLASSES:
            raise ValueError(demand.slo)
        if not self.admission:
            self.scheduler.admitted[demand.stream_id] = demand
            return
        max_streams = self.settings.server.max_streams
        if len(self.scheduler.admitted) >= max_streams or not self.scheduler.admit(demand):
            if self.metrics is not None:
                self.metrics.streams_rejected.inc()
            raise Overloaded("no capacity for another stream at this SLO; retry later or use a looser SLO class",
                             retry_after=5.0, details={"slo": demand.slo,
                                                       "active_streams": len(self.scheduler.admitted)})
        if self.metrics is not None:
            self.metrics.streams_admitted.inc()
            self.metrics.active_streams.set(len(self.scheduler.admitted))

    def keys_for(self, session: Any) -> list[str]:
        """The model keys a stream uses (for its metrics events)."""
        spec = session.spec
        return [self.asr_key(spec.source_lang)] + [f"mt:{spec.source_lang}-{t}" for t in spec.targets
                                                    if t != spec.source_lang]

    def release(self, stream_id: str) -> None:
        for w in self.scheduler.drop_stream(stream_id):
            if not w.payload.future.done():
                w.payload.future.set_result(None)
        self.sessions.pop(stream_id, None)
        if self.metrics is not None:
            self.metrics.active_streams.set(len(self.scheduler.admitted))

    def vad_probs(self, audio: np.ndarray) -> np.ndarray:
        return self.registry.vad().probabilities(audio)

    async def close(self) -> None:
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker
        for ev in self._wake.values():
            ev.set()
        for task in list(self._workers.values()):
            task.cancel()
        for task in list(self._workers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers.clear()
        for task in list(self.backlogs.values()):
            task.cancel()
        for task in list(self.backlogs.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.backlogs.clear()
        for pool in self._pools.values():
            pool.shutdown(wait=False)
        self._pools.clear()
        if self.link is not None:
            self.link.close()

