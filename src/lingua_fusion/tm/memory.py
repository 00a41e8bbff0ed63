"""``TranslationMemory``: the MT path's cache. For a batch of segments: the local LRU, then the shared Redis tier
for what the LRU lacks, then MT (with the glossary, glossary.apply_mt_batch) for what neither has; each segment that
is asked for twice in one batch is translated once. What MT made is kept in both tiers.

Used by the stream engine's MT runner (rooms and streams: a repeated phrase, the same deck in several rooms) and by
REST file translation (the same slide translated for many users). A cached entry is keyed by the route and the
glossary version (``key.py``), so a translation made with another glossary, route or model is never returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..deadline import Deadline
from ..glossary import Term, apply_mt_batch
from .key import entry_key, glossary_version, normalise
from .lru import LRU
from .shared import SharedEntry, SharedTier

if TYPE_CHECKING:
    from ..config import Settings


@dataclass
class TmStats:
    hits_local: int = 0
    hits_shared: int = 0
    misses: int = 0  # segments MT translated
    bypassed: int = 0  # segments too long (or empty) to keep


class _Batch:
    """One call's segments: their keys (None: not kept), and what is known of each so far."""

    def __init__(self, texts: list[str], terms: list[Sequence[Term]], names: list[Sequence[Term]]) -> None:
        self.texts, self.terms, self.names = texts, terms, names
        self.keys: list[str | None] = []
        self.outs: list[str | None] = [None] * len(texts)
        self.applied: list[list[Term]] = [[] for _ in texts]

    def give(self, i: int, text: str, applied: tuple[str, ...]) -> None:
        self.outs[i], self.applied[i] = text, _terms(applied, self.terms[i], self.names[i])


class TranslationMemory:
    def __init__(self, local: LRU, shared: SharedTier | None = None, *, max_segment_chars: int = 2000,
                 clock: Callable[[], float] = time.time) -> None:
        self.local = local
        self.shared = shared
        self.max_segment_chars = max_segment_chars
        self.clock = clock
        self.stats = TmStats()
        self._lock = threading.Lock()

    def translate(self, route: str, texts: list[str], terms: list[Sequence[Term]],
                  translate: Callable[[list[str]], list[str]], *, names: list[Sequence[Term]] | None = None,
                  deadline: Deadline | None = None,
                  scopes: Sequence[str] | None = None) -> tuple[list[str], list[list[Term]]]:
        """``apply_mt_batch`` with a memory: the same (translations, glossary terms applied per text). ``scopes``:
        each text's owner (its API key's id; tm/key.py), whose entries alone it may hit."""
        extra: list[Sequence[Term]] = names if names is not None else [() for _ in texts]
        owners: Sequence[str] = scopes if scopes is not None else ["" for _ in texts]
        batch = _Batch(texts, terms, extra)
        for t, ts, ns, scope in zip(texts, terms, extra, owners, strict=True):
            keep = 0 < len(normalise(t)) <= self.max_segment_chars
            batch.keys.append(entry_key(t, route, glossary_version(ts, ns), scope) if keep else None)
        now = self.clock()
        hits_local, hits_shared = self._lookup(batch, now)
        self._fill(batch, translate, deadline, now)
        with self._lock:
            cached = sum(1 for k in batch.keys if k is not None)
            self.stats.hits_local += hits_local
            self.stats.hits_shared += hits_shared
            self.stats.bypassed += len(texts) - cached
            self.stats.misses += cached - hits_local - hits_shared
        return [o if o is not None else "" for o in batch.outs], batch.applied

    def _lookup(self, batch: _Batch, now: float) -> tuple[int, int]:
        """The local tier, then the shared one for what it lacks (one MGET). Returns (local hits, shared hits)."""
        hits_local = hits_shared = 0
        for i, k in enumerate(batch.keys):
            entry = self.local.get(k, now) if k is not None else None
            if entry is not None:
                batch.give(i, entry.text, entry.applied)
                hits_local += 1
        wanted = sorted({k for i, k in enumerate(batch.keys) if k is not None and batch.outs[i] is None})
        if self.shared is None or not wanted:
            return hits_local, 0
        found = dict(zip(wanted, self.shared.get_many(wanted), strict=True))
        for i, k in enumerate(batch.keys):
            got = found.get(k) if k is not None and batch.outs[i] is None else None
            if got is not None:
                batch.give(i, str(got["t"]), tuple(got["a"]))
                self.local.put(str(k), str(got["t"]), tuple(got["a"]), now)
                hits_shared += 1
        return hits_local, hits_shared

    def _fill(self, batch: _Batch, translate: Callable[[list[str]], list[str]], deadline: Deadline | None,
              now: float) -> None:
        """MT for the misses, one segment per distinct key (or per text not kept); the results kept in both tiers."""
        todo: dict[str, list[int]] = {}
        for i, k in enumerate(batch.keys):
            if batch.outs[i] is None:
                todo.setdefault(k if k is not None else f"#{i}", []).append(i)
        if not todo:
            return
        first = [idx[0] for idx in todo.values()]
        made, used = apply_mt_batch([batch.texts[i] for i in first], [batch.terms[i] for i in first], translate,
                                    names=[batch.names[i] for i in first], deadline=deadline)
        fresh: dict[str, SharedEntry] = {}
        for (k, idx), out, terms_used in zip(todo.items(), made, used, strict=True):
            for i in idx:
                batch.outs[i], batch.applied[i] = out, list(terms_used)
            if batch.keys[idx[0]] is not None:
                sources = tuple(t.source for t in terms_used)
                self.local.put(k, out, sources, now)
                fresh[k] = {"t": out, "a": list(sources)}
        if self.shared is not None:
            self.shared.put_many(fresh)

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()


def _terms(sources: tuple[str, ...], terms: Sequence[Term], names: Sequence[Term]) -> list[Term]:
    by_source = {t.source: t for t in (*names, *terms)}
    return [by_source[s] for s in sources if s in by_source]


def open_tm(settings: Settings) -> TranslationMemory | None:
    """The memory ``settings.tm`` describes (None when off), with the shared tier on ``state.redis_url``."""
    cfg = settings.tm
    if not cfg.enabled:
        return None
    shared = SharedTier(settings.state.redis_url, int(cfg.shared_ttl_s)) \
        if cfg.shared and settings.state.redis_url else None
    return TranslationMemory(LRU(cfg.local_entries, cfg.local_max_bytes, cfg.local_ttl_s), shared,
                             max_segment_chars=cfg.max_segment_chars)
