"""A continuous runner's latency curve: how long an item takes with n items in flight, learnt online.

A continuous runner (the GPU engine, serving/gpu) batches on its own, so there is no batch latency to fit as for
the batch runners (scheduler.CostModel). What the executor can see is how many items are in flight over time and
each item's time from hand-over to result; ``InFlight`` turns them into samples, a window's mean count in flight
and its settled items' mean latency. By Little's law a runner holding n items whose latency is L(n) serves
n / L(n) items per second: admission counts it at the largest n whose latency fits the class's budget.

The curve is kept per bucket of in-flight counts (1, 2-3, 4-7, 8-15, ...), each a mean of its samples' in-flight
count and latency whose samples' weight halves every HALF_LIFE_S seconds of use (the caller's clock passed in; an
idle gap counts as MAX_GAP_S at most). Every sample of the last seconds counts, however many items a second settle,
so a moment's slowdown (a burst of arrivals sharing the cores) moves the curve by its share of those seconds; with
a weight per item (0.2) five slow items took it most of the way, and admission with it. Idle time does not age it,
so what a load taught is still known when the next load's first items come back fast on quiet cores. A bucket not
sampled in the last FORGET_AFTER samples is dropped: a load the runner is no longer handed (its window keeps it under
what the curve allows) would otherwise hold its old latency for ever. Between buckets the curve is interpolated; it
never falls as more items are in flight (a noisy bucket does not promise that more is faster). Beyond the most
items seen in flight it is extrapolated along its last slope (the prior's while one bucket is known), and the
caller bounds how far (Scheduler: twice what was held). Until a first item is seen the prior line c0 + c1 * n
stands in.

A runner that timed its own decode step at each batch size on its device (``shape``: the GPU engine's CUDA graphs,
serving/gpu/graphs.py StepGraphs.profile) is extrapolated by that instead: its latency at the top of the curve,
scaled by how much longer a step of n rows takes than one of the top's. An item's latency in a continuous batcher
is its steps times the step's time, and the step's time grows with the rows it carries, not with the items; on a
GPU a step of 8 rows costs what one of 1 does. A slope drawn through the few items a light load holds in flight
(1 and 1.5: arrivals bunching, not the batch) said each more item costs 30 ms, held admission on an H100 to 47
streams while its runners idled 75 % of the time, and the items it held never grew the curve.

``ProvenLoad``, beside it: the admitted load (items/s of the streams' demand) a runner has carried for PROVEN_S
seconds while its items' mean latency stayed within HEALTHY of the stage budget. Admission never refuses below it
(Scheduler.admit): the curve's promise moves with every moment's noise (a burst of arrivals, a load's first items
on quiet cores), but a load that was served is a fact, kept until the latency goes over the budget. Pure: the
caller's clock is passed in, no threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HALF_LIFE_S = 3.0  # seconds of use in which a sample's weight in its bucket's means halves
# a gap between a bucket's samples counts at most this long: a runner left idle (between a load's streams and the
# next's) keeps what the last load taught, and the next load's first items, served fast on quiet cores, do not
# replace it (they did: 20 streams were admitted on their promise, and every one missed its target)
MAX_GAP_S = 1.0  # one sample a WINDOW_S: the gap between a busy runner's samples counts whole, an idle one no more
FORGET_AFTER = 30  # samples: a bucket not sampled among the last this many (about 30 s of use) is dropped


def _decay(last: float, now: float) -> float:
    """What a mean's past samples, last added at ``last``, weigh at ``now``: half every HALF_LIFE_S of use."""
    return float(0.5 ** (min(MAX_GAP_S, max(0.0, now - last)) / HALF_LIFE_S))


@dataclass
class _Point:
    weight: float  # of the samples, decayed to ``at``
    in_flight_sum: float
    latency_sum: float
    at: float  # the clock at its last sample
    last: int  # the observation that last updated it

    def add(self, n: float, seconds: float, now: float) -> None:
        decay = _decay(self.at, now)
        self.weight = self.weight * decay + 1.0
        self.in_flight_sum = self.in_flight_sum * decay + n
        self.latency_sum = self.latency_sum * decay + seconds
        self.at = max(self.at, now)

    @property
    def in_flight(self) -> float:
        return self.in_flight_sum / self.weight

    @property
    def latency(self) -> float:
        return self.latency_sum / self.weight


def step_at(shape: tuple[tuple[int, float], ...], n: float) -> float:
    """Seconds a step of ``n`` rows takes by ``shape`` ((rows, seconds), rows ascending): the smallest batch size
    that holds ``n`` (a step replays the graph of the bucket it fits); past the largest, that one's per row (rows
    beyond the engine's batch wait for another step). Never less than a smaller batch's (a noisy timing does not
    promise that more rows are faster)."""
    top = 0.0
    for rows, seconds in shape:
        top = max(top, seconds)
        if n <= rows:
            return top
    rows, _ = shape[-1]
    return top * n / rows


class ServiceCurve:
    def __init__(self, c0: float = 0.2, c1: float = 0.1) -> None:
        self.c0, self.c1 = c0, c1  # the prior line, until items are seen (and its slope while one bucket is)
        self._points: dict[int, _Point] = {}
        self.observations = 0
        self.most_in_flight = 0.0
        self.shape: tuple[tuple[int, float], ...] = ()  # the runner's step seconds per batch size (``step_at``)

    def observe(self, in_flight: float, seconds: float, now: float) -> None:
        """An item served with ``in_flight`` items in flight (itself included; the mean over its life,
        a window's, ``InFlight``) took ``seconds``; ``now``: the caller's clock."""
        n = max(1.0, in_flight)
        bucket = 1 << (int(n).bit_length() - 1)
        self.observations += 1
        point = self._points.setdefault(bucket, _Point(0.0, 0.0, 0.0, now, self.observations))
        point.add(n, seconds, now)
        point.last = self.observations
        for b in [b for b, p in self._points.items() if self.observations - p.last > FORGET_AFTER]:
            del self._points[b]
        self.most_in_flight = max(self.most_in_flight, n)

    def held(self) -> float:
        """The most items in flight it is known to have held, which admission's growth bounds start from: by step
        timings (``shape``), the most among the buckets it still knows, since the timings stretch a light load's
        latency 8x past a load whose own measure was forgotten; otherwise the most ever (its slope beyond is the
        last buckets' own)."""
        if not self.shape:
            return self.most_in_flight
        return max((p.in_flight for p in self._points.values()), default=0.0)

    def _curve(self) -> list[tuple[float, float]]:
        curve: list[tuple[float, float]] = []
        top = 0.0
        for point in sorted(self._points.values(), key=lambda p: p.in_flight):
            top = max(top, point.latency)  # never faster with more in flight
            curve.append((point.in_flight, top))
        return curve

    def predict(self, n: float) -> float:
        """Seconds an item takes with ``n`` items in flight."""
        curve = self._curve()
        if not curve:
            return max(0.0, self.c0 + self.c1 * n)
        if n <= curve[0][0]:
            return curve[0][1]  # fewer than the fewest seen: no faster than that
        for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
            if n <= x1:
                return y1 if x1 - x0 < 1e-9 else y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = (curve[-2], curve[-1]) if len(curve) > 1 else ((0.0, 0.0), curve[-1])
        if self.shape:
            return y1 * step_at(self.shape, n) / max(1e-9, step_at(self.shape, x1))
        slope = self.c1 if len(curve) == 1 or x1 - x0 < 1e-9 else (y1 - y0) / (x1 - x0)
        return y1 + max(0.0, slope) * (n - x1)

    def within(self, seconds: float, cap: int) -> int:
        """The most items in flight (1 to ``cap``) whose latency is predicted within ``seconds``."""
        lo, hi = 1, max(1, cap)
        if self.predict(hi) <= seconds:
            return hi
        while hi - lo > 1:  # predict is non-decreasing in n
            mid = (lo + hi) // 2
            if self.predict(mid) <= seconds:
                lo = mid
            else:
                hi = mid
        return lo


WINDOW_S = 1.0  # the curve's samples: the items in flight and their latency, over windows of this long


@dataclass
class InFlight:
    """A continuous runner's items in flight, and the curve's samples from them (pure: the clock is passed in).

    Each sample is a window of WINDOW_S: the mean count in flight over it (the count's integral over the window's
    length) and the mean latency of the items settled in it. By Little's law the two go together in any window, for
    a runner that serves one item at a time as for one that decodes them together. An item's own place at its
    hand-over does not: a batch handed at once put its last items at the top of the curve with the batch's latency
    (a batching runner answers them all alike), the curve read "16 in flight is as fast as 1", and at the next
    burst of opens it promised 35 items/s where the runner served 10: every stream admitted on it was late."""

    count: int = 0
    _area: float = 0.0  # the count's integral since the window began
    _at: float = 0.0  # the clock when the count last changed
    _since: float = 0.0  # the window's start
    _latency: float = 0.0  # of the items measured in the window
    _measured: int = 0
    _settled: int = 0  # items served in the window, measured or not
    _busy_at: float | None = None  # the runner's busy seconds when the window began (``settle``'s ``busy``)
    # the window just ended: (items settled in it, seconds the runner's thread was busy in it); None when the runner
    # does not count its busy time or was not busy
    busy_sample: tuple[int, float] | None = None

    def _tally(self, now: float) -> None:
        self._area += self.count * max(0.0, now - self._at)
        self._at = max(self._at, now)

    def hand(self, n: int, now: float) -> None:
        """``n`` items handed over at ``now``. Time the runner sat idle is no part of the window: a runner busy in
        short spells still fills windows, with the load of its busy time."""
        if self.count == 0:
            self._since += max(0.0, now - self._at)
        self._tally(now)
        self.count += n

    def settle(self, seconds: float | None, now: float, busy: Callable[[], float | None] | None = None,
               served: bool = True) -> tuple[float, float] | None:
        """One item settled at ``now``, after ``seconds`` (None: not a measure: it failed, or waited on a build);
        ``busy``: reads the seconds the runner's thread has been busy so far (None where it does not count them),
        read only when a window ends; ``served``: False for
        an item that failed (a refusal answered at once is no measure of the runner's pace). At a window's end,
        the sample: (mean count in flight, mean latency), and ``busy_sample``; a window with nothing measured (every
        item failed) gives none and is not carried into the next."""
        self._tally(now)
        self.count -= 1
        self._settled += served
        if seconds is not None:
            self._latency += seconds
            self._measured += 1
        span = now - self._since
        if span < WINDOW_S:
            return None
        sample = (max(1.0, self._area / span), self._latency / self._measured) if self._measured else None
        now_busy = busy() if busy is not None else None
        was, self._busy_at = self._busy_at, now_busy
        self.busy_sample = (self._settled, now_busy - was) if sample and now_busy is not None and was is not None \
            and now_busy > was else None
        self._since, self._area, self._latency, self._measured, self._settled = now, 0.0, 0.0, 0, 0
        return sample


BUSY_MIN_ITEMS = 20  # items settled (decayed) a runner's pace needs behind it before admission counts it


@dataclass
class BusyPace:
    """Items a continuous runner settles per second of its thread's busy time (decayed like the curve's means: half
    every HALF_LIFE_S of use). Its thread can give no more than one busy second a second, so at the batches it ran
    it carries at least this many items a second; batching only makes an item cheaper as more run together.
    Admission lets it lift the curve's growth bound (Scheduler.capacity): a fast ramp of opens is not held to twice
    what the runner carried a moment ago when its thread says it idles most of the time."""

    _items: float = 0.0
    _busy: float = 0.0
    _at: float = 0.0

    def observe(self, items: int, busy_s: float, now: float) -> None:
        decay = _decay(self._at, now)
        self._items = self._items * decay + items
        self._busy = self._busy * decay + busy_s
        self._at = max(self._at, now)

    def rate(self) -> float | None:
        """Items per busy second; None until BUSY_MIN_ITEMS items are behind it."""
        return self._items / self._busy if self._items >= BUSY_MIN_ITEMS and self._busy > 0 else None


PROVEN_S = 5.0  # seconds a load must have been carried, healthy, before it is a floor for admission
HEALTHY = 0.8  # of the stage budget: an item's mean latency within it is healthy; over the budget, the floor goes


@dataclass
class ProvenLoad:
    """The floor is kept as what was carried, the streams' declared items/s and how many streams, not as a load in
    the units of that moment: admission charges each stream an ``extra`` beyond its declared rate (serving/rates.py)
    that moves, and a floor learnt while each stream was charged more would, read under a smaller charge, let in
    more streams than were ever carried (``at``)."""

    floor: float = 0.0  # the declared items/s carried, healthy, for PROVEN_S
    streams: int = 0  # how many streams carried it
    _weight: float = 0.0  # the items' latency, a mean whose samples' weight halves every HALF_LIFE_S of use
    _latency_sum: float = 0.0
    _at: float = 0.0
    _loads: list[tuple[float, float, int]] = field(default_factory=list)  # (when, declared, streams), oldest first

    def at(self, extra: float) -> float:
        """The floor's load with each stream charged ``extra`` beyond its declared rate, as admission sums it."""
        return self.floor + extra * self.streams

    def observe(self, seconds: float, load: float, budget: float, now: float, streams: int = 0,
                extra: float = 0.0) -> None:
        """An item took ``seconds`` while ``streams`` streams declaring ``load`` items/s in all were admitted on the
        runner, each charged ``extra`` more, ``budget`` the tightest stage budget admitted on it."""
        decay = _decay(self._at, now)
        self._weight = self._weight * decay + 1.0
        self._latency_sum = self._latency_sum * decay + seconds
        self._at = max(self._at, now)
        if not self._loads or self._loads[-1][1:] != (load, streams):
            self._loads.append((now, load, streams))
        while len(self._loads) > 1 and self._loads[1][0] <= now - PROVEN_S:
            del self._loads[0]  # the first entry is the load in force PROVEN_S ago
        mean = self._latency_sum / self._weight
        if mean > budget:
            self.floor, self.streams = 0.0, 0
            self._loads = [(now, load, streams)]
        elif mean <= HEALTHY * budget and self._loads[0][0] <= now - PROVEN_S:
            _, least, n = min(self._loads, key=lambda e: e[1] + extra * e[2])  # carried the whole time
            if least + extra * n > self.at(extra):
                self.floor, self.streams = least, n
