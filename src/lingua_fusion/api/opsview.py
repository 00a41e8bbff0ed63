"""The operations page's data: one JSON snapshot of the same Prometheus registry that /metrics renders.

``snapshot`` reads the registry once (``collect()``, as ``generate_latest`` does) and returns every sample as it is
(``samples``: name, labels, value; what /metrics prints, minus its text format) plus a digest the page shows
(``summary``): active streams, streams admitted / refused, work shed, memory, breaker level per SLO class, queue
depths, and per-stage and per-model histograms with their p50 / p99 estimated from the buckets the way
Prometheus's ``histogram_quantile`` does (linear within the bucket). The page draws p50 / p99 over time from the
bucket counts of successive snapshots (deltas), with the same rule.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from prometheus_client.core import Metric

Labels = dict[str, str]


class Sample(TypedDict):
    name: str
    labels: Labels
    value: float


class Histogram(TypedDict):
    """One histogram of the digest; ``buckets``: ``[upper bound, cumulative count]``, the last bound "+Inf"."""

    count: float
    sum: float
    mean: float | None
    p50: float | None
    p99: float | None
    buckets: list[list[str | float]]


class Summary(TypedDict):
    """The page's digest (``summarize``); by-label figures map each label value to its sum."""

    active_streams: float
    streams_admitted: float
    streams_refused: float
    streams_unavailable: float
    requests_refused: float
    shed: dict[str, float]
    memory_rss_bytes: float
    breaker: dict[str, float]
    breaker_transitions: dict[str, float]
    queue_depth: dict[str, float]
    queue_depth_max: dict[str, float]
    stages: dict[str, Histogram]
    batch_size: dict[str, Histogram]
    queue_wait: dict[str, Histogram]
    caption_latency: dict[str, Histogram]
    caption_quantiles: dict[str, dict[str, float]]
    errors: dict[str, float]
    model_failures: dict[str, float]
    unlogged_finals: float


@dataclass
class _Family:
    """One histogram's samples, gathered: its ``(bound, cumulative count)`` buckets, count and sum."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    count: float = 0.0
    sum: float = 0.0


class Collecting(Protocol):
    """A registry, or the families of a parsed page (metrics_view.ParsedRegistry: the cluster view)."""

    def collect(self) -> Iterable[Metric]: ...

PREFIX = "linguafusion_"


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's estimate of quantile ``q`` from cumulative ``(upper bound, count)`` buckets (the last one
    +Inf): linear interpolation inside the bucket that holds the rank; None without observations. A rank in the
    +Inf bucket answers the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def samples(registry: Collecting) -> list[Sample]:
    """Every sample of the registry: ``{"name", "labels", "value"}`` (``_created`` timestamps left out)."""
    out: list[Sample] = []
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out.append({"name": s.name, "labels": dict(s.labels), "value": s.value})
    return out


def summarize(rows: list[Sample]) -> Summary:
    """The page's digest of ``samples`` (pure)."""

    def one(name: str) -> float:
        return sum(r["value"] for r in rows if r["name"] == name)

    def by(name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for r in rows:
            if r["name"] == name:
                out[r["labels"].get(label, "")] += r["value"]
        return dict(sorted(out.items()))

    caption: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["name"] == PREFIX + "caption_latency_quantile_seconds":
            caption[r["labels"]["slo"]][r["labels"]["quantile"]] = r["value"]
    return {
        "active_streams": one(PREFIX + "active_streams"),
        "streams_admitted": one(PREFIX + "streams_admitted_total"),
        "streams_refused": one(PREFIX + "streams_rejected_total"),
        "streams_unavailable": one(PREFIX + "streams_unavailable_total"),
        "requests_refused": one(PREFIX + "rejected_total"),
        "shed": by(PREFIX + "shed_total", "model"),
        "memory_rss_bytes": one("process_resident_memory_bytes"),
        "breaker": by(PREFIX + "degradation_level", "slo"),
        "breaker_transitions": {f"{r['labels']['slo']} {r['labels']['direction']}": r["value"] for r in rows
                                if r["name"] == PREFIX + "breaker_transitions_total"},
        "queue_depth": by(PREFIX + "queue_depth", "model"),
        "queue_depth_max": by(PREFIX + "queue_depth_max", "model"),
        "stages": histograms(rows, PREFIX + "stage_latency_seconds", "stage"),
        "batch_size": histograms(rows, PREFIX + "batch_size", "model"),
        "queue_wait": histograms(rows, PREFIX + "queue_wait_seconds", "model"),
        "caption_latency": histograms(rows, PREFIX + "caption_latency_seconds", "slo"),
        "caption_quantiles": dict(sorted(caption.items())),
        "errors": by(PREFIX + "errors_total", "code"),
        "model_failures": by(PREFIX + "model_failures_total", "model"),
        "unlogged_finals": one(PREFIX + "unlogged_finals"),
    }


def histograms(rows: list[Sample], name: str, label: str) -> dict[str, Histogram]:
    """One histogram family by ``label``: its cumulative buckets, count, sum, mean, p50 and p99."""
    grouped: dict[str, _Family] = defaultdict(_Family)
    for r in rows:
        if not r["name"].startswith(name):
            continue
        h = grouped[r["labels"].get(label, "")]
        suffix = r["name"][len(name):]
        if suffix == "_bucket":
            h.buckets.append((float(r["labels"]["le"]), r["value"]))
        elif suffix == "_count":
            h.count = r["value"]
        elif suffix == "_sum":
            h.sum = r["value"]
    out: dict[str, Histogram] = {}
    for key, h in sorted(grouped.items()):
        buckets = sorted(h.buckets)
        out[key] = {"count": h.count, "sum": h.sum, "mean": h.sum / h.count if h.count else None,
                    "p50": histogram_quantile(0.5, buckets), "p99": histogram_quantile(0.99, buckets),
                    "buckets": [[_le(b), c] for b, c in buckets]}
    return out


def _le(bound: float) -> str | float:
    return "+Inf" if math.isinf(bound) else bound  # JSON has no infinity


def snapshot(registry: Collecting, now: float) -> dict[str, object]:
    rows = samples(registry)
    return {"time": now, "summary": summarize(rows), "samples": rows}
