"""``serve --workers N`` listens on one socket per worker (``server.reuse_port``, api/workers.py ``listeners``): the
kernel spreads streams over the workers, and so over the model processes they feed, instead of the first worker
awake taking most of them (32, 18, 10 and 4 of 64 on 4 workers, one at a time 16 of 16 on one of 2); and a second
server on the same port is still refused, as it was when the port had one socket."""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest
from conftest import BIN
from test_revocation_workers import _worker_of
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
