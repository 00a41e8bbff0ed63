"""VAD at scale on the GPU: every stream's pending 32 ms windows in one batched call.

The Silero model the CPU server uses is an ONNX graph that runs on the CPU only where the GPU engine runs, so at
thousands of streams speech is found by energy: a window's level in dB against a threshold, smoothed into a
probability. It is a plain batch runner (serving/threads.py Runner) for the executor's VAD lane.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .device_call import DeviceCall

WINDOW = 512


Runner = Callable[[list[np.ndarray]], list[np.ndarray]]


def energy_vad(device: torch.device | str, threshold_db: float = -35.0) -> Runner:
    """On CUDA the call runs on a stream of its own and waits without holding Python's lock (``DeviceCall``)."""
    call = DeviceCall(device)

    def probabilities(x: torch.Tensor) -> torch.Tensor:
        level = 10.0 * torch.log10(x.pow(2).mean(dim=1) + 1e-10)
        return torch.sigmoid((level - threshold_db) / 3.0)

    def run(windows: list[np.ndarray]) -> list[np.ndarray]:
        counts = [len(w) // WINDOW for w in windows]
        flat = np.concatenate([w[: n * WINDOW] for w, n in zip(windows, counts, strict=True)] or [np.zeros(0)])
        if flat.size == 0:
            return [np.zeros(0, dtype=np.float32) for _ in windows]
        prob = call(probabilities, torch.from_numpy(flat.astype(np.float32, copy=False)).view(-1, WINDOW))
        return np.split(prob, np.cumsum(counts)[:-1])

    return run
