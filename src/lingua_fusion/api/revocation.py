"""A revoked key's live streams end on every process, not only on the one that served the revocation.

``DELETE /v1/keys/{id}`` marks the key revoked in the key store (SQLite in the state directory: every worker of
``serve --workers N`` and any server on the same state directory read it) and at once closes the key's live streams
on the process that served the request (api/admin.py). A stream of that key on another worker, or on another server
of the state directory, or of a key revoked with ``linguafusion keys revoke`` while the server runs, is this
watch's: every ``interval_s`` (``server.key_check_interval_s``) each process asks the store, in one query run in a
thread, which of the keys that have live streams here are revoked, and closes their streams the way the route does
(``StreamService.revoke``: error ``unauthenticated``, close 4401). Such a stream ends within about ``interval_s``.
New streams and requests of a revoked key are refused everywhere already: each one authenticates against the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from .watch import every


@dataclass(frozen=True)
class RevocationWatch:
    """Closes the live streams of keys revoked elsewhere. ``live_keys``: the keys with a live stream in this process;
    ``revoked_among``: the store's answer (blocking, so it runs in a thread); ``close``: ends a key's streams here,
    returns how many."""

    live_keys: Callable[[], set[str]]
    revoked_among: Callable[[Collection[str]], set[str]]
    close: Callable[[str], Awaitable[int]]
    interval_s: float
    timeout_s: float = 10.0  # one store query (SQLite's own busy timeout is 10 s)

    async def check(self) -> int:
        """One look: close the streams of the live keys that the store says are revoked; how many were closed."""
        keys = self.live_keys()
        if not keys:
            return 0
        revoked = await asyncio.wait_for(asyncio.to_thread(self.revoked_among, keys), self.timeout_s)
        return sum([await self.close(key_id) for key_id in sorted(revoked)])

    async def run(self) -> None:
        """``check`` every ``interval_s`` until cancelled (``watch.every``)."""
        await every(self.interval_s, self.check, "revoked-key check",
                    "closed {n} stream(s) of keys revoked elsewhere")
