"""``EncoderMemo``: a GPU runner's encoder outputs kept by payload key, so the same input read again (a commit of the
window its last partial read, a caption translated into a second language) reuses its cross-attention entry.

A key must be exact: two payloads with the same key share one encoder output, and a wrong share would give one
stream another's words. For audio that is a hash of the whole window (blake2b, about 0.5 ms of the runner's thread a
10 s window, 1.4 ms for 30 s: on an H100 the ASR runner's starts were the limit, 3-5 ms an item). A recipe that also
has a ``prefilter`` (a cheap digest, equal whenever the keys are equal: the window's length and a few of its
samples) has only its tentative items hashed in full, the partials a commit may follow; a committed item is hashed
only where its prefilter matches a kept entry's, and it is then looked up by its full key as any other.

Pure bookkeeping of (key -> entry id); the runner releases an entry's reference when it is forgotten. One thread
(the runner's).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np


class Keyed(Protocol):
    def key(self, payload: Any) -> bytes | None:
        """Payloads with the same key share one encoder output (None: never shared)."""
        ...


@runtime_checkable
class Prefiltered(Protocol):
    def prefilter(self, payload: Any) -> bytes:
        """A cheap digest of what ``key`` hashes: equal for any two payloads whose keys are equal."""
        ...


class EncoderMemo:
    def __init__(self, recipe: Keyed, size: int) -> None:
        self.size = size
        self._key = recipe.key
        self._prefilter: Callable[[Any], bytes] | None = recipe.prefilter if isinstance(recipe, Prefiltered) else None
        self._entries: OrderedDict[bytes, int] = OrderedDict()  # key -> entry id, least recently used first
        self._near: dict[bytes, int] = {}  # prefilter -> how many kept entries have it
        self._filters: dict[bytes, bytes] = {}  # key -> its prefilter, for the entries that have one
        self.hashed = 0  # full keys computed (what the prefilter saves shows against the items started)

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self, payloads: list[Any], tentative: list[bool]) -> tuple[list[bytes | None], list[bytes | None]]:
        """Each payload's key (None: not shared: no key, or a committed item no kept entry may match) and its
        prefilter (None where the recipe has none)."""
        keys: list[bytes | None] = []
        filters: list[bytes | None] = []
        for payload, maybe in zip(payloads, tentative, strict=True):
            near = self._prefilter(payload) if self._prefilter is not None else None
            filters.append(near)
            if self.size == 0:  # nothing is kept: nothing to find
                keys.append(None)
            elif near is None or maybe or near in self._near:
                self.hashed += 1
                keys.append(self._key(payload))
            else:
                keys.append(None)
        return keys, filters

    def get(self, key: bytes | None) -> int | None:
        return self._entries.get(key) if key is not None else None

    def use(self, key: bytes) -> None:
        """``key``'s entry was reused: the last to be forgotten now."""
        self._entries.move_to_end(key)

    def keep(self, key: bytes, entry: int, prefilter: bytes | None) -> bool:
        """Keep ``entry`` under ``key`` (False, kept nothing: the key has an entry already)."""
        if key in self._entries:
            return False
        self._entries[key] = entry
        if prefilter is not None:
            self._filters[key] = prefilter
            self._near[prefilter] = self._near.get(prefilter, 0) + 1
        return True

    def forget_oldest(self) -> int:
        """Forget the least recently used entry; its id (the caller releases it)."""
        key, entry = self._entries.popitem(last=False)
        near = self._filters.pop(key, None)
        if near is not None:
            self._near[near] -= 1
            if not self._near[near]:
                del self._near[near]
        return entry


def audio_key(audio: np.ndarray) -> bytes:
    """A window's exact key: blake2b of its samples (``Keyed.key`` of an audio recipe)."""
    return hashlib.blake2b(np.ascontiguousarray(audio).tobytes(), digest_size=16).digest()


def audio_prefilter(audio: np.ndarray) -> bytes:
    """A window's length and 64 samples spread over it (``Prefiltered.prefilter`` of an audio recipe)."""
    n = len(audio)
    sampled: bytes = audio[:: max(1, n // 64)][:64].tobytes()
    return n.to_bytes(8, "little") + sampled
