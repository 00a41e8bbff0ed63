"""Audio as OpenAI's realtime clients send it -> what the stream engine takes (PCM16 LE mono 16 kHz).

Formats: ``audio/pcm`` (PCM16 LE mono, 24 kHz as OpenAI's API requires; 16 kHz accepted too, as is), and
G.711 ``audio/pcmu`` / ``audio/pcma`` (8 kHz). Resampling is a polyphase windowed-sinc filter that keeps its
state between appends, so a stream cut into any pieces gives the same samples as the whole.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidParameter
from ..types import SR

FORMATS = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
PCM_RATES = (24000, 16000)
TAPS_PER_PHASE = 16


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, ((a & 0x0F) << 4) + 8, (((a & 0x0F) << 4) + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


ULAW, ALAW = _ulaw_table(), _alaw_table()


class Resampler:
    """Rational resampling ``rate_in`` -> ``rate_out`` (zero-stuff by L, low-pass, keep every M-th), streaming."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        g = math.gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        n = TAPS_PER_PHASE * max(self.up, self.down) + 1
        cutoff = 0.5 / max(self.up, self.down) * 0.92  # of the upsampled rate; a little below Nyquist
        t = np.arange(n) - (n - 1) / 2
        self.h = (2 * cutoff * np.sinc(2 * cutoff * t) * np.hamming(n) * self.up).astype(np.float64)
        self.history = np.zeros(n - 1)
        self.index = 0  # the upsampled-domain index of the next filtered sample

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.up == self.down == 1:
            return x
        u = np.zeros(len(x) * self.up)
        u[:: self.up] = x
        buf = np.concatenate([self.history, u])
        y = np.convolve(buf, self.h, mode="valid")
        self.history = buf[len(buf) - (len(self.h) - 1):]
        first = (-self.index) % self.down
        self.index += len(y)
        return y[first:: self.down]


class Converter:
    """One realtime session's audio input: bytes in its format -> PCM16 16 kHz bytes for ``feed_audio``."""

    def __init__(self, fmt: str, rate: int | None = None) -> None:
        if fmt not in FORMATS:
            raise InvalidParameter(f"audio format {fmt!r} is not one of {', '.join(FORMATS)}",
                                   details={"field": "session.audio.input.format"})
        rate = rate or FORMATS[fmt]
        if fmt == "audio/pcm" and rate not in PCM_RATES:
            raise InvalidParameter("audio/pcm takes rate 24000 (or 16000)", details={"field": "rate"})
        self.fmt, self.rate = fmt, rate
        self.resample = Resampler(rate, SR)
        self._odd = b""  # a PCM16 sample split between two appends

    def __call__(self, data: bytes) -> bytes:
        if self.fmt == "audio/pcm":
            data = self._odd + data
            cut = len(data) - len(data) % 2
            data, self._odd = data[:cut], data[cut:]
            samples = np.frombuffer(data, dtype="<i2")
        else:
            samples = (ULAW if self.fmt == "audio/pcmu" else ALAW)[np.frombuffer(data, dtype=np.uint8)]
        if self.rate == SR:
            return samples.astype("<i2").tobytes()
        out = self.resample(samples.astype(np.float64))
        return np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes()

    def seconds_in(self, data: bytes) -> float:
        """The duration of ``data`` in this session's input format, known before any work on it."""
        return len(data) / (2 if self.fmt == "audio/pcm" else 1) / self.rate

    def ms(self, pcm16_16k: bytes) -> float:
        """The duration of converted audio, in milliseconds."""
        return len(pcm16_16k) / 2 / SR * 1000
