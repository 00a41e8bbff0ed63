"""The local tier: an LRU of translations bounded in entries and in bytes, each entry living ``ttl_s`` (pure: the
clock is passed in; thread-safe: the model threads and the REST workers share it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    text: str
    applied: tuple[str, ...]  # the glossary terms (sources) the translation applied
    expires: float

    @property
    def size(self) -> int:
        return 64 + len(self.text.encode("utf-8")) + sum(len(a) for a in self.applied)


class LRU:
    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0  # pushed out by the size bounds
        self.expirations = 0  # found past their TTL

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: str, now: float) -> Entry | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                return None
            if entry.expires <= now:
                self._drop(key)
                self.expirations += 1
                return None
            self._items.move_to_end(key)
            return entry

    def put(self, key: str, text: str, applied: tuple[str, ...], now: float, ttl_s: float | None = None) -> None:
        entry = Entry(text, applied, now + (self.ttl_s if ttl_s is None else ttl_s))
        if entry.size > self.max_bytes:
            return  # larger than the whole tier: not kept
        with self._lock:
            if key in self._items:
                self._drop(key)
            self._items[key] = entry
            self._bytes += entry.size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                oldest = next(iter(self._items))
                self._drop(oldest)
                self.evictions += 1

    def _drop(self, key: str) -> None:
        entry = self._items.pop(key)
        self._bytes -= entry.size
