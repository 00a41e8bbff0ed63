"""Large arrays (a partial's audio window, a picture) to the model process through memory both sides map, not the
socket.

A worker sends a stream's utterance again with every partial: on the 2-core machine its link carried about 295 KB a
stream-second where the audio itself is 64 KB (float32), and socket writes were the worker's largest single cost
(py-spy). Each crossing copied the array seven times (its bytes, msgpack, the frame, the kernel twice, msgpack, the
array). Now a worker keeps a ``Ring`` in an anonymous shared file (``memfd_create``: nothing on disk to clean up,
nothing left behind by a SIGKILL), which the model process maps at the connection's handshake through
``/proc/<pid>/fd/<fd>`` (``View.open``). An array of MIN_BYTES or more is copied into the ring and crosses as its
place; the model process copies it out as it decodes the message. The model process decodes a connection's frames
in order, so a span is free again once a reply has come for its call or for a later one (a call that timed out or
was cancelled keeps its span until then: remote.py ModelLink), and a connection that ended with spans held leaves
its ring behind (the next one gets a new ring). No room (calls held long), no ring (the model process could not map
it: it says so in the handshake's reply) or a small array: the array crosses inline, as before.

The model process maps only what it can trust: the handshake's pid must be the socket's peer (SO_PEERCRED), the
file a regular one opened without blocking, sealed against shrinking and growing (a worker that shrank it would
make the model process's reads fault). A ring's pages stay resident once touched: up to RING_BYTES a worker.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import socket
import stat
import struct
from collections import deque

import numpy as np

log = logging.getLogger("lingua_fusion.serving.shard")
RING_BYTES = 64 << 20  # a worker's ring: about 100 s of float32 audio in flight at once (pages taken as touched)
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW  # what a ring must be sealed against before it is mapped
MIN_BYTES = 64 << 10  # smaller arrays (a VAD window of 0.25 s is 16 KB) cross inline: a copy costs less there


class Ring:
    """The writer's side: spans allocated in order around the ring, freed in any order (the oldest live span holds
    the ring's tail)."""

    def __init__(self, size: int = RING_BYTES) -> None:
        self.size = size
        self.fd = os.memfd_create("lf-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)  # its size is fixed for good
        self._map = mmap.mmap(self.fd, size)
        self._head = 0
        self._live: deque[list[int]] = deque()  # [start, end, released (0/1)], in allocation order
        self.bytes_in = self.full = 0  # bytes that crossed here; arrays that found no room (counters)

    def handle(self) -> dict[str, int]:
        """What the model process maps it by (``View.open``)."""
        return {"pid": os.getpid(), "fd": self.fd, "size": self.size}

    def put(self, arr: np.ndarray) -> int | None:
        """Copy ``arr`` (C-contiguous) in; its offset, or None when there is no room now."""
        n = arr.nbytes
        at = self._alloc(n)
        if at is None:
            self.full += 1
            return None
        np.frombuffer(self._map, np.uint8, n, at)[:] = arr.reshape(-1).view(np.uint8)
        self.bytes_in += n
        return at

    def _alloc(self, n: int) -> int | None:
        if not self._live:
            self._head = 0
        if n <= 0 or n > self.size:
            return None
        tail = self._live[0][0] if self._live else 0
        if not self._live or self._head > tail:  # free: [head, size), then [0, tail)
            if self._head + n <= self.size:
                at = self._head
            elif n < tail:  # the span ends before the oldest live one starts
                at = 0
            else:
                return None
        elif self._head + n < tail:  # wrapped: free [head, tail)
            at = self._head
        else:
            return None
        self._head = at + n
        self._live.append([at, at + n, 0])
        return at

    def release(self, at: int) -> None:
        """The call that used the span at ``at`` ended."""
        for span in self._live:
            if span[0] == at and not span[2]:
                span[2] = 1
                break
        while self._live and self._live[0][2]:
            self._live.popleft()

    def live(self) -> int:
        return sum(1 for s in self._live if not s[2])

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


def peer_pid(sock: socket.socket | None) -> int | None:
    """The pid at the other end of a Unix socket (SO_PEERCRED), None where it cannot be read."""
    try:
        if sock is None:
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    except (AttributeError, OSError, struct.error):
        return None


def new_ring() -> Ring | None:
    """A worker's ring, or None where shared memory cannot be made (arrays then cross inline)."""
    try:
        return Ring()
    except (OSError, AttributeError) as exc:  # no memfd_create (not Linux), or no memory for it
        log.warning("no shared memory for the model link (%s); arrays cross the socket", exc)
        return None


class View:
    """The model process's side: a worker's ring, mapped read-only."""

    def __init__(self, mapped: mmap.mmap, size: int) -> None:
        self._map = mapped
        self.size = size

    @classmethod
    def open(cls, handle: object, peer: int | None) -> View | None:
        """Map the ring a worker's handshake names, ``peer`` the pid at the socket's other end (``peer_pid``); None
        (the worker then sends arrays inline) when it cannot, or when the ring is not what it must be."""
        try:
            if not isinstance(handle, dict):
                raise TypeError("a ring handle is a map")
            pid, fd, size = int(handle["pid"]), int(handle["fd"]), int(handle["size"])
            if peer is None or pid != peer:
                raise ValueError(f"the ring's pid {pid} is not the connection's peer {peer}")
            f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(f)
                if not stat.S_ISREG(st.st_mode) or size <= 0 or st.st_size != size:
                    raise ValueError("the ring is not a regular file of the size it says")
                if fcntl.fcntl(f, fcntl.F_GET_SEALS) & SEALS != SEALS:
                    raise ValueError("the ring is not sealed against a change of size")
                mapped = mmap.mmap(f, size, access=mmap.ACCESS_READ)
            finally:
                os.close(f)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("a worker's shared memory could not be mapped (%s); its arrays cross the socket", exc)
            return None
        return cls(mapped, size)

    def read(self, at: object, n: object, dtype: object, shape: object) -> np.ndarray:
        """A copy of the array at ``at`` (the worker may reuse the span once the call ends)."""
        if not (isinstance(at, int) and isinstance(n, int) and isinstance(dtype, str) and isinstance(shape, list)):
            raise ValueError("a malformed shared array on the model wire")
        kind = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        if at < 0 or n < 0 or at + n > self.size or count * kind.itemsize != n or kind.hasobject:
            raise ValueError("a shared array outside its ring")
        return np.frombuffer(self._map, kind, count, at).reshape(shape).copy()

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # an array still reads it (none should: ``read`` copies); unmapped when that goes
            log.warning("a worker's shared memory is still in use at its connection's end")
