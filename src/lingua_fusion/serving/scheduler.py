"""The cross-stream scheduler: a pure object (no I/O, no models, no clock of its own; ``now`` is passed in).

Work items from every stream queue per model. ``next_batch(model, now)``:
  1. sheds tentative work that can no longer meet its deadline (committed work is never shed),
  2. orders the rest: API keys share each model fairly (below); within a key's share, by score =
     a*importance + (1-a)*risk, where risk grows as the slack to the deadline shrinks,
  3. picks the largest batch whose predicted latency (c0 + c1*b, learned online per model) still meets the tightest
     deadline among the items it would take that can still be met (late items do not shrink the batch), and whose
     work units (an MT item's characters) stay within the model's ``max_units`` (one item always fits).
``admit(demand)`` answers whether a new stream's load still lets every admitted stream meet its SLO.

Fairness between keys is start-time fair queueing on work units, per model: each key has a finish tag; a key's next
item starts at max(V, its finish tag), where V is the largest start tag dispatched so far; the key with the smallest
start goes next and its finish tag grows by the item's units. A key that sends 1.2 M characters of text therefore
gets one item into a batch while a key with a one-line caption gets its caption in first, and nobody banks credit
by being idle. ``max_queue_per_key`` bounds what one key may hold of a model's queue (the executor: half).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .admitted import Admitted, Demand
from .cost_model import CostModel
from .ports import SLO_CLASSES, stage_budget  # the classes are the contract's
from .service_curve import BusyPace, ProvenLoad, ServiceCurve

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # a model's key: the executor's ModelKey (its tests' plain names)
OVERLAP_MIN_OBSERVATIONS = 5  # batches run alongside another lane before admission counts a model's lanes
# a continuous runner's capacity is counted at most this many times the items it has been seen to hold in flight at
# once (at least SERVICE_MIN_IN_FLIGHT): what it does with more is extrapolated no further than that, so admission
# grows with what the runner has shown, a factor at a time, and never from a flat fit's infinite promise
SERVICE_GROWTH = 2.0
SERVICE_MIN_IN_FLIGHT = 4
LOAD_EVERY_S = 0.5  # how often a continuous runner's admitted load is summed for its ProvenLoad
# the share of its time a runner's thread may be busy by its pace (service_curve.BusyPace), before admission's own
# target_utilisation: on an H100 the ASR runner threads busy 65 % held caption p99 0.92 s against a 1 s target, so
# 0.75 x 0.8 = 60 % busy at most, and the other model processes' kernels slow a step as they too fill the GPU
PACE_BUSY = 0.75
# ... and no further than this many times the most it has held in flight: the pace is one runner's thread's, and
# the runners of other model processes on the same GPU, each idle when it was measured, fill it together
PACE_GROWTH = 8.0
# ... and this many times, for a runner whose curve is extrapolated by its own step's timings at each batch size
# (service_curve.ServiceCurve.shape): what those do not time (its encoder's starts, the host's work per row) is
# then measured a factor at a time
SHAPE_GROWTH = 8.0
SERVICE_MAX_IN_FLIGHT = 1024  # the GPU engine's largest decode batch (serving/gpu/runner.py max_batch)


def family(model: Hashable) -> str:
    """A model's family ("asr", "mt", ...): its task, the first part of its name (serving/keys.py)."""
    return str(model).split(":")[0]


@dataclass
class WorkItem(Generic[K]):
    stream_id: str
    model: K
    stage: str
    enqueued: float
    deadline: float
    importance: float = 0.5  # 0..1
    tentative: bool = False  # tentative re-decodes may be shed; committed work never
    payload: object = None  # the submitter's own (serving/executor.py: its _Pending); the scheduler never reads it
    slo: str = "standard"
    key_id: str = ""  # the API key whose stream asked: the unit of fairness
    units: float = 1.0  # work size (an MT item: its characters), what fairness and max_units count
    seq: int = field(default_factory=itertools.count().__next__)


class ModelQueue(Generic[K]):
    """One model's queued items, in FIFO lanes keyed by (key id, importance, budget, tentative).

    Within a lane, items share key, importance and budget, so their score order is their arrival order: the best
    candidates are always at the lane heads, and choosing a batch costs O(lanes x max_batch), not O(queue).
    """

    def __init__(self) -> None:
        self.lanes: dict[tuple[str, float, float, bool], deque[WorkItem[K]]] = {}
        self.per_key: dict[str, int] = defaultdict(int)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[WorkItem[K]]:
        for lane in self.lanes.values():
            yield from lane

    @staticmethod
    def _lane(item: WorkItem[K]) -> tuple[str, float, float, bool]:
        return item.key_id, item.importance, round(item.deadline - item.enqueued, 3), item.tentative

    def append(self, item: WorkItem[K]) -> None:
        self.lanes.setdefault(self._lane(item), deque()).append(item)
        self.per_key[item.key_id] += 1
        self._n += 1

    def remove(self, item: WorkItem[K]) -> None:
        self.lanes[self._lane(item)].remove(item)
        self._gone([item])

    def discard(self, item: WorkItem[K]) -> bool:
        """Remove this very item (not an equal one) if it is queued."""
        lane = self.lanes.get(self._lane(item), deque())
        for i, w in enumerate(lane):
            if w is item:
                del lane[i]
                self._gone([item])
                return True
        return False

    def _gone(self, items: list[WorkItem[K]]) -> None:
        for w in items:
            self.per_key[w.key_id] -= 1
            if not self.per_key[w.key_id]:
                del self.per_key[w.key_id]
        self._n -= len(items)

    def remove_where(self, pred: Callable[[WorkItem[K]], bool]) -> list[WorkItem[K]]:
        out: list[WorkItem[K]] = []
        for key, lane in list(self.lanes.items()):
            keep = deque(w for w in lane if not pred(w))
            if len(keep) != len(lane):
                out += [w for w in lane if pred(w)]
                self.lanes[key] = keep
        self._gone(out)
        return out

    def shed_expired(self, ready: float) -> list[WorkItem[K]]:
        """Tentative items that cannot meet their deadline (lane heads: deadlines are FIFO within a lane)."""
        out: list[WorkItem[K]] = []
        for (_key, _imp, _budget, tentative), lane in self.lanes.items():
            if not tentative:
                continue
            while lane and lane[0].deadline < ready:
                out.append(lane.popleft())
        self._gone(out)
        return out

    def candidates(self, k: int) -> list[WorkItem[K]]:
        return [w for lane in self.lanes.values() for w in itertools.islice(lane, k)]

    def take(self, items: list[WorkItem[K]]) -> None:
        for w in items:
            self.remove(w)


@dataclass
class SchedulerStats:
    submitted: int = 0
    rejected_full: int = 0
    shed: int = 0
    batches: int = 0
    batch_sizes: dict[int, int] = field(default_factory=lambda: defaultdict(int))


class Scheduler(Generic[K]):
    def __init__(self, *, alpha: float = 0.65, max_batch: int = 8, max_queue: int = 256,
                 target_utilisation: float = 0.8, costs: dict[K, CostModel] | None = None) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha must be in [0, 1]")
        self.alpha = alpha
        self.max_batch = max_batch
        # larger batches for models whose per-item cost is small next to their per-call cost (Apertium runs one
        # pipeline over the whole batch); never above max_batch when that is lowered (the per-stream baseline)
        self.batch_scale: dict[str, int] = {}
        # most work units in one batch, per model family ("mt": characters); one item always fits
        self.max_units: dict[str, float] = {}
        self.max_queue = max_queue
        self.max_queue_per_key = max_queue  # the executor gives one key half of it (the rest stays for others)
        self.vtime: dict[K, float] = defaultdict(float)  # per model: V, the largest start tag dispatched
        self.finish: dict[K, dict[str, float]] = defaultdict(dict)  # per model: key -> finish tag
        self.target_utilisation = target_utilisation
        self.costs: dict[K, CostModel] = costs or {}
        # batches of a model that run at once (the executor's lanes: Whisper with models.asr_parallel), and the
        # cost of a lane's batch while another lane of the model ran too: admission counts the lanes only at that
        # cost, once it has been seen (two lanes on cores other jobs hold are no faster than one)
        self.lanes: dict[K, int] = {}
        self.overlap_costs: dict[K, CostModel] = {}
        # a continuous runner's (serving/gpu: it batches on its own, so it has no batch latency to fit): an item's
        # latency against the items in flight (serving/service_curve.py); by Little's law it serves n / latency(n)
        # items/s with n in flight
        self.service: dict[K, ServiceCurve] = {}
        self.proven: dict[K, ProvenLoad] = {}  # a continuous runner's load carried within its budget: a floor
        self.pace: dict[K, BusyPace] = {}  # a continuous runner's items per busy second of its thread
        self.demand_extra: dict[K, float] = {}  # items/s a stream was measured to ask beyond its rate (rates.py)
        self._load: dict[K, tuple[float, float, int, float]] = {}  # model -> (when, declared items/s, streams, budget)
        self.queues: dict[K, ModelQueue[K]] = defaultdict(ModelQueue[K])
        self.admitted: Admitted[K] = Admitted()
        self.refused_by: K | None = None  # the model whose capacity refused the last stream ``admit`` refused
        self.stats = SchedulerStats()

    # ---- queueing -------------------------------------------------------------------------------------------
    def cost(self, model: K) -> CostModel:
        if model not in self.costs:
            self.costs[model] = CostModel()
        return self.costs[model]

    def submit(self, item: WorkItem[K]) -> bool:
        """Queue an item. False when the model's queue, or this key's half of it, is full (the caller sheds)."""
        return self.submit_or_shed(item)[0]

    def submit_or_shed(self, item: WorkItem[K]) -> tuple[bool, WorkItem[K] | None]:
        """``submit``, and the tentative item dropped to make room for it, if one was (whoever waits for that one
        must hear it was shed, as for the items ``next_batch`` sheds)."""
        q = self.queues[item.model]
        own_full = q.per_key.get(item.key_id, 0) >= self.max_queue_per_key
        victim = None
        if own_full or len(q) >= self.max_queue:
            # make room by dropping the least valuable tentative item (the key's own when it is at its share),
            # never committed work
            tentative = [w for w in q if w.tentative and (not own_full or w.key_id == item.key_id)]
            if not tentative:
                self.stats.rejected_full += 1
                return False, None
            victim = min(tentative, key=lambda w: (w.importance, -w.deadline))
            q.remove(victim)
            self.stats.shed += 1
        q.append(item)
        self.stats.submitted += 1
        return True, victim

    def withdraw(self, item: WorkItem[K]) -> bool:
        """Take ``item`` out of its queue if it is still waiting there (its caller gave up on it)."""
        q = self.queues.get(item.model)
        return q is not None and q.discard(item)

    def shed(self, model: K, now: float) -> list[WorkItem[K]]:
        """Drop ``model``'s tentative items that can no longer meet their deadlines (``next_batch`` does this first;
        a runner with no room for a batch calls it alone)."""
        q = self.queues.get(model)
        if not q:
            return []
        shed = q.shed_expired(now + self.cost(model).predict(1))
        self.stats.shed += len(shed)
        return shed

    def depth(self, model: K) -> int:
        return len(self.queues.get(model, ()))

    def drop_stream(self, stream_id: str) -> list[WorkItem[K]]:
        dropped = []
        for q in self.queues.values():
            dropped += q.remove_where(lambda w: w.stream_id == stream_id)
        self.admitted.pop(stream_id, None)
        for model, q in self.queues.items():  # keys with nothing queued need no finish tag (V carries on)
            for key in [k for k in self.finish[model] if k not in q.per_key]:
                if self.finish[model][key] <= self.vtime[model]:
                    del self.finish[model][key]
        return dropped

    # ---- batching -------------------------------------------------------------------------------------------
    def score(self, item: WorkItem[K], now: float) -> float:
        return self._score(item, now + self.cost(item.model).predict(1))

    def _score(self, item: WorkItem[K], ready: float) -> float:
        """``ready`` = now + predicted single-item latency. risk = 1 - slack / budget, clamped to [0, 1]."""
        budget = item.deadline - item.enqueued
        risk = (ready - item.enqueued) / budget if budget > 1e-3 else 1.0
        risk = 0.0 if risk < 0.0 else 1.0 if risk > 1.0 else risk
        return self.alpha * item.importance + (1 - self.alpha) * risk

    def next_batch(self, model: K, now: float, limit: int | None = None,
                   committed_first: bool = False) -> tuple[list[WorkItem[K]], list[WorkItem[K]]]:
        """Return (batch to run now, at most ``limit`` items, and tentative items shed because they can no longer
        meet their deadline). ``committed_first``: within a key, committed items before any tentative one (a
        continuous runner's window: a partial handed over holds a place a caption then waits for)."""
        shed = self.shed(model, now)
        q = self.queues.get(model)
        if not q:
            return [], shed
        cm = self.cost(model)
        ready = now + cm.predict(1)
        cap = self.batch_cap(model) if limit is None else max(1, min(limit, self.batch_cap(model)))
        top, tags = self._fair_order(model, q.candidates(cap), cap, ready, committed_first)
        # Items already past rescue (deadline < now + single-item latency) do not constrain the batch: under
        # overload, shrinking batches to chase lost deadlines would only cut throughput and make everyone late.
        take = 1
        tightest = float("inf")
        prefix_min = []
        for w in top:
            if w.deadline >= ready:
                tightest = min(tightest, w.deadline)
            prefix_min.append(tightest)
        c0, c1 = cm.c0, cm.c1
        for b in range(len(top), 1, -1):
            if now + c0 + c1 * b <= prefix_min[b - 1]:
                take = b
                break
        batch = top[:take]
        q.take(batch)
        for start, key, finish in tags[:take]:
            self.finish[model][key] = finish
            self.vtime[model] = max(self.vtime[model], start)
        self.stats.batches += 1
        self.stats.batch_sizes[take] += 1
        return batch, shed

    def _fair_order(self, model: K, candidates: list[WorkItem[K]], cap: int, ready: float, committed_first: bool
                    ) -> tuple[list[WorkItem[K]], list[tuple[float, str, float]]]:
        """Up to ``cap`` candidates in dispatch order: keys by start tag (fair queueing on units), each key's own
        items by score; within the model's ``max_units``. Returns them and (start, key, finish) per item."""
        by_key: dict[str, list[WorkItem[K]]] = defaultdict(list)
        for w in candidates:
            by_key[w.key_id].append(w)
        for items in by_key.values():
            items.sort(key=lambda w: (committed_first and w.tentative, -self._score(w, ready), w.deadline, w.seq))
            items.reverse()  # pop() from the end: best first
        finish = {k: self.finish[model].get(k, 0.0) for k in by_key}
        v = self.vtime[model]
        max_units = self.max_units.get(family(model), float("inf"))
        order: list[WorkItem[K]] = []
        tags: list[tuple[float, str, float]] = []
        units = 0.0
        while by_key and len(order) < cap:
            key = min(by_key, key=lambda k: (max(v, finish[k]), by_key[k][-1].seq))
            w = by_key[key][-1]
            if order and units + w.units > max_units:
                break
            by_key[key].pop()
            if not by_key[key]:
                del by_key[key]
            start = max(v, finish[key])
            finish[key] = start + w.units
            units += w.units
            order.append(w)
            tags.append((start, key, finish[key]))
        return order, tags

    def batch_cap(self, model: K) -> int:
        return self.max_batch * self.batch_scale.get(family(model), 1) if self.max_batch > 1 else 1

    def observe(self, model: K, batch: int, seconds: float, overlapped: bool = False) -> None:
        """A batch's latency; ``overlapped``: another batch of the model ran during it (another lane)."""
        cm = self.cost(model)
        cm.observe(batch, seconds)
        if overlapped:
            if model not in self.overlap_costs:
                self.overlap_costs[model] = CostModel(cm.c0, cm.c1)
            self.overlap_costs[model].observe(batch, seconds)

    def observe_service(self, model: K, in_flight: float, seconds: float, now: float,
                        busy: tuple[int, float] | None = None, shape: tuple[tuple[int, float], ...] = ()) -> None:
        """A continuous runner's window (service_curve.InFlight): ``in_flight`` items in flight on average, their
        latency ``seconds`` on average, ending at ``now``; ``busy``: the items settled in it and the seconds the
        runner's thread was busy (``InFlight.busy_sample``); ``shape``: its step's seconds per batch size, where it
        timed them (``ServiceCurve.shape``). Admission counts the model by these (``capacity``, ``proven``) from
        then on."""
        svc = self.service.setdefault(model, ServiceCurve())
        svc.observe(in_flight, seconds, now)
        svc.shape = shape  # a runner rebuilt without its graphs times none
        if busy is not None:
            self.pace.setdefault(model, BusyPace()).observe(*busy, now)
        at, load, n, budget = self._load.get(model, (-1.0, 0.0, 0, float("inf")))
        if now - at >= LOAD_EVERY_S:  # the admitted streams summed twice a second, not per item
            streams = [d for d in self.admitted.values() if model in d.rate]
            load, n = sum(d.rate[model] for d in streams), len(streams)
            budget = min((stage_budget(d.slo, family(model)) for d in streams), default=float("inf"))
            self._load[model] = (now, load, n, budget)
        self.proven.setdefault(model, ProvenLoad()).observe(seconds, load, budget, now, n,
                                                            self.demand_extra.get(model, 0.0))

    # ---- admission ------------------------------------------------------------------------------------------
    def capacity(self, model: K, slo: str) -> float:
        """Items/s the model sustains with batches small enough for the SLO's stage budget. A model with several
        lanes: each lane's at the latency its batches have while other lanes run, once OVERLAP_MIN_OBSERVATIONS
        such batches were seen; until then one lane's (capacity is proven, not assumed). A continuous runner's (its
        model in ``service``, from its prior until its items are seen): the items in flight whose latency fits half
        the stage budget, by Little's law, at most SERVICE_GROWTH (SHAPE_GROWTH) times as many as it held; where its
        thread's pace (``BusyPace``) says it carries more, up to that pace (at most PACE_GROWTH times as many in
        flight as it held). The pace lifts the count, never lowers it."""
        budget = stage_budget(slo, family(model))
        svc = self.service.get(model)
        if svc is not None:
            return self._counted(model, svc, budget)[1]
        cm, lanes = self.cost(model), 1
        overlap = self.overlap_costs.get(model)
        if self.lanes.get(model, 1) > 1 and overlap is not None and overlap.observations >= OVERLAP_MIN_OBSERVATIONS:
            cm, lanes = overlap, self.lanes[model]
        b = cm.max_batch_within(budget / 2, self.batch_cap(model))  # half the budget to serve, half to wait
        return lanes * b / max(1e-6, cm.predict(b))

    def _in_flight_within(self, model: K, svc: ServiceCurve, budget: float) -> int:
        held = max(SERVICE_MIN_IN_FLIGHT, int((SHAPE_GROWTH if svc.shape else SERVICE_GROWTH) * svc.held()))
        return svc.within(budget / 2, min(SERVICE_MAX_IN_FLIGHT, held))

    def _counted(self, model: K, svc: ServiceCurve, budget: float) -> tuple[int, float]:
        """(items in flight, items/s) a continuous runner is counted at for a stage ``budget``: the curve's, within
        its growth bound; lifted where its thread's pace says more, to that pace at most, with the items in flight
        that pace keeps at the latency the curve predicts (Little's law), up to PACE_GROWTH x what it held."""
        n = self._in_flight_within(model, svc, budget)
        served = n / max(1e-6, svc.predict(n))
        rate = self.pace[model].rate() if model in self.pace else None
        if rate is None or rate * PACE_BUSY <= served:
            return n, served
        pace = rate * PACE_BUSY
        m = svc.within(budget / 2, min(SERVICE_MAX_IN_FLIGHT, max(SERVICE_MIN_IN_FLIGHT,
                                                                  int(PACE_GROWTH * svc.held()))))
        return max(n, min(m, math.ceil(pace * svc.predict(m)))), max(served, min(pace, m / max(1e-6, svc.predict(m))))

    def service_window(self, model: K) -> int | None:
        """How many items a continuous runner may hold in flight (None: ``model`` is not one): as many as admission
        counts it at, for the tightest class admitted on it. The rest wait here, where committed work goes first
        and tentative work past its deadline is shed; handed over, they would queue inside the runner, in
        arrival order, and make every item late."""
        svc = self.service.get(model)
        if svc is None:
            return None
        tightest = self.admitted.tightest(model) or "standard"
        return self._counted(model, svc, stage_budget(tightest, family(model)))[0]

    def admit(self, demand: Demand[K]) -> bool:
        """Reserve ``demand`` if every model it uses can carry it beside the streams admitted (their declared load
        + ``demand_extra``): within its measured capacity, or the load a continuous runner carried (``ProvenLoad``).
        A model with no stream admitted on it takes one whatever its measure says: the measure learns only from
        work it serves, so refusing would keep a pessimistic one for ever (a curve taken while the cores were busy
        elsewhere, a cost from a slow spell). If it is that slow, that stream's captions show it; the breaker acts."""
        streams = [*self.admitted.values(), demand]
        for model in {m for d in streams for m in d.rate}:
            if not any(model in d.rate for d in self.admitted.values()):
                continue
            on, extra = [d for d in streams if model in d.rate], self.demand_extra.get(model, 0.0)
            load = sum(d.rate[model] for d in on) + extra * len(on)
            tightest = min((d.slo for d in on), key=lambda s: SLO_CLASSES[s])
            proven = self.proven.get(model)  # the load it carried within budget, at today's charge: never refused
            floor = proven.at(extra) if proven is not None else 0.0
            if load > max(floor, self.target_utilisation * self.capacity(model, tightest)):
                self.refused_by = model
                return False
        self.admitted[demand.stream_id] = demand
        return True

    def release(self, stream_id: str) -> None:
        self.admitted.pop(stream_id, None)
