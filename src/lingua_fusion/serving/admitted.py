"""What a stream asks of the models (``Demand``), and the streams admission holds (``Scheduler.admitted``): by id,
counting as they change how many streams of each SLO class use each model, so the tightest class on a model is
known at once.

``Scheduler.service_window`` asks for it at every hand-over to a continuous runner, that is per item. Scanning
every admitted stream there cost a model process's loop time per item that grew with the streams
(bench/executor_host.py), on the loop whose lock the GPU runner threads share.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .ports import SLO_CLASSES

K = TypeVar("K", bound=Hashable)  # a model's key (the scheduler's)


@dataclass
class Demand(Generic[K]):
    """What one stream asks of each model: items per second, and the tightest stage budget it needs."""

    stream_id: str
    slo: str
    rate: dict[K, float]  # model -> items/s


class Admitted(MutableMapping[str, Demand[K]], Generic[K]):
    def __init__(self) -> None:
        self._by_id: dict[str, Demand[K]] = {}
        self._classes: defaultdict[K, Counter[str]] = defaultdict(Counter)  # model -> SLO class -> streams

    def tightest(self, model: K) -> str | None:
        """The tightest SLO class among the streams admitted on ``model`` (None: none is)."""
        classes = self._classes.get(model)
        return min(classes, key=SLO_CLASSES.__getitem__) if classes else None

    def __getitem__(self, stream_id: str) -> Demand[K]:
        return self._by_id[stream_id]

    def __setitem__(self, stream_id: str, demand: Demand[K]) -> None:
        if stream_id in self._by_id:
            del self[stream_id]
        self._by_id[stream_id] = demand
        for model in demand.rate:
            self._classes[model][demand.slo] += 1

    def __delitem__(self, stream_id: str) -> None:
        demand = self._by_id.pop(stream_id)
        for model in demand.rate:
            classes = self._classes[model]
            classes[demand.slo] -= 1
            if classes[demand.slo] <= 0:
                del classes[demand.slo]
            if not classes:
                del self._classes[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)
