"""Prometheus metrics: requests, errors by code, per-stage latency histograms. One registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("linguafusion_requests_total", "HTTP requests", ["route", "status"],
                                registry=self.registry)
        self.errors = Counter("linguafusion_errors_total", "Errors returned, by stable code", ["code"],
                              registry=self.registry)
        self.stage_latency = Histogram("linguafusion_stage_latency_seconds", "Latency per pipeline stage",
                                       ["stage"], buckets=BUCKETS, registry=self.registry)
        self.in_flight = Gauge("linguafusion_requests_in_flight", "Translations running", registry=self.registry)
        self.waiting = Gauge("linguafusion_requests_waiting", "Translations waiting for a worker",
                             registry=self.registry)
        self.rejected = Counter("linguafusion_rejected_total", "Requests refused for overload",
                                registry=self.registry)

    def stage(self, name: str, seconds: float) -> None:
        self.stage_latency.labels(stage=name).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
