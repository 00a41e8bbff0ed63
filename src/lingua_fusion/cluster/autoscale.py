"""Autoscaling of model replicas on queue depth and SLO headroom. Pure, apart from the Serve adapter at the end.

Each model replica reports two numbers to Serve's controller (``ModelReplica.record_autoscaling_stats``, Serve's
custom-metrics hook): ``queue_depth``, the items waiting in its scheduler now, and ``slo_pressure``, the 90th
percentile over the last ``PressureWindow.window_s`` of committed stages' latency (queue wait + run) divided by
that stage's share of the SLO budget (serving/scheduler.py's ``stage_deadline``): 1.0 means committed work uses
its whole budget, so captions are about to be late. ``decide`` turns them into a replica count:

- enough replicas that each holds at most ``target_depth`` queued items (one batch);
- at least one more when pressure is at or above ``high`` (headroom gone) even if queues look short (a slow
  model, not a long queue);
- one fewer only when pressure is under ``low`` and the queues would fit in fewer replicas.

Serve's controller then applies ``min_replicas`` / ``max_replicas`` and ``upscale_delay_s`` /
``downscale_delay_s`` from the deployment's ``autoscaling_config`` (it wraps every custom policy that way).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext


@dataclass(frozen=True)
class ScalePolicy:
    target_depth: float = 8.0  # queued items per replica: about one batch
    high: float = 0.8  # slo_pressure at or above: add a replica
    low: float = 0.4  # slo_pressure under (and short queues): a replica may go


def decide(current: int, queue_depth: float, pressure: float, policy: ScalePolicy = ScalePolicy()) -> int:
    """The replica count wanted for ``queue_depth`` items queued in all and the worst replica's ``pressure``."""
    current = max(1, current)
    by_depth = math.ceil(queue_depth / policy.target_depth) if queue_depth > 0 else 1
    if pressure >= policy.high:
        return max(current + 1, by_depth)
    if pressure < policy.low and by_depth < current:
        return max(by_depth, current - 1)
    return max(current, by_depth)


@dataclass
class PressureWindow:
    """Committed stages' latency as a share of their budget, the last ``window_s`` seconds (bounded)."""

    window_s: float = 10.0
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4096))

    def record(self, now: float, ratio: float) -> None:
        self.samples.append((now, ratio))

    def p90(self, now: float) -> float:
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        ratios = sorted(r for _, r in self.samples)
        return ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))]


def slo_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, object]]:
    """Serve's custom autoscaling policy (``AutoscalingPolicy(policy_function=...)``): ``ctx`` is Serve's
    ``AutoscalingContext``; its ``aggregated_metrics`` hold each replica's recorded stats."""
    metrics = ctx.aggregated_metrics or {}
    depth = float(sum((metrics.get("queue_depth") or {}).values()))
    pressure = float(max((metrics.get("slo_pressure") or {}).values(), default=0.0))
    return decide(int(ctx.current_num_replicas), depth, pressure), {}
