"""Vocabularies of taught examples, per API key, in SQLite (``vocabularies.sqlite3`` in the state directory, a file
of its own: no other store's connections or locks are involved).

A vocabulary has a kind (``sign`` or ``lip``), a name, the language its glosses are written in (what MT
translates them from) and examples: a gloss and its landmark sequence (the JSON form of ``landmarks.LandmarkSeq``).
Every read and write names the owner: another key's vocabulary is "not found", never "forbidden" (which would tell
that it exists). The recogniser built from a vocabulary is cached until the vocabulary changes.

Limits per key: ``max_per_key`` vocabularies, ``max_examples`` examples in each, and ``max_bytes`` of stored
landmark JSON over all of them (``quota_exceeded``, ``details.limit`` naming which). The stored JSON is read and
written with ``bigjson`` (the callers run this store on worker threads: megabytes of JSON must not hold the GIL
in one C call); the export is spliced from the stored text, never parsed.

This is the default ``VocabularyBackend`` (vocab_port.py: the contract, and ``open_vocabularies``, which picks
``redis_store.py`` instead when ``state.redis_url`` is set); what a vocabulary is, its checks and refusals, are
``vocab_model.py``'s, shared with the Redis store.
"""

from __future__ import annotations

import builtins  # the class below has a method named list: its annotations say builtins.list
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import NotFound
from ..json_types import JSONObject
from ..state.private import private_dir, private_file
from ..state.sqlite_tx import add_column
from .landmarks import LandmarkSeq
from .recogniser import Example, Recogniser, RecogniserPolicy
from .vocab_model import (
    MAX_CACHED,
    AddedExample,
    ExampleJSON,
    StoredExample,
    Vocabulary,
    blob,
    check_gloss,
    check_kind,
    clean_name,
    export_bytes,
    export_doc,
    new_example_id,
    new_vocab_id,
    no_room,
    not_found,
    parse_import,
    prepare_example,
    text_features,
    too_many_bytes,
    too_many_examples,
    unblob,
    untaught,
)

__all__ = ["Vocabulary", "VocabularyStore", "check_gloss", "check_kind"]
BATCH = 64  # examples read at once by stored_examples


class VocabularyStore:
    """The SQLite ``VocabularyBackend`` (vocab_port.py)."""

    def __init__(self, state_dir: Path, *, max_per_key: int = 20, max_examples: int = 500,
                 max_bytes: int = 256 * 1024 * 1024, policy: RecogniserPolicy | None = None) -> None:
        self.path = private_file(private_dir(state_dir) / "vocabularies.sqlite3")
        self.max_per_key = max_per_key
        self.max_examples = max_examples
        self.max_bytes = max_bytes
        self.policy = policy or RecogniserPolicy()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[int, Recogniser]] = OrderedDict()  # at most MAX_CACHED, LRU
        self._version: dict[str, int] = {}
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS vocabularies (vocab_id TEXT PRIMARY KEY, owner TEXT, "
                             "name TEXT, kind TEXT, lang TEXT, created REAL)")
            self._db.execute("CREATE TABLE IF NOT EXISTS vocab_examples (example_id TEXT PRIMARY KEY, "
                             "vocab_id TEXT, gloss TEXT, frames TEXT, n_frames INTEGER, created REAL, features BLOB)")
            self._db.execute("CREATE INDEX IF NOT EXISTS vocab_examples_by_vocab ON vocab_examples (vocab_id)")
            # a store from before features were kept gets the column, filled in as examples are read; every
            # worker of ``serve --workers`` opens the file at once, so the add is safe against a racing one
            add_column(self._db, "vocab_examples", "features", "BLOB")

    # ---- vocabularies ------------------------------------------------------------------------------------------
    def create(self, owner: str, name: str, kind: str, lang: str = "en") -> Vocabulary:
        kind = check_kind(kind)
        name = clean_name(name, kind)
        vid = new_vocab_id()
        with self._lock, self._db:
            self._check_room(owner)
            created = time.time()
            self._db.execute("INSERT INTO vocabularies VALUES (?,?,?,?,?,?)", (vid, owner, name, kind, lang, created))
        return Vocabulary(vid, name, kind, lang, created)

    def _check_room(self, owner: str) -> None:
        """QuotaExceeded when ``owner`` keeps as many vocabularies as it may."""
        count = self._db.execute("SELECT COUNT(*) FROM vocabularies WHERE owner=?", (owner,)).fetchone()[0]
        if count >= self.max_per_key:
            raise no_room(self.max_per_key)

    def get(self, owner: str, vocab_id: str) -> Vocabulary:
        with self._lock:
            row = self._db.execute(
                "SELECT v.vocab_id, v.name, v.kind, v.lang, v.created, COUNT(e.example_id), COUNT(DISTINCT e.gloss) "
                "FROM vocabularies v LEFT JOIN vocab_examples e ON e.vocab_id = v.vocab_id "
                "WHERE v.vocab_id=? AND v.owner=? GROUP BY v.vocab_id", (vocab_id, owner)).fetchone()
        if row is None:
            raise not_found(vocab_id)
        return Vocabulary(*row)

    def list(self, owner: str) -> list[Vocabulary]:
        with self._lock:
            rows = self._db.execute(
                "SELECT v.vocab_id, v.name, v.kind, v.lang, v.created, COUNT(e.example_id), COUNT(DISTINCT e.gloss) "
                "FROM vocabularies v LEFT JOIN vocab_examples e ON e.vocab_id = v.vocab_id "
                "WHERE v.owner=? GROUP BY v.vocab_id ORDER BY v.created", (owner,)).fetchall()
        return [Vocabulary(*r) for r in rows]

    def delete(self, owner: str, vocab_id: str) -> None:
        with self._lock, self._db:
            cur = self._db.execute("DELETE FROM vocabularies WHERE vocab_id=? AND owner=?", (vocab_id, owner))
            if cur.rowcount == 0:
                raise not_found(vocab_id)
            self._db.execute("DELETE FROM vocab_examples WHERE vocab_id=?", (vocab_id,))
        self._changed(vocab_id)

    # ---- examples ----------------------------------------------------------------------------------------------
    def add_example(self, owner: str, vocab_id: str, gloss: str, seq: LandmarkSeq) -> AddedExample:
        vocab = self.get(owner, vocab_id)
        gloss = check_gloss(gloss)
        text, feats = prepare_example(seq, vocab.kind)
        if vocab.examples >= self.max_examples:
            raise too_many_examples(self.max_examples)
        eid = new_example_id()
        with self._lock, self._db:
            self._check_bytes(owner, len(text.encode("utf-8")))
            self._db.execute("INSERT INTO vocab_examples (example_id, vocab_id, gloss, frames, n_frames, created, "
                             "features) VALUES (?,?,?,?,?,?,?)",
                             (eid, vocab_id, gloss, text, len(seq), time.time(), blob(feats)))
            # the cached recogniser grows by this one example (16 DTW comparisons at most), not rebuilt
            version = self._version.get(vocab_id, 0)
            cached = self._cache.get(vocab_id)
            self._version[vocab_id] = version + 1
            self._cache.pop(vocab_id, None)
            if cached is not None and cached[0] == version:
                self._cache[vocab_id] = (version + 1, cached[1].with_example(Example(gloss, feats)))
        return {"example_id": eid, "gloss": gloss, "frames": len(seq), "duration_s": round(seq.duration, 3)}

    def stored_bytes(self, owner: str) -> int:
        """Bytes of landmark JSON that ``owner``'s vocabularies hold."""
        with self._lock:
            return self._stored_bytes(owner)

    def _stored_bytes(self, owner: str) -> int:
        row = self._db.execute("SELECT COALESCE(SUM(LENGTH(CAST(e.frames AS BLOB))), 0) FROM vocab_examples e "
                               "JOIN vocabularies v ON v.vocab_id = e.vocab_id WHERE v.owner=?", (owner,)).fetchone()
        return int(row[0])

    def _check_bytes(self, owner: str, adding: int) -> None:
        """Under ``self._lock``: refuse what would take ``owner`` past ``max_bytes``."""
        used = self._stored_bytes(owner)
        if used + adding > self.max_bytes:
            raise too_many_bytes(used, adding, self.max_bytes)

    def examples(self, owner: str, vocab_id: str) -> builtins.list[ExampleJSON]:
        self.get(owner, vocab_id)
        with self._lock:
            rows = self._db.execute("SELECT example_id, gloss, n_frames, created FROM vocab_examples "
                                    "WHERE vocab_id=? ORDER BY created", (vocab_id,)).fetchall()
        return [{"example_id": r[0], "gloss": r[1], "frames": r[2], "created": round(r[3], 3)} for r in rows]

    def delete_example(self, owner: str, vocab_id: str, example_id: str) -> None:
        self.get(owner, vocab_id)
        with self._lock, self._db:
            cur = self._db.execute("DELETE FROM vocab_examples WHERE example_id=? AND vocab_id=?",
                                   (example_id, vocab_id))
        if cur.rowcount == 0:
            raise NotFound(f"no example {example_id} in vocabulary {vocab_id}")
        self._changed(vocab_id)

    def _examples(self, vocab_id: str, kind: str) -> builtins.list[Example]:
        """The vocabulary's examples as features, in the order taught: read from their stored features, never by
        parsing their landmark JSON again (a row from before features were kept is parsed once and filled in)."""
        with self._lock:
            rows = self._db.execute("SELECT example_id, gloss, features FROM vocab_examples WHERE vocab_id=? "
                                    "ORDER BY created", (vocab_id,)).fetchall()
        return [Example(gloss, unblob(self._features(eid, kind, data))) for eid, gloss, data in rows]

    def _features(self, example_id: str, kind: str, data: bytes | None) -> bytes:
        """An example's stored features; for a row from before they were kept, computed from its JSON and kept."""
        if data is not None:
            return data
        with self._lock:
            (text,) = self._db.execute("SELECT frames FROM vocab_examples WHERE example_id=?",
                                       (example_id,)).fetchone()
        data = blob(text_features(text, kind))
        with self._lock, self._db:
            self._db.execute("UPDATE vocab_examples SET features=? WHERE example_id=?", (data, example_id))
        return data

    # ---- export / import ---------------------------------------------------------------------------------------
    def export(self, owner: str, vocab_id: str) -> JSONObject:
        """The export document (the SDK's local mode; the REST route sends ``export_json``'s bytes)."""
        return export_doc(self.export_json(owner, vocab_id))

    def export_json(self, owner: str, vocab_id: str) -> bytes:
        """The export document as JSON bytes, spliced from the stored frames' text (``vocab_model.export_bytes``)."""
        vocab = self.get(owner, vocab_id)
        with self._lock:
            rows = self._db.execute("SELECT gloss, frames FROM vocab_examples WHERE vocab_id=? ORDER BY created",
                                    (vocab_id,)).fetchall()
        return export_bytes(vocab, rows)

    def import_(self, owner: str, doc: object, name: str | None = None) -> Vocabulary:
        """A new vocabulary for ``owner`` from an export document; every example is checked before anything is
        written (a bad one refuses the whole import). A key with no room for another vocabulary is refused first,
        before any example is checked (``create`` checks again, under the lock, when it writes)."""
        with self._lock:
            self._check_room(owner)
        parsed = parse_import(doc, self.max_examples)
        size = parsed.size
        with self._lock:
            self._check_bytes(owner, size)
        vocab = self.create(owner, name or parsed.name, parsed.kind, parsed.lang)
        try:
            self._insert(owner, vocab.vocab_id, parsed.examples, size)
        except Exception:  # another write of this key came in between (QuotaExceeded), or the write failed
            self.delete(owner, vocab.vocab_id)
            raise
        self._changed(vocab.vocab_id)
        return self.get(owner, vocab.vocab_id)

    def _insert(self, owner: str, vocab_id: str, examples: builtins.list[tuple[str, str, int, bytes]],
                size: int) -> None:
        now = time.time()
        with self._lock, self._db:
            self._check_bytes(owner, size)
            self._db.executemany("INSERT INTO vocab_examples (example_id, vocab_id, gloss, frames, n_frames, "
                                 "created, features) VALUES (?,?,?,?,?,?,?)",
                                 [(new_example_id(), vocab_id, g, t, n, now + i * 1e-6, f)
                                  for i, (g, t, n, f) in enumerate(examples)])

    # ---- moving vocabularies between stores (vocab_copy.py) -----------------------------------------------------
    def owners(self) -> builtins.list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT owner FROM vocabularies ORDER BY owner")]

    def stored_examples(self, owner: str, vocab_id: str) -> Iterator[StoredExample]:
        vocab = self.get(owner, vocab_id)
        with self._lock:
            ids = [r[0] for r in self._db.execute("SELECT example_id FROM vocab_examples WHERE vocab_id=? "
                                                  "ORDER BY created", (vocab_id,))]
        for i in range(0, len(ids), BATCH):
            part = ids[i:i + BATCH]
            with self._lock:
                rows = self._db.execute("SELECT example_id, gloss, frames, n_frames, created, features FROM "
                                        f"vocab_examples WHERE example_id IN ({','.join('?' * len(part))}) "
                                        "ORDER BY created", part).fetchall()
            for eid, gloss, text, n, created, data in rows:
                yield StoredExample(eid, gloss, text, n, created, self._features(eid, vocab.kind, data))

    def restore(self, owner: str, vocab: Vocabulary, examples: Iterable[StoredExample]) -> bool:
        written = False
        with self._lock, self._db:
            cur = self._db.execute("INSERT OR IGNORE INTO vocabularies VALUES (?,?,?,?,?,?)",
                                   (vocab.vocab_id, owner, vocab.name, vocab.kind, vocab.lang, vocab.created))
            written = cur.rowcount > 0
        for e in examples:
            with self._lock, self._db:
                cur = self._db.execute("INSERT OR IGNORE INTO vocab_examples (example_id, vocab_id, gloss, frames, "
                                       "n_frames, created, features) VALUES (?,?,?,?,?,?,?)",
                                       (e.example_id, vocab.vocab_id, e.gloss, e.frames, e.n_frames, e.created,
                                        e.features))
                written = written or cur.rowcount > 0
        if written:
            self._changed(vocab.vocab_id)
        return written

    # ---- recognition -------------------------------------------------------------------------------------------
    def recogniser(self, owner: str, vocab_id: str) -> Recogniser:
        """The recogniser of ``owner``'s vocabulary (built once per version of it)."""
        vocab = self.get(owner, vocab_id)
        if vocab.examples == 0:
            raise untaught(vocab_id)
        with self._lock:
            version = self._version.get(vocab_id, 0)
            cached = self._cache.get(vocab_id)
        if cached is not None and cached[0] == version:
            with self._lock:
                if vocab_id in self._cache:
                    self._cache.move_to_end(vocab_id)
            return cached[1]
        rec = Recogniser(vocab.kind, self._examples(vocab_id, vocab.kind), self.policy)
        with self._lock:
            if self._version.get(vocab_id, 0) == version:  # not changed while it was built
                self._cache[vocab_id] = (version, rec)
                while len(self._cache) > MAX_CACHED:
                    self._cache.popitem(last=False)
        return rec

    def _changed(self, vocab_id: str) -> None:
        with self._lock:
            self._version[vocab_id] = self._version.get(vocab_id, 0) + 1
            self._cache.pop(vocab_id, None)

    def close(self) -> None:
        with self._lock:
            self._db.close()
