"""Prometheus metrics: requests, errors by code, per-stage latency histograms. One registry per app."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .serving.gpu.memory import MemoryCollector, RunnerLoad
from .supervise import WorkerHealth


def gauge(name: str, doc: str, labels: Sequence[str] = (), *, registry: CollectorRegistry) -> Gauge:
    """A gauge whose series, under ``serve --workers`` (one series per process, label ``pid``), are the live
    processes' only: a dead worker's or model process's last values leave /metrics with it (``mark_process_dead``)."""
    return Gauge(name, doc, labels, registry=registry, multiprocess_mode="liveall")


BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total
        self.requests = Counter("linguafusion_requests_total", "HTTP requests", ["route", "status"],
                                registry=self.registry)
        self.errors = Counter("linguafusion_errors_total", "Errors returned, by stable code", ["code"],
                              registry=self.registry)
        self.stage_latency = Histogram("linguafusion_stage_latency_seconds", "Latency per pipeline stage",
                                       ["stage"], buckets=BUCKETS, registry=self.registry)
        self.in_flight = gauge("linguafusion_requests_in_flight", "Translations running", registry=self.registry)
        self.waiting = gauge("linguafusion_requests_waiting", "Translations waiting for a worker",
                             registry=self.registry)
        self.rejected = Counter("linguafusion_rejected_total", "Requests refused for overload",
                                registry=self.registry)

        self.queue_depth_max = gauge("linguafusion_queue_depth_max", "Largest scheduler queue depth seen per model",
                                     ["model"], registry=self.registry)
        self._depth_max: dict[str, int] = {}
        self.queue_depth = gauge("linguafusion_queue_depth", "Scheduler queue depth per model", ["model"],
                                 registry=self.registry)
        self.batch_size = Histogram("linguafusion_batch_size", "Items per model batch (across streams)", ["model"],
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=self.registry)
        self.queue_wait = Histogram("linguafusion_queue_wait_seconds", "Time a work item waited for its batch",
                                    ["model"], buckets=BUCKETS, registry=self.registry)
        self.shed = Counter("linguafusion_shed_total", "Tentative work items shed (deadline unreachable)", ["model"],
                            registry=self.registry)
        self.streams_admitted = Counter("linguafusion_streams_admitted_total", "Streams admitted",
                                        registry=self.registry)
        self.streams_rejected = Counter("linguafusion_streams_rejected_total",
                                        "Stream opens refused (4429): no capacity, or the key's stream cap",
                                        registry=self.registry)
        self.streams_unavailable = Counter("linguafusion_streams_unavailable_total",
                                           "Stream opens refused (4429) while the server drains or its model process "
                                           "restarts or does not answer", registry=self.registry)
        self.active_streams = gauge("linguafusion_active_streams", "Live streams", registry=self.registry)
        self.demand_scale = gauge("linguafusion_demand_scale", "Committed items a stream asks of a model over its "
                                  "declared rate, as admission counts it (serving/rates.py; 1 until measured)",
                                  ["model"], registry=self.registry)
        self.caption_latency = Histogram("linguafusion_caption_latency_seconds",
                                         "Audio end received -> committed caption sent", ["slo"], buckets=BUCKETS,
                                         registry=self.registry)
        self.caption_quantiles = gauge("linguafusion_caption_latency_quantile_seconds",
                                       "Caption latency quantiles (HdrHistogram)", ["slo", "quantile"],
                                       registry=self.registry)
        self.degradation_level = gauge("linguafusion_degradation_level", "SLO breaker level per class (0 = normal)",
                                       ["slo"], registry=self.registry)
        self.breaker_transitions = Counter("linguafusion_breaker_transitions_total", "SLO breaker moves",
                                           ["slo", "direction"], registry=self.registry)
        self.model_failures = Counter("linguafusion_model_failures_total", "Model batches that failed, by error code",
                                      ["model", "code"], registry=self.registry)
        self.model_retries = Counter("linguafusion_model_retries_total", "Committed work items retried", ["model"],
                                     registry=self.registry)
        self.model_timeouts = Counter("linguafusion_model_timeouts_total", "Model batches abandoned past their timeout",
                                      ["model"], registry=self.registry)
        self.store_failures = Counter("linguafusion_store_failures_total", "Stream-log writes that failed",
                                      registry=self.registry)
        self.unlogged_finals = gauge("linguafusion_unlogged_finals", "Finals sent but not yet in the stream log",
                                     registry=self.registry)
        self._hdr: dict[str, HdrHistogram] = {}
        # the GPU engine's pools and encoder cache, read at scrape time: whoever builds a GpuRunner for the
        # executor's ``backends`` calls ``gpu_memory.watch(str(key), lambda: runner.memory)`` (serving/gpu/memory.py)
        self.gpu_memory = MemoryCollector()
        self.registry.register(self.gpu_memory)
        # what each GPU runner's thread did (counters, so a model process's reach /metrics under --workers):
        # whoever builds one sets ``runner.on_load = gpu_load.sink(str(key))``
        self.gpu_load = GpuLoad(self.registry)
        # the supervised worker processes (supervise/), read at scrape time: ``workers.watch(registry.workers)``
        self.workers = WorkerCollector()
        self.registry.register(self.workers)

    def depth(self, model: str, depth: int) -> None:
        self.queue_depth.labels(model=model).set(depth)
        if depth > self._depth_max.get(model, -1):
            self._depth_max[model] = depth
            self.queue_depth_max.labels(model=model).set(depth)

    def caption(self, slo: str, seconds: float) -> None:
        self.caption_latency.labels(slo=slo).observe(seconds)
        h = self._hdr.get(slo)
        if h is None:
            h = self._hdr[slo] = HdrHistogram(1, 600_000, 3)  # microseconds .. 10 min, in ms units
        h.record_value(max(1, int(seconds * 1000)))
        for label, q in (("0.5", 50.0), ("0.9", 90.0), ("0.99", 99.0), ("0.999", 99.9)):
            self.caption_quantiles.labels(slo=slo, quantile=label).set(h.get_value_at_percentile(q) / 1000)

    def stage(self, name: str, seconds: float) -> None:
        self.stage_latency.labels(stage=name).observe(seconds)

    def render(self) -> bytes:
        """This process's metrics; under ``serve --workers N`` (PROMETHEUS_MULTIPROC_DIR set) those of every process
        of the server summed (serving/shard/metrics.py)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from .serving.shard.metrics import render_all

            return render_all()
        return generate_latest(self.registry)


class GpuLoad:
    """Counters of the GPU runners' threads (serving/gpu/memory.py RunnerLoad), by model: started items, decode
    steps and the rows they carried, and the seconds the thread was busy starting work or stepping."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.items = Counter("linguafusion_gpu_runner_started_items", "Items a GPU runner encoded and joined to its "
                             "running batch", ["model"], registry=registry)
        self.steps = Counter("linguafusion_gpu_runner_steps", "Decode steps of a GPU runner", ["model"],
                             registry=registry)
        self.rows = Counter("linguafusion_gpu_runner_step_rows", "Sequences the decode steps carried (over steps: the "
                            "mean batch)", ["model"], registry=registry)
        self.starts = Counter("linguafusion_gpu_runner_starts", "Encoder batches a GPU runner started (over them: "
                              "started items per batch)", ["model"], registry=registry)
        self.encode = Counter("linguafusion_gpu_runner_encode_seconds", "Of the start phase's seconds, those in the "
                              "model's encoder call (log-mel, encoder, its outputs)", ["model"], registry=registry)
        self.busy = Counter("linguafusion_gpu_runner_busy_seconds", "Wall seconds a GPU runner's thread spent "
                            "starting work (phase=start) or stepping (phase=step)", ["model", "phase"],
                            registry=registry)

    def sink(self, model: str) -> Callable[[RunnerLoad], None]:
        """What a runner calls with its load so far (from its own thread): the counters move by the difference."""
        last = RunnerLoad()

        def told(load: RunnerLoad) -> None:
            nonlocal last
            d, last = load.since(last), load
            if d.started_items:
                self.items.labels(model=model).inc(d.started_items)
                self.starts.labels(model=model).inc(d.starts)
            if d.encode_s > 0:
                self.encode.labels(model=model).inc(d.encode_s)
            if d.steps:
                self.steps.labels(model=model).inc(d.steps)
                self.rows.labels(model=model).inc(d.step_rows)
            if d.start_s > 0:
                self.busy.labels(model=model, phase="start").inc(d.start_s)
            if d.step_s > 0:
                self.busy.labels(model=model, phase="step").inc(d.step_s)
        return told


class WorkerCollector:
    """Restarts, crashes and availability of the supervised worker processes, computed when /metrics is read."""

    def __init__(self) -> None:
        self._source: Callable[[], dict[str, WorkerHealth]] | None = None

    def watch(self, source: Callable[[], dict[str, WorkerHealth]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        restarts = CounterMetricFamily("linguafusion_worker_restarts", "Supervised worker process restarts",
                                       labels=["backend"])
        crashes = CounterMetricFamily("linguafusion_worker_crashes", "Supervised worker process crashes and kills "
                                      "(a signal, an exit, a missed deadline)", labels=["backend"])
        available = GaugeMetricFamily("linguafusion_worker_available",
                                      "1 unless the worker is in a crash loop (its route unavailable)",
                                      labels=["backend"])
        for key, health in sorted((self._source() if self._source else {}).items()):
            restarts.add_metric([key], health.restarts)
            crashes.add_metric([key], health.crashes)
            available.add_metric([key], 0 if health.state == "unavailable" else 1)
        yield restarts
        yield crashes
        yield available
