"""Speech -> segments: one Whisper call (or two, when the detected language has no MT pair and Whisper translates
the speech into English), then, for a video whose slides were read, slide terms corrected in the transcript."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import langs
from ..errors import UnsupportedPair
from ..glossary import Term, hotwords
from ..models.registry import Registry
from ..models.transcript_guard import guard_segments
from ..types import Segment
from .work import Work


class SpeechRecogniser:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def recognise(self, audio: np.ndarray, work: Work, glossary: list[Term], prompt: str | None) -> list[Segment]:
        """Speech -> segments. Without a source language Whisper detects it (its probability is reported); with
        no MT pair from that language, Whisper's task=translate gives English (``work.speech_translation``)."""
        hot = hotwords(glossary) if glossary else None
        task = "translate" if work.speech_translation else "transcribe"
        asr = self.registry.asr(work.source, task=task)
        res = self._transcribe(asr, audio, work, task, hot, prompt)
        if work.source is None:
            work.source = langs.normalize(res.language, field="source_lang")
            work.detected, work.confidence = True, round(float(res.language_probability or 0.0), 3)
            if work.transcribe_only:
                work.target = work.source
            if work.source != work.target:
                try:
                    work.route = self.registry.mt_route(work.source, work.target)
                except UnsupportedPair:  # Whisper can still translate the speech into English
                    work.route = self.registry.speech_translation_route(work.source, work.target)
                    work.speech_translation, task = True, "translate"
                    asr = self.registry.asr(work.source, task=task)
                    res = self._transcribe(asr, audio, work, task, hot, prompt)
        work.models["asr"] = asr.info.name + (" (task=translate)" if work.speech_translation else "")
        # Mandarin in the script asked for (zh-TW / zh-Hant: Traditional, else Simplified); loops cut and said
        script = (work.source_script or "Hans") if task == "transcribe" and res.language == "zh" else None
        segments, warnings = guard_segments(res.segments, script)
        work.warnings += warnings
        if script:
            work.models["asr_script"] = {"Hans": "zh-Hans (Simplified)", "Hant": "zh-Hant (Traditional)"}[script]
        return [Segment(start=round(s.start, 3), end=round(s.end, 3), source_text=s.text, text=s.text,
                        confidence=s.confidence) for s in segments]

    @staticmethod
    def _transcribe(asr: Any, audio: np.ndarray, work: Work, task: str, hot: str | None,
                    prompt: str | None) -> Any:
        """One Whisper call; for a video whose slides were read, slide terms are then corrected from each slide's
        audio transcribed again with the slide's words as the prompt (video/context.py). Slides in another language
        than the speech are not used (they would pull Whisper into their language)."""
        def run(x: np.ndarray, slide_prompt: str | None = None, language: str | None = work.source) -> Any:
            both = " ".join(p for p in (prompt, slide_prompt) if p) or None
            return asr.transcribe(x, language=language, task=task, hotwords=hot, initial_prompt=both)

        res = run(audio)
        if work.video is None or not work.video.slides or not work.slide_context or task != "transcribe":
            return res
        from ..video.context import correct_with_slides, pieces

        shown = langs.identify(" ".join(s.source_text for s in work.video.slides))
        if not res.segments or (shown.sure and shown.lang != res.language):
            return res
        deadline = work.deadline
        return correct_with_slides(res, lambda x, p: run(x, p, res.language), audio,
                                   pieces(work.video.slides, audio),
                                   stop=(lambda: deadline.left() < deadline.seconds / 3) if deadline else None)
