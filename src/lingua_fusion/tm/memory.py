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
from typing import Any

from ..deadline import Deadline
from ..glossary import Term, apply_mt_batch
from .key import entry_key, glossary_version, normalise
from .lru import LRU
from .shared import SharedTier


@dataclass
class TmStats:
    hits_local: int = 0
    hits_shared: int = 0
    misses: int = 0  # segments MT translated
    bypassed: int = 0  # segments too long (or empty) to keep


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
                  deadline: Deadline | None = None) -> tuple[list[str], list[list[Term]]]:
        """``apply_mt_batch`` with a memory: the same (translations, glossary terms applied per text)."""
        extra: list[Sequence[Term]] = names if names is not None else [() for _ in texts]
        now = self.clock()
        outs: list[str | None] = [None] * len(texts)
        applied: list[list[Term]] = [[] for _ in texts]
        keys: list[str | None] = []
        for t, ts, ns in zip(texts, terms, extra, strict=True):
            keep = 0 < len(normalise(t)) <= self.max_segment_chars
            keys.append(entry_key(t, route, glossary_version(ts, ns)) if keep else None)
        hits_local = hits_shared = bypassed = 0
        for i, k in enumerate(keys):
            if k is None:
                bypassed += 1
                continue
            entry = self.local.get(k, now)
            if entry is not None:
                outs[i], applied[i] = entry.text, _terms(entry.applied, terms[i], extra[i])
                hits_local += 1
        wanted = sorted({k for i, k in enumerate(keys) if k is not None and outs[i] is None})
        if self.shared is not None and wanted:
            found = dict(zip(wanted, self.shared.get_many(wanted), strict=True))
            for i, k in enumerate(keys):
                got = found.get(k) if k is not None and outs[i] is None else None
                if got is not None:
                    outs[i], applied[i] = str(got["t"]), _terms(tuple(got["a"]), terms[i], extra[i])
                    self.local.put(k, str(got["t"]), tuple(got["a"]), now)  # type: ignore[arg-type]
                    hits_shared += 1
        todo: dict[str, list[int]] = {}  # one MT call per distinct key (or per uncached text)
        for i, k in enumerate(keys):
            if outs[i] is None:
                todo.setdefault(k if k is not None else f"#{i}", []).append(i)
        if todo:
            first = [idx[0] for idx in todo.values()]
            made, used = apply_mt_batch([texts[i] for i in first], [terms[i] for i in first], translate,
                                        names=[extra[i] for i in first], deadline=deadline)
            fresh: dict[str, dict[str, Any]] = {}
            for (k, idx), out, terms_used in zip(todo.items(), made, used, strict=True):
                for i in idx:
                    outs[i], applied[i] = out, list(terms_used)
                if keys[idx[0]] is not None:
                    sources = tuple(t.source for t in terms_used)
                    self.local.put(k, out, sources, now)
                    fresh[k] = {"t": out, "a": list(sources)}
            if self.shared is not None:
                self.shared.put_many(fresh)
        with self._lock:
            self.stats.hits_local += hits_local
            self.stats.hits_shared += hits_shared
            self.stats.bypassed += bypassed
            self.stats.misses += sum(1 for k in keys if k is not None) - hits_local - hits_shared
        return [o if o is not None else "" for o in outs], applied

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()


def _terms(sources: tuple[str, ...], terms: Sequence[Term], names: Sequence[Term]) -> list[Term]:
    by_source = {t.source: t for t in (*names, *terms)}
    return [by_source[s] for s in sources if s in by_source]


def open_tm(settings: Any) -> TranslationMemory | None:
    """The memory ``settings.tm`` describes (None when off), with the shared tier on ``state.redis_url``."""
    cfg = settings.tm
    if not cfg.enabled:
        return None
    shared = SharedTier(settings.state.redis_url, int(cfg.shared_ttl_s)) \
        if cfg.shared and settings.state.redis_url else None
    return TranslationMemory(LRU(cfg.local_entries, cfg.local_max_bytes, cfg.local_ttl_s), shared,
                             max_segment_chars=cfg.max_segment_chars)
