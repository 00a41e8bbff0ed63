"""metrics_view.py: a replica's page labelled with who it is, and several replicas' pages merged into one page
that Prometheus's own parser reads, each family once, every replica's samples in it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lingua_fusion.api.opsview import snapshot
from lingua_fusion.metrics_view import ParsedRegistry, labelled, merge

pytestmark = pytest.mark.timeout(30)


def page(requests: int, streams: float) -> bytes:
    registry = CollectorRegistry()
    c = Counter("linguafusion_requests_total", "HTTP requests", ["route"], registry=registry)
    c.labels(route="/v1/translate").inc(requests)
    Gauge("linguafusion_streams_active", "Live streams", registry=registry).set(streams)
    return generate_latest(registry)


def test_every_sample_carries_the_replica_and_its_own_labels() -> None:
    out = labelled(page(3, 2), {"replica": 'gw-1 "a"', "role": "gateway"})
    families = {f.name: f for f in text_string_to_metric_families(out.decode())}
    total = [s for s in families["linguafusion_requests"].samples if s.name == "linguafusion_requests_total"]
    assert total[0].labels == {"replica": 'gw-1 "a"', "role": "gateway", "route": "/v1/translate"}
    assert total[0].value == 3
    assert families["linguafusion_streams_active"].samples[0].labels == {"replica": 'gw-1 "a"', "role": "gateway"}


def test_pages_of_two_replicas_merge_into_one_valid_page_the_ops_digest_sums() -> None:
    merged = merge([labelled(page(3, 2), {"replica": "a", "role": "gateway"}),
                    labelled(page(4, 5), {"replica": "b", "role": "gateway"})])
    text = merged.decode()
    assert text.count("# HELP linguafusion_streams_active ") == 1
    assert text.count("# TYPE linguafusion_requests_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    active = {s.labels["replica"]: s.value for s in families["linguafusion_streams_active"].samples}
    assert active == {"a": 2, "b": 5}
    digest = snapshot(ParsedRegistry(merged), 0.0)
    rows = [r for r in digest["samples"] if r["name"] == "linguafusion_streams_active"]
    assert sorted(r["value"] for r in rows) == [2, 5]
