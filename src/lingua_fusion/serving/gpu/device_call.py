"""Small GPU calls made from a thread that shares Python's lock with the event loop.

``wait(event)``: block until the GPU has passed ``event`` by polling it, so Python's lock is free during the wait
(a plain ``.cpu()`` or ``.tolist()`` holds it while the GPU catches up, and every other thread of the process, the
event loop first, waits with it). ``DeviceCall``: ``fn`` on host tensors moved to the device, its float result back
as numpy; on CUDA on a stream of its own (another runner's encoder batch or decoder steps are not in its way), with
pinned copies and ``wait``; elsewhere plainly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

WAIT_POLL_S = 0.0002


def wait(event: torch.cuda.Event) -> None:
    while not event.query():
        time.sleep(WAIT_POLL_S)


class DeviceCall:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # what was put on the device so far (weights) is there first
            self.stream = torch.cuda.Stream(self.device)

    def __call__(self, fn: Callable[..., torch.Tensor], *host: torch.Tensor) -> np.ndarray:
        if self.stream is None:
            return fn(*(t.to(self.device) for t in host)).cpu().numpy()
        with torch.cuda.stream(self.stream):
            result = fn(*(t.pin_memory().to(self.device, non_blocking=True) for t in host))
            out = torch.empty(result.shape, dtype=torch.float32, pin_memory=True)
            out.copy_(result, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        wait(done)
        return out.numpy()
