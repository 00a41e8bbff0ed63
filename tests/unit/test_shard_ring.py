"""A worker's shared ring (serving/shard/shm.py): large arrays cross to the model process through memory both map.

The ring hands out spans in order and takes them back in any order; it never hands out a span that overlaps one
still in use (the model process may still be reading it), and says so (None) when there is no room, so the caller
sends the array inline. The model process's ``View`` maps it through /proc/<pid>/fd (here: this very process) and
copies an array out; the codec sends an array of MIN_BYTES or more as its place in the ring."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lingua_fusion.serving.shard import codec, shm

ME = os.getpid()  # the model process's peer in these tests: this very process


def test_spans_wrap_around_and_never_overlap_one_in_use() -> None:
    ring = shm.Ring(size=100)
    try:
        a, b, c = (ring.put(np.zeros(30, np.uint8)) for _ in range(3))
        assert (a, b, c) == (0, 30, 60)
        assert ring.put(np.zeros(30, np.uint8)) is None  # 10 left at the end, the start still held
        ring.release(b)  # out of order: the oldest (a) still holds the tail
        assert ring.put(np.zeros(30, np.uint8)) is None and ring.full == 2
        ring.release(a)  # now 0..60 is free: the next span wraps to the start
        assert ring.put(np.zeros(50, np.uint8)) == 0
        assert ring.put(np.zeros(20, np.uint8)) is None  # between 50 and c's 60: no room for 20
        assert ring.put(np.zeros(5, np.uint8)) == 50
        ring.release(c)
        assert ring.live() == 2
        assert ring.put(np.zeros(101, np.uint8)) is None  # larger than the ring: inline
    finally:
        ring.close()


def test_an_array_crosses_as_its_place_and_comes_out_equal() -> None:
    ring = shm.Ring(size=1 << 20)
    view = shm.View.open(ring.handle(), ME)
    assert view is not None
    try:
        out = codec.Outbox.__new__(codec.Outbox)  # only its encoder: no connection here
        out.ring, out._bodies, out._size, out._scheduled, out.batch_bytes = ring, [], 0, True, 1 << 22
        audio = np.random.default_rng(0).normal(0, 0.1, 16000 * 3).astype(np.float32)  # a partial's 3 s window
        small = np.ones(100, np.float32)  # under MIN_BYTES: inline
        spans = out.put({"op": "run", "payload": {"audio": audio, "small": small}})
        assert spans == [0] and ring.bytes_in == audio.nbytes
        body = out._bodies[0]
        assert len(body) < 2_000  # the frame carries its place, not its 192 KB
        msg = codec.decode_many(body, view)[0]
        payload = msg["payload"]
        assert isinstance(payload, dict)
        assert np.array_equal(payload["audio"], audio) and np.array_equal(payload["small"], small)
        assert payload["audio"].flags.writeable  # a copy: the worker may write that span again
        with pytest.raises(ValueError, match="not mapped"):  # a connection that mapped no ring
            codec.decode_many(body)
        ring.release(0)
        assert ring.live() == 0
    finally:
        view.close()
        ring.close()


def test_a_place_outside_the_ring_is_refused() -> None:
    ring = shm.Ring(size=4096)
    view = shm.View.open(ring.handle(), ME)
    assert view is not None
    try:
        with pytest.raises(ValueError, match="outside"):
            view.read(4000, 400, "<f4", [100])
        with pytest.raises(ValueError, match="outside"):
            view.read(0, 400, "<f4", [99])  # its size and its shape disagree
        with pytest.raises(ValueError, match="malformed"):
            view.read("0", 400, "<f4", [100])
    finally:
        view.close()
        ring.close()


def test_a_ring_the_model_process_cannot_map_or_must_not_trust_is_not_used(tmp_path: Path) -> None:
    """The model process maps only its peer's own sealed ring: a handle naming another process's file (a
    compromised worker reading other workers' audio back through ASR), a FIFO (the model process's loop would block
    on it), or a file whose size may change (its reads would fault) is refused, and the worker sends inline."""
    import fcntl

    ring = shm.Ring(size=4096)
    try:
        assert shm.View.open(ring.handle(), ME + 1) is None  # not the connection's peer
        assert shm.View.open(ring.handle(), None) is None
        assert shm.View.open({**ring.handle(), "size": 8192}, ME) is None  # not the size it says
        unsealed = os.memfd_create("plain")
        os.ftruncate(unsealed, 4096)
        assert shm.View.open({"pid": ME, "fd": unsealed, "size": 4096}, ME) is None
        os.close(unsealed)
        fifo = os.path.join(str(tmp_path), "fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        assert shm.View.open({"pid": ME, "fd": reader, "size": 4096}, ME) is None  # at once, no hang
        os.close(reader)
        assert fcntl.fcntl(ring.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        with pytest.raises(PermissionError):
            os.ftruncate(ring.fd, 1024)  # sealed: the worker itself cannot shrink it under the model process
    finally:
        ring.close()
    assert shm.View.open({"pid": 1 << 30, "fd": 3, "size": 4096}, 1 << 30) is None  # no such process
    assert shm.View.open("not a handle", ME) is None


def test_a_message_that_cannot_cross_holds_no_span() -> None:
    ring = shm.Ring(size=1 << 20)
    try:
        out = codec.Outbox.__new__(codec.Outbox)
        out.ring, out._bodies, out._size, out._scheduled, out.batch_bytes = ring, [], 0, True, 1 << 22
        with pytest.raises(UnicodeEncodeError):  # the array went into the ring before the text failed
            out.put({"payload": np.zeros(32768, np.float32), "text": "a lone \ud800"})
        assert ring.live() == 0 and not out._bodies
        assert out.put({"payload": np.zeros(32768, np.float32)}, shared=False) == []  # inline when told so
    finally:
        ring.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=60))
def test_live_spans_never_overlap_and_stay_in_the_ring(ops: list[tuple[bool, int]]) -> None:
    """Any order of puts and releases (a release takes the oldest or the newest live span, as calls end in any
    order): the live spans are inside the ring and never overlap."""
    ring = shm.Ring(size=100)
    live: list[tuple[int, int]] = []
    try:
        for put, n in ops:
            if put or not live:
                at = ring.put(np.zeros(n, np.uint8))
                if at is not None:
                    live.append((at, at + n))
            else:
                at, _ = live.pop(0 if n % 2 else -1)
                ring.release(at)
            spans = sorted(live)
            assert all(0 <= a < b <= 100 for a, b in spans)
            assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False))
            assert ring.live() == len(live)
    finally:
        ring.close()
