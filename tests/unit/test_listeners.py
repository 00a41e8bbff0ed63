"""``listeners`` (api/workers.py): the sockets `serve --workers N` hands its workers."""

from __future__ import annotations

import socket

import pytest

from lingua_fusion.api.workers import bind, listeners

pytestmark = pytest.mark.timeout(30)


def test_each_worker_gets_its_own_socket_on_one_port_and_connections_reach_them() -> None:
    socks = listeners("127.0.0.1", 0, 3, reuse_port=True)
    try:
        assert len({id(s) for s in socks}) == 3  # one each
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and ports != {0}  # port 0: one free port for all
        port = ports.pop()
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(24)]
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
        for c in clients:
            c.close()
    finally:
        for s in socks:
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
