"""SQLite store for API keys (only a SHA-256 digest is kept) and glossaries: the embedded ``UserStore``
(state/users.py). Thread-safe, WAL journal; the workers of one host share the file."""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Collection
from pathlib import Path

from ..errors import BackendError, NotFound, QuotaExceeded
from ..glossary import Term
from .private import private_dir, private_file
from .sqlite_tx import write_transaction
from .users import SCOPES, ApiKey, GlossaryRecord, KeyRecord, check_key, glossary_quota_message, key_digest, new_key

__all__ = ["SCOPES", "ApiKey", "SQLiteStore"]


def _busy(exc: Exception) -> BackendError:
    return BackendError(f"the key store is locked by another process: {exc}")


class SQLiteStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = private_file(private_dir(state_dir) / "linguafusion.sqlite3")
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS api_keys (key_id TEXT PRIMARY KEY, digest TEXT UNIQUE, "
                             "name TEXT, scopes TEXT, created REAL, revoked INTEGER DEFAULT 0)")
            self._db.execute("CREATE TABLE IF NOT EXISTS glossaries (glossary_id TEXT PRIMARY KEY, owner TEXT, "
                             "name TEXT, source_lang TEXT, target_lang TEXT, terms TEXT, created REAL)")

    # ---- keys -----------------------------------------------------------------------------------------------
    def create_key(self, name: str = "", scopes: tuple[str, ...] = ("translate",)) -> tuple[str, ApiKey]:
        secret, key = new_key(name, scopes)
        with self._lock, self._db:
            self._db.execute("INSERT INTO api_keys VALUES (?,?,?,?,?,0)",
                             (key.key_id, key_digest(secret), name, ",".join(scopes), key.created))
        return secret, key

    def list_keys(self) -> list[ApiKey]:
        return [r.key for r in self.records()]

    def get_key(self, key_id: str) -> ApiKey | None:
        with self._lock:
            row = self._db.execute("SELECT key_id, name, scopes, created, revoked FROM api_keys WHERE key_id=?",
                                   (key_id,)).fetchone()
        return None if row is None else ApiKey(row[0], row[1], tuple(row[2].split(",")), row[3], bool(row[4]))

    def records(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._db.execute("SELECT key_id, name, scopes, created, revoked, digest FROM api_keys "
                                    "ORDER BY created").fetchall()
        return [KeyRecord(ApiKey(r[0], r[1], tuple(r[2].split(",")), r[3], bool(r[4])), r[5]) for r in rows]

    def import_key(self, record: KeyRecord) -> bool:
        k = record.key
        with self._lock, self._db:
            cur = self._db.execute("INSERT OR IGNORE INTO api_keys VALUES (?,?,?,?,?,?)",
                                   (k.key_id, record.digest, k.name, ",".join(k.scopes), k.created, int(k.revoked)))
            if cur.rowcount == 0 and k.revoked:  # revocation goes one way only
                self._db.execute("UPDATE api_keys SET revoked=1 WHERE key_id=?", (k.key_id,))
        return cur.rowcount == 1

    def revoke_key(self, key_id: str) -> None:
        with self._lock, self._db:
            cur = self._db.execute("UPDATE api_keys SET revoked=1 WHERE key_id=?", (key_id,))
        if cur.rowcount == 0:
            raise NotFound(f"no key {key_id}")

    def revoked_among(self, key_ids: Collection[str]) -> set[str]:
        """Which of ``key_ids`` are revoked (one query per 500 ids; an id the store does not hold is not revoked)."""
        ids, out = sorted(key_ids), set[str]()
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            with self._lock:
                rows = self._db.execute("SELECT key_id FROM api_keys WHERE revoked=1 AND key_id IN "
                                        f"({','.join('?' * len(part))})", part).fetchall()
            out.update(r[0] for r in rows)
        return out

    def authenticate(self, secret: str | None, scope: str = "translate") -> ApiKey:
        row = None
        if secret:
            with self._lock:
                row = self._db.execute("SELECT key_id, name, scopes, created, revoked FROM api_keys WHERE digest=?",
                                       (key_digest(secret),)).fetchone()
        key = None if row is None else ApiKey(row[0], row[1], tuple(row[2].split(",")), row[3], bool(row[4]))
        return check_key(secret, key, scope, "this server's key store does not hold it (keys belong to one state "
                         "directory: create them with `linguafusion keys create --state-dir DIR`, DIR being the one "
                         "the server's banner names)")

    # ---- glossaries -----------------------------------------------------------------------------------------
    def put_glossary(self, owner: str, name: str, terms: list[Term], source_lang: str | None,
                     target_lang: str | None, *, limit: int | None = None) -> str:
        gid = "gl_" + secrets.token_hex(6)
        self._insert_glossary(GlossaryRecord(gid, owner, name, source_lang, target_lang, tuple(terms), time.time()),
                              limit)
        return gid

    def _insert_glossary(self, g: GlossaryRecord, limit: int | None, *, replace: bool = True) -> bool:
        payload = json.dumps([[t.source, t.target] for t in g.terms], ensure_ascii=False)
        # one write transaction for the count and the insert: another worker of the host cannot add between
        with self._lock, write_transaction(self._db, _busy):
            if limit is not None:
                n = self._db.execute("SELECT COUNT(*) FROM glossaries WHERE owner=?", (g.owner,)).fetchone()[0]
                if int(n) >= limit:
                    raise QuotaExceeded(glossary_quota_message(limit), details={"limit": "max_glossaries_per_key"})
            cur = self._db.execute(f"INSERT {'' if replace else 'OR IGNORE '}INTO glossaries VALUES (?,?,?,?,?,?,?)",
                                   (g.glossary_id, g.owner, g.name, g.source_lang, g.target_lang, payload, g.created))
        return cur.rowcount == 1

    def glossary_records(self) -> list[GlossaryRecord]:
        with self._lock:
            rows = self._db.execute("SELECT glossary_id, owner, name, source_lang, target_lang, terms, created "
                                    "FROM glossaries ORDER BY created").fetchall()
        return [GlossaryRecord(r[0], r[1], r[2], r[3], r[4], tuple(Term(s, t) for s, t in json.loads(r[5])), r[6])
                for r in rows]

    def import_glossary(self, record: GlossaryRecord) -> bool:
        return self._insert_glossary(record, None, replace=False)

    def get_glossary(self, owner: str, glossary_id: str) -> tuple[dict[str, str | None], list[Term]]:
        with self._lock:
            row = self._db.execute("SELECT name, source_lang, target_lang, terms FROM glossaries "
                                   "WHERE glossary_id=? AND owner=?", (glossary_id, owner)).fetchone()
        if row is None:
            raise NotFound(f"no glossary {glossary_id} for this key")
        meta = {"glossary_id": glossary_id, "name": row[0], "source_lang": row[1], "target_lang": row[2]}
        return meta, [Term(s, t) for s, t in json.loads(row[3])]

    def count_glossaries(self, owner: str) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM glossaries WHERE owner=?", (owner,)).fetchone()[0])

    def delete_glossary(self, owner: str, glossary_id: str) -> None:
        with self._lock, self._db:
            cur = self._db.execute("DELETE FROM glossaries WHERE glossary_id=? AND owner=?", (glossary_id, owner))
        if cur.rowcount == 0:
            raise NotFound(f"no glossary {glossary_id} for this key")

    def latest_glossary(self, owner: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT glossary_id FROM glossaries WHERE owner=? ORDER BY created DESC LIMIT 1",
                                   (owner,)).fetchone()
        return row[0] if row else None

    def list_glossaries(self, owner: str) -> list[dict[str, object]]:
        with self._lock:
            rows = self._db.execute("SELECT glossary_id, name, source_lang, target_lang, terms FROM glossaries "
                                    "WHERE owner=? ORDER BY created", (owner,)).fetchall()
        return [{"glossary_id": r[0], "name": r[1], "source_lang": r[2], "target_lang": r[3],
                 "terms": len(json.loads(r[4]))} for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
