"""What the offered load is made of: a mix of stream kinds (YAML), and the media each kind plays.

    arrival: poisson          # poisson (default) | ramp | burst
    ramp_s: 5                 # arrivals spread over this many seconds
    streams:
      - weight: 0.8
        source: synth         # synth (Piper speaks the built-in sentences) | file:PATH | folder:DIR | text
        source_lang: en
        targets: [es]
        slo: standard         # interactive | standard | batch
        importance: 0.5
        partials: true
        slides: false         # also send a rendered slide of the next sentence every 10 s
        video_fps: 0          # also send video frame messages at this rate (a screen share: that slide as JPEG)
      - weight: 0.2
        source: text
        targets: [es, ca]
        slo: interactive
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InvalidParameter
from ..fixtures import builtin_sentences


@dataclass
class StreamKind:
    weight: float = 1.0
    source: str = "synth"
    source_lang: str = "en"
    targets: list[str] = field(default_factory=lambda: ["es"])
    slo: str = "standard"
    importance: float = 0.5
    partials: bool = True
    slides: bool = False
    video_fps: float = 0.0  # frame messages a second: the current sentence's slide, 1280x720 JPEG, new every 10 s


@dataclass
class Mix:
    kinds: list[StreamKind]
    arrival: str = "poisson"
    ramp_s: float = 5.0

    def assign(self, n: int, seed: int) -> list[StreamKind]:
        """Which kind each of ``n`` streams is: deterministic, proportional to the weights."""
        weights = np.array([k.weight for k in self.kinds], dtype=float)
        counts = np.floor(weights / weights.sum() * n).astype(int)
        rest = n - counts.sum()
        order = np.random.default_rng(seed).permutation(len(self.kinds))
        for i in order[:rest]:
            counts[i] += 1
        out = [k for k, c in zip(self.kinds, counts, strict=True) for _ in range(c)]
        np.random.default_rng(seed + 1).shuffle(out)  # type: ignore[arg-type]
        return out


def load_mix(path: Path | None) -> Mix:
    if path is None:
        return Mix([StreamKind()])
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidParameter(f"cannot read the mix {path}: {exc}") from exc
    kinds = []
    for raw in doc.get("streams", []):
        unknown = set(raw) - set(StreamKind.__dataclass_fields__)
        if unknown:
            raise InvalidParameter(f"unknown mix fields {sorted(unknown)}")
        kinds.append(StreamKind(**raw))
    if not kinds:
        raise InvalidParameter("the mix lists no streams")
    arrival = str(doc.get("arrival", "poisson"))
    if arrival not in {"poisson", "ramp", "burst"}:
        raise InvalidParameter("arrival must be poisson, ramp or burst")
    return Mix(kinds, arrival, float(doc.get("ramp_s", 5.0)))


@dataclass
class Material:
    """PCM16 audio to loop (with its reference transcript), sentences for text streams, slides."""

    pcm: bytes
    reference: str
    sentences: list[str]


def _pcm(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def material(source: str, *, pause_s: float = 0.6) -> Material:
    from ...config import LimitSettings
    from ...media import decode_audio

    sentences = [en for _i, en, _es in builtin_sentences()]
    if source in ("synth", "text"):
        from ...models.tts import PiperTTS

        tts = PiperTTS()
        parts = []
        for s in sentences:
            pcm, sr = tts.synthesize(s, language="en")
            audio = _resample(pcm.astype(np.float32) / 32768, sr)
            parts += [audio, np.zeros(int(pause_s * 16000), dtype=np.float32)]
        return Material(_pcm(np.concatenate(parts)), " ".join(sentences), sentences)
    if source.startswith("file:"):
        path = Path(source[5:])
        audio, _ = decode_audio(path.read_bytes(), LimitSettings(), what=path.name)
        ref = path.with_suffix(".src.txt")
        return Material(_pcm(audio), ref.read_text(encoding="utf-8").strip() if ref.exists() else "", sentences)
    if source.startswith("folder:"):
        files = sorted(p for p in Path(source[7:]).iterdir()
                       if p.suffix.lower() in (".wav", ".mp3", ".flac", ".ogg", ".m4a", ".webm"))
        if not files:
            raise InvalidParameter(f"no audio files in {source[7:]}")
        chunks, refs = [], []
        for f in files:
            audio, _ = decode_audio(f.read_bytes(), LimitSettings(), what=f.name)
            chunks += [audio, np.zeros(int(pause_s * 16000), dtype=np.float32)]
            ref = f.with_suffix(".src.txt")
            refs.append(ref.read_text(encoding="utf-8").strip() if ref.exists() else "")
        return Material(_pcm(np.concatenate(chunks)), " ".join(r for r in refs if r), sentences)
    raise InvalidParameter(f"unknown source {source!r}: synth, text, file:PATH or folder:DIR")


def _resample(audio: np.ndarray, sr: int) -> np.ndarray:
    if sr == 16000:
        return audio
    n = int(len(audio) * 16000 / sr)
    return np.interp(np.linspace(0, len(audio) - 1, n), np.arange(len(audio)), audio).astype(np.float32)
