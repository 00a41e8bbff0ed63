"""A local TCP proxy we control, put between the server and a dependency (Redis) to inject network faults.

``TcpProxy(host, port).start()`` listens on a free loopback port, served by its own asyncio loop in a daemon thread;
point the server at that port and flip ``set_mode`` from any thread while the experiment runs:

  pass       forward both ways
  slow       every chunk, either way, is delivered ``delay_s`` after it was read (a latency, not a throughput cap:
             chunks are pipelined, order is kept)
  partition  a black hole: open connections stay open, nothing is forwarded either way (what is read is held, up to
             1 MiB per direction, then reading stops: TCP back-pressure); new connections are accepted but not
             connected upstream. Leaving the partition resets (RST) every held connection instead of replaying
             stale bytes, so clients reconnect cleanly
  reset      reset every open connection now, and every new one as soon as it is accepted, until the next mode

A client whose upstream refuses the connection (the dependency is down) is reset at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import deque
from typing import Any

MODES = ("pass", "slow", "partition", "reset")
CHUNK = 64 * 1024
HOLD_BYTES = 1024 * 1024  # per direction: read ahead (slow, partition) at most this much, then stop reading


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST (SO_LINGER 0) rather than a FIN: the peer sees ECONNRESET, as after a middlebox reset."""
    if writer is None or writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _reset_backlog(listener: socket.socket) -> None:
    """Reset every connection the kernel completed that asyncio has not accepted yet: closing the listener alone
    leaves such a client connected to nothing, waiting forever."""
    sock = socket.fromfd(listener.fileno(), listener.family, listener.type)  # a dup: closing it keeps the listener
    try:
        sock.setblocking(False)
        while True:
            try:
                conn, _addr = sock.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                return
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
    finally:
        sock.close()


class _Pipe:
    """One direction of a connection: ``fill`` reads chunks into a byte-bounded FIFO stamped with their due time,
    ``deliver`` writes each one out at that time, unless the connection is held (partition). b"" marks EOF."""

    def __init__(self, conn: _Conn, src: asyncio.StreamReader, up: bool) -> None:
        self.conn, self.src, self.up = conn, src, up
        self.items: deque[tuple[float, bytes]] = deque()
        self.size = 0
        self.cond = asyncio.Condition()

    async def fill(self) -> None:
        loop = asyncio.get_running_loop()
        proxy = self.conn.proxy
        while True:
            async with self.cond:
                await self.cond.wait_for(lambda: self.size < HOLD_BYTES)
            chunk = await self.src.read(CHUNK)
            due = loop.time() + (proxy.delay_s if proxy.mode == "slow" else 0.0)
            async with self.cond:
                self.items.append((due, chunk))
                self.size += len(chunk)
                self.cond.notify_all()
            if not chunk:
                return

    async def deliver(self, dst: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            async with self.cond:
                await self.cond.wait_for(lambda: bool(self.items) and not self.conn.held)
                due, chunk = self.items[0]
            await asyncio.sleep(max(0.0, due - loop.time()))
            if self.conn.held:
                continue  # partitioned while this chunk waited: keep it (it is never delivered)
            async with self.cond:
                self.items.popleft()
                self.size -= len(chunk)
                self.cond.notify_all()
            if not chunk:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            dst.write(chunk)
            await dst.drain()
            self.conn.proxy.count(self.up, len(chunk))


class _Conn:
    def __init__(self, proxy: TcpProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client_r, self.client_w = reader, writer
        self.up_w: asyncio.StreamWriter | None = None
        self.held = proxy.mode == "partition"  # a held connection is never forwarded again, only reset
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        graceful = False
        try:
            up = _Pipe(self, self.client_r, up=True)
            if self.held:  # accepted inside a partition: never connected upstream
                await up.fill()
                return
            try:
                up_r, up_w = await asyncio.wait_for(
                    asyncio.open_connection(self.proxy.upstream_host, self.proxy.upstream_port),
                    timeout=self.proxy.connect_timeout)
            except (OSError, TimeoutError):
                return  # the dependency is down: reset the client at once
            self.up_w = up_w
            down = _Pipe(self, up_r, up=False)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(up.fill())
                tg.create_task(up.deliver(up_w))
                tg.create_task(down.fill())
                tg.create_task(down.deliver(self.client_w))
            graceful = True  # both sides sent EOF and everything was delivered
        except* (OSError, EOFError):
            pass  # either side broke: reset both
        finally:
            for w in (self.client_w, self.up_w):
                if w is not None:
                    if graceful:
                        w.close()
                    else:
                        _reset(w)
            self.proxy.conns.discard(self)

    def kill(self) -> None:
        _reset(self.client_w)
        _reset(self.up_w)
        if self.task is not None:
            self.task.cancel()


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, *, connect_timeout: float = 5.0) -> None:
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.listen_host, self.port = listen_host, listen_port
        self.connect_timeout = connect_timeout
        self.mode = "pass"
        self.delay_s = 0.0
        self.conns: set[_Conn] = set()
        self._stopping = False
        self._totals = {"connections_total": 0, "bytes_up": 0, "bytes_down": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- control (any thread) --------------------------------------------------------------------------------
    def start(self) -> int:
        """Start listening (own loop, daemon thread); returns the bound port."""
        if self._thread is not None and self._thread.is_alive():
            return self.port
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, args=(ready, errors), daemon=True,
                                        name=f"tcp-proxy-{self.upstream_port}")
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("the proxy did not start in 10 s")
        if errors:
            self._thread.join(timeout=5)
            raise errors[0]
        return self.port

    def stop(self) -> None:
        """Close the listener and every connection, then join the thread (5 s at most)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5)
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)

    def set_mode(self, mode: str, *, delay_s: float = 0.0) -> None:
        """Switch mode; returns once it is in force (connections reset by it are already closed)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        loop = self._loop
        if loop is None or not loop.is_running() or threading.current_thread() is self._thread:
            self._apply(mode, delay_s)
            return

        async def apply() -> None:
            self._apply(mode, delay_s)

        asyncio.run_coroutine_threadsafe(apply(), loop).result(timeout=5)

    def stats(self) -> dict[str, Any]:
        return {"mode": self.mode, **self._totals, "connections_open": len(self.conns)}

    # ---- on the proxy's loop ---------------------------------------------------------------------------------
    def count(self, up: bool, n: int) -> None:
        self._totals["bytes_up" if up else "bytes_down"] += n

    def _apply(self, mode: str, delay_s: float) -> None:
        previous, self.mode, self.delay_s = self.mode, mode, max(0.0, delay_s)
        for conn in list(self.conns):
            if mode == "partition":
                conn.held = True
            elif mode == "reset" or (previous == "partition" and conn.held):
                conn.kill()

    def _main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._accept, self.listen_host, self.port))
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._loop = loop
        except OSError as exc:
            errors.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._totals["connections_total"] += 1
        if self.mode == "reset" or self._stopping:
            _reset(writer)
            return
        conn = _Conn(self, reader, writer)
        self.conns.add(conn)
        conn.task = asyncio.get_running_loop().create_task(conn.run(), name="tcp-proxy-conn")

    async def _shutdown(self) -> None:
        self._stopping = True  # from now on _accept resets every connection handed to it
        for conn in list(self.conns):
            conn.kill()
        # Wait for every other task on this loop: the connections' pipes, and asyncio's hand-offs of connections it
        # accepted already (they reach _accept and are reset). The listener stays open meanwhile: closing it first
        # makes asyncio drop such a hand-off with its socket left open (Server._attach refuses a closed server), and
        # that client would wait forever. An accept already scheduled makes its hand-off only when it runs: yield
        # first, and look again after each wait.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3
        await asyncio.sleep(0)
        while (others := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]) \
                and loop.time() < deadline:
            await asyncio.wait(others, timeout=deadline - loop.time())
            await asyncio.sleep(0)
        if self._server is not None:
            for ts in self._server.sockets:  # connections the kernel completed that asyncio has not accepted yet
                _reset_backlog(ts)
            self._server.close()  # in the same step: nothing can be accepted in between
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
        await asyncio.sleep(0)  # let the aborted transports' connection_lost callbacks run
