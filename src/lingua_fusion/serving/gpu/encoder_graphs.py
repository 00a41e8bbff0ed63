"""CUDA graphs of an encoder call, one per input shape, the batch padded up to a bucket.

An encoder batch of a base-size model is about a hundred operators, each a Python call that launches a kernel or
two: on the H200 the runner threads spent most of their busy time there, launching, while the kernels themselves
took microseconds (bench/results/gpu_model_process_spy_900.txt; ASR starts 53 %, MT starts 75 % of the runners'
busy samples at 900 streams). A graph replays a whole batch as one launch.

``EncoderGraphs(fn, batches)`` is called like ``fn``: positional tensors whose first dimension is the batch. A batch
of ``n`` rows runs on the graph of the smallest bucket ``>= n`` for the inputs' other dimensions and dtypes
(captured on first use, or ahead with ``capture``); more rows than the largest bucket run ``fn`` as it is. Rows past
``n`` are padding: they hold whatever an earlier call left there, and the caller only ever sees rows ``[:n]``, so
``fn`` must treat rows independently (an encoder without cross-row operations does). The result is a fresh tensor
(a copy out of the graph's output buffer), which later calls do not overwrite.

All graphs of one ``EncoderGraphs`` share one memory pool for their intermediates and one input and one output
buffer (views from their start), so memory grows with the largest shape, not with the number of graphs. That is
safe because calls are one at a time: call the object from one thread (the runner's).

On a CPU device the same object runs ``fn`` on the same padded buffers at each call (no graph): the CPU tests check
the bucketing, padding and copies that way; bench/gpu_checks.py checks the graphs on CUDA.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .graphs import capture, own_stream

Shape = tuple[int, ...]
Signature = list[tuple[Shape, torch.dtype]]  # each input's shape past the batch, and its dtype


def bucket(n: int, batches: list[int]) -> int | None:
    """The smallest of ``batches`` (ascending) that holds ``n`` rows; None past the largest."""
    return next((b for b in batches if b >= n), None)


@dataclass
class _Graph:
    replay: Callable[[], None]  # a CUDA graph's replay; on a CPU device, fn run on the same buffers (tests)
    inputs: list[torch.Tensor]  # views of the shared input buffers
    out: torch.Tensor  # a view of the shared output buffer


class _Buffers:
    """Flat device buffers that grow (to twice the need); a view handed out keeps its own storage alive, so graphs
    captured over an older, smaller buffer keep working."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flat: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def view(self, slot: int, shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        need = math.prod(shape)
        flat = self._flat.get((slot, dtype))
        if flat is None or flat.numel() < need:
            flat = torch.zeros(max(need, 2 * (flat.numel() if flat is not None else 0)), dtype=dtype,
                               device=self.device)
            self._flat[(slot, dtype)] = flat
        return flat[:need].view(shape)


class EncoderGraphs:
    def __init__(self, fn: Callable[..., torch.Tensor], batches: list[int], device: str | torch.device, *,
                 lazy: bool = True, ahead: Sequence[Signature] = ()) -> None:
        """``lazy``: capture a shape's graph on its first call; False (after ``capture``): a shape not captured runs
        ``fn`` as it is (counted in ``eager``), so nothing is captured while serving (a capture waits for the whole
        device and empties the allocator's caches). ``ahead``: the input signatures ``capture_ahead`` captures,
        called on the thread that will call this object (``GpuRunner(prepare=[graphs.capture_ahead])``); given, the
        object is not lazy."""
        self.fn = fn
        self.batches = sorted(batches)
        self.device = torch.device(device)
        self.lazy = lazy and not ahead
        self.ahead = list(ahead)
        self._graphs: dict[tuple[int, tuple[tuple[Shape, torch.dtype], ...]], _Graph] = {}
        self._buffers = _Buffers(self.device)
        self._pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        # warm-ups and captures of this set on a stream of its own (graphs.own_stream: cuBLAS's workspace)
        self._stream = own_stream(self.device) if self.device.type == "cuda" else None
        self._owner: int | None = None  # the thread that calls (one at a time; see the module's doc)
        self.captured = self.replays = self.eager = 0

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._check_thread()
        n = inputs[0].shape[0]
        size = bucket(n, self.batches)
        if size is None:
            self.eager += 1
            return self.fn(*inputs)
        g = self._graphs.get(self._key(size, inputs))
        if g is None:
            if not self.lazy:
                self.eager += 1
                return self.fn(*inputs)
            g = self._capture(size, [(tuple(t.shape[1:]), t.dtype) for t in inputs])
        for static, x in zip(g.inputs, inputs, strict=True):
            static[:n].copy_(x)
        g.replay()
        self.replays += 1
        return g.out[:n].clone()

    def capture_ahead(self) -> None:
        """``capture(ahead)``: before serving, on the thread that will call this object (which it claims)."""
        self._check_thread()
        self.capture(self.ahead)

    def capture(self, tails: Sequence[Signature]) -> None:
        """Capture ahead, before serving: for each input signature (each input's shape past the batch and dtype),
        a graph per batch bucket. The largest first, so the shared buffers and pool are allocated once."""
        def numel(tail: Signature) -> int:
            return sum(math.prod(shape) for shape, _ in tail)

        for tail in sorted(tails, key=numel, reverse=True):
            for size in reversed(self.batches):
                if (size, tuple(tail)) not in self._graphs:
                    self._capture(size, tail)

    def _key(self, size: int, inputs: tuple[torch.Tensor, ...]) -> tuple[int, tuple[tuple[Shape, torch.dtype], ...]]:
        return size, tuple((tuple(t.shape[1:]), t.dtype) for t in inputs)

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise RuntimeError("EncoderGraphs is called from one thread only (its buffers are shared)")

    def _capture(self, size: int, tail: Signature) -> _Graph:
        inputs = [self._buffers.view(i, (size, *shape), dtype) for i, (shape, dtype) in enumerate(tail)]
        slot: list[torch.Tensor] = []  # the output's view of the shared buffer, made after the first warm-up

        def warm() -> None:
            with torch.inference_mode():
                result = self.fn(*inputs)
            if not slot:  # outside any graph: the output slot comes after the inputs
                slot.append(self._buffers.view(len(tail), tuple(result.shape), result.dtype))

        def body() -> None:
            with torch.inference_mode():
                slot[0].copy_(self.fn(*inputs))  # in a graph, the result's own memory is freed in the pool

        if self._pool is None or self._stream is None:  # no CUDA: body runs at each call (what CPU tests check)
            warm()
            return self._keep(size, tail, _Graph(body, inputs, slot[0]))
        graph = torch.cuda.CUDAGraph()
        capture(graph, self._pool, self._stream, body, warm)
        return self._keep(size, tail, _Graph(graph.replay, inputs, slot[0]))

    def _keep(self, size: int, tail: Signature, g: _Graph) -> _Graph:
        self._graphs[(size, tuple(tail))] = g
        self.captured += 1
        return g
