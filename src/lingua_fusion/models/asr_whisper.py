"""Whisper ASR through faster-whisper (CTranslate2, int8 on CPU)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np

from ..errors import BackendError
from .base import ASRResult, ASRSegment, BackendInfo

ZH_PROMPT = "以下是普通话的句子。"  # Simplified-Chinese prompt so Whisper writes Simplified characters


class WhisperASR:
    def __init__(self, model_dir: Path, info: BackendInfo, *, compute_type: str = "int8", threads: int = 2,
                 beam_size: int = 1) -> None:
        from faster_whisper import WhisperModel

        try:
            self._model = WhisperModel(str(model_dir), device="cpu", compute_type=compute_type, cpu_threads=threads)
        except Exception as exc:  # CTranslate2 raises RuntimeError on missing/corrupt files
            raise BackendError(f"cannot load Whisper model from {model_dir}: {exc}") from exc
        self.info = info
        self._beam = beam_size
        self._lock = threading.Lock()  # one decode at a time per model; CTranslate2 uses the cores itself
        self.multilingual = self._model.model.is_multilingual

    def transcribe(self, audio: np.ndarray, *, language: str | None, task: str = "transcribe",
                   initial_prompt: str | None = None, hotwords: str | None = None) -> ASRResult:
        if not self.multilingual:
            language = "en"
            task = "transcribe"
        if language == "zh" and task == "transcribe" and not initial_prompt:
            initial_prompt = ZH_PROMPT
        with self._lock:
            segments, info = self._model.transcribe(
                audio, language=language, task=task, beam_size=self._beam, temperature=0.0,
                initial_prompt=initial_prompt, hotwords=hotwords, vad_filter=False,
                condition_on_previous_text=False, without_timestamps=False,
            )
            out: list[ASRSegment] = []
            for s in segments:
                text = s.text.strip()
                if not text:
                    continue
                conf = float(math.exp(s.avg_logprob)) * (1.0 - float(s.no_speech_prob))
                out.append(ASRSegment(start=float(s.start), end=float(s.end), text=text,
                                      confidence=round(min(1.0, max(0.0, conf)), 4)))
        return ASRResult(text=" ".join(s.text for s in out).strip(), language=info.language, segments=out,
                         language_probability=float(info.language_probability))
