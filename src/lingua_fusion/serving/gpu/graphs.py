"""CUDA graphs of the decode step, one per batch-size bucket.

A step of a base-size decoder is a few hundred small kernel launches: at thousands of streams the launches, not
the GPU, set the pace (bench/gpu_streams.py's profile: 9 ms of CPU for 6 ms of GPU at batch 2,048), and the
thread issuing them holds Python's lock the whole time. A graph replays them all as one launch. Each bucket has
static input buffers, refilled by one host-to-device copy per step; rows past the batch are padding: they read and
write block 0 of each pool, which the pools never hand out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .paged import DeviceInputs, Gather, StepInputs

T = TypeVar("T")
_FIELDS = ("tokens", "positions", "slots", "self_lens", "cross_lens", "first")
_CAPTURE = threading.Lock()  # one capture at a time in the process (each runner thread has its own graphs)
_OWN_STREAMS: set[int] = set()  # the streams handed out by own_stream in this process


def own_stream(device: torch.device | str | None = None) -> torch.cuda.Stream:
    """A CUDA stream no other part of this process got from here: each graph set captures on one, each runner and
    device call runs on one. cuBLAS keeps a workspace per stream and a graph bakes in the one its capture stream
    had, so a graph set replayed from one thread must not share its capture stream with another set (torch's default
    capture stream) or with a stream another thread runs on. torch hands out streams from a small pool in turn, so
    this draws until it gets one it has not given before."""
    with _CAPTURE:
        for _ in range(256):
            stream = torch.cuda.Stream(device)
            if stream.cuda_stream not in _OWN_STREAMS:
                _OWN_STREAMS.add(stream.cuda_stream)
                return stream
    raise RuntimeError("no unused CUDA stream left in torch's pool")


def capture(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream, body: Callable[[], T],
            warm: Callable[[], object] | None = None) -> T:
    """Capture ``body()`` into ``graph`` on ``stream`` (from ``own_stream``) with its memory in ``pool``; returns
    what ``body`` returned. ``warm`` (``body`` if None) runs twice on that stream first, outside the graph: Triton
    compiles, cuBLAS picks its kernels and makes the stream's workspace. One capture at a time in the process."""
    with _CAPTURE:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                (warm or body)()
        torch.cuda.current_stream(stream.device).wait_stream(stream)
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            out = body()
        torch.cuda.synchronize(stream.device)
    return out


@dataclass(frozen=True)
class StepShape:
    """What a decode step's static buffers are sized by: the engine's device, the widths of its self- and
    cross-attention block tables, and the two pools' block sizes (serving/gpu/decoder.py DecodeEngine)."""

    device: torch.device
    self_blocks: int
    cross_blocks: int
    block_size: int
    cross_block_size: int


class _Bucket:
    def __init__(self, shape: StepShape, size: int) -> None:
        dev = shape.device
        self.size = size
        self.self_blocks = shape.self_blocks
        self.cross_blocks = shape.cross_blocks
        width = len(_FIELDS) * size + size * (self.self_blocks + self.cross_blocks)
        self.host = torch.zeros(width, dtype=torch.int64).pin_memory()
        self.dev = torch.zeros(width, dtype=torch.int64, device=dev)
        self._np = self.host.numpy()
        views = [self.dev[i * size:(i + 1) * size] for i in range(len(_FIELDS))]
        at = len(_FIELDS) * size
        self_tables = self.dev[at: at + size * self.self_blocks].view(size, self.self_blocks)
        at += size * self.self_blocks
        cross_tables = self.dev[at:].view(size, self.cross_blocks)
        self.inputs = DeviceInputs(
            views[0], views[1], views[2],
            Gather(self_tables, views[3], shape.block_size, self.self_blocks * shape.block_size),
            Gather(cross_tables, views[4], shape.cross_block_size, self.cross_blocks * shape.cross_block_size),
            views[5])
        self.graph = torch.cuda.CUDAGraph()
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None

    def blank(self) -> None:
        """Every row padding (for capturing before any sequence exists)."""
        size = self.size
        self._np[:] = 0
        self._np[3 * size: 5 * size] = 1
        self.dev.copy_(self.host)

    def fill(self, x: StepInputs) -> None:
        n, size = len(x.tokens), self.size
        buf = self._np
        buf[:] = 0
        for i, values in enumerate((x.tokens, x.positions, x.slots, x.self_lens, x.cross_lens, x.first)):  # _FIELDS
            buf[i * size: i * size + n] = values
        buf[3 * size + n: 4 * size] = 1  # padding rows: length 1 (their scratch slot), never 0
        buf[4 * size + n: 5 * size] = 1
        at = len(_FIELDS) * size
        buf[at: at + size * self.self_blocks].reshape(size, self.self_blocks)[:n] = x.self_tables
        at += size * self.self_blocks
        buf[at:].reshape(size, self.cross_blocks)[:n] = x.cross_tables
        self.dev.copy_(self.host, non_blocking=True)


class StepGraphs:
    """CUDA graphs of one decode engine's step (``forward``), one per batch bucket."""

    def __init__(self, forward: Callable[[DeviceInputs], tuple[torch.Tensor, torch.Tensor]], shape: StepShape,
                 buckets: list[int]) -> None:
        self.forward = forward
        self.buckets = [_Bucket(shape, b) for b in buckets]
        self._pool = torch.cuda.graph_pool_handle()
        self._stream = own_stream(shape.device)  # warm-ups and captures of this set (see own_stream)
        self.captured = 0

    def capture_all(self) -> None:
        """Capture every bucket now, on this thread, before serving (capturing later, on the runner's thread while
        another runner captures, is what CUDA refuses)."""
        for bucket in self.buckets:
            if bucket.out is None:
                bucket.blank()
                self._capture(bucket)

    def fits(self, n: int) -> bool:
        return bool(self.buckets) and n <= self.buckets[-1].size

    def run(self, x: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        bucket = next(b for b in self.buckets if b.size >= len(x.tokens))
        bucket.fill(x)
        if bucket.out is None:
            self._capture(bucket)
        bucket.graph.replay()
        assert bucket.out is not None
        return bucket.out

    def profile(self, repeats: int = 5) -> tuple[tuple[int, float], ...]:
        """(batch size, seconds) a replay of each captured bucket takes on the device, every row padding: the
        step's kernels at that batch, on this set's stream. Admission scales a runner's measured latency by them
        beyond what it has held (service_curve.ServiceCurve.shape). What they leave out (attention over a real
        context, the host's work per row, the encoder's starts) the runner's measured latency shows as it grows."""
        captured = [b for b in self.buckets if b.out is not None]
        # one at a time in the process, like captures: another runner's capture or timing on the device would be
        # timed with these; the set's own stream is waited on, not the device (other runners' work on it)
        with _CAPTURE, torch.cuda.stream(self._stream):
            for bucket in captured:
                bucket.blank()
            graphs = {b.size: b.graph for b in captured}
            return time_each(list(graphs), lambda size: graphs[size].replay(), self._stream.synchronize,
                             repeats=repeats)

    def _capture(self, bucket: _Bucket) -> None:
        bucket.out = capture(bucket.graph, self._pool, self._stream, lambda: self.forward(bucket.inputs))
        self.captured += 1


def buckets_up_to(max_batch: int, smallest: int = 8) -> list[int]:
    out, b = [], smallest
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def time_each(sizes: list[int], run: Callable[[int], object], sync: Callable[[], object], *, repeats: int = 5,
              clock: Callable[[], float] = time.perf_counter) -> tuple[tuple[int, float], ...]:
    """(size, seconds) per ``run(size)``: once to warm, then the least of ``repeats`` timed runs, each ended by
    ``sync`` (the device's work done). The least: another process's kernels on the same GPU only ever add."""
    out = []
    for size in sizes:
        run(size)
        sync()
        best = float("inf")
        for _ in range(repeats):
            t = clock()
            run(size)
            sync()
            best = min(best, clock() - t)
        out.append((size, best))
    return tuple(out)
