"""Small GPU calls made from a thread that shares Python's lock with the event loop.

``wait(stream)``: block until the GPU has run what is queued on ``stream`` so far, with Python's lock free meanwhile
(a plain ``.cpu()`` or ``.tolist()`` holds it while the GPU catches up, and every other thread of the process, the
event loop first, waits with it). It records a blocking event and synchronizes on it: torch's binding releases the
lock, and a blocking event puts the thread to sleep in the driver instead of spinning on a core. (An earlier version
polled ``event.query()`` every 0.2 ms: each poll took Python's lock back, up to 5,000 times a second per waiting
thread, and under load each of those could wait a switch interval for it.) ``DeviceCall``: ``fn`` on host tensors
moved to the device, its float result back as numpy; on CUDA on a stream of its own (another runner's encoder batch
or decoder steps are not in its way), with pinned copies and ``wait``; elsewhere plainly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...models.host_copy import queued_copy
from .graphs import own_stream


def wait(stream: torch.cuda.Stream | None = None) -> None:
    """Until the GPU has run what is queued on ``stream`` (the current one if None), asleep and without the lock."""
    done = torch.cuda.Event(blocking=True)  # cudaEventBlockingSync: its synchronize sleeps
    done.record(stream)
    done.synchronize()  # Python's lock is released for the wait (torch's binding)


class DeviceCall:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # what was put on the device so far (weights) is there first
            self.stream = own_stream(self.device)  # not another runner's or graph set's (graphs.own_stream)

    def __call__(self, fn: Callable[..., torch.Tensor], *host: torch.Tensor) -> np.ndarray:
        if self.stream is None:
            return fn(*(t.to(self.device) for t in host)).cpu().numpy()
        with torch.cuda.stream(self.stream):
            result = fn(*(queued_copy(t, self.device) for t in host))
            out = torch.empty(result.shape, dtype=torch.float32, pin_memory=True)
            out.copy_(result, non_blocking=True)
        wait(self.stream)
        return out.numpy()
