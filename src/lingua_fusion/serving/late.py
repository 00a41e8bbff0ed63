"""Committed work a continuous runner owes, and how far the most overdue of it is past its budget: admission's signal
that a model is behind now, before its measures say so (pure: the clock is passed in, no threads).

Admission counts a continuous runner by its latency curve, which learns from items as they settle: in windows of a
second, decayed over seconds. A ramp of opens (900 streams in 5 s on an H100) outruns it. The runner's items were
already late while the curve still promised room, and 755 streams were admitted where 333 met their target. An item
still unanswered past its stage's whole budget is known at once: while one is owed, the model takes no more streams.

The budget counts from the item's submission to this model (``Executor._submit``: ``stage_deadline`` of then), not
from its caption's start: the caption's clock starts when its words arrived, and by the time MT is asked, ASR has
used some of it, so on a healthy server a tenth of the MT items were past their caption deadline (p90 0.39 s
against MT's 0.3 s at interactive) and would have refused every stream. An item over its whole budget at the model
is twice what admission's curve plans for (half the budget).

``Owed`` keeps each model's committed items from submission to settling (queued in the scheduler or handed to the
runner alike) in a heap by deadline; a settled item leaves it lazily, when it reaches the top or the heap is
compacted, so each item costs O(log n) whatever order they settle in.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Owed(Generic[K]):
    def __init__(self) -> None:
        self._heaps: dict[K, list[tuple[float, int]]] = {}  # (deadline, item's seq), settled ones among them
        self._open: dict[K, set[int]] = {}  # seqs still owed

    def add(self, model: K, seq: int, deadline: float) -> None:
        heapq.heappush(self._heaps.setdefault(model, []), (deadline, seq))
        self._open.setdefault(model, set()).add(seq)

    def settle(self, model: K, seq: int) -> None:
        """The item ``seq`` was answered, failed, shed or withdrawn (once or more: the second time is nothing)."""
        open_ = self._open.get(model)
        if open_ is None or seq not in open_:
            return
        open_.discard(seq)
        heap = self._heaps[model]
        if len(heap) > 2 * len(open_) + 64:  # settled items deep in the heap: dropped, so it stays O(owed)
            self._heaps[model] = [e for e in heap if e[1] in open_]
            heapq.heapify(self._heaps[model])

    def owed(self, model: K) -> int:
        return len(self._open.get(model, ()))

    def late(self, model: K, now: float, forget_after: float = float("inf")) -> float:
        """Seconds the most overdue item ``model`` still owes is past its deadline at ``now`` (0: none is). An item
        more than ``forget_after`` past it is no longer counted: one wedged item (its wait is bounded only by the
        request timeout, and retries) does not shut the model to new streams for minutes."""
        heap, open_ = self._heaps.get(model), self._open.get(model, set())
        while heap and (heap[0][1] not in open_ or now - heap[0][0] > forget_after):
            open_.discard(heapq.heappop(heap)[1])
        return max(0.0, now - heap[0][0]) if heap else 0.0
