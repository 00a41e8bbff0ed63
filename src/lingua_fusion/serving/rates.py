"""How much committed work a stream really asks of each model, measured: admission's declared rates scaled to it
(pure: the clock is passed in, no threads).

Admission reserves each stream a declared rate per model (demand.stream_demand: COMMITTED_RATE committed items a
second, about one utterance per 3.3 s) and compares the streams' sum with what the model is measured to carry. The
capacity side is measured; the demand side was a guess. On an H100 the product's streams committed 0.42 utterances
a second each (the load generator's speech: 6,138 captions from 738 streams in 20 s), 1.4x what was reserved, so a
fast ramp was admitted to 944 streams where 689 could be served in time, and 352 were.

``DemandMeter`` counts the committed items streams submit to each model, per second of streams that have settled
(admitted at least SETTLE_S ago: a new stream's first utterance comes seconds after it opens, and counting it from
its open would dilute the rate just when a ramp of opens needs it), over windows of WINDOW_S, as a moving average.
``scale(model)`` is that rate over the declared one, never below 1: a stream quieter than declared keeps its
reservation (it may start talking), and a louder one is counted as it is. Admission multiplies the model's declared
load by it (Scheduler.demand_scale), so the streams admitted and the load a model was proven to carry are both in
measured work. A file's pieces and tentative re-decodes are not counted: files wait behind captions by design and
partials are shed first under load (they count at a quarter in the declared rate, scaled alike).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

COMMITTED_RATE = 0.3  # committed items a second a stream is declared to ask of each model it uses
SETTLE_S = 5.0  # a stream's work is counted from this long after its admission
WINDOW_S = 2.0  # the rate is sampled over windows this long
MIN_STREAM_S = 20.0  # stream-seconds a window needs before it is a sample (a few quiet streams are not the rate)
ALPHA = 0.3  # a sample's weight in the moving average
MAX_SCALE = 4.0  # a stream is never counted at more than this many times its declared rate


class DemandMeter(Generic[K]):
    def __init__(self, now: float, declared: float = COMMITTED_RATE) -> None:
        self.declared = declared
        self._streams: dict[str, tuple[float, frozenset[K]]] = {}  # admitted stream -> (admitted at, its models)
        self._start = now  # the window's
        self._items: dict[K, int] = {}  # committed items of settled streams in the window
        self._gone: dict[K, float] = {}  # settled stream-seconds in the window of streams released during it
        self._rate: dict[K, float] = {}  # the moving average: committed items per settled stream-second

    def admitted(self, stream: str, models: Iterable[K], now: float) -> None:
        self._streams[stream] = (now, frozenset(models))

    def released(self, stream: str, now: float) -> None:
        entry = self._streams.pop(stream, None)
        if entry is not None:
            for model in entry[1]:
                self._gone[model] = self._gone.get(model, 0.0) + self._settled_s(entry[0], now)

    def submitted(self, model: K, stream: str, now: float) -> dict[K, float] | None:
        """A committed item of ``stream`` for ``model`` at ``now``; at a window's end, every model's scale."""
        entry = self._streams.get(stream)
        if entry is not None and now - entry[0] >= SETTLE_S:
            self._items[model] = self._items.get(model, 0) + 1
        return self.tick(now) if now - self._start >= WINDOW_S else None

    def tick(self, now: float) -> dict[K, float]:
        """Close the window at ``now``: each model's rate is sampled, and every model's scale returned."""
        seconds: dict[K, float] = dict(self._gone)
        for since, models in self._streams.values():
            settled = self._settled_s(since, now)
            if settled > 0:
                for model in models:
                    seconds[model] = seconds.get(model, 0.0) + settled
        for model, stream_s in seconds.items():
            if stream_s >= MIN_STREAM_S:
                sample = self._items.get(model, 0) / stream_s
                old = self._rate.get(model)
                self._rate[model] = sample if old is None else (1 - ALPHA) * old + ALPHA * sample
        self._start, self._items, self._gone = now, {}, {}
        return {model: self.scale(model) for model in self._rate}

    def scale(self, model: K) -> float:
        """What a stream's declared load on ``model`` is multiplied by: its measured committed rate over the
        declared one, from 1 to MAX_SCALE (1 until measured)."""
        rate = self._rate.get(model)
        return 1.0 if rate is None else min(MAX_SCALE, max(1.0, rate / self.declared))

    def _settled_s(self, since: float, now: float) -> float:
        """Seconds of this window a stream admitted at ``since`` was settled, to ``now``."""
        return max(0.0, now - max(self._start, since + SETTLE_S))
