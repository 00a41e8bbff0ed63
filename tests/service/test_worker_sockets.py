"""``serve --workers N`` listens on one socket per worker (``server.reuse_port``, api/workers.py ``listeners``): the
kernel spreads streams over the workers, and so over the model processes they feed, instead of the first worker
awake taking most of them (58 of 200 on one of 12 workers; one at a time, 16 of 16 on one of 2); a second server on
the same port is still refused, as it was when the port had one socket; and a worker whose loop stops is replaced
(``server.worker_stall_s``), so its share of new connections does not wait on it for ever."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BIN
from test_revocation_workers import _one_per_worker, _worker_of
from test_security import Srv, auth_server, opened, start

pytestmark = pytest.mark.timeout(240)
STREAMS = 24  # opened one at a time; an even spread puts 12 on each worker, and fewer than 4 is a 1 in 3,500 chance


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    with auth_server(tmp_path_factory.mktemp("sockets"), "--workers", "2") as srv:
        yield srv


async def test_streams_opened_one_at_a_time_spread_over_both_workers(two_workers: Srv) -> None:
    key, _ = two_workers.new_key("spread")
    held = []
    try:
        for _ in range(STREAMS):
            ws, _ready = await opened(two_workers.ws, key, start(["text"]))
            held.append(ws)
        by_worker = Counter(_worker_of(two_workers, ws) for ws in held)
    finally:
        await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
    assert len(by_worker) == 2 and min(by_worker.values()) >= 4, by_worker


def test_a_second_server_on_the_port_is_refused_and_the_first_keeps_serving(two_workers: Srv) -> None:
    second = subprocess.run([str(BIN), "serve", "--workers", "2", "--port", str(two_workers.port),
                             "--state-dir", str(two_workers.state / "second")], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 2, (second.returncode, second.stderr[-2000:])
    assert f"cannot listen on 127.0.0.1:{two_workers.port}" in second.stderr, second.stderr[-2000:]

    async def still_serving() -> None:
        key, _ = two_workers.new_key("after")
        for _ in range(4):  # whichever worker each lands on
            ws, ready = await opened(two_workers.ws, key, start(["text"]))
            assert ready["type"] == "ready"
            await ws.close()

    asyncio.run(still_serving())


def test_a_worker_whose_loop_stops_is_replaced_and_new_streams_open(tmp_path: Path) -> None:
    """SIGSTOP one worker (as a wedged loop looks from outside): with a socket per worker, its share of new
    connections would wait on it for ever; its silent heartbeat gets it killed and started again, and every stream
    opened after that is served."""
    env = {"LINGUAFUSION_SERVER__WORKER_STALL_S": "3"}
    with auth_server(tmp_path, "--workers", "2", env=env) as srv:
        key, _ = srv.new_key("stall")

        async def both_serving() -> None:  # /readyz answered from one worker; the other may still be starting
            for streams in (await _one_per_worker(srv, key)).values():
                await asyncio.gather(*(ws.close() for ws in streams))

        asyncio.run(both_serving())
        first = json.loads((srv.state / "serve.json").read_text())
        stopped = first["workers"][0]
        os.kill(stopped, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        now = first
        while time.monotonic() < deadline:
            now = json.loads((srv.state / "serve.json").read_text())
            if stopped not in now["workers"] and len(now["workers"]) == 2:
                break
            time.sleep(0.5)
        assert stopped not in now["workers"] and now["restarts"] >= 1, now
        assert "has not run its event loop" in srv.log(), srv.log()[-2000:]

        async def opens() -> None:
            for _ in range(8):  # both workers' sockets, by chance; each must answer
                ws, ready = await opened(srv.ws, key, start(["text"]))
                assert ready["type"] == "ready"
                await ws.close()

        asyncio.run(opens())
