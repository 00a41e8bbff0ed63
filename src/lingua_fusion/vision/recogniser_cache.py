"""Built recognisers, per vocabulary, tagged with the version of the vocabulary they were built from.

A store whose data other processes change (``redis_store.py``: a version counter per vocabulary, in Redis) reads
the current version on every use and asks for the recogniser of that version: another version's is never handed
out, so a change made anywhere is seen by the next recognition. At most ``size`` are kept, the least recently used
dropped first. Thread-safe: the callers run the store on worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .recogniser import Example, Recogniser


class RecogniserCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._built: OrderedDict[str, tuple[int, Recogniser]] = OrderedDict()

    def get(self, vocab_id: str, version: int) -> Recogniser | None:
        """The recogniser built from ``version`` of the vocabulary, if it is kept."""
        with self._lock:
            kept = self._built.get(vocab_id)
            if kept is None or kept[0] != version:
                return None
            self._built.move_to_end(vocab_id)
            return kept[1]

    def put(self, vocab_id: str, version: int, rec: Recogniser) -> None:
        """Keep ``rec``, unless one of a later version is kept already (a build that lost a race)."""
        with self._lock:
            kept = self._built.get(vocab_id)
            if kept is not None and kept[0] > version:
                return
            self._built[vocab_id] = (version, rec)
            self._built.move_to_end(vocab_id)
            while len(self._built) > self.size:
                self._built.popitem(last=False)

    def grow(self, vocab_id: str, version: int, example: Example) -> None:
        """The vocabulary's ``version`` is its last one plus ``example``: the kept recogniser of the version before
        grows by it (16 DTW comparisons at most) instead of a rebuild; any other kept one is left to be rebuilt."""
        with self._lock:
            kept = self._built.get(vocab_id)
            if kept is None or kept[0] != version - 1:
                return
            self._built[vocab_id] = (version, kept[1].with_example(example))

    def drop(self, vocab_id: str) -> None:
        with self._lock:
            self._built.pop(vocab_id, None)
