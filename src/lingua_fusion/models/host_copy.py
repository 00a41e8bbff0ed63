"""``queued_copy``: a host tensor onto the device without the calling thread waiting for the device.

A plain ``tensor.to("cuda")`` from pageable memory waits until the current CUDA stream has run everything queued on
it before the copy (and, with CUDA's default scheduling, spins a core meanwhile): a GPU runner's thread that copies
a batch's lengths or slots after queueing its encoder sat out the whole encoder that way. From pinned memory, with
``non_blocking``, the copy is queued behind that work and the thread goes on; whatever reads the result on the same
stream runs after it. PyTorch's pinned-memory cache keeps the host block until the copy has run; its blocks (powers
of two) stay page-locked for the process's life, so this is for small arrays (lengths, slots, ids), not audio.

``Readback``: the other way, a step's small outputs into pinned host buffers, queued on the stream right after the
step, so the thread waits for the step alone (an event recorded after the copy), not for work queued after it.
"""

from __future__ import annotations

import torch


def queued_copy(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` on ``device``: on CUDA queued on the current stream (no wait); elsewhere a plain copy."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class Readback:
    """Pinned host buffers that device tensors are copied into (non-blocking), grown to the widest seen; a copy's
    result is valid once the stream has passed it and until the next ``copy``."""

    def __init__(self) -> None:
        self._bufs: list[torch.Tensor] = []

    def copy(self, *device: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(self._bufs) != len(device) or any(b.shape[0] < d.shape[0] or b.dtype != d.dtype
                                                 for b, d in zip(self._bufs, device, strict=True)):
            self._bufs = [torch.empty(d.shape[0], dtype=d.dtype, pin_memory=True) for d in device]
        out = tuple(b[: d.shape[0]] for b, d in zip(self._bufs, device, strict=True))
        for o, d in zip(out, device, strict=True):
            o.copy_(d, non_blocking=True)
        return out
