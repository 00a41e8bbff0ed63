"""The ``UserStore`` (state/users.py) on Redis: API keys and glossaries shared by every server on one Redis.

Layout (names in redis_keys.py): a key's record is a hash found by its digest, so authenticating a request is one
round trip and a revocation written by any gateway is what the next request anywhere reads (no cache to expire).
A glossary is one JSON string plus its owner's sorted set (by upload time: the latest is the default one). The
writes that a check guards run as one Lua script (``ADD_GLOSSARY``: the owner's count and the add), so two
gateways cannot both add a key's last glossary; the others are single commands or idempotent.

Redis unreachable, slow past ``timeout_s`` or failing: ``BackendError`` (503 ``backend_unavailable``), never a 500;
the caller's request fails and the next one tries again (the client reconnects by itself).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Collection
from typing import TypeVar

import redis
from redis.typing import EncodableT

from ..errors import NotFound, QuotaExceeded
from ..glossary import Term
from ..redact import redact_url
from . import redis_keys as rk
from .redis_call import call
from .users import ApiKey, GlossaryRecord, KeyRecord, check_key, glossary_quota_message, key_digest, new_key

log = logging.getLogger("lingua_fusion.state")
T = TypeVar("T")

# KEYS: the owner's set, the glossary, the owners' set; ARGV: limit (-1: none), id, created, JSON, owner.
# 1 added, 0 over the limit, -1 the id is held already
ADD_GLOSSARY = """
local limit = tonumber(ARGV[1])
if limit >= 0 and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
if redis.call('SET', KEYS[2], ARGV[4], 'NX') == false then return -1 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[5])
return 1
"""
# KEYS: the owner's set, the glossary; ARGV: id. 1 deleted, 0 not the owner's (or gone)
DELETE_GLOSSARY = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""
UNKNOWN = ("the key store (Redis, state.redis_url) does not hold it: create keys with `linguafusion keys create` "
           "under the same LINGUAFUSION_STATE__REDIS_URL, or move a state directory's keys there with "
           "`linguafusion state migrate --to redis URL`")


def _text(value: object) -> str | None:
    """A reply as text (the client decodes: redis-py's annotations also allow bytes)."""
    return None if value is None else value.decode() if isinstance(value, bytes) else str(value)


def _texts(values: object) -> list[str | None]:
    return [_text(v) for v in values] if isinstance(values, list | tuple | set) else []


def _hash(value: object) -> dict[str, str]:
    return {str(_text(k)): str(_text(v)) for k, v in value.items()} if isinstance(value, dict) else {}


def _key(fields: dict[str, str]) -> ApiKey:
    return ApiKey(fields["key_id"], fields.get("name", ""), tuple(fields.get("scopes", "").split(",")),
                  float(fields.get("created", 0.0)), fields.get("revoked") == "1")


def _fields(key: ApiKey) -> dict[str, str]:
    return {"key_id": key.key_id, "name": key.name, "scopes": ",".join(key.scopes), "created": repr(key.created),
            "revoked": "1" if key.revoked else "0"}


def _glossary_json(g: GlossaryRecord) -> str:
    return json.dumps({"owner": g.owner, "name": g.name, "source_lang": g.source_lang, "target_lang": g.target_lang,
                       "terms": [[t.source, t.target] for t in g.terms], "created": g.created}, ensure_ascii=False)


def _glossary(gid: str, raw: str) -> GlossaryRecord:
    d = json.loads(raw)
    return GlossaryRecord(gid, d["owner"], d["name"], d["source_lang"], d["target_lang"],
                          tuple(Term(s, t) for s, t in d["terms"]), float(d["created"]))


class RedisUserStore:
    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                       decode_responses=True)
        self._url = redact_url(url)
        self._add = self._r.register_script(ADD_GLOSSARY)
        self._delete = self._r.register_script(DELETE_GLOSSARY)

    def _run(self, fn: Callable[[], T]) -> T:
        return call(fn, f"the key store (Redis at {self._url})")

    # ---- keys -------------------------------------------------------------------------------------------------
    def create_key(self, name: str = "", scopes: tuple[str, ...] = ("translate",)) -> tuple[str, ApiKey]:
        secret, key = new_key(name, scopes)
        self._write_key(KeyRecord(key, key_digest(secret)))
        return secret, key

    def _write_key(self, record: KeyRecord) -> None:
        def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            fields: dict[EncodableT, EncodableT] = {k: v for k, v in _fields(record.key).items()}
            pipe.hset(rk.api_key(record.digest), mapping=fields)
            pipe.set(rk.api_key_id(record.key.key_id), record.digest)
            pipe.zadd(rk.api_keys(), {record.key.key_id: record.key.created})
            pipe.execute()

        self._run(run)

    def records(self) -> list[KeyRecord]:
        def run() -> list[KeyRecord]:
            ids = [i for i in _texts(self._r.zrange(rk.api_keys(), 0, -1)) if i]
            digests = _texts(self._r.mget([rk.api_key_id(i) for i in ids])) if ids else []
            pipe = self._r.pipeline(transaction=False)
            held = [d for d in digests if d]
            for d in held:
                pipe.hgetall(rk.api_key(d))
            return [KeyRecord(_key(_hash(f)), d) for d, f in zip(held, pipe.execute(), strict=True) if f]

        return self._run(run)

    def list_keys(self) -> list[ApiKey]:
        return [r.key for r in self.records()]

    def get_key(self, key_id: str) -> ApiKey | None:
        def run() -> ApiKey | None:
            digest = _text(self._r.get(rk.api_key_id(key_id)))
            fields = _hash(self._r.hgetall(rk.api_key(digest))) if digest else {}
            return _key(fields) if fields else None

        return self._run(run)

    def revoke_key(self, key_id: str) -> None:
        def run() -> bool:
            digest = _text(self._r.get(rk.api_key_id(key_id)))
            if not digest:
                return False
            self._r.hset(rk.api_key(digest), "revoked", "1")  # idempotent: a key's digest never changes
            return True

        if not self._run(run):
            raise NotFound(f"no key {key_id}")

    def revoked_among(self, key_ids: Collection[str]) -> set[str]:
        ids = sorted(key_ids)
        if not ids:
            return set()

        def run() -> set[str]:
            digests = _texts(self._r.mget([rk.api_key_id(i) for i in ids]))
            pipe = self._r.pipeline(transaction=False)
            held = [(i, d) for i, d in zip(ids, digests, strict=True) if d]
            for _, d in held:
                pipe.hget(rk.api_key(d), "revoked")
            return {i for (i, _), r in zip(held, pipe.execute(), strict=True) if _text(r) == "1"}

        return self._run(run)

    def authenticate(self, secret: str | None, scope: str = "translate") -> ApiKey:
        fields = _hash(self._run(lambda: self._r.hgetall(rk.api_key(key_digest(secret))))) if secret else {}
        return check_key(secret, _key(fields) if fields else None, scope, UNKNOWN)

    def import_key(self, record: KeyRecord) -> bool:
        if self._run(lambda: self._r.exists(rk.api_key_id(record.key.key_id))):
            if record.key.revoked:  # revoked at the source since an earlier copy: revocation goes one way only
                self.revoke_key(record.key.key_id)
            return False
        self._write_key(record)
        return True

    # ---- glossaries -------------------------------------------------------------------------------------------
    def put_glossary(self, owner: str, name: str, terms: list[Term], source_lang: str | None,
                     target_lang: str | None, *, limit: int | None = None) -> str:
        g = GlossaryRecord("gl_" + secrets.token_hex(6), owner, name, source_lang, target_lang, tuple(terms),
                           time.time())
        if self._insert(g, limit) == 0:
            raise QuotaExceeded(glossary_quota_message(limit or 0), details={"limit": "max_glossaries_per_key"})
        return g.glossary_id

    def _insert(self, g: GlossaryRecord, limit: int | None) -> int:
        keys = [rk.glossaries_of_owner(g.owner), rk.glossary(g.glossary_id), rk.glossary_owners()]
        args: list[str | int] = [-1 if limit is None else limit, g.glossary_id, repr(g.created), _glossary_json(g),
                                 g.owner]
        return int(self._run(lambda: self._add(keys=keys, args=args)))

    def get_glossary(self, owner: str, glossary_id: str) -> tuple[dict[str, str | None], list[Term]]:
        raw = _text(self._run(lambda: self._r.get(rk.glossary(glossary_id))))
        g = _glossary(glossary_id, raw) if raw else None
        if g is None or g.owner != owner:
            raise NotFound(f"no glossary {glossary_id} for this key")
        return g.meta(), list(g.terms)

    def count_glossaries(self, owner: str) -> int:
        return int(self._run(lambda: self._r.zcard(rk.glossaries_of_owner(owner))))

    def delete_glossary(self, owner: str, glossary_id: str) -> None:
        keys = [rk.glossaries_of_owner(owner), rk.glossary(glossary_id)]
        if not self._run(lambda: self._delete(keys=keys, args=[glossary_id])):
            raise NotFound(f"no glossary {glossary_id} for this key")

    def latest_glossary(self, owner: str) -> str | None:
        ids = _texts(self._run(lambda: self._r.zrevrange(rk.glossaries_of_owner(owner), 0, 0)))
        return ids[0] if ids else None

    def _of_owner(self, owner: str) -> list[GlossaryRecord]:
        def run() -> list[GlossaryRecord]:
            ids = [i for i in _texts(self._r.zrange(rk.glossaries_of_owner(owner), 0, -1)) if i]
            raws = _texts(self._r.mget([rk.glossary(i) for i in ids])) if ids else []
            return [_glossary(i, raw) for i, raw in zip(ids, raws, strict=True) if raw]

        return self._run(run)

    def list_glossaries(self, owner: str) -> list[dict[str, object]]:
        return [g.summary() for g in self._of_owner(owner)]

    def glossary_records(self) -> list[GlossaryRecord]:
        owners = sorted(o for o in _texts(self._run(lambda: self._r.smembers(rk.glossary_owners()))) if o)
        return sorted((g for o in owners for g in self._of_owner(o)), key=lambda g: g.created)

    def import_glossary(self, record: GlossaryRecord) -> bool:
        return self._insert(record, None) == 1

    def close(self) -> None:
        self._r.close()
