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
"""

from __future__ import annotations

import builtins  # the class below has a method named list: its annotations say builtins.list
import json
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidParameter, NotFound, QuotaExceeded
from ..state.private import private_dir, private_file
from ..state.sqlite_tx import add_column
from . import bigjson
from .landmarks import LandmarkSeq
from .normalise import KINDS, LENGTH, features
from .recogniser import Example, Recogniser, RecogniserPolicy

EXPORT_FORMAT = "linguafusion-vocabulary/1"
MAX_GLOSS = 64
MAX_NAME = 100
MAX_CACHED = 64  # recognisers kept built (a large vocabulary's is a few MB)


@dataclass(frozen=True)
class Vocabulary:
    vocab_id: str
    name: str
    kind: str
    lang: str
    created: float
    examples: int = 0
    glosses: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"vocabulary_id": self.vocab_id, "name": self.name, "kind": self.kind, "lang": self.lang,
                "created": round(self.created, 3), "examples": self.examples, "glosses": self.glosses}


def check_gloss(gloss: Any) -> str:
    if not isinstance(gloss, str) or not gloss.strip():
        raise InvalidParameter("'gloss' must be a non-empty string (the sign's or word's label)",
                               details={"field": "gloss"})
    g = " ".join(gloss.split())
    if len(g) > MAX_GLOSS or not g.isprintable() or g.lower() == "unknown":
        raise InvalidParameter(f"'gloss' must be printable, at most {MAX_GLOSS} characters, and not 'unknown'",
                               details={"field": "gloss"})
    return g


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise InvalidParameter(f"'kind' must be one of {list(KINDS)}", details={"field": "kind"})
    return str(kind)


def _blob(feats: np.ndarray) -> bytes:
    """An example's features as stored: float32 bytes, LENGTH rows."""
    return np.ascontiguousarray(feats, dtype=np.float32).tobytes()


def _frames_text(seq: LandmarkSeq) -> str:
    """A sequence's JSON form as stored: written frame by frame (``bigjson``)."""
    return "[" + ",".join(bigjson.dumps(frame).decode("utf-8") for frame in seq.iter_json()) + "]"


class VocabularyStore:
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
        name = " ".join(str(name or kind).split())[:MAX_NAME] or kind
        vid = "vo_" + secrets.token_hex(6)
        with self._lock, self._db:
            self._check_room(owner)
            created = time.time()
            self._db.execute("INSERT INTO vocabularies VALUES (?,?,?,?,?,?)", (vid, owner, name, kind, lang, created))
        return Vocabulary(vid, name, kind, lang, created)

    def _check_room(self, owner: str) -> None:
        """QuotaExceeded when ``owner`` keeps as many vocabularies as it may."""
        count = self._db.execute("SELECT COUNT(*) FROM vocabularies WHERE owner=?", (owner,)).fetchone()[0]
        if count >= self.max_per_key:
            raise QuotaExceeded(f"this key has {self.max_per_key} vocabularies, the most it may keep; delete one "
                                "first (DELETE /v1/vocabularies/{id})", details={"limit": "max_vocabularies_per_key"})

    def get(self, owner: str, vocab_id: str) -> Vocabulary:
        with self._lock:
            row = self._db.execute(
                "SELECT v.vocab_id, v.name, v.kind, v.lang, v.created, COUNT(e.example_id), COUNT(DISTINCT e.gloss) "
                "FROM vocabularies v LEFT JOIN vocab_examples e ON e.vocab_id = v.vocab_id "
                "WHERE v.vocab_id=? AND v.owner=? GROUP BY v.vocab_id", (vocab_id, owner)).fetchone()
        if row is None:
            raise NotFound(f"no vocabulary {vocab_id} for this key", details={"vocabulary_id": vocab_id})
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
                raise NotFound(f"no vocabulary {vocab_id} for this key", details={"vocabulary_id": vocab_id})
            self._db.execute("DELETE FROM vocab_examples WHERE vocab_id=?", (vocab_id,))
        self._changed(vocab_id)

    # ---- examples ----------------------------------------------------------------------------------------------
    def add_example(self, owner: str, vocab_id: str, gloss: str, seq: LandmarkSeq) -> dict[str, Any]:
        vocab = self.get(owner, vocab_id)
        gloss = check_gloss(gloss)
        features(seq, vocab.kind)  # refuses a sequence this kind cannot use (no hands in a sign, no lips)
        if vocab.examples >= self.max_examples:
            raise QuotaExceeded(f"a vocabulary holds at most {self.max_examples} examples",
                                details={"limit": "max_examples_per_vocabulary"})
        eid = "ex_" + secrets.token_hex(6)
        text = _frames_text(seq)
        # the features of what is stored (its JSON rounds coordinates), as an export imported elsewhere computes them
        feats = features(LandmarkSeq.from_json(bigjson.loads(text.encode("utf-8"))), vocab.kind)
        with self._lock, self._db:
            self._check_bytes(owner, len(text.encode("utf-8")))
            self._db.execute("INSERT INTO vocab_examples (example_id, vocab_id, gloss, frames, n_frames, created, "
                             "features) VALUES (?,?,?,?,?,?,?)",
                             (eid, vocab_id, gloss, text, len(seq), time.time(), _blob(feats)))
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
            raise QuotaExceeded(f"this key's vocabularies hold {used} bytes of landmarks and may hold at most "
                                f"{self.max_bytes}; this would add {adding}: delete examples or vocabularies first",
                                details={"limit": "max_vocabulary_bytes_per_key", "used": used, "adding": adding,
                                         "max": self.max_bytes})

    def examples(self, owner: str, vocab_id: str) -> builtins.list[dict[str, Any]]:
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
        out, filled = [], []
        for eid, gloss, blob in rows:
            if blob is None:
                with self._lock:
                    (text,) = self._db.execute("SELECT frames FROM vocab_examples WHERE example_id=?",
                                               (eid,)).fetchone()
                feats = features(LandmarkSeq.from_json(bigjson.loads(text.encode("utf-8"))), kind)
                filled.append((_blob(feats), eid))
            else:
                feats = np.frombuffer(blob, dtype=np.float32).reshape(LENGTH, -1)
            out.append(Example(gloss, feats))
        if filled:
            with self._lock, self._db:
                self._db.executemany("UPDATE vocab_examples SET features=? WHERE example_id=?", filled)
        return out

    # ---- export / import ---------------------------------------------------------------------------------------
    def export(self, owner: str, vocab_id: str) -> dict[str, Any]:
        """The export document (the SDK's local mode; the REST route sends ``export_json``'s bytes)."""
        doc: dict[str, Any] = json.loads(self.export_json(owner, vocab_id))  # plain lists: callers write it as JSON
        return doc

    def export_json(self, owner: str, vocab_id: str) -> bytes:
        """The export document as JSON bytes, spliced from the stored frames' text (which ``add_example`` and
        ``import_`` wrote from a checked ``LandmarkSeq``): nothing is parsed again."""
        vocab = self.get(owner, vocab_id)
        with self._lock:
            rows = self._db.execute("SELECT gloss, frames FROM vocab_examples WHERE vocab_id=? ORDER BY created",
                                    (vocab_id,)).fetchall()
        head = json.dumps({"format": EXPORT_FORMAT, "name": vocab.name, "kind": vocab.kind, "lang": vocab.lang},
                          ensure_ascii=False)
        examples = ",".join('{"gloss":' + json.dumps(g, ensure_ascii=False) + ',"frames":' + f + "}" for g, f in rows)
        return (head[:-1] + ',"examples":[' + examples + "]}").encode("utf-8")

    def import_(self, owner: str, doc: Any, name: str | None = None) -> Vocabulary:
        """A new vocabulary for ``owner`` from an export document; every example is checked before anything is
        written (a bad one refuses the whole import). A key with no room for another vocabulary is refused first,
        before any example is checked (``create`` checks again, under the lock, when it writes)."""
        with self._lock:
            self._check_room(owner)
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise InvalidParameter(f"not a vocabulary export: 'format' must be {EXPORT_FORMAT!r}",
                                   details={"field": "format"})
        kind = check_kind(doc.get("kind"))
        items = doc.get("examples")
        if not isinstance(items, list):
            raise InvalidParameter("'examples' must be a list of {gloss, frames}", details={"field": "examples"})
        if len(items) > self.max_examples:
            raise QuotaExceeded(f"a vocabulary holds at most {self.max_examples} examples",
                                details={"limit": "max_examples_per_vocabulary"})
        parsed, feats = [], []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidParameter(f"examples[{i}] is not an object", details={"field": f"examples[{i}]"})
            seq = LandmarkSeq.from_json(item.get("frames"))
            feats.append(_blob(features(seq, kind)))
            parsed.append((check_gloss(item.get("gloss")), seq))
        for field in ("name", "lang"):
            if doc.get(field) is not None and not isinstance(doc.get(field), str):
                raise InvalidParameter(f"'{field}' must be a string", details={"field": field})
        from .. import langs

        lang = langs.normalize(doc.get("lang") or "en", field="lang")
        texts = [_frames_text(s) for _g, s in parsed]
        size = sum(len(t.encode("utf-8")) for t in texts)
        with self._lock:
            self._check_bytes(owner, size)
        vocab = self.create(owner, name or str(doc.get("name") or kind), kind, lang)
        try:
            self._insert(owner, vocab.vocab_id, parsed, texts, feats, size)
        except QuotaExceeded:  # another write of this key came in between
            self.delete(owner, vocab.vocab_id)
            raise
        self._changed(vocab.vocab_id)
        return self.get(owner, vocab.vocab_id)

    def _insert(self, owner: str, vocab_id: str, parsed: builtins.list[tuple[str, LandmarkSeq]],
                texts: builtins.list[str], feats: builtins.list[bytes], size: int) -> None:
        now = time.time()
        with self._lock, self._db:
            self._check_bytes(owner, size)
            self._db.executemany("INSERT INTO vocab_examples (example_id, vocab_id, gloss, frames, n_frames, "
                                 "created, features) VALUES (?,?,?,?,?,?,?)",
                                 [("ex_" + secrets.token_hex(6), vocab_id, g, t, len(s), now + i * 1e-6, f)
                                  for i, ((g, s), t, f) in enumerate(zip(parsed, texts, feats, strict=True))])

    # ---- recognition -------------------------------------------------------------------------------------------
    def recogniser(self, owner: str, vocab_id: str) -> Recogniser:
        """The recogniser of ``owner``'s vocabulary (built once per version of it)."""
        vocab = self.get(owner, vocab_id)
        if vocab.examples == 0:
            raise InvalidParameter(f"vocabulary {vocab_id} has no examples yet: teach it first "
                                   "(POST /v1/vocabularies/{id}/examples)", details={"vocabulary_id": vocab_id})
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
