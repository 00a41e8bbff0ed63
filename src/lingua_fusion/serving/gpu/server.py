"""The continuous-batching engine behind the server's ModelPort (``models.engine = "continuous"``, issue 12).

``engine_backends`` gives the Executor's ``backends``: ASR from the shipped Whisper weights in the torch model
(models/whisper_torch.py, the same weights the torch backend loads) decoded by a GpuRunner through
``TorchWhisperRecipe`` (serving/gpu/torch_whisper.py), so a clip's greedy transcript is the torch backend's. The
scheduler, sessions, policies, journal and admission are unchanged: only the runner differs. MT stays on its CPU
runner (routes, translation memory, glossaries: serving/runners.py). VAD is the energy VAD on the GPU when the
device is CUDA (Silero runs on the CPU only there), else Silero as without the engine.

Pools: ``GpuRunner.sized`` (``models.gpu_memory_fraction`` of the free GPU memory) on CUDA, a small fixed size on
the CPU (how CI runs it). Each runner's pools are gauges on /metrics (``Metrics.gpu_memory``). torch is imported
only when the engine is on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...config import Settings
from ..keys import ModelKey

log = logging.getLogger("lingua_fusion.gpu")

ENGINE = "continuous"


def enabled(settings: Settings) -> bool:
    return settings.models.engine == ENGINE


def engine_backends(registry: Any, settings: Settings, metrics: Any = None
                    ) -> dict[str, Callable[[ModelKey], Any]]:
    """The Executor's ``backends`` for ``models.engine`` ({} when the engine is off)."""
    if not enabled(settings):
        return {}
    device = settings.models.device

    def asr(key: ModelKey) -> Any:
        from .torch_whisper import asr_runner

        runner = asr_runner(registry.asr_torch(key.source), key.source, settings, str(key))
        if metrics is not None:
            metrics.gpu_memory.watch(str(key), lambda: runner.memory)
        log.info("%s on the continuous engine (%s)", key, device)
        return runner

    backends: dict[str, Callable[[ModelKey], Any]] = {"asr": asr}
    if device.startswith("cuda"):
        from .vad import energy_vad

        backends["vad"] = lambda _k: energy_vad(device)
    return backends


def build_executor(registry: Any, settings: Settings, metrics: Any = None, **kwargs: Any) -> Any:
    """The server's batched Executor, with the engine's backends when ``models.engine`` is on."""
    from ..executor import Executor

    return Executor(registry, settings, metrics, backends=engine_backends(registry, settings, metrics), **kwargs)

