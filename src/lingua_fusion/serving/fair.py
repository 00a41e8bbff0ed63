"""Work taken from several keys in turn (pure): one call's fair share when many keys' items wait for it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def round_robin(items: list[T], key: Callable[[T], str], units: Callable[[T], float], *, max_items: int,
                max_units: float) -> tuple[list[T], list[T]]:
    """(taken, left): ``items`` taken one key at a time in turn (each key's in their order) until ``max_items`` or
    ``max_units`` (one item always fits). The VAD lane's fair share: a key with many streams of long audio cannot
    fill one VAD call that everybody else's windows then wait behind."""
    queues: dict[str, deque[T]] = {}
    for it in items:
        queues.setdefault(key(it), deque()).append(it)
    taken: list[T] = []
    total = 0.0
    while queues and len(taken) < max_items:
        for k in list(queues):
            it = queues[k][0]
            if taken and total + units(it) > max_units:
                queues.clear()
                break
            taken.append(queues[k].popleft())
            total += units(it)
            if not queues[k]:
                del queues[k]
            if len(taken) >= max_items:
                break
    chosen = {id(it) for it in taken}
    return taken, [it for it in items if id(it) not in chosen]
