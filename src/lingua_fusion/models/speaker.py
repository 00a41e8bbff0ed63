"""Speaker embeddings: Resemblyzer's voice encoder (``resemblyzer==0.1.4``, Apache-2.0), run on plain torch.

The wheel carries the trained weights (``resemblyzer/pretrained.pt``, 17 MB): a 3-layer LSTM (hidden 256) over
40-band mel power frames (25 ms windows, 10 ms hop, 16 kHz), whose last hidden state goes through a linear layer
and a ReLU to a 256-d embedding, L2-normalised; it was trained (GE2E) on 1.6 s windows (160 frames). Only the
weights are read from the package: its own front end needs librosa and webrtcvad, which this project does not
install (``scripts/setup.sh`` installs the wheel with ``--no-deps``). The mel front end is computed here in numpy
with the parameters the package's ``audio.py`` passes to librosa (n_fft 400, hop 160, 40 Slaney-normalised mel
bands from 0 to 8 kHz, power 2, centred frames, not log), and each window's loudness is raised to -30 dBFS as its
``preprocess_wav`` does (never lowered). Nothing is downloaded: a missing wheel is ``BackendError`` (503).

``SpeakerEncoder.embed`` takes many windows and runs them in one forward (batched), in slices of ``MAX_BATCH``
windows so that memory stays bounded whatever the file's length.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

from ..errors import BackendError
from .base import BackendInfo

RATE = 16000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
WINDOW_FRAMES = 160  # the 1.6 s the encoder was trained on
WINDOW_SAMPLES = WINDOW_FRAMES * HOP  # a window's samples: its mel frames are the first WINDOW_FRAMES of them
EMBED_DIM = 256
MAX_BATCH = 256  # windows per forward: 256 x 160 x 40 floats in, a few MB of LSTM state
SMALL_BATCH = 64  # a forward of at most this many windows runs on one thread (module docstring)
TARGET_DBFS = -30.0
INT16_MAX = 2**15 - 1


def weights_path() -> Path:
    """Where the wheel put ``pretrained.pt`` (found without importing the package, which would need librosa)."""
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise BackendError("speaker diarization needs resemblyzer==0.1.4 (its voice encoder's weights): "
                               "run make setup, or pip install --no-deps resemblyzer==0.1.4")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise BackendError(f"resemblyzer is installed but {path} is missing")
    return path


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """The Slaney mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    mel = hz / f_sp
    high = hz >= min_log_hz
    mel[high] = min_log_mel + np.log(hz[high] / min_log_hz) / logstep
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    hz = mel * f_sp
    high = mel >= min_log_mel
    hz[high] = min_log_hz * np.exp(logstep * (mel[high] - min_log_mel))
    return hz


def mel_filters() -> np.ndarray:
    """(N_MELS, N_FFT // 2 + 1) triangular filters, Slaney area-normalised, 0 Hz to the Nyquist frequency."""
    fft_hz = np.linspace(0.0, RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([RATE / 2]))[0],
                                   N_MELS + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:N_MELS + 2] - edges[:N_MELS]))[:, None]
    return weights.astype(np.float32)


_FILTERS = mel_filters()
_HANN = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)  # periodic, as librosa's


def mel_frames(audio: np.ndarray) -> np.ndarray:
    """(frames, N_MELS) mel power frames of 16 kHz float audio: frame i is centred on sample i * HOP (the signal
    padded with zeros by N_FFT // 2 at both ends), so ``len(audio) // HOP + 1`` frames."""
    x = np.pad(np.asarray(audio, dtype=np.float32), N_FFT // 2)
    n = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(x, shape=(n, N_FFT), strides=(x.strides[0] * HOP, x.strides[0]))
    power = np.abs(np.fft.rfft(frames * _HANN, axis=1)) ** 2
    return (power.astype(np.float32) @ _FILTERS.T).astype(np.float32)


def louder(window: np.ndarray) -> np.ndarray:
    """A window raised to TARGET_DBFS RMS (never lowered: quiet speech is what the encoder was trained to hear
    at that level; silence stays silence)."""
    rms = float(np.sqrt(np.mean((window.astype(np.float64) * INT16_MAX) ** 2))) if len(window) else 0.0
    if rms <= 1e-3:
        return window
    change = TARGET_DBFS - 20 * np.log10(rms / INT16_MAX)
    return window if change <= 0 else (window * (10 ** (change / 20))).astype(np.float32)


class SpeakerEncoder:
    """Resemblyzer's voice encoder: ``embed(windows)`` -> L2-normalised 256-d embeddings. Thread-safe (one
    forward at a time: torch's CPU LSTM uses every core)."""

    info = BackendInfo(name="resemblyzer-voice-encoder", task="speaker", languages=(),
                       licence="Apache-2.0", quality="standard")

    def __init__(self, path: Path | None = None) -> None:
        import torch

        state = torch.load(path or weights_path(), map_location="cpu", weights_only=True)["model_state"]
        self._lstm = torch.nn.LSTM(N_MELS, 256, 3, batch_first=True)
        self._linear = torch.nn.Linear(256, EMBED_DIM)
        self._lstm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("lstm.")})
        self._linear.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("linear.")})
        self._lstm.eval()
        self._linear.eval()
        self._torch = torch
        self._lock = threading.Lock()

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(n, WINDOW_SAMPLES) float windows -> (n, EMBED_DIM) float32 unit vectors, MAX_BATCH windows per
        forward. A window of silence has no direction: its row is all zeros."""
        if windows.ndim != 2 or windows.shape[1] != WINDOW_SAMPLES:
            raise ValueError(f"windows must be (n, {WINDOW_SAMPLES}), not {windows.shape}")
        mels = np.stack([mel_frames(louder(w))[:WINDOW_FRAMES] for w in windows]) if len(windows) else \
            np.zeros((0, WINDOW_FRAMES, N_MELS), np.float32)
        return self.embed_mels(mels)

    def embed_mels(self, mels: np.ndarray) -> np.ndarray:
        """(n, frames, N_MELS) mel frames -> (n, EMBED_DIM) unit vectors (zeros where the ReLU left nothing). A
        small forward (at most ``SMALL_BATCH`` windows: live streams' utterances) runs on one thread (module
        docstring)."""
        torch = self._torch
        out = np.zeros((len(mels), EMBED_DIM), np.float32)
        with self._lock, torch.inference_mode():
            threads = torch.get_num_threads()
            if len(mels) <= SMALL_BATCH:
                torch.set_num_threads(1)
            try:
                for i in range(0, len(mels), MAX_BATCH):
                    _, (hidden, _) = self._lstm(torch.from_numpy(np.ascontiguousarray(mels[i:i + MAX_BATCH])))
                    raw = torch.relu(self._linear(hidden[-1]))
                    norm = torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp_min(1e-8)
                    out[i:i + MAX_BATCH] = (raw / norm).numpy()
            finally:
                torch.set_num_threads(threads)
        return out


def windows_of(audio: np.ndarray, hop: int, most: int) -> np.ndarray:
    """(n, WINDOW_SAMPLES) windows over a stretch of one voice, ``hop`` samples apart, the last one ending with it,
    at most ``most`` (evenly spread over a long stretch). A stretch shorter than a window is repeated to fill one:
    the window hears only this stretch's voice (padding with its neighbours' audio would mix in the next speaker's
    voice at a quick turn, and silence is not what the encoder was trained on)."""
    audio = np.asarray(audio, dtype=np.float32)
    if len(audio) == 0:
        return np.zeros((0, WINDOW_SAMPLES), np.float32)
    if len(audio) < WINDOW_SAMPLES:
        return np.resize(audio, WINDOW_SAMPLES)[None, :]
    starts = list(range(0, len(audio) - WINDOW_SAMPLES + 1, max(1, hop)))
    if starts[-1] != len(audio) - WINDOW_SAMPLES:
        starts.append(len(audio) - WINDOW_SAMPLES)
    if len(starts) > most:
        starts = [starts[int(i)] for i in np.linspace(0, len(starts) - 1, max(1, most)).round()]
    return np.stack([audio[s:s + WINDOW_SAMPLES] for s in starts])
