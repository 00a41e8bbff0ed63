"""The translation memory's figures on /metrics, read from its counters when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .memory import TranslationMemory


class TmCollector(Collector):
    def __init__(self, tm: TranslationMemory) -> None:
        self.tm = tm

    def collect(self) -> Iterator[Metric]:
        s = self.tm.stats
        lookups = CounterMetricFamily("linguafusion_tm_lookups", "Translation-memory lookups by result "
                                      "(hit_local, hit_shared, miss: translated by MT)", labels=["result"])
        lookups.add_metric(["hit_local"], s.hits_local)
        lookups.add_metric(["hit_shared"], s.hits_shared)
        lookups.add_metric(["miss"], s.misses)
        yield lookups
        yield CounterMetricFamily("linguafusion_tm_bypassed", "Segments not cached (empty or too long)",
                                  value=s.bypassed)
        yield CounterMetricFamily("linguafusion_tm_evictions", "Local entries pushed out by the size bounds",
                                  value=self.tm.local.evictions)
        yield CounterMetricFamily("linguafusion_tm_expirations", "Local entries found past their TTL",
                                  value=self.tm.local.expirations)
        yield GaugeMetricFamily("linguafusion_tm_entries", "Entries in the local tier", value=len(self.tm.local))
        yield GaugeMetricFamily("linguafusion_tm_bytes", "Bytes held by the local tier", value=self.tm.local.bytes)
