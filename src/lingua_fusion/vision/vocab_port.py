"""The vocabulary store's port: ``VocabularyBackend``, the face the REST routes, the SDK's local mode, live streams
and file requests use, and ``open_vocabularies``, which picks the store for a server's settings.

Two stores implement it: ``store.VocabularyStore`` (SQLite in the state directory: one machine, the default) and
``redis_store.RedisVocabularyStore`` (``state.redis_url`` set: every server sharing that Redis serves every
vocabulary). The contract, whichever store:

- every call names the owner (the API key id): another key's vocabulary is ``NotFound``, never "forbidden";
- limits per owner: ``max_per_key`` vocabularies, ``max_examples`` examples in each, ``max_bytes`` of landmark JSON
  over all of them, checked in the same step as the write that they guard (``QuotaExceeded``, ``details.limit``);
- calls block (disk, network, DTW): callers run them on worker threads, never on the event loop;
- ``recogniser`` is built once per version of a vocabulary, and a change made through any store sharing the data
  (another process, another server) is seen by the next call;
- a store that cannot be reached raises ``StoreUnavailable`` (503 ``state_store_unavailable``).

``owners``, ``stored_examples`` and ``restore`` are for moving vocabularies between stores (``vocab_copy.py``):
ids, owners, names and times are kept, and ``restore`` of what is there already changes nothing.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from typing import Protocol

from ..config import Settings
from ..json_types import JSONObject
from .landmarks import LandmarkSeq
from .recogniser import Recogniser
from .vocab_model import AddedExample, ExampleJSON, StoredExample, Vocabulary


class VocabularyBackend(Protocol):
    max_per_key: int
    max_examples: int
    max_bytes: int

    def create(self, owner: str, name: str, kind: str, lang: str = "en") -> Vocabulary: ...

    def get(self, owner: str, vocab_id: str) -> Vocabulary: ...

    def list(self, owner: str) -> builtins.list[Vocabulary]:
        """The owner's vocabularies, the oldest first."""
        ...

    def delete(self, owner: str, vocab_id: str) -> None: ...

    def add_example(self, owner: str, vocab_id: str, gloss: str, seq: LandmarkSeq) -> AddedExample:
        """``{example_id, gloss, frames, duration_s}`` of the new example."""
        ...

    def delete_example(self, owner: str, vocab_id: str, example_id: str) -> None: ...

    def examples(self, owner: str, vocab_id: str) -> builtins.list[ExampleJSON]:
        """``{example_id, gloss, frames, created}`` of each example, in the order taught."""
        ...

    def stored_bytes(self, owner: str) -> int: ...

    def export(self, owner: str, vocab_id: str) -> JSONObject: ...

    def export_json(self, owner: str, vocab_id: str) -> bytes: ...

    def import_(self, owner: str, doc: object, name: str | None = None) -> Vocabulary: ...

    def recogniser(self, owner: str, vocab_id: str) -> Recogniser: ...

    def owners(self) -> builtins.list[str]:
        """Every owner that keeps a vocabulary."""
        ...

    def stored_examples(self, owner: str, vocab_id: str) -> Iterator[StoredExample]:
        """The vocabulary's examples as stored, in the order taught (read a few at a time)."""
        ...

    def restore(self, owner: str, vocab: Vocabulary, examples: Iterable[StoredExample]) -> bool:
        """Put ``vocab`` (its id, name, kind, lang, created) and ``examples`` (their ids) as they are, beside
        what is there: what exists already is left as it is. Limits are not checked (the source kept them).
        True when anything was written."""
        ...

    def close(self) -> None: ...


def open_vocabularies(settings: Settings) -> VocabularyBackend:
    """The store for ``settings``: on Redis when ``state.redis_url`` is set, else SQLite in the state directory."""
    v = settings.vision
    if settings.state.redis_url:
        from .redis_store import RedisVocabularyStore

        return RedisVocabularyStore(settings.state.redis_url, max_per_key=v.max_vocabularies_per_key,
                                    max_examples=v.max_examples_per_vocabulary,
                                    max_bytes=v.max_vocabulary_bytes_per_key)
    from .store import VocabularyStore

    return VocabularyStore(settings.resolved_state_dir(), max_per_key=v.max_vocabularies_per_key,
                           max_examples=v.max_examples_per_vocabulary, max_bytes=v.max_vocabulary_bytes_per_key)
