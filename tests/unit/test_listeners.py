"""``listeners`` (api/workers.py): the sockets `serve --workers N` hands its workers; and its supervisor's watch on
the workers' heartbeats."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from lingua_fusion.api.workers import START_GRACE_S, SharedBeat, Supervisor, bind, listeners
from lingua_fusion.config import Settings

pytestmark = pytest.mark.timeout(30)


def test_each_worker_gets_its_own_socket_on_one_port_and_connections_reach_them() -> None:
    socks = listeners("127.0.0.1", 0, 3, reuse_port=True)
    clients: list[socket.socket] = []
    try:
        assert len({id(s) for s in socks}) == 3  # one each
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and ports != {0}  # port 0: one free port for all
        port = ports.pop()
        for _ in range(24):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        accepted = 0
        for s in socks:  # every connection is queued on exactly one of them
            s.setblocking(False)
            while True:
                try:
                    conn, _ = s.accept()
                except BlockingIOError:
                    break
                conn.close()
                accepted += 1
        assert accepted == 24
    finally:
        for s in [*socks, *clients]:
            s.close()


def test_a_port_already_listened_on_is_refused_even_by_another_reuse_port_group() -> None:
    first = listeners("127.0.0.1", 0, 2, reuse_port=True)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError):
            listeners("127.0.0.1", port, 2, reuse_port=True)  # would have joined the group without the plain bind
        with pytest.raises(OSError):
            bind("127.0.0.1", port)
    finally:
        for s in first:
            s.close()


def test_without_reuse_port_or_with_one_worker_all_share_one_socket() -> None:
    for n, reuse in ((3, False), (1, True)):
        socks = listeners("127.0.0.1", 0, n, reuse_port=reuse)
        try:
            assert len(socks) == n and len({id(s) for s in socks}) == 1
        finally:
            socks[0].close()


def test_the_supervisor_kills_only_a_worker_whose_loop_is_silent_past_its_limit(tmp_path: Path) -> None:
    """``Supervisor._stalled`` and ``_looked`` on its shared beats, the clock passed in: a start's grace before
    the first beat, the stall limit after it, never while draining, and a gap in the supervisor's own looks (the
    group stopped) restarting every count."""
    settings = Settings()
    settings.state.state_dir = tmp_path
    settings.server.worker_stall_s = 10.0
    sup = Supervisor(settings, 3)
    try:
        t0 = 1000.0
        for i in range(3):
            sup.started[i] = sup.beats[i] = t0
        sup._watched = t0
        beat, drain = SharedBeat(sup.beats, 1), SharedBeat(sup.beats, 2)
        sup.beats[1] = t0 + 5  # beat once
        drain.draining()
        assert [sup._stalled(i, t0 + 14) for i in range(3)] == [0.0, 0.0, 0.0]
        assert sup._stalled(1, t0 + 16) == 11.0  # silent 11 s after a beat: past 10
        assert sup._stalled(0, t0 + 16) == 0.0  # never beaten: the start's grace as well
        assert sup._stalled(0, t0 + 10 + START_GRACE_S + 1) > 0
        assert sup._stalled(2, t0 + 10_000) == 0.0  # draining
        sup._looked(t0 + 4)  # looks a second or so apart: nothing moves
        assert sup.beats[1] == t0 + 5
        sup._looked(t0 + 60)  # a minute with no look: the whole group was stopped
        assert [sup._stalled(i, t0 + 65) for i in range(3)] == [0.0, 0.0, 0.0]
        assert sup.started[0] == t0 + 60 and sup.beats[1] == t0 + 60
        beat.beat()  # a real beat: time.monotonic()
        assert sup.beats[1] != t0 + 60
    finally:
        shutil.rmtree(sup.run_dir, ignore_errors=True)
