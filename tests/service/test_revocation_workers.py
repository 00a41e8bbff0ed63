"""Revoking a key on ``serve --workers 2`` (auth on): its live streams end on both workers, not only on the one that
served ``DELETE /v1/keys/{id}`` (api/revocation.py), and the key opens nothing anywhere after. Found by an attack:
the stream on the other worker went on translating."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_security import Srv, auth_server, connect, ending, event, opened, start

from lingua_fusion.api.revocation import RevocationWatch
from lingua_fusion.state.sqlite import SQLiteStore

# Streams are opened in bursts until both workers hold one. Each worker has its own socket (server.reuse_port) and
# the kernel picks one by a hash of the connection; with one shared socket (reuse_port false) the first worker awake
# took them, and CI once saw 16 in a row on one. Six bursts of four stay under the key's 32 live streams.
BURST, MAX_BURSTS = 4, 6


@pytest.fixture(scope="module")
def workers2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    with auth_server(tmp_path_factory.mktemp("revocation"), "--workers", "2") as srv:
        yield srv


def _worker_of(srv: Srv, ws: Any) -> int:
    """The pid of the worker that holds ``ws``'s connection: the server end's socket in /proc/net/tcp (local port
    the server's, remote port ours), then the worker whose file descriptors include that socket."""
    ours = ws.local_address[1]
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if int(line.split()[1].rsplit(":", 1)[1], 16) == srv.port
              and int(line.split()[2].rsplit(":", 1)[1], 16) == ours}
    workers = json.loads((srv.state / "serve.json").read_text())["workers"]
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                    return int(pid)
            except OSError:  # a descriptor closed while we looked
                continue
    raise AssertionError(f"no worker of {workers} holds the connection from port {ours}")


async def _one_per_worker(srv: Srv, key: str) -> dict[int, list[Any]]:
    """Streams of ``key`` opened until each of the two workers holds at least one; by worker pid."""
    by_worker: dict[int, list[Any]] = {}
    for _ in range(MAX_BURSTS):
        burst = await asyncio.gather(*(opened(srv.ws, key, start(["text"])) for _ in range(BURST)))
        for ws, _ready in burst:
            by_worker.setdefault(_worker_of(srv, ws), []).append(ws)
        if len(by_worker) == 2:
            return by_worker
    raise AssertionError(f"{BURST * MAX_BURSTS} streams, opened {BURST} at a time, all landed on one worker")


async def test_revoking_a_key_closes_its_streams_on_every_worker(workers2: Srv) -> None:
    key, key_id = workers2.new_key("to-revoke")
    other, _ = workers2.new_key("stays")
    doomed = await _one_per_worker(workers2, key)
    kept, _ = await opened(workers2.ws, other, start(["text"]))

    r = httpx.delete(f"{workers2.url}/v1/keys/{key_id}", headers=workers2.auth(), timeout=10)
    assert r.status_code == 200 and r.json()["revoked"] is True, r.text

    for pid, streams in doomed.items():  # before the fix the other worker's streams stayed open
        for ws in streams:
            try:
                events, code = await ending(ws)
            except TimeoutError:
                raise AssertionError(f"a stream of the revoked key on worker {pid} is still open") from None
            assert events and events[-1]["type"] == "error", (pid, events)
            assert events[-1]["code"] == "unauthenticated" and "revoked" in events[-1]["message"], (pid, events)
            assert code == 4401, (pid, code)

    # another key's stream goes on translating
    await kept.send(json.dumps({"type": "text", "text": "The river is calm today.", "ts": 1.0}))
    final = await event(kept)
    while final["type"] != "final":
        final = await event(kept)
    assert final["source_text"] and final["text"]
    await kept.close()

    # the revoked key opens nothing and is refused by REST, whichever worker answers
    for _ in range(4):
        ws = await connect(workers2.ws, key)
        await ws.send(json.dumps(start(["text"])))
        events, code = await ending(ws)
        assert events[0]["code"] == "unauthenticated" and code == 4401, (events, code)
        r = httpx.get(f"{workers2.url}/v1/glossaries", headers=workers2.auth(key), timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated", r.text


# ---- one level down: the store's answer and one look of the watch, no server ------------------------------------
async def test_the_watch_closes_only_the_live_keys_the_store_says_are_revoked(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    ids = [store.create_key(name)[1].key_id for name in ("a", "b", "c")]
    store.revoke_key(ids[0])
    store.revoke_key(ids[2])  # revoked, but no live stream here
    live = {ids[0], ids[1], "anonymous"}
    closed: list[str] = []

    async def close(key_id: str) -> int:
        closed.append(key_id)
        live.discard(key_id)
        return 1

    watch = RevocationWatch(lambda: set(live), store.revoked_among, close, interval_s=1.0)
    assert await watch.check() == 1 and closed == [ids[0]]
    assert await watch.check() == 0 and closed == [ids[0]]  # its streams are gone: nothing more to close
    assert store.revoked_among(ids) == {ids[0], ids[2]}
    store.close()


async def test_a_failed_look_does_not_end_the_watch(tmp_path: Path) -> None:
    """One look fails with something other than the store's own errors (closing a stream raised): the watch goes on,
    and the next look still closes the revoked key's streams (before, the task ended and revocations stopped reaching
    this process)."""
    store = SQLiteStore(tmp_path)
    key_id = store.create_key("a")[1].key_id
    store.revoke_key(key_id)
    looks: list[str] = []
    closed = asyncio.Event()

    async def close(k: str) -> int:
        looks.append(k)
        if len(looks) == 1:
            raise RuntimeError("a stream failed to close")
        closed.set()
        return 1

    watch = RevocationWatch(lambda: {key_id}, store.revoked_among, close, interval_s=0.01)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(closed.wait(), 10)
        assert looks[:2] == [key_id, key_id]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
