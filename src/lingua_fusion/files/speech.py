"""Speech -> segments: Whisper through the engine, a piece of at most 30 s per work item (files/pieces.py; twice
when the detected language has no MT pair and Whisper translates the speech into English), then, for a video whose
slides were read, slide terms corrected in the transcript."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import langs
from ..errors import UnsupportedPair
from ..glossary import Term, hotwords
from ..models.base import ASRResult, ASRSegment
from ..models.registry import Registry
from ..models.transcript_guard import guard_segments
from ..models.word_times import shifted
from ..serving.keys import ModelKey
from ..serving.ports import TranscribeInput
from ..types import Segment, Word
from .engine import EngineLink, FileCall
from .pieces import RATE, cuts
from .work import Work


class SpeechRecogniser:
    def __init__(self, registry: Registry, engine: Callable[[], EngineLink]) -> None:
        self.registry = registry
        self.engine = engine

    def recognise(self, audio: np.ndarray, work: Work, glossary: list[Term], prompt: str | None) -> list[Segment]:
        """Speech -> segments. Without a source language Whisper detects it (its probability is reported); with
        no MT pair from that language, Whisper's task=translate gives English (``work.speech_translation``)."""
        hot = hotwords(glossary) if glossary else None
        task = "translate" if work.speech_translation else "transcribe"
        asked = work.source  # the model is chosen by the language asked (None: the multilingual one detects it)
        res = self._transcribe(audio, work, task, hot, prompt, work.call)
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
                    res = self._transcribe(audio, work, task, hot, prompt, work.call)
        work.models["asr"] = self.registry.asr_name(asked, task) + (
            " (task=translate)" if work.speech_translation else "")
        # Mandarin in the script asked for (zh-TW / zh-Hant: Traditional, else Simplified); loops cut and said
        script = (work.source_script or "Hans") if task == "transcribe" and res.language == "zh" else None
        segments, warnings = guard_segments(res.segments, script)
        work.warnings += warnings
        if script:
            work.models["asr_script"] = {"Hans": "zh-Hans (Simplified)", "Hant": "zh-Hant (Traditional)"}[script]
        return [Segment(start=round(s.start, 3), end=round(s.end, 3), source_text=s.text, text=s.text,
                        confidence=s.confidence, words=_words(s) if work.word_timestamps else None)
                for s in segments]

    def _transcribe(self, audio: np.ndarray, work: Work, task: str, hot: str | None, prompt: str | None,
                    call: FileCall) -> ASRResult:
        """The speech through Whisper in pieces; for a video whose slides were read, slide terms are then corrected
        from each slide's audio transcribed again with the slide's words as the prompt (video/context.py). Slides in
        another language than the speech are not used (they would pull Whisper into their language)."""
        multilingual = work.source is None  # the model that detects the language transcribes all of it

        def run(x: np.ndarray, slide_prompt: str | None = None, language: str | None = work.source) -> ASRResult:
            both = " ".join(p for p in (prompt, slide_prompt) if p) or None
            # a slide piece's second pass lends its text only: its words are not timed
            words = work.word_timestamps and slide_prompt is None
            return self._in_pieces(x, language, task, both, hot, call, multilingual, words)

        res = run(audio)
        if work.video is None or not work.video.slides or not work.slide_context or task != "transcribe":
            return res
        from ..video.context import correct_with_slides, pieces

        shown = langs.identify(" ".join(s.source_text for s in work.video.slides))
        if not res.segments or (shown.sure and shown.lang != res.language):
            return res
        deadline = work.call.deadline
        return correct_with_slides(res, lambda x, p: run(x, p, res.language), audio,
                                   pieces(work.video.slides, audio),
                                   stop=(lambda: deadline.left() < deadline.seconds / 3) if deadline else None)

    def _in_pieces(self, audio: np.ndarray, language: str | None, task: str, prompt: str | None,
                   hot: str | None, call: FileCall, multilingual: bool = False, words: bool = False) -> ASRResult:
        """``audio`` transcribed in pieces of at most 30 s cut at pauses (one work item each), as one result
        (segment and word times from the start of ``audio``). Without a language the first piece tells it, and the
        rest are transcribed in it (as Whisper itself decides from the first 30 s). ``words``: each segment's
        words timed too."""
        ranges = cuts(audio)
        link = self.engine()
        results: list[ASRResult] = []
        detected = multilingual or language is None  # the multilingual model that detects it transcribes it all
        if language is None and len(ranges) > 1:
            a, b = ranges[0]
            results = link.transcribe(ModelKey.asr(""), [TranscribeInput(audio[a:b], None, task, prompt, hot,
                                                                         word_timestamps=words)], call)
            language = results[0].language
        rest = ranges[len(results):]
        key = ModelKey.asr("" if detected else language or "")
        results += link.transcribe(key, [TranscribeInput(audio[a:b], language, task, prompt, hot, detected, words)
                                         for a, b in rest], call)
        segments = [ASRSegment(start=s.start + a / RATE, end=s.end + a / RATE, text=s.text, confidence=s.confidence,
                               words=shifted(s.words, a / RATE))
                    for (a, _b), r in zip(ranges, results, strict=True) for s in r.segments]
        head = results[0]
        return ASRResult(text=" ".join(s.text for s in segments).strip(), language=head.language, segments=segments,
                         language_probability=head.language_probability)


def _words(seg: ASRSegment) -> list[Word]:
    """A segment's words for the result, inside the segment's time (Whisper's alignment can put a word's edge a
    frame outside the segment it belongs to; a caption player shows a word only within its cue)."""
    start, end = round(seg.start, 3), round(seg.end, 3)
    out = []
    for w in seg.words:
        lo = min(max(w.start, start), end)
        out.append(Word(word=w.word, start=lo, end=min(max(w.end, lo), end), probability=w.probability))
    return out
