"""A room's record, listener tokens, who may listen to what, and what each listener is sent (pure: no I/O, no
clock of its own).

A listener token (``lt_...``) is read-only: it lets its holder hear one room, in the languages the room allows
(``listenable``), nothing else. It is never the publisher's API key, and only its SHA-256 digest is stored, under
a token id (``tk_`` + the digest's first 16 hex digits) that the owner lists and revokes it by. An
``AccessChange`` is a bus event of the room's own (never sent to a listener): every gateway's feed closes the
listeners it refuses (a revoked token, a revoked owner key, a language no longer allowed).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal, NotRequired, TypedDict

ROOM_ID = re.compile(r"^rm_[0-9a-f]{16}$")
TOKEN_PREFIX = "lt_"
# what a room carries from its publisher's stream; everything else (metrics, ready, notices) stays the publisher's
PUBLISHED = frozenset({"partial", "revision", "final", "slide", "speech", "speaker_renamed", "closed"})
MAX_LISTEN_LANGS = 8
MAX_ALLOWED_TARGETS = 32  # languages a room may let its listeners add to what its publisher translates
TOKEN_ID = re.compile(r"^tk_[0-9a-f]{16}$")
MAX_LABEL = 80
ACCESS = "access"  # the type of an AccessChange on the bus


class RoomJSON(TypedDict):
    """A room as its owner sees it (``Room.public``; ``RoomService.describe`` adds who listens)."""

    room_id: str
    state: str
    source_lang: str | None
    targets: list[str]
    allowed_targets: list[str] | None
    stream_id: str | None
    created: float
    finals: int
    languages: NotRequired[dict[str, int]]  # listeners per language
    listeners: NotRequired[int]
    speech: NotRequired[dict[str, int]]  # listeners of the speech per language


class TokenJSON(TypedDict):
    """A listener token as its owner sees it: never the token, nor its digest."""

    token_id: str
    created: float
    label: str | None


class AccessJSON(TypedDict):
    """An ``AccessChange`` on the bus."""

    type: Literal["access"]
    reason: str
    revoked: list[str]
    everyone: bool
    allowed: list[str] | None


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _strs(value: object) -> list[str]:
    """A list of strings from JSON (each item as its ``str``); not a list (None, missing): empty."""
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _int(value: object) -> int:
    """A number from JSON, as ``int()`` reads it."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"{type(value).__name__} is not a number")
    return int(value)


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
    # languages listeners may ask for beyond the publisher's own targets (and the source); None: none beyond them
    allowed_targets: list[str] | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Room:
        """A room record as ``to_dict`` wrote it (read back from the directory's store)."""
        created = d["created"]
        if not isinstance(created, int | float | str):
            raise TypeError(f"a room's created is {type(created).__name__}")
        return cls(room_id=str(d["room_id"]), owner=str(d["owner"]), created=float(created),
                   state=str(d.get("state", State.WAITING)), source_lang=_str(d.get("source_lang")),
                   targets=_strs(d.get("targets")), stream_id=_str(d.get("stream_id")),
                   finals=_int(d.get("finals", 0)), epoch=_int(d.get("epoch", 0)),
                   allowed_targets=_strs(d["allowed_targets"]) if d.get("allowed_targets") is not None else None)

    def public(self, listeners: dict[str, int] | None = None) -> RoomJSON:
        out: RoomJSON = {"room_id": self.room_id, "state": self.state, "source_lang": self.source_lang,
                         "targets": self.targets, "allowed_targets": self.allowed_targets, "stream_id": self.stream_id,
                         "created": self.created, "finals": self.finals}
        if listeners is not None:
            out["languages"] = listeners
            out["listeners"] = sum(listeners.values())
        return out


def listenable(room: Room) -> frozenset[str] | None:
    """The languages a listener of ``room`` may ask for: its source, its publisher's own targets and its
    ``allowed_targets``. None while that is not known yet: a room made by REST without ``allowed_targets`` and no
    publisher so far (listeners may join it; when a publisher attaches, those outside its targets are closed)."""
    if room.allowed_targets is None and not room.targets:
        return None
    return frozenset([*room.targets, *(room.allowed_targets or ()), *([room.source_lang] if room.source_lang else [])])


@dataclass(frozen=True)
class TokenInfo:
    """A listener token as the directory keeps it: its id, its digest, when it was made and the owner's label."""

    token_id: str
    digest: str
    created: float
    label: str | None = None

    @classmethod
    def of(cls, token: str, created: float, label: str | None = None) -> TokenInfo:
        d = digest(token)
        return cls(token_id_of_digest(d), d, created, label)

    def to_json(self) -> str:
        return json.dumps({"digest": self.digest, "created": self.created, "label": self.label})

    @classmethod
    def from_json(cls, token_id: str, raw: str) -> TokenInfo:
        d = json.loads(raw)
        return cls(token_id, str(d["digest"]), float(d["created"]), d.get("label"))

    def public(self) -> TokenJSON:
        """What the owner sees: never the token, nor its digest."""
        return {"token_id": self.token_id, "created": self.created, "label": self.label}


@dataclass(frozen=True)
class AccessChange:
    """Who may no longer listen: ``revoked`` token ids, or ``everyone`` (the owner's key was revoked), or anyone
    asking for a language outside ``allowed`` (a publisher attached to a room whose languages were open)."""

    reason: str
    revoked: tuple[str, ...] = ()
    everyone: bool = False
    allowed: tuple[str, ...] | None = None

    def to_wire(self) -> AccessJSON:
        return {"type": "access", "reason": self.reason, "revoked": list(self.revoked), "everyone": self.everyone,
                "allowed": list(self.allowed) if self.allowed is not None else None}

    @classmethod
    def from_wire(cls, e: Mapping[str, object]) -> AccessChange:
        """An ``access`` event read from the bus (``to_wire``'s)."""
        allowed = e.get("allowed")
        return cls(str(e.get("reason", "")), tuple(_strs(e.get("revoked"))), bool(e.get("everyone")),
                   tuple(_strs(allowed)) if allowed is not None else None)

    def refuses(self, token_id: str, langs: tuple[str, ...]) -> str | None:
        """Why a listener with this token and these languages must go (``token`` or ``language``), or None."""
        if self.everyone or token_id in self.revoked:
            return "token"
        if self.allowed is not None and any(lang not in self.allowed for lang in langs):
            return "language"
        return None


def new_room_id() -> str:
    return "rm_" + secrets.token_hex(8)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(24)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id_of_digest(token_digest: str) -> str:
    return "tk_" + token_digest[:16]


def token_id_of(token: str) -> str:
    """A listener token's id: what its owner lists and revokes it by (it tells nothing about the token)."""
    return token_id_of_digest(digest(token))


def _mapping(value: object) -> Mapping[object, object]:
    """An event's per-language dict (``translations``); anything else (missing, null): empty."""
    return value if isinstance(value, dict) else {}


def project(event: Mapping[str, object], langs: tuple[str, ...], speech: bool = False) -> dict[str, object] | None:
    """What a listener of ``langs`` is sent for a room ``event`` (None: nothing). A final carries the publisher's
    ``seq`` and, for each of ``langs``, the publisher's own ``translations[lang]``; a language added after the
    final was made is listed in ``untranslated``."""
    kind = event.get("type")
    if kind == "final":
        have = _mapping(event.get("translations"))
        out = {k: v for k, v in event.items() if k not in ("translations", "text", "low_confidence", "latency_ms")}
        mine = {lang: have[lang] for lang in langs if lang in have}
        out["translations"] = mine
        out["text"] = mine.get(langs[0], "")
        missing = [lang for lang in langs if lang not in have]
        if missing:
            out["untranslated"] = missing
        low_confidence = event.get("low_confidence")
        low = [lang for lang in low_confidence if lang in langs] if isinstance(low_confidence, list | tuple) else []
        if low:
            out["low_confidence"] = low
        return out
    if kind in ("partial", "revision"):
        # tentative translations: the stream's first target, and the room's other languages when they were made
        lang = event.get("lang")
        have = _mapping(event.get("translations")) or ({lang: event.get("text", "")} if lang else {})
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
        have = _mapping(event.get("translations"))
        out["translations"] = {lang: have[lang] for lang in langs if lang in have}
        return out
    if kind in ("closed", "speaker_renamed"):  # a rename carries every name: a late listener's first event
        return dict(event)
    return None
