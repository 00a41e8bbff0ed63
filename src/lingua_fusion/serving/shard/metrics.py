"""/metrics of a sharded server: every process's metrics summed (prometheus_client's multiprocess mode), and the
process figures (CPU seconds, resident memory) of the whole server, not of the worker that answered.

``linguafusion serve --workers N`` sets ``PROMETHEUS_MULTIPROC_DIR`` for its children, so each worker's and the
model process's counters and histograms land in files there; any worker answers /metrics with their sum. Gauges
carry a ``pid`` label (one series per live process: observability.gauge). CPU: the supervisor's own and its
reaped children's time (``cutime``/``cstime``: a restarted process's CPU is not lost) plus every live child's;
memory: the live processes' resident sets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

SUPERVISOR_ENV = "LINGUAFUSION_SUPERVISOR_PID"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 on (the name may hold spaces)


def server_usage(root: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of process ``root`` and its live children, plus its reaped children's CPU."""
    cpu, rss = 0.0, 0
    me = _stat(root)
    if me is None:
        return cpu, rss
    cpu += sum(int(x) for x in me[11:15]) / _TICKS  # utime stime cutime cstime
    rss += int(me[21]) * _PAGE
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == root:
            continue
        st = _stat(int(entry))
        if st is not None and int(st[1]) == root:  # field 4: the parent
            cpu += (int(st[11]) + int(st[12])) / _TICKS
            rss += int(st[21]) * _PAGE
    return cpu, rss


class ServerProcesses:
    """process_cpu_seconds_total and process_resident_memory_bytes of the whole sharded server."""

    def __init__(self, root: int) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        cpu, rss = server_usage(self.root)
        c = CounterMetricFamily("process_cpu_seconds", "CPU seconds of every process of the server")
        c.add_metric([], cpu)
        yield c
        g = GaugeMetricFamily("process_resident_memory_bytes", "Resident memory of every process of the server")
        g.add_metric([], rss)
        yield g


def render_all() -> bytes:
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(ServerProcesses(int(os.environ.get(SUPERVISOR_ENV) or os.getppid())))
    return generate_latest(registry)
