"""SQLite store for API keys (only a SHA-256 digest is kept) and glossaries. Thread-safe, WAL journal."""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuthenticationError, NotFound, PermissionDenied
from ..glossary import Term
from .private import private_dir, private_file

SCOPES = ("translate", "admin")


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    scopes: tuple[str, ...]
    created: float
    revoked: bool


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


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
        key_id = "key_" + secrets.token_hex(6)
        secret = "sk_" + secrets.token_urlsafe(32)
        key = ApiKey(key_id, name, tuple(scopes), time.time(), False)
        with self._lock, self._db:
            self._db.execute("INSERT INTO api_keys VALUES (?,?,?,?,?,0)",
                             (key_id, _digest(secret), name, ",".join(scopes), key.created))
        return secret, key

    def list_keys(self) -> list[ApiKey]:
        with self._lock:
            rows = self._db.execute("SELECT key_id, name, scopes, created, revoked FROM api_keys ORDER BY created")
            return [ApiKey(r[0], r[1], tuple(r[2].split(",")), r[3], bool(r[4])) for r in rows.fetchall()]

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
        if not secret:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer sk_...'")
        with self._lock:
            row = self._db.execute("SELECT key_id, name, scopes, created, revoked FROM api_keys WHERE digest=?",
                                   (_digest(secret),)).fetchone()
        if row is None:
            raise AuthenticationError("invalid API key: this server's key store does not hold it (keys belong to "
                                      "one state directory: create them with `linguafusion keys create --state-dir "
                                      "DIR`, DIR being the one the server's banner names)")
        key = ApiKey(row[0], row[1], tuple(row[2].split(",")), row[3], bool(row[4]))
        if key.revoked:
            raise AuthenticationError("this API key has been revoked")
        if scope not in key.scopes and "admin" not in key.scopes:
            raise PermissionDenied(f"this API key lacks the '{scope}' scope")
        return key

    # ---- glossaries -----------------------------------------------------------------------------------------
    def put_glossary(self, owner: str, name: str, terms: list[Term], source_lang: str | None,
                     target_lang: str | None) -> str:
        gid = "gl_" + secrets.token_hex(6)
        payload = json.dumps([[t.source, t.target] for t in terms], ensure_ascii=False)
        with self._lock, self._db:
            self._db.execute("INSERT INTO glossaries VALUES (?,?,?,?,?,?,?)",
                             (gid, owner, name, source_lang, target_lang, payload, time.time()))
        return gid

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
