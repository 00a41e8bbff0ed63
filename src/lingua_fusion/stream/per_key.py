"""What a key's streams here use besides their capacity (stream/capacity.py), each of it the key's own: the pixels
they decode, paced together by one ``PixelBudget`` (stream/budget.py) that ``KeyPixels`` makes with the key's first
live stream and drops with its last, so there are never more budgets than keys live here; and the vocabulary a stream
reads signs with, which must be one the key taught (``vocabulary_of``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from ..config import LimitSettings
from ..errors import InvalidParameter
from .budget import PixelBudget, pixel_budget
from .contracts import Vocabularies
from .session import StreamSession


class KeyPixels:
    """``sessions``: the service's live sessions by stream id, read here (a key with none has no budget)."""

    def __init__(self, limits: LimitSettings, sessions: Mapping[str, StreamSession]) -> None:
        self.limits = limits
        self.sessions = sessions
        self._budgets: dict[str, PixelBudget] = {}  # key id -> the pixels its live streams may decode

    def of(self, key_id: str) -> PixelBudget:
        """The key's budget, for a stream of it that opens: one per key, for all its streams."""
        budget = self._budgets.get(key_id)
        if budget is None:
            budget = self._budgets[key_id] = pixel_budget(self.limits, time.monotonic)
        return budget

    def released(self, key_id: str) -> None:
        """A stream of the key ended: with the key's last, its budget goes (bounded by live keys)."""
        if not any(s.spec.key_id == key_id for s in self.sessions.values()):
            self._budgets.pop(key_id, None)


def vocabulary_of(vocabularies: Vocabularies | None, vid: object, key_id: str) -> str:
    """A start message's ``vocabulary_id``: the opening key's, taught (404 / 400 otherwise), or "". Blocking briefly
    (the store; the recogniser is built): run it on a worker thread."""
    if vid in (None, ""):
        return ""
    if not isinstance(vid, str):
        raise InvalidParameter("vocabulary_id must be a string (POST /v1/vocabularies)")
    if vocabularies is None:
        raise InvalidParameter("this server reads no signs: it has no vocabulary store")
    vocabularies.check(key_id, vid)  # not found for another key; refused when untaught
    return vid
