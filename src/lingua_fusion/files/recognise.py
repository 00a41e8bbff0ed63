"""A validated request's input -> source segments, by modality: text split into sentences; an image decoded and
read (OCR); a video's frames read first (files/visuals.py), then its audio track; audio decoded and transcribed
(files/speech.py), then with diarize each segment's speaker (files/diarize.py). A source language learnt on the
way (OCR text, slides, Whisper) is noted in the ``Work``."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from ..config import Settings
from ..media import decode_audio, decode_image
from ..models.registry import Registry
from ..serving.ports import OcrInput
from ..types import Modality, Segment
from .diarize import SpeakerLabeller
from .engine import EngineLink
from .request import ValidRequest
from .speech import SpeechRecogniser
from .validate import identify
from .visuals import VideoVisuals
from .work import Stages, Work

SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")


class Recogniser:
    def __init__(self, settings: Settings, registry: Registry, speech: SpeechRecogniser,
                 visuals: VideoVisuals, engine: Callable[[], EngineLink], speakers: SpeakerLabeller) -> None:
        self.settings = settings
        self.registry = registry
        self.speech = speech
        self.visuals = visuals
        self.engine = engine
        self.speakers = speakers

    def recognise(self, valid: ValidRequest, work: Work, st: Stages) -> list[Segment]:
        data = valid.request.data
        if valid.request.signs is not None and valid.source_modality != Modality.VIDEO:
            work.warnings.append("vocabulary_id: signs are read from a video's frames; this input has none")
        if valid.source_modality == Modality.TEXT:
            assert valid.text is not None
            return [Segment(start=0.0, end=0.0, source_text=p.strip(), text=p.strip())
                    for p in SENTENCE.split(valid.text) if p.strip()]
        assert data is not None
        if valid.source_modality == Modality.IMAGE:
            with st.stage("decode"):
                image = decode_image(data, self.settings.limits)
            with st.stage("ocr"):
                segs = self._ocr(image, work)
            if segs and work.source is None:
                work.source, work.confidence = identify(" ".join(s.source_text for s in segs))
                work.detected = True
            return segs
        if valid.source_modality == Modality.VIDEO and not self.visuals.read(data, work, st, valid.request.signs):
            return []  # a video without an audio track: its slides are what it says
        with st.stage("decode"):
            audio, info = decode_audio(data, self.settings.limits, what=valid.source_modality.value)
        duration = info["duration_s"]
        assert isinstance(duration, float)  # the decoded samples' length in seconds (media/audio.py)
        work.duration = duration
        if valid.request.diarize:
            self.speakers.check_length(work.duration)
        if info["has_video"] and work.video is None:
            work.warnings.append("video frames were not read (source_modality audio): only the audio track was used")
        with st.stage("asr"):
            segs = self.speech.recognise(audio, work, valid.request.glossary, valid.request.prompt)
        if valid.request.diarize:
            with st.stage("diarize"):
                segs = self.speakers.label(audio, segs, work, valid.request.max_speakers)
        return segs

    def _ocr(self, image: np.ndarray, work: Work) -> list[Segment]:
        work.models["ocr"] = self.registry.ocr_name()
        lines = self.engine().read(OcrInput(image, work.source), work.call)
        return [Segment(start=0.0, end=0.0, source_text=ln.text, text=ln.text,
                        confidence=round(ln.confidence, 4)) for ln in lines if ln.text.strip()]
