"""Silero VAD v6 in torch for the GPU engine (issue 12, ``LINGUAFUSION_MODELS__GPU_VAD=silero``), run here on the
CPU: its weights read from faster-whisper's bundled ONNX file, every stream's windows in one batched call, and each
stream's probabilities those of onnxruntime's call on that stream alone (models/vad.py, the CPU server's VAD)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import piper_wav, talk_wav
from pydantic import ValidationError

from lingua_fusion.config import LimitSettings, Settings
from lingua_fusion.media.audio import decode_audio
from lingua_fusion.models.registry import Registry
from lingua_fusion.models.vad import SileroVAD
from lingua_fusion.serving.gpu.server import engine_backends, gpu_vad
from lingua_fusion.serving.gpu.silero import SileroV6, silero_vad
from lingua_fusion.serving.gpu.vad import Runner

TOL = 1e-4
SENTENCES = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday."]


@pytest.fixture(scope="module")
def onnx_vad() -> SileroVAD:
    return SileroVAD()


@pytest.fixture(scope="module")
def torch_vad() -> Runner:
    return silero_vad("cpu")


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return decode_audio(talk_wav(SENTENCES), LimitSettings())[0]


def reference(vad: SileroVAD, audio: np.ndarray) -> np.ndarray:
    return vad.probabilities(audio.copy())  # a copy: faster-whisper's call writes zeros into the array it is given


def assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert float(np.abs(got - expected).max(initial=0.0)) <= TOL
    assert ((got >= 0.5) == (expected >= 0.5)).all()


def test_speech_probabilities_equal_onnxruntime(onnx_vad: SileroVAD, torch_vad: Runner,
        speech: np.ndarray) -> None:
    expected = reference(onnx_vad, speech)
    (got,) = torch_vad([speech])
    assert_same(got, expected)
    decided = got >= 0.5
    assert decided.mean() > 0.3 and (~decided).mean() > 0.1  # the talk has speech and its pauses, both found


def test_silence_and_noise_equal_onnxruntime(onnx_vad: SileroVAD, torch_vad: Runner) -> None:
    rng = np.random.default_rng(12)
    clips = [np.zeros(16000, dtype=np.float32),
             (0.01 * rng.standard_normal(24000)).astype(np.float32),  # hiss
             (0.3 * rng.standard_normal(16000 + 300)).astype(np.float32),  # loud noise, a partial window at the end
             (0.2 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)]  # a tone
    for clip in clips:
        (got,) = torch_vad([clip])
        assert len(got) == len(clip) // 512
        assert_same(got, reference(onnx_vad, clip))
    assert (torch_vad([clips[0]])[0] < 0.5).all()


def test_streams_of_different_lengths_in_one_call(onnx_vad: SileroVAD, torch_vad: Runner,
        speech: np.ndarray) -> None:
    rng = np.random.default_rng(7)
    other = decode_audio(piper_wav("Our new product will be available in three colours."), LimitSettings())[0]
    streams = [speech, speech[8000:8000 + 512], other, speech[40_000:90_000], np.zeros(300, dtype=np.float32),
               (0.05 * rng.standard_normal(5000)).astype(np.float32), other[1000:]]
    results = torch_vad(streams)
    assert len(results) == len(streams)
    for audio, got in zip(streams, results, strict=True):
        assert_same(got, reference(onnx_vad, audio))
        np.testing.assert_allclose(got, torch_vad([audio])[0], atol=1e-5)  # as if alone in the call
    assert len(results[4]) == 0  # under one window: no probability


def test_the_callers_audio_is_left_as_it_was(onnx_vad: SileroVAD, torch_vad: Runner, speech: np.ndarray) -> None:
    """Neither VAD writes into the audio it reads (a stream's timeline, which ASR reads afterwards)."""
    for vad in (torch_vad, lambda windows: [onnx_vad.probabilities(w) for w in windows]):
        audio = speech[:16000].copy()
        vad([audio])
        np.testing.assert_array_equal(audio, speech[:16000])


def test_another_onnx_model_is_refused() -> None:
    import rapidocr

    other = next(Path(rapidocr.__file__).parent.glob("models/*cls*.onnx"))
    with pytest.raises(ValueError, match="Silero v6"):
        SileroV6.from_onnx(other)


def test_setting_selects_the_vad_on_cuda_only(speech: np.ndarray) -> None:
    assert Settings().models.gpu_vad == "energy"
    with pytest.raises(ValidationError):
        Settings(models={"gpu_vad": "webrtc"})  # type: ignore[arg-type]
    on_cpu = Settings(models={"engine": "continuous", "device": "cpu", "gpu_vad": "silero"})  # type: ignore[arg-type]
    assert "vad" not in engine_backends(Registry(on_cpu), on_cpu)  # the CPU keeps Silero on onnxruntime
    on_cuda = Settings(models={"engine": "continuous", "device": "cuda", "gpu_vad": "silero"})  # type: ignore[arg-type]
    assert "vad" in engine_backends(Registry(on_cuda), on_cuda)
    # the runner the setting picks (built here on the CPU: the same code runs on a CUDA device)
    (silero,) = gpu_vad("silero", "cpu")([speech])
    (energy,) = gpu_vad("energy", "cpu")([speech])
    np.testing.assert_allclose(silero, silero_vad("cpu")([speech])[0])
    assert not np.allclose(silero, energy, atol=0.05)
