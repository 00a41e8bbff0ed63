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
reservation (it may start talking), and a louder one is counted as it is. Admission adds each stream's ``extra``
(the committed items a second beyond the declared) to the model's declared load (Scheduler.demand_extra), in the
streams it admits and in the load a model was proven to carry. A file's pieces and tentative re-decodes are not
counted: files wait behind captions by design, and partials follow speech time and the partial pace and are shed
first under load (they count at a quarter in the declared rate, not scaled). A retried item counts once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

COMMITTED_RATE = 0.3  # committed items a second a stream is declared to ask of each model it uses
SETTLE_S = 5.0  # a stream's work is counted from this long after its admission
WINDOW_S = 2.0  # the rate is sampled over windows this long
MIN_STREAM_S = 8.0  # settled stream-seconds a window needs to be a sample (4 streams: a CPU server holds ~12)
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
        """``stream`` admitted at ``now`` (a stream re-registered after its model process restarted: pass a time
        SETTLE_S back, it is counted at once)."""
        self._streams[stream] = (now, frozenset(models))

    def released(self, stream: str, now: float) -> None:
        entry = self._streams.pop(stream, None)
        if entry is not None:
            for model in entry[1]:
                self._gone[model] = self._gone.get(model, 0.0) + self._settled_s(entry[0], now)

    def submitted(self, model: K, stream: str, now: float) -> dict[K, float] | None:
        """A committed item of ``stream`` for ``model`` at ``now`` (once per item, not per retry); at a window's end,
        every model's ``extra``."""
        entry = self._streams.get(stream)
        if entry is not None and now - entry[0] >= SETTLE_S:
            self._items[model] = self._items.get(model, 0) + 1
        return self.due(now)

    def due(self, now: float) -> dict[K, float] | None:
        """Every model's ``extra`` if a window ended by ``now`` (the caller's clock: an admission asks too, so a
        quiet server's measure does not wait for the next item), else None."""
        return self.tick(now) if now - self._start >= WINDOW_S else None

    def tick(self, now: float) -> dict[K, float]:
        """Close the window at ``now``: each model's rate is sampled where MIN_STREAM_S settled stream-seconds were
        in it; where fewer were, it moves back towards the declared rate as far (what is not measured is assumed as
        declared, so a loud spell's measure does not outlive its streams). Returns every model's ``extra``."""
        seconds: dict[K, float] = dict(self._gone)
        for since, models in self._streams.values():
            settled = self._settled_s(since, now)
            if settled > 0:
                for model in models:
                    seconds[model] = seconds.get(model, 0.0) + settled
        for model in set(seconds) | set(self._rate):
            stream_s, old = seconds.get(model, 0.0), self._rate.get(model)
            if stream_s < MIN_STREAM_S and old is None:
                continue  # nothing measured yet, nothing to go back from
            sample = self._items.get(model, 0) / stream_s if stream_s >= MIN_STREAM_S else self.declared
            self._rate[model] = sample if old is None else (1 - ALPHA) * old + ALPHA * sample
        self._start, self._items, self._gone = now, {}, {}
        return {model: self.extra(model) for model in self._rate}

    def scale(self, model: K) -> float:
        """The measured committed rate over the declared one, from 1 to MAX_SCALE (1 until measured)."""
        rate = self._rate.get(model)
        return 1.0 if rate is None else min(MAX_SCALE, max(1.0, rate / self.declared))

    def extra(self, model: K) -> float:
        """Committed items a second each stream asks of ``model`` beyond its declared rate (``scale`` - 1 of it):
        what admission adds to each stream's declared load (Scheduler.demand_extra). Its tentative re-decodes are
        not scaled: they follow speech time and the partial pace, not the utterances, and are shed first."""
        return (self.scale(model) - 1.0) * self.declared

    def _settled_s(self, since: float, now: float) -> float:
        """Seconds of this window a stream admitted at ``since`` was settled, to ``now``."""
        return max(0.0, now - max(self._start, since + SETTLE_S))
