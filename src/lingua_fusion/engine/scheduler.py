"""The cross-stream scheduler: a pure object (no I/O, no models, no clock of its own; ``now`` is passed in).

Work items from every stream queue per model. ``next_batch(model, now)``:
  1. sheds tentative work that can no longer meet its deadline (committed work is never shed),
  2. orders the rest by score = a*importance + (1-a)*risk, where risk grows as the slack to the deadline shrinks,
  3. picks the largest batch whose predicted latency (c0 + c1*b, learned online per model) still meets the tightest
     deadline among the items it would take.
``admit(demand)`` answers whether a new stream's load still lets every admitted stream meet its SLO.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

SLO_CLASSES: dict[str, float] = {"interactive": 1.0, "standard": 3.0, "batch": 30.0}  # caption p99 target (s)
# share of the caption budget each stage may use (the rest is network / emit slack)
STAGE_BUDGET = {"asr": 0.6, "mt": 0.3, "tts": 0.5, "ocr": 0.5}


def stage_deadline(slo: str, stage: str, start: float) -> float:
    return start + SLO_CLASSES[slo] * STAGE_BUDGET.get(stage, 0.5)


@dataclass
class WorkItem:
    stream_id: str
    model: str
    stage: str
    enqueued: float
    deadline: float
    importance: float = 0.5  # 0..1
    tentative: bool = False  # tentative re-decodes may be shed; committed work never
    payload: Any = None
    seq: int = field(default_factory=itertools.count().__next__)


class CostModel:
    """latency(b) ~ c0 + c1*b, fitted by exponentially weighted least squares over observed batches."""

    def __init__(self, c0: float = 0.2, c1: float = 0.1, decay: float = 0.95) -> None:
        self.c0, self.c1, self.decay = c0, c1, decay
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.observations = 0

    def predict(self, batch: int) -> float:
        return max(0.0, self.c0 + self.c1 * batch)

    def observe(self, batch: int, seconds: float) -> None:
        d = self.decay
        self._sw = d * self._sw + 1
        self._sx = d * self._sx + batch
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + batch * batch
        self._sxy = d * self._sxy + batch * seconds
        self.observations += 1
        var = self._sw * self._sxx - self._sx ** 2
        if var > 1e-9:
            c1 = (self._sw * self._sxy - self._sx * self._sy) / var
            c0 = (self._sy - c1 * self._sx) / self._sw
            if c1 >= 0 and c0 >= 0:
                self.c0, self.c1 = c0, c1
                return
        # one batch size seen so far (or a degenerate fit): keep the slope, move the intercept
        mean_b, mean_y = self._sx / self._sw, self._sy / self._sw
        self.c0 = max(0.0, mean_y - self.c1 * mean_b)

    def max_batch_within(self, seconds: float, cap: int) -> int:
        if self.c1 <= 0:
            return cap
        return max(1, min(cap, int((seconds - self.c0) / self.c1)))


@dataclass
class Demand:
    """What one stream asks of each model: items per second, and the tightest stage budget it needs."""

    stream_id: str
    slo: str
    rate: dict[str, float]  # model -> items/s


@dataclass
class SchedulerStats:
    submitted: int = 0
    rejected_full: int = 0
    shed: int = 0
    batches: int = 0
    batch_sizes: dict[int, int] = field(default_factory=lambda: defaultdict(int))


class Scheduler:
    def __init__(self, *, alpha: float = 0.65, max_batch: int = 8, max_queue: int = 256,
                 target_utilisation: float = 0.8, costs: dict[str, CostModel] | None = None) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha must be in [0, 1]")
        self.alpha = alpha
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.target_utilisation = target_utilisation
        self.costs: dict[str, CostModel] = costs or {}
        self.queues: dict[str, list[WorkItem]] = defaultdict(list)
        self.admitted: dict[str, Demand] = {}
        self.stats = SchedulerStats()

    # ---- queueing -------------------------------------------------------------------------------------------
    def cost(self, model: str) -> CostModel:
        if model not in self.costs:
            self.costs[model] = CostModel()
        return self.costs[model]

    def submit(self, item: WorkItem) -> bool:
        """Queue an item. False when the model's queue is at its bound (the caller sheds or refuses)."""
        q = self.queues[item.model]
        if len(q) >= self.max_queue:
            # make room by dropping the least valuable tentative item, never committed work
            tentative = [w for w in q if w.tentative]
            if not tentative:
                self.stats.rejected_full += 1
                return False
            victim = min(tentative, key=lambda w: (w.importance, -w.deadline))
            q.remove(victim)
            self.stats.shed += 1
        q.append(item)
        self.stats.submitted += 1
        return True

    def depth(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def drop_stream(self, stream_id: str) -> list[WorkItem]:
        dropped = []
        for q in self.queues.values():
            dropped += [w for w in q if w.stream_id == stream_id]
            q[:] = [w for w in q if w.stream_id != stream_id]
        self.admitted.pop(stream_id, None)
        return dropped

    # ---- batching -------------------------------------------------------------------------------------------
    def score(self, item: WorkItem, now: float) -> float:
        budget = max(1e-3, item.deadline - item.enqueued)
        slack = item.deadline - now - self.cost(item.model).predict(1)
        risk = min(1.0, max(0.0, 1.0 - slack / budget))
        return self.alpha * item.importance + (1 - self.alpha) * risk

    def next_batch(self, model: str, now: float) -> tuple[list[WorkItem], list[WorkItem]]:
        """Return (batch to run now, tentative items shed because they can no longer meet their deadline)."""
        q = self.queues.get(model)
        if not q:
            return [], []
        cm = self.cost(model)
        shed = [w for w in q if w.tentative and now + cm.predict(1) > w.deadline]
        if shed:
            q[:] = [w for w in q if not (w.tentative and now + cm.predict(1) > w.deadline)]
            self.stats.shed += len(shed)
        if not q:
            return [], shed
        ordered = sorted(q, key=lambda w: (-self.score(w, now), w.deadline, w.seq))
        take = 1
        for b in range(min(self.max_batch, len(ordered)), 1, -1):
            if now + cm.predict(b) <= min(w.deadline for w in ordered[:b]):
                take = b
                break
        batch = ordered[:take]
        chosen = {w.seq for w in batch}
        q[:] = [w for w in q if w.seq not in chosen]
        self.stats.batches += 1
        self.stats.batch_sizes[take] += 1
        return batch, shed

    def observe(self, model: str, batch: int, seconds: float) -> None:
        self.cost(model).observe(batch, seconds)

    # ---- admission ------------------------------------------------------------------------------------------
    def capacity(self, model: str, slo: str) -> float:
        """Items/s the model sustains with batches small enough for the SLO's stage budget."""
        cm = self.cost(model)
        budget = SLO_CLASSES[slo] * STAGE_BUDGET.get(model.split(":")[0], 0.5)
        b = cm.max_batch_within(budget / 2, self.max_batch)  # half the budget to serve, half to wait
        return b / max(1e-6, cm.predict(b))

    def admit(self, demand: Demand) -> bool:
        streams = [*self.admitted.values(), demand]
        for model in {m for d in streams for m in d.rate}:
            load = sum(d.rate.get(model, 0.0) for d in streams)
            tightest = min((d.slo for d in streams if model in d.rate), key=lambda s: SLO_CLASSES[s])
            if load > self.target_utilisation * self.capacity(model, tightest):
                return False
        self.admitted[demand.stream_id] = demand
        return True

    def release(self, stream_id: str) -> None:
        self.admitted.pop(stream_id, None)
