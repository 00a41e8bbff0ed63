"""What users create: API keys and glossaries, behind one contract with two stores.

``SQLiteStore`` (state/sqlite.py) is the embedded default: one file in the state directory, shared by the workers of
one host. ``RedisUserStore`` (state/redis_users.py) is chosen when ``state.redis_url`` is set: every server and
gateway on that Redis sees the same keys and glossaries, whatever its state directory (docs/cluster.md). Both keep
only a SHA-256 digest of a key, never the key.

Every method blocks (a file or a network round trip): the server calls them through ``Offload``
(state/offload.py), never on its event loop. ``records`` / ``glossary_records`` / ``import_*`` exist for
``linguafusion state migrate`` (cli/state.py): the digests travel, the keys cannot (they were never stored).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from ..errors import AuthenticationError, PermissionDenied
from ..glossary import Term

SCOPES = ("translate", "admin")


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    scopes: tuple[str, ...]
    created: float
    revoked: bool


@dataclass(frozen=True)
class KeyRecord:
    """A key as stored: its digest is what authenticates it."""

    key: ApiKey
    digest: str


@dataclass(frozen=True)
class GlossaryRecord:
    glossary_id: str
    owner: str
    name: str
    source_lang: str | None
    target_lang: str | None
    terms: tuple[Term, ...]
    created: float

    def meta(self) -> dict[str, str | None]:
        return {"glossary_id": self.glossary_id, "name": self.name, "source_lang": self.source_lang,
                "target_lang": self.target_lang}

    def summary(self) -> dict[str, object]:
        return {**self.meta(), "terms": len(self.terms)}


class UserStore(Protocol):
    # ---- keys
    def create_key(self, name: str = "", scopes: tuple[str, ...] = ("translate",)) -> tuple[str, ApiKey]: ...

    def list_keys(self) -> list[ApiKey]: ...

    def get_key(self, key_id: str) -> ApiKey | None: ...

    def revoke_key(self, key_id: str) -> None:
        """NotFound for an id the store does not hold."""
        ...

    def revoked_among(self, key_ids: Collection[str]) -> set[str]:
        """Which of ``key_ids`` are revoked (an id the store does not hold is not)."""
        ...

    def authenticate(self, secret: str | None, scope: str = "translate") -> ApiKey:
        """The key ``secret`` is, if it holds ``scope`` (or admin); AuthenticationError / PermissionDenied else."""
        ...

    # ---- glossaries (every call names the owner: another key's glossary is not found)
    def put_glossary(self, owner: str, name: str, terms: list[Term], source_lang: str | None,
                     target_lang: str | None, *, limit: int | None = None) -> str:
        """The new glossary's id. ``limit``: the most the owner may keep, checked atomically with the write
        (QuotaExceeded, ``details.limit`` = max_glossaries_per_key), so two gateways cannot both add the last."""
        ...

    def get_glossary(self, owner: str, glossary_id: str) -> tuple[dict[str, str | None], list[Term]]: ...

    def count_glossaries(self, owner: str) -> int: ...

    def delete_glossary(self, owner: str, glossary_id: str) -> None: ...

    def latest_glossary(self, owner: str) -> str | None: ...

    def list_glossaries(self, owner: str) -> list[dict[str, object]]: ...

    # ---- migration
    def records(self) -> list[KeyRecord]: ...

    def glossary_records(self) -> list[GlossaryRecord]: ...

    def import_key(self, record: KeyRecord) -> bool:
        """Store ``record`` as it is (id, digest, revoked); False when its id is held already (then only a
        revocation is carried over: revocation goes one way)."""
        ...

    def import_glossary(self, record: GlossaryRecord) -> bool: ...

    def close(self) -> None: ...




def glossary_quota_message(limit: int) -> str:
    return (f"this key has {limit} glossaries, the most it may keep; delete one first "
            "(DELETE /v1/glossaries/{id})")


def key_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_key(name: str, scopes: tuple[str, ...]) -> tuple[str, ApiKey]:
    """A fresh key: its secret (shown once) and its record."""
    return "sk_" + secrets.token_urlsafe(32), ApiKey("key_" + secrets.token_hex(6), name, tuple(scopes), time.time(),
                                                     False)


def check_key(secret: str | None, key: ApiKey | None, scope: str, unknown: str) -> ApiKey:
    """``key`` (the store's record for ``secret``, None when it holds none) if it may act with ``scope``; the typed
    refusal otherwise. ``unknown``: why a key may be unknown to this store, for the 401's message."""
    if not secret:
        raise AuthenticationError("missing API key: send 'Authorization: Bearer sk_...'")
    if key is None:
        raise AuthenticationError(f"invalid API key: {unknown}")
    if key.revoked:
        raise AuthenticationError("this API key has been revoked")
    if scope not in key.scopes and "admin" not in key.scopes:
        raise PermissionDenied(f"this API key lacks the '{scope}' scope")
    return key
