"""The VAD a stream worker runs for its own streams (``models.vad_in_workers``): the one its model process would
have run, so moving it there changes no caption.

A model process runs the registry's Silero (ONNX, on the CPU) unless the engine is on a CUDA device, where its VAD
lane is serving/gpu's (``models.gpu_vad``): "energy", a window's level in dB through a sigmoid, is computed here
with numpy as serving/gpu/vad.py does with torch (a worker imports no torch); "silero" is the same Silero v6 weights,
here through onnxruntime on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...config import Settings
from ...models.registry import Registry
from ..executor import Executor
from ..gpu.server import engine_vad
from ..keys import ModelKey
from ..threads import Runner, payloads_of

if TYPE_CHECKING:
    from ...observability import Metrics

WINDOW = 512  # samples: 32 ms at 16 kHz, as the engine's
THRESHOLD_DB = -35.0  # serving/gpu/vad.py energy_vad's


def energy(windows: list[np.ndarray]) -> list[np.ndarray]:
    """Each stream's 32 ms windows' speech probability by level, as serving/gpu/vad.py's (float32 throughout)."""
    out = []
    for w in windows:
        frames = np.asarray(w[: len(w) // WINDOW * WINDOW], dtype=np.float32).reshape(-1, WINDOW)
        level = np.float32(10.0) * np.log10(np.square(frames).mean(axis=1) + np.float32(1e-10))
        out.append((1.0 / (1.0 + np.exp(-(level - np.float32(THRESHOLD_DB)) / np.float32(3.0)))).astype(np.float32))
    return out


def worker_vad_backends(settings: Settings) -> dict[str, Callable[[ModelKey], Runner]]:
    """The worker's Executor ``backends``: the energy VAD where its model process would run it, else none (the
    registry's Silero, as the model process's)."""
    if engine_vad(settings) == "energy":
        return {"vad": lambda _key: lambda batch: energy(payloads_of(batch, np.ndarray))}
    return {}


def worker_vad(registry: Registry, settings: Settings, metrics: Metrics | None = None) -> Executor:
    """A worker's own engine for its streams' VAD (RemotePort's ``vad``): an Executor whose only work is VAD, with
    the VAD its model process would have run. Its model loads on the VAD lane's thread at the first call."""
    return Executor(registry, settings, metrics, backends=worker_vad_backends(settings))
