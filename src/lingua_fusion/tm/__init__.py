"""Translation memory: translations cached by (normalised source segment, route, glossary version).

- ``key.py``: the normalisation and the key (pure)
- ``lru.py``: the local tier: an LRU bounded in entries and bytes, with a TTL (pure, the clock passed in)
- ``shared.py``: the shared tier on Redis (every server and gateway sharing it), with a backoff when it fails
- ``memory.py``: ``TranslationMemory``: local, then shared, then MT for the misses only; hit / miss / eviction
  counts; ``metrics.py`` shows them on /metrics
"""

from .memory import TranslationMemory, open_tm

__all__ = ["TranslationMemory", "open_tm"]
