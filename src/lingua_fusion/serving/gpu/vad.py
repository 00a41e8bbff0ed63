"""VAD at scale on the GPU: every stream's pending 32 ms windows in one batched call.

The Silero model the CPU server uses is an ONNX graph that runs on the CPU only where the GPU engine runs, so at
thousands of streams speech is found by energy: a window's level in dB against a threshold, smoothed into a
probability. It is a plain batch runner (serving/runners.py Runner) for the executor's VAD lane.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

WINDOW = 512
WAIT_POLL_S = 0.0002


Runner = Callable[[list[np.ndarray]], list[np.ndarray]]


def energy_vad(device: torch.device | str, threshold_db: float = -35.0) -> Runner:
    """On CUDA the call runs on a stream of its own (the decoders' steps are not in its way) and waits for its
    result without holding Python's lock (a plain ``.cpu()`` would hold it while the GPU catches up, and every other
    thread of the process, the event loop first, would wait with it)."""
    dev = torch.device(device)
    stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def probabilities(x: torch.Tensor) -> torch.Tensor:
        level = 10.0 * torch.log10(x.pow(2).mean(dim=1) + 1e-10)
        return torch.sigmoid((level - threshold_db) / 3.0)

    def run(windows: list[np.ndarray]) -> list[np.ndarray]:
        counts = [len(w) // WINDOW for w in windows]
        flat = np.concatenate([w[: n * WINDOW] for w, n in zip(windows, counts, strict=True)] or [np.zeros(0)])
        if flat.size == 0:
            return [np.zeros(0, dtype=np.float32) for _ in windows]
        host = torch.from_numpy(flat.astype(np.float32, copy=False)).view(-1, WINDOW)
        if stream is None:
            prob = probabilities(host.to(dev)).cpu().numpy()
        else:
            with torch.cuda.stream(stream):
                x = host.pin_memory().to(dev, non_blocking=True)
                out = torch.empty(x.shape[0], dtype=torch.float32, pin_memory=True)
                out.copy_(probabilities(x), non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            while not done.query():
                time.sleep(WAIT_POLL_S)
            prob = out.numpy()
        return np.split(prob, np.cumsum(counts)[:-1])

    return run
