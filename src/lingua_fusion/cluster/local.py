"""A Ray cluster of several nodes on one machine, on loopback, with every port fixed, and what tests and benchmarks
do to it (find a replica's process, kill it mid-batch, read the gateways' heartbeats).

``ray start --head`` plus ``ray start --address`` for each worker node, each with its own port block from
``base`` (head: base..base+7, node k: base+8k..; workers' own ports in ``worker_ports``), no dashboard, a small
object store. ``stop`` runs ``ray stop --force``: it ends every Ray process of this user on the machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .heartbeat import Beat, read_beats

RAY = str(Path(sys.executable).parent / "ray")
OBJECT_STORE_BYTES = 100 * 1024 * 1024
TIMEOUT_S = 120
START_ATTEMPTS = 3


@dataclass
class LocalRay:
    base: int = 18700  # the head's GCS port; the other ports follow it
    nodes: int = 2  # the head and nodes - 1 worker nodes
    cpus_per_node: int = 1
    worker_ports: tuple[int, int] = (18720, 18799)  # split between the nodes
    temp_dir: str = "/tmp/lf-ray"
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.base}"

    def start(self) -> None:
        # loopback only: no token auth. Ray 2.60 turns it on for a node when ~/.ray/auth_token exists (any local
        # ray.init() writes one) but not for a node joining it, which is then refused; this process and its
        # children (the serve driver, benchmark drivers) are told the same
        os.environ["RAY_AUTH_MODE"] = "disabled"
        for k in range(self.nodes):
            for attempt in range(START_ATTEMPTS):
                try:
                    self._run(self._node_args(k))
                    break
                except RuntimeError:
                    # seen on a loaded machine: a node joining a head that has just started is refused (GCS not
                    # ready, or an auth-token error from the previous cluster's GCS still on the port): try again
                    if attempt == START_ATTEMPTS - 1:
                        self.stop()
                        raise
                    if k == 0:
                        self.stop()
                    time.sleep(2.0)

    def _node_args(self, k: int) -> list[str]:
        p = self.base + 1 + 8 * k  # node k's block (the head's GCS port is base itself)
        lo, hi = self.worker_ports
        span = (hi - lo + 1) // self.nodes
        args = [RAY, "start", "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus_per_node),
                "--object-store-memory", str(OBJECT_STORE_BYTES), "--node-manager-port", str(p),
                "--object-manager-port", str(p + 1), "--dashboard-agent-listen-port", str(p + 2),
                "--dashboard-agent-grpc-port", str(p + 3), "--metrics-export-port", str(p + 4),
                "--runtime-env-agent-port", str(p + 5), "--min-worker-port", str(lo + k * span),
                "--max-worker-port", str(lo + (k + 1) * span - 1), "--disable-usage-stats"]
        if k == 0:
            return [*args, "--head", "--port", str(self.base), "--include-dashboard", "false",
                    "--ray-client-server-port", str(p + 6), "--temp-dir", self.temp_dir]
        return [*args, "--address", self.address]

    def _run(self, args: list[str]) -> None:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.env}
        out = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} failed: {out.stderr[-2000:]}")

    def stop(self) -> None:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=TIMEOUT_S)


def replica_pids(name: str) -> list[int]:
    """Processes whose title Ray set to this Serve replica's (``ServeReplica:APP:DEPLOYMENT``)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if name in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_when_busy(pid: int, timeout_s: float = 60.0) -> None:
    """SIGKILL ``pid`` in the middle of a burst of CPU work (three 20 ms samples in a row, each with CPU time
    charged: a model batch running, 60 ms in), or after ``timeout_s``."""
    def cpu() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks (10 ms)

    last, busy, end = cpu(), 0, time.monotonic() + timeout_s
    while time.monotonic() < end and busy < 3:
        time.sleep(0.02)
        now = cpu()
        busy = busy + 1 if now > last else 0
        last = now
    os.kill(pid, signal.SIGKILL)


def live_gateways(redis_url: str, cluster: str) -> list[Beat]:
    """The heartbeats of ``cluster``'s gateways whose process is alive (this machine's pids)."""
    import redis.asyncio as aioredis

    async def read() -> list[Beat]:
        client = aioredis.from_url(redis_url, socket_timeout=2)
        try:
            return await read_beats(client, cluster)
        finally:
            await client.aclose()

    return [b for b in asyncio.run(read()) if alive(b.pid)]
