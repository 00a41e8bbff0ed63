"""A room's record, listener tokens and what each listener is sent (pure: no I/O, no clock of its own).

A listener token (``lt_...``) is read-only: it lets its holder hear one room, nothing else. It is never the
publisher's API key, and only its SHA-256 digest is stored.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

ROOM_ID = re.compile(r"^rm_[0-9a-f]{16}$")
TOKEN_PREFIX = "lt_"
# what a room carries from its publisher's stream; everything else (metrics, ready, notices) stays the publisher's
PUBLISHED = frozenset({"partial", "revision", "final", "slide", "speech", "closed"})
MAX_LISTEN_LANGS = 8


class State:
    WAITING = "waiting"  # created by REST, no publisher yet
    LIVE = "live"
    ENDED = "ended"


@dataclass
class Room:
    room_id: str
    owner: str  # the API key id that created it: only it lists, mints tokens for, publishes into and ends it
    created: float
    state: str = State.WAITING
    source_lang: str | None = None
    targets: list[str] = field(default_factory=list)  # the publisher's own targets
    stream_id: str | None = None  # the publishing stream (its resume re-attaches here)
    finals: int = 0
    epoch: int = 0  # how many times a stream attached: a publisher that left ends the room unless another came

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Room:
        return cls(room_id=str(d["room_id"]), owner=str(d["owner"]), created=float(d["created"]),
                   state=str(d.get("state", State.WAITING)), source_lang=d.get("source_lang"),
                   targets=list(d.get("targets") or []), stream_id=d.get("stream_id"),
                   finals=int(d.get("finals", 0)), epoch=int(d.get("epoch", 0)))

    def public(self, listeners: dict[str, int] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"room_id": self.room_id, "state": self.state, "source_lang": self.source_lang,
               "targets": self.targets, "stream_id": self.stream_id, "created": self.created, "finals": self.finals}
        if listeners is not None:
            out["languages"] = listeners
            out["listeners"] = sum(listeners.values())
        return out


def new_room_id() -> str:
    return "rm_" + secrets.token_hex(8)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(24)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def project(event: dict[str, Any], langs: tuple[str, ...], speech: bool = False) -> dict[str, Any] | None:
    """What a listener of ``langs`` is sent for a room ``event`` (None: nothing). A final carries the publisher's
    ``seq`` and, for each of ``langs``, the publisher's own ``translations[lang]``; a language added after the
    final was made is listed in ``untranslated``."""
    kind = event.get("type")
    if kind == "final":
        have = event.get("translations") or {}
        out = {k: v for k, v in event.items() if k not in ("translations", "text", "low_confidence", "latency_ms")}
        out["translations"] = {lang: have[lang] for lang in langs if lang in have}
        out["text"] = out["translations"].get(langs[0], "")
        missing = [lang for lang in langs if lang not in have]
        if missing:
            out["untranslated"] = missing
        low = [lang for lang in event.get("low_confidence") or () if lang in langs]
        if low:
            out["low_confidence"] = low
        return out
    if kind in ("partial", "revision"):
        # tentative translations: the stream's first target, and the room's other languages when they were made
        have = event.get("translations") or ({event["lang"]: event.get("text", "")} if event.get("lang") else {})
        out = {k: v for k, v in event.items() if k not in ("text", "lang", "translations")}
        mine = {lang: have[lang] for lang in langs if lang in have}
        if mine:
            out["translations"] = mine
            out["text"] = mine.get(langs[0], "")
        return out
    if kind == "speech":
        return dict(event) if speech and event.get("lang") in langs else None
    if kind == "slide":
        out = {k: v for k, v in event.items() if k != "translations"}
        have = event.get("translations") or {}
        out["translations"] = {lang: have[lang] for lang in langs if lang in have}
        return out
    if kind == "closed":
        return dict(event)
    return None
