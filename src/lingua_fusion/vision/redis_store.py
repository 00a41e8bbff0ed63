"""Vocabularies on Redis (``state.redis_url``): every server sharing the Redis lists, teaches and recognises with
every key's vocabularies, whichever server made them. The ``VocabularyBackend`` of vocab_port.py.

Layout (``state/redis_keys.py``): a record hash per vocabulary (owner, name, kind, lang, created, bytes, version);
its examples in four parts keyed by example id (their order, a sorted set by time taught; their meta, landmark JSON
and features, one hash each) and a count per gloss; per owner, its vocabulary ids and the bytes they hold. Each
write and the limit it is checked against are one Lua step (``redis_scripts.py``): two gateways adding at once
cannot pass ``max_per_key``, ``max_examples`` or ``max_bytes`` together.

Recognisers are built here and kept per vocabulary with the version they were built from (``RecogniserCache``):
every recognition reads the version (one round trip) and rebuilds when another process has changed the vocabulary.

Calls time out in seconds (socket timeouts, no retries: the client retries a 503); a Redis that fails or cannot be
reached is ``StoreUnavailable`` (503 ``state_store_unavailable``, "the vocabulary store"). Blocking: callers run
this store on worker threads.
"""

from __future__ import annotations

import builtins  # the class below has a method named list: its annotations say builtins.list
import functools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import LinguaFusionError, NotFound, StoreUnavailable
from ..json_types import JSONObject
from ..redact import redact_url
from ..state import redis_keys as keys
from . import redis_scripts as lua
from .landmarks import LandmarkSeq
from .recogniser import Example, Recogniser, RecogniserPolicy
from .recogniser_cache import RecogniserCache
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
    too_many_bytes,
    too_many_examples,
    unblob,
    untaught,
)

T = TypeVar("T")
TIMEOUT_S = 3.0  # connect and each call: a stalled Redis fails a request in seconds, not the library's forever
MAX_CONNECTIONS = 64  # a call beyond waits for a free one, up to TIMEOUT_S
BATCH = 64  # examples read at once by stored_examples
UNLIMITED = str(2**53)  # restore checks no limit
STORE = "the vocabulary store"
RECORD = (b"owner", b"name", b"kind", b"lang", b"created", b"version")


def _text(value: object) -> str:
    """A Redis reply (bytes: the client decodes nothing, features are binary) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisVocabularyStore:
    def __init__(self, url: str, *, max_per_key: int = 20, max_examples: int = 500,
                 max_bytes: int = 256 * 1024 * 1024, policy: RecogniserPolicy | None = None,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.max_per_key = max_per_key
        self.max_examples = max_examples
        self.max_bytes = max_bytes
        self.policy = policy or RecogniserPolicy()
        self._url = redact_url(url)
        # nothing is sent yet: a server starts while Redis is down, and its vocabulary routes answer 503 meanwhile
        pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=timeout_s, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
        self._r = redis.Redis(connection_pool=pool)
        self._create = self._r.register_script(lua.CREATE_ONE)
        self._add = self._r.register_script(lua.ADD_EXAMPLE)
        self._import = self._r.register_script(lua.IMPORT)
        self._restore = self._r.register_script(lua.RESTORE_EXAMPLE)
        self._delete_example = self._r.register_script(lua.DELETE_EXAMPLE)
        self._delete = self._r.register_script(lua.DELETE)
        self._cache = RecogniserCache(MAX_CACHED)

    def _run(self, fn: Callable[[], T]) -> T:
        """``fn()``, Redis's failures raised as ``StoreUnavailable`` (the store's own errors pass as they are)."""
        try:
            return fn()
        except LinguaFusionError:
            raise
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"vocabularies: Redis at {self._url} failed: {exc}", store=STORE) from exc

    # ---- reads -------------------------------------------------------------------------------------------------
    def _records(self, vocab_ids: builtins.list[str]) -> builtins.list[tuple[str, Vocabulary, int] | None]:
        """Each vocabulary's (owner, record, version), None for one not there: one round trip for all."""
        def read() -> builtins.list[Any]:
            pipe = self._r.pipeline(transaction=True)
            for vid in vocab_ids:
                pipe.hmget(keys.vocab(vid), RECORD)
                pipe.zcard(keys.vocab_examples(vid))
                pipe.hlen(keys.vocab_glosses(vid))
            return pipe.execute()

        got = self._run(read) if vocab_ids else []
        out: builtins.list[tuple[str, Vocabulary, int] | None] = []
        for i, vid in enumerate(vocab_ids):
            fields, examples, glosses = got[3 * i:3 * i + 3]
            if fields[0] is None:
                out.append(None)
                continue
            owner, name, kind, lang, created, version = fields
            out.append((_text(owner), Vocabulary(vid, _text(name), _text(kind), _text(lang), float(created),
                                                 int(examples), int(glosses)), int(version)))
        return out

    def _record(self, owner: str, vocab_id: str) -> tuple[Vocabulary, int]:
        """``owner``'s vocabulary and its version; NotFound for another owner's, as for one not there."""
        (found,) = self._records([vocab_id])
        if found is None or found[0] != owner:
            raise not_found(vocab_id)
        return found[1], found[2]

    def get(self, owner: str, vocab_id: str) -> Vocabulary:
        return self._record(owner, vocab_id)[0]

    def list(self, owner: str) -> builtins.list[Vocabulary]:
        ids = [_text(v) for v in self._run(lambda: self._r.zrange(keys.vocabs_of_owner(owner), 0, -1))]
        return [found[1] for found in self._records(ids) if found is not None and found[0] == owner]

    def _owned(self, owner: str, vocab_id: str, *reads: Callable[[Any], object]) -> builtins.list[Any]:
        """``reads`` (each given the pipeline) in one MULTI with the record's owner; NotFound unless ``owner``'s."""
        def read() -> builtins.list[Any]:
            pipe = self._r.pipeline(transaction=True)
            pipe.hget(keys.vocab(vocab_id), "owner")
            for r in reads:
                r(pipe)
            return pipe.execute()

        got = self._run(read)
        if got[0] is None or _text(got[0]) != owner:
            raise not_found(vocab_id)
        return got[1:]

    def examples(self, owner: str, vocab_id: str) -> builtins.list[ExampleJSON]:
        ids, meta = self._owned(owner, vocab_id, lambda p: p.zrange(keys.vocab_examples(vocab_id), 0, -1),
                                lambda p: p.hgetall(keys.vocab_example_meta(vocab_id)))
        out: builtins.list[ExampleJSON] = []
        for eid in ids:
            m = json.loads(meta[eid])
            out.append({"example_id": _text(eid), "gloss": m["gloss"], "frames": m["frames"],
                        "created": round(m["created"], 3)})
        return out

    def stored_bytes(self, owner: str) -> int:
        """Bytes of landmark JSON that ``owner``'s vocabularies hold."""
        return int(self._run(lambda: self._r.get(keys.vocab_bytes_of_owner(owner))) or 0)

    # ---- writes ------------------------------------------------------------------------------------------------
    def create(self, owner: str, name: str, kind: str, lang: str = "en") -> Vocabulary:
        kind = check_kind(kind)
        name = clean_name(name, kind)
        vid, created = new_vocab_id(), time.time()
        made = self._run(lambda: self._create(keys=lua.vocab_keys(owner, vid),
                                              args=[owner, vid, name, kind, lang, repr(created), self.max_per_key]))
        if made == 0:
            raise no_room(self.max_per_key)
        return Vocabulary(vid, name, kind, lang, created)

    def delete(self, owner: str, vocab_id: str) -> None:
        done = self._run(lambda: self._delete(keys=lua.vocab_keys(owner, vocab_id), args=[owner, vocab_id]))
        self._cache.drop(vocab_id)
        if done == 0:
            raise not_found(vocab_id)

    def add_example(self, owner: str, vocab_id: str, gloss: str, seq: LandmarkSeq) -> AddedExample:
        vocab = self.get(owner, vocab_id)
        gloss = check_gloss(gloss)
        text, feats = prepare_example(seq, vocab.kind)
        eid, created = new_example_id(), time.time()
        meta = json.dumps({"gloss": gloss, "frames": len(seq), "created": created}, ensure_ascii=False)
        answer = self._run(lambda: self._add(
            keys=lua.vocab_keys(owner, vocab_id),
            args=[owner, self.max_examples, self.max_bytes, eid, gloss, meta, text, blob(feats), repr(created)]))
        status = _text(answer[0])
        if status == "not_found":
            raise not_found(vocab_id)
        if status == "max_examples":
            raise too_many_examples(self.max_examples)
        if status == "max_bytes":
            raise too_many_bytes(int(answer[1]), len(text.encode("utf-8")), self.max_bytes)
        self._cache.grow(vocab_id, int(answer[1]), Example(gloss, feats))
        return {"example_id": eid, "gloss": gloss, "frames": len(seq), "duration_s": round(seq.duration, 3)}

    def delete_example(self, owner: str, vocab_id: str, example_id: str) -> None:
        done = self._run(lambda: self._delete_example(keys=lua.vocab_keys(owner, vocab_id),
                                                      args=[owner, example_id]))
        if done == -1:
            raise not_found(vocab_id)
        if done == 0:
            raise NotFound(f"no example {example_id} in vocabulary {vocab_id}")

    # ---- export / import ---------------------------------------------------------------------------------------
    def export(self, owner: str, vocab_id: str) -> JSONObject:
        """The export document (the SDK's local mode; the REST route sends ``export_json``'s bytes)."""
        return export_doc(self.export_json(owner, vocab_id))

    def export_json(self, owner: str, vocab_id: str) -> bytes:
        """The export document as JSON bytes, spliced from the stored frames' text (``vocab_model.export_bytes``).
        The order, the glosses and the frames are read in one MULTI: one version of the vocabulary's examples."""
        vocab = self.get(owner, vocab_id)
        ids, meta, frames = self._owned(owner, vocab_id, lambda p: p.zrange(keys.vocab_examples(vocab_id), 0, -1),
                                        lambda p: p.hgetall(keys.vocab_example_meta(vocab_id)),
                                        lambda p: p.hgetall(keys.vocab_frames(vocab_id)))
        return export_bytes(vocab, ((json.loads(meta[e])["gloss"], _text(frames[e])) for e in ids))

    def import_(self, owner: str, doc: object, name: str | None = None) -> Vocabulary:
        """A new vocabulary for ``owner`` from an export document; every example is checked before anything is
        written (a bad one refuses the whole import), then the vocabulary and its examples are written in one step
        that checks the owner's room and bytes. A key with no room is refused before any example is checked."""
        if self._run(lambda: self._r.zcard(keys.vocabs_of_owner(owner))) >= self.max_per_key:
            raise no_room(self.max_per_key)
        parsed = parse_import(doc, self.max_examples)
        kind = parsed.kind
        vname = clean_name(name or parsed.name, kind)
        vid, now = new_vocab_id(), time.time()
        args: builtins.list[str | bytes | int] = [owner, vid, vname, kind, parsed.lang, repr(now), self.max_per_key,
                                                  self.max_bytes]
        for i, (gloss, text, n, feats) in enumerate(parsed.examples):
            created = now + i * 1e-6
            meta = json.dumps({"gloss": gloss, "frames": n, "created": created}, ensure_ascii=False)
            args += [new_example_id(), gloss, meta, text, feats, repr(created)]
        answer = self._run(lambda: self._import(keys=lua.vocab_keys(owner, vid), args=args))
        status = _text(answer[0])
        if status == "max_vocabularies":
            raise no_room(self.max_per_key)
        if status == "max_bytes":
            raise too_many_bytes(int(answer[1]), parsed.size, self.max_bytes)
        if status != "ok":
            raise LinguaFusionError(f"vocabularies: the import of {vid} answered {status}")
        return self.get(owner, vid)

    # ---- moving vocabularies between stores (vocab_copy.py) -----------------------------------------------------
    def owners(self) -> builtins.list[str]:
        return sorted(_text(o) for o in self._run(lambda: self._r.smembers(keys.vocab_owners())))

    def stored_examples(self, owner: str, vocab_id: str) -> Iterator[StoredExample]:
        (ids,) = self._owned(owner, vocab_id, lambda p: p.zrange(keys.vocab_examples(vocab_id), 0, -1))
        for i in range(0, len(ids), BATCH):
            part = ids[i:i + BATCH]

            def read(part: builtins.list[bytes] = part) -> builtins.list[Any]:
                pipe = self._r.pipeline(transaction=True)
                pipe.hmget(keys.vocab_example_meta(vocab_id), part)
                pipe.hmget(keys.vocab_frames(vocab_id), part)
                pipe.hmget(keys.vocab_features(vocab_id), part)
                return pipe.execute()

            metas, frames, feats = self._run(read)
            for eid, m, text, data in zip(part, metas, frames, feats, strict=True):
                if m is None:  # deleted since the order was read
                    continue
                meta = json.loads(m)
                yield StoredExample(_text(eid), meta["gloss"], _text(text), int(meta["frames"]),
                                    float(meta["created"]), bytes(data))

    def restore(self, owner: str, vocab: Vocabulary, examples: Iterable[StoredExample]) -> bool:
        vid = vocab.vocab_id
        made = self._run(lambda: self._create(keys=lua.vocab_keys(owner, vid), args=[
            owner, vid, vocab.name, vocab.kind, vocab.lang, repr(vocab.created), UNLIMITED]))
        if made == -1:
            raise LinguaFusionError(f"vocabulary {vid} is another owner's in this store: not restored for {owner}")
        written = made == 1
        for e in examples:
            meta = json.dumps({"gloss": e.gloss, "frames": e.n_frames, "created": e.created}, ensure_ascii=False)
            n = self._run(functools.partial(self._restore, keys=lua.vocab_keys(owner, vid), args=[
                e.example_id, e.gloss, meta, e.frames, e.features, repr(e.created)]))
            written = written or n == 1
        return written

    # ---- recognition -------------------------------------------------------------------------------------------
    def recogniser(self, owner: str, vocab_id: str) -> Recogniser:
        """The recogniser of ``owner``'s vocabulary, built once per version of it (whichever process changed it)."""
        vocab, version = self._record(owner, vocab_id)
        if vocab.examples == 0:
            raise untaught(vocab_id)
        kept = self._cache.get(vocab_id, version)
        if kept is not None:
            return kept
        version, examples = self._load(owner, vocab_id)
        if not examples:  # its examples were deleted since the record was read
            raise untaught(vocab_id)
        rec = Recogniser(vocab.kind, examples, self.policy)
        self._cache.put(vocab_id, version, rec)
        return rec

    def _load(self, owner: str, vocab_id: str) -> tuple[int, builtins.list[Example]]:
        """The vocabulary's examples as features, in the order taught, and the version they are (one MULTI)."""
        version, ids, meta, feats = self._owned(
            owner, vocab_id, lambda p: p.hget(keys.vocab(vocab_id), "version"),
            lambda p: p.zrange(keys.vocab_examples(vocab_id), 0, -1),
            lambda p: p.hgetall(keys.vocab_example_meta(vocab_id)), lambda p: p.hgetall(keys.vocab_features(vocab_id)))
        return int(version), [Example(json.loads(meta[e])["gloss"], unblob(feats[e])) for e in ids]

    def close(self) -> None:
        self._r.close()
