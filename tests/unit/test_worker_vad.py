"""A stream worker's own VAD (serving/shard/worker_vad.py) is the one its model process would have run: moving VAD
into the workers (``models.vad_in_workers``) changes no caption."""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.config import Settings
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.shard.worker_vad import energy, worker_vad_backends

pytestmark = pytest.mark.timeout(60)


def test_the_workers_energy_vad_is_the_engines() -> None:
    torch = pytest.importorskip("torch", reason="the engine's VAD is torch's; the server's install has it")
    from lingua_fusion.serving.gpu.vad import energy_vad

    rng = np.random.default_rng(0)
    t = np.arange(16000 * 3) / 16000
    speechy = (0.3 * np.sin(2 * np.pi * 220 * t) * (t % 1.0 < 0.5)).astype(np.float32)  # half a second on, off
    windows = [speechy, rng.normal(0, 0.01, 16000).astype(np.float32), np.zeros(700, np.float32),
               np.zeros(100, np.float32)]
    ours = energy(windows)
    theirs = energy_vad(torch.device("cpu"))(windows)
    assert [len(p) for p in ours] == [len(p) for p in theirs] == [93, 31, 1, 0]
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == np.float32 and np.allclose(a, b, atol=1e-5)
    assert ours[0].max() > 0.99 and ours[0].min() < 0.01  # the tone is speech, its gaps are not


@pytest.mark.parametrize(("engine", "device", "kind", "energy_here"), [
    ("continuous", "cuda", "energy", True),  # the GPU engine's VAD, here in numpy
    ("continuous", "cuda:1", "energy", True),
    ("continuous", "cuda", "silero", False),  # Silero v6 through the registry's onnxruntime
    ("continuous", "cpu", "energy", False),  # the engine on the CPU runs the registry's Silero
    ("", "cpu", "energy", False),  # the default server
])
def test_a_worker_runs_the_vad_its_model_process_would(engine: str, device: str, kind: str,
                                                      energy_here: bool) -> None:
    settings = Settings()
    settings.models.engine = engine
    settings.models.device = device
    settings.models.gpu_vad = kind  # type: ignore[assignment]
    backends = worker_vad_backends(settings)
    assert ("vad" in backends) is energy_here
    if energy_here:
        run = backends["vad"](ModelKey.vad())
        out = run([np.zeros(1024, np.float32)])  # type: ignore[arg-type]
        assert len(out) == 1 and len(out[0]) == 2 and out[0].max() < 0.01


def test_a_model_process_warms_the_vad_only_where_it_runs_the_streams_vad() -> None:
    """With models.vad_in_workers each worker loads its own; the model process's copy would be memory never used."""
    from lingua_fusion.serving.shard.model_process import _warm

    class Loads:
        def __init__(self) -> None:
            self.loaded: list[str] = []

        def asr(self, lang: str) -> None:
            self.loaded.append(f"asr:{lang}")

        def vad(self) -> None:
            self.loaded.append("vad")

        def warm_apertium(self, src: str, tgt: str) -> None:
            self.loaded.append(f"mt:{src}-{tgt}")

    for vad, want in ((False, ["asr:en", "mt:en-es"]), (True, ["asr:en", "vad", "mt:en-es"])):
        registry = Loads()
        _warm(registry, vad)  # type: ignore[arg-type]  # the three loads _warm asks of a Registry
        assert registry.loaded == want
