"""What the server answers the SDK's calls, as typed dicts: ``models()``, and the rooms' calls.

Each answer is checked for the fields that tell its shape (a guard below) where it arrives; a 2xx body of another
shape is a ``BackendError`` (a wrong URL, a proxy), as a body that is no JSON object is (``client._check``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NotRequired, TypedDict, TypeGuard, TypeVar

from ..errors import BackendError
from ..json_types import JSONObject, JSONValue
from ..rooms.model import RoomJSON, TokenJSON

T = TypeVar("T")


class ModelJSON(TypedDict):
    """One model of ``GET /v1/models`` (``Registry.capabilities``)."""

    task: str
    name: str
    languages: list[str]
    pairs: list[str]
    licence: str
    quality: str
    low_confidence: NotRequired[bool]
    loaded: NotRequired[bool]
    available: NotRequired[bool]
    unavailable_reason: NotRequired[str]


class PairRouteJSON(TypedDict):
    """One translation pair of ``GET /v1/models`` with its route (``Registry.pair_routes``)."""

    pair: str
    route: str
    pivot: NotRequired[str | None]
    tier: str
    low_confidence: bool
    llm_legs: int
    chrf: NotRequired[float | None]
    available: NotRequired[bool]
    unavailable_reason: NotRequired[str]


class ModelsJSON(TypedDict):
    """``GET /v1/models``: the models, the served pairs, and (from servers that say them) each pair's route."""

    models: list[ModelJSON]
    pairs: list[str]
    routes: NotRequired[list[PairRouteJSON]]


class RoomCreated(RoomJSON):
    """``POST /v1/rooms``: the room, with its first listener token."""

    listener_token: str
    token_id: str


class TokenRevoked(TypedDict):
    room_id: str
    token_id: str
    revoked: bool
    listeners_closed: int


class RoomEnded(TypedDict):
    room_id: str
    state: str
    finals: int
    deleted: bool


def _has(body: Mapping[str, object], **fields: type | tuple[type, ...]) -> bool:
    return all(isinstance(body.get(k), t) for k, t in fields.items())


def _objects(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def is_models(body: Mapping[str, object]) -> TypeGuard[ModelsJSON]:
    pairs = body.get("pairs")
    return (_objects(body.get("models")) and isinstance(pairs, list) and all(isinstance(p, str) for p in pairs)
            and _objects(body.get("routes", [])))


def is_room(body: Mapping[str, object]) -> TypeGuard[RoomJSON]:
    return _has(body, room_id=str, state=str)


def is_room_created(body: Mapping[str, object]) -> TypeGuard[RoomCreated]:
    return is_room(body) and _has(body, listener_token=str, token_id=str)


def is_token(body: Mapping[str, object]) -> TypeGuard[TokenJSON]:
    return _has(body, token_id=str)


def is_token_revoked(body: Mapping[str, object]) -> TypeGuard[TokenRevoked]:
    return _has(body, room_id=str, token_id=str)


def is_room_ended(body: Mapping[str, object]) -> TypeGuard[RoomEnded]:
    return _has(body, room_id=str, deleted=bool)


def _other(base_url: str, what: str, body: Mapping[str, object]) -> BackendError:
    return BackendError(f"{base_url} answered {what} with a body of another shape; is --url a LinguaFusion "
                        "server?", details={"fields": sorted(body)[:20]})


def answer(body: JSONObject, guard: Callable[[Mapping[str, object]], TypeGuard[T]], base_url: str,
           what: str) -> T:
    """``body`` as the answer ``guard`` tells, or a ``BackendError``."""
    if guard(body):
        return body
    raise _other(base_url, what, body)


def answers(value: JSONValue, guard: Callable[[Mapping[str, object]], TypeGuard[T]], base_url: str,
            what: str) -> list[T]:
    """A list of answers (``body["rooms"]``), each as ``guard`` tells, or a ``BackendError``."""
    if not isinstance(value, list):
        raise BackendError(f"{base_url} answered {what} without a list of objects; is --url a LinguaFusion "
                           "server?")
    out: list[T] = []
    for item in value:
        if not isinstance(item, dict) or not guard(item):
            raise _other(base_url, what, item if isinstance(item, dict) else {})
        out.append(item)
    return out
