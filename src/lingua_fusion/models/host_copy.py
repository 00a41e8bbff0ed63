"""``queued_copy``: a host tensor onto the device without the calling thread waiting for the device.

A plain ``tensor.to("cuda")`` from pageable memory waits until the current CUDA stream has run everything queued on
it before the copy (and, with CUDA's default scheduling, spins a core meanwhile): a GPU runner's thread that copies
a batch's lengths or slots after queueing its encoder sat out the whole encoder that way. From pinned memory, with
``non_blocking``, the copy is queued behind that work and the thread goes on; whatever reads the result on the same
stream runs after it. PyTorch's pinned-memory cache keeps the host block until the copy has run; its blocks (powers
of two) stay page-locked for the process's life, so this is for small arrays (lengths, slots, ids), not audio.
"""

from __future__ import annotations

import torch


def queued_copy(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` on ``device``: on CUDA queued on the current stream (no wait); elsewhere a plain copy."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
