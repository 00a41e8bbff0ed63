"""The chaos TCP proxy with real sockets: an asyncio echo server upstream, and a real redis-server when there is one."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlparse

import pytest
from conftest import REDIS, free_port, needs_redis

from lingua_fusion.lab.chaos.proxy import TcpProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()


@pytest.fixture
def proxy_threads() -> Iterator[None]:
    """Every proxy a test starts must be gone (thread joined) when it ends."""
    yield
    assert not [t for t in threading.enumerate() if t.name.startswith("tcp-proxy")]


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=5)


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                     within: float = 5.0) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), timeout=within)


async def _closed(reader: asyncio.StreamReader, within: float = 3.0) -> bool:
    """True when the peer closed the connection (EOF or reset) within ``within`` seconds."""
    try:
        return await asyncio.wait_for(reader.read(65536), timeout=within) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


async def _refused_or_closed(port: int, within: float = 2.0) -> bool:
    """Connect, then True if the proxy reset the connection within ``within`` s (on loopback the RST may even beat
    the connect call's completion)."""
    try:
        reader, writer = await _connect(port)
    except ConnectionError:
        return True
    try:
        return await _closed(reader, within)
    finally:
        writer.close()


async def test_pass_forwards_both_ways_and_counts(echo_port: int, proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    port = proxy.start()
    try:
        reader, writer = await _connect(port)
        assert await _roundtrip(reader, writer, b"hello") == b"hello"
        big = os.urandom(3 * 1024 * 1024)  # more than the per-direction bound: back-pressure, not loss
        assert await _roundtrip(reader, writer, big, within=20) == big
        deadline = time.monotonic() + 3  # bytes are counted once written on: the last chunk may still be counting
        while (s := proxy.stats())["bytes_down"] < 5 + len(big) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert s["mode"] == "pass" and s["connections_total"] == 1 and s["connections_open"] == 1
        assert s["bytes_up"] == s["bytes_down"] == 5 + len(big)
        writer.close()
        assert await _closed(reader)
        deadline = time.monotonic() + 10  # the proxy notices the close on its own thread
        while proxy.stats()["connections_open"] and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert proxy.stats()["connections_open"] == 0
    finally:
        proxy.stop()


async def test_slow_delays_every_chunk_in_order(echo_port: int, proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    port = proxy.start()
    try:
        reader, writer = await _connect(port)
        proxy.set_mode("slow", delay_s=0.3)
        t = time.monotonic()
        assert await _roundtrip(reader, writer, b"ping") == b"ping"
        assert time.monotonic() - t >= 0.6  # delayed going up and coming back
        # pipelined, not serialised: ten chunks in flight arrive in order about one delay pair later
        t = time.monotonic()
        for i in range(10):
            writer.write(b"%02d" % i)
            await writer.drain()
            await asyncio.sleep(0.02)
        got = await asyncio.wait_for(reader.readexactly(20), timeout=5)
        assert got == b"".join(b"%02d" % i for i in range(10))
        assert time.monotonic() - t >= 0.6  # (that they are not serialised, < 2 s: bench/speed_bounds.py)
        proxy.set_mode("pass")
        assert await _roundtrip(reader, writer, b"fast") == b"fast"  # (promptly: bench/speed_bounds.py)
        writer.close()
    finally:
        proxy.stop()


async def test_partition_holds_then_resets_on_pass(echo_port: int, proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    port = proxy.start()
    try:
        reader, writer = await _connect(port)
        assert await _roundtrip(reader, writer, b"before") == b"before"
        proxy.set_mode("partition")
        up_before = proxy.stats()["bytes_up"]
        writer.write(b"lost in the partition")
        await writer.drain()
        assert not await _closed(reader, within=1.0)  # nothing comes back, yet the connection stays open
        # a new connection is accepted (the handshake completes) but goes nowhere
        reader2, writer2 = await _connect(port)
        writer2.write(b"hello?")
        await writer2.drain()
        assert not await _closed(reader2, within=0.5)
        s = proxy.stats()
        assert s["mode"] == "partition" and s["connections_open"] == 2 and s["bytes_up"] == up_before
        # the bound: a client that keeps writing is back-pressured, the proxy does not buffer it all
        writer.write(bytes(64 * 1024 * 1024))  # far more than the kernel socket buffers and the 1 MiB hold
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.drain(), timeout=1.0)
        proxy.set_mode("pass")
        assert await _closed(reader) and await _closed(reader2)  # held connections are reset, not replayed
        assert proxy.stats()["bytes_up"] == up_before
        # and a fresh connection works again
        reader3, writer3 = await _connect(port)
        assert await _roundtrip(reader3, writer3, b"after") == b"after"
        for w in (writer, writer2, writer3):
            w.close()
    finally:
        proxy.stop()


async def test_reset_closes_open_and_new_connections(echo_port: int, proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    port = proxy.start()
    try:
        reader, writer = await _connect(port)
        assert await _roundtrip(reader, writer, b"x") == b"x"
        proxy.set_mode("reset")
        assert await _closed(reader, within=1.0)
        assert await _refused_or_closed(port, within=1.0)  # accepted by the kernel, then reset at once
        assert proxy.stats()["connections_open"] == 0
        proxy.set_mode("pass")
        reader3, writer3 = await _connect(port)
        assert await _roundtrip(reader3, writer3, b"y") == b"y"
        for w in (writer, writer3):
            w.close()
    finally:
        proxy.stop()


async def test_upstream_down_closes_the_client_promptly(proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", free_port())  # nothing listens there: connection refused
    port = proxy.start()
    try:
        assert await _refused_or_closed(port, within=30.0)  # (within 1 s: bench/speed_bounds.py)
        assert proxy.stats()["connections_total"] == 1
    finally:
        proxy.stop()


async def test_stop_closes_connections_and_leaves_no_thread(echo_port: int, proxy_threads: None) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    port = proxy.start()
    reader, writer = await _connect(port)
    assert await _roundtrip(reader, writer, b"z") == b"z"
    proxy.set_mode("partition")
    reader2, writer2 = await _connect(port)
    await asyncio.to_thread(proxy.stop)
    assert await _closed(reader) and await _closed(reader2)
    with pytest.raises(OSError):
        await _connect(port)
    for w in (writer, writer2):
        w.close()


@needs_redis
def test_redis_through_the_proxy(proxy_threads: None) -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    url = urlparse(REDIS or "")
    proxy = TcpProxy(url.hostname or "127.0.0.1", int(url.port or 6379))
    port = proxy.start()
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=1.0,
                         retry=Retry(NoBackoff(), 0))
    try:
        assert client.set("lf:proxy-test", b"v") and client.get("lf:proxy-test") == b"v"
        proxy.set_mode("slow", delay_s=0.2)
        t = time.monotonic()
        assert client.get("lf:proxy-test") == b"v"
        assert time.monotonic() - t >= 0.4
        proxy.set_mode("partition")
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):  # its own 1 s socket timeout
            client.get("lf:proxy-test")
        other = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=1.0,
                            retry=Retry(NoBackoff(), 0))
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):  # a new connection fares no better
            other.ping()
        other.close()
        proxy.set_mode("pass")
        assert client.get("lf:proxy-test") == b"v"  # redis-py reconnects after the reset
        proxy.set_mode("reset")
        with pytest.raises(redis.ConnectionError):
            client.get("lf:proxy-test")
        proxy.set_mode("pass")
        assert client.delete("lf:proxy-test") == 1
    finally:
        client.close()
        proxy.stop()
