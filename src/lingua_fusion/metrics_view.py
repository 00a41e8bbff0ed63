"""One view of many servers' metrics: each replica's /metrics labelled with who it is, and all of them merged.

- ``labelled(text, labels)``: a Prometheus text page with ``labels`` (``replica``, ``role``) added to every sample.
  A cluster gateway's /metrics is labelled so (``server.role`` "gateway", ``server.replica`` its id); so is a
  server given ``server.replica``.
- ``merge(pages)``: several labelled pages as one valid page: each metric family's ``# HELP`` and ``# TYPE`` once,
  then every replica's samples of it (a page concatenated as it is would repeat them, which Prometheus refuses).
- ``Publisher`` (metrics_publish.py, imported only with Redis: redis-py loads the OpenTelemetry SDK): with
  ``state.redis_url`` set, every server writes its labelled page to Redis every ``server.metrics_publish_interval_s``
  (a key per replica that expires after three intervals, so a dead replica leaves the view; an index of replicas by
  expiry, so the view never scans the keyspace), and reads every replica's back for ``GET /metrics/cluster`` and the
  operations page's cluster view (``GET /v1/ops/metrics?scope=cluster``). The pure functions take and give bytes; the
  publisher's Redis calls are async with timeouts, and a failure leaves the last view (or none) and is logged, never
  raised to a request.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("lingua_fusion.metrics")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def replica_labels(replica: str, role: str, port: int) -> dict[str, str]:
    """Who a server is in the cluster view: ``replica`` (``server.replica``, or host:port; the workers of
    ``serve --workers`` share that name: each renders the whole server's sum) and ``role``."""
    return {"replica": replica or f"{socket.gethostname()}:{port}", "role": role}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labelled(text: bytes, labels: dict[str, str]) -> bytes:
    """``text`` with ``labels`` first on every sample line (comments and blank lines as they are)."""
    extra = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    out = []
    for line in text.decode("utf-8").splitlines():
        m = SAMPLE.match(line) if line and not line.startswith("#") else None
        if m is None:
            out.append(line)
            continue
        name, current, rest = m.group(1), m.group(2), m.group(3)
        inner = current[1:-1] if current else ""
        out.append(f"{name}{{{extra}{',' if inner else ''}{inner}}}{rest}")
    return ("\n".join(out) + "\n").encode("utf-8")


def merge(pages: Iterable[bytes]) -> bytes:
    """One page from several: families in the order first seen, each with its header once and every page's
    samples (samples before any header, which a valid page does not have, are kept first)."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for page in pages:
        family = ""
        for line in page.decode("utf-8").splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                seen = headers.setdefault(family, [])
                samples.setdefault(family, [])
                if not any(h.split(" ", 3)[1] == line.split(" ", 3)[1] for h in seen):
                    seen.append(line)
            elif line and not line.startswith("#"):
                samples.setdefault(family, []).append(line)
    out: list[str] = []
    for family, lines in samples.items():
        out.extend(headers.get(family, []))
        out.extend(lines)
    return ("\n".join(out) + "\n").encode("utf-8")


class ParsedRegistry:
    """A page's metric families behind ``collect()``, as a CollectorRegistry offers them (api/opsview.py reads it)."""

    def __init__(self, page: bytes) -> None:
        self._families = list(text_string_to_metric_families(page.decode("utf-8")))

    def collect(self) -> Iterator[Metric]:
        yield from self._families
